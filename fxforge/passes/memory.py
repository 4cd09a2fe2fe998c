"""Memory planning: every output a backend writes gets a planned buffer.

This module does what touches the FX graph: it collects one buffer per value a backend writes
(``collect_buffers``), picks in-place reuse (``inplace_source``), turns liveness over the schedule
into blocks (name -> bytes, first start, last end) and the bytes other storages hold at each
position, and builds and checks the ``MemoryPlan`` (``plan_memory``, ``verify_memory_plan``).
Buffers escaping to the caller are allocated fresh on every call; all others live in arenas,
each over a window of the schedule: which blocks share an arena and at which offsets is plain
data, in ``passes/windows.py`` (the window search and the placement) and ``passes/offsets.py``
(the offset planners).  The whole design, step by step: docs/memory.md.
"""

from __future__ import annotations

import operator
from typing import Any, Iterable

import numpy as np
import sympy
import torch
import torch.fx as fx

from ..core.config import Config
from ..core.iteration import is_pointwise, reduction_of, schema_bind
from ..lowering.out_variant import out_variant
from ..core.graph import (
    ALLOCATES,
    FALLBACK_BACKEND,
    SLICE_OF,
    SYMMETRIC,
    VAL,
    ZERO_COPY,
    Live,
    expr,
    hint,
    inputs_freed_at_last_use,
    live_profile,
    liveness,
    node_kind,
    opaque_aliasing,
    output_nodes,
    peak_live_bytes,
    shape_env_of,
    storage_nbytes,
    storage_nbytes_hint,
    storage_root,
)
from ..core.plan import Arena, Buffer, Group, MemoryPlan, PeakParts
from .offsets import Interval, PlanError, verify_plan
from .schedule import fused_positions
from .symmetric import plan_symmetric, verify_symmetric
from .windows import arena_calls_profile, place, place_windows, placed_peaks, window_options


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
    # an opaque node (a higher-order op whose bodies cannot tell) may return any of its inputs:
    # none of them may be bytes of an arena that a later buffer reuses
    escaping |= {storage_root(a) for n in gm.graph.nodes if opaque_aliasing(n) for a in n.all_input_nodes}
    buffers: dict[str, Buffer] = {}
    for g in groups:
        if g.backend == FALLBACK_BACKEND and not any(ZERO_COPY.on(n) for n in g.nodes):
            continue  # (a zero-copy cat/pad is run by the wrapper, whoever would have run it)
        written = set(g.outputs) if g.fused else None
        for node in g.nodes:
            if node_kind(node) != "compute" or ALLOCATES.get(node):
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
    place_slices(buffers)
    return buffers


def place_slices(buffers: dict[str, Buffer]) -> None:
    """Inputs a cat or pad takes in place (``meta[SLICE_OF]``, passes/padcat.py) become regions
    of its buffer, which then lives from the first of them written to the last read."""
    slices = []
    for b in buffers.values():
        at = SLICE_OF.get(b.producer)
        if at is not None and b.index is None and at[0] in buffers:
            base = buffers[at[0]]
            b.kind, b.base, b.region = "slice", base.name, tuple(at[1])
            if not b.flat:  # (a flattened input keeps its own layout, a run of the 1-D base)
                b.stride = base.stride
            slices.append(b)
    for b in slices:
        root = b
        while root.kind == "slice":
            root = buffers[root.base]
        root.start, root.end = min(root.start, b.start), max(root.end, b.end)
        if not b.flat:
            b.stride = root.stride  # a region of a region (cat of cats) is laid out as the outermost


# Row-wise kernels whose output may overwrite one input (by argument index): they read a whole row
# of it (the row sum) before writing that row, and then write each element from the same element
# of that input (softmax / log-softmax backward, CPU and CUDA kernels alike).
_ROWWISE_INPLACE = {
    torch.ops.aten._softmax_backward_data.default: 0,
    torch.ops.aten._log_softmax_backward_data.default: 0,
}


