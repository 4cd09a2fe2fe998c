"""C kernels on several threads (``build.openmp``, ``kernel.split``): the same bits at any
thread count, the work split only where it pays, and calls from several Python threads at once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fxforge
from fxforge.codegen.c import build, schedule
from thread_helpers import run_in_threads

pytestmark = [pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
              pytest.mark.usefixtures("kernel_cache")]


def _model(x, y, w, cols):
    """A pointwise chain, row kernels (layer norm, a sum), a column kernel and a transposed copy."""
    h = F.layer_norm(x + y, (x.shape[-1],), w)
    act = torch.relu(h * 2 + 1) - torch.maximum(y, h)
    return act, (x * y).sum(-1), (cols * 3).sum(0), x.t().contiguous() * 2


def _inputs(rows: int, d: int):
    g = torch.Generator().manual_seed(rows * 1000 + d)
    x, y = torch.randn(rows, d, generator=g), torch.randn(rows, d, generator=g)
    return x, y, torch.randn(d, generator=g), torch.randn(rows, 24, generator=g)


@pytest.fixture
def threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def _compiled(dynamic: bool, threads: int = 4):
    """Built for ``threads`` (``Config.threads``), whatever this machine has: split where it pays."""
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True, threads=threads))
    return b, torch.compile(_model, backend=b, fullgraph=True, dynamic=dynamic)


@pytest.mark.parametrize("dynamic", [False, True])
def test_same_bits_at_any_thread_count(threads, dynamic):
    b, fn = _compiled(dynamic)
    for rows, d in ((512, 96), (37, 200)):
        args = _inputs(rows, d)
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(fn(*args))
        # (sums: accumulated in double, eager's in float pairs)
        torch.testing.assert_close(results[0], _model(*args), equal_nan=True, rtol=1e-5, atol=1e-4)
        for other in results[1:]:
            for a, c in zip(results[0], other):
                assert torch.equal(a, c), "a C kernel's result changed with the thread count"
    assert {k.backend for c in b.compiled for k in c.kernels} >= {"c"}


def test_large_kernels_split_across_threads_small_ones_do_not():
    b, fn = _compiled(False)
    fn(*_inputs(2048, 96))
    big = b.compiled[-1].source
    assert big.count("#pragma omp parallel for") >= 3, big
    b, fn = _compiled(False)
    fn(*_inputs(4, 16))  # 64 elements: waking threads costs more than the work
    assert "#pragma omp parallel" not in b.compiled[-1].source


def test_kernels_built_for_one_thread_never_split(threads):
    torch.set_num_threads(1)
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))  # threads: torch's, at compile time
    fn = torch.compile(_model, backend=b, fullgraph=True)
    args = _inputs(512, 96)
    torch.testing.assert_close(fn(*args), _model(*args), equal_nan=True, rtol=1e-5, atol=1e-4)
    assert "#pragma omp parallel" not in b.compiled[-1].source


def test_the_split_pays_at_every_thread_count():
    least = schedule.parallel_min_work
    assert least(1) is None
    counts = [2, 3, 4, 8, 16, 64, 128]
    works = [least(t) for t in counts]
    assert works == sorted(works) and works[0] > 1000  # waking more threads costs more
    for t, w in zip(counts, works):  # at the cutoff, the time saved is the fork's cost
        saved = w * schedule.WORK_NS * (1 - 1 / t)
        assert saved >= schedule.FORK_NS * math.log2(t) > saved - schedule.WORK_NS


def _built_and_run_at_thread_counts(fn, run, source):
    """``run(compiled fn)`` with kernels built for 1 and for 4 threads (``Config.threads``), each
    run on 1 to 3: the results, and each build's ``source(backend)``."""
    results, sources = [], []
    for built in (1, 4):
        torch._dynamo.reset()
        b = fxforge.backend(fxforge.Config(codegen="c", debug=True, threads=built))
        compiled = torch.compile(fn, backend=b, fullgraph=True)
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(run(compiled))
        sources.append(source(b))
    return results, sources


def _same_bits(results: list, what: str) -> None:
    for other in results[1:]:
        for a, c in zip(results[0], other):
            assert torch.equal(a, c), f"{what} changed with the thread count it was built for or ran on"


