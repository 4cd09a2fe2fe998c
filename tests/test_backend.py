"""The torch.compile backend end to end: by name, training, dynamic shapes, fallbacks, outputs,
reports, the Compiled contract, and the demo.

Every comparison is against eager on fresh random inputs, and every test checks that fxforge's
generated code really ran (a Compiled exists for the graph and did not switch to eager).
"""

from __future__ import annotations

import copy
import dataclasses
import html
import importlib
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

import fxforge
from fxforge.artifact.compiled import Compiled, KernelInfo
from fxforge.artifact.stats import STAT_KEYS
from fxforge.entry.demo import GPT, GPTConfig

backend_module = importlib.import_module("fxforge.entry.dynamo")  # fxforge.backend is the function

TINY = GPTConfig(vocab=64, seq=16, d=32, heads=2, layers=1)


@pytest.fixture
def compile_log(monkeypatch):
    """Every Compiled that fxforge's backend builds in this test, whatever Backend built it."""
    made: list[Compiled] = []
    real = backend_module.compile_graph

    def counting(*args, **kwargs):
        c = real(*args, **kwargs)
        made.append(c)
        return c

    monkeypatch.setattr(backend_module, "compile_graph", counting)
    return made


def tokens(cfg: GPTConfig, batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=g)


def assert_ran(compiled: list[Compiled], kinds: list[str]) -> None:
    assert [c.stats["graph"] for c in compiled] == kinds
    for c in compiled:
        assert not c.failures, f"{c.stats['graph']} graph's generated code failed: {c.failures}"


class MLP(nn.Module):
    def __init__(self, d: int = 24):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


# ---------------------------------------------------------------------------------------- (1)


def test_compile_by_name_inference_matches_eager(compile_log, monkeypatch):
    monkeypatch.setenv("FXFORGE_DEBUG", "1")  # the default Config raises instead of falling back
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    compiled = torch.compile(model, backend="fxforge", fullgraph=True)
    with torch.no_grad():
        for seed in (1, 2):
            idx = tokens(TINY, 3, seed)
            want = model(idx)
            got = compiled(idx)
            assert want.abs().sum() > 0
            assert_close(got, want)
    assert_ran(compile_log, ["inference"])
    assert compile_log[0].stats["kernels"] > 0


def test_compile_by_name_training_step_matches_eager(compile_log, monkeypatch):
    monkeypatch.setenv("FXFORGE_DEBUG", "1")
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="fxforge", fullgraph=True)
    x, g = torch.randn(7, 24), torch.randn(7, 24)
    compiled(x).backward(g)
    eager(x).backward(g)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert q.grad.abs().sum() > 0
        assert_close(p.grad, q.grad, msg=lambda m: f"grad of {name}: {m}")
    assert_ran(compile_log, ["forward", "backward"])


