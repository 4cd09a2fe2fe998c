"""What every kernel language's printer shares: index expressions (sympy, Python floor
semantics) and kernel values (``values.py``) rendered as source.

Index expressions: sympy's ``FloorDiv``, ``ModularIndexing``, ``PythonMod`` and ``Mod`` mean
Python floor semantics; a language prints ``div``/``mod`` with the plain operator where both
operands are provably non-negative (where C-style and floor semantics agree) and with a sign
correction otherwise: a bare C ``%`` for a ``ModularIndexing`` of unknown sign would index the
wrong element.

Values: a language's ``ValuePrinter`` renders constants (``const``) and the vocabulary's
operations (``op``: None where the language lacks one); a composite op it does not render is
printed as its default expansion, and a primitive it lacks is refused (``Unsupported``, which
keeps the group out of that language's kernels).
"""

from __future__ import annotations

from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.printers import ExprPrinter

from ..pyexpr import ReadableArith, _delimited
from .stmts import Nest, Stmt
from .values import COMPOSITES, Block, Const, Elem, Full, Index, Mask, Op, Unsupported, Value, Var, expand


class IndexPrinter(ReadableArith, ExprPrinter):
    """Integer index expressions over symbols named by ``names`` (symbol -> source).

    torch's generic ``ExprPrinter`` (which refuses the float and Python-only functions a kernel
    index never needs) with the language's ``div``/``mod`` (floor semantics) and ``MAX``/``MIN``."""

    MAX = MIN = ""

    def __init__(self, names: dict[sympy.Symbol, str] | None = None):
        super().__init__()
        self.names = names if names is not None else {}

    def __call__(self, e: Any) -> str:
        """``e`` as source, parenthesized unless it is a name or a number: kernel code splices
        it into larger expressions."""
        return _delimited(sympy.sympify(e), self.doprint(sympy.sympify(e)))

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


class ValuePrinter:
    """Kernel values as source in one language (``language`` names it in refusals)."""

    language = ""

    def __init__(self, index: IndexPrinter):
        self.index = index

    def __call__(self, x: Value) -> str:
        if isinstance(x, Var):
            return x.name
        if isinstance(x, Const):
            return self.const(x)
        if isinstance(x, Index):
            return self.index(x.expr)
        if isinstance(x, Elem):
            return self.elem(x)
        if isinstance(x, (Mask, Full, Block)):
            return self.block(x)
        out = self.op(x, [self(a) for a in x.args])
        if out is not None:
            return out
        if x.op in COMPOSITES:
            return self(expand(x))
        raise Unsupported(f"{x.op} on {x.dtype} has no {self.language} lowering")

    def const(self, c: Const) -> str:
        raise NotImplementedError

    def elem(self, e: Elem) -> str:
        """An array element; a language without arrays leaves it refused."""
        raise Unsupported(f"{self.language} kernels have no arrays ({e.array})")

    def block(self, b: Mask | Full | Block) -> str:
        """A block language's mask, filled block or broadcast; the others refuse them."""
        raise Unsupported(f"{self.language} kernels have no blocks ({type(b).__name__})")

    def op(self, x: Op, args: list[str]) -> str | None:
        """``x`` with its arguments rendered as ``args``, or None where the language lacks it."""
        raise NotImplementedError


class StatementPrinter:
    """Kernel statements (``stmts.py``) as indented source lines: a language gives ``line`` (one
    statement) and ``nest`` (a nest's lines, its body through ``lines`` one level in)."""

    def lines(self, stmts: list[Stmt], indent: str = "") -> list[str]:
        out: list[str] = []
        for s in stmts:
            if isinstance(s, Nest):
                out += self.nest(s, indent)
            else:  # (a statement may print as several lines: a row reduction of a tuple)
                out += [indent + line for line in self.line(s).split("\n")]
        return out

    values: ValuePrinter

    def line(self, s: Stmt) -> str:
        raise NotImplementedError

    def nest(self, s: Nest, indent: str) -> list[str]:
        raise NotImplementedError

    def target(self, t: str | Elem) -> str:
        """What a ``Set`` updates: a local's name, or an array element as the values print it."""
        return t if isinstance(t, str) else self.values(t)
