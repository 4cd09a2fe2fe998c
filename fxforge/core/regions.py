"""Where the inputs of a cat or a pad land in its result: regions, and a pad's border.

A *container* is an ``aten.cat`` or ``aten.constant_pad_nd`` node: its result holds each of its
inputs in a region (a box: a start per dim, the input's shape), and a pad also a border of
constant value around its input.  Shared by the zero-copy pass (passes/padcat.py), the wrapper
that moves what is left, and the byte count of data movement (copies.py).
"""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from .graph import VAL, expr

aten = torch.ops.aten
CAT, PAD = aten.cat.default, aten.constant_pad_nd.default


def is_container(n: fx.Node) -> bool:
    return n.op == "call_function" and n.target in (CAT, PAD)


def container_inputs(n: fx.Node) -> list:
    """The tensor arguments a container places into its result, in order."""
    return list(n.args[0]) if n.target is CAT else [n.args[0]]


def size_expr(v) -> sympy.Expr:
    """A size argument (an int, a SymInt, or a node computing one) as an expression."""
    if isinstance(v, fx.Node):
        v = v.meta.get(VAL)
    return expr(v)


def regions(n: fx.Node) -> list[tuple[sympy.Expr, ...]]:
    """Where each input of container ``n`` starts in its result (per dim).  (A legacy empty 1-D
    input of a cat of higher rank takes no room.)"""
    out = n.meta[VAL]
    rank = out.dim()
    if n.target is CAT:
        dim = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % rank
        at, starts = sympy.Integer(0), []
        for a in n.args[0]:
            starts.append(tuple(at if d == dim else sympy.Integer(0) for d in range(rank)))
            at = at + expr(a.meta[VAL].shape[dim]) if a.meta[VAL].dim() == rank else at
        return starts
    pads = list(n.args[1])
    lefts = [size_expr(p) for p in pads[0::2]]  # last dim first
    start = [sympy.Integer(0)] * rank
    for i, left in enumerate(lefts):
        start[rank - 1 - i] = left
    return [tuple(start)]


def pad_border(n: fx.Node) -> list[tuple[tuple[sympy.Expr, ...], tuple[sympy.Expr, ...]]]:
    """The border of pad ``n`` as (start, size) boxes covering it once: for each padded dim, the
    slabs before and after the interior, with the dims already handled restricted to the interior."""
    out = n.meta[VAL]
    inner = n.args[0].meta[VAL]
    rank = out.dim()
    (start,) = regions(n)
    full = [expr(s) for s in out.shape]
    size = [expr(s) for s in inner.shape]
    box_start, box_size = [sympy.Integer(0)] * rank, list(full)
    boxes = []
    for d in range(rank):
        before, after = start[d], full[d] - start[d] - size[d]
        for s, w in ((sympy.Integer(0), before), (start[d] + size[d], after)):
            if w != 0:
                boxes.append((tuple(box_start[:d]) + (s,) + tuple(box_start[d + 1:]),
                              tuple(box_size[:d]) + (w,) + tuple(box_size[d + 1:])))
        box_start[d], box_size[d] = start[d], size[d]
    return boxes
