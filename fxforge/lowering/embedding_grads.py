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
shape, dtype and layout, the embedding's gradient read by the sum alone, as either term (of two
embedding gradients, the first one's rows go into the second).  Each row is added to the sum in
index order, as eager adds rows to its zeros: the same total up to rounding (the other term
comes first).
Run before ``MatmulAccumulate``: a head's ``mm`` then takes the rows in place instead of adding a
table of them as it writes.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..core.graph import fake_call
from . import fxforge_ops as ops  # noqa: F401  (fxforge::embedding_grad_add)
from .node_rewrites import AddRewrite

aten = torch.ops.aten


class AccumulateEmbeddingGrads(AddRewrite):
    """Rewrite each ``add`` of an embedding's gradient it takes (module docstring)."""

    name = "accumulate_embedding_grads"

    def takes(self, term: fx.Node) -> bool:
        return term.target is aten.embedding_dense_backward.default and not term.args[4]  # (scale_grad_by_freq)

    def fold(self, gm: fx.GraphModule, mode, add: fx.Node, e: fx.Node, y: fx.Node) -> fx.Node:
        grad, indices, _, padding_idx = e.args[:4]
        return fake_call(gm, mode, torch.ops.fxforge.embedding_grad_add.default, (y, grad, indices, padding_idx))
