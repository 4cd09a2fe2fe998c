"""``add(mm(a, b), c)`` -> ``addmm(c, a, b)``: ``MatmulAccumulate``.

The matrix multiply adds ``c`` as it writes its result (BLAS's ``beta = 1``), instead of a pass of
its own reading two tensors of the result's size and writing a third.  Training graphs make such
sums wherever two parts of a gradient meet: a weight read by a matmul and by something else.
(Where the other part is an embedding's gradient, ``embedding_grads.py``, run first, adds its
rows into the ``mm``'s result instead.)  A model adding a bias of its own after a linear layer
without one (a language model's head plus a bias over the vocabulary) makes the other form:
``add(reshape(mm(a, b)), bias)``, the bias broadcast over the rows; that becomes
``reshape(addmm(bias, a, b))``, and the product's own buffer, of the logits' size, goes.

It applies where the ``mm``'s value (and its reshape's) has no other reader, ``add``'s ``alpha``
is 1, the dtypes are one (float32 or float64), and ``c`` either has the sum's shape and strides
(the ``mm``'s own, no reshape) or is a bias: every dim 1 but the last, which is the columns'
(a bias broadcast over the rows of a 2-D input is already ``addmm`` when traced).  The reshape
keeps the columns as its last dim.  The sum is the same up to rounding: the multiply may add
``c`` before its last partial products.  Any backend; static and symbolic sizes.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..core.graph import VAL, expr, fake_call
from .node_rewrites import AddRewrite, add_terms

aten = torch.ops.aten

# Reshapes of a product its bias may be added under (the traced form of a linear layer over a
# 3-D input: ``_unsafe_view(mm(view(x), w.t()))``).
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_DTYPES = (torch.float32, torch.float64)


class MatmulAccumulate(AddRewrite):
    """Rewrite each ``add(mm(a, b), c)`` it takes into ``addmm(c, a, b)``, and each
    ``add(reshape(mm(a, b)), bias)`` into ``reshape(addmm(bias, a, b))`` (module docstring)."""

    name = "matmul_accumulate"

    def takes(self, term: fx.Node) -> bool:
        return term.target is aten.mm.default

    def terms(self, add: fx.Node) -> tuple[fx.Node, fx.Node] | None:
        return add_terms(add, self.takes) or bias_terms(add)

    def fold(self, gm: fx.GraphModule, mode, add: fx.Node, term: fx.Node, c: fx.Node) -> fx.Node | None:
        mm = term if term.target is aten.mm.default else term.args[0]
        if c.meta[VAL].dim() != 1 and _shape(c) != _shape(mm):
            c = fake_call(gm, mode, aten.view.default, (c, [-1]))  # (a bias: every dim but the last is 1)
        addmm = fake_call(gm, mode, aten.addmm.default, (c, *mm.args))
        new = addmm if term is mm else fake_call(gm, mode, term.target, (addmm, *term.args[1:]))
        if [expr(s) for s in new.meta[VAL].stride()] != [expr(s) for s in add.meta[VAL].stride()]:
            for x in dict.fromkeys((new, addmm, c)):  # (another layout than the add's: its readers expect that one)
                if not x.users and x.op == "call_function":
                    gm.graph.erase_node(x)
            return None
        return new


def _shape(n: fx.Node) -> list:
    return [expr(s) for s in n.meta[VAL].shape]


def bias_terms(add: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """``(term, bias)`` of ``add(term, bias)`` (either order, ``alpha`` 1): ``term`` an ``mm``, or
    a reshape of one keeping its columns last, read by the add alone (the ``mm`` by the reshape
    alone), and ``bias`` of size 1 in every dim but the last, broadcast over the rows to
    the sum's shape, all of one dtype (float32 or float64); else None."""
    if add.kwargs.get("alpha", 1) != 1 or len(add.args) != 2 or not all(isinstance(a, fx.Node) for a in add.args):
        return None
    for term, bias in (add.args, add.args[::-1]):
        if term is bias or len(term.users) != 1:
            continue
        mm = term.args[0] if term.target in _RESHAPES and isinstance(term.args[0], fx.Node) else term
        if mm.target is not aten.mm.default or len(mm.users) != 1:
            continue
        want, got, prod, b = (x.meta.get(VAL) for x in (add, term, mm, bias))
        if not all(isinstance(t, torch.Tensor) for t in (want, got, prod, b)) or b.dim() == 0:
            continue
        shape, cols, bshape = _shape(term), _shape(mm)[-1], _shape(bias)
        if (want.dtype in _DTYPES and prod.dtype == b.dtype == want.dtype
                and shape == _shape(add) and shape[-1] == cols and len(bshape) <= len(shape)
                and all(s == 1 for s in bshape[:-1]) and bshape[-1] in (1, cols)):
            return term, bias
    return None
