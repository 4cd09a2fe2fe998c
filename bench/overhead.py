"""Per-call overhead on small models: fxforge vs eager, aot_eager and Inductor, and
where fxforge's time per call goes.

    python bench/overhead.py                            # every case, Markdown to stdout
    python bench/overhead.py --cases mixer chain        # a subset: demo mixer chain gpt2-2l
    python bench/overhead.py --out bench/results/overhead.md --json bench/results/overhead.json

Cases (every contender gets its own ``copy.deepcopy`` of the same seeded model, same inputs):

* ``demo``: ``fxforge.demo.GPT(GPTConfig())`` (vocab 512, seq 64, d 128, 2 blocks), batch 4, as
  ``fxforge demo`` runs it;
* ``mixer``: a 4-block MLP-mixer, d 64, 16 tokens, batch 8 (token MLP 16->32->16, channel MLP
  64->256->64, GELU, pre-LayerNorm, mean over tokens, 10-class head);
* ``chain``: 200 tiny pointwise ops in a row (sin, mul, add, tanh, sigmoid, relu... on 8x32 float32),
  inference only;
* ``gpt2-2l``: transformers ``GPT2LMHeadModel`` from ``bench/corpus.py`` (2 layers, hidden 256,
  batch 2, seq 128, random weights, offline).

Modes: ``inference`` (``no_grad``, eval) and ``train`` (grads set to None, forward, loss,
``backward()``; no optimizer).  Every contender runs with one torch thread (``--threads``).

What is measured (bench/README.md, "Per-call overhead", says it in short):

1. **time per call**: ``measure.interleaved_medians`` over eager, ``aot_eager``, fxforge and
   Inductor, all compiled with ``torch.compile`` and alive together, called round-robin; minor page
   faults per call of each (``getrusage``);
2. **fxforge breakdown**, per case, summed over the case's graphs (inference, or forward+backward):
   * *outside ``call``*: per call, wall time minus the time inside the generated ``call``
     functions (a timer put in place of ``Compiled._fn``): dynamo's guards, AOTAutograd's runtime
     wrappers, ``Compiled.call_boxed``, the autograd engine; next to it ``aot_eager - eager``,
     the issue's proxy for the same (it also holds the difference between eager's modules and
     the traced ATen graph run by ``aot_eager``);
   * *in-situ penalty*: time inside ``call`` during real steps minus ``call`` alone on captured
     inputs (caches the rest of the step evicted, inputs freed by the call);
   * *``call`` standalone* on inputs captured from a real call, split into the ATen calls it
     makes (recorded with a ``TorchDispatchMode``) and the rest:
     - *Python glue*: ``call`` minus a faithful replay of its recorded ATen calls (``Program``:
       straight-line code, results passed on and ``del``-ed as in ``call``, each op bound
       directly: ``torch.empty``, Tensor methods, ``OpOverload._op``), measured back to back,
       minus the replay's own bookkeeping: the ``OpOverload.__call__`` frames, ``torch.ops.``
       attribute paths, one Python function per kernel, name binding, ``del``;
     - *arena allocation* (``torch.empty`` of the arenas), *output allocation*
       (``empty_strided``), *arena views* (``view(dtype)`` of an arena, ``as_strided`` of a
       planned buffer), *graph views* (the graph's own view nodes): each category replayed
       alone in a flat loop on the recorded arguments, minus the loop's cost;
     - *kernels*: the faithful replay minus those categories: out= calls, copies, ops without
       an out form (which allocate), with the first touch of fresh memory (page faults);
   * *eager's kernels*: eager's own ATen calls of one step, recorded and replayed the same way
     (its kernels allocate their outputs); *floor* = outside + in-situ penalty + eager's kernels;
3. **per kernel**: each kernel call alone (medians, interleaved; inputs an in-place call writes
   over restored untimed): bound as ``_op``, through torch's generated binding
   (``torch.add(..., out=)``), and, for out= calls into an arena view, the functional overload
   on the same inputs; plus a GELU micro-benchmark (arena offsets, in place, fresh arena);
4. **unit costs** and the **estimated saving** of each candidate change of issue 18, from the
   replays, per-kernel figures and counts above (``summarize``).
"""

from __future__ import annotations

import argparse
import collections
import copy
import datetime
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import corpus  # noqa: E402
import measure  # noqa: E402

aten = torch.ops.aten


def clock() -> float:
    """The clock of every breakdown figure: this thread's CPU time (user + system, so page faults
    count), which leaves out the time other processes on a shared machine take the core away;
    ``--clock wall`` switches to ``time.perf_counter``.  Budgets are always wall time."""
    return _CLOCK[0]()


_CLOCK = [time.thread_time]


CASES = ("demo", "mixer", "chain", "gpt2-2l")
# Largest difference from eager's gradients (absolute) a training case may show before the run warns.
GRAD_TOLERANCE = 1e-3
# fxforge: the default Config (on CPU the C backend where a compiler is found); fxforge_torch:
# Config(codegen="torch"), ATen calls only (the default before the C backend).
CONTENDERS = ("eager", "aot_eager", "fxforge_torch", "fxforge", "inductor")


# --------------------------------------------------------------------------------------------
# models


Mixer = corpus.Mixer  # the 4-block mixer (d 64, 16 tokens) at its defaults: tokens in, no patch embedding


class Chain(nn.Module):
    """``n`` tiny pointwise ops in a row, values kept bounded."""

    def __init__(self, n: int = 200):
        super().__init__()
        self.n = n

    def forward(self, x):
        for i in range(self.n):
            k = i % 8
            if k == 0:
                x = torch.sin(x)
            elif k == 1:
                x = x * 1.5
            elif k == 2:
                x = x + 0.25
            elif k == 3:
                x = torch.tanh(x)
            elif k == 4:
                x = torch.sigmoid(x)
            elif k == 5:
                x = x - 0.5
            elif k == 6:
                x = torch.relu(x) + x
            else:
                x = torch.abs(x) * 0.75
        return x


class Case:
    """A model, its inputs, and the step one timed call runs (``run(m)``)."""

    def __init__(self, name: str, build: Callable[[], nn.Module], kw: Callable[[bool], dict],
                 loss: Callable[[Any], torch.Tensor], modes=("inference", "train")):
        self.name, self.build, self.kw, self.loss, self.modes = name, build, kw, loss, modes


def _case(name: str) -> Case:
    if name == "demo":
        from fxforge.demo import GPT, GPTConfig

        cfg = GPTConfig()

        def build():
            torch.manual_seed(0)
            return GPT(cfg)

        def kw(train):
            g = torch.Generator().manual_seed(1)
            idx = torch.randint(0, cfg.vocab, (4, cfg.seq), generator=g)
            return {"idx": idx, "targets": torch.randint(0, cfg.vocab, (4, cfg.seq), generator=g)} if train else {"idx": idx}

        return Case(name, build, kw, lambda out: out)
    if name == "mixer":
        def build():
            torch.manual_seed(0)
            return Mixer()

        def kw(train):
            g = torch.Generator().manual_seed(1)
            x = torch.randn(8, 16, 64, generator=g)
            return {"x": x, "y": torch.randint(0, 10, (8,), generator=g)} if train else {"x": x}

        return Case(name, build, kw, lambda out: out)
    if name == "chain":
        return Case(name, lambda: Chain(200), lambda train: {"x": torch.randn(8, 32, generator=torch.Generator().manual_seed(1))},
                    lambda out: out.sum(), modes=("inference",))
    if name == "gpt2-2l":
        m = corpus.all_models()["gpt2-2l"]
        return Case(name, m.build, lambda train: m.inputs("cpu", train), m.loss)
    raise ValueError(name)


