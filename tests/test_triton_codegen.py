"""The Triton codegen backend under TRITON_INTERPRET=1 on CPU: results match eager.

Every kernel these tests generate is also compiled ahead of time for sm_80 and sm_90
(``aot.check_kernel``), so a kernel the permissive interpreter runs but the real compiler
rejects fails here.  Sizes are tiny: the interpreter is slow.
"""

from __future__ import annotations

import os
import stat

# triton.jit picks the interpreter when a function is decorated; Triton's own library
# functions are decorated when triton is imported, so this must precede any triton import.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")

import pytest
import sympy
import torch
import torch.fx as fx
import torch.nn.functional as F

import fxforge
from fxforge.spine import compile_graph
from fxforge.testing import check_pass, graphs, profile
from hypothesis import given, settings

pytest.importorskip("triton")

from fxforge.codegen.triton import aot, backend as tb, cache, kernel as tk, launch, prelude  # noqa: E402
from fxforge.codegen.triton.printer import TritonPrinter, floor_div, floor_mod  # noqa: E402
from triton_helpers import (GENERATED, aot_check_new, fallbacks, run_compiled, triton_config, triton_kernels,  # noqa: E402
                            triton_nodes)
from torch.utils._sympy.functions import FloorDiv, ModularIndexing, PythonMod  # noqa: E402

for _knob in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _knob):
        setattr(torch._dynamo.config, _knob, 100_000)


@pytest.fixture(autouse=True)
def _interpret(monkeypatch, kernel_cache):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")


def check(fn, *args, fallback_ok=False, atol=1e-5, rtol=1.3e-5, dynamic=False, config=None):
    b, out = run_compiled(fn, *args, dynamic=dynamic, config=config)
    exp = fn(*args)
    torch.testing.assert_close(out, exp, atol=atol, rtol=rtol, equal_nan=True)
    if not fallback_ok:
        assert triton_kernels(b) > 0
        assert not fallbacks(b), fallbacks(b)
    return b


# --------------------------------------------------------------------------- printer


def _run_index_expr(src: str, a: torch.Tensor, b: int) -> torch.Tensor:
    """Evaluate a printed index expression over ``a`` (symbol ``a``, constant ``b``) in a kernel."""
    em = launch.Emitted(
        kernel_source=(
            "def kernel(a_ptr, out_ptr, b, XBLOCK: tl.constexpr):\n"
            "    i = tl.arange(0, XBLOCK)\n"
            "    a = tl.load(a_ptr + i)\n"
            f"    tl.store(out_ptr + i, {src})\n"
        ),
        launch_source="",
        name="expr",
        args=[],
        params=[launch.Param("a_ptr", "*i64", ""), launch.Param("out_ptr", "*i64", ""), launch.Param("b", "i64", "")],
        constexprs={"XBLOCK": a.numel()},
        num_warps=1,
        kind="test",
    )
    fn = tb.load_kernel(em)
    out = torch.empty_like(a)
    fn[(1,)](a, out, b, XBLOCK=a.numel())
    aot.check_kernel(em)
    return out


