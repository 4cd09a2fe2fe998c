"""A wrapper's C kernels are emitted once per group structure (``codegen/c/reuse.py``): a group
with an earlier one's key gets its kernel, renamed; groups differing in a constant, a layout or
which buffers are one get kernels of their own.  Debug mode (these tests) checks every reused
kernel against the emitter's own."""

from __future__ import annotations

import re

import torch

import fxforge
from fxforge.codegen.c import reuse


def _counting(monkeypatch):
    hits = []
    renamed = reuse._renamed
    monkeypatch.setattr(reuse, "_renamed", lambda *a: hits.append(a[1]) or renamed(*a))
    return hits


def _compiled(fn, *args):
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    return b, torch.compile(fn, backend=b, fullgraph=True)(*args)


def test_repeated_blocks_reuse_one_kernel_with_their_own_arguments(monkeypatch):
    hits = _counting(monkeypatch)

    def blocks(x, ws, bs):
        for w, b in zip(ws, bs):
            h = torch.mm(x, w)  # a matmul between blocks ends each group
            x = torch.tanh(h * 0.5 + b) + x
        return x

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g)
    ws = [torch.randn(16, 16, generator=g) / 4 for _ in range(4)]
    bs = [torch.randn(16, generator=g) for _ in range(4)]
    b, got = _compiled(blocks, x, ws, bs)
    torch.testing.assert_close(got, blocks(x, ws, bs))
    src = "".join(c.source for c in b.compiled)
    assert len(hits) >= 3, src  # the 2nd to 4th blocks' kernels are the first's
    # ... each launched with its own block's bias, under its own name
    for name in hits:
        assert f"{name} = {name}_c" in src
    kernels = re.findall(r"^# C kernel (\w+)_c", src, re.M)
    functions = set(re.findall(r"^# int (fxk_\w+)\(", src, re.M))
    assert len(kernels) >= len(functions) + len(hits), src


def test_a_different_constant_or_layout_is_not_reused(monkeypatch):
    hits = _counting(monkeypatch)

    def two(x, y):
        a = torch.mm(x, x)
        p = torch.relu(a + 0.0)  # +0.0 and -0.0: one group each, same ops
        b = torch.mm(p, x)
        q = torch.relu(b + -0.0)
        c = torch.mm(q, x)
        r = torch.relu(c.t() + 1.0)  # a transposed read: another layout
        d = torch.mm(r, x)
        s = torch.relu(d + 1.0)
        return p, q, r, s

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    b, got = _compiled(two, x, y)
    for a, e in zip(got, two(x, y)):
        torch.testing.assert_close(a, e)
    assert hits == [], hits
