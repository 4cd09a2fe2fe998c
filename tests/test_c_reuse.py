"""A wrapper's C kernels are emitted once per group structure (``codegen/c/reuse.py``): a group
with an earlier one's key gets its kernel, renamed; groups differing in a constant, a layout or
which buffers are one get kernels of their own.  Debug mode (these tests) checks every reused
kernel against the emitter's own."""

from __future__ import annotations

import re

import torch

import fxforge
from fxforge.codegen.c import backend as c_backend


def _kernels(src: str) -> tuple[list[str], list[str]]:
    """The C kernels a wrapper source launches, and the C function each one runs (in order)."""
    return re.findall(r"^# C kernel (\w+)_c", src, re.M), re.findall(r"^# int (fxk_\w+)\(", src, re.M)


def _compiled(fn, *args):
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    return b, torch.compile(fn, backend=b, fullgraph=True)(*args)


def test_repeated_blocks_reuse_one_kernel_with_their_own_arguments():
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
    kernels, functions = _kernels(src)
    assert len(kernels) == len(functions) >= 4, src
    # the 2nd to 4th blocks' kernels run the first's function ...
    assert len(set(functions)) <= len(functions) - 3, src
    # ... each launched with its own block's bias, under its own name
    for name in kernels:
        assert f"{name} = {name}_c" in src


def test_a_different_constant_or_layout_is_not_reused():
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
    kernels, functions = _kernels("".join(c.source for c in b.compiled))
    assert len(kernels) == len(functions) == 4 and len(set(functions)) == 4, functions


def _mixed(x, w):
    """Groups with a row reduction of two outputs, a transposed read, and a cat of two computed
    values (written in place into it: regions laid out in the cat's strides)."""
    h = torch.tanh(x @ w)
    var, mean = torch.var_mean(h, dim=1, keepdim=True)
    n = (h - mean) * torch.rsqrt(var + 1e-5)
    t = torch.relu(n.t() * 2.0)
    c = torch.cat([torch.sigmoid(n), n * 3.0], dim=1)
    return c @ w.repeat(2, 1), t


def _emitted(monkeypatch) -> list[str]:
    """The kernels the C backend's emitter is made for, by name (not fusion's probes)."""
    runs = []

    class Counted(c_backend.CEmitter):
        def __init__(self, name, *a, **k):
            if name != "probe":
                runs.append(name)
            super().__init__(name, *a, **k)

    monkeypatch.setattr(c_backend, "CEmitter", Counted)
    return runs


def _compiled_mixed(seed: int, debug: bool):
    """``_mixed`` compiled (its values checked against eager's on fresh inputs)."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g) / 4
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=debug))
    got = torch.compile(_mixed, backend=b, fullgraph=True)(x, w)
    for a, e in zip(got, _mixed(x, w)):
        torch.testing.assert_close(a, e)
    (c,) = b.compiled
    return c


def test_kernels_emitted_ahead_of_the_plan_are_the_ones_it_launches(monkeypatch):
    runs = _emitted(monkeypatch)
    c = _compiled_mixed(2, debug=False)
    kernels, functions = _kernels(c.source)
    assert len(set(functions)) >= 2 and re.search(r"^ +sigmoid = cat\[:, 0:16\]", c.source, re.M), c.source
    # each function emitted once, before the plan, and each one built is launched
    assert len(runs) == len(set(functions)) and all(name.startswith("ahead") for name in runs), (runs, functions)
    assert c.artifact.units["c"].unused == 0


def test_a_plan_unlike_what_the_kernels_ahead_assumed_gets_its_own_kernels(monkeypatch):
    expected = c_backend.expected_layout

    def transposed(node, index):  # every value assumed transposed: no group's key is what the plan gives
        shape, stride = expected(node, index)
        return shape, tuple(reversed(stride))

    monkeypatch.setattr(c_backend, "expected_layout", transposed)
    c = _compiled_mixed(3, debug=True)
    kernels, functions = _kernels(c.source)
    assert c.artifact.units["c"].unused >= 1
    assert len(kernels) == len(functions) >= 2
