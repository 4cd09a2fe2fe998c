"""Exact simplification of a kernel's coordinate arithmetic, given the ranges of its loop variables.

A kernel walking one shape while reading a value laid out in another decomposes a flat index into
coordinates: ``f // inner % size``.  When the flat index is a sum of loop variables times
coefficients (``f = 16*r + x`` with ``0 <= x < 16``), most of those divisions fold away:
``f // 16 = r``, ``f % 16 = x``, ``f // 1024 = r // 64``.  In C, a division or a remainder left in
a vectorized loop is several instructions a lane (no 64-bit vector division); folded, the loop
keeps only what the layouts need.

The rules hold for sums ``c0 + sum(c_i * v_i)`` with non-negative integer coefficients and every
``v_i`` in ``[0, bound(v_i))``; anything else is left as it is (``None``).
"""

from __future__ import annotations

from typing import Callable

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

Bound = Callable[[sympy.Symbol], "int | None"]


def _terms(e: sympy.Expr, bound: Bound) -> list[tuple[int, sympy.Symbol | None, int]] | None:
    """``e`` as (coefficient, variable or None for the constant, the variable's bound)."""
    out = []
    for t in sympy.Add.make_args(sympy.expand(e)):
        c, rest = t.as_coeff_Mul()
        if not c.is_Integer or int(c) < 0:
            return None
        if rest == 1:
            out.append((int(c), None, 1))
            continue
        if not rest.is_Symbol:
            return None
        b = bound(rest)
        if b is None or b < 1:
            return None
        out.append((int(c), rest, b))
    return out


def _span(terms) -> int:
    """The largest value of the sum of ``terms`` (its smallest is the constant, >= 0)."""
    return sum(c * (b - 1) if v is not None else c for c, v, b in terms)


def _sum(terms, divisor: int = 1) -> sympy.Expr:
    return sympy.Add(*[sympy.Integer(c // divisor) * (v if v is not None else 1) for c, v, _ in terms])


def floor_div(e: sympy.Expr, d: int, bound: Bound) -> sympy.Expr | None:
    """``e // d`` without a division where the ranges allow: the terms whose coefficients a
    divisor ``a`` of ``d`` divides, over ``a``, then divided by ``d / a``, when the other terms
    sum to less than ``a``."""
    terms = _terms(e, bound)
    if terms is None or d < 1:
        return None
    if _span(terms) < d:
        return sympy.Integer(0)
    for a in reversed([a for a in sympy.divisors(d) if a > 1]):
        big = [t for t in terms if t[0] % a == 0]
        small = [t for t in terms if t[0] % a != 0]
        if _span(small) >= a:
            continue
        q, k = _sum(big, a), d // a
        if k == 1:
            return q
        qt = _terms(q, bound)
        return sympy.Integer(0) if qt is not None and _span(qt) < k else FloorDiv(q, k)
    return None


def modular(e: sympy.Expr, div: int, mod: int, bound: Bound) -> sympy.Expr | None:
    """``e // div % mod``: the quotient as ``floor_div`` makes it, less its terms that ``mod``
    divides; no remainder at all when what is left stays below ``mod``."""
    q = floor_div(e, div, bound) if div != 1 else e
    terms = _terms(q, bound) if q is not None else None
    if terms is None:
        return None
    kept = [t for t in terms if t[0] % mod != 0]
    if _span(kept) < mod:
        return _sum(kept)
    if div == 1 and len(kept) == len(terms):
        return None  # nothing folded
    return ModularIndexing(_sum(kept), 1, mod)


def linear_in(e: sympy.Expr, variables: tuple[sympy.Symbol, ...]) -> tuple[dict[sympy.Symbol, int], sympy.Expr] | None:
    """``e`` as ``sum(c_v * v) + rest``: each of ``variables``' integer coefficient (its
    derivative, read off the sum's terms without differentiating) and the rest, free of them;
    None where one of them appears otherwise (times a symbol, under a division or a power)."""
    coeffs = dict.fromkeys(variables, 0)
    rest = []
    for t in sympy.Add.make_args(e):
        c, v = t.as_coeff_Mul()
        if v in coeffs and c.is_Integer:
            coeffs[v] += int(c)
        elif any(x in coeffs for x in t.free_symbols):
            return None
        else:
            rest.append(t)
    return coeffs, sympy.Add(*rest)