def _step(case: Case, kw: dict, train: bool):
    def run(m):
        if train:
            for p in m.parameters():
                p.grad = None
            loss = case.loss(m(**kw))
            loss.backward()
            return loss
        with torch.no_grad():
            return m(**kw)
    return run


# --------------------------------------------------------------------------------------------
# recording and replaying ATen calls


class Recorder(TorchDispatchMode):
    """Every ATen call made at the Python dispatch key (what the code calls, after composite
    decomposition; not what those ops call internally): (op, args, kwargs, result)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, out))
        return out


def _is_view(func) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def category(func, fxforge: bool) -> str:
    """alloc_arena | alloc_out | arena_view | graph_view | kernel.  In fxforge's wrapper
    ``aten.empty`` makes arenas and ``empty_strided`` fresh outputs; ``view.dtype`` and
    ``as_strided`` are the planned buffers' views (the graph's own views are other view ops)."""
    if func is aten.empty.memory_format:
        return "alloc_arena" if fxforge else "alloc_out"
    if func is aten.empty_strided.default:
        return "alloc_out"
    if fxforge and func in (aten.view.dtype, aten.as_strided.default):
        return "arena_view"
    return "graph_view" if _is_view(func) else "kernel"


_METHODS = {aten.view.dtype: torch.Tensor.view, aten.as_strided.default: torch.Tensor.as_strided,
            aten.copy_.default: torch.Tensor.copy_, aten.fill_.Scalar: torch.Tensor.fill_}
_PUBLIC = (torch._C._VariableFunctions, torch._C._nn, torch._C._special, torch._C._linalg, torch._C._fft)


def _works(f: functools.partial) -> bool:
    try:
        f()
        return True
    except Exception:
        return False


def direct(func, args, kwargs) -> functools.partial:
    """The ATen call as the wrapper makes it, less the ``OpOverload.__call__`` Python frame:
    ``torch.empty``/``torch.empty_strided``, a Tensor method where the wrapper calls one
    (``view(dtype)``, ``as_strided``, ``copy_``, ``fill_``), else the overload's ``_op``."""
    if func is aten.empty.memory_format:
        f = functools.partial(torch.empty, *args, **kwargs)
    elif func is aten.empty_strided.default:
        f = functools.partial(torch.empty_strided, *args, **kwargs)
    elif func in _METHODS:
        f = functools.partial(_METHODS[func], *args, **kwargs)
    else:
        f = functools.partial(func._op, *args, **kwargs)
    return f if _works(f) else functools.partial(func._op, *args, **kwargs)


def public(func, args, kwargs) -> functools.partial | None:
    """The same call through torch's generated Python bindings (``torch.add(..., out=)``,
    ``torch._C._nn.gelu``, a Tensor method), or None when there is none taking these arguments."""
    name = func.overloadpacket.__name__
    for ns in _PUBLIC + (torch.Tensor,):
        f = getattr(ns, name, None)
        if f is None:
            continue
        f = functools.partial(f, *args, **kwargs)
        if _works(f):
            return f
    return None


def _noop(*args, **kwargs):
    return None


_NONES = (None,) * 16


def _noop_seq(*args, **kwargs):
    return _NONES  # indexable, as a multi-output op's result is


def interleaved(fns: dict[str, Callable[[], Any]], *, calls: int, budget_s: float, warmup: int = 2,
                min_calls: int = 5) -> dict[str, dict]:
    """``measure.interleaved_medians`` (same rounds, order rotated every round, same stopping rule),
    recording each call's wall time and this thread's CPU time: per name ``median_s``, ``p25_s``,
    ``p75_s`` (wall), ``cpu_median_s``, ``calls``."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    r = 0
    while r < calls and (r < min_calls or time.perf_counter() - start < budget_s):
        for n in names[r % len(names):] + names[: r % len(names)]:
            c0, t0 = time.thread_time(), time.perf_counter()
            fns[n]()
            t1, c1 = time.perf_counter(), time.thread_time()
            wall[n].append(t1 - t0)
            cpu[n].append(c1 - c0)
        r += 1
    out = {}
    for n in names:
        q = statistics.quantiles(wall[n], n=4) if len(wall[n]) >= 2 else [wall[n][0]] * 3
        out[n] = {"median_s": statistics.median(wall[n]), "p25_s": q[0], "p75_s": q[2],
                  "cpu_median_s": statistics.median(cpu[n]), "calls": len(wall[n]), "cpu_s": cpu[n], "wall_s": wall[n]}
    return out


def rounds(items: dict[str, Callable[[], Any]], *, budget_s: float, min_rounds: int = 5,
           max_rounds: int = 300, warmup: int = 1) -> dict[str, list[float]]:
    """Every item called once per round, in an order shuffled every round (seeded), timed with
    ``clock()``; the per-round times of each item (index r = round r), so figures combined from
    several items (differences, sums) come from the same moments of a shared machine's load, and
    no item always runs right after another (whose cache footprint it would inherit)."""
    import random

    names = list(items)
    shuffle = random.Random(0).shuffle
    for _ in range(warmup):
        for n in names:
            items[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    r = 0
    while r < max_rounds and (r < min_rounds or time.perf_counter() - start < budget_s):
        order = list(names)
        shuffle(order)
        for n in order:
            f = items[n]
            t0 = clock()
            f()
            times[n].append(clock() - t0)
        r += 1
    return times


def flat(calls: list[Callable[[], Any]]) -> Callable[[], None]:
    """One callable calling ``calls`` in a row (bound partials on recorded arguments)."""
    def run():
        for f in calls:
            f()
    return run


def loop_of(calls: list[Callable[[], Any]]) -> Callable[[], None]:
    """``flat`` over no-op partials with the same arguments: the loop's own cost."""
    return flat([functools.partial(_noop, *f.args, **f.keywords) if isinstance(f, functools.partial) else _noop
                 for f in calls])


