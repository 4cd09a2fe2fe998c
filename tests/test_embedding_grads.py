"""``AccumulateEmbeddingGrads`` (lowering/embedding_grads.py): an embedding's gradient added
straight into the other term of its sum (``fxforge::embedding_grad_add``), in place where that
term dies, instead of a table of zeros.  Every case compares with eager on fresh random inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxforge
from fxforge.codegen.c import build
from fxforge.lowering import fxforge_ops as ops  # noqa: F401  (registers torch.ops.fxforge)

aten = torch.ops.aten
CODEGENS = ["torch"] + (["c"] if build.compiler() is not None else [])


class TiedLM(torch.nn.Module):
    """A token table used twice (two lookups) and tied to the head."""

    def __init__(self, vocab=300, width=16, padding_idx=None, scale_grad_by_freq=False):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq)
        self.mix = torch.nn.Linear(width, width)

    def forward(self, x, y, t):
        h = torch.tanh(self.mix(self.emb(x))) + self.emb(y)
        logits = h @ self.emb.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))


def step(model, codegen, inputs, dynamic=False):
    """fxforge's gradients, eager's, and the compiled backward."""
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen=codegen, debug=True))
    c = torch.compile(model, backend=b, dynamic=dynamic)
    got = []
    for args in inputs:
        model.zero_grad(set_to_none=True)
        c(*args).backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        model(*args).backward()
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g, p.grad)
    (bw,) = [cc for cc in b.compiled if cc.stats["graph"] == "backward"][-1:]
    return bw


def accumulated(compiled) -> int:
    (p,) = [p for p in compiled.stats["passes"] if p["name"] == "accumulate_embedding_grads"]
    return p.get("stats", {}).get("accumulated", 0)


def batch(vocab=300, rows=2, cols=8, padding_idx=None):
    x, y, t = (torch.randint(0, vocab, (rows, cols)) for _ in range(3))
    if padding_idx is not None:
        x[0, :3] = padding_idx
        y[1, 2] = padding_idx
    x[1, :4] = x[0, -1]  # a row that repeats: its gradient rows add up
    return x, y, t


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("padding_idx", [None, 7])
def test_a_tied_table_takes_its_rows_in_place(codegen, padding_idx):
    torch.manual_seed(0)
    model = TiedLM(padding_idx=padding_idx)
    bw = step(model, codegen, [batch(padding_idx=padding_idx)])
    assert accumulated(bw) == 2, bw.source  # both lookups' rows: no table of zeros
    assert "aten.embedding_dense_backward" not in bw.source
    op = torch.ops.fxforge.embedding_grad_add.default
    adds = [b for b in bw.plan.memory.buffers.values() if b.producer.target == op]
    assert any(b.reuses is not None for b in adds), bw.plan.memory.dump()  # the first over the head's mm
    # the output is written over the chain mm -> first add -> second add: every link is the
    # output's own storage, allocated fresh, none in an arena
    chain = {b.name: b for b in adds}
    chain.update({b.reuses: bw.plan.memory.buffers[b.reuses] for b in adds if b.reuses is not None})
    assert len(chain) == 3 and all(b.kind == "fresh" for b in chain.values()), bw.plan.memory.dump()


@pytest.mark.parametrize("codegen", CODEGENS)
def test_symbolic_sizes(codegen):
    torch.manual_seed(1)
    model = TiedLM()
    bw = step(model, codegen, [batch(rows=2, cols=5), batch(rows=3, cols=7)], dynamic=True)
    assert accumulated(bw) == 2


def test_what_stays_atens():
    """``scale_grad_by_freq`` and low precision keep ATen's gradient; values match eager."""
    torch.manual_seed(2)
    bw = step(TiedLM(scale_grad_by_freq=True), "torch", [batch()])
    assert accumulated(bw) == 0 and "aten.embedding_dense_backward" in bw.source
    x = torch.randint(0, 50, (6,))
    w = torch.randn(50, 4, dtype=torch.bfloat16)
    g = torch.randn(6, 4, dtype=torch.bfloat16)

    def fn(g, x, w):
        return aten.embedding_dense_backward(g, x, 50, -1, False) + w

    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="torch", debug=True))
    torch.testing.assert_close(torch.compile(fn, backend=b)(g, x, w), fn(g, x, w))
    assert accumulated(b.compiled[0]) == 0


@pytest.mark.parametrize("padding_idx", [-1, 0, 5])
def test_the_operator_is_the_sum_eager_computes(padding_idx):
    torch.manual_seed(3)
    idx = torch.randint(0, 9, (4, 7))
    idx[0, :3] = 5
    g, y = torch.randn(4, 7, 6, dtype=torch.float64), torch.randn(9, 6, dtype=torch.float64)
    want = aten.embedding_dense_backward(g, idx, 9, padding_idx, False) + y
    torch.testing.assert_close(torch.ops.fxforge.embedding_grad_add(y, g, idx, padding_idx), want)
    out = y.clone()  # the out variant over its own input (in place) and into another tensor
    torch.ops.fxforge.embedding_grad_add.out(out, g, idx, padding_idx, out=out)
    torch.testing.assert_close(out, want)
    other = torch.empty_like(y)
    torch.ops.fxforge.embedding_grad_add.out(y, g, idx, padding_idx, out=other)
    torch.testing.assert_close(other, want)