def _columns(x, h):
    """Column kernels over many rows: a channels-last batch norm's per-channel sums over N, H and
    W, and a bias's gradient whose rows are stored too (gelu's gradient and its sum over rows)."""
    g = torch.ops.aten.gelu_backward(h, h * 0.5 + 1)
    return x.sum(dim=[0, 2, 3]), (x * x).amax(dim=[0, 2, 3]), g, g.sum(0)


def test_column_kernels_fold_rows_in_chunks_with_the_same_bits_at_any_thread_count(threads):
    """Rows folded in chunks, one thread a chunk (``kernel.row_chunks``), the chunks depending on
    the sizes alone: the same bits from kernels built for 1 or 4 threads, run on 1 to 3; a
    channels-last tensor's rows read at ``C * rindex`` (``Emitter.contiguous_groups``)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4, 40, 24, 20, generator=gen).to(memory_format=torch.channels_last)
    h = torch.randn(3000, 72, generator=gen)
    results, sources = _built_and_run_at_thread_counts(_columns, lambda fn: fn(x, h), lambda b: b.compiled[-1].source)
    torch.testing.assert_close(results[0], _columns(x, h), rtol=1e-5, atol=1e-4)
    _same_bits(results, "a column kernel's result")
    assert all(src.count("_chunks[") >= 3 for src in sources), sources[0]
    assert "#pragma omp parallel for" in sources[1] and "#pragma omp parallel" not in sources[0]
    assert "in_ptr0[(40*rindex + xi0)]" in sources[0], sources[0]


def _norms(x, r, w, b):
    """Layer norms whose gradients are the template (``templates.layer_norm_backward``): over rows
    laid out contiguously, and over a transposed residual's rows (staged in blocks of rows)."""
    return F.layer_norm(x, (x.shape[-1],), w, b), F.layer_norm(x + r.transpose(1, 2), (x.shape[-1],), w, b)


def test_layer_norm_gradient_walks_rows_in_chunks_with_the_same_bits_at_any_thread_count(threads):
    """The layer norm gradient's rows in chunks (``templates._row_chunks``, from the sizes
    alone), each adding its share of the weight's and bias's gradients into a part of its own,
    the parts added in chunk order: the same bits from kernels built for 1 or 4 threads, run on
    1 to 3; the chunks split across threads only in the kernel built for several."""
    gen = torch.Generator().manual_seed(11)
    args = [torch.randn(6, 100, 64, generator=gen), torch.randn(6, 64, 100, generator=gen),
            torch.randn(64, generator=gen), torch.randn(64, generator=gen)]
    cots = [torch.randn(6, 100, 64, generator=gen) for _ in range(2)]

    def grads(fn):
        leaves = [a.detach().clone().requires_grad_(i != 1) for i, a in enumerate(args)]
        outs = fn(*leaves)
        sum((o * c).sum() for o, c in zip(outs, cots)).backward()
        return [leaves[i].grad for i in (0, 2, 3)]

    results, sources = _built_and_run_at_thread_counts(
        _norms, grads, lambda b: [c.source for c in b.compiled if c.stats["graph"] == "backward"][-1])
    torch.testing.assert_close(results[0], grads(_norms), rtol=1e-4, atol=1e-4)
    _same_bits(results, "the layer norm gradient")
    for src in sources:
        assert src.count("template: layer norm backward") == 2 and src.count("acc_dw_chunks[rc]") >= 2, src
    assert "#pragma omp parallel for" in sources[1] and "#pragma omp parallel" not in sources[0]


def test_config_threads_is_checked():
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match="Config.threads"):
            fxforge.Config(threads=bad)


def test_symbolic_sizes_decide_at_run_time():
    b, fn = _compiled(True)
    fn(*_inputs(64, 48))
    src = b.compiled[-1].source
    assert f">= {schedule.parallel_min_work(4)})" in src, src


def test_calls_from_several_python_threads(threads):
    torch.set_num_threads(2)
    _, fn = _compiled(False)
    args = _inputs(512, 96)
    want = _model(*args)
    fn(*args)  # compiled once, before the threads call it

    def call():
        for _ in range(5):
            torch.testing.assert_close(fn(*args), want, rtol=1e-5, atol=1e-4)

    run_in_threads(call, 3)


def test_openmp_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FXFORGE_C_THREADS", "1")
    assert build.openmp() is False
    assert "-fopenmp" not in build.flags(build.openmp())
