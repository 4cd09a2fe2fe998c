"""Coordinate arithmetic folded by the loop indices' ranges (fxforge/codegen/indexing.py): every
folded form equals the division it replaces at every point of the ranges, and the C kernels that
walk one shape while reading another keep no division the ranges make exact."""

from __future__ import annotations

import itertools
import re

import pytest
import sympy
import torch
from hypothesis import given, settings, strategies as st

import fxforge
from fxforge.codegen.c import build
from fxforge.codegen.indexing import floor_div, linear_in, modular
from torch.utils._sympy.functions import FloorDiv

SYMS = sympy.symbols("a b c", integer=True, nonnegative=True)


@st.composite
def linear_forms(draw):
    bounds = {s: draw(st.integers(1, 9)) for s in SYMS}
    coeffs = [draw(st.sampled_from([0, 1, 2, 3, 4, 5, 8, 12, 16, 32, 64])) for _ in SYMS]
    const = draw(st.sampled_from([0, 0, 1, 3, 16]))
    return const + sum(c * s for c, s in zip(coeffs, SYMS)), bounds


@settings(max_examples=200, deadline=None)
@given(linear_forms(), st.sampled_from(["none", "product", "division", "symbolic"]))
def test_linear_coefficients_are_the_derivatives_or_none(form, extra):
    e, _ = form
    a, b, c = SYMS
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    e = e + {"none": 0, "product": a * b, "division": FloorDiv(a, 3), "symbolic": s0 * c}[extra]
    got = linear_in(e, (a, b))
    derivatives = [sympy.diff(e, v) for v in (a, b)]
    if all(d.is_Integer for d in derivatives):
        assert got is not None, e
        coeffs, rest = got
        assert [coeffs[a], coeffs[b]] == [int(d) for d in derivatives]
        assert sympy.expand(rest + coeffs[a] * a + coeffs[b] * b - e) == 0 and not rest.has(a, b)
    else:  # a variable under a product or a division: not linear
        assert got is None, (e, got)


@settings(max_examples=300, deadline=None)
@given(linear_forms(), st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128]), st.sampled_from([2, 3, 4, 5, 8, 16]))
def test_folded_divisions_equal_the_divisions_everywhere_in_range(form, div, mod):
    e, bounds = form
    q, m = floor_div(e, div, bounds.get), modular(e, div, mod, bounds.get)
    for values in itertools.product(*(range(bounds[s]) for s in SYMS)):
        env = dict(zip(SYMS, values))
        v = int(e.subs(env))
        if q is not None:
            assert int(q.subs(env)) == v // div, (e, div, q, env)
        if m is not None:
            assert int(m.subs(env)) == v // div % mod, (e, div, mod, m, env)


def test_what_folds_and_what_does_not():
    r, x = sympy.symbols("r x", integer=True, nonnegative=True)
    bounds = {r: 512, x: 16}.get
    f = 16 * r + x
    assert floor_div(f, 16, bounds) == r
    assert modular(f, 1, 16, bounds) == x
    assert str(floor_div(f, 1024, bounds)) == "(r//64)"
    assert str(modular(f, 16, 64, bounds)) == "ModularIndexing(r, 1, 64)"  # f // 16 % 64 = r % 64
    assert floor_div(f, 8, bounds) is None  # x spans past 8: no exact fold
    assert floor_div(f, 16, {r: 512}.get) is None  # x's range unknown (a Triton block's lanes)
    assert floor_div(r - x, 4, bounds) is None  # a negative coefficient


@pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine")
@pytest.mark.usefixtures("kernel_cache")
def test_a_column_sum_of_a_transposed_value_divides_no_lane_index():
    """The bias gradient of a linear layer applied over a transposed activation: the C kernel
    walks rows of the sum's input and reads the transposed value; its coordinates are loop
    variables (and divisions of the uniform reduced index), never divisions of a lane's index."""

    def f(x):
        t = x.transpose(1, 2).contiguous()  # [8, 64, 16] read from [8, 16, 64]
        return t, t.view(-1, 16).sum(0)

    x = torch.randn(8, 16, 64)
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    got = torch.compile(f, backend=b, fullgraph=True)(x)
    for g, w in zip(got, f(x)):
        torch.testing.assert_close(g, w)
    (c,) = b.compiled
    kernel = next(k for k in c.kernels if k.backend == "c")
    src = c.source.split(f"# C kernel {kernel.name}_c", 1)[1].split(f"\n{kernel.name}", 1)[0]
    assert not re.search(r"\b(f\d+|xi\d+)\s*[/%]", src), src  # no lane's index divided
    assert re.search(r"\bri\w*\s*[/%]", src), src  # the reduced index is: this kernel is the case
