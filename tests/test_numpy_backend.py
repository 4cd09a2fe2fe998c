"""A third kernel language on the kernel IR (``numpy_backend.py``, NumPy source printed from
fxforge's group walk and op semantics): pointwise chains and reductions fuse into NumPy kernels
that match eager, and what the fusion pass counted is what the kernel takes."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

import fxforge
from fxforge.codegen.registry import DEFAULT_REGISTRY
from fxforge.spine import compile_graph
from fxforge.testing import check_pass, graphs, profile

sys.path.insert(0, os.path.dirname(__file__))
import numpy_backend  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def registered():
    fxforge.register_backend(numpy_backend.BACKEND, replace=True)
    yield
    DEFAULT_REGISTRY.unregister("numpy")


def run(fn, *args, dynamic=False):
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="numpy", debug=True))
    out = torch.compile(fn, backend=b, fullgraph=True, dynamic=dynamic)(*args)
    want = fn(*args)
    for got, exp in zip(out if isinstance(out, tuple) else (out,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(got, exp, equal_nan=True)
    return [k for c in b.compiled for k in c.kernels if k.backend == "numpy"]


x, y, b = torch.randn(6, 16), torch.randn(6, 16), torch.randn(16)

POINTWISE = {
    "chain": (lambda x, y: (x * 2 + y).relu() - torch.sigmoid(y) / 3, (x, y)),
    "broadcast": (lambda x, b: torch.tanh(x + b) * 3, (x, b)),
    "where_clamp": (lambda x, y: torch.where(x > 0, x, y * 0.5).clamp(-1, 1), (x, y)),
    "transposed": (lambda x, y: x.t() * y.t() + 1, (x, y)),
    "ints": (lambda i: (i * 3 + 1) % 5 - torch.div(i, 4, rounding_mode="floor"), (torch.randint(-50, 50, (7, 9)),)),
    "conversions": (lambda x: (x.to(torch.float64) * 0.1).to(torch.float32) + (x > 0).to(torch.float32), (x,)),
    "nan_and_inf": (lambda x: torch.maximum(x, torch.full_like(x, float("nan"))) + x / 0, (x,)),
}
REDUCTIONS = {
    "sum_last": (lambda x: x.sum(-1) * 2, (x,)),
    "mean_first": (lambda x: x.mean(0) + 1, (x,)),
    "amax_centered": (lambda x: x - x.amax(1, keepdim=True), (x,)),
    "var": (lambda x: torch.var(x, -1) + x.sum(-1), (x,)),
    "softmax": (lambda x: torch.softmax(x * 2, -1), (x,)),
    "layer_norm": (lambda x, b: F.layer_norm(x + b, (16,), b, b), (x, b)),
    "middle_dims": (lambda t: (t * t).sum(dim=(0, 2)), (torch.randn(3, 4, 5),)),
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_kernels_match_eager(name):
    fn, args = POINTWISE[name]
    kernels = run(fn, *args)
    assert kernels and max(k.node_count for k in kernels) > 1  # fused


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_kernels_match_eager(name):
    fn, args = REDUCTIONS[name]
    assert run(fn, *args)


def test_dynamic_shapes_read_sizes_at_launch():
    fn = lambda x: torch.softmax(x, -1) + x.sum(-1, keepdim=True)  # noqa: E731
    run(fn, torch.randn(3, 8), dynamic=True)
    run(fn, torch.randn(5, 11), dynamic=True)


def test_ops_the_language_lacks_run_elsewhere():
    """NumPy has no erf: the exact GELU is refused by the printer, with its reason, and runs as
    the extern backend's call."""
    b = fxforge.backend(fxforge.Config(codegen="numpy", debug=True))
    fn = lambda x: F.gelu(x) + 1  # noqa: E731
    torch.testing.assert_close(torch.compile(fn, backend=b)(x), fn(x))
    assert {k.backend for k in b.compiled[0].kernels} == {"numpy", "torch"}


@settings(profile(), max_examples=20, deadline=None)
@given(graphs(ops=("unary", "binary", "reduction", "view", "var_mean", "native_layer_norm", "convert"),
              exclude=("remainder", "sign"), dtypes=(torch.float32, torch.int64), max_ops=6, max_dim=4))
def test_random_graphs_fuse_into_numpy_kernels_that_match_eager(example):
    """Every group fusion accepted is emitted, and in debug mode the pass verifies each group's
    argument count against the kernel's; results match eager."""
    gm, inputs = example
    cfg = fxforge.Config(codegen="numpy", debug=True)
    check_pass(lambda g: None, gm, inputs, runner=lambda g, xs: compile_graph(g, cfg)(*xs))
