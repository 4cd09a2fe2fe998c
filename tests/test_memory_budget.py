"""Training under ``Config(memory_budget=...)`` (passes/memory_budget.py): the step's peak, as the
profiler's allocation events measure it, stays within the budget; losses and gradients match eager
(dropout included: its masks are saved, never drawn again); an impossible budget raises
``MemoryBudgetError`` naming the least reachable peak; a budget the default choice meets changes
nothing."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fxforge
from fxforge import MemoryBudgetError
from fxforge.testing.strategies import graphs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import measure  # noqa: E402  (bench/measure.py: the bench's allocation-event peak)


class Blocks(torch.nn.Module):
    """Pre-norm residual blocks with dropout: saved activations dominate the step."""

    def __init__(self, d: int = 128, layers: int = 4, p: float = 0.1):
        super().__init__()
        self.norm = torch.nn.ModuleList([torch.nn.LayerNorm(d) for _ in range(layers)])
        self.up = torch.nn.ModuleList([torch.nn.Linear(d, 2 * d) for _ in range(layers)])
        self.down = torch.nn.ModuleList([torch.nn.Linear(2 * d, d) for _ in range(layers)])
        self.p = p

    def forward(self, x):
        for norm, up, down in zip(self.norm, self.up, self.down):
            h = torch.nn.functional.gelu(up(norm(x)))
            x = x + torch.nn.functional.dropout(down(h), self.p, self.training)
        return x.square().mean()


def _step(m, x, seed=7):
    for p in m.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = m(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in m.parameters()]


def _compiled(model, budget):
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(memory_budget=budget))
    return torch.compile(copy.deepcopy(model), backend=b), b


def _budget_error(e: BaseException) -> MemoryBudgetError | None:
    while e is not None:
        if isinstance(e, MemoryBudgetError):
            return e
        e = getattr(e, "inner_exception", None) or e.__cause__
    return None


@pytest.mark.parametrize("budget", [0.8, 0.7])
def test_a_budget_is_met_and_the_step_matches_eager(budget):
    torch.manual_seed(0)
    model = Blocks()
    x = torch.randn(2048, 128)
    loss, grads = _step(model, x)
    cm, b = _compiled(model, budget)
    got, got_grads = _step(cm, x)
    torch.testing.assert_close(got, loss)
    for g, r in zip(got_grads, grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    forward = next(c for c in b.compiled if c.stats["graph"] == "forward")
    plan = forward.stats["memory_budget"]
    assert plan["budget_bytes"] == int(budget * plan["default_peak_bytes"])
    assert plan["planned_peak_bytes"] <= plan["budget_bytes"]
    assert plan["recomputed"], "a budget under the default peak recomputes something"
    assert not any("dropout" in name for name in plan["recomputed"])
    backward = next(c for c in b.compiled if c.stats["graph"] == "backward")
    assert "native_dropout(" not in backward.source  # masks saved, never drawn again
    for p in cm.parameters():
        p.grad = None
    measured = measure.peak_bytes(lambda: _step(cm, x), "cpu")["peak_bytes"]
    assert measured <= plan["budget_bytes"], (measured, plan)
    # the unconstrained step peaks higher: the budget is what lowered it
    full, _ = _compiled(model, None)
    _step(full, x)
    for p in full.parameters():
        p.grad = None
    assert measure.peak_bytes(lambda: _step(full, x), "cpu")["peak_bytes"] > plan["budget_bytes"]


def test_an_impossible_budget_raises_a_clear_error():
    torch.manual_seed(0)
    model = Blocks(layers=2)
    cm, _ = _compiled(model, 4096)
    with pytest.raises(Exception) as info:
        _step(cm, torch.randn(256, 128))
    err = _budget_error(info.value)
    assert err is not None, info.value
    msg = str(err)
    assert "Config.memory_budget" in msg and "least peak" in msg and "4.0 KiB" not in msg
    assert "Raise memory_budget to at least" in msg


def test_a_budget_the_default_meets_changes_nothing():
    torch.manual_seed(0)
    model = Blocks(layers=2)
    x = torch.randn(256, 128)
    runs = {}
    for budget in (None, 1.0):
        cm, b = _compiled(model, budget)
        runs[budget] = _step(cm, x)
        backward = next(c for c in b.compiled if c.stats["graph"] == "backward")
        runs[budget] += (backward.stats["saved_activation_bytes"], backward.source.count("native_dropout("))
        if budget is not None:
            plan = b.compiled[0].stats["memory_budget"]
            assert plan["planned_peak_bytes"] == plan["default_peak_bytes"] <= plan["budget_bytes"]
    (loss, grads, saved, drops), (loss1, grads1, saved1, drops1) = runs[None], runs[1.0]
    assert saved == saved1 and drops == drops1 == 0  # the same values saved; no dropout drawn again
    torch.testing.assert_close(loss1, loss, rtol=0, atol=0)
    for g, r in zip(grads1, grads):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_where_recompute_cannot_help_the_error_names_the_default_peak():
    # the backward reads only the inputs and a random op's result: nothing to recompute
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(256, 256))

        def forward(self, x):
            return torch.nn.functional.dropout(x @ self.w, 0.5, True).sum()

    cm, _ = _compiled(Noisy(), 0.5)
    with pytest.raises(Exception) as info:
        _step(cm, torch.randn(256, 256))
    err = _budget_error(info.value)
    assert err is not None, info.value
    least = str(err).split("is ")[1].split(" (")[0]
    default = str(err).split("peaks at ")[1].split(")")[0]
    assert least == default, str(err)


def test_memory_budget_is_checked():
    for bad in (0, -5, 1.5, 0.0, "1GB", True):
        with pytest.raises(ValueError, match="memory_budget"):
            fxforge.Config(memory_budget=bad)
    assert fxforge.Config(memory_budget=0.5).memory_budget == 0.5
    assert fxforge.Config(memory_budget=1 << 30).memory_budget == 1 << 30


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(graphs(ops=["unary", "binary", "reduction", "view", "matmul", "multi_output"], exclude=["sign", "remainder"],
              dtypes=[torch.float32], dynamic=False, max_ops=8, max_dim=8),
       st.sampled_from([0.5, 0.75]))
def test_random_training_graphs_meet_the_budget_or_say_why(graph, budget):
    gm, inputs = graph
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    assume(any(t.requires_grad for t in inputs))

    def loss(fn, args):
        outs = fn(*args)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        floats = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        return sum(o.float().sum() for o in floats) if floats else None

    ref = loss(gm, inputs)
    assume(ref is not None and torch.isfinite(ref).item())
    want = torch.autograd.grad(ref, [t for t in inputs if t.requires_grad], allow_unused=True)
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(memory_budget=budget))
    args = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    try:
        got = loss(torch.compile(gm, backend=b), args)
        grads = torch.autograd.grad(got, [t for t in args if t.requires_grad], allow_unused=True)
    except Exception as e:
        err = _budget_error(e)
        if err is None:
            raise
        assert "least peak" in str(err)
        return
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, want):
        if r is None:
            assert g is None or not g.abs().max().item()
        else:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
    for c in b.compiled:
        plan = c.stats.get("memory_budget")
        if plan is not None:
            assert plan["planned_peak_bytes"] <= plan["budget_bytes"]


def test_the_report_lists_what_is_saved_and_recomputed():
    from fxforge.report.html import render

    torch.manual_seed(0)
    model = Blocks(layers=2)
    cm, b = _compiled(model, 0.8)
    _step(cm, torch.randn(1024, 128))
    html = render(b.compiled)
    plan = b.compiled[0].stats["memory_budget"]
    assert "Memory budget" in html and plan["recomputed"] and plan["saved"]
    for name in [*plan["saved"], *plan["recomputed"]]:
        assert f"<code>{name}</code>" in html


def _conv_net(channels: int = 16) -> tuple[torch.nn.Module, torch.Tensor]:
    """Convolutions with batch norms (training) and a classifier, and a batch for it."""
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, channels, 3, padding=1), torch.nn.BatchNorm2d(channels), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Conv2d(channels, channels, 3, padding=1), torch.nn.BatchNorm2d(channels), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(channels, 10))
    return model, torch.randn(64, 3, 16, 16)


def _conv_step(m: torch.nn.Module, x: torch.Tensor):
    for p in m.parameters():
        p.grad = None
    loss = m(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in m.parameters()]


def test_batch_norm_results_are_recomputed_from_batch_statistics():
    """A training-mode batch norm's result is recomputed from the batch statistics it saved; it
    updates its running statistics in the forward, which the backward must never read (saved,
    they would be the updated tensors)."""
    model, x = _conv_net()
    eager = copy.deepcopy(model)
    loss, grads = _conv_step(eager, x)
    cm, b = _compiled(model, 0.85)
    got, got_grads = _conv_step(cm, x)
    plan = b.compiled[0].stats["memory_budget"]
    assert plan["planned_peak_bytes"] <= plan["budget_bytes"] < plan["default_peak_bytes"]
    assert any(name.startswith("relu") for name in plan["recomputed"])  # from the batch norm's statistics
    torch.testing.assert_close(got, loss, rtol=1e-4, atol=1e-5)
    for g, r in zip(got_grads, grads):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-4)
    for name, buf in eager.named_buffers():  # the running statistics moved as eager's did
        torch.testing.assert_close(dict(cm._orig_mod.named_buffers())[name], buf, rtol=1e-4, atol=1e-5)


class Attention(torch.nn.Module):
    """Self-attention blocks with dropout on the probabilities: the backward reads transposes of
    saved values (forward nodes only the backward runs), and the probabilities dominate."""

    def __init__(self, d=64, heads=4, layers=3):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.ModuleList([torch.nn.Linear(d, 3 * d) for _ in range(layers)])
        self.out = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(layers)])

    def forward(self, x):
        b, t, d = x.shape
        for qkv, out in zip(self.qkv, self.out):
            q, k, v = qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            p = torch.nn.functional.dropout(torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1), 0.1, self.training)
            x = x + out((p @ v).transpose(1, 2).reshape(b, t, d))
        return x.square().mean()


def test_the_choice_is_tight_and_the_same_every_compile():
    """The recompute set stops near the budget (the quick estimate tracks the plans: a value only
    the backward reads does not stretch the forward's lifetimes), and two compiles of one model
    choose the same values (node sets are walked in graph order, never hash order)."""
    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(4, 128, 64)
    loss, grads = _step(model, x)
    chosen = []
    for _ in range(2):
        cm, b = _compiled(model, 0.8)
        got, got_grads = _step(cm, x)
        torch.testing.assert_close(got, loss)
        for g, r in zip(got_grads, grads):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
        plan = next(c for c in b.compiled if c.stats["graph"] == "forward").stats["memory_budget"]
        assert 0.9 * plan["budget_bytes"] <= plan["planned_peak_bytes"] <= plan["budget_bytes"], plan
        chosen.append(sorted(plan["recomputed"]))
    assert chosen[0] == chosen[1]


def test_the_error_breaks_the_least_peak_down_as_the_memory_plan_holds_it():
    """An unreachable budget's error says which graph's plan peaks and what it holds there: its
    arenas, the storages outside them and an eager convolution's own workspace, which add up to
    the least peak it names."""
    import re

    torch.manual_seed(0)
    # (a wide input, narrow outputs: the first convolution's backward reorders the input, the
    # largest thing live in the backward)
    model = torch.nn.Sequential(torch.nn.Conv2d(64, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1))
    cm, _ = _compiled(model, 0.1)
    x = torch.randn(8, 64, 32, 32)
    with pytest.raises(Exception) as info:
        cm(x).sum().backward()
    err = _budget_error(info.value)
    assert err is not None, info.value
    msg = str(err)
    least = float(re.search(r"least peak fxforge found by recomputing in the backward is ([\d.]+) MiB", msg)[1])
    where = re.search(r"the (forward|backward)'s memory plan peaks there with (.*?)\. Live there", msg)
    assert where is not None, msg
    parts = dict((what, float(mib)) for what, mib in re.findall(r"([^,]+?) ([\d.]+) MiB", where[2]))
    assert "convolution_backward" in where[2] and "workspace" in where[2], msg
    assert abs(sum(parts.values()) - least) <= 0.05 * len(parts) + 0.01, (parts, least)


def test_the_backward_orders_recomputation_as_the_autograd_engine_would(monkeypatch):
    """Each choice's backward is ordered in place (no graph copied per trial) exactly as
    AOTAutograd's reordering orders it: recomputed values just before their first reader."""
    from torch._functorch.partitioners import reordering_to_mimic_autograd_engine

    from fxforge.passes import memory_budget

    ordered = memory_budget.backward_order
    compared = []

    def compare(graph):
        before = [n.name for n in graph.nodes]
        ref = reordering_to_mimic_autograd_engine(torch.fx.GraphModule(torch.nn.Module(), copy.deepcopy(graph)))
        ordered(graph)
        compared.append(([n.name for n in graph.nodes], [n.name for n in ref.graph.nodes], before))

    monkeypatch.setattr(memory_budget, "backward_order", compare)
    torch.manual_seed(0)
    model, x = Blocks(), torch.randn(8, 64, 128)
    loss, grads = _step(model, x)
    cm, _ = _compiled(model, 0.6)
    got, got_grads = _step(cm, x)
    torch.testing.assert_close(got, loss)
    for g, r in zip(got_grads, grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    assert any(ref_order != before for _, ref_order, before in compared)  # (something was moved)
    for got_order, ref_order, _ in compared:
        assert got_order == ref_order


def test_the_chosen_graphs_compile_from_their_plans(monkeypatch):
    """The partitioner plans each choice it weighs (passes, schedule, memory plan); the forward
    and backward it hands over are compiled from those plans, not passed again (the forward
    planned with its saved values' layouts free, the backward with them as the forward lays them
    out, as the compile has them), and the step is eager's. A plan made under other metadata, kind
    or Config is not taken."""
    import dataclasses

    from fxforge import spine
    from fxforge.core.graph import INPUT_STRIDES

    monkeypatch.setenv("FXFORGE_GRAPH_CACHE", "0")  # (a graph loaded from the cache runs no passes)
    ahead, passes = [], []
    plan_ahead, run_passes = spine.plan_ahead, spine._run_passes

    def counted_plan_ahead(gm, config, kind, registry):
        ahead.append(plan_ahead(gm, config, kind, registry))
        return ahead[-1]

    def counted_run_passes(gm, config, kind, *args):
        passes.append(kind)
        return run_passes(gm, config, kind, *args)

    monkeypatch.setattr(spine, "plan_ahead", counted_plan_ahead)
    monkeypatch.setattr(spine, "_run_passes", counted_run_passes)
    model, x = _conv_net(channels=12)
    loss, grads = _conv_step(copy.deepcopy(model), x)
    cm, b = _compiled(model, 0.85)
    got, got_grads = _conv_step(cm, x)
    torch.testing.assert_close(got, loss, rtol=1e-4, atol=1e-5)
    for g, r in zip(got_grads, grads):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-4)
    assert len(ahead) >= 4 and len(passes) == len(ahead), (len(ahead), passes)  # the compiles ran none
    for c in b.compiled:
        assert any(c.graph is h.gm for h in ahead), c.stats["graph"]
    backward = next(h for h in ahead if any(c.graph is h.gm for c in b.compiled) and h.kind == "backward")
    assert INPUT_STRIDES.get(backward.gm), "the forward lays saved values out otherwise than traced"
    g = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    g.meta.update(backward.meta)
    assert backward.fits(g, backward.config, "backward")
    assert not backward.fits(g, backward.config, "forward")
    assert not backward.fits(g, dataclasses.replace(backward.config, max_fusion_size=1), "backward")
    INPUT_STRIDES.set(g, {})
    assert not backward.fits(g, backward.config, "backward")
