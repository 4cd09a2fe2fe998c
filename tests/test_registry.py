"""The codegen registry: a toy third-party backend, selection, refusal and compile failures."""

import logging
import shutil

import pytest
import torch

import fxforge
from fxforge import CodegenBackend, Config, Kernel
from fxforge.codegen.registry import DEFAULT_REGISTRY, Registry


# ---- a toy backend, as a third party would write it (the README shows the same) ----

def toy_accepts(node, config):
    if node.target not in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor):
        return "only add and mul"
    if not all(isinstance(a, torch.fx.Node) for a in node.args) or node.kwargs:
        return "scalar operands"
    return None


def toy_compile(group, ctx):
    node = group.nodes[0]
    op = "add" if node.target is torch.ops.aten.add.Tensor else "mul"
    src = f"def {ctx.name}(a, b, out):\n    torch.{op}(a, b, out=out)\n"
    args = [ctx.ref(node.args[0]), ctx.ref(node.args[1]), ctx.buffer(node, None)]
    return Kernel(ctx.name, src, args)


def model(x, y):
    return torch.sin(x * y + x) * (y + y)


@pytest.fixture
def register():
    """Register backends with fxforge (as a third party would); unregistered after the test."""
    names = []

    def reg(backend):
        names.append(backend.name)
        return fxforge.register_backend(backend)

    yield reg
    for n in names:
        DEFAULT_REGISTRY.unregister(n)


def test_toy_backend_runs_a_model(register):
    register(CodegenBackend("toy", ("cpu",), toy_accepts, toy_compile))
    b = fxforge.backend(Config(codegen="toy", debug=True))
    f = torch.compile(model, backend=b, fullgraph=True)
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    torch.testing.assert_close(f(x, y), model(x, y))
    (c,) = b.compiled
    assert {k.backend for k in c.kernels} == {"toy"}
    assert len(c.kernels) == 4  # mul, add, add(y, y), mul
    assert c.stats["fallback_nodes"] == 1  # sin
    assert "only add and mul" in c.stats["fallbacks"].values()


def test_registered_backend_selectable_by_name_globally():
    name = "toy_global_test"
    fxforge.register_backend(CodegenBackend(name, ("cpu",), toy_accepts, toy_compile))
    try:
        with pytest.raises(ValueError, match="already registered"):
            fxforge.register_backend(CodegenBackend(name, ("cpu",), toy_accepts, toy_compile))
        b = fxforge.backend(Config(codegen=name, debug=True))
        x, y = torch.randn(4, 2), torch.randn(4, 2)
        torch.testing.assert_close(torch.compile(model, backend=b)(x, y), model(x, y))
        assert b.compiled[0].kernels[0].backend == name
    finally:
        DEFAULT_REGISTRY.unregister(name)


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown codegen backend 'nope'.*torch"):
        DEFAULT_REGISTRY.get("nope")
    # checked against the registry the entry point uses, when the entry point gets the Config
    with pytest.raises(ValueError, match="Config.codegen='nope': unknown codegen backend.*torch.*register_backend"):
        fxforge.backend(Config(codegen="nope"))
    # each registered backend is listed with what it declares it does
    with pytest.raises(ValueError, match=r"torch \(ATen out= calls.*triton \(Triton kernels"):
        fxforge.compile_exported(torch.export.export(torch.nn.ReLU(), (torch.randn(2),)), Config(codegen="nope"))
    # a registry of one's own: its names are valid there, and only there
    reg = Registry()
    reg.register(DEFAULT_REGISTRY.get("torch"))
    with pytest.raises(ValueError, match="unknown codegen backend.*torch"):
        fxforge.backend(Config(codegen="c"), registry=reg)
    assert fxforge.backend(Config(codegen="torch"), registry=reg).registry is reg


def test_auto_picks_c_on_cpu_and_torch_without_a_compiler(monkeypatch):
    assert DEFAULT_REGISTRY.select(Config(), {"cpu"}).name == ("c" if shutil.which("cc") else "torch")
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert DEFAULT_REGISTRY.select(Config(), {"cpu"}).name == "torch"
    assert "no C compiler" in DEFAULT_REGISTRY.get("c").unavailable(frozenset({"cpu"}))
    assert DEFAULT_REGISTRY.select(Config(), {"cuda"}).name != "c"


def test_kernel_that_fails_to_compile_falls_back(register, caplog):
    def broken_compile(group, ctx):
        raise RuntimeError("no kernel for you")

    register(CodegenBackend("broken", ("cpu",), toy_accepts, broken_compile))
    b = fxforge.backend(Config(codegen="broken", debug=False))
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    with caplog.at_level(logging.WARNING, logger="fxforge"):
        out = torch.compile(model, backend=b)(x, y)
    torch.testing.assert_close(out, model(x, y))
    c = b.compiled[0]
    assert c.stats["kernels"] == 0 and c.stats["fallback_nodes"] == 5
    assert "no kernel for you" in caplog.text


def test_kernel_source_that_does_not_run_falls_back_to_eager(register, caplog):
    def bad_source(group, ctx):
        k = toy_compile(group, ctx)
        k.source = k.source.replace("torch.", "torch.not_a_function_")
        return k

    register(CodegenBackend("badsrc", ("cpu",), toy_accepts, bad_source))
    b = fxforge.backend(Config(codegen="badsrc", debug=False))
    f = torch.compile(model, backend=b)
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    with caplog.at_level(logging.WARNING, logger="fxforge"):
        torch.testing.assert_close(f(x, y), model(x, y))
        assert len(b.compiled[0].failures) == 1 and b.compiled[0].failed is None  # that call ran eagerly
        for _ in range(3):
            torch.testing.assert_close(f(y, x), model(y, x))
    assert b.compiled[0].failed is not None and "not_a_function" in b.compiled[0].failed
    assert "this call ran eagerly" in caplog.text and "now runs eagerly" in caplog.text
