"""The ``c`` codegen backend (fused C kernels for CPU graphs, docs/c.md): results match eager.

Every case compiles with ``Config(codegen="c", debug=True)`` (``fullgraph=True``: a graph break
would run eager and prove nothing) and compares with eager on fresh random inputs.  Besides the
values, the cases check where the nodes ran: fused chains are few ``c`` kernels, ops without a C
lowering are the ``torch`` backend's extern calls in the same graph (never eager fallbacks).

The backend keeps ATen's composite kernels (``decompose="none"``: softmax and the layer norm's
backward run as ATen calls; layer norm is split, GELU and the pointwise backward kernels are
lowered directly); the fused row reductions the others decompose into are tested with
``Config(decompose="core")`` (``CORE``).  Column reductions (the last dim kept: bias gradients)
are C kernels too.
The C kernels' shared objects are cached in one directory per test session
(``$FXFORGE_TEST_CACHE``, shared with the Triton tests' kernels when both run).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F
from hypothesis import given, settings
from torch.fx.experimental.proxy_tensor import make_fx

import fxforge
from fxforge.codegen.c import abi, backend as c_backend, build, kernel as kernel_module, launcher, schedule
from fxforge.codegen.ir import stmts
from fxforge.spine import compile_graph
from fxforge.core.graph import BACKEND
from fxforge.core.regions import CAT
from fxforge.testing import check_pass, graphs, profile

pytestmark = [pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
              pytest.mark.usefixtures("kernel_cache")]

C = fxforge.Config(codegen="c", debug=True)
CORE = fxforge.Config(codegen="c", debug=True, decompose="core")  # softmax, layer norm... as fused C rows

for _knob in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _knob):
        setattr(torch._dynamo.config, _knob, 100_000)


def run_compiled(fn, *args, dynamic=False, config=None):
    """``(backend, result)``: ``fn(*args)`` compiled with codegen="c" (fullgraph, debug)."""
    torch._dynamo.reset()
    b = fxforge.backend(config or C)
    return b, torch.compile(fn, backend=b, fullgraph=True, dynamic=dynamic)(*args)


def kernels(b, backend: str = "c") -> list:
    return [k for c in b.compiled for k in c.kernels if k.backend == backend]


def backends(b) -> set[str]:
    return {k.backend for c in b.compiled for k in c.kernels}


def fallbacks(b) -> dict:
    out = {}
    for c in b.compiled:
        out.update(c.stats["fallbacks"])
    return out


def outside_c(b) -> list[tuple[str, str]]:
    """``(op, why)`` of each compute node not in a C kernel (the C backend's refusal)."""
    out = []
    for c in b.compiled:
        for g in c.plan.groups:
            for n in g.nodes:
                if n.meta.get(BACKEND) != "c":
                    out.append((str(n.target), c_backend.accepts(n, C)))
    return out


def check(fn, *args, c_only=True, atol=None, rtol=None, dynamic=False, config=None):
    """Compile ``fn``, compare with eager (NaNs equal), return the backend.  ``c_only``: every
    kernel is a C kernel; otherwise at least one is.  Never an eager fallback."""
    b, out = run_compiled(fn, *args, dynamic=dynamic, config=config)
    exp = fn(*args)
    torch.testing.assert_close(out, exp, atol=atol, rtol=rtol, equal_nan=True)
    assert kernels(b), "no C kernel ran"
    if c_only:
        assert backends(b) == {"c"}, outside_c(b)
    assert not fallbacks(b), fallbacks(b)
    assert all(c.stats["fallback_nodes"] == 0 for c in b.compiled)
    return b


def _layer_norm_gelu_residual(x, w, bias, r):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, bias)) + r


def _layer_norm(a, w, b):
    var, mean = torch.var_mean(a, -1, correction=0, keepdim=True)
    return (a - mean) * torch.rsqrt(var + 1e-5) * w + b


def _softmax(a):
    m = a.amax(-1, keepdim=True)
    e = (a - m).exp()
    return e / e.sum(-1, keepdim=True)


# --------------------------------------------------------------------------- fused chains


def test_layer_norm_gelu_residual_is_one_c_kernel():
    x, w, bias, r = torch.randn(8, 16, 64), torch.randn(64), torch.randn(64), torch.randn(8, 16, 64)
    b = check(_layer_norm_gelu_residual, x, w, bias, r, config=CORE)
    (k,) = kernels(b)
    assert k.node_count >= 8  # var_mean, getitems, sub, rsqrt, mul, affine, gelu, residual
    src = b.compiled[0].source
    assert "fx_erff" in src and "double sum" in src  # erf from the prelude; the moments in double
    assert "#pragma omp simd reduction(+:" in src
    # by default the layer norm may stay ATen's kernel; GELU and the residual are one C kernel
    b = check(_layer_norm_gelu_residual, x, w, bias, r, c_only=False)
    (k,) = kernels(b)
    assert k.node_count >= 2
    assert {op for op, _ in outside_c(b)} <= {"aten.native_layer_norm.default"}, outside_c(b)


@pytest.mark.parametrize("dim", [-1, 1])
def test_softmax_one_kernel(dim):
    x = torch.randn(6, 33) * 4
    b = check(lambda a: torch.softmax(a, dim), x, config=CORE)
    assert len(kernels(b)) == 1
    b = check(lambda a: torch.softmax(a * 0.5, dim) - 1, x, c_only=False)  # by default ATen's softmax may stay
    assert {op for op, _ in outside_c(b)} <= {"aten._softmax.default"}, outside_c(b)
    b = check(_softmax, torch.randn(4, 5, 40))  # written out: one C kernel by default
    assert len(kernels(b)) == 1 and kernels(b)[0].node_count >= 5


def test_log_free_losses():
    x, y = torch.randn(7, 19), torch.randn(7, 19)
    b = check(lambda a, t: (F.mse_loss(a, t), F.l1_loss(a, t, reduction="sum"), F.smooth_l1_loss(a, t),
                            F.huber_loss(a, t, reduction="none", delta=0.5)), x, y, config=CORE)
    assert len(kernels(b)) <= 4
    check(lambda a, t: F.mse_loss(a, t, reduction="none").mean(-1), x, y, config=CORE)
    check(lambda a, t: ((a - t) ** 2).mean(), x, y)  # written out: C kernels by default


def test_row_reductions_over_the_last_dims():
    x = torch.randn(5, 6, 7)
    check(lambda a: (a.sum(-1), a.mean(-1), a.amax(-1), a.amin(-1), a.prod(-1), torch.var_mean(a, -1),
                     a.var(-1, correction=0), a.var(-1)), x, atol=1e-5, rtol=1e-5)
    check(lambda a: (a.std(-1), torch.std_mean(a, -1, keepdim=True)), x, config=CORE)  # ATen's composites by default
    check(lambda a: (a.sum((-2, -1)), a.mean((1, 2), keepdim=True), a.amax((-2, -1)), a.amin((1, 2), keepdim=True),
                     torch.var_mean(a, (1, 2), keepdim=True), a.sum()), x, atol=1e-5, rtol=1e-5)
    check(lambda a: (a.sum(-1, keepdim=True), a.amax(-1, keepdim=True) - a, a.prod(-1, keepdim=True)), x)
    # a sum over a row of 4096 float32 values: accumulated in double, rounded once
    big = torch.randn(3, 4096) + 10
    check(lambda a: (a.sum(-1), a.mean(-1), torch.var_mean(a, -1)), big, atol=1e-5, rtol=1e-6)
    xi = torch.randint(-4, 5, (4, 9))
    check(lambda a: (a.sum(-1), a.amax(-1), a.amin(-1, keepdim=True), a.prod(-1)), xi)
    check(lambda a: ((a > 0).any(-1), (a > -3).all(-1), (a > 0).sum(-1)), xi)


