"""The wrapper plan (``steps.py``) printed as the module's Python source: the kernels' sources,
the kept arenas' ``_arenas()``, ``call(args)``, and ``call_profiled(args)``, the same steps with
each kernel's call inside its profiler range (``KERNEL_RANGE``)."""

from __future__ import annotations

import linecache
import logging
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from ..api import Kernel
from .steps import Assign, Choose, Guard, Launch, Note, Release, Return, Run, Step, WrapperPlan

log = logging.getLogger(__name__)

# The profiler range each kernel call of ``call_profiled`` runs in (a global of the module).
KERNEL_RANGE = "_kernel_range"


@dataclass
class Wrapper:
    source: str
    globals: dict[str, Any]
    kernels: list[Kernel]
    # Groups whose kernel failed to compile and ran as fallbacks instead: (group id, reason).
    demoted: list[tuple[int, str]] = field(default_factory=list)
    # ``call_profiled(args)``: ``call`` with each kernel call inside a profiler range named after
    # the kernel (``KERNEL_RANGE``), compiled the first time a call runs under a profiler.
    profiled_source: str = ""
    # The ops the source calls through namespaces bound at load (``runtime.bind_ops``): (namespace,
    # name, overload) -> op.  Their namespaces are among ``globals``.
    ops: dict = field(default_factory=dict)
    # What each backend's ``link`` was given (``KernelContext.units``), by backend name: the C
    # kernels' translation units (a package builds them again for other CPUs).
    units: dict = field(default_factory=dict)

    @property
    def upgrades(self) -> list:
        """Kernels bound again once built in full: each linked unit's ``upgraded``, a future of
        ``<kernel>_c`` bindings (``build.CUnit.tiered``), where it has one."""
        return [u.upgraded for u in self._upgrading()]

    @property
    def tiered_kernels(self) -> int:
        """The kernels that wait for theirs (``upgrades``)."""
        return sum(u.first_built for u in self._upgrading())

    def _upgrading(self) -> list:
        return [u for u in self.units.values() if getattr(u, "upgraded", None) is not None]

    def compile(self, filename: str) -> CodeType:
        """The source compiled by Python (what ``load`` runs): it needs no kernel built, so a
        compile does it while its kernels' builds run."""
        return _compiled(self.source, filename)

    def load(self, filename: str, code: CodeType | None = None):
        """Run the source (``code``: it compiled already, by ``compile(filename)``); returns
        ``call(args)``, which runs the graph, and a function returning ``call_profiled``
        (compiled on its first use, into the same namespace).  Each upgrade's kernels replace the
        first ones in that namespace when it is done (a call running then finishes with either)."""
        ns = dict(self.globals)
        exec(code if code is not None else self.compile(filename), ns)
        for upgrade in self.upgrades:
            upgrade.add_done_callback(lambda done: _rebind(ns, done, filename))
        profiled: list = []

        def load_profiled():
            if not profiled:
                exec(_compiled(self.profiled_source, filename + "-profiled"), ns)
                profiled.append(ns["call_profiled"])
            return profiled[0]

        return ns["call"], load_profiled


def _rebind(ns: dict, done: Any, filename: str) -> None:
    """``ns``'s kernels ``<kernel>_c`` replaced by ``done``'s result, and each launch function
    ``<kernel>`` that is the kernel itself (``abi.launch_source``); a failed build is logged and
    the first kernels kept."""
    try:
        bindings = done.result()
    except Exception as e:  # noqa: BLE001
        log.warning("fxforge: %s: the full build of its C kernels failed (%s: %s); the -Og build is kept",
                    filename, type(e).__name__, e)
        return
    for name, fn in bindings.items():
        old = ns.get(name)
        ns[name] = fn
        launch = name.removesuffix("_c")
        if old is not None and ns.get(launch) is old:
            ns[launch] = fn


