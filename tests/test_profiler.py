"""fxforge's kernels under torch's profilers: each kernel call is a range named after the kernel,
its graph, its backend and its ops; with no profiler recording, no range is made at all."""

from __future__ import annotations

import json

import pytest
import torch

import fxforge
from fxforge.codegen.c import build

needs_cc = pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 16))


class _CountingRange(torch.profiler.record_function):
    made = 0

    def __init__(self, *a, **k):
        type(self).made += 1
        super().__init__(*a, **k)


@needs_cc
def test_a_profiled_training_step_shows_each_kernel_in_the_chrome_trace(tmp_path):
    model = _model()
    ref = _model()
    b = fxforge.backend(fxforge.Config())
    c = torch.compile(model, backend=b)
    x = torch.randn(8, 32)
    c(x).sum().backward()  # compiled, not profiled
    for p in model.parameters():
        p.grad = None
    with torch.profiler.profile() as prof:
        out = c(x)
        out.sum().backward()
    torch.testing.assert_close(out, ref(x))
    ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if str(e.get("name", "")).startswith("fxforge ")]
    names = {e["name"] for e in events}
    assert all(e.get("ph") == "X" and e.get("dur", -1) >= 0 for e in events)  # slices with a duration
    graphs = {c_.stats["graph"] for c_ in b.compiled}
    assert graphs == {"forward", "backward"}
    # every kernel of both graphs, once each, named with its graph, backend and ops
    for compiled in b.compiled:
        for k in compiled.kernels:
            mine = [n for n in names if f" {k.name} [{k.backend}] " in n and f" {compiled.stats['graph']}-" in n]
            assert len(mine) == 1, (k.name, k.backend, sorted(names))
    assert len(events) == sum(len(c_.kernels) for c_ in b.compiled)
    assert any("[c] " in n and "gelu" in n for n in names)  # a fused C kernel names its ops
    # and the profiler's table has them too
    assert names <= {e.key for e in prof.key_averages()}


@needs_cc
def test_no_range_is_made_when_no_profiler_records(monkeypatch):
    """The kernels' ranges cost nothing unprofiled: ``call`` has none, the profiled variant is not
    even compiled, and not one range object is made over several calls."""
    monkeypatch.setattr(torch.profiler, "record_function", _CountingRange)
    _CountingRange.made = 0
    b = fxforge.backend(fxforge.Config())
    model = _model()
    c = torch.compile(model, backend=b)
    x = torch.randn(8, 32)
    with torch.no_grad():
        for _ in range(3):
            c(x)
    (compiled,) = b.compiled
    assert "_kernel_range" not in compiled.source and "record_function" not in compiled.source
    assert _CountingRange.made == 0
    loads = []
    real = compiled._load_profiled
    compiled._load_profiled = lambda: loads.append(1) or real()
    with torch.no_grad():
        c(x)
    assert not loads and _CountingRange.made == 0
    # under the autograd profiler too: one range per kernel call, and the same values
    with torch.autograd.profiler.profile() as prof, torch.no_grad():
        got = c(x)
    torch.testing.assert_close(got, model(x))
    assert loads and _CountingRange.made == len(compiled.kernels)
    keys = {e.key for e in prof.key_averages()}
    graph = compiled.stats["graph"]
    assert sum(k.startswith(f"fxforge {graph}-") for k in keys) == len({k.name for k in compiled.kernels})