def test_printer_floor_semantics_for_unknown_signs():
    a = sympy.Symbol("a", integer=True)
    b = sympy.Symbol("b", integer=True)
    n = sympy.Symbol("n", integer=True, nonnegative=True)
    p = TritonPrinter()
    assert p(FloorDiv(n, 4)) == "(n // 4)"  # provably non-negative: C and Python agree
    assert p(ModularIndexing(n, 2, 8)) == "((n // 2) % 8)"
    assert "tl.where" in p(FloorDiv(a, 4)) and "tl.where" in p(ModularIndexing(a, 1, 8))
    vals = torch.arange(-9, 7, dtype=torch.int64)
    for bv in (3, -3):
        for e, ref in [
            (FloorDiv(a, b), lambda x: x // bv),
            (PythonMod(a, b), lambda x: x % bv),
            (
                ModularIndexing(a, 2, b) if bv > 0 else FloorDiv(a, b),
                (lambda x: (x // 2) % bv) if bv > 0 else (lambda x: x // bv),
            ),
        ]:
            got = _run_index_expr(p(e), vals, bv)
            want = torch.tensor([ref(int(x)) for x in vals])
            assert torch.equal(got, want), (p(e), got, want)


def test_printer_helpers_match_python():
    vals = torch.tensor([-7, -6, -1, 0, 1, 5, 6, 7], dtype=torch.int64)
    got = _run_index_expr(floor_div("a", "b"), vals, -3)
    assert got.tolist() == [int(x) // -3 for x in vals]
    got = _run_index_expr(floor_mod("a", "b"), vals, -3)
    assert got.tolist() == [int(x) % -3 for x in vals]


# --------------------------------------------------------------------------- pointwise


def test_pointwise_chain_and_source():
    x, y = torch.randn(4, 8), torch.randn(8)
    b = check(lambda x, y: torch.sin(x) + y * 2, x, y)
    src = b.compiled[0].source
    assert "tl.load" in src and "_triton[" in src  # kernel text is readable in Compiled.source
    assert all(k.backend == "triton" for k in b.compiled[0].kernels)


def test_negative_floor_div_and_mod_values():
    xi = torch.tensor([-7, -6, -5, -1, 0, 1, 5, 6, 7, -8])
    yi = torch.tensor([3, -3, 2, -2, 3, 4, -4, 3, -3, 5])
    check(
        lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc"), torch.remainder(a, -3), a // -3),
        xi,
        yi,
    )
    xf, yf = xi.float() + 0.5, yi.float()
    check(
        lambda a, b: (
            a // b,
            a % b,
            torch.fmod(a, b),
            torch.div(a, b, rounding_mode="trunc"),
            torch.div(a, b, rounding_mode="floor"),
        ),
        xf,
        yf,
    )


def test_unary_float_ops():
    x = torch.randn(3, 7)
    check(lambda a: (a.exp(), a.abs().log(), a.abs().sqrt(), a.abs().rsqrt(), a.sin(), a.cos(), a.tanh(),
                     a.sigmoid(), a.relu(), F.gelu(a), F.gelu(a, approximate="tanh"), torch.expm1(a), torch.log1p(a.abs()),
                     a.floor(), a.ceil(), a.trunc(), torch.round(a * 4), a.sign(), a.reciprocal(), F.silu(a)), x,
          atol=2e-5, rtol=2e-5)


def test_binary_and_ternary_ops():
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    check(lambda a, b: (torch.where(a > 0, a, b), torch.maximum(a, b), torch.minimum(a, b), a ** 2, a.abs() ** 0.5,
                        a.abs() ** 1.7, a.clamp(-0.5, 0.5), a.clamp(min=0.1), a - 2 * b, torch.rsub(a, b, alpha=3)), x, y)
    check(
        lambda a, b: (torch.logical_and(a > 0, b > 0), torch.logical_or(a > 0, b > 0), torch.logical_not(a > 0), a == b, a >= b),
        x,
        y,
    )
    xi, yi = torch.randint(-9, 9, (4, 4)), torch.randint(-9, 9, (4, 4))
    check(lambda a, b: (a & b, a | b, a ^ b, ~a, torch.maximum(a, b), a * b - a, a.clamp(-3, 3)), xi, yi)


def test_nan_propagation():
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("nan"), -1.0, 0.0]])
    check(
        lambda a: (
            torch.maximum(a, a * 0),
            torch.minimum(a, a * 0),
            a.clamp(0, 1),
            a.relu(),
            a.amax(1),
            a.argmax(1),
            a.max(1),
            a.amin(0),
            a.argmin(0),
        ),
        x,
    )


def test_type_conversions_and_constants():
    x = torch.randn(3, 5) * 10
    check(lambda a: (a.to(torch.int32), a.to(torch.float16), a.to(torch.bool), a.to(torch.float64), a.to(torch.bfloat16)), x)
    check(
        lambda a: (
            a + torch.full((3, 5), 2.5),
            torch.ones_like(a),
            torch.zeros_like(a, dtype=torch.int64),
            torch.full_like(a, 7, dtype=torch.bool),
        ),
        x,
    )
    check(lambda a: (a + torch.full((3, 5), 0.1, dtype=torch.float64), torch.full((3,), 2**40), a * 3), x.double())


def test_bf16_fp16_compute_and_rounding():
    x, y = torch.randn(4, 9), torch.randn(4, 9)
    for dt in (torch.float16, torch.bfloat16):
        check(
            lambda a, b: (a + b * 0.3, a * b, a / b, a.exp(), torch.sigmoid(a), a.sum(-1), a.amax(-1), a.mean(0)),
            x.to(dt),
            y.to(dt),
            atol=1e-2,
            rtol=1e-2,
        )
        check(lambda a, b: (a + b * 0.3, a * b, a / b, a - b), x.to(dt), y.to(dt), atol=0, rtol=0)  # exactly eager


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_low_precision_scalar_compare(dt):
    # pytorch#173987: eager compares in the tensor's dtype, so the Python scalar is rounded
    # first; computing in fp32 with an fp32 scalar gives different booleans.
    a = torch.tensor([0.1, 0.0999, 0.1001, 0.2, -0.1, 1.0 / 3], dtype=dt)
    b = check(lambda a: (a == 0.1, a != 0.1, a < 0.1, a <= 0.1, a > 0.1, a >= 0.1, a > 1.0 / 3), a)
    exp = a == 0.1
    assert exp[0].item()  # would be False with an fp32 scalar
    assert triton_nodes(b) == 7 and triton_kernels(b) < 7  # the compares read `a`: fused


def test_broadcasting_and_scalars():
    x, y, z = torch.randn(3, 1, 5), torch.randn(4, 1), torch.randn(())
    check(lambda a, b, c: a * b + c, x, y, z)
    check(lambda a, b: a[:, None, :] * b[None, :, :], torch.randn(3, 5), torch.randn(4, 5))
    check(lambda c: c * 2 + 1, torch.randn(()))


def test_strided_sliced_and_offset_inputs():
    x = torch.randn(6, 10)
    check(lambda a: a.t() * 2, x)
    check(lambda a: a[:, 1:4] + a[:, :3], x)
    check(lambda a: a[1:, ::3] * a[:-1, 1::3], x[:, :9])
    base = torch.randn(40)
    check(lambda a: a.exp(), base[3:].as_strided((4, 5), (1, 7), 3))
    check(lambda a: a.sum(0), x.t()[2:])


def test_bool_params_change_between_calls():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxforge.spine import compile_graph

    g = fx.Graph()
    x = g.placeholder("x")
    flag = g.placeholder("flag")
    m = g.call_function(torch.ops.aten.mul.Scalar, (x, flag))
    w = g.call_function(torch.ops.aten.add.Tensor, (m, x))
    g.output((w,))
    with FakeTensorMode():
        fake = torch.empty(4, 3)
        x.meta["val"] = fake
        flag.meta["val"] = True
        m.meta["val"] = torch.ops.aten.mul.Scalar(fake, True)
        w.meta["val"] = torch.ops.aten.add.Tensor(m.meta["val"], fake)
    gm = fx.GraphModule(torch.nn.Module(), g)
    start = len(GENERATED)
    c = compile_graph(gm, triton_config())
    assert c.stats["fallback_nodes"] == 0 and c.stats["kernels"] == 1 and c.stats["fused_nodes"] == 2
    em = GENERATED[start]
    assert any(p.sig == "i1" for p in em.params)  # a bool kernel parameter, not a constant
    t = torch.randn(4, 3)
    for f in (True, False, True, False):
        torch.testing.assert_close(c(t, f)[0], t * f + t)
    aot.check_kernel(em)


# --------------------------------------------------------------------------- reductions


def test_reductions_persistent():
    x = torch.randn(5, 6)
    check(lambda a: (a.sum(), a.mean(0), a.prod(1), a.amin(1, keepdim=True), a.argmin(0), a.argmax(), a.var(1),
                         torch.var_mean(a, 0), torch.var_mean(a, 1, correction=0, keepdim=True), a.max(1), a.min(0),
                         (a > 0).any(1), (a > 0).all(), a.std(0)), x, atol=1e-5, rtol=1e-4)
    kinds = {em.kind for em in list(GENERATED)[-20:]}
    assert "persistent_reduction" in kinds
    check(
        lambda a: (a.sum((0, 2)), a.mean((1,)), a.amax((0, 2), keepdim=True), a.sum(1, dtype=torch.float64)), torch.randn(3, 4, 5)
    )
    check(lambda a: (a.sum(1), a.prod(0), a.amax(1), a.argmax(1)), torch.randint(-5, 5, (4, 6)))


def test_reductions_looped(monkeypatch):
    monkeypatch.setattr(launch, "PERSISTENT_RBLOCK_MAX", 4)
    monkeypatch.setattr(launch, "LOOP_RBLOCK", 4)
    x = torch.randn(3, 11)
    x[1, 7] = 5.0
    x[1, 9] = 5.0  # tie: the first index wins
    start = len(GENERATED)
    check(lambda a: (a.sum(1), a.mean(1), a.amax(1), a.amin(1), a.prod(1), a.argmax(1), a.argmin(1), a.var(1),
                     torch.var_mean(a, 1), a.max(1), (a > 0).any(1)), x, atol=1e-5, rtol=1e-4)
    assert {em.kind for em in list(GENERATED)[start:]} - {"pointwise"} == {"looped_reduction"}


def _softmax(a):
    m = a.amax(-1, keepdim=True)
    e = (a - m).exp()
    return e / e.sum(-1, keepdim=True)


def _layer_norm(a, w, b):
    var, mean = torch.var_mean(a, -1, correction=0, keepdim=True)
    return (a - mean) * torch.rsqrt(var + 1e-5) * w + b


def _rms_norm(a, w):  # LLaMA's: mean of squares, rsqrt, scale
    return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _kinds(since: int) -> list[str]:
    return [em.kind for em in list(GENERATED)[since:]]


@pytest.mark.parametrize("looped", [False, True])
def test_reduction_and_epilogue_run_as_one_kernel(monkeypatch, looped):
    # softmax / layer norm / RMS norm as the core-ATen decompositions write them: reductions over
    # one row plus pointwise prologues and epilogues, each one fused Triton kernel
    if looped:  # rows longer than a block: every reduction loops, the epilogue recomputes
        monkeypatch.setattr(launch, "PERSISTENT_RBLOCK_MAX", 4)
        monkeypatch.setattr(launch, "LOOP_RBLOCK", 4)
    kind = "looped_reduction" if looped else "persistent_reduction"
    x, w, bias = torch.randn(2, 3, 10), torch.randn(10), torch.randn(10)
    for fn, args, tol in [(_softmax, (x,), 1e-5), (_layer_norm, (x, w, bias), 1e-4), (_rms_norm, (x, w), 1e-4),
                          (_softmax, (x.to(torch.bfloat16),), 1e-2), (_layer_norm, (x.half(), w.half(), bias.half()), 1e-2)]:
        start = len(GENERATED)
        b = check(fn, *args, atol=tol, rtol=tol)
        assert triton_kernels(b) == 1, (fn.__name__, _kinds(start))
        assert _kinds(start)[-1] == kind
        assert triton_nodes(b) >= 5


def test_fused_reduction_feeding_reduction_and_outputs():
    # cross-entropy-like: max, sum of exp, log; a row output and a full output; a reduction over a
    # leading dim (rows are columns) with its epilogue
    def ce(a, t):
        m = a.amax(-1, keepdim=True)
        lse = (a - m).exp().sum(-1, keepdim=True).log() + m
        return (a - lse), lse.squeeze(-1) * t

    def columns(a):
        mu = a.mean(0)
        return (a - mu) / (a - mu).abs().amax(0)

    x = torch.randn(6, 9)
    b = check(ce, x, torch.randn(6), atol=1e-5, rtol=1e-5)
    assert triton_kernels(b) == 1
    b = check(columns, x, atol=1e-5, rtol=1e-5)
    assert triton_kernels(b) == 1


def test_views_inside_fused_kernels():
    # reshapes of values the kernel computes, and strided views of its inputs, fuse; the
    # coordinates of each value follow its own shape
    def f(a, c):
        y = (a.sin().reshape(4, 12) + 1).flatten() * c.t().reshape(-1)
        return y.view(2, 24).cos()

    def rows(a):  # a row value reshaped, then broadcast back over its row
        s = a.sum(-1).view(3, 1, 1)
        return a.view(3, 1, 8) / s

    a, c = torch.randn(6, 8), torch.randn(8, 6)
    b = check(f, a, c, atol=1e-5, rtol=1e-5)
    assert triton_kernels(b) == 1
    b = check(rows, torch.randn(3, 8) + 3.0)
    assert triton_kernels(b) == 1


def test_transposed_internal_value_is_refused_and_correct():
    # a permute of a value computed inside the kernel cannot be indexed there: fusion is refused
    # with the backend's reason and the two parts run as separate kernels
    def f(a):
        return a.exp().t().contiguous().sin() + 1

    b = check(f, torch.randn(4, 6))
    refused = [r for c in b.compiled for r in c.stats["refused"]]
    assert any(r["reason"] == "backend" and "permute" in r["detail"] for r in refused), refused
    assert triton_kernels(b) == 2


def test_dynamic_row_length_layer_norm_loops():
    torch._dynamo.reset()
    b = fxforge.backend(triton_config())
    cf = torch.compile(_layer_norm, backend=b, fullgraph=True, dynamic=True)
    start = len(GENERATED)
    for n in (5, 9, 33):
        x, w, bias = torch.randn(3, n), torch.randn(n), torch.randn(n)
        torch.testing.assert_close(cf(x, w, bias), _layer_norm(x, w, bias), atol=1e-5, rtol=1e-4)
    assert len(b.compiled) == 1 and triton_kernels(b) == 1
    assert _kinds(start) == ["looped_reduction"]
    aot_check_new(start)


def test_dynamic_sizes_one_compile():
    def f(a, b):
        return (a * b).sum(-1), torch.sigmoid(a) - b, a.amax(0)

    torch._dynamo.reset()
    b = fxforge.backend(triton_config())
    cf = torch.compile(f, backend=b, fullgraph=True, dynamic=True)
    start = len(GENERATED)
    for n in (3, 5, 9):
        a, w = torch.randn(n, 6), torch.randn(n, 6)
        got = cf(a, w)
        torch.testing.assert_close(got, f(a, w))
    assert len(b.compiled) == 1
    assert triton_nodes(b) == 5 and not fallbacks(b)
    ems = list(GENERATED)[start:]
    assert any(p.name.startswith("ks") for em in ems for p in em.params)  # sizes are kernel arguments
    aot_check_new(start)


# --------------------------------------------------------------------------- capability


def test_ops_triton_refuses_run_as_torch_extern_calls_into_planned_buffers():
    # mm and cumsum have no Triton lowering: the torch backend runs them (its out= calls, writing
    # planned buffers), not eager fallbacks
    x = torch.randn(4, 4)
    b = check(lambda a: (torch.mm(a, a) + 1, torch.cumsum(a, 0) * 2), x)
    (c,) = b.compiled
    assert {k.backend for k in c.kernels} == {"triton", "torch"}
    assert "torch.mm(" in c.source and "aten.cumsum.out(" in c.source  # mm: torch's binding (runtime.PUBLIC_OUT)
    (assign,) = [p for p in c.stats["passes"] if p["name"] == "assign_backends"]
    assert assign["stats"]["extern_nodes"] == 2
    # what neither backend runs is an eager fallback, with both reasons
    b = check(lambda a: torch.mm(a, a) + 1, x, fallback_ok=True,
              config=triton_config(fallback_ops=["aten.mm"]))
    assert list(fallbacks(b).values()) == ["listed in Config.fallback_ops"]
    b = check(lambda a: _no_out_form(a) + 1, x, fallback_ok=True)
    (reason,) = fallbacks(b).values()
    assert "triton: no lowering for" in reason and "torch: custom operator" in reason, reason
    check(lambda a: torch.view_as_real(torch.view_as_complex(a.reshape(4, 2, 2)) * 2), x, fallback_ok=True)


@torch.library.custom_op("fxforge_tests::no_out_form", mutates_args=())
def _no_out_form(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@_no_out_form.register_fake
def _(x):
    return torch.empty_like(x)


def test_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.ops.aten.exp.default, (x,))
    g.output((n,))
    with FakeTensorMode():
        x.meta["val"] = torch.empty(3)
        n.meta["val"] = torch.empty(3)
    assert "TRITON_INTERPRET" in tb.accepts(n, fxforge.Config())


# --------------------------------------------------------------------------- cache


def test_cache_private_atomic_and_corrupted_file_recompiled():
    d = cache.cache_dir()
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    x = torch.randn(5, 3)

    def f(a):
        return a * 3.25 - 1.0

    run_compiled(f, x)
    em = GENERATED[-1]
    path = cache.module_path(prelude.module_text(em.kernel_source, "interp"))
    assert os.path.dirname(path) == d
    with open(path, "w") as fh:
        fh.write("def kernel(:\n  garbage\x00")  # corrupted: not even Python
    b, out = run_compiled(f, x)
    torch.testing.assert_close(out, f(x))
    with open(path) as fh:
        assert "garbage" not in fh.read()  # rewritten from the source we hold
    assert not [p for p in os.listdir(d) if p.startswith(".tmp-")]


# --------------------------------------------------------------------------- AOT / PTX


def _fake_node(op, *shapes, dtype=torch.float32):
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = fx.Graph()
    phs = [g.placeholder(f"in{i}") for i in range(len(shapes))]
    n = g.call_function(op, tuple(phs))
    g.output((n,))
    with FakeTensorMode():
        vals = [torch.empty(s, dtype=dtype) for s in shapes]
        for p, v in zip(phs, vals):
            p.meta["val"] = v
        n.meta["val"] = op(*vals)
    return n


def test_ptx_vectorized_loads_on_contiguous_inputs():
    n = _fake_node(torch.ops.aten.add.Tensor, (64, 1024), (64, 1024))
    em = tk.TritonEmitter("k", lambda n: n.name, lambda n, i: "out", [n]).emit()
    res = aot.check_kernel(em)
    for arch, r in res.items():
        assert r.has_cubin
        assert any(".v4" in l for l in r.vector_loads()), f"sm_{arch}: no ld.global.v4"


def test_int64_indexing_for_huge_tensors():
    n = _fake_node(torch.ops.aten.neg.default, (2**16, 2**16 + 1))  # > 2**31 elements (fake: no memory)
    em = tk.TritonEmitter("k", lambda n: n.name, lambda n, i: "out", [n]).emit()
    assert "tl.program_id(0).to(tl.int64)" in em.kernel_source
    aot.check_kernel(em, archs=(90,))
    small = tk.TritonEmitter("k", lambda n: n.name, lambda n, i: "out", [_fake_node(torch.ops.aten.neg.default, (64, 64))]).emit()
    assert "int64" not in small.kernel_source


# --------------------------------------------------------------------------- multi-node groups


def test_fused_pointwise_group_rounds_like_eager():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxforge.spine import compile_graph

    def f(a, b):
        return ((a * b + 1.5).exp() - b).sigmoid() * 3

    for dt in (torch.float32, torch.bfloat16):
        x, y = torch.randn(4, 6, dtype=dt), torch.randn(6, dtype=dt)
        gm = make_fx(f, tracing_mode="fake")(x, y)
        cfg = triton_config()
        start = len(GENERATED)
        c = compile_graph(gm, cfg)  # the fusion pass puts all six pointwise nodes in one group
        assert c.stats["kernels"] == 1 and c.stats["fallback_nodes"] == 0
        assert c.kernels[0].node_count == 6
        out = c(x, y)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(
            out, f(x, y), atol=0 if dt == torch.bfloat16 else 1e-6, rtol=0 if dt == torch.bfloat16 else 1e-5
        )
        aot_check_new(start)


# --------------------------------------------------------------------------- conversions inside kernels
#
# A type conversion (`_to_copy`, `convert_element_type`) fused into a kernel must change the value
# for the members reading it, not only where it is stored: bilinear upsampling computes its
# weights as ``src - int64(src)`` in the same kernel as the truncation, and got 0 (wrong results
# up to 12.5 in the OpInfo samples).


def _compare(fn, *args, fallback_ok=True, atol=1e-5, rtol=1.3e-5):
    b, out = run_compiled(fn, *args)
    exp = fn(*args)
    torch.testing.assert_close(out, exp, atol=atol, rtol=rtol, equal_nan=True)
    assert triton_kernels(b) > 0
    if not fallback_ok:
        assert not fallbacks(b), fallbacks(b)
    return b


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("shape,size", [
    ((1, 1, 3, 3), (5, 4)),   # the reported case: error 1.49 (False) / 1.65 (True)
    ((2, 3, 4, 5), (7, 9)),   # up, batch and channels
    ((2, 3, 8, 6), (3, 4)),   # down
    ((1, 2, 5, 7), (5, 5)),   # one dim kept, one down
    ((3, 1, 2, 9), (6, 5)),
])
def test_bilinear_interpolate_matches_eager(shape, size, align_corners):
    torch.manual_seed(0)
    x = torch.randn(shape)
    fn = lambda x: F.interpolate(x, size=size, mode="bilinear", align_corners=align_corners)
    b = _compare(fn, x)
    assert triton_nodes(b) >= 10  # the index and weight math runs fused in Triton


@pytest.mark.parametrize("mode", ["linear", "bilinear", "trilinear"])
def test_linear_modes_with_scale_factor_match_eager(mode):
    torch.manual_seed(1)
    shape = {"linear": (2, 3, 7), "bilinear": (2, 2, 5, 6), "trilinear": (1, 2, 3, 4, 5)}[mode]
    x = torch.randn(shape)
    for scale in (1.7, 0.6):
        _compare(lambda x: F.interpolate(x, scale_factor=scale, mode=mode), x)


def test_upsample_bilinear_matches_eager():
    # the op F.upsample_bilinear (align_corners=True) and F.interpolate dispatch to
    x = torch.randn(2, 3, 4, 5)
    _compare(lambda x: torch.ops.aten.upsample_bilinear2d.vec(x, None, True, [1.5, 2.0]), x)


def test_float_to_int_conversion_truncates_inside_a_kernel():
    x = torch.randn(4, 6) * 5
    _compare(lambda a: a - a.to(torch.int64), x, fallback_ok=False)  # the fractional part
    _compare(lambda a: (a * 1.5).to(torch.int32) * 0.5, x, fallback_ok=False)
    _compare(lambda a: (a * 2).floor().to(torch.int64) + (a * 2).to(torch.int64), x, fallback_ok=False)


_X = torch.tensor([[0.0, -0.0, 2.7, -2.7, 0.4, -0.6], [1e-3, 3.5, -7.25, 9.99, 100.5, -0.5]])
_XI = torch.tensor([[2**31 + 5, -(2**31) - 3, 2**40 + 7, -1, 0, 255], [256, 257, -129, 127, 2**63 - 2, -(2**63)]])
# doubles where rounding straight to bf16 / fp16 differs from eager's rounding through fp32
_XD = torch.tensor([1 + 2**-8 + 2**-40, 1 + 2**-11 + 2**-40, -(1 + 2**-8 + 2**-40), 0.1, 3.3, 1e-30], dtype=torch.float64)
CONVERSIONS = {
    "float_to_bool": (lambda a: (a * 1.0).to(torch.bool).to(torch.float32) + 1, _X),  # tests != 0
    "fp64_to_fp32": (lambda a: (a * 1.1).to(torch.float32).to(torch.float64) * 3, _X.double()),  # rounds
    "int64_to_int32": (lambda a: (a + 1).to(torch.int32).to(torch.int64) * 1, _XI),  # wraps
    "int64_to_uint8": (lambda a: (a + 1).to(torch.uint8).to(torch.int64) * 2, _XI),  # wraps
    "int64_to_int8": (lambda a: (a + 1).to(torch.int8) - a, _XI),  # wraps, then promoted back
    "int64_to_float": (lambda a: (a * 1).to(torch.float32).to(torch.int64) - a, _XI[:, :4]),  # rounds
    "fp64_to_bf16": (lambda a: (a * 1).to(torch.bfloat16), _XD),  # through fp32, as eager
    "fp64_to_fp16": (lambda a: (a * 1).to(torch.float16).to(torch.float64) + 0, _XD),  # through fp32, as eager
    "fp16_constant": (lambda a: torch.full((2, 6), 0.1, dtype=torch.float16) + a, _X.half()),  # a literal has no .to()
}


@pytest.mark.parametrize("name", CONVERSIONS)
def test_conversions_change_the_value_for_later_members(name):
    fn, a = CONVERSIONS[name]
    _compare(fn, a, fallback_ok=False, atol=0, rtol=0)


def test_bool_addition_is_logical_or():
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    _compare(lambda a, b: ((a > 0) + (b > 0)).float() * 2, x, y, fallback_ok=False)


def test_gathers_with_indices_computed_in_the_graph():
    # nearest / linear sampling by hand: indices from arange, scaled, converted, clamped; the
    # gathers themselves run eagerly, the index math and the blends in Triton kernels
    x = torch.randn(2, 5, 6)

    def f(x):
        src = ((torch.arange(7, dtype=torch.float32) + 0.5) * 0.8 - 0.5).clamp_min(0)
        i0 = src.to(torch.int64)
        i1 = (i0 + 1).clamp(max=5)
        lam = (src - i0).clamp(0, 1)
        rows = (torch.arange(3) * 1.7).floor().to(torch.int64).clamp(0, 4)
        g = x[:, rows][..., i0] * (1 - lam) + x[:, rows][..., i1] * lam
        idx = i0.view(1, 1, 7).expand(2, 5, 7)
        return g, torch.gather(x, 2, idx) * lam + torch.gather(x, 2, (idx + 1).clamp(max=5)) * (1 - lam)

    _compare(f, x)


@settings(profile(), max_examples=30, deadline=None)
@given(graphs(ops=("unary", "binary", "reduction", "view", "var_mean", "native_layer_norm", "convert", "index"),
              exclude=("remainder", "sign"), dtypes=(torch.float32, torch.int64), max_ops=6, max_dim=5))
def test_random_graphs_fuse_into_triton_kernels_that_match_eager(example):
    """Random pointwise/reduction/view graphs: fusion forms groups, the emitter lowers each as one
    kernel or fusion is refused with the emitter's reason; results match eager either way."""
    gm, inputs = example
    cfg = triton_config()
    start = len(GENERATED)
    check_pass(lambda g: None, gm, inputs, runner=lambda g, xs: compile_graph(g, cfg)(*xs))
    aot_check_new(start)


# --------------------------------------------------------------------------- autotune


def _undisturbed(t):
    """A timing as a quiet machine would report it (this test is about the cache, not the load)."""
    from fxforge.infra import timing

    return timing.Timing(t.seconds, t.calls, 0, None, t.attempts)


def test_autotune_times_candidates_once_and_reuses_the_choice_from_disk(monkeypatch, tmp_path):
    from fxforge.codegen.triton import autotune

    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    timed = []  # the configurations timed, in order
    real_time = autotune._time
    monkeypatch.setattr(autotune, "_time", lambda launch, cs, *a: timed.extend(cs) or _undisturbed(real_time(launch, cs, *a)))
    cfg = triton_config(autotune=True)
    x = torch.randn(4, 40)
    b, out = run_compiled(_softmax, x, config=cfg)
    torch.testing.assert_close(out, _softmax(x))
    em = GENERATED[-1]
    assert len(em.configs) > 1 and timed == em.configs  # every candidate once, the default first
    files = list((tmp_path / "triton").glob("tune_*.json"))
    assert len(files) == 1
    (choice,) = __import__("json").loads(files[0].read_text()).values()
    assert choice in em.configs

    # a new process (fresh tuner) reads the choice instead of timing again
    monkeypatch.setattr(autotune, "_time", lambda *a: (_ for _ in ()).throw(AssertionError("timed again")))
    x = torch.randn(4, 40)
    b, out = run_compiled(_softmax, x, config=cfg)
    torch.testing.assert_close(out, _softmax(x))

    # a corrupt file is tuned again and rewritten, not a crash
    files[0].write_text("{not json")
    timed.clear()
    monkeypatch.setattr(autotune, "_time", lambda launch, cs, *a: timed.extend(cs) or _undisturbed(real_time(launch, cs, *a)))
    b, out = run_compiled(_softmax, x, config=cfg)
    torch.testing.assert_close(out, _softmax(x))
    assert timed == em.configs
    assert list(__import__("json").loads(files[0].read_text()).values())[0] in em.configs


def test_autotune_choice_timed_on_a_busy_machine_is_timed_again_once_quiet(monkeypatch, tmp_path):
    from fxforge.infra import timing
    from fxforge.codegen.triton import autotune

    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    real_time = autotune._time
    timed = []

    def busy_time(launch, cs, *a):  # the real times, seen as descheduled calls
        timed.append(len(cs))
        t = real_time(launch, cs, *a)
        return timing.Timing(t.seconds, 10, 10, None, timing.ATTEMPTS)

    monkeypatch.setattr(autotune, "_time", busy_time)
    cfg = triton_config(autotune=True)
    x = torch.randn(4, 40)
    run_compiled(_softmax, x, config=cfg)
    (f,) = (tmp_path / "triton").glob("tune_*.json")
    (entry,) = __import__("json").loads(f.read_text()).values()
    assert entry["contended"] is True and entry["config"] in GENERATED[-1].configs and timed == [len(GENERATED[-1].configs)]

    monkeypatch.setattr(autotune, "quiet", lambda threads: False)  # still busy: the stored choice is used
    b, out = run_compiled(_softmax, x, config=cfg)
    torch.testing.assert_close(out, _softmax(x))
    assert len(timed) == 1

    monkeypatch.setattr(autotune, "quiet", lambda threads: True)  # quiet: timed again, stored unmarked
    def quiet_time(launch, cs, *a):
        timed.append(len(cs))
        return _undisturbed(real_time(launch, cs, *a))

    monkeypatch.setattr(autotune, "_time", quiet_time)
    b, out = run_compiled(_softmax, x, config=cfg)
    torch.testing.assert_close(out, _softmax(x))
    assert len(timed) == 2
    (entry,) = __import__("json").loads(f.read_text()).values()
    assert entry in GENERATED[-1].configs


def test_autotune_writes_only_scratch_memory():
    from fxforge.codegen.triton.autotune import scratch_args

    arena = torch.randn(64)
    out, inp_overlapping, other = arena[:16], arena[8:24], torch.randn(16)
    before = arena.clone()
    args = scratch_args((out, inp_overlapping, other, 7), n_out=1)
    assert args[0].data_ptr() != out.data_ptr() and args[0].stride() == out.stride()
    assert args[1].data_ptr() != inp_overlapping.data_ptr() and torch.equal(args[1], inp_overlapping)
    assert args[2] is other and args[3] == 7
    args[0].fill_(1.0)
    args[1].fill_(2.0)
    assert torch.equal(arena, before)