def inplace_source(node: fx.Node, out: Buffer, buffers: dict[str, Buffer], pos: dict[fx.Node, int],
                   home: dict[str, str] | None = None) -> Buffer | None:
    """An arena buffer a pointwise node (or a row-wise kernel of ``_ROWWISE_INPLACE``, over its
    one allowed input, or an op whose out variant declares that its out may alias an input:
    ``g.out(Tensor(a) x, *, Tensor(a!) out)``) may overwrite with its output: read only here, by this node, through
    exactly one reference to its root (the root itself, or a view of it, e.g. a reshape), that
    reference laid out as the output (same shape and strides, from the buffer's first byte, so
    each output element lands on the bytes of the input element it is computed from), and the
    buffer of the output's dtype and size.  ``home`` maps a region of another buffer (zero-copy
    cat/pad) to the buffer holding its bytes: a reference to a region counts as one to that buffer."""
    home = home or {}
    tensor_inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get(VAL), torch.Tensor)]
    if torch.Tag.pointwise in getattr(node.target, "tags", ()):
        candidates = tensor_inputs
    elif node.target in _ROWWISE_INPLACE and isinstance(node.args[_ROWWISE_INPLACE[node.target]], fx.Node):
        candidates = [node.args[_ROWWISE_INPLACE[node.target]]]
    elif (v := out_variant(node.target)) is not None and len(v.outs) == 1 and v.aliases[0] is not None:
        arg = schema_bind(node).get(v.op._schema.arguments[v.aliases[0]].name)
        candidates = [arg] if isinstance(arg, fx.Node) else []
    else:
        return None
    refs = [home.get(storage_root(b).name, storage_root(b).name) for b in tensor_inputs]
    for a in candidates:  # (laid out as the output: e.g. t(t(mm)), or a reshape of the loss's gradient)
        src = buffers.get(storage_root(a).name)
        if _overwritable(src, a.meta[VAL], out, pos[node], refs):
            return src
    return None


def _overwritable(src: Buffer | None, read: torch.Tensor, out: Buffer, at: int, refs: list[str]) -> bool:
    """``src``, the buffer of an input read as ``read`` by a kernel at position ``at`` whose
    inputs' storages are ``refs``, may take ``out``'s bytes: an arena buffer of its own (not a
    region) dying there, referenced once, read laid out as the output, of its dtype and size."""
    return (src is not None and src.kind == "arena" and src.index is None and src.end == at
            and refs.count(src.name) == 1 and _same_layout(read, out)
            and (src.dtype, src.nbytes) == (out.dtype, out.nbytes))


def group_inplace_source(g: Group, out: Buffer, buffers: dict[str, Buffer], pos: dict[fx.Node, int],
                         home: dict[str, str]) -> Buffer | None:
    """An arena buffer the one output of fused kernel ``g`` (a backend that ``overwrites_inputs``)
    may overwrite: an input of the output's node, of the output's layout, that dies at the kernel,
    read there only as itself (no view of its storage, no other input in it) by members computing
    one value per element of it, or folding its rows (the output's own rows: a kernel has one loop
    nest).  The kernel reads each element, and each row it folds, before it writes that element
    or row."""
    members = set(g.nodes)
    refs = [home.get(storage_root(a).name, storage_root(a).name) for a in g.inputs
            if isinstance(a.meta.get(VAL), torch.Tensor)]
    for x in out.producer.all_input_nodes:  # (read by the output's own node: the wrapper binds it through it)
        xv = x.meta.get(VAL)
        if x in members or not isinstance(xv, torch.Tensor):
            continue
        src = buffers.get(storage_root(x).name)
        if not _overwritable(src, xv, out, pos[out.producer], refs) or src.name in home.values():
            continue
        readers = [m for m in x.users if m in members]
        shape = [expr(d) for d in xv.shape]
        if all(is_pointwise(m) and [expr(d) for d in m.meta[VAL].shape] == shape
               or (r := reduction_of(m)) is not None and r.inp is x for m in readers):
            return src
    return None


def _root(b: Buffer, buffers: dict[str, Buffer]) -> Buffer:
    while b.kind == "slice":
        b = buffers[b.base]
    return b


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
                     buffers: dict[str, Buffer], length: int, first: np.ndarray, last: np.ndarray,
                     groups: Iterable[Group] = ()) -> np.ndarray:
    """Bytes (at the traced sizes) live at each position in storages that are not arena
    buffers: fresh buffers, storages of self-allocating kernels and fallbacks, and the inputs the
    call frees at their last use (the wrapper drops its references then).

    Which inputs die here is ``graph.inputs_freed_at_last_use``'s guess, used only to choose
    windows (never for soundness); the inputs the caller holds are a constant that does not move
    the peak, so they are left out."""
    env = shape_env_of(gm)
    skip = {b.name for b in buffers.values() if b.kind in ("arena", "slice")}
    # values a fused kernel computes and reads itself never reach memory
    skip |= {n.name for g in groups if g.fused for n in g.nodes if n not in g.outputs}
    freed = set(inputs_freed_at_last_use(gm))
    skip |= {n.name for n in schedule if n.op == "placeholder" and n not in freed}
    spans: dict[Any, tuple[int, int, int]] = {}  # storage -> (bytes, first, last)
    for r, l in live.items():
        v = r.meta.get(VAL)
        if r.name in skip or not isinstance(v, torch.Tensor) or node_kind(r) not in ("placeholder", "compute", "getitem"):
            continue
        # inputs that are views of one storage (a saved value and its base) hold its bytes once
        key = _storage_key(v) if r.op == "placeholder" else r
        nbytes, lo, hi = spans.get(key, (0, first[l.start], last[l.end]))
        spans[key] = (max(nbytes, storage_nbytes_hint(v, env)), min(lo, first[l.start]), max(hi, last[l.end]))
    return live_profile(((lo, hi, nbytes) for nbytes, lo, hi in spans.values()), length)


