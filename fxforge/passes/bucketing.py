"""Bucketing: small all-gathers, reduce-scatters and all-reduces merged into one collective over a
flat buffer.

A training step sharded FSDP-style gathers every parameter and reduce-scatters every gradient
on its own: each collective pays the link's latency (``core/costs.py``: ``(n-1)`` steps of
``alpha``) for a few kilobytes.  ``BucketCollectives`` merges runs of them, in program order, into
one collective of at most ``Config.bucket_bytes`` (what one rank sends), the runs cut where the
compute waits least under the cost models (``_partition``):

* **all-gathers** of one process group, size and dtype: their inputs are flattened and cat'ed
  into one buffer (the copy-in: each member's run written in place by the kernel producing it
  where it can, ``passes/padcat.py``), gathered once, and each member's result is its slice of
  every rank's block, copied out just before the first node reading it (a rank's blocks
  interleave the members: the one copy the layout needs);
* **reduce-scatters** of one group, size, reduction and dtype: each input seen as ``[ranks,
  chunk]`` and cat'ed along the chunks (``[ranks, sum of chunks]``), reduce-scattered once; each
  member's result is a slice of this rank's block: a view, no copy-out.
* **all-reduces** of one group, reduction and dtype (the gradients of parameters held whole on
  every rank, data-parallel; a loss's sum and count): inputs flattened and cat'ed (in place, as
  the all-gathers'), reduced once; each member's result is a slice of the result: a view, no
  copy-out.  A bucket small enough is then lowered to a one-shot all-reduce on symmetric memory
  (``Config.symmetric_all_reduce_bytes``, ``passes/symmetric.py``): its flat buffer in the
  symmetric arena, each member still written into its run.

Each bucket is issued where its first member was, or just after the last of its inputs is made
if that is later, and waited for where its first member was read (``passes/overlap.py`` then
moves both).  Views of a member's result that only pass it on (a gradient viewed in its
parameter's shape for the graph's output) are moved down to where it is read, so that they do
not count as reading it; so is a collective passing a result on to the output (a 2-D mesh's
gradient reduce-scattered over one dimension, then reduced over the other), with what lays the
result out for it (``_feed``): the first collectives are then bucketed together, and the second
ones too.  A member joins a bucket only if its input does not depend on what the bucket waits
for (no cycle) and is not written in place (the bucket may be issued after the write), and the
order of the collectives stays the same on every rank: buckets are made the same way from the
same graph.  ``stats`` of the pass: ``buckets`` (merged collectives made), ``bucketed``
(collectives merged into them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..core.config import Config
from ..core.graph import (VAL, fake_call, fake_mode_of, inherit_meta, node_kind, storage_root, with_views,
                          written_in_place)
from ..infra.pass_manager import PassResult
from ..lowering.cleanup import has_side_effects
from ..core.collectives import collective_bytes, group_size_of, is_collective, is_wait
from ..core.costs import CommModel, ComputeModel, graph_models, node_time


def _funcol():
    return torch.ops._c10d_functional


aten = torch.ops.aten


class BucketCollectives:
    name = "bucket_collectives"

    def __init__(self, config: Config):
        self.config = config

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        f = _funcol()
        make = {f.all_gather_into_tensor.default: (_gather_key, _gather),
                f.reduce_scatter_tensor.default: (_scatter_key, _scatter),
                f.all_reduce.default: (_reduce_key, _reduce)}
        if not self.config.bucket_bytes or not any(n.op == "call_function" and n.target in make for n in gm.graph.nodes):
            return PassResult(gm, False, {})
        mode = fake_mode_of(gm)
        if mode is None:
            return PassResult(gm, False, {})
        waited = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in make and _only_wait(n) is not None]
        _sink_views(gm, waited)
        chained = [(n, feed) for n in waited if (feed := _feed(n)) is not None]
        order = {n: i for i, n in enumerate(gm.graph.nodes)}  # (a moved node is no chained one's reader)
        for n, feed in chained:
            _sink_collective(n, feed, order)
        if chained:  # (what the moved ones read is read later now)
            _sink_views(gm, waited)
        buckets = _buckets(gm, make, self.config.bucket_bytes,
                           *graph_models(gm, self.config.comm_model, self.config.threads))
        # (the last issued first: a bucket reading another's results, a gathered weight reduce-scattered,
        # is made while they are where the graph waits for them; the other's copy-outs then go before it)
        for b in sorted(buckets, key=lambda b: -b.ready_at):
            make[b.members[0].target][1](gm, mode, b)
            for m in b.members:  # (their waits' readers read the bucket's results now)
                for w in list(m.users):
                    gm.graph.erase_node(w)
                gm.graph.erase_node(m)
        return PassResult(gm, bool(buckets), {"buckets": len(buckets), "bucketed": sum(len(b.members) for b in buckets)})


@dataclass
class _Bucket:
    members: list[fx.Node]  # the collectives, in program order
    ready_at: int  # the position of the last of their inputs


@dataclass(frozen=True)
class _Member:
    """A collective a bucket may take, as the partition sees it."""
    node: fx.Node
    ready_at: int  # positions: its input's, its first reader's
    read_at: int
    nbytes: float  # its input's bytes (what the bucket limit counts)
    sent: int  # the bytes this rank sends for it (what the link model prices)
    ready_s: float  # the compute before its input is made, and before its result is read
    due_s: float


def _buckets(gm: fx.GraphModule, make: dict, limit: int, comm: CommModel, compute: ComputeModel) -> list[_Bucket]:
    """The buckets of ``gm``'s collectives: per kind, group, size (and reduction) and dtype, its
    collectives in program order cut into runs (``_partition``), each of at most ``limit`` bytes
    of input, every member's input computed before any member's result is read (so the merged
    collective can run where the first of them is needed)."""
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    clock = _compute_clock(gm, compute)
    runs: dict[tuple, list[_Member]] = {}
    for n in gm.graph.nodes:
        x = n.args[0] if n.op == "call_function" and n.target in make else None
        if not isinstance(x, fx.Node) or _only_wait(n) is None or not _contiguous(x) or written_in_place(storage_root(x)):
            continue  # (a bucket is issued later than its members were: not past a write into one)
        reader = min(_only_wait(n).users, key=position.__getitem__)
        runs.setdefault(make[n.target][0](n), []).append(
            _Member(n, position[x], position[reader], _bytes(x), collective_bytes(n)[1], clock[x.next], clock[reader]))
    out: list[_Bucket] = []
    for members in runs.values():
        kind, ranks = collective_bytes(members[0].node)[0], group_size_of(members[0].node)
        for run in _partition(members, limit, lambda sent: comm.time(kind, sent, ranks)):
            if len(run) > 1:
                out.append(_Bucket([m.node for m in run], max(m.ready_at for m in run)))
    return out


def _compute_clock(gm: fx.GraphModule, compute: ComputeModel) -> dict[fx.Node, float]:
    """Each node's start in program order, its compute nodes run one after another at their
    estimated times (collectives and waits take none here)."""
    clock, t = {}, 0.0
    for n in gm.graph.nodes:
        clock[n] = t
        if n.op == "call_function" and not is_collective(n) and not is_wait(n):
            t += node_time(n, compute)
    return clock


def _partition(members: list[_Member], limit: float, seconds) -> list[list[_Member]]:
    """``members`` (one bucket key's, in program order) cut into runs for the least estimated
    stall: each run is sent as one collective (``seconds(sent)`` under the link model) when the
    last of its inputs is made and the runs before it are done, one after another; the compute
    stalls where a run is not done when the first of its results is read.  A run of one more
    member pays less latency but is sent later than its first member alone would be: a graph's
    first gathers, read at once, go in a small run, and the gradients made last go in a small
    run of their own, which is all the compute waits for at the end.

    Each run also costs the compute one collective's latency (``seconds(0)``: its issue and its
    wait, a copy in and out, what the stall model leaves out), so a cut must save more stall
    than that: the buckets stay few where splitting them gains next to nothing.

    Dynamic programming over the cut points; a state after a prefix is its cost so far (stall and
    runs) and how far the link's work lags the stalled compute (the next runs' stalls depend on
    nothing else), and only states no other beats in both are kept (``_FRONT`` of them)."""
    per_run = seconds(0)
    fronts: list[list[tuple[float, float, int, int]]] = [[(0.0, 0.0, -1, -1)]]  # (cost, lag, cut, its state)
    for i in range(1, len(members) + 1):
        found = []
        nbytes = sent = 0
        ready, due = 0.0, math.inf
        read_at, ready_at = math.inf, -1
        for j in range(i - 1, -1, -1):  # the run members[j:i]
            m = members[j]
            nbytes, sent = nbytes + m.nbytes, sent + m.sent
            ready, due = max(ready, m.ready_s), min(due, m.due_s)
            ready_at, read_at = max(ready_at, m.ready_at), min(read_at, m.read_at)
            if j < i - 1 and (nbytes > limit or ready_at >= read_at):
                break  # (a longer run only adds bytes, and reads earlier or readies later)
            t = seconds(sent)
            for k, (cost, lag, _, _) in enumerate(fronts[j]):
                done = max(ready, lag) + t
                waited = max(0.0, done - due)
                found.append((cost + waited + per_run, done - waited, j, k))
        fronts.append(_pareto(found))
    cuts, i, k = [], len(members), 0
    while i > 0:
        *_, j, k = fronts[i][k]
        cuts.append(members[j:i])
        i = j
    return cuts[::-1]


_FRONT = 16


def _pareto(states: list[tuple]) -> list[tuple]:
    """The states no other beats in both cost and lag, the least cost first, at most ``_FRONT``
    of them (ties: the first found, the shortest run)."""
    out: list[tuple] = []
    for s in sorted(states, key=lambda s: (s[0], s[1])):
        if not out or s[1] < out[-1][1]:
            out.append(s)
    return out[:_FRONT]


def _sink_views(gm: fx.GraphModule, collectives: list[fx.Node]) -> None:
    """Each collective's views of its wait's result moved down (``_sink_view_chain``), positions
    read once: a wait's views and their readers are not moved by another wait's."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for n in collectives:
        _sink_view_chain(_only_wait(n), order)


