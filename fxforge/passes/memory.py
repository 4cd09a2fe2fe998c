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
from .offsets import Interval, PlanError, plan_offsets, verify_plan


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


_STORAGE_OFFSET_OPS = {
    torch.ops.aten.as_strided.default,
    torch.ops.aten.as_strided_copy.default,
    torch.ops.aten.as_strided_scatter.default,
}


def positions(schedule: list[fx.Node], groups: list[Group]) -> dict[fx.Node, int]:
    """Schedule positions for liveness: every node of a fused group (and every getitem of one)
    sits at the group's position, since one kernel reads all its inputs and writes all its
    outputs; nodes of other groups run one after another at their own positions."""
    pos = {n: i for i, n in enumerate(schedule)}
    for g in groups:
        if g.fused and len(g.nodes) > 1:
            at = max(pos[n] for n in g.nodes)
            for n in g.nodes:
                pos[n] = at
                for u in n.users:
                    if u.target is operator.getitem and u in pos:
                        pos[u] = at
    return pos


def collect_buffers(gm: fx.GraphModule, schedule: list[fx.Node], groups: list[Group],
                    pos: dict[fx.Node, int]) -> dict[str, Buffer]:
    """One buffer per tensor output of every node a backend runs, with its live range (fused
    groups: per output of the group only)."""
    outputs = output_nodes(gm)
    escaping = {storage_root(o) for o in outputs}
    # as_strided's offset counts from the start of the storage: a buffer it reads must own its
    # storage, not be a view into the arena.
    escaping |= {storage_root(n.args[0]) for n in gm.graph.nodes if n.target in _STORAGE_OFFSET_OPS}
    live = liveness(schedule, outputs, pos)
    buffers: dict[str, Buffer] = {}
    for g in groups:
        if g.backend == FALLBACK_BACKEND:
            continue
        written = set(g.outputs) if g.fused else None
        for node in g.nodes:
            if node_kind(node) != "compute" or node.meta.get(ALLOCATES):
                continue  # views, scalars and self-allocating kernels hold no planned buffer
            if written is not None and node not in written:
                continue  # stays inside the fused kernel
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


def inplace_source(node: fx.Node, out: Buffer, buffers: dict[str, Buffer], pos: dict[fx.Node, int]) -> Buffer | None:
    """An arena buffer a pointwise node may overwrite with its output: read only here, by this
    node, through exactly one reference to its root, with the output's dtype, shape and stride."""
    if torch.Tag.pointwise not in getattr(node.target, "tags", ()):
        return None
    tensor_inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get(VAL), torch.Tensor)]
    for a in tensor_inputs:
        src = buffers.get(a.name)
        if (
            src is not None
            and src.kind == "arena"
            and src.index is None
            and src.end == pos[node]
            and sum(storage_root(b) is storage_root(a) for b in tensor_inputs) == 1
            and storage_root(a) is a
            and (src.dtype, src.shape, src.stride, src.nbytes) == (out.dtype, out.shape, out.stride, out.nbytes)
        ):
            return src
    return None


def blocks(bufs: list[Buffer]) -> dict[str, list[Buffer]]:
    """Buffers sharing one region through in-place reuse, keyed by the first one's name."""
    by_name = {b.name: b for b in bufs}
    out: dict[str, list[Buffer]] = {}
    for b in sorted(bufs, key=lambda b: b.start):
        head = b
        while head.reuses is not None and head.reuses in by_name:
            head = by_name[head.reuses]
        out.setdefault(head.name, []).append(b)
    return out


def block_intervals(bufs: list[Buffer]) -> dict[str, tuple[sympy.Expr, int, int]]:
    """(bytes, first start, last end) of every block."""
    return {k: (ms[0].nbytes, min(m.start for m in ms), max(m.end for m in ms)) for k, ms in blocks(bufs).items()}


def place_static(spans: dict[str, tuple[sympy.Expr, int, int]], alignment: int) -> tuple[dict[str, sympy.Expr], int, str]:
    """Offsets from the best of the offset planners: (offsets, arena bytes, planner name)."""
    plan = plan_offsets([Interval(k, int(n), s, e) for k, (n, s, e) in spans.items()], alignment)
    return {k: sympy.Integer(o) for k, o in plan.offsets.items()}, plan.arena_bytes, plan.planner


