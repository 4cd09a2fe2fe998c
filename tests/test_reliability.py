"""Reliability: inputs checked where fxforge is called directly, one failure policy on every call,
every fallback explained, reports that cannot be written never cost the compile."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton import (see test_triton_codegen)

import pytest  # noqa: E402
import torch  # noqa: E402

import fxforge  # noqa: E402
from fxforge import CodegenBackend, Config, InputError, Kernel  # noqa: E402
from fxforge.codegen.registry import DEFAULT_REGISTRY  # noqa: E402
from fxforge.artifact.compiled import MAX_FAILURES  # noqa: E402

CODEGENS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("triton") is None, reason="triton is not installed"))]


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.sigmoid(self.l1(x)) * x.sum(-1, keepdim=True) + x.mean()


def _exported(dynamic: bool = False):
    torch.manual_seed(0)
    m = Mlp().eval()
    shapes = {"x": {0: torch.export.Dim("batch", min=2, max=16)}} if dynamic else None
    return m, torch.export.export(m, (torch.randn(4, 8),), dynamic_shapes=shapes)


# --------------------------------------------------------------------------- compile_exported inputs


@pytest.mark.parametrize("codegen", CODEGENS)
def test_static_export_rejects_other_batch_sizes_and_stays_compiled(codegen):
    m, ep = _exported()
    c = fxforge.compile_exported(ep, Config(codegen=codegen, debug=True))
    for batch in (2, 8):
        with pytest.raises(InputError, match=r"'x' \(args\[0\]\): size\(0\) is %d, expected 4" % batch):
            c(torch.randn(batch, 8))
    with pytest.raises((RuntimeError, AssertionError)):  # ep.module() refuses them too
        ep.module()(torch.randn(8, 8))
    x = torch.randn(4, 8)
    torch.testing.assert_close(c(x), m(x))
    assert c.failures == [] and c.failed is None


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_inputs_with_another_layout_give_the_right_values(codegen, dynamic):
    m, ep = _exported(dynamic)
    c = fxforge.compile_exported(ep, Config(codegen=codegen, debug=True))
    base = torch.randn(8, 4)
    transposed = base.t()  # (4, 8), strides (1, 4): what ep.module() accepts
    stepped = torch.randn(4, 16)[:, ::2]  # strides (16, 2)
    for x in (transposed, stepped):
        torch.testing.assert_close(c(x), ep.module()(x))
        assert c.input_copy_bytes == x.numel() * 4  # copied into the compiled layout
    x = torch.randn(4, 8)
    torch.testing.assert_close(c(x), m(x))
    assert c.input_copy_bytes == 0
    if dynamic:  # another batch size, transposed: sizes and strides both differ from the example
        z = torch.randn(8, 6).t()
        torch.testing.assert_close(c(z), m(z))
        assert c.input_copy_bytes == z.numel() * 4


def test_dtype_device_and_range_are_checked():
    m, ep = _exported(dynamic=True)
    c = fxforge.compile_exported(ep, Config(debug=True))
    with pytest.raises(InputError, match=r"'x' \(args\[0\]\): dtype is torch.float64, expected torch.float32"):
        c(torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(InputError, match="is on meta, expected cpu"):
        c(torch.randn(4, 8, device="meta"))
    with pytest.raises(InputError, match=r"size\(0\) is 32, outside the range 2..16"):
        c(torch.randn(32, 8))
    with pytest.raises(InputError, match=r"size\(1\) is 9, expected 8"):
        c(torch.randn(4, 9))
    with pytest.raises(InputError, match="expected 2 dimensions"):
        c(torch.randn(4, 8, 1))
    for batch in (2, 5, 16):  # every size the range allows runs compiled
        x = torch.randn(batch, 8)
        torch.testing.assert_close(c(x), m(x))
    assert c.failures == []


def test_same_symbol_on_two_inputs_must_agree_and_kwargs_are_named():
    class Add(torch.nn.Module):
        def forward(self, a, *, b):
            return a * 2 + b

    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(Add(), (torch.randn(4, 3),), {"b": torch.randn(4, 3)},
                             dynamic_shapes={"a": {0: batch}, "b": {0: batch}})
    c = fxforge.compile_exported(ep, Config(debug=True))
    with pytest.raises(InputError, match=r"'b' \(kwargs\['b'\]\): size\(0\) is 5, expected 6"):
        c(torch.randn(6, 3), b=torch.randn(5, 3))
    a, b = torch.randn(6, 3), torch.randn(6, 3)
    torch.testing.assert_close(c(a, b=b), a * 2 + b)


def test_a_dim_without_a_maximum_accepts_any_size_above_its_minimum():
    class Twice(torch.nn.Module):
        def forward(self, x):
            return x * 2

    batch = torch.export.Dim("batch", min=2)  # upper bound int_oo
    ep = torch.export.export(Twice(), (torch.randn(4, 3),), dynamic_shapes={"x": {0: batch}})
    c = fxforge.compile_exported(ep, Config(debug=True))
    for n in (2, 5, 1000):
        x = torch.randn(n, 3)
        torch.testing.assert_close(c(x), x * 2)
    with pytest.raises(InputError, match=r"size\(0\) is 1, outside the range 2\.\.int_oo"):
        c(torch.randn(1, 3))


def test_a_dynamic_inner_dim_is_accepted():
    class Twice(torch.nn.Module):
        def forward(self, x):
            return x * 2

    cols = torch.export.Dim("cols", min=2, max=64)  # x's stride(0) is the symbol itself
    ep = torch.export.export(Twice(), (torch.randn(4, 3),), dynamic_shapes={"x": {1: cols}})
    c = fxforge.compile_exported(ep, Config(debug=True))
    for n in (2, 3, 17):
        x = torch.randn(4, n)
        torch.testing.assert_close(c(x), x * 2)


def test_user_input_mutation_reaches_the_callers_tensor_when_restrided():
    class Bump(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2

    ep = torch.export.export(Bump(), (torch.randn(4, 3),))
    c = fxforge.compile_exported(ep, Config(debug=True))
    x = torch.randn(3, 4).t()  # another layout: the graph runs on a copy
    want = (x + 1) * 2
    before = x.clone()
    torch.testing.assert_close(c(x), want)
    torch.testing.assert_close(x, before + 1)  # the caller's tensor was mutated, not the copy only


# --------------------------------------------------------------------------- failure policy


class Trap:
    """A kernel helper that raises while armed: generated code failing on chosen calls."""

    def __init__(self):
        self.armed = 0  # calls left to fail

    def __call__(self):
        if self.armed:
            self.armed -= 1
            raise RuntimeError("trap sprung")


def _trap_backend(name, trap):
    def accepts(node, config):
        return None if node.target in (torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor) else "not mul/add"

    def compile_group(group, ctx):
        node = group.nodes[0]
        op = "mul" if node.target is torch.ops.aten.mul.Tensor else "add"
        a, b = (ctx.ref(x) if isinstance(x, torch.fx.Node) else repr(x) for x in node.args[:2])
        src = f"def {ctx.name}(a, b, out):\n    {ctx.const(trap)}()\n    torch.{op}(a, b, out=out)\n"
        args = [a, b, ctx.buffer(node, None)]
        return Kernel(ctx.name, src, args)

    return CodegenBackend(name, ("cpu",), accepts, compile_group)


@pytest.fixture
def trapped():
    trap = Trap()
    fxforge.register_backend(_trap_backend("trapped", trap))
    yield trap
    DEFAULT_REGISTRY.unregister("trapped")


def f(x, y):
    return torch.sin(x * y) + y


def test_a_later_failure_runs_that_call_eagerly_and_keeps_the_compiled_code(trapped, caplog):
    b = fxforge.backend(Config(codegen="trapped", debug=False))
    g = torch.compile(f, backend=b)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(g(x, y), f(x, y))  # first call: compiled, fine
    (c,) = b.compiled
    trapped.armed = 1
    with caplog.at_level(logging.WARNING, logger="fxforge"):
        torch.testing.assert_close(g(y, x), f(y, x))  # second call: the trap fires, eager answers
    assert c.failures == ["RuntimeError: trap sprung"] and c.failed is None
    assert "this call ran eagerly" in caplog.text
    torch.testing.assert_close(g(x, x), f(x, x))  # third call: compiled code again
    assert len(c.failures) == 1


def test_repeated_failures_switch_the_graph_to_eager_logged_once(trapped, caplog):
    b = fxforge.backend(Config(codegen="trapped", debug=False))
    g = torch.compile(f, backend=b)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    g(x, y)
    (c,) = b.compiled
    trapped.armed = 100
    with caplog.at_level(logging.WARNING, logger="fxforge"):
        for _ in range(MAX_FAILURES + 3):
            torch.testing.assert_close(g(x, y), f(x, y))
    assert len(c.failures) == MAX_FAILURES and c.failed == "RuntimeError: trap sprung"
    assert caplog.text.count("now runs eagerly") == 1
    assert trapped.armed == 100 - MAX_FAILURES  # once eager for good, the generated code is not tried


def test_the_programs_own_error_propagates_and_disables_nothing():
    def lookup(table, idx):
        return torch.nn.functional.embedding(idx, table) * 2

    b = fxforge.backend(Config(debug=False))
    g = torch.compile(lookup, backend=b)
    table = torch.randn(10, 3)
    with pytest.raises(IndexError, match="index out of range"):
        g(table, torch.tensor([1, 12]))  # eager raises the same: it is the caller's error
    (c,) = b.compiled
    assert c.failures == [] and c.failed is None
    idx = torch.tensor([3, 9])
    torch.testing.assert_close(g(table, idx), lookup(table, idx))
    assert c.failures == []


def test_backward_failure_after_inputs_are_freed_is_a_clear_error(trapped):
    from fxforge import GeneratedCodeError

    b = fxforge.backend(Config(codegen="trapped", debug=False))
    g = torch.compile(f, backend=b)
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    g(x, y).sum().backward()  # both graphs proven
    assert {c.stats["graph"] for c in b.compiled} == {"forward", "backward"}
    out = g(x, y).sum()
    trapped.armed = 1
    with pytest.raises(GeneratedCodeError, match="backward graph failed.*trap sprung.*FXFORGE_DEBUG=1"):
        out.backward()


def test_wrong_number_of_inputs_is_an_input_error():
    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(torch.randn(2, 2), torch.randn(2, 2))
    c = fxforge.spine.compile_graph(gm, Config(debug=False))
    with pytest.raises(InputError, match="takes 2 inputs, got 1"):
        c(torch.randn(2, 2))
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    torch.testing.assert_close(c(x, y), f(x, y))
    assert c.failures == []


# --------------------------------------------------------------------------- fallbacks explained


def test_kernels_that_fail_to_compile_have_their_reason_in_stats():
    def broken(group, ctx):
        raise RuntimeError("no kernel for you")

    torch_b = DEFAULT_REGISTRY.get("torch")
    fxforge.register_backend(CodegenBackend("broken_compile", ("cpu",), torch_b.accepts, broken))
    try:
        b = fxforge.backend(Config(codegen="broken_compile", debug=False))
        x, y = torch.randn(3, 3), torch.randn(3, 3)
        torch.testing.assert_close(torch.compile(f, backend=b)(x, y), f(x, y))
    finally:
        DEFAULT_REGISTRY.unregister("broken_compile")
    c = b.compiled[0]
    assert c.stats["fallback_nodes"] == len(c.stats["fallbacks"]) == 3  # mul, sin, add
    assert all("failed to compile" in r and "no kernel for you" in r for r in c.stats["fallbacks"].values())


# --------------------------------------------------------------------------- reports


def test_an_unwritable_report_dir_keeps_the_compiled_graph(tmp_path, caplog):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the report directory should be")
    b = fxforge.backend(Config(report_dir=str(blocker / "reports"), debug=True))
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    with caplog.at_level(logging.WARNING, logger="fxforge"):
        torch.testing.assert_close(torch.compile(f, backend=b)(x, y), f(x, y))
    assert len(b.compiled) == 1 and not b.failures and b.compiled[0].stats["kernels"] > 0
    assert "could not write the report" in caplog.text and "compiled graph is kept" in caplog.text


@pytest.mark.parametrize("codegen", CODEGENS)
def test_reductions_over_a_symbolic_row_length(codegen):
    """A row length printed into kernel code must stay one operand: ``acc / (8*ks0)``, not
    ``acc / 8*ks0`` (a silent miscompile of mean/var over dynamic sizes)."""
    def g(x):
        return x.mean(-1) + x.var(-1) * 2 + x.sum() / x.numel()

    b = fxforge.backend(Config(codegen=codegen, debug=True))
    cg = torch.compile(g, backend=b, dynamic=True, fullgraph=True)
    for n in (3, 5, 17):
        x = torch.randn(4, 2 * n)
        torch.testing.assert_close(cg(x), g(x))
    assert len(b.compiled) == 1
