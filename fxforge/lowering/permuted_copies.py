"""Copies of permuted values, written as the value's own copy laid out permuted:
``PermutedCopies``.

``clone(transpose(v))`` makes a transposed value contiguous (a mixer's token mixing, attention's
heads): a kernel of its own that reads ``v`` across its rows.  The same bytes come out of a copy
of ``v`` at ``v``'s own shape whose strides are those of the result, permuted back
(``prims.copy_strided``), viewed through the same permutation:

    c = clone(transpose(v, 1, 2))                 # (8, 64, 16), strides (1024, 16, 1)

becomes

    b = copy_strided(v, (1024, 1, 16))            # (8, 16, 64): v's shape
    c = transpose(b, 1, 2)                        # (8, 64, 16), strides (1024, 16, 1)

``b`` is elementwise in ``v``'s shape, so the fusion pass can put it in the kernel computing ``v``
(which then stores each element twice: once in ``v``'s layout, once in the permuted one) instead
of a kernel reading ``v`` back.  Rewritten: a ``clone`` of one
``permute``/``transpose``/``t`` of a value a kernel computes, whatever memory format it asks
(the result keeps its strides), unless the graph returns it (``NodeRewrite``); static sizes.  Runs with the
lowering passes, for backends that fuse.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..core.graph import VAL, fake_call, node_kind
from .node_rewrites import NodeRewrite, replace

aten = torch.ops.aten
prims = torch.ops.prims


class PermutedCopies(NodeRewrite):
    name, target, stat = "permuted_copies", aten.clone.default, "permuted_copies"

    def rewrite(self, gm: fx.GraphModule, mode, n: fx.Node) -> bool:
        return _rewrite(gm, mode, n)


def permutation(x: fx.Node) -> list[int] | None:
    """The dims order of a ``permute``/``transpose``/``t`` view node: ``x.shape[i] = v.shape[p[i]]``."""
    if x.op != "call_function":
        return None
    v = x.args[0]
    rank = v.meta[VAL].dim() if isinstance(v, fx.Node) and isinstance(v.meta.get(VAL), torch.Tensor) else None
    if rank is None:
        return None
    if x.target is aten.permute.default:
        return [d % rank for d in x.args[1]]
    if x.target in (aten.transpose.int, aten.t.default):
        a, b = (x.args[1] % rank, x.args[2] % rank) if x.target is aten.transpose.int else (0, 1 % max(rank, 1))
        p = list(range(rank))
        p[a], p[b] = p[b], p[a]
        return p
    return None


def _rewrite(gm: fx.GraphModule, mode, n: fx.Node) -> bool:
    if len(n.args) != 1:  # (a memory format only decides the result's strides, which are kept)
        return False
    x = n.args[0]
    if not isinstance(x, fx.Node) or node_kind(x) != "view":
        return False
    p = permutation(x)
    v = x.args[0] if p is not None else None
    if v is None or node_kind(v) != "compute" or p == sorted(p):
        return False
    out, vv = n.meta.get(VAL), v.meta.get(VAL)
    if not (isinstance(out, torch.Tensor) and isinstance(vv, torch.Tensor)) or out.dtype != vv.dtype:
        return False
    if not all(type(s) is int for s in (*out.shape, *out.stride(), *vv.shape)):
        return False
    stride = [0] * len(p)  # the copy's: permuted by p, they are the result's
    for i, d in enumerate(p):
        stride[d] = out.stride()[i]
    with gm.graph.inserting_before(n):
        copy = fake_call(gm, mode, prims.copy_strided.default, (v, stride))
        view = fake_call(gm, mode, aten.permute.default, (copy, p))
    replace(n, view, copy)
    return True