def _sink_view_chain(w: fx.Node, order: dict[fx.Node, int]) -> None:
    """The views of ``w`` (a wait's result), and theirs, moved down to just before the first node
    reading one of them that is not such a view: a gradient reduce-scattered where it is made is
    viewed in its parameter's shape there but read only by the graph's output, and a bucket may
    wait that long."""
    chain: list[fx.Node] = []
    stack = list(w.users)
    while stack:
        u = stack.pop()
        if u not in chain and node_kind(u) == "view" and all(a is w or a in chain for a in u.all_input_nodes):
            chain.append(u)
            stack.extend(u.users)
    if not chain:
        return
    members = set(chain)
    first = min((r for u in chain for r in u.users if r not in members), key=order.__getitem__, default=None)
    if first is None:
        return
    for u in sorted(chain, key=order.__getitem__):
        first.prepend(u)


def _feed(c: fx.Node) -> list[fx.Node] | None:
    """What collective ``c`` reads, back to what another collective's wait gave, when ``c`` passes
    that on to the graph's output (a gradient reduced over one mesh dimension and then over the
    other; between them, views, and a cat laying the blocks out for the second): the nodes
    between, which only ``c`` reads (None: ``c`` reads something else too, its result is read
    before the output, or that wait's result is written in place)."""
    if not _returned_only(_only_wait(c)):
        return None
    feed: list[fx.Node] = []
    stack, source = [c.args[0]], None
    while stack:
        x = stack.pop()
        if not isinstance(x, fx.Node) or x in feed:
            continue
        if is_wait(x) and source in (None, x):
            source = x
            continue
        if x.op != "call_function" or is_collective(x) or is_wait(x) or has_side_effects(x) or len(feed) == _FEED:
            return None
        feed.append(x)
        stack.extend(x.all_input_nodes)
    inside = {*feed, c}
    if source is None or any(u not in inside for x in feed for u in x.users) or written_in_place(source):
        return None
    return feed


