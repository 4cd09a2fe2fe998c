"""EliminateIdentityViews: view chains that come back to their start (``w.t().t()``,
``detach(detach(x))``) are bypassed; chains that do not, views the graph returns and views
written into are kept.

End-to-end tests compare against eager on fresh random inputs and check that fxforge's
generated code ran; unit tests run the pass on hand-built ATen graphs (ops AOTAutograd would
decompose away, such as ``reshape``) and compare the graph before and after on real tensors.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing import assert_close

import fxforge
import fxforge.spine as compiler
from fxforge.core.graph import VAL, fake_call
from fxforge.lowering.cleanup import EliminateIdentityViews, is_view_node

aten = torch.ops.aten
NAME = EliminateIdentityViews.name


@pytest.fixture
def without_pass(monkeypatch):
    """fxforge's default pipeline minus EliminateIdentityViews (the baseline to compare with)."""
    real = compiler.default_passes

    def passes(*args, **kwargs):
        return [p for p in real(*args, **kwargs) if not isinstance(p, EliminateIdentityViews)]

    monkeypatch.setattr(compiler, "default_passes", passes)


def removed(c) -> int | None:
    """What the pass reported for this compiled graph (None: it did not run)."""
    for p in c.stats["passes"]:
        if p["name"] == NAME:
            return p.get("stats", {}).get("removed", 0)
    return None


def ran(b) -> None:
    assert b.compiled, "fxforge compiled nothing"
    for c in b.compiled:
        assert c.failed is None and not c.failures, c.failures


def t_calls(c) -> int:
    """The ``t`` views the wrapper makes (``x.t()``, or ``reinterpret`` at the traced layout)."""
    return len(re.findall(r"^\s+t(?:_\d+)? = ", c.source, re.M))


def identity_t_pairs_used_inside(gm: fx.GraphModule) -> list[str]:
    """``t(t(y))`` nodes whose value some node other than the output uses."""
    t = aten.t.default
    return [
        n.name for n in gm.graph.nodes
        if n.target is t and isinstance(n.args[0], fx.Node) and n.args[0].target is t
        and any(u.op != "output" for u in n.users)
    ]


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def train_step(model, x, y):
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def compiled_mlp_step(torch_seed: int):
    """Eager and fxforge training steps of one 2-layer MLP on the same fresh inputs."""
    torch.manual_seed(torch_seed)
    model = mlp()
    ref = copy.deepcopy(model)
    b = fxforge.backend(fxforge.Config(debug=True))
    cm = torch.compile(model, backend=b, fullgraph=True)
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    got_loss, got_grads = train_step(cm, x, y)
    want_loss, want_grads = train_step(ref, x, y)
    assert_close(got_loss, want_loss)
    for g, w in zip(got_grads, want_grads):
        assert_close(g, w)
    ran(b)
    return {c.stats["graph"]: c for c in b.compiled}


# --------------------------------------------------------------------------- end to end


def test_mlp_training_step_drops_t_pairs_from_backward(request):
    with_pass = compiled_mlp_step(0)
    bw = with_pass["backward"]
    assert removed(bw) > 0
    assert identity_t_pairs_used_inside(bw.graph) == []
    # the pair feeding the first weight's mm (t(t(primals))) is gone, and with it two .t() calls
    torch._dynamo.reset()
    request.getfixturevalue("without_pass")
    baseline = compiled_mlp_step(0)["backward"]
    assert removed(baseline) is None
    assert identity_t_pairs_used_inside(baseline.graph), "the baseline has no t(t(y)) pair: the test proves nothing"
    assert t_calls(bw) < t_calls(baseline)
    # detach(detach(relu)) before threshold_backward: gone too
    assert not any(n.target is aten.detach.default for n in bw.graph.graph.nodes)
    assert any(n.target is aten.detach.default for n in baseline.graph.graph.nodes)


def test_backward_returns_the_weight_gradients_mm_not_its_t_t_view(request):
    """A backward graph's outputs are gradients, handed to autograd without aliasing metadata:
    a linear layer's weight gradient ``mm(...).t().t()`` is returned as the mm itself (no view
    per step), and the step stays right. A forward or inference graph keeps its returned views."""
    graphs = compiled_mlp_step(2)
    bw = graphs["backward"]
    returned = [a for a in bw.graph.graph.output_node().args[0] if isinstance(a, fx.Node)]
    assert not [a.name for a in returned if a.target is aten.t.default], bw.graph.code
    torch._dynamo.reset()
    request.getfixturevalue("without_pass")
    baseline = compiled_mlp_step(2)["backward"]
    returned = [a for a in baseline.graph.graph.output_node().args[0] if isinstance(a, fx.Node)]
    assert [a for a in returned if a.target is aten.t.default], "the baseline returns no t view: the test proves nothing"
    assert t_calls(bw) <= t_calls(baseline) - 4  # two weights, two .t() each


