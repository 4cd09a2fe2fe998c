"""Index expressions, kernel values and statements (``codegen/ir``) as Triton source.

Triton's ``//`` and ``%`` on integers are C-style (truncate toward zero; the remainder takes the
dividend's sign): where an operand may be negative, ``floor_div``/``floor_mod`` correct the sign
(Python floor semantics, what sympy's and eager's floor division mean).  Values compute like
eager: float32 division and square roots are IEEE-rounded (``div_rn``/``sqrt_rn``), math
functions outside core ``tl`` come from libdevice (``prelude.py``).

Statements (``TritonStatements``) are blocks: a row value is ``[XBLOCK, 1]`` (``[XBLOCK]`` in a
pointwise kernel), a full value ``[XBLOCK, RBLOCK]``; loads and stores are masked to the rows
(and the row's elements) in range, their offsets broadcast to the block of their domain.  The
only loop is a looped reduction's ``for roffset in range(0, rnumel, RBLOCK)``.
"""

from __future__ import annotations

import functools
import math

import sympy
import torch

from ..ir.printer import IndexPrinter, OpRule, StatementPrinter, ValuePrinter
from ..ir.stmts import Index, Let, Load, Nest, Reduce, Set, Store
from ..ir.values import Block, Const, Domain, Full, Lanes, Mask, Op, Value
from .dtypes import COMBINE_FN, TL_DTYPE


def floor_div(a: str, b: str) -> str:
    """Python ``a // b`` on Triton integers (operands may be negative)."""
    q, r = f"({a} // {b})", f"({a} % {b})"
    return f"tl.where(({r} != 0) & (({a} < 0) != ({b} < 0)), {q} - 1, {q})"


def floor_mod(a: str, b: str) -> str:
    """Python ``a % b`` on Triton integers or floats: the result takes the divisor's sign."""
    r = f"({a} % {b})"
    return f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})"


