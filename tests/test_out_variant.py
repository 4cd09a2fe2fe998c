"""Out-variant lowering: custom and ATen ops write straight into planned buffers.

The custom operators live in ``out_variant_ops.py`` (defined with ``torch.library``, Python
implementations registered as CompositeExplicitAutograd, counting their calls).
"""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxforge
from fxforge import Config
from fxforge.lowering.out_variant import OutVariantRegistry, out_variant, register_out_variant, usable_on
from fxforge.passes.memory import verify_memory_plan
from fxforge.testing import profile

sys.path.insert(0, os.path.dirname(__file__))
import out_variant_ops as ops  # noqa: E402

fxov = torch.ops.fxov


def compiled(fn, *, dynamic=None, **config):
    torch._dynamo.reset()
    b = fxforge.backend(Config(debug=True, **config))
    return b, torch.compile(fn, backend=b, fullgraph=True, dynamic=dynamic)


def calls(*names):
    return {n: ops.CALLS[n] for n in names}


# --------------------------------------------------------------------------- finding the variant


def test_out_variants_are_found_in_the_packet():
    v = out_variant(fxov.scale_add.default)
    assert v.op is fxov.scale_add.out and v.outs == ("out",) and v.aliases == (None,)
    v = out_variant(fxov.mm_split.default)
    assert v.op is fxov.mm_split.out and v.outs == ("out0", "out1")
    assert out_variant(fxov.twice.default).aliases == (0,)  # Tensor(a) x / Tensor(a!) out: may alias x
    assert out_variant(fxov.soft.default) is None  # its out form lives elsewhere
    assert out_variant(torch.ops.aten.topk.default).outs == ("values", "indices")
    assert all(usable_on(out_variant(op), "cpu") for op in (fxov.scale_add.default, fxov.mm_split.default))
    assert not usable_on(out_variant(torch.ops.aten.native_layer_norm.default), "cpu")  # composite: copies


@pytest.mark.parametrize("functional, out_op, message", [
    (fxov.soft.default, fxov.scale_add.out, r"argument 0 of fxov.scale_add.out is 'x: Tensor'.*|has an argument"),
    (fxov.scale_add.default, fxov.mm_split.out, r"argument 1 of fxov.mm_split.out is 'w: Tensor', expected 'y: Tensor'"),
    (fxov.mm_split.default, fxov.mm_split.default, r"0 out arguments .*expected one per return of fxov.mm_split.default: 2"),
    (fxov.scale_add.default, fxov.twice.out, r"argument|has an argument"),
    (torch.ops.aten.add_.Tensor, torch.ops.aten.add.out, r"mutates its inputs"),
    ("fxov::soft", torch.ops.fxov_other.soft_into.default, r"functional_op='fxov::soft' is not an OpOverload"),
])
def test_a_wrong_registration_names_what_does_not_match(functional, out_op, message):
    with pytest.raises(ValueError, match=message):
        OutVariantRegistry().register(functional, out_op)


# --------------------------------------------------------------------------- lowering


def test_single_output_custom_op_calls_its_out_form_into_the_plan():
    def f(x, y):
        return fxov.scale_add(torch.relu(x), y, 0.5).sum(-1)

    b, g = compiled(f)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    before = calls("scale_add", "scale_add.out")
    torch.testing.assert_close(g(x, y), ops._scale_add(torch.relu(x), y, 0.5).sum(-1))
    after = calls("scale_add", "scale_add.out")
    assert after["scale_add.out"] - before["scale_add.out"] == 1
    assert after["scale_add"] - before["scale_add"] == 0  # the functional form never ran after tracing
    c = b.compiled[0]
    assert "torch.ops.fxov.scale_add.out(" in c.source and c.stats["fallback_nodes"] == 0
    buf = next(bb for bb in c.plan.memory.buffers.values() if bb.producer.target is fxov.scale_add.default)
    assert buf.kind == "arena"


