"""How every figure is measured: the same functions for every contender.

* ``interleaved_medians``: time per call, contenders called round-robin (start rotated each round)
  so all of them see the same machine load; median of many calls after warm-up.
* ``peak_bytes``: bytes allocated during one call, as a running sum of allocator events.
  CPU: ``torch.profiler`` with ``profile_memory=True``; every allocation and free the c10 CPU
  allocator reports (tensor storages, fxforge arenas, Inductor buffers, op workspaces) is summed
  in time order, and the peak of that sum is the figure.  Tensors alive before the call
  (weights, inputs) are not counted; outputs count until they are dropped.  CUDA:
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the bytes
  allocated before the call.
* ``fresh_inductor``: a cold Inductor compile (fresh cache dir, FX graph and AOTAutograd caches
  off, in-memory code caches cleared).
* ``fresh_fxforge``: a cold fxforge compile (fresh ``FXFORGE_CACHE_DIR``: every kernel is built).
"""

from __future__ import annotations

import os
import resource
import statistics
import tempfile
import time
from typing import Any, Callable

import torch

# The benches' per-call figures are of the kernels built in full, and their first calls' times
# are those of compiles that wait for them: tiered builds (Config.tiered_builds) off unless a
# bench's command sets FXFORGE_TIERED_BUILDS.  bench/synthetic.py measures them.
os.environ.setdefault("FXFORGE_TIERED_BUILDS", "0")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def interleaved_medians(
    fns: dict[str, Callable[[], Any]], *, calls: int, budget_s: float, warmup: int = 2, device: str = "cpu", min_calls: int = 5
) -> dict[str, dict]:
    """Median wall seconds per call of each function, calls interleaved.

    Each round calls every function once, in an order rotated by one each round (no contender is
    always first after another's cache pollution).  Stops after ``calls`` rounds, or once
    ``budget_s`` is spent and at least ``min_calls`` rounds ran.  Returns per name: ``median_s``,
    ``p25_s``, ``p75_s``, ``min_s``, ``calls``, and ``faults`` (median minor page faults per call:
    first writes to memory fresh from the kernel, the process's count around each call)."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    sync(device)
    times: dict[str, list[float]] = {n: [] for n in names}
    faults: dict[str, list[int]] = {n: [] for n in names}
    start = time.perf_counter()
    r = 0
    while r < calls and (r < min_calls or time.perf_counter() - start < budget_s):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            sync(device)
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            fns[n]()
            sync(device)
            times[n].append(time.perf_counter() - t0)
            faults[n].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        r += 1
    out = {}
    for n, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        out[n] = {"median_s": statistics.median(ts), "p25_s": q[0], "p75_s": q[2], "min_s": min(ts), "calls": len(ts),
                  "faults": statistics.median(faults[n])}
    return out


def _allocation_events(prof) -> list[tuple[int, int]]:
    """(time_ns, +-bytes) of every allocator event the profiler saw, CPU and CUDA alike."""
    from torch._C._profiler import _EventType

    out = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation:
            out.append((e.start_time_ns, int(e.extra_fields.alloc_size)))
        stack.extend(e.children)
    out.sort()
    return out


def peak_bytes(fn: Callable[[], Any], device: str = "cpu") -> dict:
    """Peak bytes allocated during one call of ``fn`` (see the module docstring for the method).

    Returns ``peak_bytes``, ``method`` and, on CPU, ``events`` (allocator events counted),
    ``allocations`` (those that allocate), ``large_allocations`` (of 1 KiB or more: buffers, not
    the 0-dim tensors ops wrap Python scalars in) and ``allocated_bytes`` (sum of all
    allocations, a measure of allocator traffic)."""
    if device == "cuda":
        sync(device)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        sync(device)
        return {"peak_bytes": torch.cuda.max_memory_allocated() - before, "method": "torch.cuda.max_memory_allocated"}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = total = 0
    events = _allocation_events(prof)
    for _, nbytes in events:
        cur += nbytes
        peak = max(peak, cur)
        total += max(nbytes, 0)
    return {"peak_bytes": peak, "method": "torch.profiler allocation events, running sum", "events": len(events),
            "allocations": sum(1 for _, b in events if b > 0),
            "large_allocations": sum(1 for _, b in events if b >= 1024), "allocated_bytes": total}


SCRATCH_DIRS: list[str] = []  # cache dirs made by fresh_inductor / fresh_fxforge; bench/run.py removes them at the end


class fresh_inductor:
    """Context: Inductor compiles cold.  A new ``TORCHINDUCTOR_CACHE_DIR`` (listed in
    ``SCRATCH_DIRS``), the FX graph cache and AOTAutograd cache off, Inductor's in-memory code
    caches cleared."""

    def __init__(self, root: str | None = None):
        self.root = root

    def __enter__(self):
        import torch._functorch.config as fconf
        import torch._inductor.config as iconf

        self.dir, self.old_env = _scratch_dir("TORCHINDUCTOR_CACHE_DIR", "inductor-cold-", self.root)
        self.saved = []
        for mod, knob in ((iconf, "fx_graph_cache"), (iconf, "fx_graph_remote_cache"), (iconf, "autotune_local_cache"),
                          (fconf, "enable_autograd_cache"), (fconf, "enable_remote_autograd_cache")):
            if hasattr(mod, knob):
                self.saved.append((mod, knob, getattr(mod, knob)))
                setattr(mod, knob, False)
        clear_inductor_memory_caches()
        return self

    def __exit__(self, *exc):
        for mod, knob, v in self.saved:
            setattr(mod, knob, v)
        # The compiled modules loaded from the directory stay loaded; the dir is only scratch.
        _restore_env("TORCHINDUCTOR_CACHE_DIR", self.old_env)
        return False


class fresh_fxforge:
    """Context: fxforge compiles cold.  A new, empty ``FXFORGE_CACHE_DIR`` (listed in
    ``SCRATCH_DIRS``), so every kernel of the graphs compiled inside is built, as on a machine
    that never compiled the model.  What one process builds once whatever it compiles (the C
    launcher, the compiler probes) is kept in memory after the first compile; ``bench/run.py``
    pays it in ``warm_process``."""

    def __enter__(self):
        self.dir, self.old_env = _scratch_dir("FXFORGE_CACHE_DIR", "fxforge-cold-")
        return self

    def __exit__(self, *exc):
        _restore_env("FXFORGE_CACHE_DIR", self.old_env)
        return False


def _scratch_dir(var: str, prefix: str, root: str | None = None) -> tuple[str, str | None]:
    """A new directory (listed in ``SCRATCH_DIRS``) put in environment variable ``var``: the
    directory and the variable's old value."""
    d = tempfile.mkdtemp(prefix=prefix, dir=root)
    SCRATCH_DIRS.append(d)
    old = os.environ.get(var)
    os.environ[var] = d
    return d, old


