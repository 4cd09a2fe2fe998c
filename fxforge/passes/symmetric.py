"""Symmetric-memory buffers: values a collective reads from every rank's memory directly live in a
rank-identical arena, written there by their producers, with slots reused only when it is safe.

Which values (``symmetric_args``): the arguments of ``torch.ops.symm_mem`` collectives that must
be in symmetric memory (``SYMM_MEM_ARGS``: the input of one-shot / two-shot / multimem
all-reduces, the buffer of ``one_shot_all_reduce_copy``...), those a custom operator declares
with ``torch.library.Library.register_symm_mem_args``, and, with
``Config(symmetric_all_reduce_bytes=N)``, the input of every functional all-reduce (sum) of at
most N bytes, which ``LowerAllReduceToSymmetric`` rewrites into ``symm_mem.one_shot_all_reduce``.
(``fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` copy their operand into a
workspace of their own: they are collectives here, fences below, but plan no buffer.)

Where (``PlaceSymmetric``, after fusion): the value's producer writes it straight into the
symmetric arena of the collective's process group (``meta[SYMMETRIC]``): a fused Triton group, an
out= call, any kernel writing a planned buffer.  When that cannot be (a graph input, a view, a
value returned or mutated, a producer allocating its own result or an eager fallback, a value
another group's arena holds), a copy into a symmetric buffer is inserted (an ``aten.clone``,
counted in ``stats["copy_bytes"]``) and its reason counted in ``stats["symmetric_copy_ins"]``.

The plan (``plan_symmetric``, called by the memory planner): one arena per process group, the
same planners as every arena, over buffers in a deterministic order, sizes from the graph only:
every rank whose graph is the same derives the same offsets.  Allocation ids are a hash of the
graph's code, its kind (forward, backward...), the group and the arena's index: distinct for a
model's forward and backward, identical across ranks, processes and runs.

Reuse rule.  Peers read a rank's symmetric buffer during the collective, and may still be reading
it after the collective returned on this rank.  A buffer's bytes may therefore be written again
only after a *fence*: a later collective on the same group (entering it proves every rank left the
earlier one; for a functional collective, its ``wait_tensor``) or a barrier.  Each symmetric
buffer is held from its producer to the first fence after its last collective read.  The planner
places the arena twice, with the fences the graph has and with a barrier inserted after each
collective that a later symmetric buffer would otherwise wait for, and keeps the smaller arena
(ties: fewer barriers).  The arena persists across calls: when no fence follows the last
collective, each call starts with a barrier before it writes the arena.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter

import torch
import torch.fx as fx

from ..core.collectives import (
    COLLECTIVE_OPS,
    group_name_of,
    is_symmetric_collective,
    symmetric_arg_nodes,
    symmetric_args,
    wait_op,
)
from ..core.config import Config
from ..core.graph import (
    GROUP,
    SLICE_OF,
    SYMMETRIC,
    VAL,
    hint,
    is_mutating,
    node_kind,
    output_nodes,
    storage_nbytes_hint,
    storage_root,
    writes_planned,
)
from ..infra.pass_manager import PassResult
from .assign import bound_symbols

log = logging.getLogger("fxforge")

# --------------------------------------------------------------------------- lowering


class LowerAllReduceToSymmetric:
    """``wait_tensor(all_reduce(x, "sum", g))`` of at most ``Config.symmetric_all_reduce_bytes``
    bytes becomes ``symm_mem.one_shot_all_reduce(x, "sum", g)``: one step, every rank reading
    the others' ``x`` from symmetric memory (no ring of sends)."""

    name = "lower_all_reduce_to_symmetric"

    def __init__(self, config: Config):
        self.config = config

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        f = torch.ops._c10d_functional
        limit = self.config.symmetric_all_reduce_bytes
        lowered = 0
        for n in list(gm.graph.nodes):
            if n.target is not f.all_reduce.default or str(n.args[1]) != "sum":
                continue
            x, val = n.args[0], n.meta.get(VAL)
            waits = [u for u in n.users if u.target is f.wait_tensor.default]
            if not isinstance(val, torch.Tensor) or len(waits) != len(n.users) or not waits:
                continue
            if storage_nbytes_hint(val) > limit:
                continue
            with gm.graph.inserting_before(n):
                new = gm.graph.call_function(torch.ops.symm_mem.one_shot_all_reduce.default, (x, "sum", n.args[2]))
            new.meta[VAL] = waits[0].meta[VAL]
            for w in waits:
                w.replace_all_uses_with(new)
                gm.graph.erase_node(w)
            gm.graph.erase_node(n)
            lowered += 1
        if lowered:
            gm.recompile()
        return PassResult(gm, lowered > 0, {"lowered_all_reduces": lowered})


