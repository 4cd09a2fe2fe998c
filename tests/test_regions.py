"""Compiled regions: each ``invoke_subgraph`` body (``torch.compiler.nested_compile_region``, and
the forward and backward bodies AOTAutograd partitions it into) compiled once by the pipeline and
called from every site (``spine.compile_regions``), against eager: values and gradients, over
several calls, static and dynamic sizes."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn

import fxforge
import fxforge.spine as spine
from fxforge.codegen.c import build
from fxforge.core.graph import region_body
from fxforge.report.html import render


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.a, self.b = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(self.ln(x))))


class Model(nn.Module):
    def __init__(self, d=16, n=5):
        super().__init__()
        self.emb = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        x = torch.tanh(self.emb(x))
        for b in self.blocks:
            x = b(x) * 0.5
        return x


@pytest.fixture
def region_compiles(monkeypatch):
    """The region bodies the spine compiles, by name, in order."""
    compiled, real = [], spine._start

    def counting(gm, config, kind, registry, passes, region, cache):
        if region:
            compiled.append(region)
        return real(gm, config, kind, registry, passes, region, cache)

    monkeypatch.setattr(spine, "_start", counting)
    return compiled


def _step(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("codegen", ["c", "torch"])
def test_a_region_is_compiled_once_and_called_at_every_site(codegen, region_compiles):
    torch.manual_seed(0)
    model, ref = Model(), None
    ref = copy.deepcopy(model)
    be = fxforge.backend(fxforge.Config(codegen=codegen, debug=True))
    f = torch.compile(model, backend=be, fullgraph=True)
    for _ in range(2):  # the second step runs over what the first left (kept arenas)
        x = torch.randn(4, 16)
        loss, grads = _step(f, x)
        loss_r, grads_r = _step(ref, x)
        torch.testing.assert_close(loss, loss_r)
        for g, gr in zip(grads, grads_r):
            torch.testing.assert_close(g, gr)
    with torch.no_grad():
        x = torch.randn(3, 16)
        torch.testing.assert_close(f(x), ref(x))
    kinds = [c.stats["graph"] for c in be.compiled]
    assert kinds == ["forward", "backward", "inference"]
    assert len(region_compiles) == 3  # one body each: forward, backward, inference
    for c in be.compiled:
        (r,) = c.stats["regions"]
        sites = [n for n in c.graph.graph.nodes if region_body(n) is not None]
        assert r["sites"] == [n.name for n in sites] and len(sites) >= 4
        assert c.stats["fallback_nodes"] == 0 and r["kernels"] > 0
        assert c.source.count(f"region {r['name']}, compiled once") == len(sites)


def test_identical_bodies_share_one_compile(region_compiles):
    """Two body modules holding the same program (the same code over inputs of the same
    layouts) are compiled once for both."""
    graphs = []

    def capture(gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        def keep(g, _):
            graphs.append(g)
            return g
        return aot_autograd(fw_compiler=keep, inference_compiler=keep)(gm, example_inputs)

    torch.manual_seed(0)
    model = Model(n=4)
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(model, backend=capture, fullgraph=True)(x)
    (gm,) = graphs
    calls = [n for n in gm.graph.nodes if region_body(n) is not None]
    assert len(calls) >= 2
    gm.body_copy = copy.deepcopy(region_body(calls[-1]))
    with gm.graph.inserting_before(calls[-1]):
        calls[-1].args = (gm.graph.get_attr("body_copy"), *calls[-1].args[1:])
    gm.recompile()
    assert region_body(calls[-1]) is not region_body(calls[0])
    inputs = [torch.randn(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "placeholder"]
    expected = gm(*inputs)
    c = fxforge.spine.compile_graph(gm, fxforge.Config(debug=True), kind="inference")
    (r,) = c.stats["regions"]
    assert len(r["sites"]) == len(calls) and len(region_compiles) == 1
    torch.testing.assert_close(c(*inputs), expected)


def test_a_region_input_laid_out_otherwise_is_copied_to_the_traced_layout():
    """A caller may pass a region a value laid out otherwise than the body was traced with (a
    region of a zero-copy cat, a tensor an ATen kernel returned): the body's kernels index at
    the traced strides, so its wrapper copies such an input first."""
    torch.manual_seed(0)
    model = Model(n=2)
    be = fxforge.backend(fxforge.Config(debug=True))
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(model, backend=be, fullgraph=True)(x)
        (c,) = be.compiled
        (region,) = c.regions
        assert "as_traced(" in region.compiled.source
        body = region_body(next(n for n in c.graph.graph.nodes if region_body(n) is not None))
        phs = [n for n in body.graph.nodes if n.op == "placeholder"]
        args = [torch.randn(n.meta["val"].shape) for n in phs]
        expected = body(*args)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        # the activation (the one input of the body's shape [4, 16]) passed transposed in memory
        k = next(i for i, n in enumerate(phs) if tuple(n.meta["val"].shape) == (4, 16))
        args[k] = args[k].t().contiguous().t()
        assert args[k].stride() != tuple(phs[k].meta["val"].stride())
        got = region.call(list(args))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_dynamic_sizes_compile_the_region_once_for_every_size(region_compiles):
    torch.manual_seed(0)
    model = Model(n=3)
    ref = copy.deepcopy(model)
    be = fxforge.backend(fxforge.Config(debug=True))
    f = torch.compile(model, backend=be)
    x = torch.randn(4, 16)
    torch._dynamo.mark_dynamic(x, 0)
    with torch.no_grad():
        for n in (4, 7, 2):
            y = torch.randn(n, 16) if n != 4 else x
            torch.testing.assert_close(f(y), ref(y))
    assert len(be.compiled) == 1 and len(region_compiles) == 1
    assert be.compiled[0].stats["fallback_nodes"] == 0


@pytest.mark.parametrize("stage", ["emit", "finish"])
def test_a_region_that_fails_to_compile_runs_eagerly(monkeypatch, caplog, stage):
    """A body that fails in its passes is left to its nodes (eager ``invoke_subgraph``); one that
    fails when linked (its kernels built) runs as its graph module at every call site.  Either
    way the caller's fallbacks name the sites and the values are eager's."""
    real = getattr(spine, f"_{stage}")

    def failing(*args, **kwargs):
        emitted_region = args[-1] if stage == "emit" else args[0].region
        if emitted_region:
            raise RuntimeError("planted failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(spine, f"_{stage}", failing)
    torch.manual_seed(0)
    model = Model(n=3)
    ref = copy.deepcopy(model)
    be = fxforge.backend(fxforge.Config(debug=False))
    x = torch.randn(4, 16)
    with caplog.at_level(logging.WARNING, logger="fxforge"), torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=be, fullgraph=True)(x), ref(x))
    assert "planted failure" in caplog.text and "its calls run it eagerly" in caplog.text
    (c,) = be.compiled
    sites = [n.name for n in c.graph.graph.nodes if region_body(n) is not None]
    assert c.stats["regions"] == [] and set(sites) <= set(c.stats["fallbacks"])


def test_the_report_shows_each_region_once_with_its_call_sites():
    torch.manual_seed(0)
    model = Model(n=4)
    be = fxforge.backend(fxforge.Config())
    _step(torch.compile(model, backend=be, fullgraph=True), torch.randn(4, 16))
    page = render(be.compiled)
    for c in be.compiled:
        (r,) = c.stats["regions"]
        tab = f"{c.stats['graph']} region {r['name']}"
        assert page.count(f">{tab}</button>") == 1
        assert all(f"<code>{s}</code>" in page for s in r["sites"])


@pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine")
def test_a_regions_kernels_start_building_before_its_caller_is_compiled(monkeypatch, tmp_path):
    """Once a wrapper's kernels are all emitted, its last C units start building (``CUnit.seal``):
    a region's body, linked with its caller, builds while the caller's passes run, rather than
    after them; every unit of every wrapper is submitted before ``link`` waits for it."""
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    events, submitted_at_link = [], []
    real_built, real_seal, real_passes = build.CUnit.built, build.CUnit.seal, spine._run_passes

    def built(self):
        submitted_at_link.append(len(self._builds) == len(self.units()) > 0)
        return real_built(self)

    def seal(self):
        real_seal(self)
        events.append("seal" if self._builds else "nothing to build")

    def run_passes(gm, config, kind, registry, passes, progress, recorder):
        calls = any(spine.REGION.get(n) is not None for n in gm.graph.nodes)
        events.append("caller passes" if calls else "body passes")
        return real_passes(gm, config, kind, registry, passes, progress, recorder)

    monkeypatch.setattr(build.CUnit, "built", built)
    monkeypatch.setattr(build.CUnit, "seal", seal)
    monkeypatch.setattr(spine, "_run_passes", run_passes)
    torch.manual_seed(0)
    model, x = Model(), torch.randn(4, 16, requires_grad=True)
    ref = _step(copy.deepcopy(model), x)
    got = _step(torch.compile(model, backend=fxforge.backend(fxforge.Config(codegen="c"))), x)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    # forward and backward: each body's units are building when its caller's passes start
    assert events.count("caller passes") == 2, events
    for i, e in enumerate(events):
        if e == "caller passes":
            assert events[i - 2:i] == ["body passes", "seal"], events
    assert submitted_at_link and all(submitted_at_link), submitted_at_link
