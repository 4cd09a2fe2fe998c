"""Choosing a generated kernel's launch configuration by timing a few candidates.

Every kernel has a default configuration chosen from its shape (``launch.py``: block sizes and
warps) and a short list of alternatives (``Emitted.configs``, the default first).  With
``Config(autotune=True)`` the launch function hands its launch to the kernel's ``Tuner``
instead of launching with the default:

* the first call for a key (the element count and the symbolic sizes the launch reads) runs
  every candidate on scratch outputs: outputs are replaced by fresh buffers of the same layout
  and inputs whose bytes overlap an output are cloned, so the caller's tensors are never
  written twice.  A candidate that fails to compile or launch is skipped;
* each candidate's time is the least of a few launches (CUDA events on a GPU; elsewhere the
  wall clock, launches interleaved, ``fxforge.infra.timing``: under TRITON_INTERPRET=1 the choice is
  meaningless but the path is the same);
* a choice timed while the host was busy (``Timing.contended``) is stored marked so: a later
  process re-times it where the host is quiet by then (``timing.quiet``);
* the fastest is kept in memory and in ``tune_<kernel key>.json`` in the kernel cache directory
  (``cache.cache_dir()``: checked private, else a per-process temp directory; atomic writes,
  JSON only, a failed write is not an error), keyed also by device name, so later processes skip
  the timing.  A stored choice is used only if it is one of the kernel's own candidates.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Callable

import torch

from ...infra.timing import Budget, Timing, quiet, time_candidates
from . import cache

log = logging.getLogger("fxforge")

Launch = Callable[[dict, tuple], None]


def _span(t: torch.Tensor) -> tuple[int, int]:
    """Byte range ``[lo, hi)`` a tensor's elements occupy."""
    lo = t.data_ptr()
    n = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    return lo, lo + n * t.element_size()


def _like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)


def scratch_args(args: tuple, n_out: int) -> tuple:
    """``args`` with the first ``n_out`` (the outputs) replaced by fresh buffers and every input
    tensor overlapping an output cloned (timing launches then write only scratch memory)."""
    outs = [a for a in args[:n_out]]
    spans = [_span(o) for o in outs if isinstance(o, torch.Tensor) and o.numel()]
    out = [_like(o) for o in outs]
    for a in args[n_out:]:
        if isinstance(a, torch.Tensor) and a.numel():
            lo, hi = _span(a)
            if any(lo < h and l < hi for l, h in spans):
                a = _like(a).copy_(a)
        out.append(a)
    return tuple(out)


def _device_name(args: tuple) -> str:
    t = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if t is not None and t.device.type == "cuda":
        return torch.cuda.get_device_name(t.device)
    return "cpu" if t is None else t.device.type


def _time(launch: Launch, configs: list[dict], args: tuple, reps: int) -> Timing:
    """Seconds per launch of each candidate (keyed by its index in ``configs``), the least over
    ``reps`` rounds, after one warm-up launch each (which also compiles; a candidate that fails
    there is left out).  On CUDA, CUDA events; elsewhere the host calls interleaved
    (``timing.time_candidates``, which also says whether the machine was busy)."""
    ok = {}
    for i, cfg in enumerate(configs):
        try:
            launch(cfg, args)
        except Exception:  # a candidate the compiler or device refuses (e.g. out of resources)
            continue
        ok[i] = cfg
    if not any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args):
        calls = {i: (lambda cfg=cfg: launch(cfg, args)) for i, cfg in ok.items()}
        return time_candidates(calls, Budget(rounds=reps, min_rounds=reps, seconds=float("inf")),
                               threads=torch.get_num_threads())
    best = {}
    for i, cfg in ok.items():
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch(cfg, args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        best[i] = min(times)
    return Timing(best, reps * len(best), 0, None, 1)


@dataclass
class Tuner:
    kernel_key: str  # cache key of the kernel's source (and Triton version)
    configs: list[dict]  # candidate launch configurations, the default first
    n_out: int  # the launch's first n_out arguments are the outputs it writes
    reps: int = 5
    best: dict[str, dict] = field(default_factory=dict)
    timed: int = 0  # tunings that ran (not read from memory or disk)

    def path(self) -> str:
        return os.path.join(cache.cache_dir(), f"tune_{self.kernel_key}.json")

    def __call__(self, key: tuple, launch: Launch, args: tuple) -> None:
        k = "|".join(map(str, key))
        cfg = self.best.get(k)
        if cfg is None:
            cfg = self.best[k] = self.tune(f"{_device_name(args)}|{k}", launch, args)
        launch(cfg, args)

    def tune(self, k: str, launch: Launch, args: tuple) -> dict:
        stored = self.read().get(k)
        if stored in self.configs:
            return stored
        if isinstance(stored, dict) and stored.get("config") in self.configs and not quiet(torch.get_num_threads()):
            return stored["config"]  # chosen on a busy machine, which is busy still
        timing = _time(launch, self.configs, scratch_args(args, self.n_out), self.reps)
        self.timed += 1
        best = self.configs[min(timing.seconds, key=timing.seconds.__getitem__)] if timing.seconds else self.configs[0]
        if timing.contended:  # stored marked: a quiet process times it again
            log.info("fxforge: autotune %s: timed while the machine was busy (%s)", k, timing.describe())
        self.write({**self.read(), k: {"config": best, "contended": True} if timing.contended else best})
        return best

    def read(self) -> dict:
        try:
            with open(self.path(), encoding="utf-8") as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # missing or corrupt: tune again and rewrite

    def write(self, data: dict) -> None:
        """Store the choices (best effort: a file that cannot be written only costs a re-tune in
        the next process, never the launch)."""
        path = self.path()
        try:
            cache.atomic_write(path, json.dumps(data, indent=1, sort_keys=True))
        except OSError as e:
            log.debug("fxforge: could not write autotune choices to %s (%s)", path, e)