def test_multi_output_custom_op_with_dynamic_shapes_one_compile():
    def f(x, w):
        p, s = fxov.mm_split(x, w, 2.0)
        return torch.sigmoid(p).sum(-1) + s

    b, g = compiled(f, dynamic=True)
    w = torch.randn(8, 6)
    n0 = calls("mm_split", "mm_split.out")
    for batch in (3, 5, 11):
        x = torch.randn(batch, 8)
        p, s = ops._mm_split(x, w, 2.0)
        torch.testing.assert_close(g(x, w), torch.sigmoid(p).sum(-1) + s)
    n1 = calls("mm_split", "mm_split.out")
    assert n1["mm_split.out"] - n0["mm_split.out"] == 3 and n1["mm_split"] == n0["mm_split"]
    assert len(b.compiled) == 1  # one compile serves every batch size
    c = b.compiled[0]
    assert "torch.ops.fxov.mm_split.out(" in c.source
    outs = [bb for bb in c.plan.memory.buffers.values() if bb.producer.target is fxov.mm_split.default]
    assert len(outs) == 2 and all(bb.kind == "arena" and bb.nbytes.free_symbols for bb in outs)


def test_an_output_nothing_reads_still_gets_a_short_lived_buffer():
    def f(x, w):
        p, _ = fxov.mm_split(x, w, 1.0)
        return p + 1

    b, g = compiled(f)
    x, w = torch.randn(4, 8), torch.randn(8, 6)
    torch.testing.assert_close(g(x, w), x @ w + 1)
    bufs = {bb.index: bb for bb in b.compiled[0].plan.memory.buffers.values() if bb.producer.target is fxov.mm_split.default}
    assert set(bufs) == {0, 1} and bufs[1].kind == "arena" and bufs[1].start == bufs[1].end


def test_registered_out_form_from_another_namespace():
    register_out_variant(fxov.soft.default, torch.ops.fxov_other.soft_into.default)
    try:
        def f(x):
            return fxov.soft(x * 3) - 1

        b, g = compiled(f)
        x = torch.randn(5, 7)
        n = ops.CALLS["soft_into"]
        torch.testing.assert_close(g(x), torch.nn.functional.softplus(x * 3) - 1)
        assert ops.CALLS["soft_into"] == n + 1
        assert "torch.ops.fxov_other.soft_into.default(" in b.compiled[0].source
    finally:
        fxforge.lowering.out_variant.OUT_VARIANTS.unregister(fxov.soft.default)


def test_chain_of_four_out_variant_ops_uses_two_buffers():
    def f(x, y):
        h = x
        for a in (0.5, 1.5, -2.0, 3.0):
            h = fxov.scale_add(h, y, a)
        return h.sum()

    b, g = compiled(f)
    x, y = torch.randn(64, 48), torch.randn(64, 48)
    want = x
    for a in (0.5, 1.5, -2.0, 3.0):
        want = want * a + y
    torch.testing.assert_close(g(x, y), want.sum())
    mem = b.compiled[0].plan.memory
    chain = [bb for bb in mem.buffers.values() if bb.producer.target is fxov.scale_add.default]
    assert len(chain) == 4 and all(bb.kind == "arena" for bb in chain)
    regions = {(bb.arena, mem.hint(bb.offset)) for bb in chain}
    assert len(regions) <= 2, mem.dump()


def test_out_declared_to_alias_its_input_runs_in_place():
    def f(x):
        return fxov.twice(x * 3).sum(-1)

    b, g = compiled(f)
    x = torch.randn(16, 16)
    torch.testing.assert_close(g(x), (x * 6 + 1).sum(-1))
    mem = b.compiled[0].plan.memory
    out = next(bb for bb in mem.buffers.values() if bb.producer.target is fxov.twice.default)
    assert out.reuses is not None and mem.buffers[out.reuses].producer.target is torch.ops.aten.mul.Tensor
    assert "torch.ops.fxov.twice.out(mul, out=twice)" in b.compiled[0].source


