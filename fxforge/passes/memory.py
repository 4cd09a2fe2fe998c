"""Memory planning: every output a backend writes gets a planned buffer.

Buffers whose storage escapes to the caller (graph outputs and views of them) are allocated
fresh on every call, so a later call can never overwrite what an earlier call returned.  All
others live in arenas, allocated per call, at aligned offsets.

An arena lives only over a window of the schedule: the wrapper allocates it just before the
kernel writing its first buffer and drops it with its last buffer (``Arena.start``/``end``).  One
arena held for the whole call would coexist with everything else the call holds at its ends: in
a backward graph, every saved activation still alive at the start; in a forward graph, every
activation saved by the end.  So the buffers of each device are split by start position into
windows, chosen (``split_windows``) to lower the peak of arenas live at any position plus every
other storage live there (inputs until their last use, fresh outputs, self-allocating kernels'
results), each window planned on its own:

* static sizes: the offset planners of ``passes/offsets.py`` run (all of them, smallest arena
  wins), so buffers whose lifetimes do not overlap share bytes;
* symbolic sizes: buffers share a *slot* only when their byte sizes are the same expression and
  their lifetimes do not overlap; slots are laid out one after another.  Sound for every size the
  symbols can take (no two live buffers ever overlap), with no re-planning at run time.
"""

from __future__ import annotations

import heapq
import operator

import numpy as np
import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import FloorDiv

from ..config import Config
from ..graph import ALLOCATES, FALLBACK_BACKEND, VAL, Live, expr, hint, liveness, node_kind, output_nodes, peak_live_bytes, shape_env_of, storage_nbytes, storage_root
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


def collect_buffers(gm: fx.GraphModule, groups: list[Group], pos: dict[fx.Node, int],
                    live: dict[fx.Node, Live]) -> dict[str, Buffer]:
    """One buffer per tensor output of every node a backend runs, with its live range (fused
    groups: per output of the group only)."""
    outputs = output_nodes(gm)
    escaping = {storage_root(o) for o in outputs}
    # as_strided's offset counts from the start of the storage: a buffer it reads must own its
    # storage, not be a view into the arena.
    escaping |= {storage_root(n.args[0]) for n in gm.graph.nodes if n.target in _STORAGE_OFFSET_OPS}
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


# Row-wise kernels whose output may overwrite one input (by argument index): they read a whole row
# of it (the row sum) before writing that row, and then write each element from the same element
# of that input (softmax / log-softmax backward, CPU and CUDA kernels alike).
_ROWWISE_INPLACE = {
    torch.ops.aten._softmax_backward_data.default: 0,
    torch.ops.aten._log_softmax_backward_data.default: 0,
}


def inplace_source(node: fx.Node, out: Buffer, buffers: dict[str, Buffer], pos: dict[fx.Node, int]) -> Buffer | None:
    """An arena buffer a pointwise node (or a row-wise kernel of ``_ROWWISE_INPLACE``, over its
    one allowed input) may overwrite with its output: read only here, by this node, through
    exactly one reference to its root, with the output's dtype, shape and stride."""
    tensor_inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get(VAL), torch.Tensor)]
    if torch.Tag.pointwise in getattr(node.target, "tags", ()):
        candidates = tensor_inputs
    elif node.target in _ROWWISE_INPLACE and isinstance(node.args[_ROWWISE_INPLACE[node.target]], fx.Node):
        candidates = [node.args[_ROWWISE_INPLACE[node.target]]]
    else:
        return None
    for a in candidates:
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


def other_live_bytes(gm: fx.GraphModule, schedule: list[fx.Node], live: dict[fx.Node, Live],
                     buffers: dict[str, Buffer], length: int) -> np.ndarray:
    """Bytes (at the traced sizes) live at each position in storages that are not arena
    buffers: fresh buffers, storages of self-allocating kernels and fallbacks, and the inputs the
    call frees at their last use (the wrapper drops its references then).

    Which inputs die here is a guess from AOTAutograd's names, used only to choose windows
    (never for soundness): in a backward graph (it has ``tangents_*`` inputs) the saved
    activations and incoming grads die at their last use, while ``primals_*`` (weights and
    user inputs) are held by the caller; in any other graph the caller holds every input, a
    constant that does not move the peak, so inputs are left out."""
    env = shape_env_of(gm)
    skip = {b.name for b in buffers.values() if b.kind == "arena"}
    placeholders = [n for n in schedule if n.op == "placeholder"]
    backward = any(n.name.startswith("tangents_") for n in placeholders)
    skip |= {n.name for n in placeholders if not backward or n.name.startswith("primals_")}
    diff = np.zeros(length + 1, dtype=np.int64)
    for r, l in live.items():
        v = r.meta.get(VAL)
        if r.name in skip or not isinstance(v, torch.Tensor) or node_kind(r) not in ("placeholder", "compute", "getitem"):
            continue
        nbytes = hint(storage_nbytes(v), env)
        diff[l.start] += nbytes
        diff[l.end + 1] -= nbytes
    return np.cumsum(diff[:length])


