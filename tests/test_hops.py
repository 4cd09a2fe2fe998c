"""Higher-order ops and effect tokens through the torch.compile backend: values and gradients
match eager.

Regression tests for what fxforge gave AOTAutograd or planned wrongly around them:

* a partitioned ``invoke_subgraph`` forward (``torch.compiler.nested_compile_region``) returns
  its own operands, saved for its backward; the planner must see those outputs as views of the
  operands, or an arena buffer that is saved gets overwritten (outputs right, gradients wrong);
* ``with_effects`` (linalg's error checks): effect tokens passed in and out of the forward shift
  the saved values' reported strides onto the wrong values (a wrong gradient for
  ``cholesky(upper=True)``, an ``IndexError`` inside AOTAutograd for ``linalg.solve``).
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