def test_training_through_a_custom_op_with_an_autograd_formula():
    def f(x, y):
        return (fxov.scale_add(torch.tanh(x), y, 0.75) ** 2).sum()

    b, g = compiled(f)
    x, y = torch.randn(6, 5, requires_grad=True), torch.randn(6, 5, requires_grad=True)
    x2, y2 = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    g(x, y).backward()
    ((torch.tanh(x2) * 0.75 + y2) ** 2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(y.grad, y2.grad)
    fw = next(c for c in b.compiled if c.stats["graph"] == "forward")
    assert "torch.ops.fxov.scale_add.out(" in fw.source


def test_aten_multi_output_ops_in_a_compiled_model():
    def f(x):
        v, i = torch.topk(x, 3)
        s, j = torch.sort(x, -1)
        m, k = torch.max(x, 1)
        lo, hi = torch.aminmax(x, dim=1)
        return v * 2, i, s[:, 0] + m + lo + hi, j, k

    b, g = compiled(f)
    x = torch.randn(6, 9)
    for got, want in zip(g(x), f(x)):
        torch.testing.assert_close(got, want)
    src = b.compiled[0].source
    for out_call in ("aten.topk.values(", "aten.max.dim_max(", "aten.aminmax.out("):
        assert out_call in src, out_call


def test_an_out_form_that_raises_falls_back_to_eager_with_a_reason(caplog):
    def f(x):
        return fxov.fragile(x + 1) * 2

    torch._dynamo.reset()
    b = fxforge.backend(Config(debug=False))
    g = torch.compile(f, backend=b, fullgraph=True)
    x = torch.randn(3, 3)
    with caplog.at_level(logging.WARNING, logger="fxforge"):
        torch.testing.assert_close(g(x), x * 2)  # (x + 1 - 1) * 2, computed eagerly
    c = b.compiled[0]
    assert c.failures and "fragile.out is broken" in c.failures[0]
    assert "fragile.out is broken" in caplog.text


def test_a_custom_op_without_out_form_runs_as_registered_with_the_reason():
    def f(x):
        return fxov.soft(x) + 1

    b, g = compiled(f)
    x = torch.randn(4)
    torch.testing.assert_close(g(x), torch.nn.functional.softplus(x) + 1)
    (reason,) = b.compiled[0].stats["fallbacks"].values()
    assert "no out variant" in reason and "register_out_variant" in reason


# --------------------------------------------------------------------------- property


_CHAIN_OPS = ("scale_add", "twice", "mm_split", "relu")


@st.composite
def chains(draw):
    steps = draw(st.lists(st.sampled_from(_CHAIN_OPS), min_size=1, max_size=6))
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    scales = draw(st.lists(st.floats(-2, 2, allow_nan=False, width=32), min_size=len(steps), max_size=len(steps)))
    dynamic = draw(st.booleans())
    return steps, rows, cols, scales, dynamic


def run_chain(steps, scales, x, y, w):
    h = x
    for s, a in zip(steps, scales):
        if s == "scale_add":
            h = fxov.scale_add(h, y, a)
        elif s == "twice":
            h = fxov.twice(h)
        elif s == "mm_split":
            p, r = fxov.mm_split(h, w, a)
            h = p + r.unsqueeze(-1)
        else:
            h = torch.relu(h)
    return h


@settings(profile(), max_examples=25, deadline=None)
@given(chains())
def test_random_chains_of_out_variant_ops_match_eager_and_plans_verify(case):
    steps, rows, cols, scales, dynamic = case

    def f(x, y, w):
        return run_chain(steps, scales, x, y, w)

    b, g = compiled(f, dynamic=dynamic or None)
    for r in ([rows, rows + 2] if dynamic else [rows]):
        x, y, w = torch.randn(r, cols), torch.randn(r, cols), torch.randn(cols, cols)
        torch.testing.assert_close(g(x, y, w), f(x, y, w), rtol=1e-4, atol=1e-4)
    for c in b.compiled:
        verify_memory_plan(c.plan.memory)
        assert c.stats["fallback_nodes"] == 0
