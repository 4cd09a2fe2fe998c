"""What loop nest a node runs: the shared vocabulary of fusion and the kernel emitters.

* *pointwise*: one value per output element (``Tag.pointwise`` ops, dtype conversions, fills);
  its iteration space is its output shape.
* *reduction*: ``reduction_of`` describes it (kind, input, reduced dims, keepdim); its iteration
  space is its input's shape, split into kept dims (rows) and reduced dims.
* anything else is *extern*: it ends fusion groups.

``Iteration`` is a group's loop nest as element counts (what fusion checks); the Triton emitter
builds the full loop nest (shapes, strides, rows) from the same vocabulary.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx as fx

from .graph import VAL, expr, node_kind, per_node

aten = torch.ops.aten

# Ops without the pointwise tag that still compute one output element from the same element of
# each input (or from nothing).
POINTWISE_EXTRA = {aten._to_copy.default, aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
                   aten.where.ScalarOther, aten.where.ScalarSelf,  # (where.self has the tag)
                   torch.ops.prims.copy_strided.default}  # a copy at other strides (lowering/permuted_copies.py)


def is_pointwise(node: fx.Node) -> bool:
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or not isinstance(node.meta.get(VAL), torch.Tensor):
        return False
    return _pointwise_op(op)


@functools.cache
def _pointwise_op(op: torch._ops.OpOverload) -> bool:
    return torch.Tag.pointwise in op.tags or op in POINTWISE_EXTRA


def kind_of(node: fx.Node) -> str:
    """"pointwise", "reduction", "view" (an index remapping of its input) or "extern"."""
    k = node_kind(node)
    if k == "view":
        return "view"
    if k != "compute":
        return "extern"
    if is_pointwise(node):
        return "pointwise"
    if reduction_of(node) is not None:
        return "reduction"
    return "extern"


def shape_of(v: torch.Tensor) -> tuple:
    """``v``'s sizes as sympy expressions."""
    return _sizes(v.shape)


def strides_of(v: torch.Tensor) -> tuple:
    """``v``'s strides as sympy expressions."""
    return _sizes(v.stride())


def _sizes(sizes) -> tuple:
    if all(type(s) is int for s in sizes):  # static: one cached conversion per distinct tuple
        return _static_sizes(tuple(sizes))
    return tuple(expr(s) for s in sizes)


@functools.lru_cache(maxsize=4096)
def _static_sizes(sizes: tuple[int, ...]) -> tuple:
    return tuple(expr(s) for s in sizes)


def numel(shape) -> sympy.Expr:
    """Element count of a shape of sympy sizes."""
    if all(type(s) is int or getattr(s, "is_Integer", False) for s in shape):  # static: no sympy product
        return expr(math.prod(int(s) for s in shape))
    return sympy.Mul(*shape)


@per_node
def node_shape(n: fx.Node) -> tuple:
    """``shape_of`` a tensor node's traced value (kept: ``per_node``)."""
    return shape_of(n.meta[VAL])


@per_node
def node_numel(n: fx.Node) -> sympy.Expr:
    """Element count of a tensor node's traced value (kept: ``per_node``)."""
    return numel(node_shape(n))


def same_size(a, b) -> bool:
    """Two size expressions are equal for every value of their symbols."""
    if a == b:
        return True
    a, b = sympy.sympify(a), sympy.sympify(b)
    if a.is_Number and b.is_Number:
        return False
    return sympy.expand(a - b) == 0


@dataclass
class Reduction:
    kind: str  # sum prod mean amax amin argmax argmin var var_mean max_dim min_dim any all
    inp: fx.Node
    dims: list[int]
    keepdim: bool
    correction: float = 0.0


