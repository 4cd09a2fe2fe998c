"""What every kernel language's printer shares: index expressions (sympy, Python floor
semantics) and kernel values (``values.py``) rendered as source.

Index expressions: sympy's ``FloorDiv``, ``ModularIndexing``, ``PythonMod`` and ``Mod`` mean
Python floor semantics; a language prints ``div``/``mod`` with the plain operator where both
operands are provably non-negative (where C-style and floor semantics agree) and with a sign
correction otherwise: a bare C ``%`` for a ``ModularIndexing`` of unknown sign would index the
wrong element.

Values and statements: a language's ``ValuePrinter`` and ``StatementPrinter`` print each kind of
value or statement by a method named after it (``value_Const``, ``stmt_Load``), the vocabulary's
operations by a table (``OPS``: op -> ``OpRule``); a composite op without a rule is printed as
its default expansion, a primitive or a kind of value without one is refused (``Unsupported``,
which keeps the group out of that language's kernels).
"""

from __future__ import annotations

from typing import Callable, Union

import sympy
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.printers import ExprPrinter

from ..pyexpr import ReadableArith, Spliced
from .stmts import Nest, Stmt
from .values import COMPOSITES, Call, Const, Elem, Index, Op, Unsupported, Value, Var, expand


class IndexPrinter(Spliced, ReadableArith, ExprPrinter):
    """Integer index expressions over symbols named by ``names`` (symbol -> source).

    torch's generic ``ExprPrinter`` (which refuses the float and Python-only functions a kernel
    index never needs) with the language's ``div``/``mod`` (floor semantics) and ``MAX``/``MIN``."""

    MAX = MIN = ""

    def _print_Symbol(self, expr) -> str:
        return self.names.get(expr, expr.name)

    def _print_Mul(self, expr) -> str:
        if any(not a.is_Integer and a.is_Rational for a in expr.args):
            raise NotImplementedError(f"non-integer index expression {expr}")
        return super()._print_Mul(expr)

    def _print_Rational(self, expr) -> str:
        raise NotImplementedError(f"non-integer index expression {expr}")

    def _print_Float(self, expr) -> str:
        raise NotImplementedError(f"non-integer index expression {expr}")

    def _print_FloorDiv(self, expr) -> str:
        return self.div(*expr.args)

    def _print_CleanDiv(self, expr) -> str:
        return self.div(*expr.args)

    def _print_CeilDiv(self, expr) -> str:
        a, b = expr.args
        return f"(-{self.div(-a, b)})"

    def _print_ModularIndexing(self, expr) -> str:
        x, d, m = expr.args
        return self.mod(FloorDiv(x, d) if d != 1 else x, m)

    def _print_PythonMod(self, expr) -> str:
        return self.mod(*expr.args)

    def _print_Mod(self, expr) -> str:
        return self.mod(*expr.args)

    def _print_Max(self, expr) -> str:
        return self._fold(self.MAX, expr.args)

    def _print_Min(self, expr) -> str:
        return self._fold(self.MIN, expr.args)

    def _fold(self, fn: str, args) -> str:
        out = self._print(args[0])
        for a in args[1:]:
            out = f"{fn}({out}, {self._print(a)})"
        return out

    def _operand(self, e: sympy.Expr) -> str:
        """``e`` as an operand of ``/`` or ``%`` (what a printer makes of a function is already
        delimited)."""
        s = self._print(e)
        return f"({s})" if e.is_Add or e.is_Mul or e.is_Pow else s

    def div(self, a: sympy.Expr, b: sympy.Expr) -> str:
        raise NotImplementedError

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        raise NotImplementedError


# How a language prints one op of the vocabulary: a format of its printed arguments
# (``"({0} + {1})"``), or a function of the printer, the op and its printed arguments giving the
# source, or None where the language lacks the op for this dtype.
OpRule = Union[str, Callable[["ValuePrinter", Op, list[str]], "str | None"]]


def rule(printer: "ValuePrinter", x: Op, args: list[str]) -> str | None:
    """``x`` printed by its rule in ``printer.OPS`` (None: the language has none)."""
    r = printer.OPS.get(x.op)
    if r is None:
        return None
    return r.format(*args) if isinstance(r, str) else r(printer, x, args)


class ValuePrinter:
    """Kernel values as source in one language (``language`` names it in refusals).

    One dispatch shape for every language: a value of type ``T`` prints by the printer's
    ``value_T`` method (a language without one refuses such values: C has no blocks, Triton no
    arrays), an op by its rule in ``OPS`` (op name -> ``OpRule``); a composite op without a rule
    prints as its default expansion, a primitive without one is refused."""

    language = ""
    OPS: dict[str, OpRule] = {}

    def __init__(self, index: IndexPrinter):
        self.index = index

    def __call__(self, x: Value) -> str:
        method = getattr(self, "value_" + type(x).__name__, None)
        if method is None:
            raise Unsupported(f"{self.language} kernels have no {type(x).__name__} values ({x!r})")
        return method(x)

    def value_Var(self, x: Var) -> str:
        return x.name

    def value_Index(self, x: Index) -> str:
        return self.index(x.expr)

    def value_Call(self, x: Call) -> str:
        return f"{x.fn}({', '.join(self(a) for a in x.args)})"

    def value_Const(self, c: Const) -> str:
        raise NotImplementedError

    def value_Op(self, x: Op) -> str:
        out = rule(self, x, [self(a) for a in x.args])
        if out is not None:
            return out
        if x.op in COMPOSITES:
            return self(expand(x))
        raise Unsupported(f"{x.op} on {x.dtype} has no {self.language} lowering")


class StatementPrinter:
    """Kernel statements (``stmts.py``) as indented source lines: a statement of type ``T`` prints
    by the language's ``stmt_T`` method (one statement, possibly several lines), a nest by its
    ``nest`` (its lines, its body through ``lines`` one level in)."""

    values: ValuePrinter

    def lines(self, stmts: list[Stmt], indent: str = "") -> list[str]:
        out: list[str] = []
        for s in stmts:
            if isinstance(s, Nest):
                out += self.nest(s, indent)
            else:  # (a statement may print as several lines: a row reduction of a tuple)
                out += [indent + line for line in self.line(s).split("\n")]
        return out

    def line(self, s: Stmt) -> str:
        method = getattr(self, "stmt_" + type(s).__name__, None)
        if method is None:
            raise TypeError(f"not a {self.values.language} kernel statement: {s!r}")
        return method(s)

    def nest(self, s: Nest, indent: str) -> list[str]:
        raise NotImplementedError

    def target(self, t: str | Elem) -> str:
        """What a ``Set`` updates: a local's name, or an array element as the values print it."""
        return t if isinstance(t, str) else self.values(t)
