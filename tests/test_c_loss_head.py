"""A classification head's loss on the C backend: ``_log_softmax`` and its gradient split into row
kernels, the NLL loss into a gather of one score per row and its gradient into pointwise ops that
fuse with them (``lowering/splits.py``, before the partitioner in training): C kernels instead of
ATen calls, no log-softmax stored by the forward, and eager's error for a target out of bounds.
Every case compares with eager on fresh random inputs."""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from fxforge.codegen.c import build
from fxforge.codegen.c.dtypes import ONE_THREAD_MAX_NUMEL

pytestmark = [pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
              pytest.mark.usefixtures("kernel_cache")]

sys.path.insert(0, os.path.dirname(__file__))
from c_helpers import compile_c  # noqa: E402
from test_c_codegen import fallbacks  # noqa: E402

aten = torch.ops.aten
LIMIT = ONE_THREAD_MAX_NUMEL


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(8, 10), (3, 5, 7), (1, 1), (64, 128), (256, 512)])
def test_cross_entropy_step_runs_in_c(shape, dtype):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    if len(shape) == 2:
        y = torch.randint(0, shape[1], (shape[0],))
        fn = lambda x, y: F.cross_entropy(x, y)  # noqa: E731
    else:
        y = torch.randn(shape[:-1], dtype=dtype)
        fn = lambda x, y: (F.log_softmax(x, -1).sum(-1) * y).sum()  # noqa: E731
    b, c = compile_c(fn)
    loss = c(x, y)
    loss.backward()
    grad, x.grad = x.grad, None
    ref = fn(x, y)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, x.grad)
    sources = "".join(cc.source for cc in b.compiled)
    assert "aten._log_softmax" not in sources  # split: row kernels, no ATen call
    assert "_log_softmax" not in " ".join(fallbacks(b))
    if len(shape) == 2:  # (256, 512) too: over the old limits, and rows longer than a vector
        assert "aten.nll_loss_forward" not in sources and "aten.nll_loss_backward" not in sources
        fw, bw = [next(cc for cc in b.compiled if cc.stats["graph"] == k) for k in ("forward", "backward")]
        # the loss's gradient computed in the log-softmax gradient's row kernel: no tensor of zeros
        assert [k.node_count > 1 for k in bw.kernels if k.backend == "c"][-1], bw.source
        # split before the partitioner: the forward stores no log-softmax (the loss gathers one
        # score per row), the backward recomputes it from the scores and two values per row
        if shape[1] > 1:  # (one class: every row-sized value is the scores' size)
            assert not stored_like(fw, x), fw.source
            assert stored_like(bw, x)  # (the gradient)


def stored_like(compiled, x) -> list[str]:
    """The buffers a compiled graph writes with as many elements as ``x``."""
    return [b.name for b in compiled.plan.memory.buffers.values() if math.prod(b.shape) == x.numel()]


def test_rows_with_infinities_and_nan_match_eager():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf] * 4, [0.0, inf, 1.0, 2.0], [nan, 1.0, 2.0, 3.0], [1.0, 2.0, -inf, 4.0],
                      [1e30, -1e30, 0.0, 3.0], [-1e30, -1e30, -1e30, -1e30]])
    x = torch.cat([x, torch.randn(4, 4)])[torch.randperm(10)]
    b, c = compile_c(lambda x: F.log_softmax(x, -1))
    torch.testing.assert_close(c(x), F.log_softmax(x, -1), equal_nan=True)
    assert [k.backend for k in b.compiled[0].kernels] == ["c"]  # one row kernel
    # a NaN anywhere in a long row, or all of it (the max, a vector reduction, may pass over a
    # NaN: the row's sum carries it to every output)
    x = torch.randn(4, 100)
    x[1, 57] = x[2, 0] = nan
    x[3] = nan
    torch.testing.assert_close(c(x), F.log_softmax(x, -1), equal_nan=True)
    assert c(x)[1:].isnan().all() and not c(x)[0].isnan().any()


def test_any_dim_any_size_and_symbolic_sizes_are_row_kernels():
    def f(x, y):
        return F.log_softmax(x, 0) * 2, F.log_softmax(y, -1) * 2

    x, y = torch.randn(6, 5), torch.randn(LIMIT // 64 + 1, 64)
    b, c = compile_c(f)
    for got, want in zip(c(x, y), f(x, y)):
        torch.testing.assert_close(got, want)
    assert "aten._log_softmax" not in b.compiled[0].source
    assert {k.backend for k in b.compiled[0].kernels} == {"c"}
    b, c = compile_c(lambda x: F.log_softmax(x, -1) * 3, dynamic=True)
    for n in (8, 5):
        x = torch.randn(n, 10)
        torch.testing.assert_close(c(x), F.log_softmax(x, -1) * 3)
    assert all("aten._log_softmax" not in cc.source for cc in b.compiled)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_runs_atens_kernel(dtype):
    """(eager computes low precision rows in float32 and rounds once: not split)"""
    x = torch.randn(4, 10, dtype=dtype)
    b, c = compile_c(lambda x: F.log_softmax(x, -1) * 2)
    torch.testing.assert_close(c(x), F.log_softmax(x, -1) * 2)
    assert "aten._log_softmax.out(" in b.compiled[0].source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction, weighted, ignore_index, shape", [
    ("mean", False, -100, (8, 10)), ("sum", True, -100, (8, 10)), ("mean", True, 3, (8, 10)),
    ("mean", False, -100, (10,)), ("sum", False, 0, (5, 3)), ("none", True, 1, (6, 4)), ("none", False, -100, (7,))])