# Eager ATen ops that allocate scratch inside themselves, and how much at most: oneDNN's
# convolutions reorder their tensor arguments into blocked layouts (measured: convolution_backward
# allocates its input's and its output gradient's bytes again).
SCRATCH_OPS = {"convolution": "inputs", "convolution_backward": "inputs"}


def scratch_bytes(gm: fx.GraphModule, groups: Iterable[Group], pos: dict[fx.Node, int], length: int,
                  first: np.ndarray) -> tuple[np.ndarray, dict[int, str]]:
    """Bytes eager ops allocate inside themselves at each position (``SCRATCH_OPS``), and the op
    that does by position."""
    out = np.zeros(max(length, 1), dtype=np.int64)
    who: dict[int, str] = {}
    env = shape_env_of(gm)
    for g in groups:
        for n in g.nodes:
            nbytes = eager_scratch_bytes(n, env) if n in pos else 0
            at = int(first[pos[n]]) if nbytes else 0
            if nbytes > out[at]:
                out[at], who[at] = nbytes, n.name
    return (out[:length] if length else out[:0]), who


def eager_scratch_bytes(n: fx.Node, env=None) -> int:
    """Bytes ``n``'s ATen kernel allocates inside itself at most (``SCRATCH_OPS``; whatever the
    group's backend: fxforge's own kernels compute none of these ops, every backend calls ATen's)."""
    name = getattr(n.target, "__name__", "").split(".")[0]
    if SCRATCH_OPS.get(name) != "inputs":
        return 0
    return sum(storage_nbytes_hint(a.meta[VAL], env) for a in n.all_input_nodes if isinstance(a.meta.get(VAL), torch.Tensor))


def _storage_key(v: torch.Tensor) -> Any:
    """What identifies ``v``'s storage among the graph's values (fake tensors that view one
    storage share it)."""
    try:
        from torch.multiprocessing.reductions import StorageWeakRef

        return StorageWeakRef(v.untyped_storage())
    except Exception:  # (a value with no storage to ask)
        return id(v)


def write_in_place(buffers: dict[str, Buffer], groups: list[Group], pos: dict[fx.Node, int]) -> None:
    """Each buffer that may be written over an input dying at its producer: ``Buffer.reuses``
    set to that input's buffer (``inplace_source``, ``group_inplace_source``)."""
    # one kernel reading and writing several values at different indices may not overwrite
    # its own inputs, unless it writes one output only, each element after reading it
    # (``group_inplace_source``)
    group_of = {n: g for g in groups if g.fused and len(g.nodes) > 1 for n in g.nodes}
    home = {b.name: _root(b, buffers).name for b in buffers.values() if b.kind == "slice"}
    reused: set[str] = set()
    for b in sorted(buffers.values(), key=lambda b: b.start):
        g = group_of.get(b.producer)
        if g is not None and not (g.overwrites_inputs and g.outputs == [b.producer]):
            continue
        if b.index is None and b.kind != "slice" and not ZERO_COPY.on(b.producer) \
                and not SYMMETRIC.on(b.producer):
            src = inplace_source(b.producer, b, buffers, pos, home) if g is None else \
                group_inplace_source(g, b, buffers, pos, home)
            if src is None or src.name in reused or SYMMETRIC.on(src.producer):
                continue  # (symmetric bytes are in another arena)
            if b.kind == "fresh":
                # an output written over an arena buffer that dies there: that buffer, and
                # the in-place chain it ends (each an arena buffer), are allocated fresh
                # instead and handed to the caller as the output (a tied embedding's
                # gradient, ``mm + embedding_dense_backward``, then holds two
                # vocabulary-sized buffers at its end, not three; a table shared by an
                # encoder and a decoder adds both embeddings' rows into the head's ``mm``)
                link = src
                while link is not None:
                    link.kind = "fresh"
                    link = buffers[link.reuses] if link.reuses is not None else None
            b.reuses = src.name
            reused.add(src.name)


