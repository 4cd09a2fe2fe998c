"""``lowering/matmul_accumulate.py``: ``mm(a, b) + c`` as ``addmm(c, a, b)`` where it applies, left
as it is where it does not; values and gradients as eager's on fresh random inputs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import fxforge

aten = torch.ops.aten


def _accumulated(b) -> int:
    return sum(p["stats"].get("accumulated", 0) for c in b.compiled for p in c.stats["passes"]
               if p["name"] == "matmul_accumulate")


class Penalized(nn.Module):
    """A weight read by a matmul and by a penalty on its own values: its gradient is the
    matmul's plus the penalty's (a tied embedding's is ``lowering/embedding_grads.py``'s)."""

    def __init__(self, d=24, out=300):
        super().__init__()
        self.proj, self.w = nn.Linear(d, d), nn.Parameter(torch.randn(d, out) * 0.1)

    def forward(self, x):
        return torch.tanh(self.proj(x)) @ self.w + self.w.square().sum() * 1e-3


@pytest.mark.parametrize("codegen", ["c", "torch"])
def test_a_weights_two_gradients_are_one_addmm(codegen):
    torch.manual_seed(0)
    m = Penalized()
    ref = copy.deepcopy(m)
    x = torch.randn(30, 24)
    b = fxforge.backend(fxforge.Config(codegen=codegen, debug=True))
    torch.compile(m, backend=b)(x).square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert _accumulated(b) == 1
    (bw,) = [c for c in b.compiled if c.stats["graph"] == "backward"]
    assert "aten.addmm" in bw.source


CASES = {  # (function, its arguments, rewritten?)
    "sum": (lambda a, b, c: a @ b + c, ((6, 5), (5, 7), (6, 7)), True),
    "sum_other_side": (lambda a, b, c: c + torch.mm(a, b), ((6, 5), (5, 7), (6, 7)), True),
    "product_read_again": (lambda a, b, c: (lambda p: (p + c, p * 2))(a @ b), ((6, 5), (5, 7), (6, 7)), False),
    # a bias over the columns, broadcast over the rows, also under a reshape to 3-D (a language
    # model's head plus a bias of its own)
    "bias": (lambda a, b, c: a @ b + c, ((6, 5), (5, 7), (7,)), True),
    "bias_2d": (lambda a, b, c: c + a @ b, ((6, 5), (5, 7), (1, 7)), True),
    "bias_one": (lambda a, b, c: a @ b + c, ((6, 5), (5, 7), (1,)), True),
    "reshaped_bias": (lambda a, b, c: (a @ b).view(2, 3, 7) + c, ((6, 5), (5, 7), (1, 1, 7)), True),
    "reshaped_bias_1d": (lambda a, b, c: (a @ b).reshape(3, 2, 7) + c, ((6, 5), (5, 7), (7,)), True),
    "reshaped_single_row": (lambda a, b, c: (a @ b).view(1, 1, 7) + c, ((1, 5), (5, 7), (1, 1, 7)), True),
    "bias_over_columns": (lambda a, b, c: a @ b + c, ((6, 5), (5, 7), (6, 1)), False),
    "reshape_splits_columns": (lambda a, b, c: (a @ b).view(6, 7, 1) + c, ((6, 5), (5, 7), (1,)), False),
    "reshaped_full": (lambda a, b, c: (a @ b).view(2, 3, 7) + c, ((6, 5), (5, 7), (2, 3, 7)), False),
    "reshaped_read_again": (lambda a, b, c: (lambda p: (p.view(2, 3, 7) + c, p.sum()))(a @ b),
                            ((6, 5), (5, 7), (7,)), False),
    "bias_float64": (lambda a, b, c: a @ b + c.double(), ((6, 5), (5, 7), (7,)), False),
    "alpha": (lambda a, b, c: torch.add(a @ b, c, alpha=2), ((6, 5), (5, 7), (6, 7)), False),
    "transposed_other": (lambda a, b, c: a @ b + c.t(), ((6, 5), (5, 7), (7, 6)), False),
    "float64_other": (lambda a, b, c: a @ b + c.double(), ((6, 5), (5, 7), (6, 7)), False),
    # the product added to itself: the add reads it twice, so nothing may take its place
    "doubled": (lambda a, b, c: (lambda p: p + p)(a @ b) + c, ((6, 5), (5, 7), (6, 7)), False),
}


@pytest.mark.parametrize("name", CASES)
def test_where_it_applies_and_where_not(name):
    fn, shapes, rewritten = CASES[name]
    args = [torch.randn(s) for s in shapes]
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(debug=True))
    got = torch.compile(fn, backend=b, fullgraph=True)(*args)
    torch.testing.assert_close(got, fn(*args))
    assert _accumulated(b) == int(rewritten)


def test_symbolic_sizes():
    fn = CASES["sum"][0]
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(debug=True))
    cf = torch.compile(fn, backend=b, fullgraph=True, dynamic=True)
    for n in (6, 9, 4):
        args = (torch.randn(n, 5), torch.randn(5, 7), torch.randn(n, 7))
        torch.testing.assert_close(cf(*args), fn(*args))
    assert _accumulated(b) >= 1


class BiasedHead(nn.Module):
    """A head without a bias of its own, then a bias over the vocabulary (a parameter or a
    buffer), over 3-D hidden states: ``_unsafe_view(mm) + bias``."""

    def __init__(self, d=16, vocab=40, buffer=False):
        super().__init__()
        self.proj, self.head = nn.Linear(d, d), nn.Linear(d, vocab, bias=False)
        if buffer:
            self.register_buffer("bias", torch.randn(1, vocab))
        else:
            self.bias = nn.Parameter(torch.randn(1, vocab))

    def forward(self, x):
        return self.head(torch.tanh(self.proj(x))) + self.bias


@pytest.mark.parametrize("codegen", ["c", "torch"])
@pytest.mark.parametrize("buffer", [False, True])
def test_a_heads_bias_is_the_products_accumulator(codegen, buffer):
    """Values, gradients, and the returned logits written in place by the caller, as eager's;
    the forward adds the bias in the matmul, no buffer holds the bare product."""
    torch.manual_seed(1)
    m = BiasedHead(buffer=buffer)
    ref = copy.deepcopy(m)
    b = fxforge.backend(fxforge.Config(codegen=codegen, debug=True))
    cm = torch.compile(m, backend=b)
    for _ in range(2):
        x = torch.randn(3, 5, 16)
        got, want = cm(x), ref(x)
        torch.testing.assert_close(got, want)
        got.mul_(2)
        want.mul_(2)
        got.square().mean().backward()
        want.square().mean().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    fw = next(c for c in b.compiled if c.stats["graph"] == "forward")
    assert "aten.addmm" in fw.source and _accumulated(b) >= 1
    assert not any(bb.producer.target is aten.mm.default and bb.shape[-1] == 40
                   for bb in fw.plan.memory.buffers.values()), fw.plan.memory.dump()


def test_reshaped_bias_symbolic_sizes():
    torch.manual_seed(2)
    m = BiasedHead()
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(debug=True))
    cm = torch.compile(m, backend=b, dynamic=True)
    with torch.no_grad():
        for shape in ((3, 5, 16), (2, 7, 16), (4, 3, 16)):
            x = torch.randn(shape)
            torch.testing.assert_close(cm(x), m(x))
    assert _accumulated(b) >= 1