def _compiled(source: str, filename: str):
    """``source`` compiled, its lines kept where tracebacks and debuggers look for them."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec")


def _noted(line: str, note: str) -> str:
    return f"{line}  # {note}" if note else line


def _targets(names: tuple[str, ...]) -> str:
    return f"{', '.join(names)}{',' if len(names) == 1 else ''}"


def lines(steps: list[Step], profiled: bool = False) -> list[str]:
    """The steps as statements (``profiled``: each kernel call inside its profiler range)."""
    out: list[str] = []
    for s in steps:
        if isinstance(s, Assign):
            out.append(_noted(f"{s.target} = {s.value}", s.note))
        elif isinstance(s, Run):
            out.append(_noted(s.expr, s.note))
        elif isinstance(s, Note):
            out.append(f"# {s.text}")
        elif isinstance(s, Launch):
            call = f"{s.kernel}({', '.join(s.args)})"
            call = f"{_targets(s.returns)} = {call}" if s.returns else call
            out += [f"with {KERNEL_RANGE}({s.range!r}):", "    " + call] if profiled else [call]
        elif isinstance(s, Guard):
            # the plain comparison first: as_traced (which ignores the strides of size-1 dims) runs
            # only where it differs
            out += [f"if {s.name}.stride() != {s.stride}:", f"    {s.name} = as_traced({s.name}, {s.stride})"]
        elif isinstance(s, Choose):
            lo = 1
            for i, (bound, call) in enumerate(s.cases):
                if bound is None:  # the last range (a Dispatch has two at least)
                    out += ["else:", f"    {s.target} = {call}  # {lo}.."]
                else:
                    out += [f"{'elif' if i else 'if'} {s.size} <= {bound}:", f"    {s.target} = {call}  # {lo}..{bound}"]
                    lo = bound + 1
        elif isinstance(s, Release):
            out.append("del " + ", ".join(s.names))
        elif isinstance(s, Return):
            out.append(f"return {s.value}")
        else:
            raise TypeError(f"not a wrapper step: {s!r}")
    return out


def function(wp: WrapperPlan, name: str, profiled: bool) -> list[str]:
    """``def name(args)``: the inputs unpacked (and the caller's list cleared: each input is
    freed after its last use), the kept arenas taken and lent back, the steps."""
    head = [f"{_targets(tuple(wp.inputs))} = args"] if wp.inputs else []
    head.append("args.clear()")
    body = lines(wp.steps, profiled)
    if wp.kept is not None:
        inner = [f"{', '.join(('_block', *wp.kept.names))}, = _views"] + (
            ["_block.fill_(255)  # poison: NaN for floats"] if wp.poison else [])
        body = ["_views = _kept.take()", "try:"] + ["    " + l for l in inner + body] + ["finally:", "    _kept.give(_views)"]
    return [f"def {name}(args):"] + ["    " + l for l in head + body]


def module(wp: WrapperPlan) -> tuple[str, str]:
    """The module's source and the profiled variant's (``call_profiled``, compiled into the same
    namespace when first used)."""
    src = [f"# fxforge wrapper: {len(wp.kernels)} kernels, {wp.arenas} arenas", "import math, operator", "import torch", ""]
    if wp.op_spaces:
        src += [f"# {', '.join(wp.op_spaces)}: the ops of torch.ops.{{{','.join(wp.op_spaces)}}} this graph calls, each "
                "bound once to its dispatcher entry", ""]
    for k in wp.kernels:
        src += [k.source.rstrip("\n"), "", ""]
    if wp.kept is not None:  # kept across calls: made on the first call (``runtime.KeptArenas``)
        body = [f"_block = {wp.kept.block}"] + lines(wp.kept.setup) + [f"return {', '.join(('_block', *wp.kept.names))},"]
        src += ["def _arenas():  # kept across calls: made on the first call, reused by the next ones"] + \
               ["    " + l for l in body] + ["", "", "_kept = KeptArenas(_arenas)", "", ""]
    if wp.recycled:
        src += ["_recycled = Recycled()  # fresh buffers handed out again once the caller drops them", "", ""]
    return "\n".join(src + function(wp, "call", False)) + "\n", "\n".join(function(wp, "call_profiled", True)) + "\n"
