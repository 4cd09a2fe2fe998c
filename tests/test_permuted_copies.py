"""Copies of permuted values (``lowering/permuted_copies.py``): ``clone(permute(v))`` becomes a
copy of ``v`` laid out permuted, which the fusion pass puts in the kernel computing ``v``.

Every case runs against eager on random inputs."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (see test_triton_codegen)

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxforge
from fxforge import Config
from fxforge.codegen.c import build
from fxforge.core.graph import GROUP
from fxforge.passes.memory import verify_memory_plan
from fxforge.testing import profile

CODEGENS = ["torch", "triton"] + (["c"] if build.compiler() is not None else [])
copy_strided = torch.ops.prims.copy_strided.default


def rewritten(c) -> int:
    (rec,) = [p for p in c.stats["passes"] if p["name"] == "permuted_copies"]
    return rec["stats"]["permuted_copies"]


def run(f, *args, codegen="c", **config):
    torch._dynamo.reset()
    b = fxforge.backend(Config(codegen=codegen, debug=True, **config))
    got, want = torch.compile(f, backend=b, fullgraph=True)(*args), f(*args)
    tol = {"atol": 1e-4, "rtol": 1e-5} if codegen == "triton" else {}
    for x, y in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        torch.testing.assert_close(x, y, **tol)
        assert [st for st, n in zip(x.stride(), x.shape) if n > 1] == [st for st, n in zip(y.stride(), y.shape) if n > 1]
    (c,) = b.compiled
    verify_memory_plan(c.plan.memory)
    return c


def fused_with_producer(c) -> bool:
    """Each copy runs in one kernel with the node computing its input."""
    gm = c.graph
    copies = [n for n in gm.graph.nodes if n.target is copy_strided]
    return bool(copies) and all(n.meta.get(GROUP) is not None and n.meta.get(GROUP) == n.args[0].meta.get(GROUP)
                                for n in copies)


def mixing(x, w):
    """A mixer's token mixing: a layer norm's result transposed and made contiguous for a matmul."""
    v = torch.nn.functional.layer_norm(x * 2, x.shape[-1:])
    return v.transpose(1, 2).contiguous() @ w, v.sum(-1)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_transposed_copy_is_stored_by_the_kernel_computing_it(codegen):
    x, w = torch.randn(4, 16, 32), torch.randn(16, 5)
    c = run(mixing, x, w, codegen=codegen)
    if codegen != "torch":  # (the torch backend keeps layer norm one node: its result is a getitem)
        assert rewritten(c) == 1 and fused_with_producer(c), c.source


@pytest.mark.parametrize("make", ["permute", "t", "clone_of_transpose", "channels_last"])
def test_permutations_match_eager(make):
    def f(x):
        v = x.sin() + 1 if make != "t" else x[0].sin() + 1
        if make == "permute":
            return v.permute(2, 0, 1).contiguous() * 3
        if make == "t":
            return v.t().clone() * 3
        if make == "clone_of_transpose":
            return torch.clone(v.transpose(0, 2)) * 3
        return v.permute(0, 3, 1, 2).clone(memory_format=torch.channels_last) * 3

    c = run(f, torch.randn(2, 3, 5, 7) if make == "channels_last" else torch.randn(3, 5, 7))
    assert rewritten(c) == 1


def test_what_is_not_rewritten():
    def f(x, y):
        a = x.transpose(0, 1).contiguous()  # a graph input: no kernel to store it
        v = y * 2
        b = v[:, :3].clone()  # a slice: not a permutation
        return a, b, v.transpose(0, 1).transpose(0, 1).contiguous()  # two transposes: one view each

    c = run(f, torch.randn(4, 6), torch.randn(5, 6))
    assert rewritten(c) == 0


def test_a_returned_copy_stays_a_tensor_of_its_own():
    x = torch.randn(4, 6)
    c = run(lambda x: (x * 2).t().contiguous(), x)
    assert rewritten(c) == 0 and c(x)[0]._base is None


def test_training_through_the_mixer_block():
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32, requires_grad=True)
    w = torch.randn(16, 8, requires_grad=True)
    torch._dynamo.reset()
    b = fxforge.backend(Config(codegen="c" if "c" in CODEGENS else "torch", debug=True))
    out = torch.compile(lambda x, w: mixing(x, w)[0].square().sum(), backend=b)(x, w)
    out.backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    mixing(x, w)[0].square().sum().backward()
    # (layer norm's statistics in double: a few float32 ulps from eager's)
    torch.testing.assert_close(gx, x.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, w.grad, atol=1e-4, rtol=1e-4)
    assert sum(rewritten(c) for c in b.compiled) >= 1


@settings(profile(), max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4), st.randoms(use_true_random=False))
def test_random_permutations_match_eager(shape, rnd):
    perm = list(range(len(shape)))
    rnd.shuffle(perm)

    def f(x):
        return (x * 2 - 1).permute(perm).contiguous() + 0.5

    c = run(f, torch.randn(*shape))
    # (a permutation moving only dims of size 1 is contiguous already: no copy to rewrite)
    assert rewritten(c) == (0 if torch.empty(shape).permute(perm).is_contiguous() else 1)
