"""``NodeRewrite``: a lowering pass that rewrites the nodes of one op, one at a time, each where
its rule takes it (``lowering/reshaped_cats.py``, ``lowering/permuted_copies.py``)."""

from __future__ import annotations

import torch.fx as fx

from ..graph import VAL, fake_mode_of
from ..pipeline import PassResult


class NodeRewrite:
    """Subclasses name the pass (``name``), the op (``target``), the stat counting the nodes
    rewritten (``stat``), and the rule: ``rewrite(gm, mode, node)`` replaces ``node`` (new nodes
    get fake values in ``mode``, the graph's fake mode) and returns True, or leaves the graph as
    it was and returns False.  Nodes it leaves unused go with the dead-code pass that follows.
    A node the graph returns is left alone: a rewrite ends in a view of a new node, which would
    reach the caller where eager gives a tensor of its own."""

    name: str
    target: object
    stat: str

    def rewrite(self, gm: fx.GraphModule, mode, node: fx.Node) -> bool:
        raise NotImplementedError

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        mode = fake_mode_of(gm)
        done = 0
        if mode is not None:
            for n in list(gm.graph.nodes):
                if n.op != "call_function" or n.target is not self.target or any(u.op == "output" for u in n.users):
                    continue
                done += self.rewrite(gm, mode, n)
        if done:
            gm.recompile()
        return PassResult(gm, done > 0, {self.stat: done})


def replace(node: fx.Node, value: fx.Node, computed_by: fx.Node) -> None:
    """``node``'s users read ``value`` instead, and ``node`` goes; ``computed_by``, the new node
    that now does its work, takes its metadata (a stack trace, a module path) but its value."""
    for k, v in node.meta.items():
        if k != VAL:
            computed_by.meta.setdefault(k, v)
    node.replace_all_uses_with(value)
    node.graph.erase_node(node)
