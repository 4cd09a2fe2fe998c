"""ATen pointwise ops -> Triton expressions, computed like eager.

Each lowering gets its operands already converted to the op's computation dtype (``V``: a
Triton expression and the torch dtype it has) and returns a ``V``.  fp16/bf16 compute in fp32
and the result is rounded once when stored, as eager's CPU and CUDA kernels do.  Python
scalars of comparisons are first rounded to the tensor's dtype (eager compares in the common
dtype; pytorch#173987), arithmetic scalars stay in fp32 (eager's opmath).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

from .printer import floor_div

TL_DTYPE = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
# Signature names for ahead-of-time compiles.
SIG_DTYPE = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "i1",
}
LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt in LOW_PRECISION else dt


@dataclass(frozen=True)
class V:
    """A Triton value: source expression and the torch dtype it has in the kernel."""

    expr: str
    dtype: torch.dtype


def literal_value(expr: str) -> bool | int | float | None:
    """The Python value of a literal constant expression (None: a runtime value)."""
    if expr in ("True", "False"):
        return expr == "True"
    if expr.startswith('float("') and expr.endswith('")'):
        return float(expr[7:-2])
    for conv in (int, float):
        try:
            return conv(expr)
        except ValueError:
            pass
    return None


LANGUAGE = "Triton"


def is_literal(e: str) -> bool:
    """A constant ``const`` wrote: a Python literal, or a typed ``tl.full([], c, dtype)``."""
    return e.startswith("tl.full([], ") or literal_value(e) is not None


def cast(v: V, dt: torch.dtype) -> V:
    if v.dtype == dt:
        return v
    lit = literal_value(v.expr)
    if lit is not None:  # a literal has no .to(): convert the value here, as eager would
        return const(torch.tensor(lit, dtype=v.dtype).to(dt).item(), dt)
    if dt == torch.bool:
        return V(f"({v.expr} != 0)", dt)
    if dt in LOW_PRECISION and v.dtype != torch.float32:
        # eager converts to fp16/bf16 from float (c10::Half/BFloat16(float)): fp64 and ints
        # round to fp32 first (and the interpreter's direct fp64 -> bf16 cast is garbage)
        v = cast(v, torch.float32)
    if dt == torch.bfloat16 and v.dtype == torch.float32:
        return V(f"_to_bf16({v.expr})", dt)
    return V(f"{v.expr}.to({TL_DTYPE[dt]})", dt)


def const(x: Any, dt: torch.dtype) -> V:
    """A Python scalar as a Triton constant of dtype ``dt`` (a literal where Triton types it so)."""
    if dt == torch.bool:
        return V("True" if bool(x) else "False", dt)
    if dt.is_floating_point:
        x = float(x)
        if math.isnan(x):
            s = 'float("nan")'
        elif math.isinf(x):
            s = 'float("inf")' if x > 0 else 'float("-inf")'
        else:
            s = repr(x)
        return V(s if dt == torch.float32 else f"tl.full([], {s}, {TL_DTYPE[dt]})", dt)
    x = int(x)
    if dt in (torch.int32, torch.int64) and -(2**31) <= x < 2**31:
        return V(str(x), dt)
    return V(f"tl.full([], {x}, {TL_DTYPE[dt]})", dt)


def pow_scalar(x: V, e: Any) -> V | None:
    """``x ** e`` for a Python scalar exponent (None: not lowered)."""
    cdt = x.dtype
    if float(e) == 2.0:
        return V(f"({x.expr} * {x.expr})", cdt)
    if float(e) == 0.5 and cdt.is_floating_point:
        return V(_sqrt(x), cdt)
    if not cdt.is_floating_point:
        return None
    return V(f"_ld_pow({x.expr}, {const(e, cdt).expr})", cdt)


def is_nan_const(v: V) -> bool | None:
    """True/False for a literal constant, None for a runtime value."""
    if v.expr == 'float("nan")':
        return True
    try:
        float(v.expr)
        return False
    except ValueError:
        return None if not v.expr.startswith("float(") else False


def round_to(x: Any, dt: torch.dtype) -> Any:
    """The Python scalar ``x`` as eager sees it after casting to ``dt``."""
    if isinstance(x, bool) or not dt.is_floating_point:
        return x
    return torch.tensor(x, dtype=torch.float64).to(dt).item()


# --------------------------------------------------------------------------- lowerings
# fn(args: list[V], node_kwargs: dict) -> V; args in the computation dtype.


def _float(dt: torch.dtype) -> bool:
    return dt.is_floating_point


def _max_nan(a: str, b: str) -> str:
    return f"_max_nan({a}, {b})"


def _min_nan(a: str, b: str) -> str:
    return f"_min_nan({a}, {b})"


def _div(a: V, b: V) -> V:
    if a.dtype == torch.float32:
        return V(f"tl.div_rn({a.expr}, {b.expr})", a.dtype)  # IEEE division, like eager
    return V(f"({a.expr} / {b.expr})", a.dtype)


def _sqrt(a: V) -> str:
    return f"tl.sqrt_rn({a.expr})" if a.dtype == torch.float32 else f"_ld_sqrt({a.expr})"


def _div_mode(a: V, b: V, mode: str | None) -> V:
    if mode is None:
        return _div(a, b)
    if _float(a.dtype):
        if mode == "trunc":
            return V(f"_ld_trunc({_div(a, b).expr})", a.dtype)
        return V(f"_div_floor_f({a.expr}, {b.expr})", a.dtype)
    if mode == "trunc":
        return V(f"({a.expr} // {b.expr})", a.dtype)  # C division truncates
    return V(floor_div(a.expr, b.expr), a.dtype)


def _gelu(a: V, approximate: str) -> V:
    x = a.expr
    if approximate == "tanh":
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        return V(f"(0.5 * {x} * (1.0 + _ld_tanh({inner})))", a.dtype)
    return V(f"(0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476)))", a.dtype)


def _sign(a: V) -> V:
    x, t = a.expr, TL_DTYPE[a.dtype]
    if a.dtype == torch.bool:
        return a
    if _float(a.dtype):
        return V(f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, {x})).to({t})", a.dtype)
    return V(f"tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0)).to({t})", a.dtype)


def _clamp(a: V, lo: V | None, hi: V | None) -> V:
    x = a.expr
    if _float(a.dtype):
        # NaN in the input stays NaN; NaN bounds give NaN, as in eager
        for b, cmp in ((lo, "<"), (hi, ">")):
            if b is None:
                continue
            nan = is_nan_const(b)
            if nan is True:
                x = f"({x} + {b.expr})"
            elif nan is False:
                x = f"tl.where({x} {cmp} {b.expr}, {b.expr}, {x})"
            else:
                x = f"tl.where({b.expr} != {b.expr}, {b.expr}, tl.where({x} {cmp} {b.expr}, {b.expr}, {x}))"
        return V(x, a.dtype)
    if lo is not None:
        x = f"tl.maximum({x}, {lo.expr})"
    if hi is not None:
        x = f"tl.minimum({x}, {hi.expr})"
    return V(x, a.dtype)


@dataclass(frozen=True)
class OpLowering:
    # argument names (from the schema) that are operands, in order
    operands: tuple[str, ...]
    fn: Callable[..., V]
    promotion: Any = K.DEFAULT
    # operand dtypes the lowering supports: "float", "int" (ints and bool), "any"
    dtypes: str = "any"
    # comparisons: Python scalar operands are rounded to the common dtype first
    round_scalars: bool = False


OPS: dict[str, OpLowering] = {}


def _reg(names: str, lowering: OpLowering) -> None:
    for n in names.split():
        OPS[n] = lowering


def _alpha(b: V, alpha: Any) -> V:
    if alpha is None or alpha == 1:
        return b
    return V(f"({b.expr} * {const(alpha, b.dtype).expr})", b.dtype)


_reg("add.Tensor add.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"({a.expr} + {_alpha(b, kw.get('alpha')).expr})", a.dtype) if a.dtype != torch.bool else V(f"({a.expr} | {_alpha(b, kw.get('alpha')).expr})", a.dtype)))  # bool + bool is `or` in eager (i1 + i1 wraps)
_reg("sub.Tensor sub.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"({a.expr} - {_alpha(b, kw.get('alpha')).expr})", a.dtype)))
_reg("rsub.Tensor rsub.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"({b.expr} - {_alpha(a, kw.get('alpha')).expr})", a.dtype)))
_reg("mul.Tensor mul.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"({a.expr} * {b.expr})", a.dtype) if a.dtype != torch.bool else V(f"({a.expr} & {b.expr})", a.dtype)))
_reg("div.Tensor div.Scalar", OpLowering(("self", "other"), lambda a, b, kw: _div(a, b), K.INT_TO_FLOAT))
_reg("div.Tensor_mode div.Scalar_mode", OpLowering(("self", "other"), lambda a, b, kw: _div_mode(a, b, kw.get("rounding_mode"))))
_reg("floor_divide.default floor_divide.Scalar", OpLowering(("self", "other"), lambda a, b, kw: _div_mode(a, b, "floor")))
_reg("remainder.Tensor remainder.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"_remainder({a.expr}, {b.expr})", a.dtype)))
_reg("fmod.Tensor fmod.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"({a.expr} % {b.expr})", a.dtype)))
_reg("maximum.default", OpLowering(("self", "other"), lambda a, b, kw: V(_max_nan(a.expr, b.expr), a.dtype)))
_reg("minimum.default", OpLowering(("self", "other"), lambda a, b, kw: V(_min_nan(a.expr, b.expr), a.dtype)))
_reg("pow.Tensor_Scalar", OpLowering(("self", "exponent"), None))  # special-cased in lower_pointwise
_reg("pow.Tensor_Tensor", OpLowering(("self", "exponent"), lambda a, b, kw: V(f"_ld_pow({a.expr}, {b.expr})", a.dtype), dtypes="float"))
_reg("atan2.default", OpLowering(("self", "other"), lambda a, b, kw: V(f"_ld_atan2({a.expr}, {b.expr})", a.dtype), K.INT_TO_FLOAT))

for _name, _op in {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}.items():
    _reg(f"{_name}.Tensor {_name}.Scalar", OpLowering(
        ("self", "other"), (lambda op: lambda a, b, kw: V(f"({a.expr} {op} {b.expr})", torch.bool))(_op),
        K.ALWAYS_BOOL, round_scalars=True))

_reg("logical_and.default", OpLowering(("self", "other"), lambda a, b, kw: V(f"(({a.expr} != 0) & ({b.expr} != 0))", torch.bool), K.ALWAYS_BOOL))
_reg("logical_or.default", OpLowering(("self", "other"), lambda a, b, kw: V(f"(({a.expr} != 0) | ({b.expr} != 0))", torch.bool), K.ALWAYS_BOOL))
_reg("logical_xor.default", OpLowering(("self", "other"), lambda a, b, kw: V(f"(({a.expr} != 0) ^ ({b.expr} != 0))", torch.bool), K.ALWAYS_BOOL))
_reg("logical_not.default", OpLowering(("self",), lambda a, kw: V(f"({a.expr} == 0)", torch.bool), K.ALWAYS_BOOL))
for _name, _op in {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}.items():
    _reg(f"{_name}.Tensor {_name}.Scalar", OpLowering(
        ("self", "other"), (lambda op: lambda a, b, kw: V(f"({a.expr} {op} {b.expr})", a.dtype))(_op), dtypes="int"))
_reg("bitwise_not.default", OpLowering(("self",), lambda a, kw: V(f"({a.expr} == 0)" if a.dtype == torch.bool else f"(~{a.expr})", a.dtype), dtypes="int"))

_reg("where.self", OpLowering(("condition", "self", "other"), lambda c, a, b, kw: V(f"tl.where({c.expr}, {a.expr}, {b.expr})", a.dtype)))
_reg("clamp.default", OpLowering(("self", "min", "max"), lambda a, lo, hi, kw: _clamp(a, lo, hi)))
_reg("clamp.Tensor", OpLowering(("self", "min", "max"), lambda a, lo, hi, kw: _clamp(a, lo, hi)))
_reg("clamp_min.default clamp_min.Tensor", OpLowering(("self", "min"), lambda a, lo, kw: _clamp(a, lo, None)))
_reg("clamp_max.default clamp_max.Tensor", OpLowering(("self", "max"), lambda a, hi, kw: _clamp(a, None, hi)))

_FLOAT_UNARY = {
    "exp": "tl.exp({x})", "exp2": "tl.exp2({x})", "expm1": "_ld_expm1({x})",
    "log": "tl.log({x})", "log2": "tl.log2({x})", "log10": "_ld_log10({x})", "log1p": "_ld_log1p({x})",
    "sin": "tl.sin({x})", "cos": "tl.cos({x})", "tan": "_ld_tan({x})",
    "asin": "_ld_asin({x})", "acos": "_ld_acos({x})", "atan": "_ld_atan({x})",
    "sinh": "_ld_sinh({x})", "cosh": "_ld_cosh({x})", "tanh": "_ld_tanh({x})",
    "asinh": "_ld_asinh({x})", "acosh": "_ld_acosh({x})", "atanh": "_ld_atanh({x})",
    "erf": "tl.math.erf({x})", "erfc": "_ld_erfc({x})", "erfinv": "_ld_erfinv({x})",
    "sigmoid": "(1.0 / (1.0 + tl.exp(-{x})))",
    "reciprocal": "(1.0 / {x})",
    "rsqrt": "(1.0 / {sqrt})",
    "sqrt": "{sqrt}",
    "lgamma": "_ld_lgamma({x})",
}
for _name, _fmt in _FLOAT_UNARY.items():
    _reg(f"{_name}.default", OpLowering(
        ("self",), (lambda fmt: lambda a, kw: V(fmt.format(x=a.expr, sqrt=_sqrt(a)), a.dtype))(_fmt), K.INT_TO_FLOAT, dtypes="float"))

# float-only rounding ops keep integer inputs unchanged
for _name, _fmt in {"floor": "tl.floor({x})", "ceil": "tl.ceil({x})", "trunc": "_ld_trunc({x})", "round": "_ld_nearbyint({x})"}.items():
    _reg(f"{_name}.default", OpLowering(("self",), (lambda fmt: lambda a, kw: V(fmt.format(x=a.expr), a.dtype) if _float(a.dtype) else a)(_fmt)))

_reg("neg.default", OpLowering(("self",), lambda a, kw: V(f"(-{a.expr})", a.dtype)))
_reg("abs.default", OpLowering(("self",), lambda a, kw: a if a.dtype == torch.bool else V(f"tl.abs({a.expr})", a.dtype)))
_reg("relu.default", OpLowering(("self",), lambda a, kw: V(f"tl.where({a.expr} < 0, 0, {a.expr})", a.dtype)))
_reg("sign.default", OpLowering(("self",), lambda a, kw: _sign(a)))
_reg("gelu.default", OpLowering(("self",), lambda a, kw: _gelu(a, kw.get("approximate", "none")), dtypes="float"))
_reg("isnan.default", OpLowering(("self",), lambda a, kw: V(f"({a.expr} != {a.expr})", torch.bool), K.ALWAYS_BOOL))
_reg("silu.default", OpLowering(("self",), lambda a, kw: V(f"({a.expr} / (1.0 + tl.exp(-{a.expr})))", a.dtype), dtypes="float"))
_reg("hardtanh.default", OpLowering(("self",), lambda a, kw: _clamp(a, const(kw.get("min_val", -1.0), a.dtype), const(kw.get("max_val", 1.0), a.dtype))))

# conversions and copies: the single operand, converted to the node's dtype by Emitter.value (where
# it is computed, so the members reading it see the converted value, not only the store)
_reg("_to_copy.default clone.default alias_copy.default", OpLowering(("self",), lambda a, kw: a, None))
_reg("copy_strided.default", OpLowering(("a",), lambda a, kw: a, None))  # prims: stored at the planned strides
_reg("convert_element_type.default", OpLowering(("a",), lambda a, kw: a, None))  # prims' schema names it ``a``


def lowering_of(op: torch._ops.OpOverload) -> OpLowering | None:
    name = op.name().split("::", 1)[1]
    if "." not in name:
        name += ".default"
    return OPS.get(name)


_reg("isinf.default", OpLowering(("self",), lambda a, kw: V(f"(tl.abs({a.expr}) == float(\"inf\"))", torch.bool), K.ALWAYS_BOOL, dtypes="float"))
_reg("fmax.default", OpLowering(("self", "other"), lambda a, b, kw: V(
    f"tl.where({b.expr} != {b.expr}, {a.expr}, tl.where({a.expr} != {a.expr}, {b.expr}, tl.where({a.expr} > {b.expr}, {a.expr}, {b.expr})))", a.dtype), dtypes="float"))
_reg("fmin.default", OpLowering(("self", "other"), lambda a, b, kw: V(
    f"tl.where({b.expr} != {b.expr}, {a.expr}, tl.where({a.expr} != {a.expr}, {b.expr}, tl.where({a.expr} < {b.expr}, {a.expr}, {b.expr})))", a.dtype), dtypes="float"))


def _elu(a: V, kw) -> V:
    alpha, scale, iscale = (float(kw.get(k, 1.0)) for k in ("alpha", "scale", "input_scale"))
    x = a.expr
    return V(f"tl.where({x} > 0, {x} * {scale!r}, _ld_expm1({x} * {iscale!r}) * {alpha * scale!r})", a.dtype)


_reg("elu.default", OpLowering(("self",), _elu, dtypes="float"))
_reg("leaky_relu.default", OpLowering(("self",), lambda a, kw: V(
    f"tl.where({a.expr} > 0, {a.expr}, {a.expr} * {float(kw.get('negative_slope', 0.01))!r})", a.dtype), dtypes="float"))


# --------------------------------------------------------------------------- reductions
#
# How a reduction kind reduces a row (Emitter.reduce reads this table).  ``strategy``:
# "combine" folds blocks with ``combine`` (one accumulator), "arg" folds (value, index) pairs
# with ``combine`` (ties to the first index, NaN largest), "moments" takes two passes (the mean,
# then the sum of squared deviations).  ``results`` name what the reduction returns, in order:
# "acc" the accumulator, "mean" acc / row length, "nonzero" acc != 0, "value"/"index" an arg
# fold's pair, "var"/"avg" the moments' variance (with the correction) and mean.


@dataclass(frozen=True)
class ReduceLowering:
    strategy: str
    identity: str  # "0", "1", "lowest" or "highest" (of the accumulator dtype)
    combine: str | None  # a PRELUDE helper
    accumulate: str  # the accumulator dtype: "sum" (wide), "moments", "flag" (int32) or "input"
    results: tuple[str, ...]


REDUCE_LOWERINGS = {
    "sum": ReduceLowering("combine", "0", "_sum_combine", "sum", ("acc",)),
    "mean": ReduceLowering("combine", "0", "_sum_combine", "sum", ("mean",)),
    "prod": ReduceLowering("combine", "1", "_prod_combine", "sum", ("acc",)),
    "amax": ReduceLowering("combine", "lowest", "_max_nan", "input", ("acc",)),
    "amin": ReduceLowering("combine", "highest", "_min_nan", "input", ("acc",)),
    "any": ReduceLowering("combine", "0", "_max_nan", "flag", ("nonzero",)),
    "all": ReduceLowering("combine", "1", "_min_nan", "flag", ("nonzero",)),
    "argmax": ReduceLowering("arg", "lowest", "_argmax_combine", "input", ("index",)),
    "argmin": ReduceLowering("arg", "highest", "_argmin_combine", "input", ("index",)),
    "max_dim": ReduceLowering("arg", "lowest", "_argmax_combine", "input", ("value", "index")),
    "min_dim": ReduceLowering("arg", "highest", "_argmin_combine", "input", ("value", "index")),
    "var": ReduceLowering("moments", "0", "_sum_combine", "moments", ("var",)),
    "var_mean": ReduceLowering("moments", "0", "_sum_combine", "moments", ("var", "avg")),
}


def accumulator_dtype(low: ReduceLowering, in_dt: torch.dtype, out_dt: torch.dtype) -> torch.dtype:
    """The dtype a row is accumulated in: sums and products in fp32/fp64/int64 (eager's
    accumulate types), moments in fp32 (fp64 input: fp64), any/all as int32 flags, min/max and
    arg folds in the input's compute dtype (bool as int32)."""
    if low.accumulate == "sum":
        return torch.float64 if out_dt == torch.float64 else (torch.float32 if out_dt.is_floating_point else torch.int64)
    if low.accumulate == "moments":
        return torch.float64 if in_dt == torch.float64 else torch.float32
    if low.accumulate == "flag":
        return torch.int32
    acc = compute_dtype(in_dt)
    return torch.int32 if acc == torch.bool else acc


def identity_of(low: ReduceLowering, acc: torch.dtype) -> str:
    """The fold's identity as a literal of ``acc``."""
    if low.identity in ("0", "1"):
        return low.identity
    if acc.is_floating_point:
        return 'float("-inf")' if low.identity == "lowest" else 'float("inf")'
    ii = torch.iinfo(acc)
    return str(ii.min if low.identity == "lowest" else ii.max)
