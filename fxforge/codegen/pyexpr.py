"""Printing sympy size expressions and FX node arguments as Python source for the wrapper."""

from __future__ import annotations

import math
from typing import Any, Callable

import sympy
import torch
import torch.fx as fx
from sympy.printing.precedence import PRECEDENCE
from torch.utils._sympy.printers import PythonPrinter


class Spliced:
    """A printer called on an expression (``names``: the source of each symbol): its source, safe
    to splice into a larger expression (``_delimited``).  Integers at once; another expression is
    printed once per printer while the symbols it names stay as many (``names`` only grows, and a
    symbol printed by name keeps it)."""

    def __init__(self, names: dict[sympy.Symbol, str] | None = None):
        super().__init__()
        self.names = names if names is not None else {}
        self.printed: dict = {}

    def __call__(self, e: Any) -> str:
        if type(e) is not int:
            e = sympy.sympify(e)
            if e.is_Integer:
                e = int(e)
        if type(e) is int:
            return str(e) if e >= 0 else f"({e})"
        key = (e, len(self.names))
        text = self.printed.get(key)
        if text is None:
            text = self.printed[key] = _delimited(e, self.doprint(e))
        return text


def _delimited(e: sympy.Basic, text: str) -> str:
    """``text`` (what a printer made of ``e``) safe to splice into a larger expression."""
    if e.is_Symbol or (e.is_Integer and int(e) >= 0) or _enclosed(text):
        return text
    return f"({text})"


def _enclosed(text: str) -> bool:
    """``text`` is one parenthesized whole: ``(a // b)``, not ``(a) + (b)``."""
    if not text.startswith("("):
        return False
    depth = 0
    for i, c in enumerate(text):
        depth += c == "("
        depth -= c == ")"
        if depth == 0:
            return i == len(text) - 1
    return False


class ReadableArith:
    """Sums and products printed as people write them: ``s0 - 3``, ``-s0``, ``2*s0``."""

    def _print_Add(self, expr, order=None) -> str:
        terms = sorted(expr.args, key=lambda t: (t.is_number, sympy.default_sort_key(t)))
        out = self._print(terms[0])
        for t in terms[1:]:
            c, _ = t.as_coeff_Mul()
            if c.is_number and c < 0:
                out += f" - {self.parenthesize(-t, PRECEDENCE['Add'])}"
            else:
                out += f" + {self.parenthesize(t, PRECEDENCE['Add'])}"
        return out

    def _print_Mul(self, expr) -> str:
        c, rest = expr.as_coeff_Mul()
        if c == -1:
            return f"-{self.parenthesize(rest, PRECEDENCE['Mul'])}"
        return super()._print_Mul(expr)


class PyExprPrinter(Spliced, ReadableArith, PythonPrinter):
    """sympy -> Python source over the wrapper's names for the size symbols (``names``).

    torch's ``PythonPrinter`` with fxforge's conventions: Python floor semantics for ``//`` and
    ``%`` (exactly what Python ints do), plain ``float()`` for ``ToFloat``, and an unbound symbol
    is an error rather than a name that might resolve to something else at run time."""

    def _print_Symbol(self, expr) -> str:
        if expr not in self.names:
            raise KeyError(f"symbol {expr} is not bound in the generated code")
        return self.names[expr]

    def _print_ToFloat(self, expr) -> str:
        return f"float({self._print(expr.args[0])})"

    def _print_Rational(self, expr) -> str:
        return f"({expr.p} / {expr.q})"


_SIMPLE_CONSTS = (torch.dtype, torch.layout, torch.memory_format)


def literal(v: Any) -> str | None:
    """Python source for a constant argument, or None when it needs to be a global."""
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    if isinstance(v, _SIMPLE_CONSTS):
        return str(v)  # "torch.float32", "torch.strided", "torch.contiguous_format"
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    return None


def format_arg(a: Any, ref: Callable[[fx.Node], str], const: Callable[[Any], str]) -> str:
    """Source for an FX argument: nodes through ``ref``, odd constants through ``const``."""
    if isinstance(a, fx.Node):
        return ref(a)
    if isinstance(a, tuple):
        inner = ", ".join(format_arg(x, ref, const) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(format_arg(x, ref, const) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {format_arg(v, ref, const)}" for k, v in a.items()) + "}"
    s = literal(a)
    return s if s is not None else const(a)


def format_call(fn: str, args, kwargs, ref, const) -> str:
    parts = [format_arg(a, ref, const) for a in args]
    parts += [f"{k}={format_arg(v, ref, const)}" for k, v in kwargs.items()]
    return f"{fn}({', '.join(parts)})"
