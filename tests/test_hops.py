"""Higher-order ops and effect tokens through the torch.compile backend: values and gradients
match eager.

Regression tests for what fxforge gave AOTAutograd or planned wrongly around them:

* a partitioned ``invoke_subgraph`` forward (``torch.compiler.nested_compile_region``) returns
  its own operands, saved for its backward; the planner must see those outputs as views of the
  operands, or an arena buffer that is saved gets overwritten (outputs right, gradients wrong);
* ``with_effects`` (linalg's error checks): effect tokens passed in and out of the forward shift
  the saved values' reported strides onto the wrong values (a wrong gradient for
  ``cholesky(upper=True)``, an ``IndexError`` inside AOTAutograd for ``linalg.solve``).

And a sweep over every higher-order op that can reach a compiled graph (``HOP_CASES``): forward
and backward against eager on both CPU codegens (C with static and dynamic shapes), two calls (the second
runs over the arenas the first left), each case checked to have reached fxforge's graph as the
HOP it tests.  Where one cannot: ``flex_attention``'s backward has no CPU kernel (``aot_eager``
refuses it too: inference only); ``tag_activation_checkpoint`` reaches the backend in Dynamo's
graph and AOTAutograd inlines it (its recompute tags); ``wrap_with_set_grad_enabled`` and
``wrap_with_autocast`` exist in ``torch.export`` programs before decomposition, so they go
through ``apply_passes`` and ``compile_exported``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import fxforge


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.a, self.b = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return x + self.b(torch.nn.functional.silu(self.a(self.ln(x))))


class Regions(nn.Module):
    """Blocks marked as one region, with compiled ops between them: each block's input is a
    buffer of the caller's plan."""

    def __init__(self, d=32, n=6):
        super().__init__()
        self.emb = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        x = torch.tanh(self.emb(x))
        for b in self.blocks:
            x = b(x) * 0.5 + 1.0
        return x


def _train_step(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("codegen", ["c", "torch"])
def test_nested_compile_region_gradients(codegen):
    torch.manual_seed(0)
    m = Regions()
    c = copy.deepcopy(m)
    b = fxforge.backend(fxforge.Config(codegen=codegen, debug=True))
    compiled = torch.compile(c, backend=b)
    for _ in range(2):  # the second call runs over the arenas the first left
        x = torch.randn(4, 8, 32)
        loss_e, grads_e = _train_step(m, x)
        loss_c, grads_c = _train_step(compiled, x)
        torch.testing.assert_close(loss_c, loss_e)
        for ge, gc in zip(grads_e, grads_c):
            torch.testing.assert_close(gc, ge, atol=1e-5, rtol=1e-4)
        m.zero_grad()
        c.zero_grad()
    assert {cc.stats["graph"] for cc in b.compiled} >= {"forward", "backward"}


def _spd(n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g)
    return a @ a.mT + n * torch.eye(n)


@pytest.mark.parametrize("fn", [
    lambda a, b: torch.linalg.cholesky(a, upper=True),
    lambda a, b: torch.linalg.cholesky(a),
    lambda a, b: torch.linalg.solve(a, b),
    lambda a, b: torch.linalg.lu_factor(a)[0],
], ids=["cholesky_upper", "cholesky", "solve", "lu_factor"])
def test_effect_token_gradients(fn):
    a, b = _spd(5, 0), torch.randn(5, 3)
    ins_e = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    ins_c = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    out_e = fn(*ins_e)
    cot = torch.randn(out_e.shape, generator=torch.Generator().manual_seed(1))
    grads_e = torch.autograd.grad(out_e, ins_e, cot, allow_unused=True)
    out_c = torch.compile(fn, backend=fxforge.backend(fxforge.Config(debug=True)), fullgraph=True)(*ins_c)
    grads_c = torch.autograd.grad(out_c, ins_c, cot, allow_unused=True)
    torch.testing.assert_close(out_c, out_e)
    for ge, gc in zip(grads_e, grads_c):
        if ge is not None:
            torch.testing.assert_close(gc, ge, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- HOP sweep


@torch.compiler.nested_compile_region
def _region(a, w):
    return torch.sin(a @ w) + a, a * 3


def _invoke_subgraph(x, w):
    y, a = _region(x, w)
    z, _ = _region(y * 2, w)  # the same region twice: one body, two calls
    return z.sum(-1, keepdim=True) + a.mean()


def _cond(x, w):
    return torch.cond(x.sum() > 0, lambda x, w: torch.sin(x @ w), lambda x, w: torch.cos(x) @ w, (x, w)) * 2


def _while_loop(x, w):
    from torch._higher_order_ops.while_loop import while_loop

    _, y = while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, torch.tanh(x @ w)), (torch.tensor(0), x))
    return y + 1


def _flex_attention(q, k, v):
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, qi, ki):
        return score + (qi - ki).to(score.dtype) * 0.1

    return flex_attention(q, k, v, score_mod=score_mod) * 2


def _checkpoint(x, w):
    return torch.utils.checkpoint.checkpoint(lambda t: torch.sin(t @ w) @ w, x, use_reentrant=False).relu() + 1