def _returned_only(w: fx.Node) -> bool:
    """Only the graph's output reads ``w``, itself or through views."""
    return all(u.op == "output" or node_kind(u) == "view" for x in with_views(w) for u in x.users)


_FEED = 16  # nodes at most between a collective and the wait it passes on


def _sink_collective(c: fx.Node, feed: list[fx.Node], order: dict[fx.Node, int]) -> None:
    """Collective ``c``, what it reads back to the wait it passes on (``feed``) and its own wait,
    moved down to just before the first node reading what it waited for: a view of it, moved
    down to the graph's output (``_returned_only``).  Traced where that wait is, ``c`` reads its
    result at once, and no collective of the waited one's kind could be bucketed with a later
    one; the overlap pass issues ``c`` again as soon as what it reads is ready."""
    first = min(_only_wait(c).users, key=order.__getitem__)
    for x in (*sorted(feed, key=order.__getitem__), c, _only_wait(c)):
        first.prepend(x)


def _contiguous(x: fx.Node) -> bool:
    v = x.meta.get(VAL)
    return isinstance(v, torch.Tensor) and v.is_contiguous()


def _only_wait(c: fx.Node) -> fx.Node | None:
    """The collective's one ``wait_tensor``, itself read (None: it has other users, or none)."""
    users = list(c.users)
    return users[0] if len(users) == 1 and is_wait(users[0]) and users[0].users else None


