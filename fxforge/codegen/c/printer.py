"""Index expressions, kernel values and statements (``codegen/ir``) as C.

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

Statements (``CStatements``): index locals are ``const int64_t``, loads, lets and stores one line
each; a nest is its ``for`` lines around one braced body, with an ``omp simd`` pragma on its
innermost loop where the walk marked it (the compiler then vectorizes it without checking at
run time that the kernel's pointers do not overlap: past ten such checks it leaves a loop
scalar, and a fused kernel of a dozen tensors needs more) and an ``omp parallel for`` on its
outer loops where they are split across threads (``collapse`` over several, ``if`` a condition
on symbolic sizes); each element or row is still computed by one thread, in one order.
"""

from __future__ import annotations

import functools
import math

import sympy
import torch

from ..ir.printer import IndexPrinter, OpRule, StatementPrinter, ValuePrinter
from ..ir.stmts import Array, Check, Do, Index, Let, Load, Loop, Nest, Set, Skip, Store, View
from ..ir.values import FLOAT_UNARY, Addr, Const, Elem, Op
from .abi import fail
from .dtypes import CTYPE


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


def _bitwise(sym: str) -> OpRule:
    def print_(p, x: Op, a: list[str]) -> str:  # (integer results narrowed back to their type)
        return f"({a[0]} {sym} {a[1]})" if x.dtype == torch.bool else f"(({CTYPE[x.dtype]})({a[0]} {sym} {a[1]}))"
    return print_


def _abs(p, x: Op, a: list[str]) -> str:
    if x.dtype.is_floating_point:
        return f"fabsf({a[0]})" if x.dtype == torch.float32 else f"fabs({a[0]})"
    return f"({a[0]} < 0 ? -{a[0]} : {a[0]})"


def _float_function(p: "CValues", x: Op, a: list[str]) -> str | None:
    """A float function: the prelude's float32 version, else the C library's (module docstring)."""
    name, dt = x.op, x.dtype
    if not dt.is_floating_point:
        return None
    f32 = dt == torch.float32
    library = name in p.vector_math or name in _LIBM
    if f32 and name in _PRELUDE_F32 and (name in _PRELUDE_FIRST or not library):
        return f"fx_{name}f({a[0]})"
    if library or name in _PRELUDE_F32:
        return f"{name}f({a[0]})" if f32 else f"{name}({a[0]})"
    return None


class CValues(ValuePrinter):
    """C values; ``vector_math``: the float functions the C library computes on vectors."""

    language = "C"
    OPS: dict[str, OpRule] = {
        **{name: f"({{0}} {sym} {{1}})" for name, sym in _BINARY.items()},
        **{name: _bitwise(sym) for name, sym in _BITWISE.items()},
        # floats only: an integer division by zero is undefined in C
        "truediv": lambda p, x, a: f"({a[0]} / {a[1]})" if x.dtype.is_floating_point else None,
        "neg": "(-{0})",
        "abs": _abs,
        "invert": lambda p, x, a: f"(({CTYPE[x.dtype]})(~{a[0]}))",
        "not": "({0} == 0)",
        "where": "({0} ? {1} : {2})",
        "max_nan": "FX_MAX_NAN({0}, {1})",
        "min_nan": "FX_MIN_NAN({0}, {1})",
        "cast": lambda p, x, a: f"({a[0]} != 0)" if x.dtype == torch.bool else f"(({CTYPE[x.dtype]})({a[0]}))",
        "gelu_grad": lambda p, x, a: f"fx_gelu_gradf({a[0]})" if x.dtype == torch.float32 else None,
        **{name: _float_function for name in FLOAT_UNARY},
    }

    def __init__(self, vector_math: frozenset[str] = frozenset()):
        super().__init__(CPrinter())
        self.vector_math = vector_math

    def value_Elem(self, e: Elem) -> str:
        return e.array + "".join(f"[{self.index(i)}]" for i in e.index)

    def value_Addr(self, x: Addr) -> str:
        """``a + i`` for an element of a pointer (a tensor's), ``&a[i][j]`` for a local array's."""
        e = x.of
        return f"{e.array} + {self.index(e.index[0])}" if len(e.index) == 1 else f"&{self(e)}"

    def value_Const(self, c: Const) -> str:
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


