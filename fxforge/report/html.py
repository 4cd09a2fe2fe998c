"""A self-contained HTML page for compiled graphs: memory picture, graph picture, pass timeline,
kernels, the schedule of collectives, stats and source.  Inline CSS, JS and SVG only: it opens
from disk, offline.

``render(compiled)`` or ``render([c1, c2, ...])`` (one tab per graph) returns the page;
``write_report(compiled_or_list, path)`` writes it.  The pictures that can be counted (buffers,
kernel groups, pass bars) are SVG written here; views of thousands of nodes (the node-level
graph, the code of each pass, kernel sources) are drawn by the page's script from a JSON block,
only when opened.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any, Sequence

from . import assets
from .graphview import graph_view
from .kernels import kernel_view
from .memory import curves, curves_svg, fmt_bytes, memory_view
from .schedule import schedule_svg
from .timeline import pass_view

BYTES_KEYS = ("_bytes",)


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _json_block(obj: Any, cls: str) -> str:
    # "<" escaped so no "</script>" (or "<!--") inside the data can end the block
    text = json.dumps(obj, separators=(",", ":"), default=str).replace("<", "\\u003c")
    return f'<script type="application/json" class="{cls}">{text}</script>'


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "", row_attrs: Sequence[str] | None = None) -> str:
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = []
    for i, r in enumerate(rows):
        attrs = row_attrs[i] if row_attrs else ""
        body.append(f"<tr{attrs}>" + "".join(f"<td>{c if isinstance(c, Raw) else esc(c)}</td>" for c in r) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table>'


class Raw(str):
    """Already-escaped HTML for a table cell."""


def _stat_value(key: str, v: Any) -> tuple[str, str]:
    """The value as Python prints it (exact) and, where it helps, a readable form."""
    if key == "passes":
        return f"{len(v)} passes", "see Pass timeline"
    if key == "refused":
        return f"{len(v)} listed", "see Graph: refused fusions"
    if key == "fallbacks":
        return f"{len(v)} nodes", "see Graph: fallbacks"
    if key == "custom_ops":
        return f"{len(v)} sites", "see Custom ops" if v else ""
    if key == "regions":
        return f"{len(v)} regions", "see Regions" if v else ""
    if key == "comm":
        return (f"{v['count']} collectives, exposed {v['exposed_s']:.6g} s of {v['estimated_s']:.6g} s",
                "see Schedule" if v.get("timeline") else "")
    if key == "memory_budget":
        return f"planned peak {v['planned_peak_bytes']} of {v['budget_bytes']}", "see Memory budget"
    if isinstance(v, float):
        return f"{v:.6g}", (f"{v * 100:.1f}%" if key == "fragmentation" else "")
    if isinstance(v, int) and not isinstance(v, bool) and key.endswith(BYTES_KEYS):
        return str(v), fmt_bytes(v)
    if isinstance(v, dict):
        return json.dumps({k: (round(x, 6) if isinstance(x, float) else x) for k, x in v.items()}, default=str), ""
    return str(v), ""


def _summary(c) -> str:
    s = c.stats
    frag = s.get("fragmentation", 0.0) * 100
    return (
        f'<p class="summary"><b>{esc(s.get("graph", "graph"))} graph</b>: {s.get("nodes_in", 0):,} nodes \u2192 '
        f"{s.get('kernels', 0):,} kernels ({s.get('fused_nodes', 0):,} nodes fused), "
        f'<span class="{"warn" if s.get("fallback_nodes") else ""}">{s.get("fallback_nodes", 0)} fallback nodes</span>; '
        f"arenas {esc(fmt_bytes(s.get('arena_bytes', 0)))} for a lower bound of {esc(fmt_bytes(s.get('lower_bound_bytes', 0)))} "
        f"(fragmentation {frag:.1f}%); eager peak {esc(fmt_bytes(s.get('eager_live_peak_bytes', 0)))}, "
        f"schedule peak {esc(fmt_bytes(s.get('schedule_peak_bytes', 0)))} ({esc(s.get('schedule', ''))} order); "
        f"compiled in {s.get('compile_seconds', 0.0):.2f} s</p>"
    )


def _memory_section(c, uid: str) -> tuple[str, dict]:
    if c.plan is None:
        return f'<section id="{uid}-memory"><h2>Memory</h2><p>No plan was recorded.</p></section>', {}
    mv = memory_view(c, uid)
    cv = curves(c)
    s = c.stats
    legend = "".join(
        f'<span class="sw kind-{esc(k)}" style="background:{css}"></span>{esc(k)}' + (f" ({esc(note)})" if note else "")
        for k, css, note in mv["legend"]
    )
    n_arena = mv["in_arenas"]
    note = (
        f"{len(mv['buffers'])} buffers ({n_arena} in {len(mv['arenas'])} arenas, {len(mv['buffers']) - n_arena} in fresh allocations) "  # noqa: E501
        f"over {mv['steps']} schedule steps. Arenas hold {esc(fmt_bytes(s.get('arena_bytes', 0)))} at most at once; the "
        f"buffers in them need {esc(fmt_bytes(s.get('lower_bound_bytes', 0)))} (lower bound, dashed): fragmentation "
        f"<b>{s.get('fragmentation', 0.0) * 100:.1f}%</b>. Arenas are stacked where they would sit in one address space "
        f"(first fit over their live windows: {esc(fmt_bytes(mv['packed_bytes']))})."
    )
    fresh = (
        (
            f"<h3>Fresh allocations <small>(graph outputs and what they view: allocated per call, never in an arena)</small></h3>"
            f"{mv['fresh_svg']}"
        )
        if mv["fresh_svg"]
        else ""
    )
    eager_note = "" if "eager" in cv else " (no input-graph record: eager curve not available)"
    body = (f'<section class="memory" id="{uid}-memory"><h2>Memory</h2><p class="note">{note}</p>'
            f'<p class="legend">{legend}<span class="sw reuse"></span>written in place over a dying buffer'
            f'<span class="hint">hover a buffer for details; drag across a panel to zoom, double-click to reset</span></p>'
            f'<h3>Arenas <small>(x: schedule step, y: address)</small></h3>{mv["arena_svg"]}{fresh}'
            f'<h3>Live bytes over steps{eager_note}</h3><p class="legend"><span class="ln eager"></span>eager order '
            f'(input graph, peak {esc(fmt_bytes(max(cv.get("eager", [0]) or [0])))})'
            f'<span class="ln schedule"></span>fxforge schedule (peak {esc(fmt_bytes(max(cv["schedule"] or [0])))})'
            f'<span class="ln arenas"></span>arenas allocated</p>{curves_svg(cv, uid)}</section>')
    return body, {"buffers": mv["buffers"], "tips": mv["tips"], "arenas": mv["arenas"], "curves": cv}


def _graph_section(c, uid: str) -> tuple[str, dict]:
    if c.plan is None:
        return f'<section id="{uid}-graph"><h2>Graph</h2><p>No plan was recorded.</p></section>', {}
    gv = graph_view(c, uid)
    s = c.stats
    counts = s.get("refused_fusions", {}) or {}
    refused_rows = [[r.get("reason", ""), r.get("into", ""), r.get("group", ""), r.get("detail", "")] for r in gv["refused"]]
    refused = (_table(["reason", "into (last node)", "group (last node)", "detail"], refused_rows, "refused clickable",
                      [f' data-r="{i}"' for i in range(len(refused_rows))])
               if refused_rows else "<p>None.</p>")
    count_text = ", ".join(f"<code>{esc(k)}</code> {v}" for k, v in sorted(counts.items())) or "none"
    fb = s.get("fallbacks", {}) or {}
    fb_rows = [[n, r] for n, r in fb.items()]
    fallbacks = (_table(["node", "reason"], fb_rows, "fallbacks clickable", [f' data-node="{esc(n)}"' for n, _ in fb_rows])
                 if fb_rows else "<p>None: every node runs in a generated kernel.</p>")
    body = (
        f'<section class="graphpic" id="{uid}-graph"><h2>Graph</h2>'
        f'<p class="note">{len(gv["nodes"]):,} nodes in schedule order, {len(gv["groups"]):,} kernel groups. '
        f"Overview: one block per kernel group (width: its nodes), fallbacks red and hatched. Click a block, a "
        f"refused fusion or a fallback to show its nodes below.</p>{gv['overview_svg']}"
        f'<div class="controls"><button class="prev" type="button">\u25c0 earlier</button>'
        f'<input class="slider" type="range" min="0" max="{max(len(gv["nodes"]) - 1, 0)}" value="0" aria-label="window start">'
        f'<button class="next" type="button">later \u25b6</button>'
        f'<input class="find" type="search" placeholder="find node by name" aria-label="find node">'
        f'<span class="range"></span></div><div class="detail"></div>'
        f"<h3>Refused fusions <small>({count_text}; first {len(refused_rows)} listed)</small></h3>{refused}"
        f"<h3>Fallbacks</h3>{fallbacks}</section>"
    )
    return body, {"nodes": gv["nodes"], "groups": gv["groups"], "reasons": gv["reasons"],
                  "refused": [[r.get("into", ""), r.get("group", "")] for r in gv["refused"]]}


def _passes_section(c, uid: str) -> tuple[str, dict]:
    pv = pass_view(c)
    rows = []
    for i, p in enumerate(pv["passes"]):
        changed = []
        if p.get("meta"):
            changed.append(esc(p["meta"]))
        if p["stats"]:
            changed.append("<code>" + esc(json.dumps(p["stats"], default=str)) + "</code>")
        if "diff" in p:
            what = f'code: \u2212{p["removed"]} +{p["added"]} lines' if p["diff"] else "code (unchanged)"
            code = (
                f'<details class="code" data-pass="{i}"><summary>{what}</summary>'
                f'<pre class="diff"></pre><details class="full" data-text="{p["code_before"]}"><summary>before</summary><pre></pre></details>'  # noqa: E501
                f'<details class="full" data-text="{p["code_after"]}"><summary>after</summary><pre></pre></details></details>'
            )
            changed.append(code)
        rows.append([p["name"], f'{p["seconds"] * 1e3:.2f} ms', p["before"], p["after"], "yes" if p["modified"] else "no",
                     Raw("<br>".join(changed))])
    table = _table(["pass", "time", "nodes before", "nodes after", "modified", "what it changed"], rows, "passes")
    body = (f'<section id="{uid}-passes"><h2>Pass timeline</h2>{pv["svg"]}{table}</section>')
    return body, {"diffs": [p.get("diff", "") for p in pv["passes"]], "texts": pv["texts"]}


def _kernels_section(c, uid: str) -> tuple[str, dict]:
    kv = kernel_view(c)
    rows = []
    for i, (name, backend, nodes, nargs, uio, args, src, dev) in enumerate(kv):
        shown = ", ".join(args[:8]) + (f", \u2026 ({len(args)} in all)" if len(args) > 8 else "")
        rows.append([name, backend, nodes, nargs, uio, Raw(f"<code>{esc(shown)}</code>"),
                     Raw(f'<details class="ksrc" data-k="{i}"><summary>source</summary><pre></pre></details>')])
    table = _table(["kernel", "backend", "nodes", "launch args", "unique io buffers", "arguments", ""], rows, "kernels")
    body = (f'<section id="{uid}-kernels"><h2>Kernels <small>({len(kv)})</small></h2>{table}</section>')
    return body, {"kernels": [[r[6], r[7]] for r in kv]}


def _custom_ops_section(c, uid: str) -> str:
    """Per tuned custom-op call site: each candidate's time per range (or at the site's sizes),
    the rejected ones with why, and the winner (fxforge/custom_ops)."""
    sites = c.stats.get("custom_ops") or []
    if not sites:
        return ""

    def us(v: Any) -> str:
        return f"{v * 1e6:,.1f} \u00b5s" if isinstance(v, (int, float)) else "\u2013"

    parts = []
    for site in sites:
        ranges = site.get("ranges") or [{"sizes": None, "times": [site.get("candidates", {})], "winner": site["winner"]}]
        names = list(dict.fromkeys(n for r in ranges for t in r["times"] for n in t)) + list(site.get("rejected", {}))
        head = ["range"] + names
        rows = []
        for r in ranges:
            times = r["times"][0]  # (merged ranges: the times at the first range's size)
            where = "all sizes" if r["sizes"] is None else \
                f"{site.get('dispatch_on', 'size')} in {r['sizes'][0]}..{'' if r['sizes'][1] is None else r['sizes'][1]}"
            cells = [Raw(f"<b>{esc(us(times[n]))}</b>") if n == r["winner"] else
                     ("rejected" if n in site.get("rejected", {}) else us(times.get(n))) for n in names]
            rows.append([where, *cells])
        rejected = "".join(f"<li><code>{esc(n)}</code>: {esc(why)}</li>" for n, why in site.get("rejected", {}).items())
        cached = " (choice read from the disk cache)" if site.get("cached") else ""
        if site.get("context"):
            cached = f"; timed with {site['context']}" + cached
        parts.append(f'<h3><code>{esc(site["op"])}</code> at {esc(site.get("node", ""))}: '
                     f'{esc(site.get("inputs", ""))}{esc(cached)}</h3>'
                     + _table(head, rows, "custom-ops") + (f"<ul>{rejected}</ul>" if rejected else ""))
    return (f'<section id="{uid}-custom-ops"><h2>Custom ops</h2><p class="note">Each candidate\'s least time per '
            f'call; the winner in bold, inlined into the graph (or, per range, called by the wrapper\'s if '
            f'chain); rejected candidates disagreed with the op and were never timed.</p>{"".join(parts)}</section>')


def _regions_section(c, uid: str) -> str:
    """The compiled regions the graph calls: each body once (its own tab), with its call sites."""
    regions = c.stats.get("regions") or []
    if not regions:
        return ""
    rows = [[r["name"], len(r["sites"]), Raw("<br>".join(f"<code>{esc(x)}</code>" for x in r["sites"])), r["nodes_in"],
             r["kernels"], r["fallback_nodes"], fmt_bytes(r["arena_bytes"]), f"{r['compile_seconds']:.2f} s"]
            for r in regions]
    table = _table(["region", "calls", "call sites", "nodes", "kernels", "fallback nodes", "arena", "compiled in"], rows,
                   "regions")
    return (f'<section id="{uid}-regions"><h2>Regions</h2><p class="note">Each <code>invoke_subgraph</code> body '
            f'(<code>torch.compiler.nested_compile_region</code>) is compiled once and called from every site; its '
            f'kernels, memory plan and source are in its own tab.</p>{table}</section>')


def _budget_section(c, uid: str) -> str:
    """Under ``Config.memory_budget``: the step's planned peak against the budget, every value the
    forward saves for the backward with its bytes, every value the backward recomputes with its
    bytes and cost (passes/memory_budget.py)."""
    plan = c.stats.get("memory_budget")
    if not plan:
        return ""
    saved = sorted(plan["saved"].items(), key=lambda kv: -kv[1])
    recomputed = sorted(plan["recomputed"].items(), key=lambda kv: -kv[1]["seconds"])
    rows = [[Raw(f"<code>{esc(n)}</code>"), "saved", fmt_bytes(b), "", ""] for n, b in saved]
    rows += [[Raw(f"<code>{esc(n)}</code>"), "recomputed", fmt_bytes(r["bytes"]), f"{r['flops']:,.0f}",
              f"{r['seconds'] * 1e6:,.1f} \u00b5s"] for n, r in recomputed]
    note = (f"Planned step peak <b>{esc(fmt_bytes(plan['planned_peak_bytes']))}</b> against a budget of "
            f"{esc(fmt_bytes(plan['budget_bytes']))} (the default choice: "
            f"{esc(fmt_bytes(plan['default_peak_bytes']))}); {esc(fmt_bytes(plan['saved_bytes']))} saved for the "
            f"backward, {plan['recomputed_flops']:,.0f} FLOPs recomputed there.")
    return (f'<section id="{uid}-budget"><h2>Memory budget</h2><p class="note">{note}</p>'
            + _table(["value", "", "bytes", "recompute FLOPs", "recompute cost"], rows, "budget") + "</section>")


def _schedule_section(c, uid: str) -> str:
    """A graph with collectives: its schedule replayed under the cost models, kernels and
    collectives side by side (``report/schedule.py``), and each collective's figures."""
    comm = c.stats.get("comm") or {}
    picture = schedule_svg(comm)
    if not picture:
        return ""
    rows = [[Raw(f"<code>{esc(r['node'])}</code>"), r["collective"], r["ranks"], fmt_bytes(r["bytes"]),
             f"{r['estimated_s'] * 1e6:,.1f} \u00b5s", f"{r['exposed_s'] * 1e6:,.1f} \u00b5s"]
            for r in comm.get("collectives", [])]
    note = (f"The schedule replayed with each kernel at its estimated time ({esc(comm.get('compute_model', ''))}) and "
            f"the collectives one after another on their own stream ({esc(comm.get('model', ''))}): "
            f"{comm['count']} collectives, {esc(fmt_bytes(comm['bytes']))} sent, "
            f"{comm['estimated_s'] * 1e3:.3f} ms of communication of which {comm['exposed_s'] * 1e3:.3f} ms exposed "
            f"(red: the compute waits).")
    return (f'<section id="{uid}-schedule"><h2>Schedule</h2><p class="note">{note}</p>{picture}'
            + _table(["collective", "kind", "ranks", "sent", "estimated", "exposed"], rows, "collectives")
            + "</section>")


