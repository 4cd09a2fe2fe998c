"""ATen pointwise ops -> C expressions, computed like eager (the C kernels' dialect).

The same contract as the Triton dialect (``codegen/triton/ops.py``, whose ``OpLowering``, ``V``
and reduction table this module shares): each lowering gets its operands converted to the op's
computation dtype and returns a ``V`` (a C expression and the torch dtype it has).  Only ops a C
compiler turns into vector code, or that the helpers in ``prelude.py`` compute branch-free
(``fx_expf``, ``fx_tanhf``, ``fx_erff``), are lowered: an op that would run element by element
through the C library (``log``, ``sin``...) is left to its ATen kernel, which is vectorized.
fp16/bf16 tensors are not read or written (``SIG_DTYPE`` leaves them out).
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

from ..triton import ops as triton_ops
from ..triton.ops import LOW_PRECISION, OpLowering, V, compute_dtype, round_to  # noqa: F401 (the dialect's names)

LANGUAGE = "C"

CTYPE = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}
# The kernel parameter type of a tensor's elements (the emitter's ``Param.sig`` is ``*`` + this).
# bool tensors are read and written as bytes (0 or 1): C compilers do not vectorize loads of ``bool``
# (a masked fill over a bool mask ran 10x slower); the values read are ``bool`` locals again.
SIG_DTYPE = {**CTYPE, torch.bool: "uint8_t"}

_LITERAL = re.compile(r"^(true|false|NAN|INFINITY|\(-INFINITY\)|INT64_MIN|[0-9][0-9.e+-]*f?|\(-[0-9][0-9.e+-]*f?\)"
                      r"|\(\((int64_t|int32_t|int16_t|int8_t|uint8_t)\)-?[0-9]+\))$")


def is_literal(e: str) -> bool:
    """A constant ``const`` wrote."""
    return bool(_LITERAL.match(e))


def const(x: Any, dt: torch.dtype) -> V:
    """A Python scalar as a C constant of dtype ``dt``."""
    if dt == torch.bool:
        return V("true" if bool(x) else "false", dt)
    if dt.is_floating_point:
        x = float(x)
        if dt == torch.float32 and math.isfinite(x):  # the float32 nearest x (what eager's opmath computes with)
            try:
                x = struct.unpack("f", struct.pack("f", x))[0]
            except OverflowError:  # beyond float32's range: eager's cast gives inf
                x = math.copysign(math.inf, x)
        if math.isnan(x):
            return V("NAN", dt)
        if math.isinf(x):
            return V("INFINITY" if x > 0 else "(-INFINITY)", dt)
        s = repr(x) + ("f" if dt == torch.float32 else "")
        return V(s, dt) if not s.startswith("-") else V(f"({s})", dt)
    if int(x) == -2**63:
        return V("INT64_MIN", dt)
    return V(f"(({CTYPE[dt]}){int(x)})", dt)


def cast(v: V, dt: torch.dtype) -> V:
    if v.dtype == dt:
        return v
    if dt == torch.bool:
        return V(f"({v.expr} != 0)", dt)
    return V(f"(({CTYPE[dt]})({v.expr}))", dt)


def _fn(name: str, a: V) -> str:
    """A libm or prelude function of ``a``'s float type (``f`` suffix for float32)."""
    return f"{name}f({a.expr})" if a.dtype == torch.float32 else f"{name}({a.expr})"


def _vec(name: str, a: V) -> str:
    """``exp``/``tanh``/``erf`` of ``a``: the prelude's vectorizable ``fx_<name>f`` on float32, the C
    library's on float64."""
    return f"fx_{name}f({a.expr})" if a.dtype == torch.float32 else f"{name}({a.expr})"


def _one(a: V) -> str:
    return "1.0f" if a.dtype == torch.float32 else "1.0"


