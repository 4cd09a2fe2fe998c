"""What ATen's pointwise operators and reductions compute, in the kernel values' vocabulary.

Written once for every kernel language: each printer renders the values (``values.py``) these
build, or refuses an operation its language lacks.  Operands reach a semantics function already
converted to the op's computation dtype (eager's type promotion; fp16/bf16 compute in fp32),
Python scalars as constants of that dtype (those of comparisons first rounded to the common
dtype, as eager compares: pytorch#173987).  ``lower`` applies an ATen node's semantics to its
operands; ``REDUCTIONS`` says how each reduction kind folds a row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import sympy
import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K, elementwise_dtypes

from ...core.graph import VAL, per_node
from ...core.iteration import schema_bind
from . import values as v
from .values import LOW_PRECISION, Const, Unsupported, Value, compute_dtype, const

# Operands (by schema name) that select, read as bool and left out of type promotion.
CONDITIONS = ("condition", "mask")


@dataclass(frozen=True)
class Semantics:
    # argument names (from the schema) that are operands, in order
    operands: tuple[str, ...]
    fn: Callable[..., Value] | None  # fn(*operands, kwargs) -> Value
    promotion: Any = K.DEFAULT  # None: a conversion (the operand, converted to the node's dtype)
    # operand dtypes the op is defined on here: "float", "int" (ints and bool), "any"
    dtypes: str = "any"
    # comparisons: Python scalar operands are rounded to the common dtype first
    round_scalars: bool = False


OPS: dict[str, Semantics] = {}


def _reg(names: str, semantics: Semantics) -> None:
    for n in names.split():
        OPS[n] = semantics


def _one(x: Value) -> Const:
    return const(1, x.dtype)


def _alpha(b: Value, alpha: Any) -> Value:
    return b if alpha is None or alpha == 1 else v.mul(b, const(alpha, b.dtype))


def _add(a: Value, b: Value, kw) -> Value:
    if a.dtype == torch.bool:  # bool + bool is `or` in eager
        return v.bit_or(a, b)
    return v.add(a, _alpha(b, kw.get("alpha")))


def _mul(a: Value, b: Value, kw) -> Value:
    return v.bit_and(a, b) if a.dtype == torch.bool else v.mul(a, b)


def _div_mode(a: Value, b: Value, mode: str | None) -> Value:
    if mode is None:
        return v.truediv(a, b)
    if a.dtype.is_floating_point:
        return v.unary("trunc", v.truediv(a, b)) if mode == "trunc" else v.floordiv(a, b)
    return v.truncdiv(a, b) if mode == "trunc" else v.floordiv(a, b)


def pow_scalar(x: Value, e: Any) -> Value:
    """``x ** e`` for a Python scalar exponent, as eager's kernel special-cases it."""
    e = float(e)
    if e == 2.0:
        return v.mul(x, x)
    if e == 1.0:
        return x
    if not x.dtype.is_floating_point:
        raise Unsupported(f"pow with exponent {e!r} on {x.dtype}")
    if e == 0.5:
        return v.sqrt(x)
    if e == -1.0:
        return v.truediv(_one(x), x)
    if e == 3.0:
        return v.mul(v.mul(x, x), x)
    return v.pow_(x, const(e, x.dtype))


def _clamp(a: Value, lo: Value | None, hi: Value | None) -> Value:
    x = a
    for b, cmp in ((lo, "lt"), (hi, "gt")):
        if b is None:
            continue
        x = v.where(v.compare(cmp, x, b), b, x)
        if a.dtype.is_floating_point:  # a NaN bound gives NaN, as eager (a NaN input stays NaN)
            x = v.where(v.isnan(b), b, x)
    return x


def _sign(a: Value) -> Value:
    if a.dtype == torch.bool:
        return a
    zero = a if a.dtype.is_floating_point else const(0, a.dtype)  # keeps -0.0 and NaN
    return v.where(v.compare("gt", a, const(0, a.dtype)), _one(a),
                   v.where(v.compare("lt", a, const(0, a.dtype)), const(-1, a.dtype), zero))


def _gelu_tanh_inner(x: Value) -> Value:
    """``tanh(sqrt(2/pi) * (x + 0.044715 x**3))``."""
    c = const(0.044715, x.dtype)
    return v.unary("tanh", v.mul(const(0.7978845608028654, x.dtype), v.add(x, v.mul(v.mul(v.mul(c, x), x), x))))


