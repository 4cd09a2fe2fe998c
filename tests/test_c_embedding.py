"""The C backend's index templates (``codegen/c/templates.py``): ``embedding``, its gradient
``embedding_dense_backward`` and integer ``arange``, against eager on random inputs, bit for bit
(the gradient sums each row in eager's order)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import fxforge
from fxforge.codegen.c import backend as c_backend, build
from fxforge.codegen.c.dtypes import ONE_THREAD_MAX_NUMEL

pytestmark = [pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
              pytest.mark.usefixtures("kernel_cache")]

sys.path.insert(0, os.path.dirname(__file__))
from c_helpers import compile_c, sources  # noqa: E402
from test_c_codegen import fallbacks  # noqa: E402

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("ishape, padding_idx", [((4, 16), None), ((7,), 2), ((2, 3, 5), 0), ((), None), ((64,), -1)])
def test_lookup_and_gradient_match_eager_bit_for_bit(ishape, padding_idx, index_dtype, dtype):
    torch.manual_seed(0)
    w = torch.randn(10, 6, dtype=dtype, requires_grad=True)
    idx = torch.randint(0, 10, ishape, dtype=index_dtype)
    if padding_idx is not None and idx.dim():
        idx.view(-1)[: max(1, idx.numel() // 3)] = padding_idx % 10  # and repeated indices, which sum
    g = torch.randn(*ishape, 6, dtype=dtype)

    def fn(w, idx):
        return F.embedding(idx, w, padding_idx=padding_idx) * 1.0

    b, c = compile_c(fn)
    out = c(w, idx)
    out.backward(g)
    gw, w.grad = w.grad, None
    ref = fn(w, idx)
    ref.backward(g)
    assert torch.equal(out, ref) and torch.equal(gw, w.grad)
    src = sources(b)
    assert "(template: embedding," in src and "(template: embedding backward," in src
    assert not [k for k in fallbacks(b) if "embedding" in k]


def test_strided_table_indices_and_gradient():
    """A transposed table, sliced indices, a gradient read through a transpose."""
    def fn(w, idx, g):
        out = F.embedding(idx[:, ::2], w.t())
        return out, aten.embedding_dense_backward(g.transpose(0, 1), idx[:, ::2], 12, -1, False)

    w, idx, g = torch.randn(5, 12), torch.randint(0, 12, (3, 8)), torch.randn(4, 3, 5)
    b, c = compile_c(fn)
    for x, y in zip(c(w, idx, g), fn(w, idx, g)):
        assert torch.equal(x, y)
    assert sources(b).count("(template: embedding") == 2


def test_an_index_out_of_range_raises_eagers_error(kernels_through):
    w = torch.randn(10, 3)
    b, c = compile_c(lambda w, i: F.embedding(i, w) + 1)
    c(w, torch.tensor([1, 2, 3]))  # the shape of the calls below: one static compile
    assert len(b.compiled) == 1 and "(template: embedding," in b.compiled[0].source
    for bad in (10, -1, 1 << 40):
        i = torch.tensor([1, bad, 3])
        with pytest.raises(IndexError) as eager:
            F.embedding(i, w)
        with pytest.raises(IndexError) as compiled:
            c(w, i)
        assert str(compiled.value) == str(eager.value) == "index out of range in self"
    assert len(b.compiled) == 1


def test_refusals_name_the_reason():
    i = torch.randint(0, 10, (4,))

    def graph(fn, *args):
        torch._dynamo.reset()
        b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
        torch.compile(fn, backend=b, fullgraph=True)(*args)
        return b.compiled[0].graph

    def why(gm, op):
        (n,) = [n for n in gm.graph.nodes if n.target == op]
        return c_backend.accepts(n, fxforge.Config(codegen="c"))

    gm = graph(lambda g, i: aten.embedding_dense_backward(g, i, 10, -1, True), torch.randn(4, 3), i)
    assert "scale_grad_by_freq" in why(gm, aten.embedding_dense_backward.default)
    big = ONE_THREAD_MAX_NUMEL // 3 + 1
    gm = graph(lambda w, i: F.embedding(i, w), torch.randn(big, 3), i)
    assert why(gm, aten.embedding.default) is None  # the lookup writes 12 elements
    gm = graph(lambda g, i: aten.embedding_dense_backward(g, i, big, -1, False), torch.randn(4, 3), i)
    assert f"over {ONE_THREAD_MAX_NUMEL} elements" in why(gm, aten.embedding_dense_backward.default)
    gm = graph(lambda w, i: F.embedding(i, w), torch.randint(0, 5, (10, 3)), i)
    assert "float32 or float64" in why(gm, aten.embedding.default)
    gm = graph(lambda x: torch.arange(5, dtype=torch.float32) + x, torch.randn(5))
    assert "int64 or int32 only" in why(gm, aten.arange.default)


def test_symbolic_sizes_run_as_aten():
    w = torch.randn(10, 3, requires_grad=True)
    b, c = compile_c(lambda w, i: F.embedding(i, w).sum(), dynamic=True)
    for n in (4, 7):
        i = torch.randint(0, 10, (n,))
        c(w, i).backward()
        gw, w.grad = w.grad, None
        F.embedding(i, w).sum().backward()
        assert torch.equal(gw, w.grad)
        w.grad = None
    assert "(template: embedding" not in sources(b)


@pytest.mark.parametrize("args, dtype", [((7,), None), ((3, 11), torch.int32), ((-5, 20, 3), None), ((10, 0, -2), None),
                                         ((0,), None)])
def test_integer_arange(args, dtype):
    def fn(x):
        return torch.arange(*args, dtype=dtype) * x

    b, c = compile_c(fn)
    x = torch.tensor(3, dtype=dtype or torch.int64)
    got, want = c(x), fn(x)
    assert torch.equal(got, want) and got.dtype == want.dtype
    if want.numel():
        assert "(template: arange," in sources(b)