def pow_scalar(x: V, e: Any) -> V | None:
    """``x ** e`` for a Python scalar exponent (None: not lowered)."""
    e = float(e)
    if e == 2.0:
        return V(f"({x.expr} * {x.expr})", x.dtype)
    if e == 1.0:
        return x
    if not x.dtype.is_floating_point:
        return None
    if e == 0.5:
        return V(_fn("sqrt", x), x.dtype)
    if e == -1.0:
        return V(f"({_one(x)} / {x.expr})", x.dtype)
    if e == 3.0:
        return V(f"({x.expr} * {x.expr} * {x.expr})", x.dtype)
    return None


def _alpha(b: V, alpha: Any) -> V:
    if alpha is None or alpha == 1:
        return b
    return V(f"({b.expr} * {const(alpha, b.dtype).expr})", b.dtype)


def _clamp(a: V, lo: V | None, hi: V | None) -> V:
    x = a.expr
    for b, cmp in ((lo, "<"), (hi, ">")):
        if b is None:
            continue
        if a.dtype.is_floating_point:  # NaN in the input or a bound gives NaN, as eager
            x = f"({b.expr} != {b.expr} ? {b.expr} : ({x} {cmp} {b.expr} ? {b.expr} : {x}))"
        else:
            x = f"({x} {cmp} {b.expr} ? {b.expr} : {x})"
    return V(x, a.dtype)


def _gelu_tanh(a: V) -> str:
    """``tanh(sqrt(2/pi) * (x + 0.044715 x**3))``, the tanh GELU's inner term."""
    x, f = a.expr, "f" if a.dtype == torch.float32 else ""
    return _vec("tanh", V(f"(0.7978845608028654{f} * ({x} + 0.044715{f} * {x} * {x} * {x}))", a.dtype))


def _gelu_erf(a: V) -> str:
    """``erf(x / sqrt(2))``, the exact GELU's inner term."""
    return _vec("erf", V(f"({a.expr} * 0.7071067811865476{'f' if a.dtype == torch.float32 else ''})", a.dtype))


def _gelu(a: V, approximate: str) -> V:
    x, f = a.expr, "f" if a.dtype == torch.float32 else ""
    inner = _gelu_tanh(a) if approximate == "tanh" else _gelu_erf(a)
    return V(f"(0.5{f} * {x} * (1.0{f} + {inner}))", a.dtype)


def _exp_nonpositive(a: V) -> str:
    """``exp(a)`` for ``a <= 0`` or NaN (0 below float32's normal range, as the products it
    feeds need: ``inf * exp(-inf)`` is NaN in eager)."""
    if a.dtype != torch.float32:
        return f"exp({a.expr})"
    return f"({a.expr} < -87.3f ? 0.0f : fx_expf_neg({a.expr}))"


def _gelu_backward(g: V, a: V, approximate: str) -> V:
    """``gelu_backward`` as eager's CPU kernel computes it: ``g * (cdf + x * pdf)`` (exact), and
    for ``tanh``, the derivative of ``0.5 x (1 + tanh(inner))`` written out as eager does."""
    x, f = a.expr, "f" if a.dtype == torch.float32 else ""
    if approximate == "tanh":
        t = _gelu_tanh(a)
        dtanh = f"(1.0{f} - {t} * {t})"
        dinner = f"(0.7978845608028654{f} * (1.0{f} + 0.134145{f} * {x} * {x}))"
        return V(f"({g.expr} * (0.5{f} * (1.0{f} + {t}) + 0.5{f} * {x} * {dtanh} * {dinner}))", a.dtype)
    if a.dtype == torch.float32:
        return V(f"({g.expr} * fx_gelu_gradf({x}))", a.dtype)  # one exp for erf and the density
    pdf = f"({_exp_nonpositive(V(f'({x} * {x} * (-0.5{f}))', a.dtype))} * 0.3989422804014327{f})"
    cdf = f"(0.5{f} * (1.0{f} + {_gelu_erf(a)}))"
    return V(f"({g.expr} * ({cdf} + {x} * {pdf}))", a.dtype)


