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

from ..graph import VAL, expr, fake_call, fake_mode_of
from ..pipeline import PassResult
from .node_rewrites import replace

aten = torch.ops.aten


def _accumulated(n: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(the ``mm``, the other operand) of an ``add`` the rewrite takes, else None."""
    if n.target is not aten.add.Tensor or n.kwargs.get("alpha", 1) != 1 or len(n.args) != 2:
        return None
    for mm, c in (n.args, n.args[::-1]):
        if not (isinstance(mm, fx.Node) and mm.target is aten.mm.default and len(mm.users) == 1
                and isinstance(c, fx.Node)):
            continue
        want, got, have = n.meta.get(VAL), mm.meta.get(VAL), c.meta.get(VAL)
        if not all(isinstance(t, torch.Tensor) for t in (want, got, have)):
            continue
        if (want.dtype in (torch.float32, torch.float64) and got.dtype == have.dtype == want.dtype
                and have.dim() == 2 and [expr(s) for s in have.shape] == [expr(s) for s in want.shape]
                and [expr(s) for s in have.stride()] == [expr(s) for s in want.stride()]):
            return mm, c
    return None


class MatmulAccumulate:
    """Rewrite each ``add(mm(a, b), c)`` it takes into ``addmm(c, a, b)`` (module docstring)."""

    name = "matmul_accumulate"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        mode = fake_mode_of(gm)
        done = 0
        for n in list(gm.graph.nodes) if mode is not None else ():
            if n.op != "call_function":
                continue
            found = _accumulated(n)
            if found is None:
                continue
            mm, c = found
            with gm.graph.inserting_before(n):
                addmm = fake_call(gm, mode, aten.addmm.default, (c, *mm.args))
            if [expr(s) for s in addmm.meta[VAL].stride()] != [expr(s) for s in n.meta[VAL].stride()]:
                gm.graph.erase_node(addmm)  # (another layout than the add's: its readers expect that one)
                continue
            replace(n, addmm, addmm)
            gm.graph.erase_node(mm)
            done += 1
        if done:
            gm.recompile()
        return PassResult(gm, done > 0, {"accumulated": done})