def plan_memory(gm: fx.GraphModule, schedule: list[fx.Node], groups: list[Group], config: Config,
                kind: str = "graph") -> MemoryPlan:
    """The memory plan of ``gm`` over ``schedule``.  ``kind`` (inference, forward, backward...)
    decides whether its arenas are kept across calls (``keep_arenas``) and makes symmetric
    arenas' allocation ids differ between graphs of one model."""
    pos = positions(schedule, groups)
    live = liveness(schedule, output_nodes(gm), pos)
    buffers = collect_buffers(gm, groups, pos, live)
    if config.inplace:
        write_in_place(buffers, groups, pos)
    by_device: dict[str, list[Buffer]] = {}
    symmetric = []
    for b in buffers.values():
        if b.kind == "arena":
            (symmetric if SYMMETRIC.on(b.producer) else by_device.setdefault(str(b.device), [])).append(b)
    env = shape_env_of(gm)
    length = max(pos.values(), default=-1) + 1
    first, last = call_spans(groups, pos, length)
    other = other_live_bytes(gm, schedule, live, buffers, length, first, last, groups)
    # the peak counts what eager ops allocate inside themselves (scratch), at their calls
    scratch, scratch_of = scratch_bytes(gm, groups, pos, length, first)
    with_scratch = other + scratch
    peak = int(with_scratch.max(initial=0))
    arenas = []
    arena_calls = np.zeros(length, dtype=np.int64)  # (bytes of arenas allocated at each position)
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
        peak += placed_peaks(placed, hinted, with_scratch, first, last, env)[0] - int(with_scratch.max(initial=0))
        arena_calls += arena_calls_profile(placed, hinted, first, last, env)
        for heads, (offsets, nbytes, planner) in placed:
            name = f"arena{len(arenas)}"
            for head in heads:
                for b in members[head]:
                    b.arena, b.offset = name, offsets[head]
            arenas.append(Arena(name, bufs[0].device, nbytes, planner,
                                start=min(spans[k][1] for k in heads), end=max(spans[k][2] for k in heads)))
    symm_arenas, barriers = plan_symmetric(gm, symmetric, pos, length, config.alignment, env,
                                           f"{kind}\n{gm.code}") if symmetric else ([], [])
    kept = keep_arenas(arenas, buffers, config, kind, (first, last))
    if kept:  # (one block, held through every call)
        peak = int(with_scratch.max(initial=0)) + kept
        arena_calls[:] = kept
    recycle_fresh(buffers, config, kind)
    at = int((arena_calls + with_scratch).argmax()) if length else 0
    parts = PeakParts(int(arena_calls[at]), int(other[at]), int(scratch[at]), scratch_of.get(at)) if length else None
    return MemoryPlan(buffers, arenas + symm_arenas, config.alignment, env, barriers, kept, peak, parts)


def recycle_fresh(buffers: dict[str, Buffer], config: Config, kind: str) -> None:
    """Mark the fresh CPU buffers of static size at least ``recycle_min_bytes`` as recycled
    (``Config.recycle_outputs``): on a later call each is allocated over the bytes it had before
    when the caller no longer holds them.  None where the policy excludes this graph (a training
    step's forward or backward under "inference")."""
    if config.recycle_outputs == "never" or \
            (config.recycle_outputs == "inference" and kind in ("forward", "backward")):
        return
    for b in buffers.values():
        nbytes = sympy.sympify(b.nbytes)
        b.recycled = b.kind == "fresh" and b.reuses is None and b.device.type == "cpu" and nbytes.is_Integer \
            and int(nbytes) >= config.recycle_min_bytes