def _sigmoid(a: V) -> str:
    return f"({_one(a)} / ({_one(a)} + {_vec('exp', V(f'(-{a.expr})', a.dtype))}))"


def _sign(a: V) -> V:
    x = a.expr
    if a.dtype == torch.bool:
        return a
    one, zero = const(1, a.dtype).expr, const(0, a.dtype).expr
    return V(f"({x} > 0 ? {one} : ({x} < 0 ? -{one} : {x if a.dtype.is_floating_point else zero}))", a.dtype)


OPS: dict[str, OpLowering] = {}


def _reg(names: str, lowering: OpLowering) -> None:
    for n in names.split():
        OPS[n] = lowering


_reg("add.Tensor add.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(
    f"({a.expr} + {_alpha(b, kw.get('alpha')).expr})" if a.dtype != torch.bool else f"({a.expr} | {b.expr})", a.dtype)))
_reg("sub.Tensor sub.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"({a.expr} - {_alpha(b, kw.get('alpha')).expr})", a.dtype)))
_reg("rsub.Tensor rsub.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"({b.expr} - {_alpha(a, kw.get('alpha')).expr})", a.dtype)))
_reg("mul.Tensor mul.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(
    f"({a.expr} * {b.expr})" if a.dtype != torch.bool else f"({a.expr} & {b.expr})", a.dtype)))
# true division only (K.INT_TO_FLOAT: integer operands are divided as floats, never by zero in C)
_reg("div.Tensor div.Scalar", OpLowering(("self", "other"), lambda a, b, kw: V(f"({a.expr} / {b.expr})", a.dtype), K.INT_TO_FLOAT, dtypes="float"))
_reg("maximum.default", OpLowering(("self", "other"), lambda a, b, kw: V(f"FX_MAX_NAN({a.expr}, {b.expr})", a.dtype)))
_reg("minimum.default", OpLowering(("self", "other"), lambda a, b, kw: V(f"FX_MIN_NAN({a.expr}, {b.expr})", a.dtype)))
_reg("pow.Tensor_Scalar", OpLowering(("self", "exponent"), None))  # the emitter asks pow_scalar

# comparisons and logical ops: the same source in C as in Triton (operators on the operands)
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _reg(f"{_name}.Tensor {_name}.Scalar", triton_ops.OPS[f"{_name}.Tensor"])
for _name in ("logical_and", "logical_or", "logical_xor", "logical_not"):
    _reg(f"{_name}.default", triton_ops.OPS[f"{_name}.default"])
for _name, _op in {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}.items():
    _reg(f"{_name}.Tensor {_name}.Scalar", OpLowering(
        ("self", "other"), (lambda op: lambda a, b, kw: V(f"(({CTYPE[a.dtype]})({a.expr} {op} {b.expr}))", a.dtype))(_op), dtypes="int"))
_reg("bitwise_not.default", OpLowering(("self",), lambda a, kw: V(
    f"({a.expr} == 0)" if a.dtype == torch.bool else f"(({CTYPE[a.dtype]})(~{a.expr}))", a.dtype), dtypes="int"))

_reg("where.self", OpLowering(("condition", "self", "other"), lambda c, a, b, kw: V(f"({c.expr} ? {a.expr} : {b.expr})", a.dtype)))
# float only: an int tensor filled with a float would be computed in float (eager casts the value)
_reg("masked_fill.Scalar masked_fill.Tensor", OpLowering(("self", "mask", "value"), lambda a, m, v, kw: V(
    f"({m.expr} ? {v.expr} : {a.expr})", a.dtype), dtypes="float"))
