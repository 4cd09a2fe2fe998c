"""sympy index expressions -> Triton source, with Python (floor) semantics.

Triton's ``//`` and ``%`` on integers are C-style (truncate toward zero; the remainder takes the
dividend's sign).  sympy's ``FloorDiv``, ``ModularIndexing``, ``PythonMod`` and ``Mod`` mean
Python floor semantics.  Where both operands are provably non-negative the two agree and the
plain operator is printed; otherwise the printer emits a sign correction (``floor_div`` /
``floor_mod`` below, also used for tensor *values* by the op table).  Inductor's printer emits a
bare C ``%`` for ``ModularIndexing`` of unknown sign (DESIGN.md §5); this one does not.
"""

from __future__ import annotations

from typing import Any

import sympy
from torch.utils._sympy.functions import (
    CeilDiv,
    CleanDiv,
    FloorDiv,
    ModularIndexing,
    PythonMod,
)


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


class TritonPrinter:
    """Prints integer index expressions over symbols named by ``names`` (symbol -> source)."""

    def __init__(self, names: dict[sympy.Symbol, str] | None = None):
        self.names = names if names is not None else {}

    def __call__(self, e: Any) -> str:
        return self.p(sympy.sympify(e))

    def p(self, e: sympy.Basic) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return self.names.get(e, e.name)
        if e.is_Add:
            terms = sorted(e.args, key=lambda t: (t.is_number, sympy.default_sort_key(t)))
            out = self.p(terms[0])
            for t in terms[1:]:
                c, _ = t.as_coeff_Mul()
                out += f" - {self.p(-t)}" if c.is_number and c < 0 else f" + {self.p(t)}"
            return f"({out})"
        if e.is_Mul:
            c, rest = e.as_coeff_Mul()
            if c == -1:
                return f"(-{self.p(rest)})"
            if any(not a.is_Integer and a.is_Rational for a in e.args):
                raise NotImplementedError(f"non-integer index expression {e}")
            return "(" + " * ".join(self.p(a) for a in e.args) + ")"
        if e.is_Pow:
            base, exp = e.args
            if exp.is_Integer and exp > 0:
                return "(" + " * ".join([self.p(base)] * int(exp)) + ")"
            raise NotImplementedError(f"cannot print power {e} as a Triton index")
        if isinstance(e, (FloorDiv, CleanDiv)):
            a, b = e.args
            return self.div(a, b)
        if isinstance(e, CeilDiv):
            a, b = e.args
            return f"(-{self.div(-a, b)})"
        if isinstance(e, ModularIndexing):
            x, d, m = e.args
            q = FloorDiv(x, d) if d != 1 else x
            return self.mod(q, m)
        if isinstance(e, (PythonMod, sympy.Mod)):
            return self.mod(*e.args)
        if isinstance(e, (sympy.Max, sympy.Min)) or type(e).__name__ in ("Max", "Min"):
            fn = "tl.maximum" if "Max" in type(e).__name__ else "tl.minimum"
            out = self.p(e.args[0])
            for a in e.args[1:]:
                out = f"{fn}({out}, {self.p(a)})"
            return out
        raise NotImplementedError(f"cannot print index expression {e} ({type(e).__name__}) for Triton")

    def div(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if b == 1:
            return self.p(a)
        if _nonneg(a) and _nonneg(b):
            return f"({self.p(a)} // {self.p(b)})"
        return floor_div(self.p(a), self.p(b))

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if b == 1:
            return "0"
        if _nonneg(a) and _nonneg(b):
            return f"({self.p(a)} % {self.p(b)})"
        return floor_mod(self.p(a), self.p(b))
