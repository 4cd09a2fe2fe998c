"""The schedule picture of a graph with collectives: its replay under the cost models
(``stats["comm"]["timeline"]``, ``passes/overlap.replay``) as two lanes over estimated time, the
kernels on the compute lane and the collectives on the communication lane, with the stretches
where the compute waits for a collective (the exposed communication) marked on the compute lane."""

from __future__ import annotations

import html

from .memory import W

LANES = {"compute": 0, "stall": 0, "comm": 1}
COLOURS = {"compute": "#4c78a8", "stall": "#d62728", "comm": "#f58518"}
LANE_H, TOP, LEFT = 22, 18, 110


def _time(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} \u00b5s"


def schedule_svg(comm: dict) -> str:
    """The timeline of ``comm`` (a graph's ``stats["comm"]``) as an SVG, or "" where it has none."""
    events = comm.get("timeline") or []
    end = max((e[3] for e in events), default=0.0)
    if not events or end <= 0:
        return ""
    width = W - LEFT - 10
    scale = width / end
    parts = [f'<text x="4" y="{TOP + LANE_H * i + 15}" font-size="12">{name}</text>'
             for i, name in enumerate(("compute", "communication"))]
    for lane, name, start, stop in events:
        x, w = LEFT + start * scale, max((stop - start) * scale, 0.5)
        what = {"compute": "kernel from", "comm": "collective", "stall": "waits for"}[lane]
        tip = f"{what} {name}: {_time(start)} \u2013 {_time(stop)} ({_time(stop - start)})"
        parts.append(f'<rect x="{x:.2f}" y="{TOP + LANE_H * LANES[lane] + 2}" width="{w:.2f}" height="{LANE_H - 4}" '
                     f'fill="{COLOURS[lane]}"><title>{html.escape(tip)}</title></rect>')
    for i in range(5):  # time ticks
        t = end * i / 4
        x = LEFT + t * scale
        parts.append(f'<line x1="{x:.2f}" y1="{TOP - 2}" x2="{x:.2f}" y2="{TOP + 2 * LANE_H}" stroke="#999" '
                     f'stroke-dasharray="2,3"/><text x="{x:.2f}" y="12" font-size="10" '
                     f'text-anchor="{"start" if i == 0 else "end" if i == 4 else "middle"}">{_time(t)}</text>')
    return (f'<svg class="schedule" width="{W}" height="{TOP + 2 * LANE_H + 6}" viewBox="0 0 {W} {TOP + 2 * LANE_H + 6}" '
            f'font-family="sans-serif">' + "".join(parts) + "</svg>")