def place_symbolic(spans: dict[str, tuple[sympy.Expr, int, int]], alignment: int) -> tuple[dict[str, sympy.Expr], sympy.Expr, str]:
    """Slots shared by blocks of the same size expression with disjoint lifetimes."""
    free: dict[sympy.Expr, list[tuple[int, int]]] = {}  # size -> heap of (last end, slot)
    slot_of: dict[str, int] = {}
    slot_sizes: list[sympy.Expr] = []
    for k, (nbytes, start, end) in sorted(spans.items(), key=lambda kv: (kv[1][1], kv[1][2])):
        heap = free.setdefault(nbytes, [])
        if heap and heap[0][0] < start:
            _, slot = heapq.heappop(heap)
        else:
            slot = len(slot_sizes)
            slot_sizes.append(nbytes)
        slot_of[k] = slot
        heapq.heappush(heap, (end, slot))
    offsets, at = [], sympy.Integer(0)
    for size in slot_sizes:
        offsets.append(at)
        at = at + align_up(size, alignment)
    return {k: offsets[s] for k, s in slot_of.items()}, at, "slots"


def plan_memory(gm: fx.GraphModule, schedule: list[fx.Node], groups: list[Group], config: Config) -> MemoryPlan:
    pos = positions(schedule, groups)
    buffers = collect_buffers(gm, schedule, groups, pos)
    if config.inplace:
        # one kernel reading and writing several values at different indices may not overwrite
        # its own inputs
        multi = {n for g in groups if g.fused and len(g.nodes) > 1 for n in g.nodes}
        for b in sorted(buffers.values(), key=lambda b: b.start):
            if b.kind == "arena" and b.index is None and b.producer not in multi:
                src = inplace_source(b.producer, b, buffers, pos)
                if src is not None:
                    b.reuses = src.name
    by_device: dict[str, list[Buffer]] = {}
    for b in buffers.values():
        if b.kind == "arena":
            by_device.setdefault(str(b.device), []).append(b)
    arenas = []
    for i, bufs in enumerate(by_device.values()):
        name = f"arena{i}"
        spans = block_intervals(bufs)
        if all(sympy.sympify(n).is_Integer for n, _, _ in spans.values()):
            offsets, nbytes, planner = place_static(spans, config.alignment)
            nbytes = sympy.Integer(nbytes)
        else:
            offsets, nbytes, planner = place_symbolic(spans, config.alignment)
        for head, members in blocks(bufs).items():
            for b in members:
                b.arena, b.offset = name, offsets[head]
        arenas.append(Arena(name, bufs[0].device, nbytes, planner))
    return MemoryPlan(buffers, arenas, config.alignment, shape_env_of(gm))


def arena_intervals(plan: MemoryPlan, arena: str) -> list[Interval]:
    """One interval per block of ``arena`` at the traced sizes (in-place chains are one block)."""
    spans = block_intervals([b for b in plan.buffers.values() if b.arena == arena])
    return [Interval(k, plan.hint(n), s, e) for k, (n, s, e) in spans.items()]


def verify_memory_plan(plan: MemoryPlan) -> None:
    """Raise ``offsets.PlanError`` if two buffers live at once share bytes (at the traced sizes),
    a buffer leaves its arena, or an offset is misaligned.  A buffer written in place over an
    input it replaces shares that input's bytes by design; every other overlap is an error."""
    for a in plan.arenas:
        members = blocks([b for b in plan.buffers.values() if b.arena == a.name])
        if any(len({plan.hint(m.offset) for m in ms}) != 1 for ms in members.values()):
            raise PlanError(f"an in-place chain in {a.name} does not share one offset")
        offsets = {k: plan.hint(ms[0].offset) for k, ms in members.items()}
        verify_plan(arena_intervals(plan, a.name), offsets, plan.hint(a.nbytes), plan.alignment)
