"""The memory picture: arenas and buffers over the schedule (SVG), and live bytes over steps.

Panel 1 (``memory_svg``), after PyTorch's memory_viz: x = schedule position, y = address.  Each
arena is a band, placed where it would sit in one address space (first fit over its live
window, so arenas that never live together share addresses); each arena buffer is a rectangle at
its offset over its live range.  Buffers allocated fresh (graph outputs, escaping views) are
packed the same way in a panel of their own.  One ``<rect class="buf">`` per planned buffer, in
``plan.memory.buffers`` order, so the picture can be checked against the plan.  Arena buffers get
a hue each; kinds in ``KIND_PATTERN`` (``slice``: a region of a zero-copy cat/pad result, drawn
over it; ``symmetric``: a buffer of a symmetric-memory arena) are filled with a pattern of their own
(``<pattern class="kind-KIND">``) and a dark outline, so they stay apart from any hue.  What a
buffer's hover shows is ``hover_lines``, sent with the page.  A dashed line marks the lower
bound (most bytes of arena buffers live at once), a solid one the arena bytes.

Panel 2 (``curves``): bytes of all storages the graph creates, live at each step, in the input
graph's own (eager) order and in fxforge's schedule, plus the arenas allocated at each step.
Their maxima are ``stats["eager_live_peak_bytes"]`` and ``stats["schedule_peak_bytes"]``.
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable, Sequence

from ..core.graph import liveness, output_nodes
from ..passes.schedule import fused_layout, program_order, storage_sizes
from .record import rebuild

W = 1000.0  # viewBox width of every x axis
KIND_HUE = {"arena": None, "fresh": 28}  # None: hue per buffer; other kinds get EXTRA_HUES in turn
EXTRA_HUES = (285, 350, 120, 55)
# Kinds drawn with a pattern instead of a hue: (pattern, background, ink, legend text).
KIND_PATTERN = {
    "slice": ("hatch", "#f3e8ff", "#6b21a8", "hatched: a region of a cat/pad result, written in place"),
    "symmetric": ("dots", "#ccfbf1", "#0f766e", "dotted: in the symmetric arena"),
}
MIN_H = 0.8  # least height drawn, in viewBox units, so a small buffer stays visible and hoverable


def fmt_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f}".rstrip("0").rstrip(".") + f" {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


def pack(items: Sequence[tuple[int, int, int]]) -> tuple[list[int], int]:
    """First-fit addresses for (start, end, nbytes) items that may not overlap while both live.
    Returns each item's address and the total height.  Cost: items x (items live at once)^2."""
    order = sorted(range(len(items)), key=lambda i: (items[i][0], -items[i][2]))
    addr = [0] * len(items)
    active: list[int] = []
    top = 0
    for i in order:
        s, e, n = items[i]
        active = [j for j in active if items[j][1] >= s]
        spans = sorted((addr[j], addr[j] + items[j][2]) for j in active)
        y = 0
        for lo, hi in spans:
            if y + n <= lo:
                break
            y = max(y, hi)
        addr[i] = y
        active.append(i)
        top = max(top, y + n)
    return addr, top


def _hue(i: int) -> int:
    return int(i * 137.508) % 360  # golden angle: neighbours differ


def _colour(kind: str, i: int, extra: dict[str, int]) -> str:
    hue = KIND_HUE.get(kind, -1)
    if hue is None:
        return f"hsl({_hue(i)},55%,{52 + (i % 3) * 8}%)"
    if hue == -1:
        hue = extra.setdefault(kind, EXTRA_HUES[len(extra) % len(EXTRA_HUES)])
    return f"hsl({hue},70%,{50 + (i % 3) * 7}%)"


def _pattern_svg(pid: str, kind: str) -> str:
    shape, bg, ink, _ = KIND_PATTERN[kind]
    if shape == "hatch":
        return (f'<pattern id="{pid}" class="kind-{kind}" patternUnits="userSpaceOnUse" width="6" height="6" '
                f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{bg}"/>'
                f'<rect width="2.4" height="6" fill="{ink}"/></pattern>')
    return (f'<pattern id="{pid}" class="kind-{kind}" patternUnits="userSpaceOnUse" width="5" height="5">'
            f'<rect width="5" height="5" fill="{bg}"/><circle cx="2.5" cy="2.5" r="1.3" fill="{ink}"/></pattern>')