def _gelu(x: Value, approximate: str) -> Value:
    half = v.mul(const(0.5, x.dtype), x)
    if approximate == "tanh":
        return v.mul(half, v.add(_one(x), _gelu_tanh_inner(x)))
    return v.mul(half, v.add(_one(x), v.erf(v.mul(x, const(0.7071067811865476, x.dtype)))))


def _gelu_backward(g: Value, x: Value, approximate: str) -> Value:
    """As eager's CPU kernel: ``g * (cdf + x * pdf)`` (exact); for ``tanh``, the derivative of
    ``0.5 x (1 + tanh(inner))`` written out as eager does."""
    if approximate == "tanh":
        t = _gelu_tanh_inner(x)
        half = const(0.5, x.dtype)
        dtanh = v.sub(_one(x), v.mul(t, t))
        dinner = v.mul(const(0.7978845608028654, x.dtype), v.add(_one(x), v.mul(v.mul(const(0.134145, x.dtype), x), x)))
        return v.mul(g, v.add(v.mul(half, v.add(_one(x), t)), v.mul(v.mul(v.mul(half, x), dtanh), dinner)))
    return v.mul(g, v.composite("gelu_grad", x))


def _sigmoid(x: Value) -> Value:
    return v.composite("sigmoid", x)


def _silu(x: Value) -> Value:
    return v.truediv(x, v.add(_one(x), v.exp(v.neg(x))))


def _elu(a: Value, kw) -> Value:
    alpha, scale, iscale = (float(kw.get(k, 1.0)) for k in ("alpha", "scale", "input_scale"))
    neg = v.mul(v.unary("expm1", v.mul(a, const(iscale, a.dtype))), const(alpha * scale, a.dtype))
    return v.where(v.compare("gt", a, const(0, a.dtype)), v.mul(a, const(scale, a.dtype)), neg)


def _fmax_fmin(a: Value, b: Value, cmp: str) -> Value:
    """The other operand where one is NaN (NaN only where both are)."""
    return v.where(v.isnan(b), a, v.where(v.isnan(a), b, v.where(v.compare(cmp, a, b), a, b)))


_reg("add.Tensor add.Scalar", Semantics(("self", "other"), _add))
_reg("sub.Tensor sub.Scalar", Semantics(("self", "other"), lambda a, b, kw: v.sub(a, _alpha(b, kw.get("alpha")))))
_reg("rsub.Tensor rsub.Scalar", Semantics(("self", "other"), lambda a, b, kw: v.sub(b, _alpha(a, kw.get("alpha")))))
_reg("mul.Tensor mul.Scalar", Semantics(("self", "other"), _mul))
_reg("div.Tensor div.Scalar", Semantics(("self", "other"), lambda a, b, kw: v.truediv(a, b), K.INT_TO_FLOAT))
_reg("div.Tensor_mode div.Scalar_mode", Semantics(("self", "other"), lambda a, b, kw: _div_mode(a, b, kw.get("rounding_mode"))))
_reg("floor_divide.default floor_divide.Scalar", Semantics(("self", "other"), lambda a, b, kw: _div_mode(a, b, "floor")))
_reg("remainder.Tensor remainder.Scalar", Semantics(("self", "other"), lambda a, b, kw: v.mod(a, b)))
_reg("fmod.Tensor fmod.Scalar", Semantics(("self", "other"), lambda a, b, kw: v.fmod(a, b)))
_reg("maximum.default", Semantics(("self", "other"), lambda a, b, kw: v.max_nan(a, b)))
_reg("minimum.default", Semantics(("self", "other"), lambda a, b, kw: v.min_nan(a, b)))
_reg("fmax.default", Semantics(("self", "other"), lambda a, b, kw: _fmax_fmin(a, b, "gt"), dtypes="float"))
_reg("fmin.default", Semantics(("self", "other"), lambda a, b, kw: _fmax_fmin(a, b, "lt"), dtypes="float"))
_reg("pow.Tensor_Scalar", Semantics(("self", "exponent"), None))  # ``lower`` calls pow_scalar
_reg("pow.Tensor_Tensor", Semantics(("self", "exponent"), lambda a, b, kw: v.pow_(a, b), dtypes="float"))
_reg("atan2.default", Semantics(("self", "other"), lambda a, b, kw: v.atan2(a, b), K.INT_TO_FLOAT))

