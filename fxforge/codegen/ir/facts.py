"""What a group's kernel needs, from each member's facts, without walking the group.

The fusion pass asks a backend for the cost of every candidate merge (``fusion_cost``): a chain
growing one node at a time would have the emitter walk groups of 2, 3, ... 64 nodes.  For groups
of static pointwise nodes the walk's answer follows from per-node facts combined as sets, in
O(the group's nodes):

* such a group is one flat loop over its element count: the emitter refuses it only when the
  counts differ (every member was accepted alone: its op, dtypes and printing are the same
  inside a group, where its operands are values instead of loads);
* its launch arguments are one pointer per tensor its members' semantics read from outside
  (``aten.read_nodes``; each node outside the group one tensor), one per output it stores, and
  one per runtime scalar read; its io buffers, the tensors read and stored.

Groups with reductions, views or symbolic sizes are the emitter's to answer (None here).  In debug
mode the wrapper checks every fused group's answer against the kernel emitted for it
(``Wrapper.check_cost``).

Each node's facts are found once per graph (``pointwise_facts``, kept with the probes' summaries in
the graph module's meta while a ``PassManager`` runs).  A backend offering ``pointwise_facts`` as
its ``fusion_facts`` lets the fusion pass keep each group's facts (``PointwiseFacts``) and merge
them with the groups: a merge then costs its groups' reads, not their members.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from ...graph import PROBES, VAL, free_symbols, node_kind
from ...iteration import kind_of
from ..api import GroupCost
from .aten import read_nodes


@dataclass(frozen=True)
class PointwiseFacts:
    """A group of static pointwise nodes with one element count: the tensors and scalars its
    members read from outside it.  ``merge`` combines two groups' facts in O(their reads)."""

    numel: int
    tensors: frozenset[fx.Node]
    scalars: frozenset[fx.Node]

    def merge(self, other: "PointwiseFacts", members: set[fx.Node]) -> "PointwiseFacts | None":
        """The facts of the two groups as one (``members``: all its nodes), or None: their
        element counts differ, the emitter must answer."""
        if other.numel != self.numel:
            return None
        return PointwiseFacts(self.numel, frozenset(x for x in self.tensors | other.tensors if x not in members),
                              frozenset(x for x in self.scalars | other.scalars if x not in members))

    def cost(self, stored: int) -> GroupCost:
        """The kernel's launch arguments and io buffers, storing ``stored`` outputs: a pointer per
        tensor read and per output, one per runtime scalar."""
        return GroupCost(num_args=len(self.tensors) + stored + len(self.scalars),
                         unique_io_buffers=len(self.tensors) + stored)


def pointwise_facts(n: fx.Node) -> PointwiseFacts | None:
    """The facts of ``n`` alone, or None: not a static pointwise node (a backend's
    ``fusion_facts``).  Memoized per graph (module docstring)."""
    gm = n.graph.owning_module
    memo = gm.meta.get(PROBES) if gm is not None else None
    if memo is None:  # not while a PassManager runs
        return _facts(n)
    key = ("facts", n)
    if key not in memo:
        memo[key] = _facts(n)
    return memo[key]


def _facts(n: fx.Node) -> PointwiseFacts | None:
    v = n.meta.get(VAL)
    if node_kind(n) != "compute" or not isinstance(v, torch.Tensor) or kind_of(n) != "pointwise" or free_symbols(v):
        return None
    read = read_nodes(n)
    if read is None:
        return None
    read = [a for a in read if a is not n]
    tensors = frozenset(a for a in read if isinstance(a.meta.get(VAL), torch.Tensor))
    return PointwiseFacts(v.numel(), tensors, frozenset(read) - tensors)


def pointwise_cost(nodes: list[fx.Node], outputs: list[fx.Node] | None) -> GroupCost | None:
    """The cost of a group of static pointwise nodes with one element count (``outputs``: those
    used outside; None or empty: every member), or None: the emitter must answer."""
    members = set(nodes)
    group = None
    for n in nodes:
        facts = pointwise_facts(n)
        if facts is None:
            return None
        group = facts if group is None else group.merge(facts, members)
        if group is None:
            return None
    stored = [n for n in outputs if n in members] if outputs else nodes
    return None if group is None else group.cost(len(stored))
