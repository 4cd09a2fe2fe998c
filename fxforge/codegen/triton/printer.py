"""sympy index expressions -> Triton source, with Python (floor) semantics.

Triton's ``//`` and ``%`` on integers are C-style (truncate toward zero; the remainder takes the
dividend's sign).  sympy's ``FloorDiv``, ``ModularIndexing``, ``PythonMod`` and ``Mod`` mean
Python floor semantics.  Where both operands are provably non-negative the two agree and the
plain operator is printed; otherwise the printer emits a sign correction (``floor_div`` /
``floor_mod`` below, also used for tensor *values* by the op table): a bare C ``%`` for a
``ModularIndexing`` of unknown sign would index the wrong element.
"""

from __future__ import annotations

from typing import Any

import sympy
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.printers import ExprPrinter

from ..pyexpr import ReadableArith, _delimited


def floor_div(a: str, b: str) -> str:
    """Python ``a // b`` on Triton integers (operands may be negative)."""
    q, r = f"({a} // {b})", f"({a} % {b})"
    return f"tl.where(({r} != 0) & (({a} < 0) != ({b} < 0)), {q} - 1, {q})"


def floor_mod(a: str, b: str) -> str:
    """Python ``a % b`` on Triton integers or floats: the result takes the divisor's sign."""
    r = f"({a} % {b})"
    return f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})"


def _nonneg(e: sympy.Basic) -> bool:
    return bool(e.is_nonnegative)


class TritonPrinter(ReadableArith, ExprPrinter):
    """Integer index expressions over symbols named by ``names`` (symbol -> source), as Triton.

    torch's generic ``ExprPrinter`` (which refuses the float and Python-only functions a kernel
    index never needs) with floor semantics for ``//`` and ``%`` (see the module docstring) and
    ``tl.maximum``/``tl.minimum`` for ``Max``/``Min``."""

    def __init__(self, names: dict[sympy.Symbol, str] | None = None):
        super().__init__()
        self.names = names if names is not None else {}

    def __call__(self, e: Any) -> str:
        """``e`` as source, parenthesized unless it is a name or a number: kernel code splices
        it into larger expressions (``acc / {rnumel}``, ``{rnumel}.to(tl.float32)``)."""
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

    def _print_Pow(self, expr) -> str:
        base, exp = expr.args
        if not (exp.is_Integer and exp > 0):
            raise NotImplementedError(f"cannot print power {expr} as a Triton index")
        return super()._print_Pow(expr)

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
        return self._fold("tl.maximum", expr.args)

    def _print_Min(self, expr) -> str:
        return self._fold("tl.minimum", expr.args)

    def _fold(self, fn: str, args) -> str:
        out = self._print(args[0])
        for a in args[1:]:
            out = f"{fn}({out}, {self._print(a)})"
        return out

    def _operand(self, e: sympy.Expr) -> str:
        """``e`` as an operand of ``//`` or ``%`` (what this printer makes of a function is
        already delimited: ``(x // y)``, ``tl.where(...)``)."""
        s = self._print(e)
        return f"({s})" if e.is_Add or e.is_Mul or e.is_Pow else s

    def div(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if b == 1:
            return self._print(a)
        if _nonneg(a) and _nonneg(b):
            return f"({self._operand(a)} // {self._operand(b)})"
        return floor_div(self._operand(a), self._operand(b))

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if b == 1:
            return "0"
        if _nonneg(a) and _nonneg(b):
            return f"({self._operand(a)} % {self._operand(b)})"
        return floor_mod(self._operand(a), self._operand(b))