def test_entry_point_resolves_without_importing_fxforge():
    """``backend="fxforge"`` is found through the torch_dynamo_backends entry point."""
    code = textwrap.dedent(
        """
        import logging, sys, torch
        assert "fxforge" not in sys.modules
        compiled = []  # fxforge logs one DEBUG record per compiled graph on the "fxforge" logger
        handler = logging.Handler()
        handler.emit = lambda r: compiled.append(r.getMessage())
        logging.getLogger("fxforge").addHandler(handler)
        logging.getLogger("fxforge").setLevel(logging.DEBUG)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x = torch.randn(5, 8)
        with torch.no_grad():
            got = torch.compile(m, backend="fxforge", fullgraph=True)(x)
            torch.testing.assert_close(got, m(x))
        assert "fxforge" in sys.modules, "the entry point did not load fxforge"
        assert any(m.startswith("fxforge: compiled inference graph") for m in compiled), compiled
        print("OK")
        """
    )
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "fxforge"]
    assert ep.value == "fxforge.entry.dynamo:fxforge_backend"
    env = dict(os.environ, FXFORGE_DEBUG="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------- (2)


@pytest.mark.parametrize("attention", ["matmul", "sdpa"])
def test_training_step_loss_and_grads_match_eager(attention):
    cfg = dataclasses.replace(TINY, attention=attention)
    torch.manual_seed(0)
    eager = GPT(cfg)
    model = copy.deepcopy(eager)
    b = fxforge.backend(fxforge.Config(debug=True))
    compiled = torch.compile(model, backend=b, fullgraph=True)
    idx, targets = tokens(cfg, 3, 1), tokens(cfg, 3, 2)

    loss = compiled(idx, targets)
    loss.backward()
    want = eager(idx, targets)
    want.backward()
    assert_close(loss, want)
    eager_params = dict(eager.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(eager_params) > 10
    for name, p in model.named_parameters():
        q = eager_params[name]
        assert p.grad is not None, f"no gradient for {name}"
        assert q.grad.abs().sum() > 0, f"eager gradient of {name} is zero: the check would prove nothing"
        assert_close(p.grad, q.grad, msg=lambda m: f"grad of {name}: {m}")
    assert_ran(b.compiled, ["forward", "backward"])


def test_training_input_grad_matches_eager():
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager)
    b = fxforge.backend(fxforge.Config(debug=True))
    compiled = torch.compile(model, backend=b, fullgraph=True)
    x = torch.randn(6, 24)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn(6, 24)
    compiled(x1).backward(g)
    eager(x2).backward(g)
    assert_close(x1.grad, x2.grad)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert_close(p.grad, q.grad, msg=lambda m: f"grad of {name}: {m}")
    assert_ran(b.compiled, ["forward", "backward"])


# ---------------------------------------------------------------------------------------- (3)


class CountingBackend:
    """Counts the graphs dynamo compiled with the backend.

    Only completed calls count: dynamo may abandon a call half-way by raising one of its own
    restart exceptions (e.g. ``TensorifyScalarRestartAnalysis``) and trace the frame again.
    """

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, gm, example_inputs, **kwargs):
        fn = self.inner(gm, example_inputs, **kwargs)
        self.calls += 1
        return fn


@pytest.mark.parametrize("how", ["dynamic=True", "mark_dynamic"])
def test_dynamic_batch_one_compile(how):
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    b = fxforge.backend(fxforge.Config(debug=True))
    counting = CountingBackend(b)
    compiled = torch.compile(model, backend=counting, fullgraph=True, dynamic=True if how == "dynamic=True" else None)
    with torch.no_grad():
        for i, batch in enumerate((2, 3, 7)):
            idx = tokens(TINY, batch, 10 + i)
            if how == "mark_dynamic" and i == 0:
                torch._dynamo.mark_dynamic(idx, 0)
            got = compiled(idx)
            assert got.shape == (batch, TINY.seq, TINY.vocab)
            assert_close(got, model(idx))
    assert counting.calls == 1
    assert len(b.compiled) == 1
    assert_ran(b.compiled, ["inference"])
    assert any(isinstance(s, torch.SymInt) for s in _placeholder_sizes(b.compiled[0])), "the graph is not dynamic"


def test_dynamic_batch_training_one_compile():
    torch.manual_seed(0)
    eager = GPT(TINY)
    model = copy.deepcopy(eager)
    b = fxforge.backend(fxforge.Config(debug=True))
    counting = CountingBackend(b)
    compiled = torch.compile(model, backend=counting, fullgraph=True, dynamic=True)
    for i, batch in enumerate((2, 3, 5)):
        idx, targets = tokens(TINY, batch, 20 + i), tokens(TINY, batch, 30 + i)
        for m in (model, eager):
            m.zero_grad(set_to_none=True)
        loss = compiled(idx, targets)
        loss.backward()
        want = eager(idx, targets)
        want.backward()
        assert_close(loss, want)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert_close(p.grad, q.grad, msg=lambda m: f"batch {batch}, grad of {name}: {m}")
    assert counting.calls == 1
    assert_ran(b.compiled, ["forward", "backward"])