def _gather_key(n: fx.Node) -> tuple:
    _, ranks, group = n.args[:3]
    return ("all_gather", group, ranks, n.args[0].meta[VAL].dtype)


def _scatter_key(n: fx.Node) -> tuple:
    _, op, ranks, group = n.args[:4]
    return ("reduce_scatter", group, ranks, op, n.args[0].meta[VAL].dtype)


def _reduce_key(n: fx.Node) -> tuple:
    _, op, group = n.args[:3]
    return ("all_reduce", group, op, n.args[0].meta[VAL].dtype)


def _bytes(x: fx.Node) -> float:
    v = x.meta.get(VAL)
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape) \
        else math.inf


def _bucket_at(b: _Bucket) -> fx.Node:
    """Where the bucket is issued (the node before which it goes; positions found again: earlier
    buckets have added nodes): where its first member was, or just after the last of its
    members' inputs if that is later; before any member's result is read (``_buckets``).  So the
    collectives keep the order of their first members: the order ``_partition`` cut them in,
    which the overlap keeps (a gathered weight read first is not issued after the buckets of
    weights read later)."""
    order = {n: i for i, n in enumerate(b.members[0].graph.nodes)}
    at = max((m.args[0] for m in b.members), key=order.__getitem__).next
    while at.op == "placeholder":  # (inputs stay the graph's first nodes)
        at = at.next
    return max(at, b.members[0], key=order.__getitem__)


def _first_reader(w: fx.Node) -> fx.Node:
    """The first node (in program order) reading ``w``: where a member's copy-out goes."""
    order = {n: i for i, n in enumerate(w.graph.nodes)}
    return min(w.users, key=order.__getitem__)


