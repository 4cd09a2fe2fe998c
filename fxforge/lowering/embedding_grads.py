"""``add(y, embedding_dense_backward(g, indices, ...))`` -> ``embedding_grad_add(y, g, indices)``:
``AccumulateEmbeddingGrads``.

An embedding's gradient is a table of zeros with each index's gradient row added to its row.  A
weight used in more than one place gets the sum of its uses' gradients: a token embedding tied to
a language model's head (the head's ``mm`` plus the embedding's gradient), or a table shared by an
encoder and a decoder (two embedding gradients).  Each ``embedding_dense_backward`` then writes a
table of the vocabulary's size, mostly zeros, that the sum reads back.  Added straight into the
other term (``ops.embedding_grad_add``, in place where that term dies there: the memory plan lets
its out variant write over it), the rows cost what they read, and no table of zeros is written.

It applies to float32/float64 gradients without ``scale_grad_by_freq``, the two terms of one
shape, dtype and layout, the embedding's gradient read by the sum alone; either term of the add
(the first embedding gradient of two is the other's ``y``).  Each row is added to the sum in
index order, as eager adds rows to its zeros: the same total up to rounding (``y`` comes first).
Run before ``MatmulAccumulate``: a head's ``mm`` then takes the rows in place instead of adding a
table of them as it writes.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..graph import VAL, expr, fake_call, fake_mode_of
from ..pipeline import PassResult
from . import ops  # noqa: F401  (fxforge::embedding_grad_add)
from .node_rewrites import replace

aten = torch.ops.aten


def _terms(n: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(the other term, the embedding's gradient) of an ``add`` the rewrite takes, else None."""
    if n.target is not aten.add.Tensor or n.kwargs.get("alpha", 1) != 1 or len(n.args) != 2:
        return None
    for e, y in (n.args[::-1], n.args):
        if not (isinstance(e, fx.Node) and e.target is aten.embedding_dense_backward.default
                and len(e.users) == 1 and isinstance(y, fx.Node) and not e.args[4]):
            continue
        want, ev, yv = n.meta.get(VAL), e.meta.get(VAL), y.meta.get(VAL)
        if not all(isinstance(t, torch.Tensor) for t in (want, ev, yv)):
            continue
        if (want.dtype in (torch.float32, torch.float64) and ev.dtype == yv.dtype == want.dtype
                and [expr(s) for s in yv.shape] == [expr(s) for s in want.shape]
                and [expr(s) for s in yv.stride()] == [expr(s) for s in want.stride()]):
            return y, e
    return None


class AccumulateEmbeddingGrads:
    """Rewrite each ``add`` of an embedding's gradient it takes (module docstring)."""

    name = "accumulate_embedding_grads"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        mode = fake_mode_of(gm)
        done = 0
        for n in list(gm.graph.nodes) if mode is not None else ():
            found = _terms(n) if n.op == "call_function" else None
            if found is None:
                continue
            y, e = found
            grad, indices, _, padding_idx = e.args[:4]
            with gm.graph.inserting_before(n):
                add = fake_call(gm, mode, torch.ops.fxforge.embedding_grad_add.default, (y, grad, indices, padding_idx))
            replace(n, add, add)
            gm.graph.erase_node(e)
            done += 1
        if done:
            gm.recompile()
        return PassResult(gm, done > 0, {"accumulated": done})