def _placeholder_sizes(c: Compiled):
    for n in c.graph.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" and isinstance(v, torch.Tensor):
            yield from v.shape


# ---------------------------------------------------------------------------------------- (4)


@torch.library.custom_op("fxforge_test_backend::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _fallback_records(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fxforge" and "fallback" in r.getMessage()]


def test_fallback_ops_config_runs_and_reports(caplog):
    caplog.set_level(logging.INFO, logger="fxforge")
    torch.manual_seed(0)
    model = MLP().eval()
    b = fxforge.backend(fxforge.Config(debug=True, fallback_ops={"aten.gelu.default"}))
    compiled = torch.compile(model, backend=b, fullgraph=True)
    x = torch.randn(5, 24)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
    assert_ran(b.compiled, ["inference"])
    s = b.compiled[0].stats
    assert s["fallback_nodes"] == 1
    (name, reason), = s["fallbacks"].items()
    assert "gelu" in name and "fallback_ops" in reason
    assert s["kernels"] > 0  # everything else still ran as kernels
    assert any("gelu" in m for m in _fallback_records(caplog)), caplog.text
    assert "aten.gelu.default(" in b.compiled[0].source  # an eager call in the wrapper


def test_fallback_ops_off_means_no_fallback():
    """The control of the test above: without the knob the same graph has no fallback."""
    assert _compiled_mlp().stats["fallback_nodes"] == 0


def test_custom_op_runs_as_fallback(caplog):
    caplog.set_level(logging.INFO, logger="fxforge")

    def f(x, w):
        return scaled_sin(x @ w, 0.5).relu() + 1

    b = fxforge.backend(fxforge.Config(debug=True))
    compiled = torch.compile(f, backend=b, fullgraph=True)
    for seed in (0, 1):
        torch.manual_seed(seed)
        x, w = torch.randn(4, 6), torch.randn(6, 5)
        assert_close(compiled(x, w), f(x, w))
    assert_ran(b.compiled, ["inference"])
    s = b.compiled[0].stats
    assert s["fallback_nodes"] >= 1
    reasons = [r for n, r in s["fallbacks"].items() if "scaled_sin" in n or "scaled_sin" in r]
    assert reasons and "custom operator" in reasons[0], s["fallbacks"]
    assert any("scaled_sin" in m for m in _fallback_records(caplog)), caplog.text


# ---------------------------------------------------------------------------------------- (5)


def test_outputs_do_not_alias_the_arena():
    """Results of call 1 survive call 2, including outputs that are views of intermediates."""

    def f(x, w):
        h = (x @ w).relu()  # an intermediate that could live in the arena
        y = h * 2 + 1
        return y, y.t(), y[:, 1:3], (h @ w.t()).sum(1)

    b = fxforge.backend(fxforge.Config(debug=True))
    compiled = torch.compile(f, backend=b, fullgraph=True)
    x1, x2, w = torch.randn(8, 6), torch.randn(8, 6), torch.randn(6, 6)
    first = compiled(x1, w)
    kept = [t.clone() for t in first]
    second = compiled(x2, w)
    for a, k, want in zip(first, kept, f(x1, w)):
        assert_close(a, k, rtol=0, atol=0)
        assert_close(a, want)
    for a, want in zip(second, f(x2, w)):
        assert_close(a, want)
    assert not torch.equal(first[0], second[0])
    assert_ran(b.compiled, ["inference"])
    assert_own_storage(first)


def assert_own_storage(outputs) -> None:
    """No output is a view into an arena.

    Today's arena is allocated per call, so a result living in it would survive the next call
    too; what gives it away is its storage: the whole arena, bigger than any output in it.
    """
    by_storage: dict[int, list[torch.Tensor]] = {}
    for t in outputs:
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    for ts in by_storage.values():
        assert ts[0].untyped_storage().nbytes() == max(t.numel() * t.element_size() for t in ts)