def _tab_name(c) -> str:
    s = c.stats
    return f"{s.get('graph', 'graph')} region {s['region']}" if s.get("region") else str(s.get("graph", "graph"))


def _with_regions(graphs: list) -> list:
    """The graphs, each followed by the compiled regions it calls that no graph before listed."""
    out, seen = [], set()
    for c in graphs:
        for g in [c, *(r.compiled for r in getattr(c, "regions", []))]:
            if id(g) not in seen:
                seen.add(id(g))
                out.append(g)
    return out


def _stats_section(c, uid: str) -> str:
    rows = [[k, *_stat_value(k, v)] for k, v in c.stats.items()]
    return f'<section id="{uid}-stats"><h2>Stats</h2>{_table(["stat", "value", ""], rows, "stats")}</section>'


def _source_section(c, uid: str) -> str:
    n = c.source.count("\n")
    return (f'<section id="{uid}-source"><h2>Generated source</h2><details class="src"><summary>the wrapper and '
            f'kernel sources ({n:,} lines): the exact code that runs</summary><pre>{esc(c.source)}</pre></details></section>')


def _graph_html(c, i: int, hidden: bool) -> str:
    uid = f"g{i}"
    parts, data = [], {}
    for make in (_memory_section, _graph_section, _passes_section, _kernels_section):
        body, d = make(c, uid)
        parts.append(body)
        data.update(d)
    parts += [_schedule_section(c, uid), _budget_section(c, uid), _regions_section(c, uid),
              _custom_ops_section(c, uid), _stats_section(c, uid), _source_section(c, uid)]
    sections = [("memory", "Memory"), ("graph", "Graph"), ("passes", "Passes"), ("kernels", "Kernels"),
                *([("schedule", "Schedule")] if (c.stats.get("comm") or {}).get("timeline") else []),
                ("stats", "Stats"), ("source", "Source")]
    toc = " ".join(f'<a href="#{uid}-{s}">{t}</a>' for s, t in sections)
    return (f'<section class="graph" id="{uid}" data-g="{i}"{" hidden" if hidden else ""}>{_summary(c)}'
            f'<nav class="toc">{toc}</nav>' + "".join(parts) + _json_block(data, "data") + "</section>")