# --------------------------------------------------------------------------- placement


class PlaceSymmetric:
    """Marks each symmetric argument's producer to write into its group's arena, or inserts the
    copy-in that makes one (module docstring).  ``assign`` (the pipeline's ``AssignBackends``)
    gives a copy-in its backend, as it gave every other node."""

    name = "place_symmetric"

    def __init__(self, assign, config: Config):
        self.assign = assign
        self.config = config

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        copy_ins: Counter = Counter()
        placed = 0
        outputs = set(output_nodes(gm))
        returned = {storage_root(o) for o in outputs}
        next_group = 1 + max((GROUP.get(n, -1) for n in gm.graph.nodes), default=-1)
        bound = None
        for n in list(gm.graph.nodes):
            args = symmetric_arg_nodes(n)
            if not args:
                continue
            group = group_name_of(n)
            for _, a in args:
                why = self.refusal(a, group, returned)
                if why is None:
                    SYMMETRIC.set(a, group)
                    placed += 1
                    continue
                copy_ins[why] += 1
                log.debug("fxforge: %s reads %s from symmetric memory through a copy: %s", n.name, a.name, why)
                with gm.graph.inserting_before(n):
                    c = gm.graph.call_function(torch.ops.aten.clone.default, (a,))
                c.meta[VAL] = a.meta[VAL].clone()
                SYMMETRIC.set(c, group)
                bound = bound_symbols(gm) if bound is None else bound
                self.assign.place(c, bound, next_group)
                next_group += 1
                n.replace_input_with(a, c)
        if copy_ins:
            gm.recompile()
        return PassResult(gm, placed + sum(copy_ins.values()) > 0,
                          {"symmetric_buffers": placed, "symmetric_copy_ins": dict(copy_ins)})

    def refusal(self, a: fx.Node, group: str | None, returned: set) -> str | None:
        if group is None:
            return "no_group"
        if a.op in ("placeholder", "get_attr"):
            return "graph_input"
        if node_kind(a) != "compute" or storage_root(a) is not a:
            return "view"
        if SYMMETRIC.get(a, group) != group:
            return "other_group"
        if a in returned:
            return "graph_output"
        if any(is_mutating(u) and u.args and u.args[0] is a for u in a.users if not symmetric_args(u)):
            return "mutated"
        if not writes_planned(a) or SLICE_OF.on(a):
            return "producer"
        if not isinstance(a.meta.get(VAL), torch.Tensor):
            return "producer"
        return None


# --------------------------------------------------------------------------- fences and the plan


def fence_points(gm: fx.GraphModule, pos: dict[fx.Node, int]) -> dict[str, list[float]]:
    """Per process group, the schedule positions where every rank is known to have left the
    collectives before: each symmetric-memory collective, and each functional collective's
    ``wait_tensor``."""
    out: dict[str, list[float]] = {}
    wait = wait_op()
    for n in gm.graph.nodes:
        if n not in pos:
            continue
        if is_symmetric_collective(n):
            group = group_name_of(n)
        elif n.target is wait and isinstance(n.args[0], fx.Node) and n.args[0].target in COLLECTIVE_OPS:
            group = group_name_of(n.args[0])
        else:
            continue
        if group is not None:
            out.setdefault(group, []).append(float(pos[n]))
    return {g: sorted(ps) for g, ps in out.items()}


def symmetric_reads(gm: fx.GraphModule, pos: dict[fx.Node, int]) -> dict[fx.Node, int]:
    """The last position a collective reads each symmetric value (peers read it then too)."""
    out: dict[fx.Node, int] = {}
    for n in gm.graph.nodes:
        if n in pos:
            for _, a in symmetric_arg_nodes(n):
                out[a] = max(out.get(a, -1), pos[n])
    return out