for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _reg(f"{_name}.Tensor {_name}.Scalar", Semantics(
        ("self", "other"), (lambda c: lambda a, b, kw: v.compare(c, a, b))(_name), K.ALWAYS_BOOL, round_scalars=True))


def _truth(x: Value) -> Value:
    return x if x.dtype == torch.bool else v.compare("ne", x, const(0, x.dtype))


_reg("logical_and.default", Semantics(("self", "other"), lambda a, b, kw: v.bit_and(_truth(a), _truth(b)), K.ALWAYS_BOOL))
_reg("logical_or.default", Semantics(("self", "other"), lambda a, b, kw: v.bit_or(_truth(a), _truth(b)), K.ALWAYS_BOOL))
_reg("logical_xor.default", Semantics(("self", "other"), lambda a, b, kw: v.bit_xor(_truth(a), _truth(b)), K.ALWAYS_BOOL))
_reg("logical_not.default", Semantics(("self",), lambda a, kw: v.logical_not(_truth(a)), K.ALWAYS_BOOL))
_reg("bitwise_and.Tensor bitwise_and.Scalar", Semantics(("self", "other"), lambda a, b, kw: v.bit_and(a, b), dtypes="int"))
_reg("bitwise_or.Tensor bitwise_or.Scalar", Semantics(("self", "other"), lambda a, b, kw: v.bit_or(a, b), dtypes="int"))
_reg("bitwise_xor.Tensor bitwise_xor.Scalar", Semantics(("self", "other"), lambda a, b, kw: v.bit_xor(a, b), dtypes="int"))
_reg("bitwise_not.default", Semantics(("self",), lambda a, kw: v.logical_not(a) if a.dtype == torch.bool
                                      else v.unary("invert", a), dtypes="int"))

_reg("where.self where.ScalarOther where.ScalarSelf",
     Semantics(("condition", "self", "other"), lambda c, a, b, kw: v.where(c, a, b)))
# float only: an int tensor filled with a float value would be computed in float (eager casts the value)
_reg("masked_fill.Scalar masked_fill.Tensor", Semantics(("self", "mask", "value"), lambda a, m, x, kw: v.where(m, x, a),
                                                        dtypes="float"))
_reg("clamp.default clamp.Tensor", Semantics(("self", "min", "max"), lambda a, lo, hi, kw: _clamp(a, lo, hi)))
_reg("clamp_min.default clamp_min.Tensor", Semantics(("self", "min"), lambda a, lo, kw: _clamp(a, lo, None)))
_reg("clamp_max.default clamp_max.Tensor", Semantics(("self", "max"), lambda a, hi, kw: _clamp(a, None, hi)))
_reg("hardtanh.default", Semantics(("self",), lambda a, kw: _clamp(a, const(kw.get("min_val", -1.0), a.dtype),
                                                                  const(kw.get("max_val", 1.0), a.dtype))))