def test_compiled_called_directly_keeps_results():
    """The same property on the Compiled object itself, called with AOTAutograd's inputs."""

    def f(x, w1, w2):
        return ((x @ w1).tanh() @ w2).softmax(-1)

    b = fxforge.backend(fxforge.Config(debug=True))
    shapes = {(5, 6): "x", (6, 7): "w1", (7, 3): "w2"}  # distinct shapes tell the graph inputs apart
    torch.compile(f, backend=b, fullgraph=True)(*(torch.randn(s) for s in shapes))
    c = b.compiled[0]
    order = [shapes[tuple(n.meta["val"].shape)] for n in c.graph.graph.nodes if n.op == "placeholder"]
    assert sorted(order) == ["w1", "w2", "x"]
    first_in = {name: torch.randn(s) for s, name in shapes.items()}
    second_in = {name: torch.randn(s) for s, name in shapes.items()}
    (r1,) = c(*(first_in[n] for n in order))
    kept = r1.clone()
    (r2,) = c(*(second_in[n] for n in order))
    assert_close(r1, kept, rtol=0, atol=0)
    assert_own_storage([r1])
    assert_close(r1, f(**first_in))
    assert_close(r2, f(**second_in))


# ---------------------------------------------------------------------------------------- (6)


def _compiled_mlp() -> Compiled:
    b = fxforge.backend(fxforge.Config(debug=True))
    model = MLP().eval()
    with torch.no_grad():
        torch.compile(model, backend=b, fullgraph=True)(torch.randn(5, 24))
    return b.compiled[0]


def test_write_report_html(tmp_path):
    c = _compiled_mlp()
    path = tmp_path / "sub" / "report.html"
    c.write_report(str(path))
    text = path.read_text(encoding="utf-8")
    assert text.lstrip().lower().startswith("<!doctype html")
    assert text.rstrip().endswith("</html>")
    for key in ("nodes_in", "kernels", "fallback_nodes", "arena_bytes", "lower_bound_bytes", "compile_seconds"):
        assert key in text, key
    assert f"<td>arena_bytes</td><td>{c.stats['arena_bytes']}</td>" in text
    assert f"<td>nodes_in</td><td>{c.stats['nodes_in']}</td>" in text
    assert "def call(args):" in text
    for line in c.source.splitlines():  # the whole source, escaped
        assert html.escape(line) in text
    for k in c.kernels:
        assert k.name in text
    assert "<script src" not in text and "<link" not in text  # self-contained


def test_report_dir_writes_a_report_per_graph(tmp_path):
    b = fxforge.backend(fxforge.Config(debug=True, report_dir=str(tmp_path)))
    model = MLP()
    torch.compile(model, backend=b, fullgraph=True)(torch.randn(5, 24)).sum().backward()
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and all(f.endswith(".html") for f in files), files


# ---------------------------------------------------------------------------------------- (7)


def test_compiled_contract():
    c = _compiled_mlp()
    s = c.stats
    missing = set(STAT_KEYS) - set(s)
    assert not missing, missing
    for k in STAT_KEYS:
        if k == "compile_seconds":
            assert isinstance(s[k], float) and s[k] > 0
        elif k in ("refused_fusions", "refused_zero_copy"):
            assert isinstance(s[k], dict)
        elif k == "custom_ops":  # one record per tuned custom-op call site (tests/test_custom_ops.py)
            assert s[k] == []
        else:
            assert isinstance(s[k], int) and not isinstance(s[k], bool) and s[k] >= 0, (k, s[k])
    assert s["graph"] == "inference"
    assert isinstance(s["passes"], list) and s["passes"]
    assert isinstance(s["fallbacks"], dict)
    assert s["nodes_in"] > 0 and s["kernels"] > 0
    assert s["arena_bytes"] >= s["lower_bound_bytes"] > 0  # a plan cannot beat the max live bytes
    assert s["eager_live_peak_bytes"] > 0

    assert len(c.kernels) == s["kernels"]
    fields = [f.name for f in dataclasses.fields(KernelInfo)]
    assert fields == ["name", "backend", "node_count", "num_args", "unique_io_buffers"]
    for k in c.kernels:
        assert isinstance(k, KernelInfo)
        assert isinstance(k.name, str) and k.name in c.source
        assert k.backend in ("c", "torch")  # the CPU default and its extern calls
        for f in ("node_count", "num_args", "unique_io_buffers"):
            assert isinstance(getattr(k, f), int) and getattr(k, f) >= 1, (k, f)
    assert len({k.name for k in c.kernels}) == len(c.kernels)
    # the graph the kernels run: the input graph after lowering (a split may add nodes)
    assert sum(k.node_count for k in c.kernels) + s["fallback_nodes"] <= s["passes"][-1]["nodes_after"]

    assert isinstance(c.source, str) and "def call(args):" in c.source
    compile(c.source, "x", "exec")
    assert "fxforge.Compiled inference" in repr(c)


