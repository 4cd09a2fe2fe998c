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
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ...graph import VAL, free_symbols, node_kind
from ...iteration import kind_of
from ..api import GroupCost
from .aten import read_nodes


def pointwise_cost(nodes: list[fx.Node], outputs: list[fx.Node] | None) -> GroupCost | None:
    """The cost of a group of static pointwise nodes with one element count (``outputs``: those
    used outside; None or empty: every member), or None: the emitter must answer."""
    members = set(nodes)
    numel = None
    tensors_in: set[fx.Node] = set()
    scalars: set[fx.Node] = set()
    for n in nodes:
        v = n.meta.get(VAL)
        if node_kind(n) != "compute" or not isinstance(v, torch.Tensor) or kind_of(n) != "pointwise" or free_symbols(v):
            return None
        if numel is None:
            numel = v.numel()
        elif v.numel() != numel:
            return None
        read = read_nodes(n)
        if read is None:
            return None
        for a in read:
            if a not in members:
                (tensors_in if isinstance(a.meta.get(VAL), torch.Tensor) else scalars).add(a)
    stored = [n for n in outputs if n in members] if outputs else nodes
    return GroupCost(num_args=len(tensors_in) + len(stored) + len(scalars),
                     unique_io_buffers=len(tensors_in) + len(stored))
