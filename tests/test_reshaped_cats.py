"""Cats of reshaped values (``lowering/reshaped_cats.py``): the values before the reshape are
concatenated, so the zero-copy pass can have their kernels write into the result.

Every case runs against eager on random inputs; ``stats["copy_bytes"]`` is checked against the
bytes the rewritten cat still copies, and (torch backend) against ``CopyCounter``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (see test_triton_codegen)

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxforge
from fxforge import Config
from fxforge.codegen.c import build
from fxforge.passes.memory import verify_memory_plan
from fxforge.testing import profile

sys.path.insert(0, os.path.dirname(__file__))
from test_padcat import F32, measured, slices  # noqa: E402

CODEGENS = ["torch", "triton"] + (["c"] if build.compiler() is not None else [])


def rewritten(c) -> int:
    (rec,) = [p for p in c.stats["passes"] if p["name"] == "cat_through_reshapes"]
    return rec["stats"]["cats_through_reshapes"]


def run(f, *args, codegen="torch", **config):
    torch._dynamo.reset()
    b = fxforge.backend(Config(codegen=codegen, debug=True, **config))
    got, want = torch.compile(f, backend=b, fullgraph=True)(*args), f(*args)
    torch.testing.assert_close(got, want, atol=1e-4 if codegen == "triton" else 1e-5, rtol=1e-5)
    (c,) = b.compiled
    verify_memory_plan(c.plan.memory)
    return c


def qkv(a, b, c, w):
    """Three (B, T, H, D) values merged to (B, T, H*D) and concatenated, as attention's backward
    does with the query, key and value gradients; the key's is a view (a transpose) of its input."""
    B, T, H, D = a.shape
    q = (a * 2).reshape(B, T, H * D)
    k = b.transpose(1, 2).reshape(B, T, H * D)  # b: (B, H, T, D), a copy on reshape
    v = (c + 1).reshape(B, T, H * D)
    return torch.cat([q, k, v], 2) @ w


@pytest.mark.parametrize("codegen", CODEGENS)
def test_query_and_value_are_written_into_the_cat_and_only_the_key_is_copied(codegen):
    B, T, H, D = 2, 8, 4, 8
    args = (torch.randn(B, T, H, D), torch.randn(B, H, T, D), torch.randn(B, T, H, D), torch.randn(3 * H * D, 5))
    c = run(qkv, *args, codegen=codegen)
    assert rewritten(c) == 1
    assert {"mul", "add"} <= set(slices(c))
    # the key: its reshape is a copy (the transpose), which the cat makes in its region
    assert c.stats["copy_bytes"] == B * T * H * D * F32
    if codegen == "torch":
        assert measured(c, *args) == B * T * H * D * F32


def test_without_zero_copy_the_cat_is_left_alone():
    B, T, H, D = 2, 8, 4, 8
    args = (torch.randn(B, T, H, D), torch.randn(B, H, T, D), torch.randn(B, T, H, D), torch.randn(3 * H * D, 5))
    c = run(qkv, *args, zero_copy=False)
    assert "cat_through_reshapes" not in [p["name"] for p in c.stats["passes"]]
    assert not slices(c)


@pytest.mark.parametrize("case", ["widths differ", "not a multiple", "a merge of other dims", "cat dim not split"])
def test_cats_that_cannot_be_split_alike_are_kept(case):
    a, b = torch.randn(2, 6, 4, 8), torch.randn(2, 6, 8, 4)

    def f(a, b):
        x = (a * 2).reshape(2, 6, 32)
        if case == "widths differ":  # split by 8 and by 4
            y = (b + 1).reshape(2, 6, 32)
        elif case == "not a multiple":  # 4 is no multiple of 8
            y = b[:, :, 0, :] + 1
        elif case == "a merge of other dims":
            x = (a * 2).reshape(12, 32).reshape(2, 6, 32)  # a view of a view: its source is 2-d
            y = b.reshape(2, 6, 32) + 1
        else:  # the reshape splits another dim than the cat's
            x = (a * 2).permute(0, 2, 1, 3).reshape(2, 24, 8)
            return torch.cat([x, x[:, :3] * 3], 1).sum(0)
        return torch.cat([x, y], 2).sum(0)

    c = run(f, a, b)
    assert rewritten(c) == 0