@per_node
def schema_bind(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by their schema names, defaults filled in (kept: ``per_node``; do not
    change the dict returned)."""
    schema = node.target._schema
    out: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


_REDUCTIONS = {
    "sum.dim_IntList": "sum", "sum.default": "sum", "mean.dim": "mean", "mean.default": "mean",
    "prod.dim_int": "prod", "prod.default": "prod", "amax.default": "amax", "amin.default": "amin",
    "argmax.default": "argmax", "argmin.default": "argmin", "var.correction": "var",
    "var_mean.correction": "var_mean", "max.dim": "max_dim", "min.dim": "min_dim",
    "max.default": "amax", "min.default": "amin", "any.dim": "any", "any.dims": "any", "any.default": "any",
    "all.dim": "all", "all.dims": "all", "all.default": "all",
}


@per_node
def reduction_of(node: fx.Node) -> Reduction | None:
    op = node.target
    if not isinstance(op, torch._ops.OpOverload):
        return None
    name = op.name().split("::", 1)[1]
    name = name if "." in name else name + ".default"
    kind = _REDUCTIONS.get(name)
    if kind is None:
        return None
    b = schema_bind(node)
    inp = b.get("self")
    if not isinstance(inp, fx.Node) or not isinstance(inp.meta.get(VAL), torch.Tensor):
        return None
    ndim = inp.meta[VAL].ndim
    dims = b.get("dim", b.get("dims"))
    if isinstance(dims, int):
        dims = [dims]
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(ndim))
        if kind in ("argmax", "argmin") and b.get("dim") is None:
            dims = list(range(ndim))  # flattened argmax: the flat index
    dims = sorted({d % max(ndim, 1) for d in dims}) if ndim else []
    corr = b.get("correction")
    return Reduction(kind, inp, dims, bool(b.get("keepdim", False)), 1.0 if corr is None else float(corr))


@dataclass
class Iteration:
    """A group's loop nest, as element counts: ``numel`` values per reduction row times
    ``rnumel`` reduced elements per row (1: pointwise only); ``reduces``: the group holds a
    reduction (its rows are then that reduction's).  Shapes may differ where views reshape
    values; a backend that needs more (same shapes, same strides) says so itself."""

    numel: object
    rnumel: object = 1
    reduces: bool = False

    def fits(self, n) -> bool:
        """A pointwise value of ``n`` elements runs in this loop nest: one per element, or one per row."""
        return same_size(n, self.numel * self.rnumel) or (self.rnumel != 1 and same_size(n, self.numel))


def iteration_of(nodes: list[fx.Node]) -> Iteration | str:
    """The loop nest all compute nodes of ``nodes`` share, or why they do not share one."""
    it = None
    for n in nodes:
        r = reduction_of(n) if kind_of(n) == "reduction" else None
        if r is None:
            continue
        shape = shape_of(r.inp.meta[VAL])
        red = [s for d, s in enumerate(shape) if d in r.dims]
        kept = [s for d, s in enumerate(shape) if d not in r.dims]
        mine = Iteration(numel(kept), numel(red), reduces=True)
        if it is not None and not (same_size(it.numel, mine.numel) and same_size(it.rnumel, mine.rnumel)):
            return f"reductions of {it.numel} rows x {it.rnumel} and {mine.numel} rows x {mine.rnumel}"
        it = mine
    for n in nodes:
        if kind_of(n) != "pointwise":
            continue
        count = numel(shape_of(n.meta[VAL]))
        if it is None:
            it = Iteration(count)
        elif not it.fits(count):
            return f"{n.name} has {count} elements; the group iterates {it.numel} x {it.rnumel}"
    return it if it is not None else Iteration(sympy.Integer(1))


def joined_iteration(a: Iteration, b: Iteration) -> Iteration | None:
    """``iteration_of`` the union of two groups, from their own loop nests (None: none shared).
    Within a group every reduction has its rows and every pointwise value fits them; without a
    reduction every pointwise value has ``numel`` elements.  So the union shares a loop nest
    exactly when the nests agree, or one group's pointwise values fit the other's reduction."""
    if a.reduces and b.reduces:
        return a if same_size(a.numel, b.numel) and same_size(a.rnumel, b.rnumel) else None
    if a.reduces or b.reduces:
        red, pw = (a, b) if a.reduces else (b, a)
        return red if red.fits(pw.numel) else None
    return a if same_size(a.numel, b.numel) else None
