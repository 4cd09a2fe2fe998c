"""Memory planning: every output a backend writes gets a planned buffer.

Buffers whose storage escapes to the caller (graph outputs and views of them) are allocated
fresh on every call, so a later call can never overwrite what an earlier call returned.  All
others live in one arena per device, allocated per call, at aligned offsets:

* static sizes: the offset planners of ``passes/offsets.py`` run (all of them, smallest arena
  wins), so buffers whose lifetimes do not overlap share bytes;
* symbolic sizes: buffers share a *slot* only when their byte sizes are the same expression and
  their lifetimes do not overlap; slots are laid out one after another.  Sound for every size the
  symbols can take (no two live buffers ever overlap), with no re-planning at run time.
"""

from __future__ import annotations

import heapq
import operator

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import FloorDiv

from ..config import Config
from ..graph import ALLOCATES, FALLBACK_BACKEND, VAL, expr, liveness, node_kind, output_nodes, shape_env_of, storage_nbytes, storage_root
from ..plan import Arena, Buffer, Group, MemoryPlan
from .offsets import Interval, plan_offsets, verify_plan


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


def collect_buffers(gm: fx.GraphModule, schedule: list[fx.Node], groups: list[Group]) -> dict[str, Buffer]:
    """One buffer per tensor output of every node a backend runs, with its live range."""
    outputs = output_nodes(gm)
    escaping = {storage_root(o) for o in outputs}
    live = liveness(schedule, outputs)
    pos = {n: i for i, n in enumerate(schedule)}
    buffers: dict[str, Buffer] = {}
    for g in groups:
        if g.backend == FALLBACK_BACKEND:
            continue
        for node in g.nodes:
            if node_kind(node) != "compute" or node.meta.get(ALLOCATES):
                continue  # views, scalars and self-allocating kernels hold no planned buffer
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
    return buffers


def place_static(bufs: list[Buffer], alignment: int) -> tuple[int, str]:
    """Offsets from the best of the offset planners; returns (arena bytes, planner name)."""
    plan = plan_offsets([Interval(b.name, int(b.nbytes), b.start, b.end) for b in bufs], alignment)
    for b in bufs:
        b.offset = sympy.Integer(plan.offsets[b.name])
    return plan.arena_bytes, plan.planner


def place_symbolic(bufs: list[Buffer], alignment: int) -> tuple[sympy.Expr, str]:
    """Slots shared by buffers of the same size expression with disjoint lifetimes."""
    free: dict[sympy.Expr, list[tuple[int, int]]] = {}  # size -> heap of (last end, slot)
    slot_of: dict[str, int] = {}
    slot_sizes: list[sympy.Expr] = []
    for b in sorted(bufs, key=lambda b: (b.start, b.end)):
        heap = free.setdefault(b.nbytes, [])
        if heap and heap[0][0] < b.start:
            _, slot = heapq.heappop(heap)
        else:
            slot = len(slot_sizes)
            slot_sizes.append(b.nbytes)
        slot_of[b.name] = slot
        heapq.heappush(heap, (b.end, slot))
    offsets, at = [], sympy.Integer(0)
    for size in slot_sizes:
        offsets.append(at)
        at = at + align_up(size, alignment)
    for b in bufs:
        b.offset = offsets[slot_of[b.name]]
    return at, "slots"


def plan_memory(gm: fx.GraphModule, schedule: list[fx.Node], groups: list[Group], config: Config) -> MemoryPlan:
    buffers = collect_buffers(gm, schedule, groups)
    by_device: dict[str, list[Buffer]] = {}
    for b in buffers.values():
        if b.kind == "arena":
            by_device.setdefault(str(b.device), []).append(b)
    arenas = []
    for i, bufs in enumerate(by_device.values()):
        name = f"arena{i}"
        for b in bufs:
            b.arena = name
        if all(sympy.sympify(b.nbytes).is_Integer for b in bufs):
            nbytes, planner = place_static(bufs, config.alignment)
            nbytes = sympy.Integer(nbytes)
        else:
            nbytes, planner = place_symbolic(bufs, config.alignment)
        arenas.append(Arena(name, bufs[0].device, nbytes, planner))
    return MemoryPlan(buffers, arenas, config.alignment, shape_env_of(gm))


def verify_memory_plan(plan: MemoryPlan) -> None:
    """Raise ``offsets.PlanError`` if two buffers live at once share bytes (at the traced sizes),
    a buffer leaves its arena, or an offset is misaligned."""
    for a in plan.arenas:
        bufs = [b for b in plan.buffers.values() if b.arena == a.name]
        ivs = [Interval(b.name, plan.hint(b.nbytes), b.start, b.end) for b in bufs]
        verify_plan(ivs, {b.name: plan.hint(b.offset) for b in bufs}, plan.hint(a.nbytes), plan.alignment)