# ---------------------------------------------------------------------------------------- (8)


def test_demo_runs_and_matches_eager(tmp_path, fxforge_command):
    """``fxforge demo`` (the console script, so the CLI test need not run the demo again):
    exit 0, the table printed, and run_demo's figures (written with --json) all sound."""
    out = tmp_path / "demo.json"
    cmd = fxforge_command + ["demo", "--calls", "3", "--budget", "1", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    table = p.stdout
    for word in ("inference", "forward", "backward", "train_step", "arena", "lower bound", "compile", "ratio"):
        assert word in table, table
    *_, verdict, report = table.rstrip().splitlines()
    assert verdict.strip() == "PASS" and report.startswith("report: "), table

    r = json.loads(out.read_text())
    assert r["ok"] is True
    assert [g["graph"] for g in r["graphs"]] == ["inference", "forward", "backward"]
    assert r["failures"] == []
    assert len(r["checks"]) >= 5 and all(c["ok"] for c in r["checks"].values())
    assert any(name.startswith("grads") for name in r["checks"])
    for g in r["graphs"]:
        assert g["nodes"] > 50 and g["kernels"] > 10, g
        assert g["arena_bytes"] >= g["lower_bound_bytes"] > 0, g
        assert g["compile_seconds"] > 0
        assert f"{g['graph']:<10} {g['nodes']:>6} {g['kernels']:>8}" in table
    for what in ("inference", "train_step"):
        t = r["timing"][what]
        assert t["fxforge_s"] > 0 and t["eager_s"] > 0 and t["calls"] >= 3
        assert t["ratio"] == pytest.approx(t["fxforge_s"] / t["eager_s"])
    assert r["model"] == dataclasses.asdict(GPTConfig())


def _corrupting_registry():
    """A registry whose "torch" backend adds 0.1 to every GELU output: a deliberate miscompile."""
    from fxforge.codegen import torch_backend
    from fxforge.codegen.registry import Registry

    def compile_group(group, ctx):
        k = torch_backend.compile_group(group, ctx)
        if any(n.target is torch.ops.aten.gelu.default for n in group.nodes):
            k = dataclasses.replace(k, source=k.source.rstrip("\n") + f"\n    {k.args[-1]}.add_(0.1)\n")
        return k

    reg = Registry()
    reg.register(dataclasses.replace(torch_backend.BACKEND, compile=compile_group))
    return reg


def test_demo_detects_a_miscompile_and_exits_nonzero(monkeypatch, capsys):
    from fxforge.entry import cli, demo

    cfg = demo.GPTConfig(vocab=32, seq=8, d=16, heads=2, layers=1)
    r = demo.run_demo(cfg, batch=2, calls=1, budget_s=0.0, registry=_corrupting_registry())
    assert not r["ok"]
    assert not r["checks"]["inference logits"]["ok"]
    assert r["checks"]["inference logits"]["max_abs_err"] > 1e-3
    grads = next(v for k, v in r["checks"].items() if k.startswith("grads"))
    assert not r["checks"]["train loss"]["ok"] and not grads["ok"]

    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: r)
    assert cli.main(["demo"]) == 1
    assert "FAIL" in capsys.readouterr().out
