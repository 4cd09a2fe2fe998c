"""The progress line of a long compile (fxforge/infra/progress.py): shown on a terminal after a while,
naming the graph, its node count and the stage; never on a pipe, never when turned off."""

from __future__ import annotations

import io
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxforge
from fxforge.infra import progress
from fxforge.spine import compile_graph


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _graph():
    x = torch.randn(16, 8)
    return make_fx(lambda a: (a * 2).relu().sum(1), tracing_mode="fake")(x), x


def _slow_pass(gm):  # (a user pass that takes a while)
    time.sleep(0.3)
    return False


def test_a_long_compile_shows_one_line_rewritten_per_stage(monkeypatch):
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.1)
    gm, x = _graph()
    c = compile_graph(gm, fxforge.Config(codegen="torch", progress=True, passes={"after_fusion": [_slow_pass]}),
                      kind="forward")
    torch.testing.assert_close(c(x), (x * 2).relu().sum(1))
    out = term.getvalue()
    nodes = c.stats["nodes_in"]
    assert f"compiling the forward graph ({nodes} nodes): pass _slow_pass" in out, out
    assert "kernels and wrapper" in out or "schedule" in out, out  # rewritten as the stages moved on
    assert out.endswith("s\n") and f"compiled the forward graph ({nodes} nodes) in " in out, out
    assert out.count("\n") == 1  # one line, rewritten in place


def test_no_line_on_a_pipe_when_turned_off_or_for_a_short_compile(monkeypatch):
    gm, _ = _graph()
    slow = {"after_fusion": [_slow_pass]}
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.1)
    for stream, cfg in ((io.StringIO(), fxforge.Config(codegen="torch", passes=slow)),  # not a terminal
                        (_Terminal(), fxforge.Config(codegen="torch", passes=slow, progress=False))):
        monkeypatch.setattr("sys.stderr", stream)
        compile_graph(gm, cfg)
        assert stream.getvalue() == ""
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 5.0)
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    compile_graph(gm, fxforge.Config(codegen="torch", progress=True))
    assert term.getvalue() == ""  # shorter than the delay: nothing at all
    monkeypatch.setenv("FXFORGE_PROGRESS", "0")
    assert fxforge.Config().progress is False
    monkeypatch.setenv("FXFORGE_PROGRESS", "1")
    assert fxforge.Config().progress is True