class TritonPrinter(IndexPrinter):
    """Integer index expressions as Triton (floor semantics, ``tl.maximum``/``tl.minimum``)."""

    MAX, MIN = "tl.maximum", "tl.minimum"

    def _print_Pow(self, expr) -> str:
        base, exp = expr.args
        if not (exp.is_Integer and exp > 0):
            raise NotImplementedError(f"cannot print power {expr} as a Triton index")
        return super()._print_Pow(expr)

    def div(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if b == 1:
            return self._print(a)
        if a.is_nonnegative and b.is_nonnegative:
            return f"({self._operand(a)} // {self._operand(b)})"
        return floor_div(self._operand(a), self._operand(b))

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if b == 1:
            return "0"
        if a.is_nonnegative and b.is_nonnegative:
            return f"({self._operand(a)} % {self._operand(b)})"
        return floor_mod(self._operand(a), self._operand(b))


_BINARY = {"add": "+", "sub": "-", "mul": "*", "fmod": "%", "truncdiv": "//", "and": "&", "or": "|", "xor": "^",
           "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_CALLS = {"max_nan": "_max_nan", "min_nan": "_min_nan", "mod": "_remainder", "pow": "_ld_pow", "atan2": "_ld_atan2",
          "where": "tl.where", "abs": "tl.abs", "exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2",
          "sin": "tl.sin", "cos": "tl.cos", "erf": "tl.math.erf", "floor": "tl.floor", "ceil": "tl.ceil"}
# the rest of the vocabulary's float functions: libdevice's (``_ld_<name>``, prelude.py)
_LIBDEVICE = ("expm1", "log10", "log1p", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
              "atanh", "erfc", "erfinv", "lgamma", "trunc", "nearbyint")


def _call(fn: str) -> OpRule:
    def print_(p: "TritonValues", x: Op, a: list[str]) -> str | None:
        return p.call(fn, a)
    return print_


def _cast(p, x: Op, a: list[str]) -> str:
    if x.dtype == torch.bool:
        return f"({a[0]} != 0)"
    if x.dtype == torch.bfloat16 and x.args[0].dtype == torch.float32:
        return f"_to_bf16({a[0]})"
    return f"{a[0]}.to({TL_DTYPE[x.dtype]})"


class TritonValues(ValuePrinter):
    """Triton values; ``helpers``: the prelude helpers the kernel's module defines (None: all),
    a value calling another is refused (the interpreter's module lacks some libdevice functions)."""

    language = "Triton"
    OPS: dict[str, OpRule] = {
        **{name: f"({{0}} {sym} {{1}})" for name, sym in _BINARY.items()},
        **{name: _call(fn) for name, fn in _CALLS.items()},
        **{name: _call(f"_ld_{name}") for name in _LIBDEVICE},
        "neg": "(-{0})",
        "invert": "(~{0})",
        "not": "({0} == 0)",
        "truediv": lambda p, x, a: f"tl.div_rn({a[0]}, {a[1]})" if x.dtype == torch.float32 else f"({a[0]} / {a[1]})",
        "sqrt": lambda p, x, a: f"tl.sqrt_rn({a[0]})" if x.dtype == torch.float32 else p.call("_ld_sqrt", a),
        "floordiv": lambda p, x, a: f"_div_floor_f({a[0]}, {a[1]})" if x.dtype.is_floating_point else floor_div(a[0], a[1]),
        "cast": _cast,
    }

    def __init__(self, helpers: frozenset[str] | None = None):
        super().__init__(TritonPrinter())
        self.helpers = helpers
        if helpers is not None:
            self.language = "Triton interpreter (TRITON_INTERPRET=1)"

    def call(self, fn: str, a: list[str]) -> str | None:
        if fn.startswith("_ld_") and self.helpers is not None and fn not in self.helpers:
            return None
        return f"{fn}({', '.join(a)})"

    # a reduction kernel's blocks: ``[XBLOCK, 1]`` per row, ``[XBLOCK, RBLOCK]`` per element

    def value_Mask(self, b: Mask) -> str:
        return "xmask" if b.dom == Domain.ROW else "rmask & xmask"

    def value_Full(self, b: Full) -> str:
        fill = self.literal(b.value) if isinstance(b.value, Const) else self(b.value)
        return f"tl.full({_shape(b.dom)}, {fill}, {TL_DTYPE[b.dtype]})"

    def value_Block(self, b: Block) -> str:
        return f"tl.broadcast_to({self(b.value)}, {_shape(b.dom)})"

    def value_Lanes(self, b: Lanes) -> str:
        return "tl.arange(0, RBLOCK)[None, :]"

    def literal(self, c: Const) -> str:
        """The constant as a Python literal (Triton types it as fp32, int32/int64 or i1)."""
        x = c.value
        if c.dtype == torch.bool:
            return "True" if x else "False"
        if c.dtype.is_floating_point:
            return (
                'float("nan")' if math.isnan(x) else ('float("inf")' if x > 0 else 'float("-inf")') if math.isinf(x) else repr(x)
            )
        return str(x)

    def value_Const(self, c: Const) -> str:
        dt = c.dtype
        if dt in (torch.bool, torch.float32) or (dt in (torch.int32, torch.int64) and -(2**31) <= c.value < 2**31):
            return self.literal(c)
        return f"tl.full([], {self.literal(c)}, {TL_DTYPE[dt]})"


def _shape(dom: Domain) -> str:
    return "[XBLOCK, 1]" if dom == Domain.ROW else "[XBLOCK, RBLOCK]"


@functools.lru_cache(maxsize=None)
def values(helpers: frozenset[str] | None) -> TritonValues:
    """The printer for kernel modules defining ``helpers`` (None: every helper)."""
    return TritonValues(helpers)


class TritonStatements(StatementPrinter):
    """Kernel statements (``ir/stmts.py``) as Triton lines (module docstring).  ``reduction``: the
    kernel has rows of ``RBLOCK`` elements; ``deps_of``: the kernel indices (``xindex``,
    ``rindex``) an offset varies with."""

    def __init__(self, values: "TritonValues", reduction: bool, deps_of):
        self.values, self.reduction, self.deps_of = values, reduction, deps_of

    def indices(self, dom: Domain) -> tuple[str, ...]:
        return ("xindex",) if dom == Domain.ROW else ("xindex", "rindex")

    def mask(self, dom: Domain) -> str:
        return self.values(Mask(dom))

    def block_shape(self, dom: Domain) -> str:
        if not self.reduction:
            return "[XBLOCK]"
        return "[XBLOCK, 1]" if dom == Domain.ROW else "[XBLOCK, RBLOCK]"

    def block(self, v: Value, dom: Domain) -> str:
        """``v`` as a block of the domain's shape (constants become ``tl.full``)."""
        shape = self.block_shape(dom)
        if isinstance(v, Const):
            return f"tl.full({shape}, {self.values.literal(v)}, {TL_DTYPE[v.dtype]})"
        return f"tl.broadcast_to({self.values(v)}, {shape})"

    def offset(self, e: sympy.Expr, dom: Domain) -> str:
        """An element offset as source: a block varying with every index of ``dom``."""
        out = TritonPrinter()(e)
        have = self.deps_of(e)
        for ix in self.indices(dom):
            if ix not in have:
                out += f" + 0 * {ix}"
        return out

    def nest(self, s: Nest, indent: str) -> list[str]:
        """The reduced elements' loop, a block at a time."""
        (loop,) = s.loops
        bounds = ", ".join(TritonPrinter()(b) for b in (loop.start, loop.stop, loop.step))
        head = f"{indent}for {loop.var} in range({bounds}):"
        return [head] + self.lines(s.body, indent + "    ")

    def stmt_Index(self, s: Index) -> str:
        return f"{s.name} = {TritonPrinter()(s.expr)}"

    def stmt_Load(self, s: Load) -> str:
        return f"{s.name} = tl.load({s.ptr} + ({self.offset(s.offset, s.dom)}), mask={self.mask(s.dom)}, other=0)"

    def stmt_Store(self, s: Store) -> str:
        return f"tl.store({s.ptr} + ({self.offset(s.offset, s.dom)}), {self.block(s.value, s.dom)}, mask={self.mask(s.dom)})"

    def stmt_Let(self, s: Let) -> str:
        return f"{s.name} = {self.values(s.value)}"

    def stmt_Set(self, s: Set) -> str:
        value, target = self.values(s.value), self.target(s.target)
        return f"{target} = {target} {s.op} {value}" if s.op else f"{target} = {value}"

    def stmt_Reduce(self, s: Reduce) -> str:
        """A fold step: ``acc = fn(acc, x)`` lane by lane, or ``tl.reduce`` across each row's lanes
        (a tuple reduction then keeps each result as a column of the block, a line each)."""
        fn, targets, args = COMBINE_FN[s.combine], ", ".join(s.targets), [self.values(a) for a in s.args]
        if not s.across:
            return f"{targets} = {fn}({', '.join([*s.targets, *args])})"
        if len(args) == 1:
            return f"{targets} = tl.reduce({args[0]}, 1, {fn}){'[:, None]' if s.keep else ''}"
        lines = [f"{targets} = tl.reduce(({', '.join(args)}), 1, {fn})"]
        return "\n".join(lines + ([f"{t} = {t}[:, None]" for t in s.targets] if s.keep else []))