def swatch_css(kind: str, colour: str = "") -> str:
    """The legend swatch's CSS background: the kind's pattern as a CSS gradient, else ``colour``."""
    if kind not in KIND_PATTERN:
        return colour
    shape, bg, ink, _ = KIND_PATTERN[kind]
    if shape == "hatch":
        return f"repeating-linear-gradient(45deg,{ink} 0 2px,{bg} 2px 4.5px)"
    return f"radial-gradient({ink} 35%,{bg} 40%) 0 0/5px 5px"


def hover_lines(row: Sequence[Any]) -> list[str]:
    """What hovering a buffer shows, from its row in ``memory_view(...)["buffers"]``: name, dtype
    and shape; producer; lifetime in schedule steps; size; where its bytes are."""
    name, shape, dtype, producer, start, end, nbytes, offset, where, kind, reuses = row
    if kind == "slice":
        place = f"{where} (written in place into a cat/pad result)"
    elif where == "fresh":
        place = f"allocated fresh per call (kind {kind})"
    else:
        place = f"in {where} at offset " + ("?" if offset is None else f"{offset:,}")
    return [f"{name}  {dtype} {shape}", f"producer: {producer or '-'}",
            f"live: steps {start}..{end} ({end - start + 1} steps)", f"size: {fmt_bytes(nbytes)} ({nbytes:,} B)",
            place, f"written in place over {reuses}" if reuses else "click: show the producer in the graph"]


