"""``stats["copy_bytes"]`` counts what data movement really writes: equal to a dispatch-mode
counter (``fxforge.testing.CopyCounter``) around the compiled call, on the torch backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxforge
from fxforge.testing import CopyCounter


def _cases():
    a, b, w = torch.randn(64, 48), torch.randn(64, 48), torch.randn(96, 32)
    return {
        "cat_input_feeds_mm": (lambda a, b, w: (torch.cat([a, b], 1) @ w, a @ w[:48]), (a, b, w)),
        "pad_of_cat": (lambda a, b: F.pad(torch.cat([a, b], 1), (1, 2, 3, 0)), (a, b)),
        "cat_of_pads": (lambda a, b: torch.cat([F.pad(a, (1, 1)), F.pad(b, (0, 2, 1, 0))], 0), (a, b)),
        "left_pad_mm": (lambda a, w: F.pad(a, (4, 0)) @ w[:52], (a, w)),
        "clone_contiguous": (lambda a: (a.t().contiguous() * 2, a.clone() + 1), (a,)),
        "no_copies": (lambda a, b: torch.relu(a) * b, (a, b)),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_copy_bytes_equals_what_a_dispatch_counter_measures(name):
    f, args = _cases()[name]
    b = fxforge.backend(fxforge.Config(codegen="torch", debug=True))
    g = torch.compile(f, backend=b, fullgraph=True)
    want = f(*args)
    got = g(*args)
    for x, y in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        torch.testing.assert_close(x, y)
    (c,) = b.compiled
    with torch.no_grad(), CopyCounter() as counter:
        c(*args)
    assert c.stats["copy_bytes"] == counter.bytes, counter.calls
    assert (counter.bytes == 0) == (name == "no_copies")


def test_copy_bytes_in_training_graphs():
    """Backward graphs move bytes too (the gradient of a cat is slices, of a pad a crop)."""
    def f(a, b):
        return (F.pad(torch.cat([a, b], 1), (2, 2)) ** 2).sum()

    a, b = torch.randn(8, 6, requires_grad=True), torch.randn(8, 5, requires_grad=True)
    bk = fxforge.backend(fxforge.Config(codegen="torch", debug=True))
    torch.compile(f, backend=bk)(a, b).backward()
    for c in bk.compiled:
        inputs = [torch.randn([int(s) for s in n.meta["val"].shape]) for n in c.graph.graph.nodes if n.op == "placeholder"]
        with torch.no_grad(), CopyCounter() as counter:
            c(*inputs)
        assert c.stats["copy_bytes"] == counter.bytes, (c.stats["graph"], counter.calls)
    assert any(c.stats["copy_bytes"] > 0 for c in bk.compiled)