def _restore_env(var: str, old: str | None) -> None:
    if old is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = old


def clear_inductor_memory_caches() -> None:
    try:
        from torch._inductor import utils

        (getattr(utils, "clear_inductor_caches", None) or getattr(utils, "clear_caches"))()
    except Exception:
        pass


def inductor_metric(name: str) -> float | None:
    """Total seconds dynamo's ``compilation_time_metrics`` recorded under ``name`` so far
    (e.g. ``compile_fx_inner``: Inductor's compile of one graph).  None if the key is unknown."""
    try:
        from torch._dynamo.utils import compilation_time_metrics

        v = compilation_time_metrics.get(name)
        return float(sum(v)) if v is not None else 0.0
    except Exception:
        return None


def max_abs_err(a: Any, b: Any) -> float:
    """Max abs difference over matching tensors of two (nested) outputs; inf on a mismatch."""
    xs, ys = _tensors(a), _tensors(b)
    if len(xs) != len(ys):
        return float("inf")
    err = 0.0
    for x, y in zip(xs, ys):
        if x.shape != y.shape:
            return float("inf")
        if x.numel():
            err = max(err, (x.detach().double() - y.detach().double()).abs().max().item())
    return err


def identical(a: Any, b: Any) -> bool:
    """Matching tensors of two (nested) outputs are equal bit for bit."""
    xs, ys = _tensors(a), _tensors(b)
    return len(xs) == len(ys) and all(torch.equal(x, y) for x, y in zip(xs, ys))


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, dict):
        return [t for k in sorted(v) for t in _tensors(v[k])]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    if hasattr(v, "to_tuple"):  # transformers ModelOutput
        return _tensors(v.to_tuple())
    return []