def test_mlp_repeated_steps_match_eager():
    """The compiled training step stays right over several steps with fresh inputs."""
    torch.manual_seed(1)
    model = mlp()
    ref = copy.deepcopy(model)
    b = fxforge.backend(fxforge.Config(debug=True))
    cm = torch.compile(model, backend=b, fullgraph=True)
    for _ in range(3):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        x, y = torch.randn(4, 16), torch.randn(4, 8)
        got = train_step(cm, x, y)
        want = train_step(ref, x, y)
        assert_close(got[0], want[0])
        for g, w in zip(got[1], want[1]):
            assert_close(g, w)
    ran(b)


def test_non_identity_chains_are_kept():
    def f(x, w):
        a = x.transpose(0, 1) @ w                 # (8, 4) @ (4, 5): one transpose, not identity
        c = x.t().reshape(2, 16).sum(0)           # t then reshape: a copy, then a view
        d = x.t().t()[1:].t()                     # a slice in between: not x's layout
        return a, c, d @ torch.ones(3, 2)

    b = fxforge.backend(fxforge.Config(debug=True))
    cf = torch.compile(f, backend=b, fullgraph=True)
    for _ in range(2):
        x, w = torch.randn(4, 8), torch.randn(4, 5)
        for g, want in zip(cf(x, w), f(x, w)):
            assert_close(g, want)
    ran(b)
    (c,) = b.compiled
    targets = [n.target for n in c.graph.graph.nodes]
    assert aten.t.default in targets or aten.transpose.int in targets or aten.permute.default in targets


def test_dynamic_shapes_no_specialization():
    def f(x, w):
        return torch.relu(x @ w.t().t()) * 2

    b = fxforge.backend(fxforge.Config(debug=True))
    cf = torch.compile(f, backend=b, fullgraph=True, dynamic=True)
    x, w = torch.randn(5, 7), torch.randn(7, 3)
    assert_close(cf(x, w), f(x, w))
    ran(b)
    (c,) = b.compiled
    assert removed(c) > 0
    assert identity_t_pairs_used_inside(c.graph) == []
    assert any(isinstance(s, torch.SymInt) for n in c.graph.graph.nodes if n.op == "placeholder"
               for s in getattr(n.meta.get(VAL), "shape", ())), "the graph is not dynamic: the test proves nothing"
    for shape_x, shape_w in (((9, 4), (4, 6)), ((2, 11), (11, 2)), ((3, 3), (3, 3))):
        x, w = torch.randn(*shape_x), torch.randn(*shape_w)
        assert_close(cf(x, w), f(x, w))
    assert len(b.compiled) == 1, "a new size recompiled: the pass specialized a size"
    ran(b)


def test_dynamic_shapes_training():
    torch.manual_seed(2)
    model = mlp()
    ref = copy.deepcopy(model)
    b = fxforge.backend(fxforge.Config(debug=True))
    cm = torch.compile(model, backend=b, fullgraph=True, dynamic=True)
    for batch in (4, 7, 13):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        x, y = torch.randn(batch, 16), torch.randn(batch, 8)
        got, want = train_step(cm, x, y), train_step(ref, x, y)
        assert_close(got[0], want[0])
        for g, w in zip(got[1], want[1]):
            assert_close(g, w)
    ran(b)
    assert len(b.compiled) == 2  # one forward, one backward: no recompile per batch size
    bw = next(c for c in b.compiled if c.stats["graph"] == "backward")
    assert removed(bw) > 0


def test_identity_views_returned_are_correct():
    def f(x, w):
        h = torch.sin(x) @ w
        return x.t().t(), h.t().t(), h.detach().detach() + 1

    b = fxforge.backend(fxforge.Config(debug=True))
    cf = torch.compile(f, backend=b, fullgraph=True)
    for _ in range(2):
        x, w = torch.randn(3, 4), torch.randn(4, 5)
        got, want = cf(x, w), f(x, w)
        for g, e in zip(got, want):
            assert_close(g, e)
            assert g.shape == e.shape and g.stride() == e.stride()
    ran(b)


