"""Bucketing: small all-gathers and reduce-scatters merged into one collective over a flat buffer.

A training step sharded FSDP-style gathers every parameter and reduce-scatters every gradient
on its own: each collective pays the link's latency (``core/costs.py``: ``(n-1)`` steps of
``alpha``) for a few kilobytes.  ``BucketCollectives`` merges runs of them, in program order, into
one collective of at most ``Config.bucket_bytes`` (what one rank sends):

* **all-gathers** of one process group, size and dtype: their inputs are flattened and cat'ed
  into one buffer (the copy-in: written in place by the kernels producing them where they can,
  ``passes/padcat.py``), gathered once, and each member's result is its slice of every rank's
  block, copied out just before the first node reading it (a rank's blocks interleave the
  members: the one copy the layout needs);
* **reduce-scatters** of one group, size, reduction and dtype: each input seen as ``[ranks,
  chunk]`` and cat'ed along the chunks (``[ranks, sum of chunks]``), reduce-scattered once; each
  member's result is a slice of this rank's block: a view, no copy-out.

Each bucket is issued just after the last of its inputs is made, waited for where its first
member was read (``passes/overlap.py`` then moves both).  Views of a member's result that only
pass it on (a gradient viewed in its parameter's shape for the graph's output) are moved down to
where it is read, so that they do not count as reading it.  A member joins a bucket only if its
input does not depend on what the bucket waits for (no cycle), and the order of the collectives
stays the same on every rank: buckets are made the same way from the same graph.  ``stats`` of the pass:
``buckets`` (merged collectives made), ``bucketed`` (collectives merged into them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..core.config import Config
from ..core.graph import VAL, fake_call, fake_mode_of, inherit_meta, node_kind
from ..infra.pass_manager import PassResult
from ..core.collectives import is_wait


def _funcol():
    return torch.ops._c10d_functional


aten = torch.ops.aten


class BucketCollectives:
    name = "bucket_collectives"

    def __init__(self, config: Config):
        self.config = config

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        f = _funcol()
        mode = fake_mode_of(gm)
        if not self.config.bucket_bytes or mode is None:
            return PassResult(gm, False, {})
        make = {f.all_gather_into_tensor.default: (_gather_key, _gather),
                f.reduce_scatter_tensor.default: (_scatter_key, _scatter)}
        # (positions read once: a wait's views and their readers are not moved by another wait's)
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        for n in list(gm.graph.nodes):
            if n.op == "call_function" and n.target in make and _only_wait(n) is not None:
                _sink_views(_only_wait(n), order)
        buckets = _buckets(gm, make, self.config.bucket_bytes)
        for b in buckets:
            make[b.members[0].target][1](gm, mode, b)
            for m in b.members:  # (their waits' readers read the bucket's results now)
                for w in list(m.users):
                    gm.graph.erase_node(w)
                gm.graph.erase_node(m)
        return PassResult(gm, bool(buckets), {"buckets": len(buckets), "bucketed": sum(len(b.members) for b in buckets)})


@dataclass
class _Bucket:
    members: list[fx.Node]  # the collectives, in program order
    read_at: int  # the position of the earliest node reading one of their results
    ready_at: int  # the position of the last of their inputs
    nbytes: int


def _buckets(gm: fx.GraphModule, make: dict, limit: int) -> list[_Bucket]:
    """Runs of collectives of one kind, group, size (and reduction) and dtype, in program order,
    each of at most ``limit`` bytes of input, every member's input computed before any member's
    result is read (so the merged collective can run where the first of them is needed)."""
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    open_: dict[tuple, _Bucket] = {}
    done: list[_Bucket] = []
    for n in gm.graph.nodes:
        x = n.args[0] if n.op == "call_function" and n.target in make else None
        if not isinstance(x, fx.Node) or _only_wait(n) is None or not _contiguous(x):
            continue
        key = make[n.target][0](n)
        reader = min(_only_wait(n).users, key=position.__getitem__)
        nbytes, ready = _bytes(n.args[0]), position[n.args[0]]
        b = open_.get(key)
        if b is not None and b.nbytes + nbytes <= limit and max(b.ready_at, ready) < min(b.read_at, position[reader]):
            b.members.append(n)
            b.nbytes += nbytes
            b.ready_at = max(b.ready_at, ready)
            b.read_at = min(b.read_at, position[reader])
            continue
        if b is not None and len(b.members) > 1:
            done.append(b)
        open_[key] = _Bucket([n], position[reader], ready, nbytes)
    return done + [b for b in open_.values() if len(b.members) > 1]


def _sink_views(w: fx.Node, order: dict[fx.Node, int]) -> None:
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


def _bytes(x: fx.Node) -> float:
    v = x.meta.get(VAL)
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape) \
        else math.inf


def _bucket_at(b: _Bucket) -> fx.Node:
    """Where the bucket is issued: just after the last of its members' inputs (the node before
    which it goes; positions found again: earlier buckets have added nodes), before any member's
    result is read (``_buckets``). A collective issued where its input is ready stays ahead of
    those the graph has after it (the overlap keeps the issue order)."""
    order = {n: i for i, n in enumerate(b.members[0].graph.nodes)}
    at = max((m.args[0] for m in b.members), key=order.__getitem__).next
    while at.op == "placeholder":  # (inputs stay the graph's first nodes)
        at = at.next
    return at


def _first_reader(w: fx.Node) -> fx.Node:
    """The first node (in program order) reading ``w``: where a member's copy-out goes."""
    order = {n: i for i, n in enumerate(w.graph.nodes)}
    return min(w.users, key=order.__getitem__)


