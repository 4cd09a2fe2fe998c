"""Per-call overhead of the generated wrapper, by its structure (times: bench/README.md, "Per-call
overhead"): after the first call a static graph allocates no arena and builds no arena view, calls each op
through its bound dispatcher entry (no ``OpOverload.__call__`` frame), and lends its kept arenas
to one call at a time."""

from __future__ import annotations

import re
import sys
import threading
from collections import Counter

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import fxforge
from fxforge.spine import compile_graph

aten = torch.ops.aten


class MLP(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
        return (x + h).softmax(-1)


class Ops(TorchDispatchMode):
    """Counts every ATen op a call dispatches (what the wrapper and its kernels call)."""

    def __init__(self):
        super().__init__()
        self.count = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func] += 1
        return func(*args, **(kwargs or {}))


def _compiled(**config):
    torch.manual_seed(0)
    model = MLP().eval()
    b = fxforge.backend(fxforge.Config(debug=True, **config))
    return model, b, torch.compile(model, backend=b, fullgraph=True)


def _second_call_ops(**config) -> tuple[Counter, fxforge.Compiled]:
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(8, 32)
    c = fxforge.compile_exported(torch.export.export(model, (x,)), fxforge.Config(debug=True, **config))
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x))  # the first call makes the kept arenas
        with Ops() as ops:
            got = c(x)
        torch.testing.assert_close(got, model(x))
    return ops.count, c


def test_a_static_graph_allocates_no_arena_and_builds_no_view_after_its_first_call():
    kept, c = _second_call_ops()
    assert c.stats["kept_arena_bytes"] > 0 and c.stats["kept_arena_bytes"] >= c.stats["arena_bytes"]
    # fresh CPU outputs come from torch's fast allocator (runtime.empty_strided_cpu), which no
    # dispatch mode sees: counted in the call's source instead
    def allocations(ops: Counter, c: fxforge.Compiled) -> int:
        fast = c.source.split("\ndef call(", 1)[1].count("empty_strided_cpu(")
        return ops[aten.empty.memory_format] + ops[aten.empty_strided.default] + fast

    outputs = sum(1 for b in c.plan.memory.buffers.values() if b.kind == "fresh")
    assert allocations(kept, c) == outputs  # only what the call returns is allocated
    assert kept[aten.as_strided.default] == 0 and kept[aten.view.dtype] == 0
    # the same graph with arenas made per call: one allocation per arena, a view per buffer
    per_call, d = _second_call_ops(keep_arenas="never")
    assert d.stats["kept_arena_bytes"] == 0
    assert allocations(per_call, d) == len(d.plan.memory.arenas) + outputs
    assert per_call[aten.as_strided.default] >= sum(1 for b in d.plan.memory.buffers.values() if b.kind == "arena")


def test_ops_are_called_through_their_bound_entries():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(8, 32)
    c = fxforge.compile_exported(torch.export.export(model, (x,)),
                                 fxforge.Config(debug=True, fallback_ops=["aten.gelu"]))  # an eager call too
    frames = Counter()

    def profile(frame, event, arg):
        if event == "call":
            frames[getattr(frame.f_code, "co_qualname", frame.f_code.co_name)] += 1

    with torch.no_grad():
        c(x)
        sys.setprofile(profile)
        try:
            got = c(x)
        finally:
            sys.setprofile(None)
        torch.testing.assert_close(got, model(x))
    assert frames["call"] == 1 and not any("OpOverload.__call__" in k for k in frames), frames
    assert "torch.addmm(" in c.source and "aten.gelu.default(" in c.source and "torch.ops.aten." not in c.source


def test_unsafe_views_inside_the_call_are_tensor_views_and_returned_ones_are_not_views():
    def f(x, w):
        inner = aten._unsafe_view.default(x, [16, 8])  # an input's view, read by the matmul
        out = aten._unsafe_view.default(aten.mm.default(inner, w).relu(), [4, 32])  # returned
        return out, inner.sum()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(8, 16), torch.randn(8, 8))
    c = compile_graph(gm, fxforge.Config(debug=True, codegen="torch"))
    x, w = torch.randn(8, 16), torch.randn(8, 8)
    out, total = c(x, w)
    want = f(x, w)
    torch.testing.assert_close(out, want[0])
    torch.testing.assert_close(total, want[1])
    assert out._base is None  # returned: not a view of an internal tensor
    src = c.source.split("\ndef call(", 1)[1]
    # the inner one: a view of the input at its traced layout (runtime.reinterpret); the returned
    # one views a tensor an ATen kernel returned (its layout is ATen's): its op
    assert src.count("aten._unsafe_view.default(") == 1 and "reinterpret(x_1, (16, 8), (8, 1), 0)" in src, src