def test_nll_loss_split_matches_eager(reduction, weighted, ignore_index, shape, dtype):
    torch.manual_seed(2)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    y = torch.randint(0, shape[-1], shape[:-1])
    w = torch.rand(shape[-1], dtype=dtype) + 0.5 if weighted else None

    def fn(x, y, w):
        return F.cross_entropy(x, y, weight=w, reduction=reduction, ignore_index=ignore_index)

    b, c = compile_c(fn)
    loss = c(x, y, w)
    loss.sum().backward()
    grad, x.grad = x.grad, None
    ref = fn(x, y, w)
    ref.sum().backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, x.grad)
    sources = "".join(cc.source for cc in b.compiled)
    assert "aten.nll_loss_forward" not in sources and "aten.nll_loss_backward" not in sources
    assert not [k for k in fallbacks(b) if "nll" in k]


def test_a_target_out_of_bounds_raises_eagers_error(kernels_through):
    x = torch.randn(8, 10, requires_grad=True)
    b, c = compile_c(lambda x, y: F.cross_entropy(x, y))
    c(x, torch.randint(0, 10, (8,))).backward()
    assert "aten.nll_loss_forward" not in b.compiled[0].source and "fxforge.nll_targets" in b.compiled[0].source
    for bad in (10, -1, 1 << 40):
        y = torch.randint(0, 10, (8,))
        y[5] = bad
        with pytest.raises(IndexError) as eager:
            F.cross_entropy(x, y)
        with pytest.raises(IndexError) as compiled:
            c(x, y)
        assert str(compiled.value) == str(eager.value) == f"Target {bad} is out of bounds."


def test_every_target_ignored_gives_eagers_nan():
    x = torch.randn(6, 4)
    y = torch.full((6,), -100)
    b, c = compile_c(lambda x, y: F.cross_entropy(x, y))
    out = c(x, y)
    assert out.isnan() and F.cross_entropy(x, y).isnan()
    y[2] = 1  # one row counts again
    torch.testing.assert_close(c(x, y), F.cross_entropy(x, y))


def test_a_log_softmax_read_at_one_class_per_row_is_never_stored():
    """Inference: ``log_softmax(x).gather(...)`` (a token's log-probability) moves the gather up to
    ``x`` (``SinkGathers``): the row kernel computes the row statistics, no tensor of x's size."""
    x, y = torch.randn(64, 1000), torch.randint(0, 1000, (64, 1))

    def fn(x, y):
        return F.log_softmax(x * 2, -1).gather(-1, y) + 1

    b, c = compile_c(fn)
    torch.testing.assert_close(c(x, y), fn(x, y))
    (g,) = b.compiled
    assert not stored_like(g, x), g.source
    assert all(n.args[0].op == "placeholder" or n.args[0].target == aten.expand.default
               for n in g.graph.graph.nodes if n.target == aten.gather.default), g.source


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_large_nll_gradient_is_c_kernels_and_checks_its_targets(reduction):
    """A GPT-sized head's NLL gradient (mostly zeros) is pointwise C kernels, any reduction, class
    weights and ignored rows included; called directly with a target out of bounds, it raises."""
    rows = ONE_THREAD_MAX_NUMEL // 512 + 1
    x = torch.randn(rows, 512, requires_grad=True)
    y = torch.randint(0, 512, (rows,))
    y[::7] = -100
    w = torch.rand(512) + 0.5

    def fn(x, y):
        return F.nll_loss(x, y, weight=w, reduction=reduction).sum()

    b, c = compile_c(fn)
    c(x, y).backward()
    grad, x.grad = x.grad, None
    fn(x, y).backward()
    torch.testing.assert_close(grad, x.grad)
    (bw,) = [cc for cc in b.compiled if cc.stats["graph"] == "backward"]
    assert "aten.nll_loss_backward" not in bw.source and not fallbacks(b)
    # the op called by itself: its targets checked
    red = {"none": 0, "mean": 1, "sum": 2}[reduction]
    g = torch.ones(rows) if reduction == "none" else torch.tensor(1.0)
    bwd = lambda g, x, y: aten.nll_loss_backward(g, x, y, w, red, -100, torch.tensor(float(rows)))  # noqa: E731
    b, c = compile_c(bwd)
    torch.testing.assert_close(c(g, x.detach(), y), bwd(g, x.detach(), y))
    y[3] = 512
    if reduction != "none":  # (eager's kernel checks its targets there alone)
        with pytest.raises(IndexError):
            bwd(g, x.detach(), y)
    with pytest.raises(RuntimeError, match="nll_loss_backward: a target is out of bounds"):
        c(g, x.detach(), y)
