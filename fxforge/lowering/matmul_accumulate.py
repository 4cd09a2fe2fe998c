"""``add(mm(a, b), c)`` -> ``addmm(c, a, b)``: ``MatmulAccumulate``.

The matrix multiply adds ``c`` as it writes its result (BLAS's ``beta = 1``), instead of a pass of
its own reading two tensors of the result's size and writing a third.  Training graphs make such
sums wherever two parts of a gradient meet: a weight read by a matmul and by something else.
(Where the other part is an embedding's gradient, ``embedding_grads.py``, run first, adds its
rows into the ``mm``'s result instead.)

It applies where the ``mm``'s value has no other reader, ``c`` has the result's shape, dtype
(float32 or float64) and strides (no broadcast: a bias broadcast over the rows is already
``addmm`` when traced), and ``add``'s ``alpha`` is 1.  The sum is the same up to rounding: the
multiply may add ``c`` before its last partial products.  Any backend; static and symbolic sizes.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..graph import VAL, expr, fake_call
from .node_rewrites import AddRewrite

aten = torch.ops.aten


class MatmulAccumulate(AddRewrite):
    """Rewrite each ``add(mm(a, b), c)`` it takes into ``addmm(c, a, b)`` (module docstring)."""

    name = "matmul_accumulate"

    def takes(self, term: fx.Node) -> bool:
        return term.target is aten.mm.default

    def fold(self, gm: fx.GraphModule, mode, add: fx.Node, mm: fx.Node, c: fx.Node) -> fx.Node | None:
        addmm = fake_call(gm, mode, aten.addmm.default, (c, *mm.args))
        if [expr(s) for s in addmm.meta[VAL].stride()] != [expr(s) for s in add.meta[VAL].stride()]:
            gm.graph.erase_node(addmm)  # (another layout than the add's: its readers expect that one)
            return None
        return addmm
