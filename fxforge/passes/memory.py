"""Memory planning: every output a backend writes gets a planned buffer.

Buffers whose storage escapes to the caller (graph outputs and views of them) are allocated
fresh on every call, so a later call can never overwrite what an earlier call returned.  All
others live in arenas, allocated per call, at aligned offsets.

An arena lives only over a window of the schedule: the wrapper allocates it just before the
kernel writing its first buffer and drops it with its last buffer (``Arena.start``/``end``).  One
arena held for the whole call would coexist with everything else the call holds at its ends: in
a backward graph, every saved activation still alive at the start; in a forward graph, every
activation saved by the end.  So the buffers of each device are split into windows (by start
position, with long-lived buffers in arenas of their own), chosen (``split_windows``) to lower
the peak of arenas live at any position plus every other storage live there (inputs until their
last use, fresh outputs, self-allocating kernels' results), then to bring the most arena bytes
live at once down to the buffers' own peak of live bytes; each window is planned on its own
(``place_windows``, which also moves a long-lived buffer out of a window the planners cannot
pack to its bound):

* static sizes: the offset planners of ``passes/offsets.py`` run (all of them, smallest arena
  wins), so buffers whose lifetimes do not overlap share bytes;
* symbolic sizes: buffers share a *slot* only when their byte sizes are the same expression and
  their lifetimes do not overlap; slots are laid out one after another.  Sound for every size the
  symbols can take (no two live buffers ever overlap), with no re-planning at run time.
"""

from __future__ import annotations

import bisect
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
from .offsets import Interval, PlanError, RangeMax, plan_offsets, verify_plan
from .schedule import fused_positions


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
    """Schedule positions for liveness, fused groups each at one position (``fused_positions``)."""
    return fused_positions(schedule, [g.nodes for g in groups if g.fused])


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
    exactly one reference to its root (the root itself, or a view of it, e.g. a reshape), that
    reference laid out as the output (same shape and strides, from the buffer's first byte, so
    each output element lands on the bytes of the input element it is computed from), and the
    buffer of the output's dtype and size."""
    tensor_inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get(VAL), torch.Tensor)]
    if torch.Tag.pointwise in getattr(node.target, "tags", ()):
        candidates = tensor_inputs
    elif node.target in _ROWWISE_INPLACE and isinstance(node.args[_ROWWISE_INPLACE[node.target]], fx.Node):
        candidates = [node.args[_ROWWISE_INPLACE[node.target]]]
    else:
        return None
    for a in candidates:
        root = storage_root(a)
        src = buffers.get(root.name)
        if (
            src is not None
            and src.kind == "arena"
            and src.index is None
            and src.end == pos[node]
            and sum(storage_root(b) is root for b in tensor_inputs) == 1
            and _same_layout(a.meta[VAL], out)  # e.g. t(t(mm)), or a reshape of the loss's gradient
            and (src.dtype, src.nbytes) == (out.dtype, out.nbytes)
        ):
            return src
    return None


def _same_layout(val: torch.Tensor, b: Buffer) -> bool:
    """``val`` (a value in some storage) sits in it from its first byte exactly as ``b`` is laid
    out in its own: same element size, shape and strides."""
    return (isinstance(val, torch.Tensor) and expr(val.storage_offset()) == 0
            and val.element_size() == b.dtype.itemsize
            and tuple(expr(s) for s in val.shape) == b.shape and tuple(expr(s) for s in val.stride()) == b.stride)


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


