"""Kernel values: the expressions a kernel computes per element, before any language.

A value is a small tree: a constant (``Const``), a name the kernel binds (``Var``: a load's
result, a parameter, an accumulator), an element of an array (``Elem``) or its address
(``Addr``), an index expression (``Index``: a size, a row length), a block language's blocks
(``Mask``, ``Full``, ``Block``, ``Lanes``), an operation of the vocabulary below on other values
(``Op``) or a helper of one language's prelude (``Call``).  Every value carries the torch dtype
it has in the kernel.  The builders (``add``, ``where``, ``exp``...) fold what is known when the
kernel is built (a cast of a constant, a ``where`` on a constant condition, NaN tests of
constants), so printers see only what must be computed at run time.

The vocabulary: ``PRIMITIVES`` name operations a printer renders in its language, or refuses
(a C kernel has no ``log``: the group is left to ATen); ``COMPOSITES`` are operations with a
default expansion into other operations, which a printer may render directly where its
language has something better (``sigmoid``, the exact GELU's derivative).  What an ATen
operator means in this vocabulary is written once, in ``aten.py``.
"""

from __future__ import annotations

import math
import struct
from enum import Enum
from typing import Any, Callable

import sympy
import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


class Domain(str, Enum):
    """Where a value of a kernel lives in its frame (``rows.py``): one per row (``ROW``), or one
    per element of the rows (``ELEMENT``, reduction kernels only).  A str, so that it keys
    dicts and prints as its short name."""

    ROW = "x"
    ELEMENT = "xr"

    __str__ = str.__str__
    __format__ = str.__format__


class Role(str, Enum):
    """What a kernel does with a tensor parameter: reads it (``IN``) or writes it (``OUT``); its
    C and Triton names start with it (``in_ptr0``, ``out_ptr1``)."""

    IN = "in"
    OUT = "out"

    __str__ = str.__str__
    __format__ = str.__format__


class Unsupported(Exception):
    """A kernel cannot be built for this group (the capability check says so in its reason)."""


def compute_dtype(dt: torch.dtype) -> torch.dtype:
    """fp16/bf16 compute in fp32 and are rounded once when stored, as eager's kernels do."""
    return torch.float32 if dt in LOW_PRECISION else dt


class Value:
    __slots__ = ("dtype",)
    dtype: torch.dtype


class Const(Value):
    """A Python scalar as the kernel sees it: a bool, an int, or a float (float32 constants are
    the nearest float32, as eager's opmath computes with)."""

    __slots__ = ("value",)

    def __init__(self, value: Any, dtype: torch.dtype):
        self.value, self.dtype = value, dtype

    def __repr__(self) -> str:
        return f"Const({self.value!r}, {self.dtype})"