def next_fence(points: list[float], after: float) -> float:
    """The first fence point strictly after ``after`` (math.inf: none)."""
    return next((p for p in points if p > after), math.inf)


def alloc_id(key: str, group: str, index: int) -> int:
    """A 63-bit allocation id from the graph (``key``: its kind and code), group and arena index."""
    digest = hashlib.sha256(f"{key}\n{group}\n{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _ends(bufs: list, points: list[float], length: int) -> dict[str, int]:
    """Each buffer held from its producer to the first fence after its last collective read."""
    out = {}
    for b in bufs:
        f = next_fence(points, b.released)
        out[b.name] = max(b.end, length - 1 if f == math.inf else int(math.floor(f)))
    return out


def plan_symmetric(gm: fx.GraphModule, bufs: list, pos: dict[fx.Node, int], length: int, alignment: int,
                   env, key: str) -> tuple[list, list[tuple[str, str]]]:
    """Place every symmetric buffer (``Buffer``s whose producer carries ``meta[SYMMETRIC]``) in
    one arena per process group; returns the arenas and the barriers to emit, as (node after
    which, arena).  Sets each buffer's arena, offset, ``released`` and held ``end``."""
    from ..core.plan import Arena
    from .windows import place

    reads = symmetric_reads(gm, pos)
    fences = fence_points(gm, pos)
    at = {p: n for n, p in pos.items() if symmetric_args(n)}  # collectives are never fused: one node each
    by_group: dict[str, list] = {}
    for b in sorted(bufs, key=lambda b: (b.start, b.name)):
        b.released = reads.get(b.producer, b.end)
        by_group.setdefault(SYMMETRIC.of(b.producer), []).append(b)
    arenas, barriers = [], []
    for index, group in enumerate(sorted(by_group)):
        members = by_group[group]
        points = fences.get(group, [])
        collectives = sorted({p for p, n in at.items() if group_name_of(n) == group})
        # a barrier after a collective lets the buffers it read be reused by those written before
        # the group's next fence
        extra = [p for p in collectives
                 if any(b.start > p and next_fence(points, p) > b.start for b in members)]
        options = []
        for inserted in ([], extra) if extra else ([],):
            pts = sorted(points + [p + 0.5 for p in inserted])
            ends = _ends(members, pts, length)
            spans = {b.name: (b.nbytes, b.start, ends[b.name]) for b in members}
            offsets, nbytes, planner = place(spans, alignment)
            options.append((hint(nbytes, env), len(inserted), inserted, pts, ends, offsets, nbytes, planner))
        _, _, inserted, pts, ends, offsets, nbytes, planner = min(options, key=lambda o: o[:2])
        name = f"symm{index}"
        for b in members:
            b.arena, b.offset, b.end = name, offsets[b.name], ends[b.name]
        last_read = max(b.released for b in members)
        arenas.append(Arena(name, members[0].device, nbytes, planner, start=min(b.start for b in members),
                            end=length - 1, symmetric=group, alloc_id=alloc_id(key, group, index),
                            start_barrier=next_fence(pts, last_read) == math.inf, fences=tuple(pts)))
        barriers += [(at[p].name, name) for p in inserted]
    return arenas, barriers


def verify_symmetric(plan) -> None:
    """Raise ``PlanError`` if a symmetric buffer's bytes may be written again before every rank
    is done reading it: its hold must reach the first fence after its last collective read."""
    from .offsets import PlanError

    for a in plan.arenas:
        if a.symmetric is None:
            continue
        last = max((b.end for b in plan.buffers.values() if b.arena == a.name), default=-1)
        for b in plan.buffers.values():
            if b.arena != a.name:
                continue
            f = next_fence(list(a.fences), b.released)
            need = last if f == math.inf else int(math.floor(f))
            if b.end < need:
                raise PlanError(f"symmetric buffer {b.name} of {a.name} is held to {b.end}, but peers may read it "
                                f"until the fence at {need if f != math.inf else 'the end of the call'}: its bytes "
                                "could be written while another rank still reads them")
        if a.start_barrier is False and next_fence(list(a.fences), max(
                (b.released for b in plan.buffers.values() if b.arena == a.name), default=-1)) == math.inf:
            raise PlanError(f"{a.name} is written at the start of each call with no fence after its last "
                            "collective read of the previous call and no start barrier")