class Program:
    """A recorded call sequence replayed *faithfully*, as straight-line Python generated from the
    record: each call gets the results of the replayed calls before it (not the recorded
    tensors), and each result is ``del``-ed after its last use, as the wrapper does, so arenas and
    outputs are allocated, first touched (page faults) and freed as in the real call.

    ``bind`` says how each call is made:

    * ``direct``: ``torch.empty``/``torch.empty_strided``, a Tensor method where the wrapper calls
      one (``view(dtype)``, ``as_strided``, ``copy_``, ``fill_``), else the overload's ``_op``
      (no ``OpOverload.__call__`` frame, no attribute path);
    * ``wrapper``: as the generated wrapper writes them, ``torch.ops.aten.<op>.<overload>(...)``
      for kernels and graph views (the rest as ``direct``);
    * ``public``: kernels and graph views through torch's generated Python bindings
      (``torch.add(..., out=)``, ``x.view(...)``) where one takes the same arguments;
    * ``noop``: the same code calling a no-op: the replay's own cost (name binding, argument
      passing, ``del``), to subtract.

    ``persistent=True``: arenas, their typed views, the planned buffers' ``as_strided`` views and
    every graph view of a buffer in an arena are not made: the recorded ones are used, as if made
    once and kept across calls (static shapes)."""

    def __init__(self, calls: list[tuple], cats: list[str], bind: str = "direct", persistent: bool = False):
        consts: dict[str, Any] = {"torch": torch}
        where: dict[int, str] = {}
        uses: dict[str, int] = {}

        def const(v) -> str:
            name = f"_c{len(consts)}"
            consts[name] = v
            return name

        def expr(v, i) -> str:
            if isinstance(v, torch.Tensor) and id(v) in where:
                uses[where[id(v)].split("[")[0]] = i
                return where[id(v)]
            if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) and id(x) in where for x in v):
                items = ", ".join(expr(x, i) for x in v)
                return f"[{items}]" if isinstance(v, list) else f"({items},)"
            return const(v)

        arenas = {out.untyped_storage().data_ptr() for (_, _, _, out), cat in zip(calls, cats) if cat == "alloc_arena"}

        def kept(out, cat) -> bool:
            return cat in ("alloc_arena", "arena_view") or (
                cat == "graph_view" and isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() in arenas)

        lines = []
        for i, ((func, a, kw, out), cat) in enumerate(zip(calls, cats)):
            if persistent and kept(out, cat):
                rhs = const(out)
            else:
                args = ", ".join([expr(v, i) for v in a] + [f"{k}={expr(v, i)}" for k, v in kw.items()])
                f = None
                if bind == "noop":
                    f = _noop_seq
                elif bind == "wrapper" and cat in ("kernel", "graph_view") and func not in _METHODS:
                    ns, rest = func.name().split("::", 1)
                    name, _, overload = rest.partition(".")
                    fn = f"torch.ops.{ns}.{name}.{overload or 'default'}"
                elif bind == "public" and cat in ("kernel", "graph_view"):
                    p = public(func, a, kw)
                    f = p.func if p is not None else direct(func, a, kw).func
                else:
                    f = direct(func, a, kw).func
                if f is not None:
                    fn = const(f)
                rhs = f"{fn}({args})"
            lines.append((f"v{i} = {rhs}", f"v{i}"))
            if isinstance(out, torch.Tensor):
                where[id(out)] = f"v{i}"
            elif isinstance(out, (list, tuple)):
                for j, o in enumerate(out):
                    if isinstance(o, torch.Tensor):
                        where[id(o)] = f"v{i}[{j}]"
        dead_at: dict[int, list[str]] = {}
        for name, i in uses.items():
            dead_at.setdefault(i, []).append(name)
        body = []
        for i, (line, name) in enumerate(lines):
            body.append(line)
            dead = dead_at.get(i, []) + ([] if name in uses else [name])
            if dead:
                body.append("del " + ", ".join(dead))
        self.source = "def replay():\n" + "".join(f"    {line}\n" for line in body or ["pass"])
        ns = dict(consts)
        exec(compile(self.source, f"<overhead-replay-{bind}>", "exec"), ns)
        self.run = ns["replay"]


def timed_medians(fns: dict[str, Callable[[], Any] | tuple], *, budget_s: float, min_rounds: int = 5,
                  max_rounds: int = 2000) -> dict[str, float]:
    """Median seconds per call of each function, interleaved (order rotated every round), after
    one warm-up call each.  A value may be ``(setup, fn)``: ``setup()`` runs untimed before every
    call of ``fn`` (to restore an input that ``fn`` overwrites)."""
    pairs = {n: f if isinstance(f, tuple) else (None, f) for n, f in fns.items()}
    for setup, f in pairs.values():
        if setup:
            setup()
        f()
    times: dict[str, list[float]] = {n: [] for n in pairs}
    names = list(pairs)
    start = time.perf_counter()
    r = 0
    while r < max_rounds and (r < min_rounds or time.perf_counter() - start < budget_s):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            setup, f = pairs[n]
            if setup:
                setup()
            t0 = clock()
            f()
            times[n].append(clock() - t0)
        r += 1
    return {n: statistics.median(ts) for n, ts in times.items()}


# --------------------------------------------------------------------------------------------
# fxforge's generated call, taken apart


class Probe:
    """Put in place of ``Compiled._fn`` (the generated ``call``): times it, can capture its inputs."""

    def __init__(self, compiled):
        self.compiled, self.fn = compiled, compiled._fn
        self.seconds = 0.0
        self.capture = False
        self.args: list | None = None

    def __call__(self, args):
        if self.capture:
            self.args = list(args)
        t0 = clock()
        out = self.fn(args)
        self.seconds += clock() - t0
        return out


