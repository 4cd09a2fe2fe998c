"""Memory planning: every output a backend writes gets a planned buffer.

Buffers whose storage escapes to the caller (graph outputs and views of them) are allocated
fresh on every call, so a later call can never overwrite what an earlier call returned.  All
others live in one arena per device, allocated per call, at aligned offsets.  The offsets here
are sequential (no reuse); the planners of ``passes/offsets.py`` replace them.
"""

from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import FloorDiv

from ..config import Config
from ..graph import FALLBACK_BACKEND, VAL, expr, liveness, node_kind, output_nodes, shape_env_of, storage_nbytes, storage_root
from ..plan import Arena, Buffer, Group, MemoryPlan


def align_up(e: sympy.Expr, alignment: int) -> sympy.Expr:
    e = sympy.sympify(e)
    if e.is_Integer:
        return sympy.Integer(-(-int(e) // alignment) * alignment)
    return FloorDiv(e + (alignment - 1), alignment) * alignment


def slot_values(node: fx.Node) -> list[tuple[int | None, torch.Tensor, fx.Node | None]]:
    """(index, fake value, node holding the value) for every tensor output of a compute node."""
    val = node.meta[VAL]
    if isinstance(val, torch.Tensor):
        return [(None, val, node)]
    getitems = {u.args[1]: u for u in node.users if u.target is operator.getitem}
    return [(i, v, getitems.get(i)) for i, v in enumerate(val) if isinstance(v, torch.Tensor)]


def plan_memory(gm: fx.GraphModule, schedule: list[fx.Node], groups: list[Group], config: Config) -> MemoryPlan:
    outputs = output_nodes(gm)
    escaping = {storage_root(o) for o in outputs}
    live = liveness(schedule, outputs)
    pos = {n: i for i, n in enumerate(schedule)}
    buffers: dict[str, Buffer] = {}
    for g in groups:
        if g.backend == FALLBACK_BACKEND:
            continue
        for node in g.nodes:
            if node_kind(node) != "compute":
                continue  # views and scalars a fusion pass put in the group hold no buffer
            for index, val, holder in slot_values(node):
                name = holder.name if holder is not None else f"{node.name}_out{index}"
                l = live.get(holder) if holder is not None else None
                start, end = (l.start, l.end) if l is not None else (pos[node], pos[node])
                buffers[name] = Buffer(
                    name=name,
                    producer=node,
                    index=index,
                    dtype=val.dtype,
                    device=val.device,
                    shape=tuple(expr(s) for s in val.shape),
                    stride=tuple(expr(s) for s in val.stride()),
                    nbytes=storage_nbytes(val),
                    kind="fresh" if holder is not None and holder in escaping else "arena",
                    start=start,
                    end=end,
                )
    arenas: dict[str, Arena] = {}
    for b in buffers.values():
        if b.kind != "arena":
            continue
        key = str(b.device)
        if key not in arenas:
            arenas[key] = Arena(f"arena{len(arenas)}", b.device, sympy.Integer(0))
        a = arenas[key]
        b.arena, b.offset = a.name, a.nbytes
        a.nbytes = a.nbytes + align_up(b.nbytes, config.alignment)
    return MemoryPlan(buffers, list(arenas.values()), config.alignment, shape_env_of(gm))