def _gather(gm: fx.GraphModule, mode, b: _Bucket) -> None:
    """One all-gather of the members' inputs flattened and cat'ed; each member's result copied
    out of every rank's block (``[ranks, total]``)."""
    f = _funcol()
    ranks, group = b.members[0].args[1], b.members[0].args[2]
    sizes = [m.args[0].meta[VAL].numel() for m in b.members]
    with gm.graph.inserting_before(_bucket_at(b)):
        flats = [fake_call(gm, mode, aten.view.default, (m.args[0], [-1])) for m in b.members]
        flat = fake_call(gm, mode, aten.cat.default, (flats,))
        merged = fake_call(gm, mode, f.all_gather_into_tensor.default, (flat, ranks, group))
        done = fake_call(gm, mode, f.wait_tensor.default, (merged,))
    inherit_meta([*flats, flat, merged, done], b.members[0])

    def copy_out(offset: int, size: int) -> list[fx.Node]:
        # (each member views the rows itself: nothing reads the wait before the first copy-out)
        rows = fake_call(gm, mode, aten.view.default, (done, [ranks, sum(sizes)]))
        part = fake_call(gm, mode, aten.slice.Tensor, (rows, 1, offset, offset + size))
        return [rows, part, fake_call(gm, mode, aten.clone.default, (part,), {"memory_format": torch.contiguous_format})]

    _hand_out(gm, mode, b, sizes, copy_out)


def _scatter(gm: fx.GraphModule, mode, b: _Bucket) -> None:
    """One reduce-scatter of the members' inputs as ``[ranks, chunk]`` cat'ed along the chunks;
    each member's result a view of its slice of this rank's block."""
    f = _funcol()
    op, ranks, group = b.members[0].args[1], b.members[0].args[2], b.members[0].args[3]
    chunks = [m.args[0].meta[VAL].numel() // ranks for m in b.members]
    with gm.graph.inserting_before(_bucket_at(b)):
        blocks = [fake_call(gm, mode, aten.view.default, (m.args[0], [ranks, c])) for m, c in zip(b.members, chunks)]
        joined = fake_call(gm, mode, aten.cat.default, (blocks, 1))
        flat = fake_call(gm, mode, aten.view.default, (joined, [-1]))
        merged = fake_call(gm, mode, f.reduce_scatter_tensor.default, (flat, op, ranks, group))
        done = fake_call(gm, mode, f.wait_tensor.default, (merged,))
    inherit_meta([*blocks, joined, flat, merged, done], b.members[0])
    _hand_out(gm, mode, b, chunks, lambda offset, c: [fake_call(gm, mode, aten.slice.Tensor, (done, 0, offset, offset + c))])


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