def python_calls(fn: Callable[[], Any]) -> Counter:
    """Python-level calls during ``fn()`` (``sys.setprofile``): ``kernel functions``,
    ``OpOverload.__call__``, ``other Python``, ``builtins`` (C functions and methods)."""
    c: Counter = Counter()

    def prof(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_name.startswith("kernel"):
                c["kernel functions"] += 1
            elif code.co_name == "__call__" and code.co_filename.endswith(os.path.join("torch", "_ops.py")):
                c["OpOverload.__call__"] += 1
            else:
                c["other Python"] += 1
        elif event == "c_call":
            c["builtins"] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    c["other Python"] -= 1  # the profiled lambda's frame is not one of the wrapper's calls
    return c


def minor_faults(fn: Callable[[], Any], calls: int = 10) -> float:
    """Minor page faults per call of ``fn`` (``getrusage``; first touches of fresh memory)."""
    import resource

    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def source_counts(source: str) -> dict:
    """Static counts over the generated source: names ``del``-ed in ``call`` and
    ``torch.ops.`` attribute paths (each is evaluated once per call: no loops in the wrapper)."""
    body = source.split("\ndef call(args):", 1)[-1]
    dels = sum(len(line.strip()[4:].split(",")) for line in body.splitlines() if line.strip().startswith("del "))
    return {"del_names": dels, "op_paths": source.count("torch.ops."),
            "kernel_defs": sum(1 for line in source.splitlines() if line.startswith("def kernel"))}


def prepare_graph(c, args: list) -> dict:
    """Everything the breakdown of one compiled graph needs, from one standalone call of its
    generated ``call`` on inputs captured from a real call: the ATen calls it makes (recorded),
    their categories, the replays (see ``Program``), counts."""
    fn = c._fn.fn if isinstance(c._fn, Probe) else c._fn
    with torch.no_grad():
        rec = Recorder()
        with rec:
            fn(list(args))
        counts = python_calls(lambda: fn(list(args)))
        faults = minor_faults(lambda: fn(list(args)))
    cats = [category(func, True) for func, *_ in rec.calls]
    groups: dict[str, list] = {k: [] for k in ("alloc_arena", "alloc_out", "arena_view", "graph_view")}
    kernels, arena_ptrs, arena_bytes, arena_views = [], set(), 0, 0
    ops: Counter = Counter()
    with torch.no_grad():
        for (func, a, kw, out), cat in zip(rec.calls, cats):
            ops[f"{cat}:{func}"] += 1
            if cat == "kernel":
                kernels.append((func, a, kw))
                continue
            groups[cat].append(direct(func, a, kw))
            if cat == "graph_view" and isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() in arena_ptrs:
                arena_views += 1
            if cat == "alloc_arena":
                arena_bytes += int(out.numel() * out.element_size())
                arena_ptrs.add(out.untyped_storage().data_ptr())
        programs = {bind: Program(rec.calls, cats, bind) for bind in ("direct", "noop", "wrapper", "public")}
        programs["persistent"] = Program(rec.calls, cats, "direct", persistent=True)
        programs["best"] = Program(rec.calls, cats, "public", persistent=True)
    return {"compiled": c, "fn": fn, "args": args, "groups": groups, "programs": programs, "kernels": kernels,
            "arena_ptrs": arena_ptrs, "info": {
                "graph": c.stats.get("graph"), "counts": {k: len(v) for k, v in groups.items()} | {"kernel": len(kernels),
                                                                                      "graph_view_of_arena": arena_views},
                "ops": dict(sorted(ops.items())), "python_calls": dict(counts), "source": source_counts(c.source),
                "arena_bytes_allocated": arena_bytes, "minor_faults": faults}}


def graph_items(i: int, g: dict) -> dict[str, Callable[[], Any]]:
    """The items one graph adds to the breakdown's rounds."""
    fn, args, c = g["fn"], g["args"], g["compiled"]
    items = {f"g{i}:call": lambda: fn(list(args)), f"g{i}:call_boxed": lambda: c.call_boxed(list(args))}
    for name, p in g["programs"].items():
        items[f"g{i}:replay_{name}"] = p.run
    for cat, calls in g["groups"].items():
        items[f"g{i}:{cat}"] = flat(calls)
        items[f"g{i}:{cat}_loop"] = loop_of(calls)
    return items


def eager_items(run: Callable[[], Any], train: bool) -> tuple[dict, dict]:
    """Eager's own ATen calls of one step, recorded; their kernels replayed the same way (they
    allocate their outputs): items for the rounds and counts."""
    rec = Recorder()
    if train:
        with rec:
            run()
    else:
        with torch.no_grad(), rec:
            run()
    kernels = [direct(func, a, kw) for func, a, kw, out in rec.calls if category(func, False) in ("kernel", "alloc_out")]
    views = sum(1 for func, *_ in rec.calls if category(func, False) == "graph_view")
    return {"eager:kernels": flat(kernels), "eager:kernels_loop": loop_of(kernels)}, {"kernel": len(kernels), "graph_view": views}


def _med(ts: list[float]) -> float:
    return statistics.median(ts)


def breakdown(times: dict[str, list[float]], inner: list[float], graphs: list[dict]) -> dict:
    """Medians (seconds) of the breakdown's figures from the per-round times, summed over graphs;
    differences taken round by round."""
    n = len(times["fxforge"])
    inner = inner[-n:]

    def per_round(f) -> float:
        return _med([f(r) for r in range(n)])

    def t(name, r):
        return times[name][r]

    gi = range(len(graphs))
    b = {
        "total": _med(times["fxforge"]),
        "eager": _med(times["eager"]),
        "inside": _med(inner),
        "outside": _med([times["fxforge"][r] - inner[r] for r in range(n)]),
        "call": per_round(lambda r: sum(t(f"g{i}:call", r) for i in gi)),
        "call_boxed_extra": per_round(lambda r: sum(t(f"g{i}:call_boxed", r) - t(f"g{i}:call", r) for i in gi)),
        "replay": per_round(lambda r: sum(t(f"g{i}:replay_direct", r) - t(f"g{i}:replay_noop", r) for i in gi)),
        "glue": per_round(lambda r: sum(t(f"g{i}:call", r) - t(f"g{i}:replay_direct", r) + t(f"g{i}:replay_noop", r)
                                        for i in gi)),
        "eager_kernels": per_round(lambda r: t("eager:kernels", r) - t("eager:kernels_loop", r)),
    }
    for cat in ("alloc_arena", "alloc_out", "arena_view", "graph_view"):
        b[cat] = per_round(lambda r, cat=cat: sum(t(f"g{i}:{cat}", r) - t(f"g{i}:{cat}_loop", r) for i in gi))
    b["kernel"] = per_round(lambda r: sum(t(f"g{i}:replay_direct", r) - t(f"g{i}:replay_noop", r)
                                          - sum(t(f"g{i}:{c}", r) - t(f"g{i}:{c}_loop", r)
                                                for c in ("alloc_arena", "alloc_out", "arena_view", "graph_view"))
                                          for i in gi))
    b["penalty"] = b["inside"] - b["call"]
    # savings: a replay variant against the direct replay, round by round
    for name, (a, z) in {"save_bind": ("replay_wrapper", "replay_direct"),
                         "save_persistent": ("replay_direct", "replay_persistent"),
                         "save_public": ("replay_direct", "replay_public"),
                         "save_wrapper_rest": ("call", "replay_wrapper")}.items():
        b[name] = per_round(lambda r, a=a, z=z: sum(t(f"g{i}:{a}", r) - t(f"g{i}:{z}", r) for i in gi))
    # all changes together: ``call`` against the straight-line replay with persistent arenas and
    # torch's bindings, its own bookkeeping (binding names, ``del``) kept: what a lean wrapper costs
    b["save_all"] = per_round(lambda r: sum(t(f"g{i}:call", r) - t(f"g{i}:replay_best", r) for i in gi))
    b["floor"] = b["outside"] + b["penalty"] + b["kernel"] - b["save_public"]
    b["rounds"] = n
    return b


def _written(func, a, kw) -> list[tuple[str, torch.Tensor]]:
    """The arguments a call writes (its schema's ``Tensor(a!)`` arguments: ``out=``,
    ``grad_input=``, ``values=``, an in-place op's ``self``), by name."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        v = kw.get(arg.name, a[i] if i < len(a) and not arg.kwarg_only else None)
        if isinstance(v, torch.Tensor):
            out.append((arg.name, v))
    return out


def _out_keys(func, a, kw) -> list[str]:
    """Keyword arguments that are outputs (out=, grad_input=, ...)."""
    return [k for k, _ in _written(func, a, kw) if k in kw]


def _restorer(func, a, kw) -> Callable[[], None] | None:
    """Where a call writes over storage one of its inputs lives in (in place into the arena),
    repeating it would feed it its own output (GELU repeated drives values to denormals, and
    every later reader slows down 10-100x): restore those inputs before each call."""
    ptrs = {o.untyped_storage().data_ptr() for _, o in _written(func, a, kw)}
    shared = {x.untyped_storage().data_ptr(): x.untyped_storage() for x in a
              if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() in ptrs}
    if not shared:
        return None
    saved = [(st, st.clone()) for st in shared.values()]  # whole storages: inputs may be expanded views

    def restore():
        for st, v in saved:
            st.copy_(v)
    return restore


def functional_of(func, a, kw) -> functools.partial | None:
    """The functional overload of an out= call, bound to the same inputs (``_op``, as ``direct``)."""
    keys = _out_keys(func, a, kw)
    fkw = {k: v for k, v in kw.items() if k not in keys}
    for name in func.overloadpacket.overloads():
        ov = getattr(func.overloadpacket, name)
        if ov is func or ov._schema.is_mutable:
            continue
        f = functools.partial(ov._op, *a, **fkw)
        try:
            with torch.no_grad():
                r = f()
        except Exception:
            continue
        outs = [kw[k] for k in keys]
        rs = list(r) if isinstance(r, (tuple, list)) else [r]
        if len(rs) >= len(outs) and all(isinstance(x, torch.Tensor) and x.shape == o.shape for x, o in zip(rs, outs)):
            return f
    return None


def per_kernel(kernels: list[tuple], arena_ptrs: set[int], budget_s: float, top: int = 6) -> dict:
    """Each kernel call of the generated code timed alone (medians, variants interleaved, inputs
    an out= call writes over restored untimed): as the wrapper binds it (``_op``), through torch's
    generated Python binding, and for out= calls writing an arena view, the functional overload
    on the same inputs (which allocates its result, as eager does)."""
    if not kernels:
        return {"kernels": 0}
    per = max(budget_s / len(kernels), 0.02)
    rows = []
    with torch.no_grad():
        for func, a, kw in kernels:
            restore = _restorer(func, a, kw)
            variants = {"op": (restore, direct(func, a, kw))}
            pub = public(func, a, kw)
            if pub is not None:
                variants["public"] = (restore, pub)
            outs = _out_keys(func, a, kw)
            if outs and all(kw[k].untyped_storage().data_ptr() in arena_ptrs for k in outs):
                fn = functional_of(func, a, kw)
                if fn is not None:
                    variants["functional"] = (restore, fn)
            t = timed_medians(variants, budget_s=per, min_rounds=5, max_rounds=200)
            if restore:
                restore()
            shape = next((list(kw[k].shape) for k in outs), None)
            rows.append({"op": f"{func.__name__} {shape if shape is not None else ''}".strip(), "in_place": restore is not None,
                         **{k + "_s": v for k, v in t.items()}})
    pub = [r for r in rows if "public_s" in r]
    arena = [r for r in rows if "functional_s" in r]
    arena.sort(key=lambda r: r["op_s"] - r["functional_s"], reverse=True)
    return {"kernels": len(rows), "op_s": sum(r["op_s"] for r in rows),
            "public": len(pub), "op_minus_public_s": sum(r["op_s"] - r["public_s"] for r in pub),
            "out_arena": len(arena), "out_s": sum(r["op_s"] for r in arena), "functional_s": sum(r["functional_s"] for r in arena),
            "slower_10pct": sum(1 for r in arena if r["op_s"] > 1.1 * r["functional_s"]),
            "faster_10pct": sum(1 for r in arena if r["op_s"] < r["functional_s"] / 1.1), "worst": arena[:top]}


# --------------------------------------------------------------------------------------------
# one case


def run_case(case: Case, mode: str, args) -> dict:
    import fxforge

    train = mode == "train"
    torch._dynamo.reset()
    base = case.build()
    base.train(train)
    kw = case.kw(train)
    run = _step(case, kw, train)
    ref = run(base)
    ref_grads = [p.grad for p in base.parameters()] if train else None
    models: dict[str, nn.Module] = {"eager": base}
    backend = fxforge.backend(fxforge.Config())
    backends = {"fxforge": backend, "fxforge_torch": fxforge.backend(fxforge.Config(codegen="torch"))}
    first = {}
    # one untimed compile first, so the timed first calls below all find dynamo and AOTAutograd warm
    # (the first of them would otherwise also pay their one-time set-up); through a backend of its
    # own, so that aot_eager's timed first call compiles again instead of reusing this one's graphs
    aot_eager = torch._dynamo.lookup_backend("aot_eager")
    run(torch.compile(copy.deepcopy(base), backend=lambda gm, example_inputs: aot_eager(gm, example_inputs)))
    for who in args.contenders:
        if who == "eager":
            continue
        m = copy.deepcopy(base)
        cm = torch.compile(m, backend=backends.get(who, who))
        t0 = time.perf_counter()
        out = run(cm)
        first[who] = {"first_call_s": time.perf_counter() - t0, "max_abs_err": measure.max_abs_err(out, ref)}
        if train:  # a wrong gradient leaves the loss right: compare every parameter's gradient too
            first[who]["grad_max_abs_err"] = measure.max_abs_err([p.grad for p in m.parameters()], ref_grads)
            if not first[who]["grad_max_abs_err"] <= GRAD_TOLERANCE:
                print(f"WARNING: {case.name} {mode} {who}: gradients differ from eager's by "
                      f"{first[who]['grad_max_abs_err']:.2e}", file=sys.stderr, flush=True)
        models[who] = cm
    from torch._dynamo.utils import counters

    # 1. time per call: the contenders alone, interleaved
    graphs_before = int(counters["stats"]["unique_graphs"])
    timing = interleaved({n: (lambda m=m: run(m)) for n, m in models.items()}, calls=args.calls, budget_s=args.budget)
    faults = {n: minor_faults(lambda m=m: run(m), calls=5) for n, m in models.items()}
    row: dict[str, Any] = {"case": case.name, "mode": mode, "clock": args.clock, "time": timing, "first_call": first,
                           "minor_faults": faults,
                           "recompiled_during_timing": int(counters["stats"]["unique_graphs"]) != graphs_before}
    if "fxforge" not in models:
        return row
    fxm = models["fxforge"]
    compiled = list(backend.compiled)
    row["fxforge_failures"] = [r for c in compiled for r in c.failures] + [r for _, r in backend.failures]
    row["fxforge_kernels"] = dict(collections.Counter(k.backend for c in compiled for k in c.kernels))
    if any(k.backend != "torch" for c in compiled for k in c.kernels):
        # the replay records ATen calls; a generated kernel is not one (it would be replayed as nothing)
        row["breakdown_skipped"] = "the fxforge graphs run generated kernels: the ATen replay does not apply"
        return row

    # 2. breakdown: the generated ``call`` functions get a timer (``Probe``), one real step
    # captures their inputs, then one set of interleaved rounds holds the real fxforge and eager
    # steps and every standalone call and replay, so all figures share the machine's load
    probes = [Probe(c) for c in compiled]
    for c, p in zip(compiled, probes):
        c._fn = p
        p.capture = True
    run(fxm)
    for p in probes:
        p.capture = False
    graphs = [prepare_graph(c, p.args) for c, p in zip(compiled, probes) if p.args is not None]
    inner: list[float] = []

    def fx_step():
        before = sum(p.seconds for p in probes)
        run(fxm)
        inner.append(sum(p.seconds for p in probes) - before)

    items: dict[str, Callable[[], Any]] = {"fxforge": fx_step, "eager": lambda: run(base)}
    ek, ecounts = eager_items(lambda: run(base), train)
    items.update(ek)
    for i, g in enumerate(graphs):
        items.update(graph_items(i, g))
    # standalone calls and replays run under no_grad, as call_boxed runs the generated code (and
    # as eager's ATen calls run below autograd)
    times = rounds({n: _no_grad(f) if ":" in n else f for n, f in items.items()},
                   budget_s=args.budget, max_rounds=args.calls)
    row["breakdown"] = breakdown(times, inner, graphs)
    row["eager_counts"] = ecounts
    row["graphs"] = [g["info"] for g in graphs]

    # 3. each kernel alone: bound as the wrapper binds it, through torch's bindings, functional
    for g in graphs:
        g["info"]["per_kernel"] = per_kernel(g["kernels"], g["arena_ptrs"], args.budget / 2 / len(graphs))
    for c, p in zip(compiled, probes):
        c._fn = p.fn
    return row


def _no_grad(f: Callable[[], Any]) -> Callable[[], Any]:
    def g():
        with torch.no_grad():
            return f()
    return g


# --------------------------------------------------------------------------------------------
# micro-benchmarks


def unit_costs(budget_s: float) -> dict:
    """Per-operation costs (seconds) of the candidate changes' building blocks: loops of 1000,
    each figure minus an empty loop's, medians of interleaved rounds.  Tensors are tiny (8x32)."""
    n = 1000
    x = torch.randn(8, 32)
    y = torch.randn(8, 32)
    o = torch.empty(8, 32)
    add_out = aten.add.out
    add_op = add_out._op
    view = aten.view.default
    view_op = view._op
    arena = torch.empty(131072, dtype=torch.uint8)

    def k4(a, b, c, d):
        return None

    loops = {
        "empty": lambda: None,
        "pycall": lambda: k4(x, y, o, x),
        "path": lambda: torch.ops.aten.add.out,
        "bound": lambda: add_out,
        "add_opoverload": lambda: add_out(x, y, out=o),
        "add_op": lambda: add_op(x, y, out=o),
        "add_public": lambda: torch.add(x, y, out=o),
        "view_opoverload": lambda: view(x, [32, 8]),
        "view_op": lambda: view_op(x, [32, 8]),
        "view_method": lambda: x.view(32, 8),
        "as_strided": lambda: x.as_strided((32, 8), (8, 1), 0),
        "alloc": lambda: torch.empty(131072, dtype=torch.uint8, device=torch.device("cpu")),
        "typed": lambda: arena.view(torch.float32),
    }

    def loop(f):
        def run():
            for _ in range(n):
                f()
        return run

    t = timed_medians({k: loop(f) for k, f in loops.items()}, budget_s=budget_s, max_rounds=300)
    per = {k: (v - t["empty"]) / n for k, v in t.items()}
    return {
        "Python function call, 4 args": per["pycall"],
        "`torch.ops.aten.add.out` attribute path (vs a bound name)": per["path"] - per["bound"],
        "`OpOverload.__call__` frame (`aten.add.out(...)` vs its `._op(...)`)": per["add_opoverload"] - per["add_op"],
        "`aten.add.out._op(x, y, out=o)`": per["add_op"],
        "`torch.add(x, y, out=o)` (generated binding)": per["add_public"],
        "`aten.view.default(x, s)` (OpOverload)": per["view_opoverload"],
        "`aten.view.default._op(x, s)`": per["view_op"],
        "`x.view(s)` (Tensor method)": per["view_method"],
        "`x.as_strided(size, stride, 0)`": per["as_strided"],
        "`torch.empty(131072, dtype=uint8)` + free": per["alloc"],
        "`arena.view(torch.float32)`": per["typed"],
    }


def gelu_micro(budget_s: float) -> list[dict]:
    """GELU, functional vs out= into arena views (offsets), in place, and a fresh arena per call."""
    rows = []
    for shape in ((4, 64, 512), (8, 16, 256), (8, 64, 32)):
        x = torch.randn(shape)
        numel, st = x.numel(), x.stride()
        arena = torch.empty(numel * 4 + 4096, dtype=torch.uint8)
        a32 = arena.view(torch.float32)
        out = torch.empty_like(x)
        xin = x.clone()
        v0, v1, v4, v257 = (a32.as_strided(shape, st, off) for off in (0, 1, 4, 257))
        fns = {
            "functional gelu.default (allocates)": lambda: aten.gelu.default(x),
            "gelu.out into torch.empty_like": lambda: aten.gelu.out(x, out=out),
            "gelu.out into arena view, offset 0": lambda: aten.gelu.out(x, out=v0),
            "gelu.out into arena view, offset 4 B": lambda: aten.gelu.out(x, out=v1),
            "gelu.out into arena view, offset 16 B": lambda: aten.gelu.out(x, out=v4),
            "gelu.out into arena view, offset 1 KiB + 4 B": lambda: aten.gelu.out(x, out=v257),
            "as_strided + gelu.out into arena view, offset 0": lambda: aten.gelu.out(x, out=a32.as_strided(shape, st, 0)),
            # restored untimed before each call: repeated in place, GELU drives values to denormals
            "gelu.out in place (out is the input)": (lambda: xin.copy_(x), lambda: aten.gelu.out(xin, out=xin)),
            "fresh arena per call: empty + view + as_strided + gelu.out":
                lambda: aten.gelu.out(x, out=torch.empty(numel * 4, dtype=torch.uint8).view(torch.float32).as_strided(shape, st, 0)),
        }
        t = timed_medians(fns, budget_s=budget_s / 4, max_rounds=3000)
        rows.append({"shape": list(shape), "times_s": t})
    return rows


def gelu_threads(budget_s: float, shape=(4, 64, 512)) -> list[dict]:
    """GELU functional vs out= into an arena view with 1 and 2 torch threads: median and mean of
    wall time per call (a short profile reports means)."""
    x = torch.randn(shape)
    a32 = torch.empty(x.numel() * 4, dtype=torch.uint8).view(torch.float32)
    v = a32.as_strided(shape, x.stride(), 0)
    before = torch.get_num_threads()
    rows = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fns = {"functional": lambda: aten.gelu.default(x), "out= arena view": lambda: aten.gelu.out(x, out=v)}
            times: dict[str, list[float]] = {n: [] for n in fns}
            start = time.perf_counter()
            while time.perf_counter() - start < budget_s / 2 or len(times["functional"]) < 50:
                for n, f in fns.items():
                    t0 = time.perf_counter()
                    f()
                    times[n].append(time.perf_counter() - t0)
            for n, ts in times.items():
                rows.append({"threads": threads, "variant": n, "median_s": statistics.median(ts),
                             "mean_s": statistics.mean(ts), "max_s": max(ts), "calls": len(ts)})
    finally:
        torch.set_num_threads(before)
    return rows


# --------------------------------------------------------------------------------------------
# tables


def summarize(row: dict) -> dict:
    """The breakdown's figures (seconds) with the counts per call, summed over the case's graphs."""
    s = dict(row["breakdown"])
    g = row["graphs"]

    def tot(f):
        return sum(f(x) for x in g)

    for k in ("alloc_arena", "alloc_out", "arena_view", "graph_view", "kernel"):
        s["n_" + k] = tot(lambda x: x["counts"][k])
    s["n_arena_graph_views"] = tot(lambda x: x["counts"].get("graph_view_of_arena", 0))
    s["n_as_strided"] = tot(lambda x: sum(v for k, v in x["ops"].items() if k.endswith("as_strided.default")))
    s["n_kernel_fns"] = tot(lambda x: x["python_calls"].get("kernel functions", 0))
    s["n_opoverload"] = tot(lambda x: x["python_calls"].get("OpOverload.__call__", 0))
    s["n_del"] = tot(lambda x: x["source"]["del_names"])
    s["n_paths"] = tot(lambda x: x["source"]["op_paths"])
    s["arena_bytes"] = tot(lambda x: x["arena_bytes_allocated"])
    s["faults"] = tot(lambda x: x["minor_faults"])
    s["n_eager_kernel"] = row["eager_counts"]["kernel"]
    t = row["time"]
    key = "cpu_median_s" if row.get("clock") == "cpu" else "median_s"
    s["headline"] = {n: v[key] for n, v in t.items()}
    # projected: the saving's share of the breakdown's fxforge step, applied to the headline ratios
    keep = 1 - s["save_all"] / s["total"]
    s["projected_over_eager"] = t["fxforge"][key] * keep / t["eager"][key]
    s["projected_over_inductor"] = t["fxforge"][key] * keep / t["inductor"][key] if "inductor" in t else None
    pk = [x["per_kernel"] for x in g if x.get("per_kernel", {}).get("out_arena")]
    s["out_arena"] = sum(k["out_arena"] for k in pk)
    s["out_s"] = sum(k["out_s"] for k in pk)
    s["functional_s"] = sum(k["functional_s"] for k in pk)
    s["out_slower"] = sum(k["slower_10pct"] for k in pk)
    s["out_faster"] = sum(k["faster_10pct"] for k in pk)
    s["out_worst"] = sorted((w for k in pk for w in k["worst"]), key=lambda w: w["op_s"] - w["functional_s"], reverse=True)[:3]
    return s


def _us(v: float | None) -> str:
    return "—" if v is None else f"{v * 1e6:,.0f}"


def render(rows: list[dict], units: dict, gelu: list[dict], meta: dict) -> str:
    clock = "this thread's CPU time" if meta.get("clock", "cpu") == "cpu" else "wall time"
    out = [f"<!-- {meta['command']} | {meta['date_utc']} | {meta['cpu']}, {meta['cores']} cores | torch {meta['torch']}, "
           f"python {meta['python']}, transformers {meta.get('transformers')} | fxforge {meta.get('fxforge_commit')} | "
           f"{meta['threads']} thread(s) | load avg at start {meta.get('loadavg_start')} -->", ""]
    out += [f"**Time per call** (median µs of {clock}, contenders interleaved, {meta['threads']} thread; "
            "ratios of wall-time medians too):", "",
            "| case | eager | aot_eager | fxforge (torch backend) | fxforge | Inductor | fxforge / eager "
            "| fxforge / Inductor | fxforge (torch backend) / eager | wall: fxforge / eager | wall: fxforge / Inductor "
            "| rounds | first call s: fxforge / Inductor | backend compile s (first call − aot_eager's): "
            "fxforge / Inductor = ratio | fxforge kernels | page faults per call: "
            + " / ".join(CONTENDERS) + " |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|"]
    for r in rows:
        t = r["time"]
        key = "cpu_median_s" if r.get("clock") == "cpu" else "median_s"

        def med(n, k=key):
            return t[n].get(k) if n in t else None

        def ratio(a, b, k=key):
            return f"{med(a, k) / med(b, k):.2f}x" if med(a, k) and med(b, k) else "—"

        fc = r.get("first_call", {})
        first = " / ".join(f"{fc[n]['first_call_s']:.2f}" if n in fc else "—" for n in ("fxforge", "inductor"))
        own = {n: fc[n]["first_call_s"] - fc["aot_eager"]["first_call_s"] for n in ("fxforge", "inductor")
               if n in fc and "aot_eager" in fc}
        compile_s = (f"{own['fxforge']:.2f} / {own['inductor']:.2f} = {own['fxforge'] / own['inductor']:.2f}x"
                     if len(own) == 2 and own["inductor"] > 0 else "—")
        kern = ", ".join(f"{n} {b}" for b, n in sorted(r.get("fxforge_kernels", {}).items())) or "—"
        out.append(f"| {r['case']} {r['mode']} | {_us(med('eager'))} | {_us(med('aot_eager'))} | {_us(med('fxforge_torch'))} | "
                   f"{_us(med('fxforge'))} | {_us(med('inductor'))} | {ratio('fxforge', 'eager')} | {ratio('fxforge', 'inductor')} | "
                   f"{ratio('fxforge_torch', 'eager')} | "
                   f"{ratio('fxforge', 'eager', 'median_s')} | {ratio('fxforge', 'inductor', 'median_s')} | "
                   f"{t['eager']['calls']}{' (recompiled!)' if r.get('recompiled_during_timing') else ''} | {first} | {compile_s} | {kern} | "
                   + " / ".join(f"{r['minor_faults'][n]:,.0f}" if n in r["minor_faults"] else "—" for n in CONTENDERS) + " |")
    trained = [r for r in rows if any("grad_max_abs_err" in v for v in r.get("first_call", {}).values())]
    if trained:  # the step timed computes what eager's does: every parameter's gradient checked
        out += ["", "Gradients after the first call, max abs difference from eager's (warned above "
                f"{GRAD_TOLERANCE:g}): " + "; ".join(
                    f"{r['case']} " + ", ".join(f"{n} {v['grad_max_abs_err']:.1e}" for n, v in r["first_call"].items()
                                                  if "grad_max_abs_err" in v) for r in trained) + "."]
    sums = [(r, summarize(r)) for r in rows if "breakdown" in r]
    skipped = [r for r in rows if "breakdown_skipped" in r]
    if skipped:  # no empty tables: say which cases have no breakdown, and why
        out += ["", "No ATen-replay breakdown for " + ", ".join(f"{r['case']} {r['mode']}" for r in skipped)
                + f": {skipped[0]['breakdown_skipped']}."]
    if sums:
        out += ["", f"**Where fxforge's time per call goes** (median µs of {clock} per step, summed over the case's graphs; "
                "n = calls per step; all figures from the same interleaved rounds):", "",
                "| case | fxforge step | = outside `call` | + inside `call` | (− `call` alone = in-situ penalty) "
                "| `call` alone | = Python glue | + arena `empty` (n, KiB) | + output `empty_strided` (n) "
                "| + arena views (n `as_strided` + `view(dtype)`) | + graph views (n) | + kernels (n; page faults) "
                "| aot_eager − eager | eager step | eager's kernels replayed (n) | rounds |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r, s in sums:
            aot = s["headline"].get("aot_eager")
            out.append(
                f"| {r['case']} {r['mode']} | {_us(s['total'])} | {_us(s['outside'])} | {_us(s['inside'])} | "
                f"{_us(s['penalty'])} | {_us(s['call'])} | {_us(s['glue'])} | {_us(s['alloc_arena'])} "
                f"({s['n_alloc_arena']}, {s['arena_bytes'] / 1024:,.0f}) | {_us(s['alloc_out'])} ({s['n_alloc_out']}) | "
                f"{_us(s['arena_view'])} ({s['n_as_strided']} + {s['n_arena_view'] - s['n_as_strided']}) | "
                f"{_us(s['graph_view'])} ({s['n_graph_view']}) | {_us(s['kernel'])} ({s['n_kernel']}; {s['faults']:,.0f}) | "
                f"{_us(aot - s['headline']['eager'] if aot else None)} | {_us(s['eager'])} | "
                f"{_us(s['eager_kernels'])} ({s['n_eager_kernel']}) | {s['rounds']} |")
        out += ["", "**What the generated code does per step, and what each candidate change saves** (µs per step, "
                "measured: `call` or a replay variant against another, same rounds):", "",
                "| case | kernel functions called | `OpOverload.__call__` | `torch.ops.` paths | names `del`-ed "
                "| `call_boxed` beyond `call` | kernel functions & rest (`call` − wrapper-like replay) "
                "| bind op handles (`torch.ops` path + frame → `_op`) | persistent arenas + views of them (n views) "
                "| torch's bindings for kernels & views | all together (`call` − lean replay) | floor: outside + penalty + kernels "
                "| projected fxforge / eager | projected fxforge / Inductor |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r, s in sums:
            po = s["projected_over_inductor"]
            out.append(
                f"| {r['case']} {r['mode']} | {s['n_kernel_fns']} | {s['n_opoverload']} | {s['n_paths']} | {s['n_del']} | "
                f"{_us(s['call_boxed_extra'])} | {_us(s['save_wrapper_rest'])} | {_us(s['save_bind'])} | "
                f"{_us(s['save_persistent'])} ({s['n_arena_view'] + s['n_arena_graph_views']}) | {_us(s['save_public'])} | {_us(s['save_all'])} | {_us(s['floor'])} | "
                f"{s['projected_over_eager']:.2f}x | {'—' if po is None else f'{po:.2f}x'} |")
        out += ["", "**out= into arena views vs the functional op on the same inputs** (each out= call writing an arena "
                "view, alone, both through `_op`, medians of interleaved calls; µs summed over the calls):", "",
                "| case | out= calls into the arena | Σ out= | Σ functional | out= >10% slower | out= >10% faster "
                "| largest differences (out= vs functional, µs) |",
                "|---|---:|---:|---:|---:|---:|---|"]
        for r, s in sums:
            if not s["out_arena"]:
                continue
            ws = "; ".join(f"{w['op']}{' in place' if w['in_place'] else ''} {w['op_s'] * 1e6:.1f} vs {w['functional_s'] * 1e6:.1f}"
                           for w in s["out_worst"])
            out.append(f"| {r['case']} {r['mode']} | {s['out_arena']} | {_us(s['out_s'])} | {_us(s['functional_s'])} | "
                       f"{s['out_slower']} | {s['out_faster']} | {ws} |")
    out += ["", "**GELU micro-benchmark** (median µs per call):", ""]
    out += ["| variant | " + " | ".join(str(g["shape"]) for g in gelu) + " |", "|---|" + "---:|" * len(gelu)]
    for n in gelu[0]["times_s"]:
        out.append(f"| {n} | " + " | ".join(f"{g['times_s'][n] * 1e6:.1f}" for g in gelu) + " |")
    if gelu and gelu[0].get("threads"):
        out += ["", f"**GELU {gelu[0]['shape']}, 1 vs 2 torch threads** (wall µs per call; a short profile reports the mean):",
                "", "| threads | variant | median | mean | max | calls |", "|---:|---|---:|---:|---:|---:|"]
        for x in gelu[0]["threads"]:
            out.append(f"| {x['threads']} | {x['variant']} | {x['median_s'] * 1e6:.1f} | {x['mean_s'] * 1e6:.1f} | "
                       f"{x['max_s'] * 1e6:,.0f} | {x['calls']} |")
    out += ["", "**Unit costs** (ns per operation, 8x32 float32 tensors, loops of 1000, medians):", "",
            "| operation | ns |", "|---|---:|"]
    for k, v in units.items():
        out.append(f"| {k} | {v * 1e9:.0f} |")
    return "\n".join(out)


def machine_info() -> dict:
    info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:
        info["transformers"] = None
    try:
        info["fxforge_commit"] = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
                                                capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:
        info["fxforge_commit"] = None
    try:
        info["loadavg_start"] = tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        pass
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="*", choices=CASES, default=list(CASES),
                   help="cases to run (none: only the micro-benchmarks)")
    p.add_argument("--modes", nargs="+", choices=("inference", "train"), default=["inference", "train"])
    p.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS),
                   help="eager is always measured")
    p.add_argument("--calls", type=int, default=200, help="most timed rounds per case (default 200)")
    p.add_argument("--budget", type=float, default=20.0, help="seconds for a case's interleaved timing (default 20); "
                   "the breakdown takes about as long again")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="clock of the breakdown figures: this thread's CPU time (default; robust to other "
                        "processes on a shared machine) or wall time")
    p.add_argument("--out", help="also write the Markdown there")
    p.add_argument("--json", help="write every figure as JSON there")
    p.add_argument("--render", metavar="JSON", help="only print the Markdown of a JSON file written by --json")
    args = p.parse_args(argv)
    if args.render:
        d = json.loads(Path(args.render).read_text())
        print(render(d["rows"], d["units"], d["gelu"], d["meta"]))
        return 0
    if "eager" not in args.contenders:
        args.contenders = ["eager"] + args.contenders
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    _CLOCK[0] = time.thread_time if args.clock == "cpu" else time.perf_counter
    import torch._dynamo.config as dconf

    dconf.cache_size_limit = max(getattr(dconf, "cache_size_limit", 8), 64)
    meta = machine_info()
    meta["threads"] = torch.get_num_threads()
    meta["clock"] = args.clock
    meta["command"] = "python bench/overhead.py" + ("" if argv is None and len(sys.argv) == 1 else " " + " ".join(argv if argv is not None else sys.argv[1:]))
    rows = []
    for name in args.cases:
        case = _case(name)
        for mode in case.modes:
            if mode not in args.modes:
                continue
            t0 = time.perf_counter()
            rows.append(run_case(case, mode, args))
            print(f"[{name} {mode}: {time.perf_counter() - t0:.0f}s]", file=sys.stderr, flush=True)
    units = unit_costs(budget_s=min(args.budget, 5.0))
    gelu = gelu_micro(budget_s=min(args.budget, 6.0))
    gelu[0]["threads"] = gelu_threads(budget_s=min(args.budget, 6.0))
    text = render(rows, units, gelu, meta)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        for r in rows:  # the per-call lists stay out of the file: medians are what it reports
            for v in r["time"].values():
                v.pop("cpu_s", None), v.pop("wall_s", None)
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows, "units": units, "gelu": gelu}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
