"""Timing choices that hold under load (``fxforge.infra.timing``): least time over interleaved rounds,
contention told from CPU time against wall time, and contended choices re-timed once the machine
is quiet (custom-op tuning, the Triton autotuner)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import fxforge
from fxforge.infra import timing
from fxforge.custom_ops import _TUNINGS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import custom_op_cases as cases  # noqa: E402


def _spin(seconds: float):
    def call():
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
    return call


def test_the_least_time_is_kept_and_calls_are_interleaved():
    order = []
    delays = {"a": [0.004, 0.0, 0.0], "b": [0.0, 0.004, 0.0]}  # each one slow in one round only

    def call(n):
        def f():
            order.append(n)
            spent = delays[n].pop(0) if delays[n] and len(order) > 2 else 0.0
            time.sleep(spent)
        return f

    t = timing.time_candidates({"a": call("a"), "b": call("b")}, timing.Budget(rounds=3, min_rounds=3, seconds=1.0),
                               attempts=1)
    assert order[2:] == ["a", "b", "b", "a", "a", "b"]  # warm-up, then the start rotated each round
    assert t.seconds["a"] < 0.003 and t.seconds["b"] < 0.003


def test_calls_whose_thread_did_not_run_are_contended_and_retried():
    """A call that waits (its thread off the CPU, as a descheduled one) counts against the timing."""
    t = timing.time_candidates({"sleeps": lambda: time.sleep(0.002)}, timing.Budget(rounds=5, min_rounds=5))
    assert t.descheduled == t.calls == 5 and t.attempts == timing.ATTEMPTS and t.contended
    assert "descheduled" in t.describe()


def test_other_processes_crowd_only_the_threads_the_calls_need(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert not timing._crowded(2.0, threads=1) and timing._crowded(3.5, threads=1)
    assert timing._crowded(0.5, threads=4) and not timing._crowded(0.2, threads=4)
    assert not timing._crowded(None, threads=4)
    base = dict(seconds={"a": 1e-6}, calls=100, descheduled=0, attempts=1)
    assert timing.Timing(**base, other_load=0.5, threads=4).contended
    assert not timing.Timing(**base, other_load=0.5, threads=2).contended
    assert timing.Timing(**{**base, "descheduled": 21}, other_load=None).contended


def test_the_load_is_read_from_this_processes_cpus():
    busy = timing._busy_cpu_seconds()
    if busy is None:
        pytest.skip("no /proc/stat here: the load of other processes is unknown, only the calls' own CPU time counts")
    _spin(0.05)()  # 50 ms of this thread's CPU time: five clock ticks on its CPUs at least
    assert timing._busy_cpu_seconds() > busy


# --------------------------------------------------------------------------- custom-op tuning


@pytest.fixture
def tuning(tmp_path, monkeypatch):
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path / "cache"))
    saved = dict(_TUNINGS)
    fxforge.register_custom_op_autotuning(cases.slow_norm, [fxforge.CustomOpConfig(cases.norm_fast_then_slow)])
    yield tmp_path / "cache" / "custom_ops"
    _TUNINGS.clear()
    _TUNINGS.update(saved)


def _tune(x):
    b = fxforge.backend(fxforge.Config(codegen="c"))
    f = torch.compile(lambda x: cases.slow_norm(x + 1) * 2, backend=b)
    torch.testing.assert_close(f(x), cases.norm_fast_then_slow(x + 1) * 2)
    (rec,) = [r for c in b.compiled for r in c.stats["custom_ops"]]
    return rec


def test_a_contended_choice_is_stored_marked_and_timed_again_once_quiet(tuning, monkeypatch):
    from fxforge.custom_ops import tune as custom_ops  # where tune_site times and reads the cache

    busy = timing.Timing({}, 10, 10, None, timing.ATTEMPTS)
    real = custom_ops.time_candidates
    monkeypatch.setattr(custom_ops, "time_candidates",
                        lambda calls, *a, **k: timing.Timing(real(calls, *a, **k).seconds, 10, 10, None, 3))
    assert busy.contended
    x = torch.randn(8, 32)
    rec = _tune(x)
    assert rec["winner"] == "norm_fast_then_slow" and "descheduled" in rec["contended"] and not rec["cached"]
    (path,) = tuning.glob("*.json")
    assert "contended" in json.loads(path.read_text())

    # still busy: the stored choice is used, not timed again
    monkeypatch.setattr(custom_ops, "quiet", lambda threads: False)
    monkeypatch.setattr(custom_ops, "time_candidates", lambda *a, **k: pytest.fail("timed again while busy"))
    torch._dynamo.reset()
    assert _tune(x)["cached"]

    # quiet now: timed again, and the entry replaced by an unmarked one
    monkeypatch.setattr(custom_ops, "quiet", lambda threads: True)
    monkeypatch.setattr(custom_ops, "time_candidates", real)
    torch._dynamo.reset()
    rec = _tune(x)
    if rec.get("contended"):
        pytest.skip(f"this machine was busy during the re-timing ({rec['contended']})")
    assert not rec["cached"] and "contended" not in json.loads(path.read_text())
    torch._dynamo.reset()
    assert _tune(x)["cached"]


def test_a_busy_core_leaves_the_choice_as_a_quiet_machine_makes_it(tuning):
    """One core spinning in another process while a decomposition that wins by far more than 5x
    is tuned, three times with a fresh cache: the decomposition every time
    (bench/tuning_load.py measures it at 10 trials)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.1)
        winners = []
        for i in range(3):
            for f in tuning.glob("*.json"):
                f.unlink()
            torch._dynamo.reset()
            rec = _tune(torch.randn(8, 256))
            assert rec["candidates"]["fallback"] > 5 * rec["candidates"]["norm_fast_then_slow"], rec
            winners.append(rec["winner"])
    finally:
        spinner.kill()
        spinner.wait()
    assert winners == ["norm_fast_then_slow"] * 3