def test_returned_views_alias_as_eager_and_are_saved_without_a_detach():
    """A returned view whose storage is its own among what the caller holds is made by layout
    (no autograd view of its base): AOTAutograd saves it for the backward as it is, where it
    detaches a view first.  One that views an input or shares its storage with another returned
    value keeps its op: the caller sees eager's aliasing, and writing to one of them in place
    makes the backward raise as eager's does."""
    def f(x, w):
        y = (x @ w).relu()
        return y, y.view(-1), x.view(4, -1).t(), (y.view(2, -1) * 3).sum()

    def run(fn):
        torch.manual_seed(0)
        x, w = torch.randn(8, 6), torch.randn(6, 6, requires_grad=True)
        out = fn(x, w)
        grad = torch.autograd.grad(out[0].sum() + out[3], w, retain_graph=True)[0]
        y, flat, xt, _ = out
        assert flat.untyped_storage().data_ptr() == y.untyped_storage().data_ptr() and flat._is_view()
        assert xt.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        with torch.no_grad():
            y.add_(1)
        assert torch.equal(flat, y.view(-1))  # a view of the output, as in eager
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(out[0].sum() + out[3], w)  # the saved y changed, as in eager
        return out, grad

    torch._dynamo.reset()
    got, want = run(torch.compile(f, backend=fxforge.backend(fxforge.Config(debug=True)), fullgraph=True)), run(f)
    for a, b in zip(got[0] + (got[1],), want[0] + (want[1],)):
        torch.testing.assert_close(a, b)

    # an MLP's training graph: the views it saves of its own intermediates are made by layout
    torch._dynamo.reset()
    backend = fxforge.backend(fxforge.Config(debug=True))
    mlp = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 6))
    cm = torch.compile(mlp, backend=backend, fullgraph=True)
    x = torch.randn(2, 4, 6)
    cm(x).sum().backward()
    forward = next(c for c in backend.compiled if c.stats["graph"] == "forward")
    call = forward.source.split("\ndef call(", 1)[1]
    # the saved view of the GELU's result by layout; the saved view of the input x by its op
    assert re.search(r"view_\d+ = reinterpret\(gelu, ", call) and "aten.view.default(" not in call, call
    assert all(base.startswith("primals") for base in re.findall(r"(\w+)\.view\(", call)), call
    seen = []
    orig = forward._fn
    forward._fn = lambda args: (inputs := list(args), out := orig(args), seen.append((inputs, out)))[1]
    cm(x).sum().backward()
    (inputs, out), = seen
    views = [t for t in out if isinstance(t, torch.Tensor) and t._is_view()]
    assert all(any(t._base is i for i in inputs) for t in views)  # views of inputs only


def test_public_bindings_resolve_to_the_out_overload():
    """``runtime.PUBLIC_OUT``: each binding, called as the wrapper calls it, dispatches the overload."""
    from fxforge.codegen.runtime import PUBLIC_OUT

    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)
    ba, bb, bc = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(2, 3, 5)
    calls = {
        aten.mm.out: ((a, b), {}), aten.addmm.out: ((c, a, b), {"beta": 0.5, "alpha": 2.0}),
        aten.bmm.out: ((ba, bb), {}), aten.baddbmm.out: ((bc, ba, bb), {"beta": 0.5, "alpha": 2.0}),
    }
    assert set(calls) == set(PUBLIC_OUT)
    for op, (args, kwargs) in calls.items():
        for kw in ({}, kwargs):
            expected = torch.empty(op(*args, **kw, out=torch.empty(0)).shape)
            op(*args, **kw, out=expected)
            out = torch.empty_like(expected)
            with Ops() as ops:
                eval(PUBLIC_OUT[op], {"torch": torch})(*args, **kw, out=out)
            assert list(ops.count) == [op], (op, ops.count)
            torch.testing.assert_close(out, expected)