def test_broadcasting_reads():
    x, w, col = torch.randn(8, 16, 64), torch.randn(64), torch.randn(16, 1)
    b = check(lambda a, w, c: ((a * w + c).relu() - c) * w, x, w, col)
    assert len(kernels(b)) == 1
    check(lambda a, w, c: ((a + w) * c).sum(-1) + c.squeeze(-1), x, w, col)  # a row reduction of broadcast reads
    check(lambda s, a: a * s + 1, torch.randn(()), torch.randn(3, 5))  # a 0-d tensor
    check(lambda a, b: a[:, None, :] * b[None, :, :], torch.randn(3, 5), torch.randn(4, 5))


def test_non_contiguous_inputs():
    x = torch.randn(12, 20)
    check(lambda a: a.t() * 2 + 1, x)
    check(lambda a: a.t().exp().sum(-1), x)  # rows along a stride-20 dim
    check(lambda a: a[:, 1:7] + a[:, 5:11], x)  # storage offsets
    check(lambda a: a[1:, ::3] * a[:-1, 1::3], x[:, :18])  # steps and offsets
    check(lambda a: a.amax(-1), x[2::2, 3::2])
    base = torch.randn(200)
    check(lambda a: torch.tanh(a) * a, base[5:].as_strided((6, 7), (1, 9), 5))  # an input view with an offset
    check(lambda a, b: a + b, torch.randn(4, 5, 6).permute(2, 0, 1), torch.randn(6, 4, 5))


def test_integer_and_bool_ops():
    a, b = torch.randint(-50, 50, (6, 9)), torch.randint(-50, 50, (6, 9))
    check(lambda a, b: (a & b, a | b, a ^ b, ~a, a + b * 3, a - b, a * b, torch.maximum(a, b), torch.minimum(a, b),
                        a.abs(), a.neg(), a.sign(), a.clamp(-10, 10), a.relu()), a, b)
    check(lambda a, b: (a == b, a != b, a < b, a <= b, a > 3, a >= -2, torch.where(a > b, a, b),
                        torch.where(a > 0, a, -1), a / b.clamp(min=1)), a, b)
    p, q = torch.rand(6, 9) > 0.5, torch.rand(6, 9) > 0.5
    check(lambda p, q: (p & q, p | q, p ^ q, ~p, torch.logical_and(p, q), torch.logical_or(p, q), torch.logical_xor(p, q),
                        torch.logical_not(p), p + q, p * q, torch.where(p, 1.5, -2.0)), p, q)
    check(lambda a, p: torch.logical_and(a, p) | (a > 10), a, p)  # logical ops on ints read nonzero
    big = torch.tensor([2**40 + 3, -(2**41) - 7, 2**62, -(2**62), 0, 1])
    check(lambda a: (a * 2 + 1, a - 3 * a, a ^ (a + 1), ~a & a, a.to(torch.float64) * 0.5, a.amax(-1)), big)


def test_scalar_arguments():
    # dynamo passes a float as a 0-d tensor and an int as a symbolic size: new values, no recompile
    def f(x, s, n):
        return (x * s + n) * s - n

    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    cf = torch.compile(f, backend=b, fullgraph=True)
    for s, n in [(2.5, 3), (-1.25, 7), (0.5, -2), (4.0, 11)]:
        x = torch.randn(4, 5)
        torch.testing.assert_close(cf(x, s, n), f(x, s, n))
    assert len(b.compiled) <= 2  # the first call specializes, the second makes it generic
    assert kernels(b) and not fallbacks(b)
    # the float's 0-d tensor is converted by prims.convert_element_type (operand ``a``): in C too
    assert {k.backend for k in b.compiled[-1].kernels} == {"c"}, outside_c(b)
    assert "int64_t sc" in b.compiled[-1].source  # n: a kernel argument, not a constant
    # Python constants folded in the graph: every float32 rounding of the literal as eager's
    check(lambda a: (a * 0.1 + 1e-7, a / 3.0, a - 1e30, a + 2**-149), torch.randn(3, 4))


def test_dtype_conversions():
    x = torch.randn(4, 6) * 50
    x[0, :4] = torch.tensor([-2.9, 2.9, -0.5, 0.5])
    check(lambda a: (a.to(torch.int32), a.to(torch.int64), a - a.to(torch.int64), (a * 1.5).to(torch.int32) * 0.5,
                     a.to(torch.bool), a.to(torch.float64) * 3, a.abs().to(torch.uint8),
                     a.clamp(-100, 100).to(torch.int8)), x, atol=0, rtol=0)
    d = torch.randn(3, 7, dtype=torch.float64)
    check(lambda a: (a.exp() * a.tanh(), a.sum(-1), a.to(torch.float32) + 1, torch.sigmoid(a), F.gelu(a)), d)
    xi = torch.randint(-(2**40), 2**40, (5, 5))
    check(lambda a: ((a + 1).to(torch.int32).to(torch.int64), (a * 3).to(torch.float32), a.to(torch.float64) / 7,
                     (a.to(torch.float32) * 0.5).to(torch.int64)), xi, atol=0, rtol=0)
    check(lambda a: _softmax(a.to(torch.float32)), torch.randint(-3, 3, (4, 8)))


def test_nan_in_clamp_maximum_minimum_and_max_reductions():
    x = torch.randn(4, 8)
    x[0, 1] = x[2, 5] = x[3, 0] = float("nan")
    x[1, 3], x[1, 4] = float("inf"), float("-inf")
    y = torch.randn(4, 8)
    y[1, 1] = y[0, 1] = float("nan")
    check(lambda a, b: (torch.maximum(a, b), torch.minimum(a, b), a.clamp(-0.5, 0.5),
                        a.clamp(min=0.1), a.clamp(max=b), a.clamp(min=b, max=b + 1), a.relu(), F.hardtanh(a),
                        a.amax(-1), a.amin(-1), a.sum(-1), torch.isnan(a), torch.isinf(a)), x, y)
    # a NaN bound gives NaN
    check(lambda a: (a.clamp(min=float("nan")), a.clamp(max=float("nan"))), torch.randn(3, 3))
    # maximum/minimum with NaN in either operand or both
    a = torch.tensor([float("nan"), 1.0, float("nan"), -0.0, 2.0])
    bb = torch.tensor([0.0, float("nan"), float("nan"), 0.0, -2.0])
    check(lambda a, b: (torch.maximum(a, b), torch.minimum(a, b), torch.maximum(b, a)), a, bb)


def test_few_kernels_for_a_block():
    # attention-free transformer block tail: residual add, layer norm, gelu, softmax over heads' rows
    def f(x, r, w, bias, s):
        h = x + r
        ln = F.layer_norm(h, (64,), w, bias)
        return F.gelu(ln, approximate="tanh") * 0.5 + h, torch.softmax(s * 0.125, -1)

    args = torch.randn(2, 8, 64), torch.randn(2, 8, 64), torch.randn(64), torch.randn(64), torch.randn(2, 4, 8, 8)
    b = check(f, *args, config=CORE)
    assert len(kernels(b)) <= 2, [(k.name, k.node_count) for k in kernels(b)]
    assert sum(k.node_count for k in kernels(b)) >= 15


# --------------------------------------------------------------------------- training


class _MLP(torch.nn.Module):
    """Linear, LayerNorm, GELU with a gated residual (pointwise work between the ATen calls), Linear."""

    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)
        self.gate = torch.nn.Parameter(torch.randn(64))

    def forward(self, x):
        h = self.ln(self.fc1(x))
        return self.fc2(F.gelu(h) * torch.sigmoid(self.gate) + h * 0.5)


@pytest.mark.parametrize("decompose", ["auto", "core"])
def test_training_step_grads_match_eager(decompose):
    torch.manual_seed(0)
    model = _MLP()
    ref = copy.deepcopy(model)
    x, t = torch.randn(16, 32), torch.randn(16, 8)
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True, decompose=decompose))
    step = torch.compile(lambda m, x, t: F.mse_loss(m(x), t), backend=b, fullgraph=True)
    loss = step(model, x, t)
    loss.backward()
    ref_loss = F.mse_loss(ref(x), t)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    graphs_ = {c.stats["graph"] for c in b.compiled}
    assert graphs_ == {"forward", "backward"}, graphs_
    assert backends(b) == {"c", "torch"}  # the matmuls (and by default layer norm, GELU) are extern calls
    assert not fallbacks(b)
    (bw,) = [c for c in b.compiled if c.stats["graph"] == "backward"]
    assert any(k.backend == "c" and k.node_count >= 3 for k in bw.kernels)  # the gate's and residual's gradients
    if decompose == "core":  # the layer norm's and GELU's backward fuse into C kernels too
        assert any(k.backend == "c" and k.node_count >= 10 for k in bw.kernels)


