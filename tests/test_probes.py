"""Backends' emitter probes memoized by group structure (fxforge/codegen/probes.py): the memo
tells apart what an emitter reads, and never changes a decision or a line of generated code."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
from hypothesis import given, settings
from torch.fx.experimental.proxy_tensor import make_fx

import fxforge
from fxforge.codegen import probes
from fxforge.codegen.c import backend as c_backend, build
from fxforge.codegen.c.kernel import CEmitter
from fxforge.codegen.triton import backend as triton_backend
from fxforge.codegen.triton.kernel import Emitter
from fxforge.spine import compile_graph
from fxforge.core.graph import BACKEND, GROUP, PROBES
from fxforge.testing import graphs, profile

aten = torch.ops.aten
needs_cc = pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine")


def _compute(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _key(fn, *args, pick=None, outputs=None):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    nodes = _compute(gm) if pick is None else pick(_compute(gm))
    return probes.structure(nodes, outputs(nodes) if outputs else None)


def test_structure_is_the_group_up_to_names():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = make_fx(lambda a, b: ((a * 1.5 + b).tanh() * 1.5 + b).tanh(), tracing_mode="fake")(x, y)
    n = _compute(gm)
    assert len(n) == 6 and len({m.name for m in n}) == 6
    # the second block reads the first block's result where the first read a: same structure
    assert probes.structure(n[:3], None) == probes.structure(n[3:], None)


def test_structure_tells_apart_what_an_emitter_reads():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    base = _key(lambda a, b: (a * 1.5 + b).tanh(), x, y)
    assert base == _key(lambda a, b: (a * 1.5 + b).tanh(), x.clone(), y.clone())
    different = {
        "the same tensor twice": _key(lambda a, b: (a * 1.5 + a).tanh(), x, y),
        "a constant": _key(lambda a, b: (a * 2.5 + b).tanh(), x, y),
        "an op": _key(lambda a, b: (a * 1.5 + b).sigmoid(), x, y),
        "a shape": _key(lambda a, b: (a * 1.5 + b).tanh(), torch.randn(4, 9), torch.randn(4, 9)),
        "a dtype": _key(lambda a, b: (a * 1.5 + b).tanh(), x.double(), y.double()),
        "strides": _key(lambda a, b: (a * 1.5 + b).tanh(), torch.randn(8, 4).t(), y),
        "a storage offset": _key(lambda a, b: (a * 1.5 + b).tanh(), torch.randn(5, 8)[1:], y),
        "a broadcast": _key(lambda a, b: (a * 1.5 + b).tanh(), x, torch.randn(8)),
        "the outputs": _key(lambda a, b: (a * 1.5 + b).tanh(), x, y, outputs=lambda n: n[1:]),
        "fewer members": _key(lambda a, b: (a * 1.5 + b).tanh(), x, y, pick=lambda n: n[1:]),
        "-0.0 against 0.0": _key(lambda a, b: (a * -0.0 + b).tanh(), x, y),
    }
    assert _key(lambda a, b: (a * 0.0 + b).tanh(), x, y) != different["-0.0 against 0.0"]
    for what, key in different.items():
        assert key != base, what


def test_structure_tells_a_members_output_from_a_tensor_read():
    x = torch.randn(4, 8)

    def f(a):
        var, mean = torch.var_mean(a, dim=1, keepdim=True)
        return (a - mean) * var

    gm = make_fx(f, tracing_mode="fake")(x)
    nodes = _compute(gm)
    vm = next(n for n in nodes if n.target == aten.var_mean.correction)
    items = [n for n in nodes if n.args and n.args[0] is vm]
    rest = [n for n in nodes if n is not vm and n not in items]
    # the getitems outside the group: with the var_mean in it they are its outputs, without it reads
    assert probes.structure([vm, *rest], None)[1] != probes.structure(rest, None)[1]
    assert ("item", 0, 1) in probes.structure([vm, *rest], None)[1]


def _groups(gm: fx.GraphModule) -> list[tuple]:
    by: dict = {}
    for n in gm.graph.nodes:
        if GROUP in n.meta:
            by.setdefault(n.meta[GROUP], []).append((n.name, n.meta.get(BACKEND)))
    return sorted(tuple(v) for v in by.values())


def _compile_both(gm, cfg, monkeypatch):
    """``gm`` compiled with the memo and without it: (compiled, emitter runs) each."""
    module, emitter = {"c": (c_backend, CEmitter), "triton": (triton_backend, Emitter)}[cfg.codegen]
    runs = []
    real = emitter.emit
    monkeypatch.setattr(emitter, "emit", lambda self: runs.append(self.name) or real(self))
    with_memo = compile_graph(copy.deepcopy(gm), cfg)
    memo_runs = len(runs)
    runs.clear()
    with monkeypatch.context() as m:
        m.setattr(module, "memoized", lambda tag, nodes, outputs, probe: probe())
        without = compile_graph(copy.deepcopy(gm), cfg)
    return (with_memo, memo_runs), (without, len(runs))


@pytest.mark.parametrize("codegen", ["c", "triton"])
def test_memo_changes_no_decision_and_no_line_of_code(codegen, monkeypatch):
    """Twelve repeated pointwise blocks: the probes run once per distinct group, not once per
    candidate; the groups, the backends and the generated source are the same without the memo."""
    if codegen == "c" and build.compiler() is None:
        pytest.skip("no C compiler (cc, or $CC) on this machine")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    def f(x, y):
        for _ in range(12):
            x = torch.sigmoid(x * 1.5 + y) - 0.5
            x = torch.sinh(x)  # not a C op (no vector sinh): a torch kernel between the C groups
        return x

    x, y = torch.randn(8, 32), torch.randn(8, 32)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    # (not in debug mode: there every merge the facts answer is checked against the emitter too)
    cfg = fxforge.Config(codegen=codegen, debug=False)
    (a, runs_a), (b, runs_b) = _compile_both(gm, cfg, monkeypatch)
    assert _groups(a.graph) == _groups(b.graph)
    assert a.source == b.source
    assert a.stats["kernels"] == b.stats["kernels"] and a.stats["refused"] == b.stats["refused"]
    assert a.stats["fallbacks"] == b.stats["fallbacks"]  # (a kept refusal is said in each node's own names)
    torch.testing.assert_close(a(x, y), f(x, y))
    assert PROBES not in a.graph.meta and PROBES not in gm.meta
    # each of the 60 nodes is probed alone: 5 distinct ops, so 55 emitter runs fewer at least
    # (refusals kept too: C refuses the 12 sinhs, and is asked once)
    assert runs_b - runs_a >= 55, (runs_a, runs_b)
    if codegen == "c":  # 12 groups between the sinhs, each merge candidate one of 12 repeats (the
        # pointwise merges are answered from the members' facts, ir/facts.py, memo or not)
        kernels = sum(1 for k in a.kernels if k.backend == "c")
        assert kernels == 12 and runs_b > 2 * runs_a and runs_a <= kernels + 10, (runs_a, runs_b, kernels)


@needs_cc
@settings(profile(), max_examples=25, deadline=None)
@given(graphs(ops=("unary", "binary", "reduction", "view", "var_mean", "native_layer_norm", "convert", "index"),
              exclude=("remainder", "sign"), dtypes=(torch.float32, torch.int64), max_ops=8, max_dim=5))
def test_random_graphs_compile_the_same_with_and_without_the_memo(example):
    gm, inputs = example
    cfg = fxforge.Config(codegen="c", debug=True)
    with pytest.MonkeyPatch.context() as mp:
        (a, _), (b, _) = _compile_both(gm, cfg, mp)
    assert _groups(a.graph) == _groups(b.graph)
    assert a.source == b.source


@needs_cc
def test_apply_passes_leaves_no_memo_in_the_graph():
    """A user's own pass list through ``apply_passes``: the memo the fusion pass filled is gone."""
    from fxforge.spine import default_passes

    x, y = torch.randn(8, 32), torch.randn(8, 32)
    gm = make_fx(lambda a, b: ((a * 1.5 + b).tanh() * 1.5 + b).tanh(), tracing_mode="fake")(x, y)
    cfg = fxforge.Config(codegen="c")
    seen = []
    real = probes.memoized

    def spy(tag, nodes, outputs, probe):
        seen.append(PROBES in nodes[0].graph.owning_module.meta)
        return real(tag, nodes, outputs, probe)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(c_backend, "memoized", spy)
        out = fxforge.apply_passes(gm, default_passes(cfg, fxforge.codegen.registry.DEFAULT_REGISTRY, gm, "graph"))
    assert seen and any(seen)  # the memo was there while the passes ran
    assert PROBES not in out.meta and PROBES not in gm.meta


def test_a_refusal_is_kept_and_said_again_in_the_other_groups_names():
    """A group the emitter refuses is not probed again for a group of the same structure; the
    refusal raised for it names that group's own nodes and inputs."""
    from fxforge.codegen.ir.values import Unsupported

    gm = make_fx(lambda x, y: (torch.sinh(x) + y, torch.sinh(y) + x), tracing_mode="fake")(torch.randn(4),
                                                                                         torch.randn(4))
    sinhs = [n for n in gm.graph.nodes if n.target == torch.ops.aten.sinh.default]
    runs = []

    def probe(n):
        def run():
            runs.append(n.name)
            raise Unsupported(f"{n.name} reads {n.args[0].name}; {n.name}x is another name")
        return run

    PROBES.set(gm, {})
    try:
        said = []
        for n in sinhs:
            with pytest.raises(Unsupported) as info:
                probes.memoized("c", [n], None, probe(n))
            said.append(str(info.value))
    finally:
        PROBES.clear(gm)
    a, b = sinhs
    assert runs == [a.name]
    assert said == [f"{a.name} reads {a.args[0].name}; {a.name}x is another name",
                    f"{b.name} reads {b.args[0].name}; {a.name}x is another name"]