def render(compiled: Any, *, title: str | None = None, notes: Sequence[str] = ()) -> str:
    """The report page of one ``Compiled`` or of several (one tab each)."""
    graphs = _with_regions(list(compiled) if isinstance(compiled, (list, tuple)) else [compiled])
    kinds = [_tab_name(c) for c in graphs]
    title = title or "fxforge report: " + ", ".join(kinds) + (" graph" if len(kinds) == 1 else " graphs")
    tabs = ""
    if len(graphs) > 1:
        tabs = '<nav class="tabs">' + "".join(
            f'<button type="button" data-tab="{i}"{" class=on" if i == 0 else ""}>{esc(k)}</button>' for i, k in enumerate(kinds)
        ) + "</nav>"
    note_html = "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
    body = "".join(_graph_html(c, i, i > 0) for i, c in enumerate(graphs))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{assets.CSS}</style><script>{assets.ERRORS_JS}</script></head>"
            f"<body><header><h1>{esc(title)}</h1>{tabs}{note_html}</header><main>{body}</main>"
            f'<div class="tip" hidden></div><script>{assets.JS}</script></body></html>\n')


def write_report(compiled: Any, path: str, **kwargs: Any) -> str:
    """Write ``render(compiled, **kwargs)`` to ``path`` (parent directories created); returns it."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    text = render(compiled, **kwargs)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path