def test_compile_exported():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 6))
            self.lin = nn.Linear(6, 3)

        def forward(self, x):
            h = torch.relu(x @ self.w.t().t())
            return self.lin(h.detach().detach()), h.t().contiguous()

    torch.manual_seed(3)
    model = M()
    ep = torch.export.export(model, (torch.randn(5, 8),))
    c = fxforge.compile_exported(ep, fxforge.Config(debug=True))
    assert removed(c) > 0
    assert identity_t_pairs_used_inside(c.graph) == []
    for _ in range(2):
        x = torch.randn(5, 8)
        with torch.no_grad():
            want = model(x)
        for g, e in zip(c(x), want):
            assert_close(g, e)
    assert c.failed is None and not c.failures


# --------------------------------------------------------------------------- the pass alone


def build(f, *shapes):
    """A GraphModule built node by node: ``f(gm, mode, *placeholders)`` returns the outputs."""
    gm = fx.GraphModule(torch.nn.Module(), fx.Graph())
    mode = FakeTensorMode()
    phs = []
    for i, s in enumerate(shapes):
        p = gm.graph.placeholder(f"x{i}")
        with mode:
            p.meta[VAL] = torch.empty(s)
        phs.append(p)
    out = f(gm, mode, *phs)
    gm.graph.output(tuple(out))
    gm.recompile()
    return gm


def run_pass(gm):
    before = copy.deepcopy(gm)
    r = EliminateIdentityViews()(gm)
    gm = r.graph_module
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return before, gm, r.stats["removed"]


def same_results(before, after, *shapes):
    args = [torch.randn(s) for s in shapes]
    for g, w in zip(after(*[a.clone() for a in args]), before(*[a.clone() for a in args])):
        assert_close(g, w)


def test_reshape_that_copies_is_not_followed():
    # x.t().reshape(32).view(4, 8) has x's sizes and strides but not its data: reshape copied
    def f(gm, mode, x):
        t = fake_call(gm, mode, aten.t.default, (x,))
        r = fake_call(gm, mode, aten.reshape.default, (t, [32]))
        v = fake_call(gm, mode, aten.view.default, (r, [4, 8]))
        return [fake_call(gm, mode, aten.mul.Tensor, (v, 2.0))]

    gm = build(f, (4, 8))
    v = next(n for n in gm.graph.nodes if n.target is aten.view.default)
    assert tuple(v.meta[VAL].stride()) == (8, 1)  # the layout check alone would take it for x
    before, after, k = run_pass(gm)
    assert k == 0
    assert any(n.target is aten.reshape.default for n in after.graph.nodes)
    same_results(before, after, (4, 8))


def test_identity_chain_through_several_views():
    def f(gm, mode, x):
        a = fake_call(gm, mode, aten.unsqueeze.default, (x, 0))
        b = fake_call(gm, mode, aten.permute.default, (a, [0, 2, 1]))
        c = fake_call(gm, mode, aten.transpose.int, (b, 1, 2))
        d = fake_call(gm, mode, aten.squeeze.dim, (c, 0))
        e = fake_call(gm, mode, aten.alias.default, (d,))
        return [fake_call(gm, mode, aten.mul.Tensor, (e, 3.0))]

    before, after, k = run_pass(build(f, (3, 5)))
    assert k >= 1
    assert not any(is_view_node(n) for n in after.graph.nodes)
    same_results(before, after, (3, 5))


def test_views_written_into_or_returned_are_kept():
    def f(gm, mode, x, y):
        a = fake_call(gm, mode, aten.t.default, (x,))
        b = fake_call(gm, mode, aten.t.default, (a,))
        fake_call(gm, mode, aten.add_.Tensor, (b, 1.0))         # writes through the view
        c = fake_call(gm, mode, aten.t.default, (y,))
        d = fake_call(gm, mode, aten.t.default, (c,))            # returned
        return [fake_call(gm, mode, aten.mul.Tensor, (b, 2.0)), d]

    gm = build(f, (2, 3), (3, 4))
    before, after, k = run_pass(gm)
    assert k == 0
    assert sum(n.target is aten.t.default for n in after.graph.nodes) == 4
    same_results(before, after, (2, 3), (3, 4))


def test_conj_bit_is_part_of_the_layout():
    # _conj has the same sizes and strides as its input, and a different value
    gm = fx.GraphModule(torch.nn.Module(), fx.Graph())
    mode = FakeTensorMode()
    x = gm.graph.placeholder("x")
    with mode:
        x.meta[VAL] = torch.empty(3, dtype=torch.complex64)
    c = fake_call(gm, mode, aten._conj.default, (x,))
    out = fake_call(gm, mode, aten.mul.Tensor, (c, 2.0))
    gm.graph.output((out,))
    gm.recompile()
    _, _, k = run_pass(gm)
    assert k == 0