_reg("clamp.default clamp.Tensor", OpLowering(("self", "min", "max"), lambda a, lo, hi, kw: _clamp(a, lo, hi)))
_reg("clamp_min.default clamp_min.Tensor", OpLowering(("self", "min"), lambda a, lo, kw: _clamp(a, lo, None)))
_reg("clamp_max.default clamp_max.Tensor", OpLowering(("self", "max"), lambda a, hi, kw: _clamp(a, None, hi)))
_reg("hardtanh.default", OpLowering(("self",), lambda a, kw: _clamp(a, const(kw.get("min_val", -1.0), a.dtype), const(kw.get("max_val", 1.0), a.dtype))))

_FLOAT_UNARY = {
    "exp": lambda a: _vec("exp", a),
    "sigmoid": _sigmoid,
    "tanh": lambda a: _vec("tanh", a),
    "erf": lambda a: _vec("erf", a),
    "sqrt": lambda a: _fn("sqrt", a),
    "rsqrt": lambda a: f"({_one(a)} / {_fn('sqrt', a)})",
    "reciprocal": lambda a: f"({_one(a)} / {a.expr})",
}
for _name, _f in _FLOAT_UNARY.items():
    _reg(f"{_name}.default", OpLowering(("self",), (lambda f: lambda a, kw: V(f(a), a.dtype))(_f), K.INT_TO_FLOAT, dtypes="float"))
for _name in ("floor", "ceil", "trunc"):
    _reg(f"{_name}.default", OpLowering(("self",), (lambda nm: lambda a, kw: V(_fn(nm, a), a.dtype) if a.dtype.is_floating_point else a)(_name)))
_reg("round.default", OpLowering(("self",), lambda a, kw: V(_fn("nearbyint", a), a.dtype) if a.dtype.is_floating_point else a))

_reg("neg.default", OpLowering(("self",), lambda a, kw: V(f"(-{a.expr})", a.dtype)))
_reg("abs.default", OpLowering(("self",), lambda a, kw: a if a.dtype == torch.bool else V(
    _fn("fabs", a) if a.dtype.is_floating_point else f"({a.expr} < 0 ? -{a.expr} : {a.expr})", a.dtype)))
_reg("relu.default", OpLowering(("self",), lambda a, kw: V(f"({a.expr} < 0 ? {const(0, a.dtype).expr} : {a.expr})", a.dtype)))
_reg("sign.default", OpLowering(("self",), lambda a, kw: _sign(a)))
_reg("gelu.default", OpLowering(("self",), lambda a, kw: _gelu(a, kw.get("approximate", "none")), dtypes="float"))
_reg("silu.default", OpLowering(("self",), lambda a, kw: V(f"({a.expr} / ({_one(a)} + {_vec('exp', V(f'(-{a.expr})', a.dtype))}))", a.dtype), dtypes="float"))
# the pointwise backward kernels autograd's graphs keep (``decompose="none"``), as eager's CPU kernels
_reg("gelu_backward.default", OpLowering(("grad_output", "self"), lambda g, a, kw: _gelu_backward(g, a, kw.get("approximate", "none")), dtypes="float"))
_reg("threshold_backward.default", OpLowering(("grad_output", "self", "threshold"), lambda g, a, t, kw: V(
    f"({a.expr} <= {t.expr} ? {const(0, g.dtype).expr} : {g.expr})", g.dtype)))
_reg("sigmoid_backward.default", OpLowering(("grad_output", "output"), lambda g, y, kw: V(
    f"({g.expr} * ({_one(y)} - {y.expr}) * {y.expr})", g.dtype), dtypes="float"))
_reg("tanh_backward.default", OpLowering(("grad_output", "output"), lambda g, y, kw: V(
    f"({g.expr} * ({_one(y)} - {y.expr} * {y.expr}))", g.dtype), dtypes="float"))
_reg("silu_backward.default", OpLowering(("grad_output", "self"), lambda g, a, kw: V(
    f"({g.expr} * {_sigmoid(a)} * ({_one(a)} + {a.expr} * ({_one(a)} - {_sigmoid(a)})))", g.dtype), dtypes="float"))
