"""Tiered C builds (``Config.tiered_builds``, ``codegen/c/build.py``): a unit not in the kernel
cache is built at -Og first, the compile returns with those kernels, and each is swapped for its
full build once that is done in the background."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

import fxforge
from fxforge.codegen.c import backend as c_backend
from fxforge.codegen.c import build


def _step(x, w, b):
    h = torch.tanh(x @ w + b)
    return (h * h.sum(-1, keepdim=True)).softmax(-1), torch.nn.functional.gelu(h).mean(0)


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 64, generator=g), torch.randn(64, 48, generator=g) / 8, torch.randn(48, generator=g)


def _compile(fn, args, **config):
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", **config))
    out = torch.compile(fn, backend=b, fullgraph=True)(*args)
    return b, out


@pytest.fixture
def held(monkeypatch, tmp_path):
    """A fresh kernel cache, and the full builds held until the test sets the event."""
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    gate = threading.Event()
    real = build.shared_object

    def held_back(*args, **kwargs):
        if threading.current_thread().name.startswith(build.UPGRADE_THREADS):
            gate.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "shared_object", held_back)
    yield gate
    gate.set()


def _kernels(b) -> dict:
    ns = b.compiled[0].generated.__globals__
    return {k: v for k, v in ns.items() if k.endswith("_c") and k.startswith("kernel")}


def test_the_first_calls_run_the_quick_build_and_the_full_build_replaces_it(held):
    args = _inputs(0)
    b, first = _compile(_step, args, tiered_builds=True)
    c = b.compiled[0]
    assert c.stats["tiered_kernels"] > 0
    assert not c.wait_for_kernels(timeout=0)  # the full builds are held
    quick = _kernels(b)
    assert quick
    for got, want in zip(first, _step(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    held.set()
    assert b.wait_for_kernels(timeout=120)
    full = _kernels(b)
    assert full.keys() == quick.keys() and all(full[k] is not quick[k] for k in full)
    later = _inputs(1)
    tiered_out = torch.compile(_step, backend=b, fullgraph=True)(*later)
    assert len(b.compiled) == 1  # (the same graph called again)
    for got, want in zip(tiered_out, _step(*later)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    # the kernels now bound are the ones a compile without tiering builds: the same bits
    b2, _ = _compile(_step, args, tiered_builds=False)
    assert b2.compiled[0].stats["tiered_kernels"] == 0 and b2.compiled[0].upgrades == []
    direct = b2.compiled[0](*later)
    for x, y in zip(tiered_out, direct):
        assert torch.equal(x, y)


def test_a_unit_in_the_kernel_cache_is_not_built_again_at_minus_og(held):
    args = _inputs(0)
    held.set()
    b, _ = _compile(_step, args, tiered_builds=True)
    assert b.compiled[0].stats["tiered_kernels"] > 0
    assert b.wait_for_kernels(timeout=120)
    b2, _ = _compile(_step, args, tiered_builds=True)
    assert b2.compiled[0].stats["tiered_kernels"] == 0 and b2.compiled[0].upgrades == []


def test_training_gradients_match_eager_before_and_after_the_upgrade(held):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8))
    b = fxforge.backend(fxforge.Config(codegen="c", tiered_builds=True))
    compiled = torch.compile(model, backend=b)

    def check(seed: int) -> None:
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(seed))
        model.zero_grad()
        compiled(x).square().mean().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().mean().backward()
        for g, w in zip(got, [p.grad for p in model.parameters()]):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)

    check(0)
    assert sum(c.stats["tiered_kernels"] for c in b.compiled) > 0
    assert not b.wait_for_kernels(timeout=0)
    held.set()
    assert b.wait_for_kernels(timeout=120)
    check(1)


def test_a_failed_full_build_keeps_the_quick_kernels(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    real = build.shared_object

    def refuse_full(source, *a, first=False, **k):
        if not first and threading.current_thread().name.startswith(build.UPGRADE_THREADS):
            raise build.CompileError("refused by the test")
        return real(source, *a, first=first, **k)

    monkeypatch.setattr(build, "shared_object", refuse_full)
    args = _inputs(0)
    with caplog.at_level(logging.WARNING):
        b, _ = _compile(_step, args, tiered_builds=True)
        assert b.wait_for_kernels(timeout=120)
    assert "the -Og build is kept" in caplog.text
    later = _inputs(2)
    for got, want in zip(b.compiled[0](*later), _step(*later)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_first_build_is_at_minus_og_and_a_multi_rank_process_is_never_tiered(monkeypatch):
    first = build.flags(first=True)
    assert "-Og" in first and "-O2" not in first and "-O1" not in first
    assert set(first) - {"-Og"} == set(build.flags()) - {"-O2"}
    config = fxforge.Config(tiered_builds=True)
    assert c_backend.tiered(config) and not c_backend.tiered(fxforge.Config(tiered_builds=False))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: 2)
    assert not c_backend.tiered(config)


def test_tiered_builds_is_checked_and_read_from_the_environment(monkeypatch):
    with pytest.raises(ValueError, match="tiered_builds"):
        fxforge.Config(tiered_builds="yes")
    monkeypatch.setenv("FXFORGE_TIERED_BUILDS", "0")
    assert fxforge.Config().tiered_builds is False
    monkeypatch.setenv("FXFORGE_TIERED_BUILDS", "1")
    assert fxforge.Config().tiered_builds is True


_EXITS_AT_ONCE = r"""
import sys, torch, fxforge
sys.path.insert(0, HERE)
from test_tiered_builds import _inputs, _step
b = fxforge.backend(fxforge.Config(codegen="c", tiered_builds=True))
torch.compile(_step, backend=b, fullgraph=True)(*_inputs(0))
assert b.compiled[0].stats["tiered_kernels"] > 0
"""


def test_a_process_exiting_at_once_leaves_its_kernels_built_in_full(monkeypatch, tmp_path):
    """The process waits for its full builds as it exits: the next one finds them cached."""
    import os
    import subprocess
    import sys

    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))
    env = dict(os.environ, FXFORGE_TIERED_BUILDS="1")
    source = _EXITS_AT_ONCE.replace("HERE", repr(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", source], env=env, check=True, timeout=300)
    b, _ = _compile(_step, _inputs(0), tiered_builds=True)
    assert b.compiled[0].stats["tiered_kernels"] == 0 and b.compiled[0].upgrades == []