class Var(Value):
    """A name the kernel binds (a local, a parameter, an element of a local array)."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: torch.dtype):
        self.name, self.dtype = name, dtype

    def __repr__(self) -> str:
        return f"Var({self.name!r}, {self.dtype})"


class Elem(Value):
    """An element of an array: of a tensor parameter (its data pointer) or of a local array
    (``stmts.Array``: a row cache, a tile, a column's accumulator), at one index expression per
    dim (``index``).  Printers subscript it in their language; one without arrays refuses it."""

    __slots__ = ("array", "index")

    def __init__(self, array: str, index: tuple, dtype: torch.dtype):
        self.array, self.index, self.dtype = array, tuple(sympy.sympify(i) for i in index), dtype

    def __repr__(self) -> str:
        return f"Elem({self.array!r}, {self.index!r}, {self.dtype})"


class Mask(Value):
    """The lanes of a block inside the kernel's sizes, in domain ``dom`` (a block language's
    kernels: Triton's ``xmask`` / ``rmask & xmask``)."""

    __slots__ = ("dom",)

    def __init__(self, dom: "Domain"):
        self.dom, self.dtype = dom, torch.bool


class Full(Value):
    """A block of domain ``dom`` filled with ``value`` (an accumulator's start)."""

    __slots__ = ("value", "dom")

    def __init__(self, value: Value, dom: "Domain"):
        self.value, self.dom, self.dtype = value, dom, value.dtype


class Block(Value):
    """``value`` broadcast to a block of domain ``dom`` (a row's element indices, as values), of
    ``dtype`` where the language's block has another type than the value (Triton's ``rindex``
    is int32)."""

    __slots__ = ("value", "dom")

    def __init__(self, value: Value, dom: "Domain", dtype: torch.dtype | None = None):
        self.value, self.dom, self.dtype = value, dom, value.dtype if dtype is None else dtype


class Lanes(Value):
    """The lane numbers of a block along its rows' elements, ``0 .. RBLOCK - 1`` (a block
    language's reduction kernels: Triton's ``tl.arange``), int32."""

    __slots__ = ()

    def __init__(self):
        self.dtype = torch.int32


class Call(Value):
    """A helper of the kernel language's prelude (``fn``: its name there) applied to ``args``:
    what a language module writes where it has a faster routine than the vocabulary's ops (C's
    ``fx_expf_neg`` of a non-positive argument), or, as a statement (``stmts.Do``), a routine
    called for its effect (C's ``fx_tile_in8``: a tile of a tensor moved into a local array)."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: str, args: tuple, dtype: torch.dtype | None = None):  # (None: a call for its effect)
        self.fn, self.args, self.dtype = fn, tuple(args), dtype

    def __repr__(self) -> str:
        return f"Call({self.fn!r}, {self.args!r}, {self.dtype})"


class Addr(Value):
    """The address of an element (``of``: an ``Elem``), a helper's argument; of the element's dtype."""

    __slots__ = ("of",)

    def __init__(self, of: Elem):
        self.of, self.dtype = of, of.dtype


class Index(Value):
    """An integer index expression over the kernel's size parameters (int64)."""

    __slots__ = ("expr",)

    def __init__(self, expr: sympy.Expr):
        self.expr, self.dtype = expr, torch.int64


class Op(Value):
    """``op`` of the vocabulary applied to ``args`` (values; for ``cast`` the target is the dtype)."""

    __slots__ = ("op", "args")

    def __init__(self, op: str, args: tuple, dtype: torch.dtype):
        self.op, self.args, self.dtype = op, args, dtype

    def __repr__(self) -> str:
        return f"Op({self.op!r}, {self.args!r}, {self.dtype})"


# --------------------------------------------------------------------------- vocabulary

# unary ops of floats whose printers call their language's math library (or refuse)
FLOAT_UNARY = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
               "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "sqrt",
               "floor", "ceil", "trunc", "nearbyint")
PRIMITIVES = frozenset(FLOAT_UNARY + (
    "add", "sub", "mul", "truediv", "neg", "abs",
    "floordiv",  # Python's ``//`` (ints), eager's floor division (floats)
    "truncdiv",  # ints: C's ``/``
    "mod",  # Python's ``%`` (the divisor's sign)
    "fmod",  # C's ``%`` / fmod (the dividend's sign)
    "pow", "atan2",
    "eq", "ne", "lt", "le", "gt", "ge",
    "and", "or", "xor", "invert", "not",  # bitwise on ints and bools; ``not`` is logical
    "where", "max_nan", "min_nan",  # maximum/minimum propagating NaN (torch.maximum, amax)
    "cast",
))


def _sigmoid(x: Value) -> Value:
    return truediv(const(1, x.dtype), add(const(1, x.dtype), exp(neg(x))))


def _gelu_grad(x: Value) -> Value:
    """``Phi(x) + x phi(x)``: the exact GELU's derivative."""
    cdf = mul(const(0.5, x.dtype), add(const(1, x.dtype), erf(mul(x, const(0.7071067811865476, x.dtype)))))
    pdf = mul(exp(mul(mul(x, x), const(-0.5, x.dtype))), const(0.3989422804014327, x.dtype))
    return add(cdf, mul(x, pdf))