@torch.library.custom_op("fxforge_test::accumulate", mutates_args=("acc",))
def _accumulate(acc: torch.Tensor, x: torch.Tensor) -> None:
    acc.add_(x * 2)


@_accumulate.register_fake
def _(acc, x):
    return None


def _auto_functionalized(x, w):
    y = torch.sin(x @ w)
    acc = torch.ones(x.shape)
    _accumulate(acc, y.detach())  # a mutating custom op: auto_functionalized in the graph
    return y * acc + acc


def _mat_inputs(sign):
    return lambda n: (sign * torch.randn(n, 8).abs(), torch.randn(8, 8))


# name -> (function, inputs for a leading size n, HOP expected in fxforge's graphs, training)
HOP_CASES = {
    "invoke_subgraph": (_invoke_subgraph, _mat_inputs(1), "invoke_subgraph", True),
    "cond_true": (_cond, _mat_inputs(1), "cond", True),
    "cond_false": (_cond, _mat_inputs(-1), "cond", True),
    "while_loop": (_while_loop, _mat_inputs(1), "while_loop", True),
    "flex_attention": (_flex_attention, lambda n: tuple(torch.randn(1, 2, 4 * n, 8) for _ in range(3)), "flex_attention", False),
    "tag_activation_checkpoint": (_checkpoint, _mat_inputs(1), "tag_activation_checkpoint", True),
    "auto_functionalized": (_auto_functionalized, _mat_inputs(1), "auto_functionalized", True),
}


def _hops(gm: torch.fx.GraphModule) -> set[str]:
    return {n.target.name() for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)}


class _Seen:
    """A backend that records the HOPs of the graphs Dynamo gives it, then compiles with fxforge."""

    def __init__(self, backend):
        self.backend, self.hops = backend, set()

    def __call__(self, gm, example_inputs):
        self.hops |= _hops(gm)
        return self.backend(gm, example_inputs)


@pytest.mark.parametrize("codegen,dynamic", [("c", False), ("c", True), ("torch", False)],
                         ids=["c-static", "c-dynamic", "torch-static"])
@pytest.mark.parametrize("case", list(HOP_CASES))
def test_hop_sweep(case, codegen, dynamic):
    fn, make, hop, train = HOP_CASES[case]
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen=codegen, debug=True))
    seen = _Seen(b)
    compiled = torch.compile(fn, backend=seen, fullgraph=True, dynamic=dynamic)
    for n in (4, 6):  # a second call, at another size where dynamic
        torch.manual_seed(n)
        ins = make(n)
        ins_e = [t.clone().requires_grad_(train) for t in ins]
        ins_c = [t.clone().requires_grad_(train) for t in ins]
        out_e, out_c = fn(*ins_e), compiled(*ins_c)
        torch.testing.assert_close(out_c, out_e, atol=1e-5, rtol=1e-5)
        if train:
            cot = torch.randn(out_e.shape)
            for ge, gc in zip(torch.autograd.grad(out_e, ins_e, cot), torch.autograd.grad(out_c, ins_c, cot)):
                torch.testing.assert_close(gc, ge, atol=1e-5, rtol=1e-5)
    in_fxforge = {h for c in b.compiled if c.graph is not None for h in _hops(c.graph)}
    kinds = {c.stats["graph"] for c in b.compiled}
    if hop == "tag_activation_checkpoint":
        assert hop in seen.hops and not in_fxforge, (seen.hops, in_fxforge)
    else:
        assert any(h.startswith(hop) for h in in_fxforge), f"{hop} not in fxforge's graphs: {sorted(in_fxforge)}"
    assert kinds >= ({"forward", "backward"} if train else {"inference"}), kinds


class _Scoped(nn.Module):
    """``no_grad`` and ``autocast`` blocks: ``wrap_with_set_grad_enabled`` and ``wrap_with_autocast``
    in the exported program."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            z = torch.sin(y) * 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            u = self.lin(torch.cos(y))
        return y * z + u.float()


def test_hop_sweep_exported():
    torch.manual_seed(0)
    m = _Scoped()
    x = torch.randn(4, 8)
    ep = torch.export.export(m, (x,))
    assert _hops(ep.graph_module) >= {"wrap_with_set_grad_enabled", "wrap_with_autocast"}
    seen = []

    def count(gm):
        seen.append(_hops(gm))
        return gm

    gm = fxforge.apply_passes(ep, [count], debug=True)  # debug: the graph is verified with its bodies
    assert seen[0] >= {"wrap_with_set_grad_enabled", "wrap_with_autocast"}
    c = fxforge.compile_exported(ep, fxforge.Config(debug=True))
    for _ in range(2):
        x = torch.randn(4, 8)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_e, out_c = m(xe), gm(xc)
        torch.testing.assert_close(out_c, out_e)
        cot = torch.randn(out_e.shape)
        ge = torch.autograd.grad(out_e, [xe, *m.parameters()], cot)
        gc = torch.autograd.grad(out_c, [xc, *gm.parameters()], cot)
        for a, e in zip(gc, ge):
            torch.testing.assert_close(a, e)
        with torch.no_grad():
            torch.testing.assert_close(c(x), m(x), atol=1e-2, rtol=1e-2)  # bfloat16 inside
