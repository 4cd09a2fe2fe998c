"""Lowering passes that rewrite nodes one at a time: ``NodeRewrite``, the nodes of one op, each
where its rule takes it (``lowering/reshaped_cats.py``, ``lowering/permuted_copies.py``), and
``AddRewrite``, an add folded into the op of one of its terms (``lowering/matmul_accumulate.py``,
``lowering/embedding_grads.py``)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx

from ..core.graph import VAL, expr, fake_mode_of
from ..infra.pass_manager import PassResult


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


def add_terms(n: fx.Node, takes: Callable[[fx.Node], bool]) -> tuple[fx.Node, fx.Node] | None:
    """``(term, other)`` of ``n`` where ``n`` is ``add.Tensor(a, b)`` (``alpha`` 1) of float32 or
    float64 tensors of one shape, dtype and layout (no broadcast, no promotion), and one term is
    a node ``takes`` accepts that nothing but the add reads, and the add once (``add(t, t)``
    reads it twice; the first such, in argument order);
    else None.  The pattern of rewrites folding the add into the term's op (``matmul_accumulate``,
    ``embedding_grads``)."""
    if (n.op != "call_function" or n.target is not torch.ops.aten.add.Tensor or n.kwargs.get("alpha", 1) != 1
            or len(n.args) != 2):
        return None
    for term, other in (n.args, n.args[::-1]):
        if not (isinstance(term, fx.Node) and isinstance(other, fx.Node) and other is not term
                and len(term.users) == 1 and takes(term)):
            continue
        want, got, have = (x.meta.get(VAL) for x in (n, term, other))
        if not all(isinstance(t, torch.Tensor) for t in (want, got, have)):
            continue
        if (want.dtype in (torch.float32, torch.float64) and got.dtype == have.dtype == want.dtype
                and [expr(s) for s in have.shape] == [expr(s) for s in want.shape]
                and [expr(s) for s in have.stride()] == [expr(s) for s in want.stride()]):
            return term, other
    return None


class AddRewrite:
    """A pass folding each ``add(term, other)`` that ``add_terms`` finds into one new node:
    subclasses name the pass (``name``), say which terms it takes (``takes``), and make the node
    (``fold``, called at the add's place in the graph; None: the add stays, the graph as it was).
    The add's users read the new node, and the term, read by the add alone, goes, with the nodes
    only it read.  The stat ``accumulated`` counts the adds folded."""

    name: str

    def takes(self, term: fx.Node) -> bool:
        raise NotImplementedError

    def fold(self, gm: fx.GraphModule, mode, add: fx.Node, term: fx.Node, other: fx.Node) -> fx.Node | None:
        raise NotImplementedError

    def terms(self, add: fx.Node) -> tuple[fx.Node, fx.Node] | None:
        """``(term, other)`` of an add this pass folds (``add_terms`` unless a subclass widens it)."""
        return add_terms(add, self.takes)

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        mode = None
        done = 0
        for n in list(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor)):
            found = self.terms(n)
            if found is None:
                continue
            mode = mode or fake_mode_of(gm)  # (looked up once there is something to rewrite)
            if mode is None:
                break
            with gm.graph.inserting_before(n):
                new = self.fold(gm, mode, n, *found)
            if new is None:
                continue
            replace(n, new, new)
            read = found[0].all_input_nodes
            gm.graph.erase_node(found[0])
            for x in read:  # what only the term read (the product under a reshaped term)
                if x.op == "call_function" and not x.users and not x.is_impure():
                    gm.graph.erase_node(x)
            done += 1
        if done:
            gm.recompile()
        return PassResult(gm, done > 0, {"accumulated": done})