def _issue(gm: fx.GraphModule, mode, b: _Bucket, collective, args: tuple, ranks: int = 0) -> fx.Node:
    """The bucket's one collective, ``collective(flat, *args)``, issued where the bucket goes
    (``_bucket_at``): ``flat`` its members' inputs flattened and cat'ed, or with ``ranks``, each
    input seen as ``[ranks, chunk]`` and cat'ed along the chunks; its wait."""
    with gm.graph.inserting_before(_bucket_at(b)):
        if ranks:
            pieces = [fake_call(gm, mode, aten.view.default, (m.args[0], [ranks, m.args[0].meta[VAL].numel() // ranks]))
                      for m in b.members]
            made = [*pieces, fake_call(gm, mode, aten.cat.default, (pieces, 1))]
            made.append(fake_call(gm, mode, aten.view.default, (made[-1], [-1])))
        else:
            pieces = [fake_call(gm, mode, aten.view.default, (m.args[0], [-1])) for m in b.members]
            made = [*pieces, fake_call(gm, mode, aten.cat.default, (pieces,))]
        made.append(fake_call(gm, mode, collective, (made[-1], *args)))
        made.append(fake_call(gm, mode, _funcol().wait_tensor.default, (made[-1],)))
    inherit_meta(made, b.members[0])
    return made[-1]


def _gather(gm: fx.GraphModule, mode, b: _Bucket) -> None:
    """One all-gather of the members' inputs flattened and cat'ed; each member's result copied
    out of every rank's block (``[ranks, total]``)."""
    ranks = b.members[0].args[1]
    sizes = [m.args[0].meta[VAL].numel() for m in b.members]
    done = _issue(gm, mode, b, _funcol().all_gather_into_tensor.default, tuple(b.members[0].args[1:3]))

    def copy_out(offset: int, size: int) -> list[fx.Node]:
        # (each member views the rows itself: nothing reads the wait before the first copy-out)
        rows = fake_call(gm, mode, aten.view.default, (done, [ranks, sum(sizes)]))
        part = fake_call(gm, mode, aten.slice.Tensor, (rows, 1, offset, offset + size))
        return [rows, part, fake_call(gm, mode, aten.clone.default, (part,), {"memory_format": torch.contiguous_format})]

    _hand_out(gm, mode, b, sizes, copy_out)


def _scatter(gm: fx.GraphModule, mode, b: _Bucket) -> None:
    """One reduce-scatter of the members' inputs as ``[ranks, chunk]`` cat'ed along the chunks;
    each member's result a view of its slice of this rank's block."""
    ranks = b.members[0].args[2]
    done = _issue(gm, mode, b, _funcol().reduce_scatter_tensor.default, tuple(b.members[0].args[1:4]), ranks)
    _hand_out(gm, mode, b, [m.args[0].meta[VAL].numel() // ranks for m in b.members], _slicer(gm, mode, done))


def _reduce(gm: fx.GraphModule, mode, b: _Bucket) -> None:
    """One all-reduce of the members' inputs flattened and cat'ed; each member's result a view of
    its slice of the result."""
    done = _issue(gm, mode, b, _funcol().all_reduce.default, tuple(b.members[0].args[1:3]))
    _hand_out(gm, mode, b, [m.args[0].meta[VAL].numel() for m in b.members], _slicer(gm, mode, done))


def _slicer(gm: fx.GraphModule, mode, done: fx.Node):
    """``piece`` of ``_hand_out`` taking a member's elements as a slice of ``done``: a view."""
    return lambda offset, size: [fake_call(gm, mode, aten.slice.Tensor, (done, 0, offset, offset + size))]


def _hand_out(gm: fx.GraphModule, mode, b: _Bucket, sizes: list[int], piece) -> None:
    """Each member's result from the bucket's: ``piece(offset, size)`` (the nodes taking its
    elements out, the last one holding them), viewed in the member's shape, made just before the
    first node reading the member's wait, which it then replaces."""
    offset = 0
    for m, size in zip(b.members, sizes):
        w = _only_wait(m)
        with gm.graph.inserting_before(_first_reader(w)):
            made = piece(offset, size)
            out = fake_call(gm, mode, aten.view.default, (made[-1], list(w.meta[VAL].shape)))
        inherit_meta([*made, out], w)
        w.replace_all_uses_with(out)
        offset += size
