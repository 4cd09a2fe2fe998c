"""The pass timeline: every pass and compile stage as a bar over the compile's time, and per pass
what it changed: nodes before/after, its own stats, kernel groups and backends, and the code
before and after it (a unified diff; the full texts are kept once each and drawn on demand)."""

from __future__ import annotations

import difflib
import html
from typing import Any

from .memory import W

MAX_DIFF_LINES = 800
STAGES = ("kernels_ahead", "schedule", "memory_plan", "codegen", "link", "load")


def _short_stats(st: dict) -> dict:
    """A pass's stats with long lists replaced by their length (``refused`` is listed elsewhere)."""
    return {k: (f"{len(v)} listed" if isinstance(v, list) else v) for k, v in st.items()}


def _diff(before: str, after: str) -> tuple[str, int, int]:
    """Unified diff (capped at MAX_DIFF_LINES), lines removed, lines added."""
    if before == after:
        return "", 0, 0
    lines = list(difflib.unified_diff(before.splitlines(), after.splitlines(), "before", "after", n=2, lineterm=""))
    removed = sum(1 for l in lines if l.startswith("-") and not l.startswith("---"))
    added = sum(1 for l in lines if l.startswith("+") and not l.startswith("+++"))
    if len(lines) > MAX_DIFF_LINES:
        lines = lines[:MAX_DIFF_LINES] + [f"... {len(lines) - MAX_DIFF_LINES} more diff lines (see the full texts)"]
    return "\n".join(lines), removed, added


def _meta_text(before, after) -> str:
    if before is None or after is None:
        return ""
    bits = []
    if before.groups != after.groups:
        bits.append(f"kernel groups {before.groups} \u2192 {after.groups}")
    if before.backends != after.backends:
        bits.append("backends: " + ", ".join(f"{b} {n}" for b, n in sorted(after.backends.items(), key=str)))
    if before.fallbacks != after.fallbacks:
        bits.append(f"fallback nodes {before.fallbacks} \u2192 {after.fallbacks}")
    return "; ".join(bits)


def pass_view(compiled) -> dict[str, Any]:
    records = list(compiled.stats.get("passes", []))
    data = getattr(compiled, "report_data", None)
    codes = list(data.codes) if data is not None else []
    metas = list(data.meta) if data is not None else []
    texts: list[str] = []
    text_ix: dict[str, int] = {}

    def keep(t: str) -> int:
        if t not in text_ix:
            text_ix[t] = len(texts)
            texts.append(t)
        return text_ix[t]

    rows = []
    aligned = len(codes) == len(records) + 1
    for i, r in enumerate(records):
        row = {"name": r["name"], "seconds": r["seconds"], "before": r["nodes_before"], "after": r["nodes_after"],
               "modified": bool(r["modified"]), "stats": _short_stats(r.get("stats", {}))}
        if aligned:
            d, removed, added = _diff(codes[i], codes[i + 1])
            row.update(diff=d, removed=removed, added=added, code_before=keep(codes[i]), code_after=keep(codes[i + 1]),
                       meta=_meta_text(metas[i] if i < len(metas) else None, metas[i + 1] if i + 1 < len(metas) else None))
        rows.append(row)
    return {"passes": rows, "texts": texts, "svg": timeline_svg(records, compiled.stats.get("stage_seconds", {}))}


def timeline_svg(records: list[dict], stages: dict[str, float]) -> str:
    """One bar per pass, then per later stage, at its start time within the compile."""
    bars: list[tuple[str, float, str]] = [(r["name"], float(r["seconds"]), "pass") for r in records]
    bars += [(s, float(stages[s]), "stage") for s in STAGES if s in stages]
    total = sum(d for _, d, _ in bars) or 1.0
    row_h, label_w = 16.0, 170.0
    width = W - label_w - 80
    parts, t = [], 0.0
    for i, (name, d, kind) in enumerate(bars):
        y = i * row_h
        x0, w = label_w + t / total * width, max(d / total * width, 0.8)
        parts.append(f'<text class="tl-label" x="{label_w - 6:g}" y="{y + 11:g}">{html.escape(name)}</text>'
                     f'<rect class="tl {kind}" x="{x0:.1f}" y="{y + 2:g}" width="{w:.1f}" height="{row_h - 4:g}" data-row="{i}"/>'
                     f'<text class="tl-time" x="{x0 + w + 4:.1f}" y="{y + 11:g}">{d * 1e3:.1f} ms</text>')
        t += d
    h = len(bars) * row_h + 18
    parts.append(f'<text class="tl-total" x="{label_w:g}" y="{h - 4:g}">total {total * 1e3:.1f} ms '
                 f'(passes, then schedule, memory plan, codegen and load)</text>')
    return f'<svg class="timeline" viewBox="0 0 {W:g} {h:g}" role="img" aria-label="pass timeline">' + "".join(parts) + "</svg>"