# --------------------------------------------------------------------------- dynamic shapes


def test_mark_dynamic_batch_one_compile_sizes_including_one():
    w = torch.randn(24)

    def f(a, w):  # no exp/erf/tanh: those run in C only on a static count of elements
        return _layer_norm(a, w, w * 0.5).relu() + a, (a * w).sum(-1), a.amax(-1, keepdim=True) - a

    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    cf = torch.compile(f, backend=b, fullgraph=True)
    # size-oblivious sizes: 1 is one more size, not a recompile specialized to it
    with fx_config.patch(backed_size_oblivious=True):
        for n in (5, 1, 3, 17, 1, 64):
            a = torch.randn(n, 24)
            torch._dynamo.mark_dynamic(a, 0)
            torch.testing.assert_close(cf(a, w), f(a, w))
    assert len(b.compiled) == 1
    assert kernels(b) and backends(b) == {"c"} and not fallbacks(b)
    assert "int64_t ks" in b.compiled[0].source or "int64_t s" in b.compiled[0].source  # a size parameter


@pytest.mark.parametrize("op", ["exp", "sigmoid"])
def test_dynamic_row_length_reductions(op):
    def f(a, w):
        shifted = a - a.amax(-1, keepdim=True)
        return shifted * w, torch.var_mean(a, -1), _layer_norm(a, w, w), getattr(shifted, op)().sum(-1)

    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    cf = torch.compile(f, backend=b, fullgraph=True, dynamic=True)
    for m in (7, 3, 40, 129):
        a, w = torch.randn(3, m), torch.randn(m)
        torch.testing.assert_close(cf(a, w), f(a, w))
    assert len(b.compiled) == 1 and not fallbacks(b)
    assert backends(b) == {"c"}, outside_c(b)


# --------------------------------------------------------------------------- the prelude's numerics


SPECIAL = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40,
                        1.1754942e-38, 1.17549435e-38, -1.17549435e-38, 1e-30, 1e-7, -1e-7, 88.72, 88.7229, 88.73,
                        -87.33, -103.8, -103.9, -104.0, 0.625, -0.625, 0.6249999, 9.0, -9.0, 1e30, -1e30,
                        1.8e38, -1.8e38, 3.4e38, -3.4e38])


def _grid() -> torch.Tensor:
    dense = torch.linspace(-120, 120, 96_001)  # steps of 0.0025
    fine = torch.linspace(-1, 1, 8_001)
    return torch.cat([dense, fine, SPECIAL])


PRELUDE_FNS = {
    "exp": torch.exp,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "gelu": F.gelu,
    "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"),
    "silu": F.silu,
}