_reg("isnan.default", OpLowering(("self",), lambda a, kw: V(f"({a.expr} != {a.expr})", torch.bool), K.ALWAYS_BOOL))
_reg("isinf.default", OpLowering(("self",), lambda a, kw: V(f"({_fn('fabs', a)} == INFINITY)", torch.bool), K.ALWAYS_BOOL, dtypes="float"))
_reg("leaky_relu.default", OpLowering(("self",), lambda a, kw: V(
    f"({a.expr} > 0 ? {a.expr} : {a.expr} * {const(kw.get('negative_slope', 0.01), a.dtype).expr})", a.dtype), dtypes="float"))
# conversions and copies: the single operand, converted to the node's dtype by the emitter
_reg("_to_copy.default clone.default alias_copy.default", OpLowering(("self",), lambda a, kw: a, None))
_reg("copy_strided.default", OpLowering(("a",), lambda a, kw: a, None))  # prims: stored at the planned strides
_reg("convert_element_type.default", OpLowering(("a",), lambda a, kw: a, None))  # prims' schema names it ``a``


# C kernels run on one thread: an op the backend would run on more elements than this (the exact
# GELU, the row, loss and embedding templates) stays ATen's, whose kernel runs on every intra-op
# thread.
ONE_THREAD_MAX_NUMEL = 1 << 18

# Ops computed through ``fx_expf``/``fx_tanhf`` take about 2x the time per element of eager's
# vector kernels (SLEEF), so the backend takes them only on tensors small enough that the ATen
# call saved costs more (``backend.accepts``).  ``fx_erff`` (erf, exact GELU) is about as fast as
# ATen's up to 64k elements; the exact GELU goes to 256k: at 131k elements its C kernel is slower
# than ATen's alone (64 against 54 µs) but twice as fast inside a training step (64 against 118 µs
# a call in the demo's), up to ``ONE_THREAD_MAX_NUMEL``.
TRANSCENDENTAL_MAX_NUMEL = {f"{n}.default": 8192 for n in ("exp", "sigmoid", "tanh", "silu", "silu_backward")}
TRANSCENDENTAL_MAX_NUMEL.update({"erf.default": 65536, "gelu.default": ONE_THREAD_MAX_NUMEL})
# gelu_backward (exact) has no limit: its C version (fx_gelu_gradf) is faster than eager's on one
# thread (131k elements: 57 against 107 µs)


def _key(op: torch._ops.OpOverload) -> str:
    name = op.name().split("::", 1)[1]
    return name if "." in name else name + ".default"


def lowering_of(op: torch._ops.OpOverload) -> OpLowering | None:
    return OPS.get(_key(op))


def max_numel(op: torch._ops.OpOverload, kwargs: dict) -> int | None:
    """The most elements the backend computes ``op`` on (None: no limit)."""
    key = _key(op)
    if key in ("gelu.default", "gelu_backward.default") and kwargs.get("approximate", "none") == "tanh":
        key = "tanh.default"
    return TRANSCENDENTAL_MAX_NUMEL.get(key)


# Reductions: how a row folds, per ``REDUCE_LOWERINGS`` kind (the shared table's ``combine``).
COMBINE = {"_sum_combine": "({a} + {b})", "_prod_combine": "({a} * {b})",
           "_max_nan": "FX_MAX_NAN({a}, {b})", "_min_nan": "FX_MIN_NAN({a}, {b})"}


def identity(kind: str, acc: torch.dtype) -> str:
    """A fold's identity (``ReduceLowering.identity``) as a C constant of ``acc``."""
    if kind in ("0", "1"):
        return const(int(kind), acc).expr
    if acc.is_floating_point:
        return "(-INFINITY)" if kind == "lowest" else "INFINITY"
    ii = torch.iinfo(acc)
    return const(ii.min if kind == "lowest" else ii.max, acc).expr
