"""The graph picture: kernel groups along the schedule (SVG overview), nodes for the page's script.

The overview is one rectangle per kernel group in schedule order, its width the group's share
of the compute nodes, coloured by group (the colour its nodes get in the detail view); fallback
groups are red and hatched.  The detail view (drawn by the page's script, a window of the
schedule at a time, so graphs of thousands of nodes stay usable) needs per node: name, op, kind,
group, inputs.  Refused fusions name the last node of each group they would have merged.
"""

from __future__ import annotations

import html
import operator
import re
from typing import Any

from ..core.graph import FALLBACK_BACKEND, node_kind, op_display
from .memory import W, _hue

KINDS = {"placeholder": "in", "get_attr": "attr", "output": "out", "view": "view", "getitem": "item",
         "scalar": "scalar", "compute": "op"}


def _op_label(n) -> str:
    if n.op == "placeholder":
        return "input"
    if n.op == "get_attr":
        return "get_attr " + str(n.target)
    if n.op == "call_function" and n.target is operator.getitem:
        return f"getitem [{n.args[1]}]"
    name = op_display(n.target)
    return name[len("aten."):] if name.startswith("aten.") else name


def kernel_of_group(kernels: list) -> dict[int, str]:
    """Group id -> kernel name (the wrapper names each group's kernel ``kernel<id>``)."""
    out = {}
    for k in kernels:
        m = re.match(r"kernel(\d+)", getattr(k, "name", ""))
        if m:
            out.setdefault(int(m.group(1)), k.name)
    return out


def graph_view(compiled, uid: str = "g0") -> dict[str, Any]:
    plan = compiled.plan
    sched = list(plan.schedule)
    index = {n: i for i, n in enumerate(sched)}
    data = getattr(compiled, "report_data", None)
    kernel_names = kernel_of_group(data.kernels if data is not None else [])
    groups = [g for g in plan.groups if g.nodes]
    gidx = {g.id: i for i, g in enumerate(groups)}
    fallbacks = compiled.stats.get("fallbacks", {})
    reasons: list[str] = []
    reason_ix: dict[str, int] = {}
    nodes = []
    for n in sched:
        g = plan.group_of(n)
        r = fallbacks.get(n.name)
        if r is not None and r not in reason_ix:
            reason_ix[r] = len(reasons)
            reasons.append(r)
        nodes.append([
            n.name,
            _op_label(n),
            KINDS.get(node_kind(n), "op"),
            gidx[g.id] if g is not None else -1,
            [index[a] for a in n.all_input_nodes if a in index],
            reason_ix[r] if r is not None else -1,
        ])
    group_rows = []
    for g in groups:
        demoted = any(n.name in fallbacks for n in g.nodes)
        group_rows.append([g.id, g.backend, kernel_names.get(g.id, ""), [index[n] for n in g.nodes if n in index],
                           1 if (g.backend == FALLBACK_BACKEND or demoted) else 0, _hue(g.id)])
    return {
        "nodes": nodes,
        "groups": group_rows,
        "reasons": reasons,
        "refused": list(compiled.stats.get("refused", [])),
        "overview_svg": overview_svg(group_rows, uid),
    }


def overview_svg(groups: list[list], uid: str) -> str:
    """Kernel groups in schedule order, width proportional to their node count."""
    total = sum(max(len(g[3]), 1) for g in groups) or 1
    h = 26.0
    parts, x = [], 0.0
    for i, (gid, backend, kernel, members, fallback, hue) in enumerate(groups):
        w = max(len(members), 1) * W / total
        cls = "grp fb" if fallback else "grp"
        fill = f"url(#hatch-{uid})" if fallback else f"hsl({hue},55%,60%)"
        parts.append(f'<rect class="{cls}" x="{x:.2f}" y="0" width="{w:.2f}" height="{h:g}" fill="{fill}" data-g="{i}"/>')
        x += w
    hatch = (
        f'<pattern id="hatch-{uid}" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="6" height="6" fill="#e5484d"/><line x1="0" y1="0" x2="0" y2="6" stroke="#7a1013" stroke-width="3"/></pattern>'  # noqa: E501
    )
    return (f'<svg class="overview" viewBox="0 -2 {W:g} {h + 4:g}" preserveAspectRatio="none" role="img" '
            f'aria-label="{html.escape("kernel groups in schedule order")}"><defs>{hatch}</defs>' + "".join(parts) + "</svg>")