@pytest.mark.parametrize("name", PRELUDE_FNS)
def test_prelude_numerics_match_eager(name):
    fn = PRELUDE_FNS[name]
    x = _grid()
    torch._dynamo.reset()
    b = fxforge.backend(C)
    cf = torch.compile(lambda a: fn(a) + 0, backend=b, fullgraph=True)  # + 0: the op inside a kernel
    got = cf(x)
    assert len(b.compiled) == 1 and backends(b) == {"c"}, outside_c(b)
    assert any(h in b.compiled[0].source for h in ("fx_expf(", "fx_tanhf(", "fx_erff(", " expf(", " tanhf("))
    exp = fn(x)
    # Eager's vectorized CPU gelu (erf) overflows to inf above ~1.7e38 and gives NaN at inf, where
    # its scalar path (a one-element tensor) and float64 give x and inf (as the C kernel does):
    # there the reference is eager on each value alone.  Only gelu may differ so.
    tail = exp[-len(SPECIAL):]
    alone = torch.stack([fn(v.reshape(1))[0] for v in SPECIAL])
    differ = ~torch.isclose(tail, alone, rtol=1.3e-6, atol=1e-5, equal_nan=True)  # assert_close's float32 tolerances
    if name == "gelu":
        assert (SPECIAL[differ] >= 1.7e38).all(), SPECIAL[differ]
    else:
        assert not differ.any(), SPECIAL[differ]
    exp[-len(SPECIAL):] = torch.where(differ, alone, tail)
    torch.testing.assert_close(got, exp, equal_nan=True)
    if name in ("exp", "tanh", "sigmoid", "silu"):  # and within ~3 ulp (2 subnormal steps near 0)
        torch.testing.assert_close(got, exp, equal_nan=True, rtol=4e-7, atol=3e-45)
    # inf, -inf and nan exactly as eager
    torch.testing.assert_close(got[-len(SPECIAL):][:3], exp[-len(SPECIAL):][:3], equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("name", build.VECTOR_MATH[0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vector_math_numerics_match_eager(name, dtype):
    """The C library's vector math (build.vector_math): fused into C kernels, called on vectors,
    as eager computes within float32's and float64's tolerances; inf, -inf and NaN exactly."""
    if name not in build.vector_math():
        pytest.skip(f"this machine's C library has no vector {name}")
    fn = getattr(torch.special if name in ("exp2", "expm1", "log1p", "erfc") else torch, name)
    x = torch.cat([torch.linspace(-12, 12, 4001), torch.linspace(-1, 1, 2001), SPECIAL]).to(dtype)
    torch._dynamo.reset()
    b = fxforge.backend(C)
    cf = torch.compile(lambda a: fn(a * 1.5) + 0.25, backend=b, fullgraph=True)  # the op inside a kernel
    got = cf(x)
    assert len(b.compiled) == 1 and backends(b) == {"c"}, outside_c(b)
    call = f"{name}{'f' if dtype == torch.float32 else ''}("
    assert f" {call}" in b.compiled[0].source or f" fx_{call}" in b.compiled[0].source  # the prelude's erff
    exp = fn(x * 1.5) + 0.25
    torch.testing.assert_close(got, exp, equal_nan=True)
    torch.testing.assert_close(got[-len(SPECIAL):][:3], exp[-len(SPECIAL):][:3], equal_nan=True, atol=0, rtol=0)


aten = torch.ops.aten
BACKWARD_FNS = {  # the pointwise backward kernels of autograd's graphs: (grad, x) -> grad_input
    "gelu_backward": lambda g, a: aten.gelu_backward(g, a),
    "gelu_backward_tanh": lambda g, a: aten.gelu_backward(g, a, approximate="tanh"),
    "threshold_backward": lambda g, a: aten.threshold_backward(g, a, 0.25),
    "sigmoid_backward": lambda g, a: aten.sigmoid_backward(g, torch.sigmoid(a)),
    "tanh_backward": lambda g, a: aten.tanh_backward(g, torch.tanh(a)),
    "silu_backward": lambda g, a: aten.silu_backward(g, a),
}


@pytest.mark.parametrize("name", BACKWARD_FNS)
def test_backward_pointwise_kernels_match_eager(name):
    fn = BACKWARD_FNS[name]
    x = _grid()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    g[::7] = 1.0  # also a gradient of one at every value (inf * 0 is NaN in eager: kept)
    torch._dynamo.reset()
    b = fxforge.backend(C)
    cf = torch.compile(lambda gg, a: fn(gg, a) * 1, backend=b, fullgraph=True)
    got = cf(g, x)
    assert backends(b) == {"c"}, outside_c(b)
    exp = fn(g, x)
    # eager's vectorized gelu (erf) differs from its scalar path above ~1.7e38: compared on each value alone there
    alone = torch.stack([fn(gv.reshape(1), v.reshape(1))[0] for gv, v in zip(g[-len(SPECIAL):], SPECIAL)])
    exp[-len(SPECIAL):] = torch.where(SPECIAL.abs() >= 1.7e38, alone, exp[-len(SPECIAL):])
    torch.testing.assert_close(got, exp, equal_nan=True)
    torch.testing.assert_close(got[-len(SPECIAL):][:3], exp[-len(SPECIAL):][:3], equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu", "silu", "sigmoid", "tanh"])
def test_training_step_runs_activation_backward_in_c(act):
    fns = {"gelu": F.gelu, "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"), "relu": F.relu, "silu": F.silu,
           "sigmoid": torch.sigmoid, "tanh": torch.tanh}
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(48, 96), torch.nn.Linear(96, 48)
    model = lambda x: (lin2(fns[act](lin1(x))) ** 2).mean()  # noqa: E731
    x = torch.randn(16, 48)
    exp = torch.autograd.grad(model(x), [lin1.weight, lin1.bias, lin2.weight])
    torch._dynamo.reset()
    b = fxforge.backend(C)
    cm = torch.compile(model, backend=b, fullgraph=True)
    got = torch.autograd.grad(cm(x), [lin1.weight, lin1.bias, lin2.weight])
    torch.testing.assert_close(got, exp)
    bwd = [c for c in b.compiled if c.stats["graph"] == "backward"]
    assert len(bwd) == 1
    in_c = [str(n.target) for g in bwd[0].plan.groups for n in g.nodes if n.meta.get(BACKEND) == "c"]
    assert any("_backward" in op or "le." in op for op in in_c), in_c  # relu's backward: where(x <= 0, 0, g)
    assert not [op for op, _ in outside_c(b) if "_backward" in op or "sum" in op], outside_c(b)  # bias grads too
    assert not fallbacks(b)


_X3 = (8, 16, 64)
COLUMN_CASES = {  # reductions keeping the last dim: one vectorized lane per column
    "sum_batch": lambda a, g: a.sum(0),
    "sum_two_leading_keepdim": lambda a, g: a.sum((0, 1), keepdim=True) * 2,
    "mean_middle": lambda a, g: (a * g).mean(1),
    "amax_nan": lambda a, g: torch.where(g > 2.5, float("nan"), a).amax(0),
    "amin_two": lambda a, g: (a + 1).amin((0, 1)),
    "prod": lambda a, g: (a * 0.1 + 1).prod(0),
    "int_count": lambda a, g: (a > 0).to(torch.int64).sum(0),
    "any": lambda a, g: (a > 2).any(0),
    # a bias gradient: the pointwise backward, its full output and its column sum in one kernel
    "gelu_backward_and_bias_grad": lambda a, g: (lambda d: (d, d.sum((0, 1))))(aten.gelu_backward(g, a)),
    "two_sums_and_a_full_output": lambda a, g: ((a * g).sum(0), g.sum(0), a * g + 1),
    "broadcast_operand": lambda a, g: (a * g[0, 0]).sum(0),
    "size_one_leading": lambda a, g: a[:1].sum(1),
}


@pytest.mark.parametrize("name", COLUMN_CASES)
def test_column_reductions_are_c_kernels(name):
    fn = COLUMN_CASES[name]
    a, g = torch.randn(_X3), torch.randn(_X3)
    b = check(fn, a, g)
    sources = "".join(c.source for c in b.compiled)
    assert "#pragma omp simd\n#     for (int64_t xi" in sources.replace("#     #pragma", "#pragma")  # the kept loop


@pytest.mark.parametrize("name", ["mean_middle", "gelu_backward_and_bias_grad", "two_sums_and_a_full_output"])
def test_column_reductions_too_large_or_symbolic_are_aten_kernels(name):
    # a column walk over data that is not in cache waits on memory at every row: ATen's kernel
    # where the kernel would walk down its columns (fewer than COLUMNS_BY_ROWS_MIN), or the count
    # is symbolic
    fn = COLUMN_CASES[name]
    rows = schedule.COLUMN_MAX_NUMEL // 16 + 1
    assert 16 < schedule.COLUMNS_BY_ROWS_MIN
    large = (1, rows, 16) if name == "mean_middle" else (rows, 1, 16)  # 16 columns of many rows
    for shape, dynamic in ((large, False), (_X3, True)):
        a, g = torch.randn(shape), torch.randn(shape)
        # sums of thousands of rows: eager's and the C kernel's gelu_backward differ in the last bit
        b = check(fn, a, g, dynamic=dynamic, c_only=False, atol=1e-4, rtol=1e-5)
        why = [w for op, w in outside_c(b) if "sum" in op or "mean" in op]
        assert why and all("column reduction over more than" in w for w in why), outside_c(b)
    a2, g2 = torch.randn(5, 16, 64), torch.randn(5, 16, 64)
    torch.testing.assert_close(torch.compile(fn, backend=b, fullgraph=True, dynamic=True)(a2, g2), fn(a2, g2))


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_large_column_reductions_walk_their_rows_in_chunks(threads):
    """Past COLUMN_MAX_NUMEL a column kernel with many columns still runs in C, walking its rows
    in order (memory as it lies), in chunks of rows (``row_chunks``: from the sizes alone); built
    for several threads, each takes a chunk: the same sums, bit for bit, at any thread count and
    whatever it was built for."""
    fn = COLUMN_CASES["two_sums_and_a_full_output"]
    rows = schedule.COLUMN_MAX_NUMEL // 200 + 1
    a, g = torch.randn(rows, 200), torch.randn(rows, 200)
    b = check(fn, a, g, atol=1e-4, rtol=1e-5, config=fxforge.Config(codegen="c", debug=True, threads=threads))
    src = b.compiled[0].source
    assert re.search(r"double acc\d+\[200\];", src) and re.search(r"double acc\d+_chunks\[\d+\]\[200\];", src), src
    chunks = re.search(r"(#pragma omp parallel for\n#\s+)?for \(int64_t rc = 0; rc < (\d+); rc\+\+\)", src)
    assert chunks and 2 <= int(chunks.group(2)) <= schedule.COLUMN_CHUNKS_MAX, src
    assert (chunks.group(1) is not None) == (threads > 1) and "xb" not in src, src
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.compile(fn, backend=b, fullgraph=True)(a, g)
        torch.set_num_threads(2)
        two = torch.compile(fn, backend=b, fullgraph=True)(a, g)
    finally:
        torch.set_num_threads(saved)
    assert all(torch.equal(x, y) for x, y in zip(one, two))


def test_column_kernels_with_too_few_rows_for_chunks_split_blocks_of_columns():
    """A column kernel whose rows are too few for two chunks (``row_chunks``) splits blocks of
    columns across threads (``column_blocks``): each walks every row's columns of its block."""
    fn = COLUMN_CASES["two_sums_and_a_full_output"]
    a, g = torch.randn(40, 1000), torch.randn(40, 1000)
    b = check(fn, a, g, atol=1e-4, rtol=1e-5, config=fxforge.Config(codegen="c", debug=True, threads=4))
    src = b.compiled[0].source
    blocks = re.search(r"for \(int64_t xb = 0; xb < 1000; xb \+= (\d+)\)", src)
    assert blocks and "#pragma omp parallel for" in src and "_chunks" not in src, src
    block = int(blocks.group(1))
    assert block % schedule.COLUMN_BLOCK_MIN == 0 and -(-1000 // block) <= 4


def _loads_inside_fold_loops(source: str) -> list[str]:
    """The reads inside a C kernel's loops over reduced elements (``for (int64_t ri...``), with the
    offset each reads at."""
    out, depth, inner = [], 0, None
    for line in (l[2:] for l in source.splitlines() if l.startswith("# ")):
        if line.strip().startswith("for (int64_t ri") and inner is None:
            inner = depth
        depth += line.count("{") - line.count("}")
        if inner is not None and depth <= inner and "}" in line:
            inner = None
        m = re.match(r"\s*const \w+ \w+ = in_ptr\d+\[(.*)\];", line)
        if m and inner is not None:
            out.append(m.group(1))
    return out


@pytest.mark.parametrize("case", ["row", "column"])
def test_reads_of_row_values_are_made_once_per_row_not_in_the_fold_loops(case):
    # a row's mean and scale (a layer norm backward's shape), a column's bias: read once per row,
    # before the loops, so the loops storing full outputs stay vectorizable (16 columns: a column
    # kernel walking down its columns, kernel.COLUMNS_BY_ROWS_MIN)
    a, mean, rstd, bias = torch.randn(32, 64), torch.randn(32, 1), torch.rand(32, 1) + 0.5, torch.randn(64)
    if case == "column":
        a, bias = torch.randn(32, 16), torch.randn(16)
    if case == "row":
        fn = lambda x, m, r, b: (lambda h: (h, (h * x).sum(-1, keepdim=True), h * 2 + x))((x - m) * r)  # noqa: E731
    else:
        fn = lambda x, m, r, b: (lambda h: (h.sum(0), h * 3))((x + b) * b)  # noqa: E731
    b = check(fn, a, mean, rstd, bias)
    reads = _loads_inside_fold_loops(b.compiled[0].source)
    assert reads, b.compiled[0].source  # the full values are read in the loops
    assert all(re.search(r"\br", off) for off in reads), reads  # each at an offset varying with the reduced index


def test_a_column_kernel_with_many_columns_walks_its_rows_in_order():
    """64 columns (``kernel.COLUMNS_BY_ROWS_MIN``): the rows in order, by blocks of
    ``kernel.COLUMN_ROW_BLOCK``, each block's columns in the vectorized loop folding into one
    accumulator per column."""
    a, bias = torch.randn(48, 64), torch.randn(64)
    fn = lambda x, b: (lambda h: (h.sum(0), h * 3, h.amax(0)))((x + b) * b)  # noqa: E731
    b = check(fn, a, bias)
    src = b.compiled[0].source
    assert re.search(r"double acc\d+\[64\];", src) and re.search(r"float acc\d+\[64\];", src), src
    # the rows' loop, by blocks of 8 rows, holds the columns' vectorized loop; each column sums
    # a block in float32 (its part), then adds the part to its double
    assert re.search(r"for \(int64_t rb = 0; rb < 48; rb \+= 8\)\n#\s+\{\n#\s+#pragma omp simd\n", src), src
    assert re.search(r"float part\d+ = 0\.0f;", src) and src.count("const int64_t ri = (rb + 7);") == 1, src
    # larger inputs than one call: the same as eager
    check(fn, torch.randn(300, 40), torch.randn(40))
    # a per-column value stored before the fold and several full values stored inside its loop
    # (the walk keeps the per-column definitions and moves only the stores after the fold)
    fn2 = lambda x, b: (lambda c, h: (c, h * 3, (h - c).exp(), h - 1, (h * c).sum(0), h.amax(0)))(  # noqa: E731
        b * 2 + 1, (x + b) * b)
    src = check(fn2, a, bias).compiled[0].source
    assert re.search(r"double acc\d+\[64\];", src), src
    # the walk's statements (every node an output here): the seven full values are stored inside
    # the fold's loop, the two per-column values and the two folds' results after it
    gm = make_fx(fn2, tracing_mode="fake")(a, bias)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    em = kernel_module.CEmitter("k", lambda n: n.name, lambda n, i: f"{n.name}_{i}", nodes, None)
    em.emit()
    at = next(i for i, s in enumerate(em.body) if s is em.fold_nest)
    stores = [sum(isinstance(s, stmts.Store) for s in part) for part in (em.body[:at], em.fold_nest.body, em.body[at:])]
    assert em.by_rows and stores == [0, 7, 4], em.body


def test_sums_over_all_dims_but_channels_walk_channels_last_memory_as_columns():
    """A sum over N, H and W of an (N, C, H, W) tensor: channels-last, C is innermost in memory and
    the kernel folds columns in memory order (its rows by blocks); at the traced NCHW layout W is
    innermost and reduced: ATen's kernel."""
    x = torch.randn(5, 40, 6, 7) * 2 + 1
    fn = lambda x: (x.sum([0, 2, 3]), (x * x).amax([0, 2, 3]))  # noqa: E731
    src = check(fn, x.to(memory_format=torch.channels_last)).compiled[0].source
    assert re.search(r"double acc\d+\[40\];", src) and "rb += 8" in src, src
    b = check(fn, x, c_only=False)
    assert "torch" in backends(b), backends(b)  # the two reductions


@pytest.mark.parametrize("transposed", [True, False])
def test_a_multi_pass_row_reads_its_inputs_once(transposed):
    """A layer norm over a residual sum (three passes over each row: the sum, the deviations, the
    normalized output): the sum's inputs are read by the first pass only, which keeps the row in
    a local array for the others (``ROW_CACHE_MAX_NUMEL``) -- a transposed one is read once, into
    a tile of rows (``TILE_ROWS``), and the tile read once."""
    x, w, bias = torch.randn(4, 8, 32), torch.randn(32), torch.randn(32)
    y = torch.randn(4, 32, 8) if transposed else torch.randn(4, 8, 32)

    def fn(x, y, w, bias):
        h = x + (y.transpose(1, 2) if transposed else y)
        return h, F.layer_norm(h, (32,), w, bias)

    b = check(fn, x, y, w, bias)
    kernel = next(k for k in b.compiled[0].source.split("# C kernel ")[1:] if "moments" in k or "m2" in k or "double m" in k)
    loads = re.findall(r"= (in_ptr\d+)\[", kernel) + re.findall(r"fx_tile_in8\(&\w+\[0\]\[0\], \d+, (in_ptr\d+)", kernel)
    assert loads.count("in_ptr0") == 1 and loads.count("in_ptr1") == 1, kernel
    assert len(re.findall(r"= tile\d+\[", kernel)) == transposed, kernel
    assert len(re.findall(r"float row\d+\[32\];", kernel)) == 1, kernel  # one local row, written once


def test_masked_fill_and_bool_masks():
    x, m = torch.randn(4, 8, 16), torch.rand(8, 16) > 0.5
    b = check(lambda a, mm: (a * 0.5).masked_fill(~mm, float("-inf")), x, m)
    assert "const uint8_t* in_ptr" in b.compiled[0].source  # bools read as bytes (the fill's mask)
    b = check(lambda a, mm: (a > 0) & mm, x, m)
    assert "uint8_t* out_ptr0" in b.compiled[0].source
    check(lambda a, mm: a.to(torch.float64).masked_fill(mm, float("nan")) + 1, x, m)
    b = check(lambda a, mm: (a * 10).to(torch.int64).masked_fill(mm, 7), x, m, c_only=False)  # ints: ATen
    assert [op for op, _ in outside_c(b)] == ["aten.masked_fill.Scalar"]


def test_full_output_of_a_column_sum_runs_in_two_kernels_and_last_dim_with_others_is_aten():
    a = torch.randn(_X3)
    b = check(lambda x: x - x.sum(0, keepdim=True), a)  # the full value reads the fold's result: two kernels
    assert len(kernels(b)) == 2
    b = check(lambda x: x.sum((0, 2)) * 2, a, c_only=False)
    assert [op for op, _ in outside_c(b)] == ["aten.sum.dim_IntList"]
    assert "the last dim and others not next to it" in outside_c(b)[0][1]


def test_transcendental_ops_on_large_tensors_stay_in_c():
    """Every elementwise function the C backend prints runs in C at any size (the prelude's
    ``fx_expf``/``fx_erff`` paths are vectorized): one kernel, parallel over its rows."""
    fn = lambda a: (a.exp() * 2, torch.sigmoid(a) + 1, F.gelu(a) - a, F.gelu(a, approximate="tanh") * a,  # noqa: E731
                    F.silu(a) * a)
    b = check(fn, torch.randn(300, 1024))
    assert len(kernels(b)) == 1 and "omp parallel" in b.compiled[0].source
    b = check(lambda g, a: (aten.silu_backward(g, a) + 1, aten.gelu_backward(g, a) * 2), torch.randn(300, 1024),
              torch.randn(300, 1024))
    assert len(kernels(b)) == 1


# --------------------------------------------------------------------------- extern ops


def test_ops_without_a_c_lowering_run_as_torch_kernels_in_the_same_graph():
    def f(a, b):
        h = (a * 2 + b).relu()
        return torch.log(h + 1) * 3, torch.sin(a) - b, h.argmax(-1), (h - 1).sum(0), torch.mm(h, b.t()[:, :8]).abs()

    x, y = torch.randn(96, 100), torch.randn(96, 100)
    b = check(f, x, y, c_only=False)
    (c,) = b.compiled
    assert backends(b) == {"c", "torch"}
    assert c.stats["fallback_nodes"] == 0
    assert sorted(op for op, _ in outside_c(b)) == ["aten.argmax.default", "aten.mm.default"], outside_c(b)
    for op in ("mm", "argmax"):
        assert f"aten.{op}." in c.source, op
    (assign,) = [p for p in c.stats["passes"] if p["name"] == "assign_backends"]
    assert assign["stats"]["extern_nodes"] == 2


# --------------------------------------------------------------------------- the cache and the compiler


def _so_files(d) -> list[str]:
    """The kernels' shared objects in cache ``d`` (not the launcher's, which carries the probe
    kernel ``fx_probe``, nor the probes': each built once per cache, whichever test comes first)."""
    c = os.path.join(d, "c")
    return sorted(p for p in os.listdir(c) if p.endswith(".so") and "probe(" not in open(os.path.join(c, p[:-3] + ".c")).read())


_CACHED_SCRIPT = textwrap.dedent("""
    import torch, torch.nn.functional as F, fxforge
    import fxforge.codegen.c.build as build

    def f(x, w):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w)) * 1.5 + x

    def compile_and_check(seed):
        \"\"\"Compile f, check it against eager; the number of compiler runs building a shared object.\"\"\"
        calls, real = [], build.subprocess.run
        # each compiler run's command and source (the launcher and the probe carry fx_probe)
        build.subprocess.run = lambda cmd, *a, **k: calls.append(
            (list(cmd), open(next(a for a in cmd if a.endswith(".c"))).read() if "-shared" in cmd else "")) or real(cmd, *a, **k)
        try:
            torch._dynamo.reset()
            torch.manual_seed(seed)
            x, w = torch.randn(4, 48), torch.randn(48)
            b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
            torch.testing.assert_close(torch.compile(f, backend=b, fullgraph=True)(x, w), f(x, w))
            assert "c" in {k.backend for c in b.compiled for k in c.kernels}
        finally:
            build.subprocess.run = real
        # compiler runs building the kernels' shared object (not the launcher, launcher.refusal, nor
        # build.vector_math's probe)
        return sum(1 for cmd, source in calls if "-shared" in cmd and "probe(" not in source)
""")


def test_shared_object_cached_across_processes(monkeypatch, tmp_path):
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    ns: dict = {}
    exec(_CACHED_SCRIPT, ns)
    assert ns["compile_and_check"](0) == 1  # built here
    files = _so_files(tmp_path)
    assert len(files) == 1
    env = dict(os.environ, FXFORGE_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", _CACHED_SCRIPT + "\nprint('COMPILES', compile_and_check(1))"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert int(p.stdout.split("COMPILES")[-1]) == 0  # a fresh process, other values: found, not compiled
    assert _so_files(tmp_path) == files


def test_shared_object_cached_in_process_and_compile_errors_name_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    b, out = run_compiled(lambda a: (a * 3).exp() - 1, x := torch.randn(5, 7))
    torch.testing.assert_close(out, (x * 3).exp() - 1)
    (so,) = _so_files(tmp_path)
    source = open(os.path.join(tmp_path, "c", so[:-3] + ".c")).read()

    def no_compiler(*a, **k):
        raise AssertionError(f"the compiler ran: {a}")

    with monkeypatch.context() as m:
        m.setattr(build.subprocess, "run", no_compiler)
        # (5 x 7 elements: a quick build, kernel.QUICK_BUILD_MAX_WORK)
        assert build.shared_object(source, libs=build.CUnit.libs(), parallel=build.openmp(),
                                   quick=True) == os.path.join(tmp_path, "c", so)
        # the same function compiled again: its kernels come from the cache (also with new inputs)
        x = torch.randn(5, 7)
        b, out = run_compiled(lambda a: (a * 3).exp() - 1, x)
        torch.testing.assert_close(out, (x * 3).exp() - 1)

    bad = build.PRELUDE + "\nvoid broken(float* p) { p[0] = undeclared_name + ; }\n"
    with pytest.raises(build.CompileError) as e:
        build.shared_object(bad)
    msg = str(e.value)
    failed = [p for p in os.listdir(os.path.join(tmp_path, "c")) if p.startswith("failed-") and p.endswith(".c")]
    assert len(failed) == 1 and os.path.join(tmp_path, "c", failed[0]) in msg
    assert "undeclared_name" in msg  # the compiler's message
    assert "undeclared_name" in open(os.path.join(tmp_path, "c", failed[0])).read()
    assert not [p for p in os.listdir(os.path.join(tmp_path, "c")) if p.startswith(".tmp-")]
    assert _so_files(tmp_path) == [so]


def _unit_of(bodies: list[str], names: list[str] | None = None) -> build.CUnit:
    """A CUnit of one-line kernels ``out_ptr0[0] = <body>;`` (named k0, k1... unless ``names``)."""
    from fxforge.codegen.ir.lowering import Param

    params = [Param("out_ptr0", "*float", "out")]
    kernels = []
    for i, body in enumerate(bodies):
        symbol, lines = abi.c_function(params, [f"    out_ptr0[0] = {body};"])
        name = names[i] if names else f"k{i}"
        kernels.append(abi.CEmitted(symbol, "\n".join(lines) + "\n", "", name, ["out"], params, 1, 1))
    return build.CUnit(kernels)


def test_translation_units_depend_on_their_kernels_alone(monkeypatch):
    bodies = [f"{i}.0f" for i in range(40)]
    monkeypatch.setattr(build, "UNIT_BYTES", 4 * len(_unit_of(bodies[:1]).kernels[0].c_source))  # ~4 kernels a unit
    units = _unit_of(bodies).units()
    assert len(units) > 2 and [s for _, ss, _ in units for s in ss] == [k.symbol for k in _unit_of(bodies).kernels]
    # the same kernels, under other names, some twice: the same units
    again = _unit_of(bodies + bodies[:5], names=[f"other{i}" for i in range(45)]).units()
    assert again == units
    # one kernel more, anywhere: every unit but the one it joins (split in two where it ends a
    # unit; a unit of its own where it ends one after another's end) is unchanged
    for where in range(0, 41, 3):
        grown = _unit_of(bodies[:where] + ["41.0f"] + bodies[where:]).units()
        new, gone = set(map(str, grown)) - set(map(str, units)), set(map(str, units)) - set(map(str, grown))
        assert 1 <= len(new) <= 2 and len(gone) <= 1, where
    # added one at a time, the units compiled in the background are the same
    streamed = build.CUnit(background=False)
    for k in _unit_of(bodies).kernels:
        streamed.add(k)
    assert streamed.units() == units


def test_kernels_built_in_several_units_in_parallel(monkeypatch, tmp_path):
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "UNIT_BYTES", 1)  # a unit a kernel
    monkeypatch.setattr(build, "jobs", lambda: 2)

    def f(x, w, z):  # kernels split by the matmuls: several C kernels, one wrapper
        y = torch.relu(x * 2 + 1) @ w
        y = torch.sigmoid(y) * 3 - x
        return (y @ w).exp() + z, (y - z).abs().sum(-1)

    args = (torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8))
    b, out = run_compiled(f, *args)
    for got, want in zip(out, f(*args)):
        torch.testing.assert_close(got, want)
    assert len(kernels(b)) >= 3 and len(_so_files(tmp_path)) >= 2


def test_short_kernels_are_built_quick_in_units_of_their_own(monkeypatch, tmp_path):
    """Kernels of fewer node-elements than ``kernel.QUICK_BUILD_MAX_WORK`` build at -O1, the
    others at -O2, each in units of their kind; both run and match eager."""
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    built = []
    real = build.shared_object
    monkeypatch.setattr(build, "shared_object", lambda *a, **k: built.append(k.get("quick", False)) or real(*a, **k))
    assert "-O1" in build.flags(quick=True) and "-O2" not in build.flags(quick=True) and "-O2" in build.flags()

    def f(small, big):
        return torch.relu(small * 2 + 1) @ small, (big.sin() * 3 - big).sum(-1)

    small, big = torch.randn(8, 8), torch.randn(512, 64)
    assert 8 * 8 * 4 < schedule.QUICK_BUILD_MAX_WORK < 512 * 64 * 4
    b, out = run_compiled(f, small, big)
    for got, want in zip(out, f(small, big)):
        torch.testing.assert_close(got, want)
    assert sorted(set(built)) == [False, True], built


def _bound_kernels(b) -> dict:
    """Each C kernel's callable (``<kernel>_c``) of every graph ``b`` compiled."""
    return {(i, k.name): c._fn.__globals__[f"{k.name}_c"] for i, c in enumerate(b.compiled)
            for k in c.kernels if k.backend == "c"}


def _residual_block(x, w, bias, r):
    return F.gelu(F.layer_norm(x + r, (x.shape[-1],), w, bias)) * 2 + r


@pytest.mark.skipif(launcher.python_include() is None or launcher._data_ptr_entry() is None,
                    reason="no Python.h for this interpreter, or no data-pointer entry in this torch: kernels go through ctypes")
def test_kernels_are_called_by_the_launcher_with_the_tensors():
    args = (torch.randn(6, 16), torch.randn(16), torch.randn(16), torch.randn(6, 16))
    # the launcher's own errors: without debug mode's layout checks, which come first
    b, out = run_compiled(_residual_block, *args, config=fxforge.Config(codegen="c", debug=False))
    torch.testing.assert_close(out, _residual_block(*args))
    bound = _bound_kernels(b)
    assert bound and all(type(f).__name__ == "Kernel" for f in bound.values())
    (i, name), fn = next(iter(bound.items()))
    source = b.compiled[i].source
    assert f"\n{name} = {name}_c\n" in source  # no Python launch frame: the wrapper calls the launcher object
    assert ".data_ptr()" not in source and repr(fn) == f"<fxforge C kernel {name}>"
    # misuse raises Python errors: the argument count, keywords, and what is not a tensor
    with pytest.raises(TypeError, match=f"{name} takes [0-9]+ positional arguments \\(0 given\\)") as e:
        fn()
    n = int(str(e.value).split("takes ")[1].split(" ")[0])
    assert n == source.split(f"\n{name} = {name}_c", 1)[0].rsplit(f"# C kernel {name}_c", 1)[1].count("fx_ptrs[")
    with pytest.raises(TypeError, match="positional arguments"):
        fn(*([torch.zeros(0)] * (n - 1)), out=torch.zeros(0))
    with pytest.raises(AttributeError, match="data_ptr"):
        fn(*([3] * n))
    with pytest.raises(ValueError, match="none of p, i, b, f"):
        launcher.launcher().kernel(1, b"px", "bad")


def test_kernels_called_through_ctypes_without_python_headers(monkeypatch, fresh_launcher):
    monkeypatch.setattr(launcher, "python_include", lambda: None)
    args = (torch.randn(6, 16), torch.randn(16), torch.randn(16), torch.randn(6, 16))
    b, out = run_compiled(_residual_block, *args)
    torch.testing.assert_close(out, _residual_block(*args))
    bound = _bound_kernels(b)
    assert bound and all(type(f).__name__ == "function" for f in bound.values())  # ctypes adapters
    # dynamic shapes: sizes passed as scalars after the tensors
    args = (torch.randn(5, 16), *args[1:3], torch.randn(5, 16))
    b, out = run_compiled(_residual_block, *args, dynamic=True)
    torch.testing.assert_close(out, _residual_block(*args))
    assert _bound_kernels(b) and "_c(" in b.compiled[0].source  # a launch function passing the sizes
    assert "fx_ints[0]" in b.compiled[0].source


def _every_kind_unit() -> build.CUnit:
    """One kernel taking a parameter of each kind, in an order that interleaves them:
    ``out[j] = (in[j] + a) * (flag ? s : -s) + b`` for ``j < n``; error 1 for ``n < 0``."""
    from fxforge.codegen.ir.lowering import Param

    params = [Param("out_ptr0", "*float", "out"), Param("n", "i64", "n"), Param("in_ptr0", "*float", "x"),
              Param("s", "fp32", "s"), Param("flag", "i1", "flag"), Param("a", "i64", "a"), Param("b", "fp32", "b")]
    body = [f"    if (n < 0) {abi.fail(abi.TARGET_OUT_OF_BOUNDS, 'n')}",
            "    for (int64_t j = 0; j < n; j++)", "        out_ptr0[j] = (in_ptr0[j] + a) * (flag ? s : -s) + b;"]
    symbol, lines = abi.c_function(params, body)
    return build.CUnit([abi.CEmitted(symbol, "\n".join(lines) + "\n", "", "kinds", [p.launch for p in params],
                                               params, 1, 2)])


def test_every_parameter_kind_reaches_the_kernel(kernels_through):
    unit = _every_kind_unit()
    assert unit.kernels[0].kinds == "pipfbif"
    fn = launcher.link(unit)["kinds_c"]
    assert (type(fn).__name__ == "Kernel") == (kernels_through == "launcher")
    x = torch.randn(10)
    for n, s, flag, a, b in [(10, 1.5, True, 3, -0.25), (7, -2.0, False, -1, 4.0)]:
        out = torch.full((10,), 7.0)
        fn(out, n, x, s, flag, a, b)
        expect = torch.full((10,), 7.0)
        expect[:n] = (x[:n] + a) * (s if flag else -s) + b
        torch.testing.assert_close(out, expect)
    with pytest.raises(TypeError, match="7 positional arguments"):
        fn(out, 10, x)
    with pytest.raises(TypeError):
        fn(out, "ten", x, 1.0, True, 1, 1.0)  # a size that is not an int
    with pytest.raises(IndexError, match=r"^Target -3 is out of bounds\.$"):  # a kernel's error code
        fn(out, -3, x, 1.0, True, 1, 1.0)


def test_a_launcher_that_fails_to_load_falls_back_to_ctypes_with_one_warning(monkeypatch, caplog, fresh_launcher):
    def refuse(path):
        raise ImportError(f"cannot load {path}")

    monkeypatch.setattr(launcher, "_load_extension", refuse)
    args = (torch.randn(6, 16), torch.randn(16), torch.randn(16), torch.randn(6, 16))
    with caplog.at_level("WARNING", logger="fxforge.codegen.c.launcher"):
        for _ in range(2):
            b, out = run_compiled(_residual_block, *args)
            torch.testing.assert_close(out, _residual_block(*args))
            assert all(type(f).__name__ == "function" for f in _bound_kernels(b).values())
    assert sum("launcher failed" in r.getMessage() for r in caplog.records) == 1


def test_a_sparse_input_to_an_exported_program_raises_before_any_kernel():
    """A tensor without storage never reaches a kernel (its data pointer would abort the process
    inside torch): the exported program's input check raises first.  Run in a child process."""
    script = textwrap.dedent("""
        import torch, fxforge
        class M(torch.nn.Module):
            def forward(self, x):
                return torch.nn.functional.gelu(x * 2 + 1)
        x = torch.randn(4, 8)
        c = fxforge.compile_exported(torch.export.export(M(), (x,)), fxforge.Config(codegen="c"))
        torch.testing.assert_close(c(x), M()(x))
        try:
            c(x.to_sparse())
        except Exception as e:
            print("RAISED", type(e).__name__)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "RAISED" in p.stdout


def test_no_compiler_auto_picks_torch(monkeypatch):
    cc = build.compiler()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert build.compiler() is None
    x, w, bias, r = torch.randn(4, 16), torch.randn(16), torch.randn(16), torch.randn(4, 16)
    for fn, args in [(_layer_norm_gelu_residual, (x, w, bias, r)), (_softmax, (x,)), (_layer_norm, (x, w, bias))]:
        b, out = run_compiled(fn, *args, config=fxforge.Config(debug=True))  # codegen="auto"
        torch.testing.assert_close(out, fn(*args))
        assert backends(b) == {"torch"} and not fallbacks(b)
    monkeypatch.setenv("CC", cc)  # a compiler again: auto picks C
    b, out = run_compiled(_softmax, x, config=fxforge.Config(debug=True))
    torch.testing.assert_close(out, _softmax(x))
    assert backends(b) == {"c"}


def test_a_compiler_that_cannot_build_the_kernels_is_not_picked(monkeypatch, tmp_path):
    """A compiler rejecting fxforge's flags (or failing otherwise) is found by building a probe
    kernel once: "auto" picks the torch backend, naming why."""
    bad = tmp_path / "badcc"
    bad.write_text("#!/bin/sh\necho 'badcc: unrecognized option' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("CC", str(bad))
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path / "cache"))
    why = c_backend.unavailable(frozenset({"cpu"}))
    assert why and str(bad) in why and "Config(codegen='torch')" in why
    x = torch.randn(4, 16)
    b, out = run_compiled(_softmax, x, config=fxforge.Config(debug=True))  # codegen="auto"
    torch.testing.assert_close(out, _softmax(x))
    assert backends(b) == {"torch"} and not fallbacks(b)
    # named explicitly: a warning, and every node an ATen call of the extern backend (not eager)
    b, out = run_compiled(_softmax, x, config=fxforge.Config(codegen="c", debug=True))
    torch.testing.assert_close(out, _softmax(x))
    assert backends(b) == {"torch"} and not fallbacks(b) and not b.failures


# --------------------------------------------------------------------------- zero-copy cat


def test_cat_regions_written_by_c_kernels_then_matmul():
    def f(a, b, w):
        return torch.cat([a * 2, b + 1]) @ w

    args = torch.randn(16, 24), torch.randn(8, 24), torch.randn(24, 12)
    b = check(f, *args, c_only=False)
    (c,) = b.compiled
    assert backends(b) == {"c", "torch"}
    slices = {buf.name: buf for buf in c.plan.memory.buffers.values() if buf.kind == "slice"}
    assert set(slices) == {"mul", "add"}, set(slices)
    assert {buf.producer.meta[BACKEND] for buf in slices.values() if buf.producer.target is not CAT} == {"c"}
    assert c.stats["copy_bytes"] == 0 and c.stats["refused_zero_copy"] == {}
    # row reductions' outputs into a cat along the last dim: strided regions
    def g(a, b, w):
        return torch.cat([a.softmax(-1), (b * b).sum(-1, keepdim=True)], 1) @ w

    b = check(g, torch.randn(5, 9), torch.randn(5, 3), torch.randn(10, 4), c_only=False, config=CORE)
    (c,) = b.compiled
    slices = {buf.name: buf for buf in c.plan.memory.buffers.values() if buf.kind == "slice"}
    assert len(slices) == 2 and c.stats["copy_bytes"] == 0, (set(slices), c.stats["refused_zero_copy"])
    assert {buf.producer.meta[BACKEND] for buf in slices.values()} == {"c"}


# --------------------------------------------------------------------------- random graphs


@settings(profile(), max_examples=30, deadline=None)
@given(graphs(ops=("unary", "binary", "reduction", "view", "var_mean", "native_layer_norm", "convert", "index"),
              exclude=("remainder", "sign"), dtypes=(torch.float32, torch.int64), max_ops=6, max_dim=5))
def test_random_graphs_through_c_kernels_match_eager(example):
    """Random pointwise/reduction/view graphs: fused into C kernels (or torch extern calls where C
    refuses); results match eager, no eager fallbacks."""
    gm, inputs = example
    cfg = fxforge.Config(codegen="c", debug=True)
    compiled = []

    def runner(g, xs):
        c = compile_graph(g, cfg)
        compiled.append(c)
        return c(*xs)

    check_pass(lambda g: None, gm, inputs, runner=runner)
    assert all(c.stats["fallback_nodes"] == 0 for c in compiled), [c.stats["fallbacks"] for c in compiled]


def test_debug_mode_checks_each_tensors_layout_naming_the_argument(kernels_through):
    args = (torch.randn(6, 16), torch.randn(16), torch.randn(16), torch.randn(6, 16))
    for debug in (True, False):
        torch._dynamo.reset()
        b = fxforge.backend(fxforge.Config(codegen="c", debug=debug))
        f = torch.compile(_residual_block, backend=b, fullgraph=True)
        torch.testing.assert_close(f(*args), _residual_block(*args))
        (i, name), fn = next(iter(_bound_kernels(b).items()))
        scope, seen = b.compiled[i]._fn.__globals__, []
        slot = name if scope[name] is fn else f"{name}_c"  # ``kernel0 = kernel0_c``, or a launch function
        scope[slot] = lambda *a: (seen.append(a), fn(*a))[1]  # the arguments of a real call
        f(*args)
        scope[slot] = fn
        real = seen[0]
        t = next(j for j, a in enumerate(real) if isinstance(a, torch.Tensor) and a.dim() == 2 and a.shape[1] > 1)
        shape = tuple(real[t].shape)
        wrong = (torch.randn(shape[0], shape[1] + 1), f"has shape \\({shape[0]}, {shape[1] + 1}\\); the kernel was "
                 f"compiled for \\({shape[0]}, {shape[1]}\\)")
        cases = [
            wrong,
            (torch.randn(shape[::-1]).t(), "has strides"),
            (
                torch.randn(shape, dtype=torch.float64),
                "is a torch.float64 tensor on cpu; the kernel was compiled for torch.float32 on cpu",
            ),
            (3.0, "is a float, not a tensor"),
        ]
        for bad, why in cases:
            call = list(real)
            call[t] = bad
            if debug:
                with pytest.raises(ValueError, match=f"fxforge C kernel {name}: argument {t} \\(.*\\) {why}"):
                    fn(*call)
            elif not isinstance(bad, torch.Tensor):  # off: no check (the launcher's own error)
                with pytest.raises(Exception) as e:
                    fn(*call)
                assert "fxforge C kernel" not in str(e.value)


@pytest.mark.parametrize("case", ["one_row", "channels_last", "broadcast_channels"])
def test_dims_laid_out_one_in_the_next_read_at_their_flat_index(case):
    """Coordinates one flat index made, over dims laid out contiguously, are read at that index
    (``Emitter.contiguous_groups``): each dim counted once where a row's coordinates and every
    element's both cover it, and a tensor that lacks some of the dims (broadcast) read per dim."""
    g = torch.Generator().manual_seed(3)
    if case == "one_row":  # a layer norm over both dims of its one row, its bias (2, 2)
        fn = lambda x, b: torch.nn.functional.layer_norm(x, [2, 2], None, b)  # noqa: E731
        args = torch.randn(1, 2, 2, generator=g), torch.randn(2, 2, generator=g)
    elif case == "channels_last":  # per-channel sums over N, H and W: rows of C at C * rindex
        fn = lambda x: (x.sum(dim=[0, 2, 3]), (x * x).amax(dim=[0, 2, 3]))  # noqa: E731
        args = (torch.randn(3, 40, 5, 6, generator=g).to(memory_format=torch.channels_last),)
    else:  # the same, with a per-(H, W) term broadcast over N and C
        fn = lambda x, hw: (x * hw).sum(dim=[0, 2, 3])  # noqa: E731
        args = torch.randn(3, 40, 5, 6, generator=g).to(memory_format=torch.channels_last), torch.randn(5, 6, generator=g)
    b = check(fn, *args, atol=1e-5, rtol=1e-5)
    if case == "channels_last":
        assert "in_ptr0[(40*rindex + xi0)]" in b.compiled[0].source, b.compiled[0].source