_FLOAT_UNARY: dict[str, Callable[[Value], Value]] = {
    name: (lambda n: lambda a: v.unary(n, a))(name)
    for name in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
                 "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "sqrt")}
_FLOAT_UNARY.update({
    "sigmoid": _sigmoid,
    "reciprocal": lambda a: v.truediv(_one(a), a),
    "rsqrt": lambda a: v.truediv(_one(a), v.sqrt(a)),
})
for _name, _f in _FLOAT_UNARY.items():
    _reg(f"{_name}.default", Semantics(("self",), (lambda f: lambda a, kw: f(a))(_f), K.INT_TO_FLOAT, dtypes="float"))
# rounding ops keep integer inputs unchanged
for _name, _prim in {"floor": "floor", "ceil": "ceil", "trunc": "trunc", "round": "nearbyint"}.items():
    _reg(f"{_name}.default", Semantics(("self",), (lambda p: lambda a, kw: v.unary(p, a) if a.dtype.is_floating_point
                                                    else a)(_prim)))

_reg("neg.default", Semantics(("self",), lambda a, kw: v.neg(a)))
_reg("abs.default", Semantics(("self",), lambda a, kw: a if a.dtype == torch.bool else v.unary("abs", a)))
_reg("relu.default", Semantics(("self",), lambda a, kw: v.where(v.compare("lt", a, const(0, a.dtype)), const(0, a.dtype), a)))
_reg("sign.default", Semantics(("self",), lambda a, kw: _sign(a)))
_reg("gelu.default", Semantics(("self",), lambda a, kw: _gelu(a, kw.get("approximate", "none")), dtypes="float"))
_reg("silu.default", Semantics(("self",), lambda a, kw: _silu(a), dtypes="float"))
_reg("elu.default", Semantics(("self",), _elu, dtypes="float"))
_reg("leaky_relu.default", Semantics(("self",), lambda a, kw: v.where(
    v.compare("gt", a, const(0, a.dtype)), a, v.mul(a, const(kw.get("negative_slope", 0.01), a.dtype))), dtypes="float"))
_reg("isnan.default", Semantics(("self",), lambda a, kw: v.isnan(a), K.ALWAYS_BOOL))
_reg("isinf.default", Semantics(("self",), lambda a, kw: v.compare("eq", v.unary("abs", a), const(float("inf"), a.dtype)),
                                K.ALWAYS_BOOL, dtypes="float"))
# the pointwise backward kernels autograd's graphs keep (when not decomposed), as eager's CPU kernels
_reg("gelu_backward.default", Semantics(("grad_output", "self"), lambda g, a, kw: _gelu_backward(
    g, a, kw.get("approximate", "none")), dtypes="float"))
_reg("threshold_backward.default", Semantics(("grad_output", "self", "threshold"), lambda g, a, t, kw: v.where(
    v.compare("le", a, t), const(0, g.dtype), g)))
_reg("hardtanh_backward.default", Semantics(("grad_output", "self", "min_val", "max_val"), lambda g, a, lo, hi, kw: v.where(
    v.compare("le", a, lo), const(0, g.dtype), v.where(v.compare("ge", a, hi), const(0, g.dtype), g)), dtypes="float"))
_reg("sigmoid_backward.default", Semantics(("grad_output", "output"), lambda g, y, kw: v.mul(
    v.mul(g, v.sub(_one(y), y)), y), dtypes="float"))
_reg("tanh_backward.default", Semantics(("grad_output", "output"), lambda g, y, kw: v.mul(
    g, v.sub(_one(y), v.mul(y, y))), dtypes="float"))
_reg("silu_backward.default", Semantics(("grad_output", "self"), lambda g, a, kw: v.mul(
    v.mul(g, _sigmoid(a)), v.add(_one(a), v.mul(a, v.sub(_one(a), _sigmoid(a))))), dtypes="float"))
# conversions and copies: the single operand, converted to the node's dtype by the caller (where it
# is computed, so the members reading it see the converted value, not only the store)
_reg("_to_copy.default clone.default alias_copy.default", Semantics(("self",), None, None))
_reg("copy_strided.default", Semantics(("a",), None, None))  # prims: stored at the planned strides
_reg("convert_element_type.default", Semantics(("a",), None, None))  # prims' schema names it ``a``


def op_key(op: torch._ops.OpOverload) -> str:
    """``name.overload`` of an ATen operator (``.default`` where it has none)."""
    name = op.name().split("::", 1)[1]
    return name if "." in name else name + ".default"


_FILLS = ("full.default", "full_like.default", "scalar_tensor.default", "fill.Scalar", "zeros_like.default",
          "ones_like.default")


def _fill_value(key: str, b: dict) -> Any:
    """The value a fill op (``_FILLS``) writes: a constant or a runtime scalar's node."""
    return {"zeros_like.default": 0, "ones_like.default": 1}.get(key, b.get("fill_value", b.get("value", b.get("s"))))


@per_node
def read_nodes(n: fx.Node) -> list[fx.Node] | None:
    """The nodes ``lower`` reads for ``n`` (its operands, and a fill's runtime value), or None
    where ``n`` has no semantics here (kept: ``per_node``; do not change the list returned)."""
    if not isinstance(n.target, torch._ops.OpOverload):
        return None
    key = op_key(n.target)
    b = schema_bind(n)
    if key in _FILLS:
        value = _fill_value(key, b)
        return [value] if isinstance(value, fx.Node) else []
    sem = OPS.get(key)
    if sem is None:
        return None
    return [a for a in (b.get(name) for name in sem.operands) if isinstance(a, fx.Node)]


def promoted_dtypes(args: list, kind) -> tuple[torch.dtype, torch.dtype]:
    """``elementwise_dtypes(*args, type_promotion_kind=kind)`` (computation and result dtypes),
    worked out once per signature: what eager's promotion reads of the arguments is each tensor's
    dtype and whether it has no dimension, each Python number's type, and the default dtype."""
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((a.dtype, a.ndim == 0))
        elif type(a) in (bool, int, float, complex):
            sig.append(type(a))
        else:  # (a symbolic number: asked as it is)
            return elementwise_dtypes(*args, type_promotion_kind=kind)
    return _promoted(tuple(sig), kind, torch.get_default_dtype())


@functools.cache
def _promoted(sig: tuple, kind, default: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    # (``default``, the default dtype, is part of the key: what an integer promoted to float becomes)
    args = [torch.empty(() if s[1] else (1,), dtype=s[0], device="meta") if isinstance(s, tuple) else s(1) for s in sig]
    return elementwise_dtypes(*args, type_promotion_kind=kind)


def lower(n: fx.Node, operand: Callable[[fx.Node], Value], scalar: Callable[[fx.Node], Value]) -> Value:
    """The value of pointwise node ``n`` in its computation dtype (the caller converts it to the
    node's dtype): ``operand(a)`` gives a tensor argument's value per element, ``scalar(a)`` a
    runtime scalar argument's."""
    b = schema_bind(n)
    key = op_key(n.target)
    if key in _FILLS:
        value = _fill_value(key, b)
        cdt = compute_dtype(n.meta[VAL].dtype)
        if isinstance(value, fx.Node):
            return v.cast(scalar(value), cdt)
        if not isinstance(value, (bool, int, float)):
            raise Unsupported(f"fill value {value!r}")
        return const(value, cdt)
    sem = OPS.get(key)
    if sem is None:
        raise Unsupported(f"no lowering for {n.target}")
    raw = [b.get(a) for a in sem.operands]
    if sem.promotion is None:  # conversions: one operand, converted by the caller (to the node dtype)
        return operand(raw[0])
    fake_args = [a.meta[VAL] if isinstance(a, fx.Node) else a
                 for name, a in zip(sem.operands, raw) if name not in CONDITIONS and a is not None]
    cdt, rdt = promoted_dtypes(fake_args, sem.promotion)
    if sem.promotion == K.ALWAYS_BOOL:  # comparisons compute in the common dtype (bool results)
        _, common = promoted_dtypes(fake_args, K.DEFAULT)
        cdt, rdt = compute_dtype(common), common
    cdt = compute_dtype(cdt)
    opname = key.split(".")[0]
    if sem.dtypes == "float" and not cdt.is_floating_point:
        raise Unsupported(f"{opname} on {cdt}")
    if sem.dtypes == "int" and cdt.is_floating_point:
        raise Unsupported(f"{opname} on {cdt}")
    if sem.fn is None:  # pow with a scalar exponent
        if isinstance(raw[1], fx.Node):
            raise Unsupported("pow with a runtime exponent")
        return pow_scalar(v.cast(operand(raw[0]), cdt), raw[1])
    ops: list[Value | None] = []
    for name, a in zip(sem.operands, raw):
        if a is None:
            ops.append(None)
        elif name in CONDITIONS:
            ops.append(v.cast(operand(a), torch.bool) if isinstance(a, fx.Node) else const(a, torch.bool))
        elif isinstance(a, fx.Node):
            ops.append(v.cast(operand(a), cdt))
        else:
            if sem.round_scalars and rdt in LOW_PRECISION:
                a = v.round_to(a, rdt)
            ops.append(const(a, cdt))
    kw = {k: x for k, x in b.items() if k not in sem.operands}
    if any(isinstance(x, fx.Node) for x in kw.values()):
        raise Unsupported("a runtime value in a non-operand argument")
    return sem.fn(*ops, kw)


# --------------------------------------------------------------------------- reductions
#
# How a reduction kind folds a row.  ``strategy``: "combine" folds with ``combine`` (one
# accumulator), "arg" folds (value, index) pairs (ties to the first index, NaN largest),
# "moments" takes two passes (the mean, then the sum of squared deviations).  ``results`` name
# what the reduction returns, in order: "acc" the accumulator, "mean" acc / row length,
# "nonzero" acc != 0, "value"/"index" an arg fold's pair, "var"/"avg" the moments' variance
# (with the correction) and mean.


@dataclass(frozen=True)
class Reduction:
    strategy: str
    identity: str  # "0", "1", "lowest" or "highest" (of the accumulator dtype)
    combine: str  # the vocabulary's op ("add", "mul", "max_nan", "min_nan"), or "argmax"/"argmin"
    accumulate: str  # the accumulator dtype: "sum" (wide), "moments", "flag" (int32) or "input"
    results: tuple[str, ...]


REDUCTIONS = {
    "sum": Reduction("combine", "0", "add", "sum", ("acc",)),
    "mean": Reduction("combine", "0", "add", "sum", ("mean",)),
    "prod": Reduction("combine", "1", "mul", "sum", ("acc",)),
    "amax": Reduction("combine", "lowest", "max_nan", "input", ("acc",)),
    "amin": Reduction("combine", "highest", "min_nan", "input", ("acc",)),
    "any": Reduction("combine", "0", "max_nan", "flag", ("nonzero",)),
    "all": Reduction("combine", "1", "min_nan", "flag", ("nonzero",)),
    "argmax": Reduction("arg", "lowest", "argmax", "input", ("index",)),
    "argmin": Reduction("arg", "highest", "argmin", "input", ("index",)),
    "max_dim": Reduction("arg", "lowest", "argmax", "input", ("value", "index")),
    "min_dim": Reduction("arg", "highest", "argmin", "input", ("value", "index")),
    "var": Reduction("moments", "0", "add", "moments", ("var",)),
    "var_mean": Reduction("moments", "0", "add", "moments", ("var", "avg")),
}


def accumulator_dtype(r: Reduction, in_dt: torch.dtype, out_dt: torch.dtype) -> torch.dtype:
    """The dtype a row is accumulated in: sums and products in fp32/fp64/int64 (eager's
    accumulate types), moments in fp32 (fp64 input: fp64), any/all as int32 flags, min/max and
    arg folds in the input's compute dtype (bool as int32)."""
    if r.accumulate == "sum":
        return torch.float64 if out_dt == torch.float64 else (torch.float32 if out_dt.is_floating_point else torch.int64)
    if r.accumulate == "moments":
        return torch.float64 if in_dt == torch.float64 else torch.float32
    if r.accumulate == "flag":
        return torch.int32
    acc = compute_dtype(in_dt)
    return torch.int32 if acc == torch.bool else acc


def identity(r: Reduction, acc: torch.dtype) -> Const:
    """The fold's identity as a constant of ``acc``."""
    if r.identity in ("0", "1"):
        return const(int(r.identity), acc)
    if acc.is_floating_point:
        return const(float("-inf") if r.identity == "lowest" else float("inf"), acc)
    ii = torch.iinfo(acc)
    return const(ii.min if r.identity == "lowest" else ii.max, acc)


def combine(r: Reduction, acc: Value, x: Value) -> Value:
    """``acc`` folded with element ``x`` (a "combine" reduction)."""
    return v.op(r.combine, acc, x)


def element(r: Reduction, x: Value, acc_dt: torch.dtype) -> Value:
    """A row element as the fold's accumulator reads it (any/all: a flag)."""
    if r.accumulate == "flag":
        return v.cast(v.compare("ne", x, const(0, x.dtype)), torch.int32)
    return v.cast(x, acc_dt)


def count(n: Any, dt: torch.dtype) -> Value:
    """A row length (an index expression) as a value of float dtype ``dt``."""
    n = sympy.sympify(n)
    return const(float(n), dt) if n.is_Integer else v.cast(v.Index(n), dt)


def result(kind: str, accs: dict[str, Value], rnumel: Any, correction: float) -> Value:
    """One result of a fold (``Reduction.results``) from its accumulators."""
    if kind in ("acc", "value", "index"):
        return accs["acc" if kind == "acc" else kind]
    if kind == "mean":
        acc = accs["acc"]
        return v.truediv(acc, count(rnumel, acc.dtype))
    if kind == "nonzero":
        return v.compare("ne", accs["acc"], const(0, accs["acc"].dtype))
    if kind == "avg":
        return accs["mean"]
    m2 = accs["m2"]  # "var"
    rn = sympy.sympify(rnumel)
    if rn.is_Integer:
        denom = const(float(max(int(rn) - correction, 0.0)), m2.dtype)
    else:
        denom = v.max_nan(v.sub(count(rn, m2.dtype), const(correction, m2.dtype)), const(0.0, m2.dtype))
    return v.truediv(m2, denom)

