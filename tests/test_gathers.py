"""``SinkGathers`` (lowering/gathers.py): a gather moved before the pointwise nodes it reads,
computing them only at the gathered positions.  Every case compares with eager on fresh random
inputs, on the C and torch backends, and checks what the pass moved."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxforge
from fxforge.codegen.c import build

aten = torch.ops.aten
CODEGENS = ["torch"] + (["c"] if build.compiler() is not None else [])


def compile_fn(fn, codegen: str, **config):
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen=codegen, debug=True, **config))
    return b, torch.compile(fn, backend=b, fullgraph=True)


def moved(b) -> int:
    """Gathers the pass moved, over every compiled graph."""
    return sum(p.get("stats", {}).get("moved", 0) for c in b.compiled for p in c.stats["passes"]
               if p["name"] == "sink_gathers")


def gather_inputs(b) -> list:
    """What each gather left in the compiled graphs reads."""
    return [n.args[0] for c in b.compiled for n in c.graph.graph.nodes if n.target == aten.gather.default]


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_a_gather_moves_up_a_pointwise_chain_with_broadcast_operands(codegen, dim):
    torch.manual_seed(0)
    x, bias, row = torch.randn(6, 40), torch.randn(40), torch.randn(6, 1)
    index = torch.randint(0, x.shape[dim], (3, 5) if dim == 0 else (6, 3))

    def fn(x, bias, row, index):
        y = torch.exp(torch.tanh(x + bias) * row) - 0.5
        return torch.gather(torch.where(y > 0, y, y * 0.1), dim, index)

    b, c = compile_fn(fn, codegen)
    torch.testing.assert_close(c(x, bias, row, index), fn(x, bias, row, index))
    assert moved(b) >= 5  # through sub, mul, exp, tanh, add (and where's operands)
    # the gathers left read the graph's inputs, or views of them broadcast to the chain's shape
    assert all(a.op == "placeholder" or a.target == aten.expand.default for a in gather_inputs(b))


@pytest.mark.parametrize("codegen", CODEGENS)
def test_an_operand_of_fewer_dims_over_leading_ones_is_expanded_before_its_gather(codegen):
    """``f``'s shape ``[1, 2]`` and an operand of shape ``[2]``: the same elements, one dim
    fewer; its gather must read it at ``f``'s rank (found by tests/test_pass_properties.py)."""
    torch.manual_seed(0)
    x, w, index = torch.randn(1, 2), torch.randn(2), torch.zeros(1, 1, dtype=torch.int64)

    def fn(x, w, index):
        return torch.gather(x * w + 1, 1, index)

    b, c = compile_fn(fn, codegen)
    torch.testing.assert_close(c(x, w, index), fn(x, w, index))
    assert moved(b) >= 1


@pytest.mark.parametrize("codegen", CODEGENS)
def test_log_probabilities_of_tokens_with_symbolic_rows(codegen):
    """A token's log-probability (``log_softmax(logits).gather``), the rows a dynamic size."""
    def fn(logits, tokens):
        return F.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)

    b, c = compile_fn(fn, codegen)
    torch._dynamo.config.assume_static_by_default = False
    try:
        for rows in (5, 9):
            logits, tokens = torch.randn(2, rows, 300), torch.randint(0, 300, (2, rows))
            torch.testing.assert_close(c(logits, tokens), fn(logits, tokens))
    finally:
        torch._dynamo.config.assume_static_by_default = True
    if codegen == "c":  # (the torch backend keeps the log-softmax whole: nothing pointwise to move through)
        assert moved(b) > 0


@pytest.mark.parametrize("codegen", CODEGENS)
def test_what_stays(codegen):
    """A gather stays where its index is as large as what it reads, where the op draws random
    numbers, and where the moved form would promote differently; values match eager."""
    torch.manual_seed(1)
    x = torch.randn(4, 6)
    full = torch.randint(0, 6, (4, 6))
    small = torch.randint(0, 6, (4, 2))
    i = torch.randint(0, 4, (4, 6))
    b, c = compile_fn(lambda x, idx: torch.gather(x * 2 + 1, 1, idx), codegen)
    torch.testing.assert_close(c(x, full), torch.gather(x * 2 + 1, 1, full))
    assert moved(b) == 0  # (not fewer elements)
    b, c = compile_fn(lambda x, idx: torch.gather(torch.rand_like(x) * 0 + x, 1, idx), codegen)
    torch.testing.assert_close(c(x, small), torch.gather(x, 1, small))
    # an int tensor and a 0-d float: the 0-d operand stays as it is, the result stays float
    b, c = compile_fn(lambda i, s, idx: torch.gather(i + s, 1, idx), codegen)
    s = torch.tensor(0.5)
    torch.testing.assert_close(c(i, s, small), torch.gather(i + s, 1, small))
    assert moved(b) == 1


@pytest.mark.parametrize("codegen", CODEGENS)
def test_training_through_a_moved_gather(codegen):
    torch.manual_seed(2)
    x = torch.randn(8, 50, requires_grad=True)
    w = torch.randn(50, requires_grad=True)
    idx = torch.randint(0, 50, (8, 2))

    def fn(x, w, idx):
        return torch.gather(torch.sigmoid(x * w), 1, idx).square().sum()

    b, c = compile_fn(fn, codegen)
    c(x, w, idx).backward()
    got = (x.grad, w.grad)
    x.grad = w.grad = None
    fn(x, w, idx).backward()
    torch.testing.assert_close(got, (x.grad, w.grad))