def call_spans(groups: list[Group], pos: dict[fx.Node, int], length: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, last): the positions of the kernel call each position belongs to.  A group a
    backend runs as one function call (its ops one after another) holds each position on its own
    in the plan, so its buffers can share bytes, but the wrapper binds every buffer the call
    writes before it and drops every value that dies in it after it: what is allocated when
    spans the whole call."""
    first, last = np.arange(length), np.arange(length)
    for g in groups:
        at = [pos[n] for n in g.nodes if n in pos]
        if len(at) > 1:
            lo, hi = min(at), max(at)
            first[lo:hi + 1] = np.minimum(first[lo:hi + 1], lo)
            last[lo:hi + 1] = np.maximum(last[lo:hi + 1], hi)
    return first, last


def other_live_bytes(gm: fx.GraphModule, schedule: list[fx.Node], live: dict[fx.Node, Live],
                     buffers: dict[str, Buffer], length: int, first: np.ndarray, last: np.ndarray) -> np.ndarray:
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
        diff[first[l.start]] += nbytes
        diff[last[l.end] + 1] -= nbytes
    return np.cumsum(diff[:length])


def window_options(spans: dict[str, tuple[int, int, int]], other: np.ndarray,
                   calls: tuple[np.ndarray, np.ndarray] | None = None) -> list[list[list[str]]]:
    """``split_windows`` holding the arena peak and, only if holding it changed a choice, not
    holding it (unchanged choices give the same windows)."""
    holding, it_mattered = _split_windows(spans, other, calls=calls, hold_arena_peak=True)
    return [holding] + ([_split_windows(spans, other, calls=calls, hold_arena_peak=False)[0]] if it_mattered else [])


def split_windows(spans: dict[str, tuple[int, int, int]], other: np.ndarray, **options) -> list[list[str]]:
    """Group blocks into arenas (``_split_windows``, which says how)."""
    return _split_windows(spans, other, **options)[0]


def _split_windows(spans: dict[str, tuple[int, int, int]], other: np.ndarray, max_cuts: int = 64,
                   max_candidates: int = 1024, work_budget: float = 5e7, isolate: int = 4,
                   calls: tuple[np.ndarray, np.ndarray] | None = None,
                   hold_arena_peak: bool = True) -> tuple[list[list[str]], bool]:
    """Group blocks (name -> (bytes, start, end), at the traced sizes) into arenas.  An arena of
    blocks ``B`` is estimated at the max live bytes of ``B`` and lives from the first start to the
    last end in ``B`` (widened to whole kernel calls by ``calls``, ``call_spans``' arrays, when
    given: the wrapper allocates and frees around calls).  Moves that split an arena:

    * a *cut* at a start position: blocks starting before it stay, the rest form a new arena;
    * a *clean cut*: the same, with the (at most ``isolate``) blocks of the first part that are
      still live where the second starts each moved into an arena of their own, so the two
      arenas do not overlap (a residual or a saved value crossing the cut would otherwise keep
      the whole first arena alive under the second);
    * *isolating* one of the ``isolate`` longest-lived blocks of an arena into an arena of its own.

    A split is judged by

    * its peak: the max over positions of ``other`` plus the arenas live there, then
    * its excess: the max over positions of the arena bytes live there minus the bytes of
      their buffers live there (what one call holds beyond per-buffer allocations, at worst),
    * its waste: that excess summed over positions.

    ``other`` misses what the caller holds (weights, a forward's returned logits during the
    backward) and guesses which inputs die here, so its peak may sit at the wrong position.  The
    excess needs no such knowledge: wherever the true peak lies, the call holds at most the
    excess more than if every buffer were allocated on its own, as eager does.

    Greedy, in two phases.  First make the move with the lowest (peak, excess, waste), among those
    that do not push the most arena bytes live at once above both its current value and 1% over
    the blocks' own peak of live bytes (the lower bound) (unless ``hold_arena_peak`` is false), while it
    lowers the peak, or keeps it and lowers the excess by at least 1% of the largest window's
    bytes, or keeps both and lowers the waste by at least 0.5% of the one-arena waste.  Then,
    while the most arena bytes live at once exceed the blocks' own peak of live bytes (the lower
    bound) by more than 1%, make the move that lowers that figure most without raising the peak.
    At most ``max_cuts`` moves, stopping once the moves judged add up to ``work_budget`` profile
    entries as a move-by-move scan would touch them (a deterministic size measure: huge graphs
    stop early).  No move: one arena, as before.  Returns the windows, and whether holding the
    arena peak ruled out a move the first phase would otherwise have made."""
    if not spans:
        return [], False
    names = sorted(spans, key=lambda k: (spans[k][1], spans[k][2], k))
    n = len(names)
    size = np.array([spans[k][0] for k in names], dtype=np.float64)
    start = np.array([spans[k][1] for k in names], dtype=np.int64)
    end = np.array([spans[k][2] for k in names], dtype=np.int64)
    length = max(len(other), int(end.max()) + 1)
    first, last = calls if calls is not None else (np.arange(length), np.arange(length))
    prof = np.zeros(length, dtype=np.float64)  # other + the arenas live at each position
    prof[: len(other)] = other
    other = prof.copy()
    own = np.cumsum(np.bincount(start, size, length + 1) - np.bincount(end + 1, size, length + 1))[:length]
    bound = float(own.max())  # the blocks' own peak: no split of them goes below it
    floor = other + own  # the profile minus this is the excess
    fine = np.zeros(length, dtype=np.float64)  # the arenas over their blocks' own positions
    alone = np.zeros(n, dtype=bool)  # blocks isolated into arenas of their own
    # candidate cuts: indices where a new start position begins (a cut never splits one position)
    firsts = [i for i in range(1, n) if start[i] != start[i - 1]]
    if len(firsts) > max_candidates:
        firsts = [firsts[int(k * len(firsts) / max_candidates)] for k in range(max_candidates)]
    tables: dict[tuple[int, int], _Moves] = {}  # the current windows' moves

    def moves_of(i: int, j: int) -> _Moves:
        if (i, j) not in tables:
            cuts = firsts[bisect.bisect_right(firsts, i):bisect.bisect_left(firsts, j)]
            tables[(i, j)] = _Moves(i, np.flatnonzero(~alone[i:j]) + i, cuts, start, end, size, first, last, isolate)
        return tables[(i, j)]

    bounds = [0, n]  # windows: names[bounds[k]:bounds[k + 1]], less isolated blocks
    nbytes, lo, hi, f_lo, f_hi = moves_of(0, n).window
    prof[lo:hi + 1] += nbytes
    fine[f_lo:f_hi + 1] += nbytes
    peak, excess, area = float(prof.max()), float((prof - floor).max()), nbytes * (hi - lo + 1)
    min_gain = 0.005 * (area - float((size * (end - start + 1)).sum()))
    min_excess_gain = 0.01 * nbytes
    fine_area = nbytes * (f_hi - f_lo + 1)  # the arenas' bytes summed over their own positions
    work = 0.0
    held = False

    def best_move(phase: int):
        """Phase 0: (peak, excess, waste, window, cut, isolated) of the move with the lowest
        (peak, excess, waste) among those that keep the arena peak (arenas over their blocks' own
        positions: the plan's figure) within 1% of the bound or below its current value; phase
        1: (arena peak, *that) of the lowest arena peak.  Every move of every window is judged
        at once: a move changes the profiles only inside its window's range, by a few ranges of
        constant bytes, so each figure is a handful of range maxima of the current profiles."""
        nonlocal work, held
        a_limit = max(float(fine.max()), 1.01 * bound)
        curves = (prof, prof - floor, fine)
        hot = fine >= fine.max() if phase else None  # phase 1: only arenas live at its peak can lower it
        ks = [k for k in range(len(bounds) - 1) if len(moves_of(bounds[k], bounds[k + 1]).moves)]
        tabs = [tables[(bounds[k], bounds[k + 1])] for k in ks]
        if phase:
            keep = [hot[t.window[3]:t.window[4] + 1].any() for t in tabs]
            ks, tabs = [k for k, h in zip(ks, keep) if h], [t for t, h in zip(tabs, keep) if h]
        if not tabs:
            return None
        count = [len(t.moves) for t in tabs]
        w = np.array([t.window for t in tabs])
        work += float((np.array(count) * ((w[:, 2] - w[:, 1] + 1) + (w[:, 4] - w[:, 3] + 1))).sum())  # as a scan
        stale = [t for t in tabs if t.seg is None]
        if stale:
            # each move's peak, excess and arena peak within its window's range (valid until a
            # move changes the profiles there: ``apply``)
            sw = np.repeat(np.array([t.window for t in stale]), [len(t.moves) for t in stale], axis=0)
            s_bytes, (s_lo, s_hi, sf_lo, sf_hi) = sw[:, 0], sw[:, 1:].astype(np.int64).T
            pb = np.concatenate([t.bytes for t in stale])
            plo, phi, pflo, pfhi = (np.concatenate([getattr(t, f) for t in stale]) for f in ("lo", "hi", "flo", "fhi"))
            seg = np.stack([_covered_max(RangeMax(curve), lo, hi, pb, p_lo, p_hi) - s_bytes
                            for curve, (lo, hi, p_lo, p_hi) in zip(curves, ((s_lo, s_hi, plo, phi), (s_lo, s_hi, plo, phi),
                                                                            (sf_lo, sf_hi, pflo, pfhi)))], axis=1)
            for t, part in zip(stale, np.split(seg, np.cumsum([len(t.moves) for t in stale])[:-1])):
                t.seg = part
        figures = []
        for q, (curve, (lo, hi)) in enumerate(zip(curves, ((w[:, 1], w[:, 2]), (w[:, 1], w[:, 2]), (w[:, 3], w[:, 4])))):
            lo, hi = lo.astype(np.int64), hi.astype(np.int64)
            left, right = np.maximum.accumulate(curve), np.maximum.accumulate(curve[::-1])[::-1]
            outside = np.maximum(np.where(lo > 0, left[np.maximum(lo - 1, 0)], 0.0),
                                 np.where(hi + 1 < length, right[np.minimum(hi + 1, length - 1)], 0.0))
            figures.append(np.maximum(np.repeat(outside, count), np.concatenate([t.seg[:, q] for t in tabs])))
        t_peak, t_excess, a_peak = figures
        t_area = area + np.concatenate([t.d_area for t in tabs])
        t_fine_area = fine_area + np.concatenate([t.d_fine_area for t in tabs])
        k_of = np.repeat(np.array(ks), count)
        rank = np.concatenate([t.rank for t in tabs])
        keys = [t_peak, t_excess, t_area, k_of, rank]
        if phase:
            keys = [a_peak, t_fine_area, *keys]
        x = int(np.lexsort(keys[::-1])[0])
        if not phase and hold_arena_peak and a_peak[x] > a_limit:
            held = True  # phase 0 may not push the arena peak above the bound's tolerance
            allowed = np.flatnonzero(a_peak <= a_limit)
            if not len(allowed):
                return None
            x = int(allowed[np.lexsort([key[allowed] for key in reversed(keys)])[0]])
        row = ks.index(int(k_of[x]))
        c, xs = tabs[row].moves[x - sum(count[:row])]
        trial = (float(t_peak[x]), float(t_excess[x]), float(t_area[x]), int(k_of[x]), c, xs)
        return (float(a_peak[x]), float(t_fine_area[x]), *trial) if phase else trial

    def apply(k: int, c: int, xs: tuple[int, ...]) -> None:
        nonlocal fine_area
        i, j = bounds[k], bounds[k + 1]
        t = tables.pop((i, j))
        w_bytes, w_lo, w_hi, wf_lo, wf_hi = t.window
        prof[w_lo:w_hi + 1] -= w_bytes
        fine[wf_lo:wf_hi + 1] -= w_bytes
        fine_area -= w_bytes * (wf_hi - wf_lo + 1)
        r = t.moves.index((c, xs))
        if c >= 0:
            bounds.insert(k + 1, c)
        if xs:
            alone[list(xs)] = True
        for p_bytes, p_lo, p_hi, pf_lo, pf_hi in zip(t.bytes[r], t.lo[r], t.hi[r], t.flo[r], t.fhi[r]):
            prof[p_lo:p_hi + 1] += p_bytes
            fine[pf_lo:pf_hi + 1] += p_bytes
            fine_area += p_bytes * (pf_hi - pf_lo + 1)
        for other in tables.values():  # the profiles changed over this window's ranges only
            _, o_lo, o_hi, of_lo, of_hi = other.window
            if o_lo <= w_hi and w_lo <= o_hi or of_lo <= wf_hi and wf_lo <= of_hi:
                other.seg = None

    moves_made = 0
    for phase in (0, 1):
        while moves_made < max_cuts and work <= work_budget and min_gain > 0:
            a_peak = float(fine.max())
            if phase == 1 and a_peak <= 1.01 * bound:
                break
            move = best_move(phase)
            if move is None:
                break
            if phase == 0:
                c_peak, c_excess, c_area, k, c, xs = move
                ok = (c_peak < peak * (1 - 1e-3) or (c_peak <= peak and c_excess <= excess - min_excess_gain)
                      or (c_peak <= peak and c_excess <= excess and c_area <= area - min_gain))
            else:
                c_apeak, c_fine_area, c_peak, c_excess, c_area, k, c, xs = move
                ok = c_peak <= peak and (c_apeak < a_peak or (c_apeak == a_peak and c_fine_area < fine_area))
            if not ok:
                break
            apply(k, c, xs)
            peak, excess, area = c_peak, c_excess, c_area
            moves_made += 1
    out = [[names[x] for x in range(i, j) if not alone[x]] for i, j in zip(bounds, bounds[1:])]
    out += [[names[x]] for x in np.flatnonzero(alone)]
    return sorted((w for w in out if w), key=lambda w: spans[w[0]][1:]), held


class _Moves:
    """The moves that split one window (blocks ``members``, indices into start order, less the
    isolated ones) and, per move, the arenas it leaves, one row each padded to one width:
    ``bytes``, ``lo``/``hi`` (allocated .. freed, whole calls) and ``flo``/``fhi`` (first start ..
    last end of their blocks).  ``moves[r]`` is row r's (cut index or -1, isolated blocks)."""

    def __init__(self, i: int, members: np.ndarray, cuts: list[int], start: np.ndarray, end: np.ndarray,
                 size: np.ndarray, first: np.ndarray, last: np.ndarray, isolate: int):
        def arenas(nbytes, lo, hi) -> np.ndarray:
            """Rows of (bytes, allocated, freed, first start, last end); no bytes: empty (padding)."""
            lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
            cols = np.broadcast_arrays(np.asarray(nbytes, dtype=np.float64), first[lo], last[hi], lo, hi)
            return np.stack(cols, axis=-1).astype(np.float64)

        def nothing(at) -> np.ndarray:
            """No blocks left: no bytes, allocated and freed where the range of ``at`` starts."""
            r = arenas(0.0, start[at], start[at])
            r[..., 2] = r[..., 1]
            return r

        width = 2 + isolate  # a clean cut: both sides and up to ``isolate`` blocks alone
        self.moves: list[tuple[int, tuple[int, ...]]] = []
        if not len(members):  # every block isolated
            b, lo, hi, flo, fhi = nothing(i)
            self.window = (float(b), int(lo), int(hi), int(flo), int(fhi))
            self._table(np.zeros((0, width, 5)))
            return
        s, e, b = start[members], end[members], size[members]
        f_lo, f_hi = int(s[0]), int(e.max())
        L = f_hi - f_lo + 1
        own = np.cumsum(np.bincount(s - f_lo, b, L + 1) - np.bincount(e + 1 - f_lo, b, L + 1))[:L]
        self.window = (float(own.max()), int(first[f_lo]), int(last[f_hi]), f_lo, f_hi)
        own_max = RangeMax(own)
        rows: list[np.ndarray] = []  # (moves, parts, 5) per kind of move
        cuts = np.asarray(cuts, dtype=np.int64)
        if len(cuts):
            # a cut: the blocks starting before it, and the rest (each side's peak of live bytes)
            before = np.searchsorted(members, cuts)
            at = start[cuts] - f_lo  # where the right side starts, locally
            has_left, has_right = before > 0, before < len(members)
            nxt = np.minimum(before, len(members) - 1)
            # left of a cut only its blocks have started, and after the cut they only end
            left_peak = np.maximum.accumulate(own)[np.clip(at - 1, 0, L - 1)]
            left = arenas(left_peak, f_lo, np.maximum.accumulate(e)[np.maximum(before - 1, 0)])
            right = arenas(_right_peaks(s - f_lo, e - f_lo, b, before, L), s[nxt], np.maximum.accumulate(e[::-1])[::-1][nxt])
            left = np.where(has_left[:, None], left, nothing(i))
            right = np.where(has_right[:, None], right, nothing(cuts))
            rows.append(np.stack([left, right], axis=1))
            self.moves += [(int(c), ()) for c in cuts]
            # a clean cut: the few blocks still live where the right side starts each in an arena
            # of its own, so the left arena ends before the right one begins
            clean, crossing = _crossing(members, e, before, at + f_lo, isolate)
            if clean:
                q = np.array(clean)
                xs = np.array([x + [-1] * (isolate - len(x)) for x in crossing])  # padded with -1
                real = xs >= 0
                x_bytes = np.where(real, size[xs], 0.0)
                x_start = np.where(real, start[xs] - f_lo, 0)
                hi = at[q] - 1
                kept_peak = _covered_max(own_max, np.zeros_like(hi), hi, -x_bytes, x_start, np.broadcast_to(hi[:, None], xs.shape))
                ends = np.sort(e)
                kept_hi = ends[np.searchsorted(ends, at[q] + f_lo) - 1]
                kept_lo = s[np.searchsorted(-np.minimum.accumulate(e), -(at[q] + f_lo), side="right")]
                singles = arenas(x_bytes, np.where(real, start[xs], f_lo), np.where(real, end[xs], f_lo))
                rows.append(np.concatenate([arenas(kept_peak, kept_lo, kept_hi)[:, None], right[q][:, None], singles], axis=1))
                self.moves += [(int(cuts[k]), tuple(int(x) for x in xx)) for k, xx in zip(q, crossing)]
        if len(members) > 1:
            # isolating one of the longest-lived blocks
            xs = members[np.argsort(s - e, kind="stable")[:isolate]]
            zero = np.zeros(len(xs), dtype=np.int64)
            peaks = _covered_max(own_max, zero, zero + L - 1, -size[xs][:, None], (start[xs] - f_lo)[:, None],
                                 (end[xs] - f_lo)[:, None])
            for x, peak in zip(xs, peaks):
                keep = members != x
                rows.append(np.stack([arenas(peak, s[keep][0], e[keep].max()), arenas(size[x], start[x], end[x])])[None])
                self.moves.append((-1, (int(x),)))
        self._table(np.concatenate([np.concatenate([r, np.zeros((len(r), width - r.shape[1], 5))], axis=1)
                                    if r.shape[1] < width else r for r in rows]) if rows else np.zeros((0, width, 5)))

    def _table(self, table: np.ndarray) -> None:
        # padding parts hold no bytes at positions 0..0 (within every range, adds nothing)
        self.bytes = table[:, :, 0]
        self.lo, self.hi, self.flo, self.fhi = (table[:, :, q].astype(np.int64) for q in range(1, 5))
        w_bytes, w_lo, w_hi, wf_lo, wf_hi = self.window
        # what each move adds to the arenas' bytes summed over their positions (whole calls; own)
        self.d_area = (self.bytes * (self.hi - self.lo + 1)).sum(axis=1) - w_bytes * (w_hi - w_lo + 1)
        self.d_fine_area = (self.bytes * (self.fhi - self.flo + 1)).sum(axis=1) - w_bytes * (wf_hi - wf_lo + 1)
        self.seg: np.ndarray | None = None  # per move: peak, excess, arena peak within the window's ranges
        # ties go to the lower (cut, isolated blocks), as in a scan of the moves in that order
        self.rank = np.empty(len(self.moves), dtype=np.int64)
        self.rank[sorted(range(len(self.moves)), key=self.moves.__getitem__)] = np.arange(len(self.moves))


def _crossing(members: np.ndarray, e: np.ndarray, before: np.ndarray, at: np.ndarray,
              isolate: int) -> tuple[list[int], list[list[int]]]:
    """The cuts q with a few (1..``isolate``) blocks left of them still live at ``at[q]``, not all
    of the left ones, and those blocks (in index order): one sweep with a heap by end."""
    live: list[tuple[int, int]] = []  # (end, member) of left blocks
    clean, crossing = [], []
    k = 0
    for q in range(len(before)):
        while k < before[q]:
            heapq.heappush(live, (int(e[k]), int(members[k])))
            k += 1
        while live and live[0][0] < at[q]:
            heapq.heappop(live)
        if 0 < len(live) <= isolate and len(live) < before[q]:
            clean.append(q)
            crossing.append(sorted(m for _, m in live))
    return clean, crossing


def _right_peaks(s: np.ndarray, e: np.ndarray, b: np.ndarray, before: np.ndarray, length: int) -> np.ndarray:
    """Most bytes live at once among the blocks right of each cut (the window's blocks in start
    order, live over local positions ``s``..``e``; ``before[q]`` of them left of cut q): adding
    the blocks from the last one back, the profile only grows, so its max is the old max or the
    max over the range the new blocks cover (time: the blocks' lifetimes, not cuts x positions)."""
    out = np.full(len(before), -np.inf)
    prof = np.zeros(length)
    peak, k = -np.inf, len(s)
    for q in range(len(before) - 1, -1, -1):
        if k > before[q]:
            lo, hi = int(s[before[q]]), int(e[before[q]:k].max())
            while k > before[q]:
                k -= 1
                prof[s[k]:e[k] + 1] += b[k]
            peak = max(peak, float(prof[lo:hi + 1].max()))
        out[q] = peak
    return out


def _covered_max(curve: RangeMax, lo: np.ndarray, hi: np.ndarray, p_bytes: np.ndarray, p_lo: np.ndarray,
                 p_hi: np.ndarray) -> np.ndarray:
    """For each row r: max over positions lo[r]..hi[r] of the curve plus ``p_bytes[r, q]`` over
    every part q with ``p_lo[r, q] <= position <= p_hi[r, q]`` (parts lie within the range)."""
    cuts = np.concatenate([lo[:, None], hi[:, None] + 1, p_lo, p_hi + 1], axis=1)
    cuts = np.sort(np.clip(cuts, lo[:, None], hi[:, None] + 1), axis=1)
    a, b = cuts[:, :-1], cuts[:, 1:]  # elementary ranges a..b-1, each under a constant set of parts
    cover = ((p_lo[:, None, :] <= a[:, :, None]) & (a[:, :, None] <= p_hi[:, None, :])) * p_bytes[:, None, :]
    return (curve(a, b) + cover.sum(axis=2)).max(axis=1)


def place(window: dict[str, tuple[sympy.Expr, int, int]], alignment: int) -> tuple[dict[str, sympy.Expr], sympy.Expr, str]:
    """Offsets of one arena's blocks: the offset planners for static sizes, slots otherwise."""
    if all(sympy.sympify(n).is_Integer for n, _, _ in window.values()):
        offsets, nbytes, planner = place_static(window, alignment)
        return offsets, sympy.Integer(nbytes), planner
    return place_symbolic(window, alignment)


def place_windows(windows: list[list[str]], spans: dict[str, tuple[sympy.Expr, int, int]],
                  hinted: dict[str, tuple[int, int, int]], alignment: int,
                  calls: tuple[np.ndarray, np.ndarray] | None = None, rounds: int = 8,
                  tries: int = 4, max_blocks: int = 4096) -> list[tuple[list[str], tuple[dict[str, sympy.Expr], sympy.Expr, str]]]:
    """Place every window, then repair what ``split_windows`` could not see: it sizes a window at
    its blocks' peak of live bytes, but the offset planners may need more (no packing reaches
    that bound for some lifetime sets).  While the most arena bytes live at once (planned sizes,
    at the traced sizes) exceed the blocks' own peak by more than 1%, take the window live there
    that its planner packs worst and move the one of its ``tries`` longest-lived blocks whose
    removal lowers that figure most into an arena of its own (an arena of one block wastes
    nothing); stop when no such move lowers it.  Windows of more than ``max_blocks`` blocks are
    left as they are (each try re-plans the window: bounded time on huge graphs)."""
    placed = {tuple(w): place({k: spans[k] for k in w}, alignment) for w in windows}
    if not spans:
        return []
    length = max(e for _, _, e in hinted.values()) + 1
    first, last = calls if calls is not None else (np.arange(length), np.arange(length))
    length = max(length, len(last))
    bound = peak_live_bytes((s, e, n) for n, s, e in hinted.values())

    def size(w: tuple[str, ...]) -> int:
        return hint(placed[w][1]) if sympy.sympify(placed[w][1]).is_Integer else 0

    def span(w: tuple[str, ...], calls: bool = False) -> tuple[int, int]:  # first start .. last end
        lo, hi = min(hinted[k][1] for k in w), max(hinted[k][2] for k in w)
        return (int(first[lo]), int(last[hi])) if calls else (lo, hi)

    def profile(ws, calls: bool = False) -> np.ndarray:
        return live_profile(((*span(w, calls), size(w)) for w in ws), length)

    current = list(placed)
    for _ in range(rounds):
        prof = profile(current)
        at, top = int(prof.argmax()), int(prof.max())
        allocated = int(profile(current, True).max())  # around whole calls: must not grow
        if top <= 1.01 * bound:
            break
        waste = {w: size(w) - peak_live_bytes((hinted[k][1], hinted[k][2], hinted[k][0]) for k in w)
                 for w in current if 1 < len(w) <= max_blocks and span(w)[0] <= at <= span(w)[1] and size(w) > 0}
        fragmented = [w for w, wasted in waste.items() if wasted > 0]
        if not fragmented:
            break
        w = max(fragmented, key=waste.get)
        best = None
        for x in sorted(w, key=lambda k: (hinted[k][1] - hinted[k][2], -hinted[k][0], k))[:tries]:
            rest = tuple(k for k in w if k != x)
            for part in (rest, (x,)):
                if part not in placed:
                    placed[part] = place({k: spans[k] for k in part}, alignment)
            trial = [v for v in current if v != w] + [rest, (x,)]
            t = int(profile(trial).max())
            if int(profile(trial, True).max()) > allocated:
                continue
            if best is None or t < best[0]:
                best = (t, trial)
        if best is None or best[0] >= top:
            break
        current = best[1]
    current.sort(key=lambda w: span(w))
    return [(list(w), placed[w]) for w in current]


def placed_peaks(placed, hinted: dict[str, tuple[int, int, int]], other: np.ndarray, first: np.ndarray,
                 last: np.ndarray, env) -> tuple[int, int, int]:
    """(most of ``other`` + arenas allocated at once around kernel calls, most arena bytes live at
    once over their buffers' own positions, number of arenas) of placed windows."""
    length = len(first)
    spans = [(min(hinted[k][1] for k in heads), max(hinted[k][2] for k in heads), hint(nbytes, env))
             for heads, (_, nbytes, _) in placed]
    calls = live_profile(((first[lo], last[hi], b) for lo, hi, b in spans), length)
    calls[:len(other)] += other.astype(calls.dtype)
    own = live_profile(spans, length)
    return int(calls.max()), int(own.max()), len(placed)


def live_profile(ranges, length: int) -> np.ndarray:
    """Bytes live at each of ``length`` positions, for (first, last, nbytes) ranges."""
    prof = np.zeros(length + 1, dtype=np.int64)
    for lo, hi, b in ranges:
        prof[lo] += b
        prof[hi + 1] -= b
    return np.cumsum(prof[:length])


def plan_memory(gm: fx.GraphModule, schedule: list[fx.Node], groups: list[Group], config: Config) -> MemoryPlan:
    pos = positions(schedule, groups)
    live = liveness(schedule, output_nodes(gm), pos)
    buffers = collect_buffers(gm, groups, pos, live)
    if config.inplace:
        # one kernel reading and writing several values at different indices may not overwrite
        # its own inputs
        multi = {n for g in groups if g.fused and len(g.nodes) > 1 for n in g.nodes}
        reused: set[str] = set()
        for b in sorted(buffers.values(), key=lambda b: b.start):
            if b.index is None and b.producer not in multi:
                src = inplace_source(b.producer, b, buffers, pos)
                if src is None or src.name in reused or (b.kind == "fresh" and src.reuses is not None):
                    continue
                if b.kind == "fresh":
                    # an output written over an arena buffer that dies there: that buffer is
                    # allocated fresh instead and handed to the caller as the output (a tied
                    # embedding's gradient, ``mm + embedding_dense_backward``, then holds two
                    # vocabulary-sized buffers at its end, not three)
                    src.kind = "fresh"
                b.reuses = src.name
                reused.add(src.name)
    by_device: dict[str, list[Buffer]] = {}
    for b in buffers.values():
        if b.kind == "arena":
            by_device.setdefault(str(b.device), []).append(b)
    env = shape_env_of(gm)
    length = max(pos.values(), default=-1) + 1
    first, last = call_spans(groups, pos, length)
    other = other_live_bytes(gm, schedule, live, buffers, length, first, last) if by_device else None
    arenas = []
    for bufs in by_device.values():
        members = blocks(bufs)
        spans = block_intervals(bufs)
        hinted = {k: (hint(n, env), s, e) for k, (n, s, e) in spans.items()}
        if config.arena_windows:
            # the first phase's greedy may reach the bound either holding the arena peak at every
            # step or not (then the second phase brings it down); the estimate cannot tell which
            # packs better, so place both and keep the lower (peak around calls, arena peak)
            options = [place_windows(w, spans, hinted, config.alignment, (first, last))
                       for w in window_options(hinted, other, calls=(first, last))]
            placed = min(options, key=lambda o: placed_peaks(o, hinted, other, first, last, env))
        else:
            placed = place_windows([list(spans)], spans, hinted, config.alignment)
        for heads, (offsets, nbytes, planner) in placed:
            name = f"arena{len(arenas)}"
            for head in heads:
                for b in members[head]:
                    b.arena, b.offset = name, offsets[head]
            arenas.append(Arena(name, bufs[0].device, nbytes, planner,
                                start=min(spans[k][1] for k in heads), end=max(spans[k][2] for k in heads)))
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