def split_windows(spans: dict[str, tuple[int, int, int]], other: np.ndarray, max_cuts: int = 64,
                  max_candidates: int = 1024, work_budget: float = 5e7) -> list[list[str]]:
    """Group blocks (name -> (bytes, start, end), at the traced sizes) into arenas by start
    position.  An arena of blocks ``B`` is estimated at the max live bytes of ``B`` and lives
    from the first start to the last end in ``B``.  A split is judged by

    * its peak: the max over positions of ``other`` plus the arenas live there, then
    * its excess: the max over positions of the arena bytes live there minus the bytes of
      their buffers live there (what one call holds beyond per-buffer allocations, at worst),
    * its waste: that excess summed over positions.

    ``other`` misses what the caller holds (weights, a forward's returned logits during the
    backward) and guesses which inputs die here, so its peak may sit at the wrong position.  The
    excess needs no such knowledge: wherever the true peak lies, the call holds at most the
    excess more than if every buffer were allocated on its own, as eager does.  Greedy: add the
    cut (at a block start) that gives the lowest (peak, excess, waste) while it lowers the peak,
    or keeps it and lowers the excess by at least 1% of the largest window's bytes, or keeps both
    and lowers the waste by at least 0.5% of the one-arena waste; at most ``max_cuts`` cuts and
    about ``work_budget`` profile entries touched (deterministic, bounded time on huge graphs).
    No cut: one arena, as before."""
    if not spans:
        return []
    names = sorted(spans, key=lambda k: (spans[k][1], spans[k][2], k))
    n = len(names)
    size = np.array([spans[k][0] for k in names], dtype=np.float64)
    start = np.array([spans[k][1] for k in names], dtype=np.int64)
    end = np.array([spans[k][2] for k in names], dtype=np.int64)
    length = max(len(other), int(end.max()) + 1)
    prof = np.zeros(length, dtype=np.float64)
    prof[: len(other)] = other
    # other + live bytes of the buffers: the profile minus this is the excess
    floor = prof + np.cumsum(np.bincount(start, size, length + 1) - np.bincount(end + 1, size, length + 1))[:length]
    cache: dict[tuple[int, int], tuple[float, int, int]] = {}

    def window(i: int, j: int) -> tuple[float, int, int]:  # blocks names[i:j]: (bytes, first, last)
        w = cache.get((i, j))
        if w is None:
            lo, hi = int(start[i]), int(end[i:j].max())
            d = np.bincount(start[i:j] - lo, size[i:j], hi - lo + 2) - np.bincount(end[i:j] + 1 - lo, size[i:j], hi - lo + 2)
            w = cache[(i, j)] = (float(np.cumsum(d).max()), lo, hi)
        return w

    # candidate cuts: indices where a new start position begins (a cut never splits one position)
    firsts = [i for i in range(1, n) if start[i] != start[i - 1]]
    if len(firsts) > max_candidates:
        firsts = [firsts[int(k * len(firsts) / max_candidates)] for k in range(max_candidates)]
    bounds = [0, n]  # windows: names[bounds[k]:bounds[k + 1]]
    nbytes, lo, hi = window(0, n)
    prof[lo:hi + 1] += nbytes
    peak, excess, area = float(prof.max()), float((prof - floor).max()), nbytes * (hi - lo + 1)
    min_gain = 0.005 * (area - float((size * (end - start + 1)).sum()))
    min_excess_gain = 0.01 * nbytes
    work = 0.0
    for _ in range(max_cuts):
        if min_gain <= 0 or work > work_budget:
            break
        # max of the profile left and right of every position, for peaks outside a window
        left = np.maximum.accumulate(prof)
        right = np.maximum.accumulate(prof[::-1])[::-1]
        ex = prof - floor
        ex_left = np.maximum.accumulate(ex)
        ex_right = np.maximum.accumulate(ex[::-1])[::-1]
        best = None
        for k in range(len(bounds) - 1):
            i, j = bounds[k], bounds[k + 1]
            w_bytes, w_lo, w_hi = window(i, j)
            outside = max(left[w_lo - 1] if w_lo > 0 else 0.0, right[w_hi + 1] if w_hi + 1 < length else 0.0)
            ex_outside = max(ex_left[w_lo - 1] if w_lo > 0 else 0.0, ex_right[w_hi + 1] if w_hi + 1 < length else 0.0)
            base = prof[w_lo:w_hi + 1] - w_bytes
            base_floor = floor[w_lo:w_hi + 1]
            for c in firsts:
                if not i < c < j:
                    continue
                a, b = window(i, c), window(c, j)
                seg = base.copy()
                seg[a[1] - w_lo:a[2] - w_lo + 1] += a[0]
                seg[b[1] - w_lo:b[2] - w_lo + 1] += b[0]
                work += len(seg)
                trial = (max(outside, float(seg.max())), max(ex_outside, float((seg - base_floor).max())),
                         area - w_bytes * (w_hi - w_lo + 1) + a[0] * (a[2] - a[1] + 1) + b[0] * (b[2] - b[1] + 1), c)
                if best is None or trial < best:
                    best = trial
        if best is None:
            break
        c_peak, c_excess, c_area, c = best
        if not (c_peak < peak * (1 - 1e-3) or (c_peak <= peak and c_excess <= excess - min_excess_gain)
                or (c_peak <= peak and c_excess <= excess and c_area <= area - min_gain)):
            break
        k = next(k for k in range(len(bounds) - 1) if bounds[k] < c < bounds[k + 1])
        i, j = bounds[k], bounds[k + 1]
        for (wi, wj), sign in (((i, j), -1), ((i, c), 1), ((c, j), 1)):
            w_bytes, w_lo, w_hi = window(wi, wj)
            prof[w_lo:w_hi + 1] += sign * w_bytes
        bounds.insert(k + 1, c)
        peak, excess, area = c_peak, c_excess, c_area
    return [names[i:j] for i, j in zip(bounds, bounds[1:])]