def test_kept_arenas_are_lent_to_one_call_at_a_time():
    """Two threads inside the graph at once (a custom op in it waits for both): one call has the
    kept arenas, the other makes its own; both results are right."""
    meeting: list[threading.Barrier] = []  # set while the two threads run
    lib = torch.library.Library("fxforge_overhead", "DEF")
    lib.define("meet(Tensor x) -> Tensor")
    lib.impl("meet", lambda x: ([m.wait() for m in meeting], x * 2)[1], "CPU")
    lib.impl("meet", lambda x: torch.empty_like(x), "Meta")

    class F(torch.nn.Module):
        def forward(self, x, w):
            h = torch.relu(x @ w) + 1
            return torch.ops.fxforge_overhead.meet(h) @ w

    w = torch.randn(16, 16)
    xs = [torch.randn(4, 16) for _ in range(2)]
    c = fxforge.compile_exported(torch.export.export(F(), (xs[0], w)), fxforge.Config(debug=True))
    c(xs[0], w)  # alone: the first call makes the kept arenas
    assert c.stats["kept_arena_bytes"] > 0
    meeting.append(threading.Barrier(2, timeout=30))
    results = [None, None]

    def run(i):
        results[i] = c(xs[i], w)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for x, got in zip(xs, results):
        torch.testing.assert_close(got, ((torch.relu(x @ w) + 1) * 2) @ w)


def test_training_graphs_allocate_arenas_per_call_unless_small_or_asked():
    x = torch.randn(8, 32, requires_grad=True)
    for policy, limit, kept in (("inference", 0, False), ("always", 0, True), ("inference", 1 << 20, True),
                                ("never", 1 << 20, False)):
        model, b, cm = _compiled(keep_arenas=policy, keep_training_arenas_max_bytes=limit)
        cm(x).sum().backward()
        graphs = {c.stats["graph"]: c.stats["kept_arena_bytes"] > 0 for c in b.compiled}
        assert graphs == {"forward": kept, "backward": kept}, (policy, graphs)
        g = x.grad.clone()
        x.grad = None
        model(x).sum().backward()
        torch.testing.assert_close(g, x.grad)
        x.grad = None


def test_views_of_values_laid_out_as_traced_are_reinterpreted():
    """Views of inputs and planned buffers are made at their traced layout (``runtime.reinterpret``,
    no view op dispatched), relative to where their base starts: an input with a storage offset
    and buffers placed in the kept arenas give eager's values; a dtype view keeps its op."""
    def f(x, w):
        y = x * 2
        a = y.view(4, 16).t()  # views of a planned buffer
        b = x[:, 1:].transpose(0, 1)  # views of an input
        bits = (y + 1).view(torch.int32)  # a dtype view: its op
        return (a @ w).relu(), b.sum(0), bits

    base, w = torch.randn(10, 8), torch.randn(4, 5)
    x = base[2:]  # a storage offset of 16 elements
    gm = make_fx(f, tracing_mode="fake")(x, w)
    c = compile_graph(gm, fxforge.Config(debug=True, codegen="torch"))
    for _ in range(2):  # the second call: views of kept buffers
        for got, want in zip(c(x, w), f(x, w)):
            assert torch.equal(got, want)
    src = c.source
    assert src.count("reinterpret(") >= 3 and "aten.view.dtype(" in src, src
    with Ops() as ops:
        c(x, w)
    assert not {"aten.t.default", "aten.transpose.int", "aten.slice.Tensor"} & set(map(str, ops.count)), ops.count


def test_reinterpret_fallback_matches_torchs():
    from fxforge.codegen import runtime

    block = torch.arange(4096, dtype=torch.float32)
    x = block.as_strided((8, 16, 8), (128, 8, 1), 300)
    for size, stride, offset in (((16, 64), (64, 1), 0), ((4, 8), (1, 16), 7), ((8,), (0,), 3)):
        fast, slow = runtime.reinterpret(x, size, stride, offset), runtime._reinterpret_fallback(x, size, stride, offset)
        assert torch.equal(fast, slow) and fast.storage_offset() == slow.storage_offset() == 300 + offset
        assert not fast._is_view() and not slow._is_view()  # tensors of their own over x's storage


def test_views_that_carry_a_bit_keep_their_op():
    """``conj`` and ``_neg_view`` are views with the same layout and a bit set: made by layout
    alone they would lose it (fft.hfft2's and polar's gradients went wrong so)."""
    def f(x, w):
        y = x * 2
        return y.conj() @ w, aten._neg_view(y) @ w

    x, w = torch.randn(4, 6, dtype=torch.complex64), torch.randn(6, 3, dtype=torch.complex64)
    gm = make_fx(f, tracing_mode="fake")(x, w)
    for codegen in ("torch", "c"):
        c = compile_graph(gm, fxforge.Config(debug=True, codegen=codegen))
        for got, want in zip(c(x, w), f(x, w)):
            torch.testing.assert_close(got, want)