def keep_arenas(arenas: list[Arena], buffers: dict[str, Buffer], config: Config, kind: str,
                calls: tuple[np.ndarray, np.ndarray]) -> int:
    """Lay the arenas out in one block kept across calls (``Config.keep_arenas``), arenas that
    never live together sharing addresses (over whole kernel calls: ``call_spans``, as the
    wrapper binds them); the block's bytes, or 0 when they are not kept: a policy excluding this
    graph (under "inference", a training graph's block over ``keep_training_arenas_max_bytes``, or
    any under ``memory_budget``),
    symbolic sizes, or arenas on several devices."""
    if config.keep_arenas == "never" or not arenas:
        return 0
    names = {a.name for a in arenas}
    sizes = [a.nbytes for a in arenas] + [b.offset for b in buffers.values() if b.arena in names]
    if len({str(a.device) for a in arenas}) > 1 or not all(sympy.sympify(e).is_Integer for e in sizes):
        return 0
    first, last = calls
    offsets, nbytes, _ = place({a.name: (a.nbytes, int(first[a.start]), int(last[a.end])) for a in arenas},
                               config.alignment)
    if config.keep_arenas == "inference" and kind in ("forward", "backward") \
            and (nbytes > config.keep_training_arenas_max_bytes or config.memory_budget is not None):
        return 0  # (under a memory budget, bytes held through the step count against it)
    for a in arenas:
        a.block_offset = int(offsets[a.name])
    return int(nbytes)


def arena_peak_bytes(plan: MemoryPlan) -> int:
    """Most arena bytes live at once (at the traced sizes): arenas live over their windows.
    Symmetric arenas (held across calls) are counted apart: ``symmetric_arena_bytes``."""
    return peak_live_bytes((a.start, a.end, plan.hint(a.nbytes)) for a in plan.arenas if a.symmetric is None)


def symmetric_arena_bytes(plan: MemoryPlan) -> int:
    return sum(plan.hint(a.nbytes) for a in plan.arenas if a.symmetric is not None)


def arena_intervals(plan: MemoryPlan, arena: str) -> list[Interval]:
    """One interval per block of ``arena`` at the traced sizes (in-place chains are one block)."""
    spans = block_intervals([b for b in plan.buffers.values() if b.arena == arena])
    return [Interval(k, plan.hint(n), s, e) for k, (n, s, e) in spans.items()]


def verify_slices(plan: MemoryPlan) -> None:
    by_base: dict[str, list[Buffer]] = {}
    for b in plan.buffers.values():
        if b.kind != "slice":
            continue
        base, root = plan.buffers[b.base], plan.root(b)
        lo = [plan.hint(s) for s in b.region]
        hi = [x + plan.hint(n) for x, n in zip(lo, b.extent())]
        if len(lo) != len(base.shape) or any(x < 0 or y > plan.hint(n) for x, y, n in zip(lo, hi, base.shape)):
            raise PlanError(f"{b.name} is the region {plan.region_text(b)} of {base.name}, which has shape "
                            f"{tuple(plan.hint(n) for n in base.shape)}")
        if not root.start <= b.start <= b.end <= root.end:
            raise PlanError(f"{b.name} lives over {b.start}..{b.end}, but {root.name}, holding its bytes, "
                            f"over {root.start}..{root.end}")
        for o in by_base.setdefault(b.base, []):
            olo = [plan.hint(s) for s in o.region]
            ohi = [x + plan.hint(n) for x, n in zip(olo, o.extent())]
            empty = any(x >= y for x, y in zip(lo, hi)) or any(x >= y for x, y in zip(olo, ohi))
            if not empty and all(x < y2 and x2 < y for x, y, x2, y2 in zip(lo, hi, olo, ohi)):
                raise PlanError(f"regions {b.name} and {o.name} of {b.base} overlap")
        by_base[b.base].append(b)


def verify_memory_plan(plan: MemoryPlan) -> None:
    """Raise ``offsets.PlanError`` if two buffers live at once share bytes (at the traced sizes),
    a buffer leaves its arena (in bytes, or in time: its live range outside the arena's), or an
    offset is misaligned.  Buffers of different arenas never share bytes (separate allocations).
    A buffer written in place over an input it replaces shares that input's bytes by design, and
    a region of a buffer (zero-copy cat/pad) shares its base's: it must lie inside the base, live
    while the buffer holding its bytes does, and not overlap another region of the same base.
    Every other overlap is an error."""
    verify_slices(plan)
    verify_symmetric(plan)
    for a in plan.arenas:
        members = blocks([b for b in plan.buffers.values() if b.arena == a.name])
        outside = [m.name for ms in members.values() for m in ms if not a.start <= m.start <= m.end <= a.end]
        if outside:
            raise PlanError(f"{a.name} lives over {a.start}..{a.end}, but buffers {outside} live outside it")
        if any(len({plan.hint(m.offset) for m in ms}) != 1 for ms in members.values()):
            raise PlanError(f"an in-place chain in {a.name} does not share one offset")
        offsets = {k: plan.hint(ms[0].offset) for k, ms in members.items()}
        verify_plan(arena_intervals(plan, a.name), offsets, plan.hint(a.nbytes), plan.alignment)