def plan_memory(gm: fx.GraphModule, schedule: list[fx.Node], groups: list[Group], config: Config) -> MemoryPlan:
    pos = positions(schedule, groups)
    live = liveness(schedule, output_nodes(gm), pos)
    buffers = collect_buffers(gm, groups, pos, live)
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
    env = shape_env_of(gm)
    length = max(pos.values(), default=-1) + 1
    other = other_live_bytes(gm, schedule, live, buffers, length) if by_device else None
    arenas = []
    for bufs in by_device.values():
        members = blocks(bufs)
        spans = block_intervals(bufs)
        hinted = {k: (hint(n, env), s, e) for k, (n, s, e) in spans.items()}
        windows = split_windows(hinted, other) if config.arena_windows else [list(spans)]
        for heads in windows:
            name = f"arena{len(arenas)}"
            window = {k: spans[k] for k in heads}
            if all(sympy.sympify(n).is_Integer for n, _, _ in window.values()):
                offsets, nbytes, planner = place_static(window, config.alignment)
                nbytes = sympy.Integer(nbytes)
            else:
                offsets, nbytes, planner = place_symbolic(window, config.alignment)
            for head in heads:
                for b in members[head]:
                    b.arena, b.offset = name, offsets[head]
            arenas.append(Arena(name, bufs[0].device, nbytes, planner,
                                start=min(s for _, s, _ in window.values()), end=max(e for _, _, e in window.values())))
    return MemoryPlan(buffers, arenas, config.alignment, env)


def arena_peak_bytes(plan: MemoryPlan) -> int:
    """Most arena bytes live at once (at the traced sizes): arenas live over their windows."""
    return peak_live_bytes((a.start, a.end, plan.hint(a.nbytes)) for a in plan.arenas)


def arena_intervals(plan: MemoryPlan, arena: str) -> list[Interval]:
    """One interval per block of ``arena`` at the traced sizes (in-place chains are one block)."""
    spans = block_intervals([b for b in plan.buffers.values() if b.arena == arena])
    return [Interval(k, plan.hint(n), s, e) for k, (n, s, e) in spans.items()]


def verify_memory_plan(plan: MemoryPlan) -> None:
    """Raise ``offsets.PlanError`` if two buffers live at once share bytes (at the traced sizes),
    a buffer leaves its arena (in bytes, or in time: its live range outside the arena's), or an
    offset is misaligned.  Buffers of different arenas never share bytes (separate allocations).
    A buffer written in place over an input it replaces shares that input's bytes by design;
    every other overlap is an error."""
    for a in plan.arenas:
        members = blocks([b for b in plan.buffers.values() if b.arena == a.name])
        outside = [m.name for ms in members.values() for m in ms if not a.start <= m.start <= m.end <= a.end]
        if outside:
            raise PlanError(f"{a.name} lives over {a.start}..{a.end}, but buffers {outside} live outside it")
        if any(len({plan.hint(m.offset) for m in ms}) != 1 for ms in members.values()):
            raise PlanError(f"an in-place chain in {a.name} does not share one offset")
        offsets = {k: plan.hint(ms[0].offset) for k, ms in members.items()}
        verify_plan(arena_intervals(plan, a.name), offsets, plan.hint(a.nbytes), plan.alignment)