def _ticks(top: float, n: int = 4, binary: bool = True) -> list[float]:
    """Tick values from 0 to ``top``: round numbers of bytes (KiB, MiB... multiples) or of steps."""
    if top <= 0:
        return [0.0]
    unit = 1.0
    if binary:
        while top / unit >= 1024 and unit < 1024 ** 3:
            unit *= 1024
    raw = top / unit / n
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    step = max(step, 1.0) if not binary else step
    return [k * step * unit for k in range(int(top / unit // step) + 1)]


class Panel:
    """One SVG panel: x over ``steps`` positions, y over ``top`` bytes (address or live bytes).

    Data goes in ``plot`` (inside a clipped ``<g class="plot">`` the page's script scales along x
    to zoom), labels in ``axis`` (never scaled)."""

    def __init__(self, steps: int, top: float, height: float, label: str, uid: str):
        self.steps, self.top, self.h, self.label, self.uid = max(steps, 1), max(top, 1), height, label, uid
        self.plot: list[str] = []
        self.axis: list[str] = []
        self.defs: dict[str, str] = {}

    def fill(self, kind: str, i: int, extra: dict[str, int]) -> str:
        """The fill of buffer ``i`` of ``kind``: its pattern (defined once in this panel) or colour."""
        if kind not in KIND_PATTERN:
            return _colour(kind, i, extra)
        pid = f"{self.uid}-{kind}"
        if kind not in self.defs:
            self.defs[kind] = _pattern_svg(pid, kind)
        return f"url(#{pid})"

    def x(self, step: float) -> float:
        return step * W / self.steps

    def y(self, b: float) -> float:
        return self.h - b * self.h / self.top

    def axes(self) -> None:
        for t in _ticks(self.top):
            y = self.y(t)
            self.plot.append(f'<line class="grid" x1="0" x2="{W:g}" y1="{y:.1f}" y2="{y:.1f}"/>')
            self.axis.append(f'<text class="tick" x="-4" y="{y + 3:.1f}">{html.escape(fmt_bytes(t))}</text>')

    def hline(self, b: float, cls: str, text: str) -> None:
        y = self.y(b)
        self.plot.append(f'<line class="{cls}" x1="0" x2="{W:g}" y1="{y:.1f}" y2="{y:.1f}"/>')
        x, anchor = (W - 4, "end") if cls == "lb" else (4, "start")
        self.axis.append(f'<text class="{cls}-t" x="{x:g}" y="{y - 3:.1f}" text-anchor="{anchor}">{html.escape(text)}</text>')

    def svg(self, cls: str, data_attrs: str = "") -> str:
        clip = f"clip-{self.uid}"
        return (f'<svg class="{cls}" viewBox="-72 -10 {W + 80:g} {self.h + 26:g}" role="img" '
                f'aria-label="{html.escape(self.label)}" data-steps="{self.steps}"{data_attrs}>'
                + (f'<defs>{"".join(self.defs.values())}</defs>' if self.defs else "") +
                f'<clipPath id="{clip}"><rect x="0" y="-10" width="{W:g}" height="{self.h + 10:g}"/></clipPath>'
                f'<g clip-path="url(#{clip})"><g class="plot">' + "".join(self.plot) + "</g></g>"
                + "".join(self.axis) + f'<g class="xticks" transform="translate(0,{self.h + 13:g})"></g></svg>')


def _root_and_offset(b, mem) -> tuple[Any, int]:
    """The buffer holding ``b``'s bytes, and where ``b``'s first byte is in it.  A ``slice``
    buffer (a zero-copy cat/pad input: a region of its ``base``, laid out with the base's
    strides) starts at the region's first element; the bytes it spans may interleave with its
    neighbours' when the region is not along the outermost dim."""
    off = 0
    while b.kind == "slice" and getattr(b, "base", None) in mem.buffers:
        parent = mem.buffers[b.base]
        region = getattr(b, "region", None) or ()
        off += sum(mem.hint(r) * mem.hint(st) for r, st in zip(region, parent.stride)) * parent.dtype.itemsize
        b = parent
    return b, off


def _kind(b, symmetric: set) -> str:
    """How a buffer is drawn: its plan kind, or ``symmetric`` for a buffer of a symmetric arena."""
    return "symmetric" if b.kind == "arena" and b.arena in symmetric else b.kind


def _where(b, mem) -> str:
    if b.kind == "slice" and getattr(b, "base", None):
        try:
            return f"in {b.base}[{mem.region_text(b)}]"
        except Exception:
            return f"in {b.base}"
    return b.arena if b.kind == "arena" and b.arena else "fresh"


def memory_view(compiled, uid: str = "g0") -> dict[str, Any]:
    """The memory picture's SVG and the JSON its hover needs."""
    plan = compiled.plan
    mem = plan.memory
    hint = mem.hint
    steps = len(plan.schedule)
    arenas = list(mem.arenas)
    a_items = [(a.start, a.end, hint(a.nbytes)) for a in arenas]
    a_addr, a_top = pack(a_items)
    base = {a.name: a_addr[i] for i, a in enumerate(arenas)}
    buffers = list(mem.buffers.values())
    symmetric = {a.name for a in arenas if a.symmetric is not None}
    kinds_of = [_kind(b, symmetric) for b in buffers]
    located = [_root_and_offset(b, mem) for b in buffers]
    # buffers holding their own bytes outside any arena (graph outputs...): packed in a panel of their own
    fresh = [b for b in buffers if b.kind != "slice" and not (b.kind == "arena" and b.arena in base)]
    f_addr, f_top = pack([(b.start, b.end, hint(b.nbytes)) for b in fresh])
    f_at = {b.name: f_addr[i] for i, b in enumerate(fresh)}

    stats = compiled.stats
    arena_panel = Panel(steps, max(a_top, stats.get("arena_bytes", 0), 1), 260.0,
                        "arenas: buffers by address over the schedule", f"{uid}-arenas")
    arena_panel.axes()
    for i, a in enumerate(arenas):
        s, e, n = a_items[i]
        x0, x1 = arena_panel.x(s), arena_panel.x(e + 1)
        y0, y1 = arena_panel.y(a_addr[i] + n), arena_panel.y(a_addr[i])
        arena_panel.plot.append(f'<rect class="arena" x="{x0:.2f}" y="{y0:.2f}" width="{x1 - x0:.2f}" '
                                f'height="{max(y1 - y0, MIN_H):.2f}" data-a="{i}"/>')
    fresh_panel = Panel(steps, max(f_top, 1), 110.0, "fresh allocations (graph outputs)", f"{uid}-fresh")
    fresh_panel.axes()
    extra: dict[str, int] = {}
    rows = []
    # slices after the buffers they are regions of, so they are drawn on top
    for i in sorted(range(len(buffers)), key=lambda i: buffers[i].kind == "slice"):
        b, (root, off) = buffers[i], located[i]
        n = hint(b.nbytes)
        in_fresh = root.name in f_at
        p = fresh_panel if in_fresh else arena_panel
        addr = (f_at[root.name] if in_fresh else base.get(root.arena, 0) + hint(root.offset or 0)) + off
        x0, x1 = p.x(b.start), p.x(b.end + 1)
        y0, y1 = p.y(addr + n), p.y(addr)
        kind = kinds_of[i]
        cls = "buf" + (" reuse" if b.reuses else "") + (f" {kind}" if kind in KIND_PATTERN else "")
        p.plot.append(f'<rect class="{cls}" x="{x0:.2f}" y="{y0:.2f}" width="{max(x1 - x0, 0.3):.2f}" '
                      f'height="{max(y1 - y0, MIN_H):.2f}" fill="{p.fill(kind, i, extra)}" data-i="{i}"/>')
    for i, b in enumerate(buffers):
        rows.append([b.name, "(" + ", ".join(str(s) for s in b.shape) + ")", str(b.dtype).replace("torch.", ""),
                     b.producer.name if b.producer is not None else "", b.start, b.end, hint(b.nbytes),
                     hint(b.offset) if b.offset is not None else None, _where(b, mem), kinds_of[i], b.reuses or ""])
    lb = stats.get("lower_bound_bytes", 0)
    if stats.get("arena_bytes"):
        arena_panel.hline(stats["arena_bytes"], "ab", f"arenas live at once: {fmt_bytes(stats['arena_bytes'])}")
    if lb:
        arena_panel.hline(lb, "lb", f"lower bound {fmt_bytes(lb)}")
    kinds = sorted(set(kinds_of) | {"arena"})
    notes = {"arena": "a hue per buffer", **{k: v[3] for k, v in KIND_PATTERN.items()}}
    legend = [(k, swatch_css(k, _colour(k, 0, extra)), notes.get(k, "")) for k in kinds]
    return {
        "arena_svg": arena_panel.svg("mem arenas-svg"),
        "fresh_svg": fresh_panel.svg("mem fresh-svg") if f_at else "",
        "buffers": rows,
        "tips": [hover_lines(r) for r in rows],
        "arenas": [[a.name, str(a.device), a_items[i][2], a.start, a.end, a.planner] for i, a in enumerate(arenas)],
        "legend": legend,
        "packed_bytes": a_top,
        "fresh_bytes": f_top,
        "steps": steps,
        "in_arenas": sum(1 for r, _ in located if r.name not in f_at),
    }


# --------------------------------------------------------------------------- live bytes over steps


def _curve(ranges: Iterable[tuple[int, int, int]], steps: int) -> list[int]:
    delta = [0] * (steps + 1)
    for s, e, n in ranges:
        if n and 0 <= s < steps:
            delta[s] += n
            delta[min(e, steps - 1) + 1] -= n
    out, cur = [], 0
    for d in delta[:steps]:
        cur += d
        out.append(cur)
    return out


def live_curve(gm, order: list, fused: Iterable[int] = ()) -> list[int]:
    """Bytes of graph-created storages live at each position of ``order`` (as ``peak_bytes``
    counts them: its maximum is ``peak_bytes(gm, order, fused=fused)``)."""
    sizes = storage_sizes(gm, order)
    pos, internal = fused_layout(gm, order, fused)
    live = liveness(order, output_nodes(gm), pos)
    return _curve(((l.start, l.end, sizes[r]) for r, l in live.items() if r in sizes and r not in internal), len(order))


def curves(compiled) -> dict[str, Any]:
    """Live bytes per step: eager (the input graph in its own order), fxforge's schedule, arenas."""
    plan = compiled.plan
    out: dict[str, Any] = {}
    data = getattr(compiled, "report_data", None)
    if data is not None and data.sketch:
        g = rebuild(data.sketch)
        order = program_order(g)
        out["eager"] = live_curve(g, order)
        out["eager_names"] = [n.name for n in order]
    sched = list(plan.schedule)
    fused = {g.id for g in plan.groups if g.fused}
    out["schedule"] = live_curve(compiled.graph, sched, fused)
    out["schedule_names"] = [n.name for n in sched]
    mem = plan.memory
    out["arenas"] = _curve(((a.start, a.end, mem.hint(a.nbytes)) for a in mem.arenas), len(sched))
    return out


def _step_path(p: Panel, values: Sequence[int], limit: int = 2500) -> str:
    """An SVG path of a step function; above ``limit`` points each bucket keeps its maximum."""
    n = len(values)
    k = max(1, -(-n // limit))
    d = [f"M0 {p.y(0):.1f}"]
    for i in range(0, n, k):
        v = max(values[i:i + k])
        d.append(f"V{p.y(v):.1f}H{p.x(min(i + k, n)):.1f}")
    d.append(f"V{p.y(0):.1f}")
    return "".join(d)


def curves_svg(c: dict[str, Any], uid: str = "g0") -> str:
    steps = max(len(c.get("eager", ())), len(c["schedule"]), 1)
    top = max([1, *c.get("eager", ()), *c["schedule"], *c["arenas"]])
    p = Panel(steps, top * 1.05, 170.0, "live bytes over steps: eager order vs fxforge schedule", f"{uid}-curves")
    p.axes()
    for key in ("arenas", "eager", "schedule"):
        if c.get(key):
            p.plot.append(f'<path class="curve {key}" d="{_step_path(p, c[key])}"/>')
    p.plot.append('<line class="cursor" x1="-10" x2="-10" y1="0" y2="170"/>')
    return p.svg("mem curves-svg", f' data-steps="{steps}"')
