"""A group's loop nest and what fits in it: the rules a kernel's members must keep.

A group's kernel runs one loop nest (``Frame``): a pointwise group, one flat loop over its
elements; a group with reductions, rows over the kept dims of the first reduction's input times
the reduced elements of a row.  Each member computes either one value per row
(``Domain.ROW``) or one per element of the rows (``Domain.ELEMENT``), and reads its operands in
its own domain: a row value read per element must be one value per row of the reader's shape
(broadcast along the reduced dims); a value per element is never read per row.

The lowering builds a kernel in this frame (``lowering.py``), and the fusion facts check a
candidate group against the same rules without building one (``facts.py``): whatever one refuses,
the other refuses.  Every rule raises ``Unsupported`` with its reason.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import sympy
import torch
import torch.fx as fx

from ...core.graph import VAL, aliased_input, node_kind
from ...core.iteration import node_numel, node_shape, numel as _numel, reduction_of, same_size as _same
from .values import Domain, Unsupported

aten = torch.ops.aten
# Views that keep a value's elements in order: a member computed in the kernel viewed so has the
# same value per element (``check_view``).
ORDER_KEEPING_VIEWS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default,
    aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
    aten.flatten.using_ints, aten.expand.default,
}


@dataclass
class Frame:
    """A kernel's loop nest.  Pointwise: one flat index ``xindex`` over ``xnumel`` elements.
    Reduction: rows ``xindex`` over the kept dims of ``shape`` (the first reduction's input)
    times ``rindex`` over its reduced dims; ``layouts`` maps
    each reduction input shape to its reduced dims.  ``xnumel``/``rnumel`` are over kernel
    parameters, ``xnumel_g``/``rnumel_g`` over the graph's symbols."""

    reduction: bool
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    xnumel_g: sympy.Expr
    rnumel_g: sympy.Expr
    shape: tuple
    layouts: dict


def trailing(shape: tuple, dims: list[int]) -> bool:
    """The reduced dims are the last ones: row i holds the flat elements [i * rnumel, (i+1) * rnumel)."""
    return list(dims) == list(range(len(shape) - len(dims), len(shape)))


def leading(shape: tuple, dims: list[int]) -> bool:
    """The reduced dims come before every kept dim but those of size 1: row i (a position in the
    kept dims) is the column of elements i, i + xnumel, i + 2 xnumel..."""
    kept = [d for d in range(len(shape)) if d not in dims and shape[d] != 1]
    return not kept or not dims or min(kept) > max(dims)


def internal(members: set[fx.Node], a: fx.Node) -> bool:
    """``a``'s value is computed by the kernel of ``members`` (it is never read from memory): a
    computed member, a member view of one, or an output of a multi-output member."""
    if a in members:
        k = node_kind(a)
        return k == "compute" or (k == "view" and internal(members, aliased_input(a)))
    return a.target is operator.getitem and isinstance(a.args[0], fx.Node) and a.args[0] in members


def root(members: set[fx.Node], a: fx.Node) -> fx.Node:
    """What ``a`` is through the member views of ``members``: the tensor outside the kernel that
    a member view of one reads, or the member that a view of one views (``a`` itself otherwise)."""
    while a in members and node_kind(a) == "view":
        a = aliased_input(a)
    return a


def frame_of(order: list[fx.Node], reductions: list[fx.Node],
             size: Callable[[sympy.Expr], sympy.Expr] = lambda e: e) -> Frame:
    """The loop nest of a group (``order``: its members; ``reductions``: those that reduce);
    ``size`` maps graph sizes to the kernel's (the emitter's parameters; the fusion facts keep
    the graph's)."""
    if not reductions:
        values = [n for n in order if isinstance(n.meta.get(VAL), torch.Tensor)]
        numel = node_numel(values[0])
        if any(not _same(node_numel(n), numel) for n in values):
            raise Unsupported("pointwise group with different element counts")
        return Frame(False, size(numel), sympy.Integer(1), numel, sympy.Integer(1), node_shape(values[0]), {})

    def layout(n):  # input shape, reduced dims (size-1 dims count as kept: one coordinate, 0)
        r = reduction_of(n)
        s = node_shape(r.inp)
        return s, [d for d in r.dims if s[d] != 1]

    shape, dims = layout(reductions[0])
    layouts = {shape: dims}
    xg = _numel([s for d, s in enumerate(shape) if d not in dims])
    rg = _numel([s for d, s in enumerate(shape) if d in dims])
    for n in reductions[1:]:
        s, ds = layout(n)
        same_rows = _same(_numel([x for d, x in enumerate(s) if d in ds]), rg) and _same(_numel(s), xg * rg)
        if layouts.get(s, ds) != ds or not (s in layouts or (same_rows and trailing(s, ds) and trailing(shape, dims))):
            raise Unsupported(f"reductions over different rows: {list(shape)} dims {dims} and {list(s)} dims {ds}")
        layouts[s] = ds
    return Frame(True, size(xg), size(rg), xg, rg, shape, layouts)


def domain(fr: Frame, n: fx.Node, reductions: list[fx.Node]) -> Domain:
    """``Domain.ROW``: one value per row; ``ELEMENT``: one per element of the rows (reduction kernels only)."""
    if not fr.reduction:
        return Domain.ROW
    if n.target is operator.getitem:
        return domain(fr, n.args[0], reductions)
    if n in reductions:
        return Domain.ROW
    numel = node_numel(n)
    if _same(numel, fr.xnumel_g):
        return Domain.ROW
    if _same(numel, fr.xnumel_g * fr.rnumel_g):
        return Domain.ELEMENT
    raise Unsupported(f"{n.name} has {numel} elements; the kernel runs {fr.xnumel_g} rows x {fr.rnumel_g}")


def check_rows(fr: Frame, a: fx.Node, shape: tuple) -> None:
    """A row value ``a`` broadcast into a full value of ``shape`` must give each element its own
    row's value: ``shape`` is a reduction's input and ``a`` has its kept dims, in place."""
    layout = fr.layouts.get(shape)
    if layout is None and trailing(fr.shape, fr.layouts[fr.shape]):
        # rows are runs of rnumel consecutive elements: the dims of ``shape`` after the first
        # k, whose sizes multiply to rnumel, run within a row
        k = next((k for k in range(len(shape) + 1) if _same(_numel(shape[k:]), fr.rnumel_g)), None)
        layout = None if k is None else list(range(k, len(shape)))
    ashape = node_shape(a)
    lead = len(shape) - len(ashape)
    if layout is None or lead < 0 or not all(
            _same(ashape[j - lead] if j >= lead else 1, 1 if j in layout else shape[j]) for j in range(len(shape))):
        raise Unsupported(f"{a.name} {list(ashape)} is not one value per row of {list(shape)}")


def check_operand(fr: Frame, a: fx.Node, have: str, shape: tuple, want: str) -> None:
    """Member ``a`` (a value in domain ``have``) read by a member computing a value of ``shape``
    in domain ``want``."""
    if have == Domain.ROW and want == Domain.ELEMENT:
        check_rows(fr, a, shape)
    elif have != want:
        raise Unsupported(f"{a.name}: a full value read per row")


def check_view(fr: Frame, n: fx.Node, dom: Callable[[fx.Node], Domain]) -> None:
    """A member view ``n`` of a value computed in the kernel: the same elements in the same
    order, or a row value expanded along the reduced dims.  ``dom(n)``: a member's domain."""
    if not isinstance(n.meta[VAL], torch.Tensor):  # a split's pieces are views of a computed value
        raise Unsupported(f"{n.target} (views of several pieces) of a value computed in the kernel")
    base = aliased_input(n)
    if n.target in ORDER_KEEPING_VIEWS and _same(node_numel(n), node_numel(base)):
        return
    if n.target == aten.expand.default and dom(base) == Domain.ROW and dom(n) == Domain.ELEMENT:
        check_rows(fr, base, node_shape(n))
        return
    raise Unsupported(f"{n.target} of a value computed in the kernel")