COMPOSITES: dict[str, Callable[..., Value]] = {
    "sigmoid": _sigmoid,
    "gelu_grad": _gelu_grad,
}


# --------------------------------------------------------------------------- builders


def const(x: Any, dt: torch.dtype) -> Const:
    """A Python scalar as a constant of ``dt``."""
    if dt == torch.bool:
        return Const(bool(x), dt)
    if dt.is_floating_point:
        x = float(x)
        if dt == torch.float32 and math.isfinite(x):
            try:
                x = struct.unpack("f", struct.pack("f", x))[0]
            except OverflowError:  # beyond float32's range: eager's cast gives inf
                x = math.copysign(math.inf, x)
        return Const(x, dt)
    return Const(int(x), dt)


def round_to(x: Any, dt: torch.dtype) -> Any:
    """The Python scalar ``x`` as eager sees it after casting to ``dt``."""
    if isinstance(x, bool) or not dt.is_floating_point:
        return x
    return torch.tensor(x, dtype=torch.float64).to(dt).item()


def cast(v: Value, dt: torch.dtype) -> Value:
    if v.dtype == dt:
        return v
    if isinstance(v, Const):  # converted here, as eager would
        return const(torch.tensor(v.value, dtype=v.dtype).to(dt).item(), dt)
    if dt in LOW_PRECISION and v.dtype != torch.float32:
        # eager converts to fp16/bf16 from float (c10::Half/BFloat16(float)): fp64 and ints round
        # to fp32 first
        v = cast(v, torch.float32)
    return Op("cast", (v,), dt)


def op(name: str, *args: Value, dtype: torch.dtype | None = None) -> Op:
    return Op(name, args, args[0].dtype if dtype is None else dtype)


def _binary(name: str) -> Callable[[Value, Value], Value]:
    def build(a: Value, b: Value) -> Value:
        return Op(name, (a, b), a.dtype)
    build.__name__ = name
    return build


add, sub, mul, truediv = _binary("add"), _binary("sub"), _binary("mul"), _binary("truediv")
floordiv, truncdiv, mod, fmod = _binary("floordiv"), _binary("truncdiv"), _binary("mod"), _binary("fmod")
pow_, atan2, max_nan, min_nan = _binary("pow"), _binary("atan2"), _binary("max_nan"), _binary("min_nan")
bit_and, bit_or, bit_xor = _binary("and"), _binary("or"), _binary("xor")


def compare(name: str, a: Value, b: Value) -> Value:
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(bool({"eq": a.value == b.value, "ne": a.value != b.value, "lt": a.value < b.value,
                           "le": a.value <= b.value, "gt": a.value > b.value, "ge": a.value >= b.value}[name]),
                     torch.bool)
    return Op(name, (a, b), torch.bool)


def neg(a: Value) -> Value:
    return Op("neg", (a,), a.dtype)


def unary(name: str, a: Value) -> Value:
    return Op(name, (a,), a.dtype)


def exp(a: Value) -> Value:
    return unary("exp", a)


def erf(a: Value) -> Value:
    return unary("erf", a)


def sqrt(a: Value) -> Value:
    return unary("sqrt", a)


def logical_not(a: Value) -> Value:
    return Op("not", (a,), torch.bool)


def isnan(a: Value) -> Value:
    if isinstance(a, Const):
        return Const(isinstance(a.value, float) and math.isnan(a.value), torch.bool)
    if not a.dtype.is_floating_point:
        return Const(False, torch.bool)
    return compare("ne", a, a)


def where(c: Value, a: Value, b: Value) -> Value:
    if isinstance(c, Const):
        return a if c.value else b
    return Op("where", (c, a, b), a.dtype)


def composite(name: str, *args: Value) -> Value:
    return Op(name, args, args[0].dtype)


def expand(v: Op) -> Value:
    """A composite op in the vocabulary's primitives (its default expansion)."""
    return COMPOSITES[v.op](*v.args)
