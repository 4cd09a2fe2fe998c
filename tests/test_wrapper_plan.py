"""The wrapper by stage: a plan of steps (``codegen/wrapper/plan.py``, ``steps.py``) computed
from the schedule and the memory plan, printed by ``source.py``: ``call`` and its profiled
variant come from the same plan."""

from __future__ import annotations

import re

import torch

import fxforge
from fxforge.codegen.wrapper import source
from fxforge.codegen.wrapper.steps import Assign, Choose, Guard, KeptArenas, Launch, Note, Release, Return, Run, WrapperPlan


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.n, self.b = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.n(self.a(x)))
        return self.b(y).softmax(-1), torch.cat([y, y * 2], 0)


def _body(src: str, name: str) -> list[str]:
    lines = src.split("\n")
    start = lines.index(f"def {name}(args):")
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    return [l for l in lines[start + 1:end] if l]


def test_call_profiled_is_call_with_each_kernel_in_its_range():
    torch.manual_seed(0)
    be = fxforge.backend(fxforge.Config(keep_arenas="always"))
    x = torch.randn(4, 16, requires_grad=True)
    out = torch.compile(_Block(), backend=be)(x)
    (out[0].sum() + out[1].sum()).backward()
    for c in be.compiled:
        w = c.artifact
        call, profiled = _body(w.source, "call"), _body(w.profiled_source, "call_profiled")
        ranges = [l for l in profiled if l.strip().startswith(f"with {source.KERNEL_RANGE}(")]
        assert len(ranges) == len(w.kernels) > 0
        unwrapped, skip = [], False
        for l in profiled:  # each range's line, and the kernel call under it one level in
            if l in ranges:
                skip = True
                continue
            unwrapped.append(l.replace("    ", "", 1) if skip else l)
            skip = False
        assert unwrapped == call
        assert any(re.match(r"\s+_views = _kept.take\(\)", l) for l in call)  # the kept arenas, taken and lent back


def test_steps_print_as_the_statements_they_name():
    steps = [Assign("s0", "arg0_1.size(0)"), Note("add: eager fallback (why)"), Run("arena0.fill_(255)", "poison"),
             Launch("kernel1", ("a", "b"), ("c",), "fxforge graph kernel1 [c] add"), Guard("c", "(4, 1)"),
             Choose("d", "a.size(0)", ((8, "f(a)"), (None, "g(a)"))), Release(("a", "b")), Return("(c, d)")]
    assert source.lines(steps) == [
        "s0 = arg0_1.size(0)", "# add: eager fallback (why)", "arena0.fill_(255)  # poison", "c, = kernel1(a, b)",
        "if c.stride() != (4, 1):", "    c = as_traced(c, (4, 1))",
        "if a.size(0) <= 8:", "    d = f(a)  # 1..8", "else:", "    d = g(a)  # 9..", "del a, b", "return (c, d)"]
    assert source.lines(steps[3:4], profiled=True) == [
        f"with {source.KERNEL_RANGE}('fxforge graph kernel1 [c] add'):", "    c, = kernel1(a, b)"]


def test_a_plan_with_kept_arenas_prints_their_setup_once():
    kept = KeptArenas(64, "empty(64)", [Assign("b0", "_block[0:8]")], ["b0"])
    wp = WrapperPlan(["x"], [Assign("y", "x + 1"), Return("(y,)")], kept, [], {}, 1, [], True, False, [], {}, {})
    src, profiled = source.module(wp)
    assert "def _arenas():" in src and src.count("b0 = _block[0:8]") == 1 and "_block.fill_(255)" in src
    assert "_kept.take()" in profiled and "def call_profiled(args):" in profiled
