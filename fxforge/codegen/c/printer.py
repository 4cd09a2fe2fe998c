"""Index expressions and kernel values (``codegen/ir``) as C.

Indices are ``int64_t`` arithmetic with Python floor semantics (a sign correction where an
operand may be negative).  Values compute like eager: float32 constants are ``f``-suffixed (the
nearest float32), integer bitwise results are narrowed back to their type.  Float functions:

* the C library's vector math (``build.vector_math``: ``sinf``, ``logf``... called by their C
  names, the compiler vectorizes the loops calling them) where this machine has it;
* else, for ``exp``, ``tanh`` and ``erf``, the prelude's vectorizable ``fx_<name>f`` on float32
  (the C library's scalar function on float64); ``exp`` and ``erf`` always (``_PRELUDE_FIRST``);
* the exact GELU's derivative of float32 is ``fx_gelu_gradf`` (one ``exp`` for both terms).

What C lacks here (a float function without a vector version, integer division...) is refused:
those nodes run as ATen's vector kernels.
"""

from __future__ import annotations

import functools
import math

import torch

from ..ir.printer import IndexPrinter, ValuePrinter
from ..ir.values import Const, Op
from .ops import CTYPE


class CPrinter(IndexPrinter):
    """Integer index expressions as C (``int64_t`` arithmetic): ``/`` and ``%`` where both
    operands are non-negative, a sign correction otherwise (Python floor semantics)."""

    MAX, MIN = "FX_MAX_NAN", "FX_MIN_NAN"

    def _print_Pow(self, expr) -> str:
        base, exp = expr.args
        if not (exp.is_Integer and exp > 0):
            raise NotImplementedError(f"cannot print power {expr} as a C index")
        return "(" + " * ".join([self._operand(base)] * int(exp)) + ")"

    def div(self, a, b) -> str:
        if b == 1:
            return self._print(a)
        x, y = self._operand(a), self._operand(b)
        if a.is_nonnegative and b.is_nonnegative:
            return f"({x} / {y})"
        return f"({x} / {y} - (({x} % {y} != 0) && (({x} < 0) != ({y} < 0))))"

    def mod(self, a, b) -> str:
        if b == 1:
            return "0"
        x, y = self._operand(a), self._operand(b)
        if a.is_nonnegative and b.is_nonnegative:
            return f"({x} % {y})"
        r = f"({x} % {y})"
        return f"(({r} != 0 && (({r} < 0) != ({y} < 0))) ? {r} + {y} : {r})"


_BINARY = {"add": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_BITWISE = {"and": "&", "or": "|", "xor": "^"}
# float functions: the prelude's vectorizable float32 versions (``fx_expf``...), else the C library's
_PRELUDE_F32 = ("exp", "tanh", "erf")
# the prelude's even where the library has a vector version: ``exp`` within 1 ulp of eager's (the
# library's: within 3, 6% of results more than 1 ulp off, which chains of ops through a matmul
# amplify past float32's tolerances), ``erf`` faster
_PRELUDE_FIRST = ("exp", "erf")
_LIBM = ("sqrt", "floor", "ceil", "trunc", "nearbyint")  # instructions


class CValues(ValuePrinter):
    """C values; ``vector_math``: the float functions the C library computes on vectors."""

    language = "C"

    def __init__(self, vector_math: frozenset[str] = frozenset()):
        super().__init__(CPrinter())
        self.vector_math = vector_math

    def const(self, c: Const) -> str:
        dt, x = c.dtype, c.value
        if dt == torch.bool:
            return "true" if x else "false"
        if dt.is_floating_point:
            if math.isnan(x):
                return "NAN"
            if math.isinf(x):
                return "INFINITY" if x > 0 else "(-INFINITY)"
            s = repr(x) + ("f" if dt == torch.float32 else "")
            return s if not s.startswith("-") else f"({s})"
        if x == -2**63:
            return "INT64_MIN"
        return f"(({CTYPE[dt]}){x})"

    def op(self, x: Op, a: list[str]) -> str | None:
        name, dt = x.op, x.dtype
        f32 = dt == torch.float32
        if name in _BINARY:
            return f"({a[0]} {_BINARY[name]} {a[1]})"
        if name in _BITWISE:
            return f"({a[0]} {_BITWISE[name]} {a[1]})" if dt == torch.bool else f"(({CTYPE[dt]})({a[0]} {_BITWISE[name]} {a[1]}))"
        if name == "truediv":  # floats only: an integer division by zero is undefined in C
            return f"({a[0]} / {a[1]})" if dt.is_floating_point else None
        if name == "neg":
            return f"(-{a[0]})"
        if name == "abs":
            if dt.is_floating_point:
                return f"fabsf({a[0]})" if f32 else f"fabs({a[0]})"
            return f"({a[0]} < 0 ? -{a[0]} : {a[0]})"
        if name == "invert":
            return f"(({CTYPE[dt]})(~{a[0]}))"
        if name == "not":
            return f"({a[0]} == 0)"
        if name == "where":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if name in ("max_nan", "min_nan"):
            return f"{'FX_MAX_NAN' if name == 'max_nan' else 'FX_MIN_NAN'}({a[0]}, {a[1]})"
        if name == "cast":
            return f"({a[0]} != 0)" if dt == torch.bool else f"(({CTYPE[dt]})({a[0]}))"
        if not dt.is_floating_point:
            return None
        if name == "gelu_grad":
            return f"fx_gelu_gradf({a[0]})" if f32 else None
        library = name in self.vector_math or name in _LIBM
        if f32 and name in _PRELUDE_F32 and (name in _PRELUDE_FIRST or not library):
            return f"fx_{name}f({a[0]})"
        if library or name in _PRELUDE_F32:
            return f"{name}f({a[0]})" if f32 else f"{name}({a[0]})"
        return None


@functools.lru_cache(maxsize=None)
def values(vector_math: frozenset[str]) -> CValues:
    """The printer for a machine whose C library computes ``vector_math`` on vectors."""
    return CValues(vector_math)