@functools.lru_cache(maxsize=None)
def values(vector_math: frozenset[str]) -> CValues:
    """The printer for a machine whose C library computes ``vector_math`` on vectors."""
    return CValues(vector_math)


@functools.lru_cache(maxsize=8192)
def c_index(e: sympy.Expr) -> str:
    """An index expression as C (``CPrinter``): the same few recur in every kernel."""
    return CPrinter()(e)


def for_line(loop: Loop) -> str:
    v = loop.var
    step = f"{v}++" if loop.step == 1 else f"{v} += {c_index(loop.step)}"
    return f"for (int64_t {v} = {c_index(loop.start)}; {v} < {c_index(loop.stop)}; {step})"


def array_decl(a: Array) -> str:
    """``ctype name[d0][d1]...`` on the stack, or a pointer into the kernel's heap block ``fx_heap``."""
    if a.heap_at is None:
        return f"{a.ctype} {a.name}{''.join(f'[{d}]' for d in a.dims)};"
    inner = "".join(f"[{d}]" for d in a.dims[1:])
    return f"{a.ctype} (*{a.name}){inner} = ({a.ctype} (*){inner})(fx_heap + {a.heap_at});" if inner else \
        f"{a.ctype}* {a.name} = ({a.ctype}*)(fx_heap + {a.heap_at});"


class CStatements(StatementPrinter):
    """Kernel statements (``ir/stmts.py``) as C lines (module docstring), values by ``values``."""

    def __init__(self, values: CValues):
        self.values = values

    def stmt_Index(self, s: Index) -> str:
        return f"const int64_t {s.name} = {c_index(s.expr)};"

    def stmt_Load(self, s: Load) -> str:
        return f"const {CTYPE[s.dtype]} {s.name} = {self.element(s)};"

    def stmt_Store(self, s: Store) -> str:
        return f"{self.element(s)} = {self.values(s.value)};"

    def stmt_Let(self, s: Let) -> str:
        return f"{'' if s.mutable else 'const '}{CTYPE[s.value.dtype]} {s.name} = {self.values(s.value)};"

    def stmt_Set(self, s: Set) -> str:
        return f"{self.target(s.target)} {s.op}= {self.values(s.value)};"

    def stmt_Array(self, s: Array) -> str:
        return array_decl(s)

    def stmt_View(self, s: View) -> str:
        return f"{'const ' if s.readonly else ''}{CTYPE[s.of.dtype]}* const {s.name} = {self.values(s.of)};"

    def stmt_Do(self, s: Do) -> str:
        return f"{self.values(s.call)};"

    def stmt_Check(self, s: Check) -> str:
        return f"if ({self.values(s.cond)}) {fail(s.code, self.values(s.value))}"

    def stmt_Skip(self, s: Skip) -> str:
        return f"if ({self.values(s.cond)}) continue;"

    def element(self, s: Load | Store) -> str:
        """The element a load reads or a store writes: ``ptr[offset]``, or where the kernel moved
        it (``at``: a tile's element)."""
        return self.values(s.at if s.at is not None else Elem(s.ptr, (s.offset,), s.dtype if isinstance(s, Load)
                                                               else s.value.dtype))

    def nest(self, s: Nest, indent: str) -> list[str]:
        fors = [for_line(l) for l in s.loops]
        pragmas: dict[int, str] = {}
        if fors and s.simd is not None:
            pragmas[len(fors) - 1] = " ".join(["simd"] + [f"reduction({op}:{acc})" for op, acc in s.simd])
        if fors and s.parallel:
            clauses = (f" collapse({s.parallel})" if s.parallel > 1 else "") + (
                f" if({c_index(s.parallel_if[0])} >= {s.parallel_if[1]})" if s.parallel_if else "")
            pragmas[0] = f"parallel for {pragmas[0]}{clauses}" if 0 in pragmas else f"parallel for{clauses}"
        out = []
        for i, f in enumerate(fors):
            if i in pragmas:
                out.append(f"{indent}#pragma omp {pragmas[i]}")
            out.append(indent + f)
        return out + [indent + "{"] + self.lines(s.body, indent + "    ") + [indent + "}"]
