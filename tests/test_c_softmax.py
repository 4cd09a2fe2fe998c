"""``_softmax`` over the last dim as a C template (``codegen/c/templates.py``) and its gradient
split into a row kernel (``lowering/splits.py``): attention's weights in a training step, masked
rows (a weight of exactly 0 where eager's is), rows of infinities and NaN, strided rows,
refusals.  Every case compares with eager on fresh random inputs."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import fxforge
from fxforge.codegen.c import backend as c_backend, build
from fxforge.codegen.c.dtypes import ONE_THREAD_MAX_NUMEL
from fxforge.testing import profile

pytestmark = [pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
              pytest.mark.usefixtures("kernel_cache")]

sys.path.insert(0, os.path.dirname(__file__))
from c_helpers import compile_c, sources  # noqa: E402

aten = torch.ops.aten


def zeros_as_eager(got: torch.Tensor, want: torch.Tensor) -> bool:
    """A weight is 0 where eager's is, up to float32's subnormals (exp below -87.3: eager's may be
    a subnormal where this one is 0, or the other way round after the scaling)."""
    tiny = torch.finfo(torch.float32).tiny
    got, want = got.nan_to_num(1.0), want.nan_to_num(1.0)
    return bool((got[want == 0] < tiny).all() and (want[got == 0] < tiny).all())


def attention(q, k, v, mask):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("t", [16, 64, 37])
def test_causal_attention_step_runs_in_c(t, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, t, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    b, c = compile_c(attention)
    out = c(q, k, v, mask)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref = attention(q, k, v, mask)
    refs = torch.autograd.grad(ref, (q, k, v), g)
    torch.testing.assert_close(out, ref)
    for a, e in zip(grads, refs):
        torch.testing.assert_close(a, e)
    src = sources(b)
    assert "(template: softmax," in src
    assert "aten._softmax.out(" not in src and "aten._softmax_backward_data" not in src  # no ATen softmax call


def test_masked_weights_are_exactly_zero_and_special_rows_match_eager():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf] * 4, [0.0, inf, 1.0, 2.0], [nan, 1.0, 2.0, 3.0], [1.0, 2.0, -inf, 4.0],
                      [1e30, -1e30, 0.0, 3.0], [-1e30, -1e30, -1e30, -1e30], [0.0, -90.0, -200.0, -inf]])
    x = torch.cat([x, torch.randn(5, 4)])[torch.randperm(12)]
    b, c = compile_c(lambda x: torch.softmax(x, -1))
    got, want = c(x), torch.softmax(x, -1)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert zeros_as_eager(got, want)
    masked = (x == -inf) & ~(x == -inf).all(-1, keepdim=True)  # rows of -inf only are NaN, as eager's
    assert masked.any() and (got[masked] == 0).all()  # masked scores: exactly 0
    assert "(template: softmax," in b.compiled[0].source
    x = torch.randn(4, 100)
    x[1, 57] = x[2, 0] = nan
    x[3] = nan
    torch.testing.assert_close(c(x), torch.softmax(x, -1), equal_nan=True)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_strided_rows_and_leading_dims(op):
    """Rows read at their traced strides: a transposed input, a sliced one, three leading dims
    (the softmax template's, and the log-softmax's row kernels)."""
    fn = torch.softmax if op == "softmax" else F.log_softmax

    def f(a, b):
        return fn(a.transpose(0, 1), -1) + fn(b[:, 1:, :, ::2], -1).sum(0)

    a, b = torch.randn(12, 6), torch.randn(2, 4, 6, 24)
    b_, c = compile_c(f)
    torch.testing.assert_close(c(a, b), f(a, b))
    src = b_.compiled[0].source
    assert src.count("(template: softmax,") == 2 if op == "softmax" else "aten._log_softmax" not in src


def test_the_gradient_is_one_row_kernel():
    def f(x, w):
        return (torch.softmax(x @ w, -1) * 3).sum()

    x, w = torch.randn(32, 16), torch.randn(16, 24, requires_grad=True)
    b, c = compile_c(f)
    got = torch.autograd.grad(c(x, w), w)[0]
    torch.testing.assert_close(got, torch.autograd.grad(f(x, w), w)[0])
    bw = b.compiled[1]
    assert "aten._softmax_backward_data" not in bw.source
    assert not [n for n in bw.graph.graph.nodes if n.target == aten._softmax_backward_data.default]


def test_refusals_name_the_reason_and_run_atens_kernel():
    def f(x, y):
        return torch.softmax(x, 0) * 2, torch.softmax(y, -1) * 2

    x, y = torch.randn(6, 5), torch.randn(ONE_THREAD_MAX_NUMEL // 64 + 1, 64)
    b, c = compile_c(f)
    for got, want in zip(c(x, y), f(x, y)):
        torch.testing.assert_close(got, want)
    src = b.compiled[0].source
    assert "template: softmax" not in src and src.count("aten._softmax.out(") == 2
    why = {n.args[1]: c_backend.accepts(n, fxforge.Config(codegen="c"))
           for n in b.compiled[0].graph.graph.nodes if n.target == aten._softmax.default}
    assert "over the last dim only" in why[0] and f"over {ONE_THREAD_MAX_NUMEL} elements" in why[-1 if -1 in why else 1]
    # symbolic sizes: ATen's kernel
    b, c = compile_c(lambda x: torch.softmax(x, -1) * 3, dynamic=True)
    for n in (8, 5):
        x = torch.randn(n, 10)
        torch.testing.assert_close(c(x), torch.softmax(x, -1) * 3)
    assert "template: softmax" not in sources(b)


@settings(profile(), max_examples=15, deadline=None)
@given(rows=st.integers(1, 40), n=st.integers(1, 70), scale=st.sampled_from([0.1, 1.0, 30.0]),
       masked=st.booleans(), seed=st.integers(0, 2**16))
def test_random_rows_match_eager(rows, n, scale, masked, seed):
    torch.manual_seed(seed)
    x = torch.randn(rows, n, requires_grad=True)
    mask = torch.rand(rows, n) < 0.3 if masked else torch.zeros(rows, n, dtype=torch.bool)

    def f(x):
        return torch.softmax((x * scale).masked_fill(mask, float("-inf")), -1)

    b, c = compile_c(f)
    g = torch.randn(rows, n)
    out = c(x)
    grad = torch.autograd.grad(out, x, g)[0]
    ref = f(x)
    torch.testing.assert_close(out, ref, equal_nan=True)
    # the gradient is scaled by ``scale``: so is the rounding of its (g - sum) cancellation
    torch.testing.assert_close(grad, torch.autograd.grad(ref, x, g)[0], equal_nan=True, atol=1e-5 * scale, rtol=1e-4)
    assert zeros_as_eager(out.detach(), ref.detach())
    live = ~mask.all(-1, keepdim=True)  # rows with a score left (the others are NaN, as eager's)
    assert (out.detach()[mask & live] == 0).all()  # masked scores: exactly 0