def test_a_symbolic_size_is_left_alone():
    torch._dynamo.reset()
    b = fxforge.backend(Config(codegen="torch", debug=True))
    g = torch.compile(lambda a, w: torch.cat([(a * 2).reshape(a.shape[0], 32), a.reshape(a.shape[0], 32) + 1], 1) @ w,
                      backend=b, fullgraph=True, dynamic=True)
    w = torch.randn(64, 3)
    for n in (3, 5, 7):
        a = torch.randn(n, 4, 8)
        torch.testing.assert_close(g(a, w), torch.cat([(a * 2).reshape(n, 32), a.reshape(n, 32) + 1], 1) @ w)
    assert all(rewritten(c) == 0 for c in b.compiled)


def test_a_returned_cat_stays_a_tensor_of_its_own_and_a_split_value_read_elsewhere_keeps_its_value():
    def f(a, b):
        x = a * 2
        out = torch.cat([x.reshape(4, 24), (b + 1).reshape(4, 24), b.reshape(4, 24)], 1)
        return out, x.sum(1)

    a, b = torch.randn(4, 6, 4), torch.randn(4, 6, 4)
    c = run(f, a, b)
    assert rewritten(c) == 0 and c(a, b)[0]._base is None  # returned: no view of a new cat

    def g(a, b):
        x = a * 2
        return torch.cat([x.reshape(4, 24), (b + 1).reshape(4, 24)], 1).sum(0), x.sum(1)

    assert rewritten(run(g, a, b)) == 1


class Attention(torch.nn.Module):
    """Self-attention with one fused q/k/v projection: its backward concatenates the three gradients."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.qkv, self.out, self.heads = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), heads

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, 2)
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5).softmax(-1)
        return self.out((att @ v).transpose(1, 2).reshape(B, T, d))


@pytest.mark.parametrize("codegen", CODEGENS)
def test_attention_backward_writes_its_gradients_into_the_cat(codegen):
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(2, 8, 32, requires_grad=True)
    ref = Attention()
    ref.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    b = fxforge.backend(Config(codegen=codegen, debug=True))
    out = torch.compile(model, backend=b)(x)
    out.square().sum().backward()
    gx, x.grad = x.grad, None
    ref(x).square().sum().backward()
    tol = {"atol": 1e-4, "rtol": 1e-4} if codegen == "triton" else {}
    torch.testing.assert_close(gx, x.grad, **tol)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol)
    (bw,) = [c for c in b.compiled if c.stats["graph"] == "backward"]
    verify_memory_plan(bw.plan.memory)
    assert rewritten(bw) == 1 and len(slices(bw)) >= 2


@st.composite
def cats(draw):
    """A cat along dim ``d`` of inputs of random kinds: a computed value reshaped from its split
    form, a view reshaped (a copy), or a value computed at the merged shape."""
    lead = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    trail = draw(st.lists(st.integers(1, 3), min_size=0, max_size=1))
    c = draw(st.integers(1, 4))
    kinds = draw(st.lists(st.tuples(st.sampled_from(["split", "view", "plain"]), st.integers(1, 3)), min_size=1, max_size=4))
    return lead, trail, c, kinds


@settings(profile(), max_examples=30, deadline=None)
@given(cats())
def test_random_cats_of_reshapes_match_eager(case):
    lead, trail, c, kinds = case
    d = len(lead)
    xs = [torch.randn(*lead, k, c, *trail) for _, k in kinds]

    def f(*xs):
        parts = []
        for (kind, k), x, i in zip(kinds, xs, range(len(xs))):
            merged = [*lead, k * c, *trail]
            if kind == "split":
                parts.append((x * (i + 2)).reshape(merged))
            elif kind == "view":  # a transposed copy of the split form
                parts.append(x.transpose(d, d + 1).contiguous().transpose(d, d + 1).mul(0.5).reshape(merged))
            else:
                parts.append(x.reshape(merged) - i)
        return torch.cat(parts, d) * 1.5

    c_ = run(f, *xs)
    # (a "view" input may be a reshape of a computed split value too, where its layout allows)
    assert rewritten(c_) == 1 or not any(kd == "split" for kd, _ in kinds)
