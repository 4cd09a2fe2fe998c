"""Timing candidates so that a choice made while the machine is busy is the one a quiet machine
would make, or is known not to be.

``time_candidates`` calls the candidates interleaved (each round calls every one once, starting
at a rotated position) and keeps each one's *minimum* over the rounds: a call that another
process delayed is only ever slower, so the fastest round is the closest to the candidate's own
cost, where a median moves with the load.

It also says whether the machine was **contended** while it timed, from CPU time against wall
time:

* each call's own thread: a call whose thread ran for less than ``QUIET_CPU_SHARE`` of its wall
  time was descheduled (or waited for a descheduled worker thread).  Where more than
  ``MAX_DESCHEDULED_SHARE`` of the calls were, the timing was contended;
* the other processes on this process's CPUs (Linux ``/proc/stat``, which counts the hypervisor's
  steal time too), over a timing of at least ``LOAD_MIN_WINDOW_S``: the CPU time spent there,
  less this process's own, is contention where it leaves the calls' threads (``threads``, torch's
  intra-op count) fewer CPUs than they use, by more than ``MAX_OTHER_LOAD`` CPUs on average.

A contended timing is retried (up to ``ATTEMPTS`` times in all, the minima kept across attempts).
A choice still contended is stored marked so, and a later compile re-times it where the machine
is quiet by then (``quiet``): a busy first compile never leaves a choice that sticks.

Timings of CUDA work are taken by the caller with events; this module times host calls.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

QUIET_CPU_SHARE = 0.8
MAX_DESCHEDULED_SHARE = 0.2
LOAD_MIN_WINDOW_S = 0.05
MAX_OTHER_LOAD = 0.3
ATTEMPTS = 3


@dataclass(frozen=True)
class Budget:
    """How long one timing may take: ``rounds`` at most, and once ``min_rounds`` ran, no more
    after ``seconds`` of timing."""

    rounds: int = 30
    min_rounds: int = 5
    seconds: float = 1.0


@dataclass(frozen=True)
class Timing:
    """Each candidate's least seconds per call, and what was seen of the machine meanwhile."""

    seconds: dict[str, float]
    calls: int  # timed calls, all candidates
    descheduled: int  # of them, the calls whose thread ran under QUIET_CPU_SHARE of their wall time
    other_load: float | None  # CPUs the other processes used on average; None where unknown
    attempts: int
    threads: int = 1  # the threads the calls ran on

    @property
    def contended(self) -> bool:
        return self.descheduled > MAX_DESCHEDULED_SHARE * self.calls or _crowded(self.other_load, self.threads)

    def describe(self) -> str:
        load = "" if self.other_load is None else f", other processes {self.other_load:.2f} CPUs"
        return f"{self.descheduled} of {self.calls} calls descheduled{load}, {self.attempts} attempt(s)"


def _busy_cpu_seconds() -> float | None:
    """CPU seconds spent on this process's CPUs so far, by anyone (None off Linux)."""
    try:
        cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        busy = 0
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *ticks = line.split()
                if name in cpus:
                    v = [int(t) for t in ticks]
                    busy += sum(v) - v[3] - v[4]  # all but idle and iowait (steal counts: the host ran)
        return busy / os.sysconf("SC_CLK_TCK")
    except (AttributeError, OSError, ValueError, IndexError):
        return None


def _crowded(other_load: float | None, threads: int) -> bool:
    """Whether other processes using ``other_load`` CPUs left fewer than ``threads`` free."""
    if other_load is None:
        return False
    spare = len(os.sched_getaffinity(0)) - threads if hasattr(os, "sched_getaffinity") else 0
    return other_load > max(0, spare) + MAX_OTHER_LOAD


class _Load:
    """Watches the CPU time other processes spend on this process's CPUs from its start."""

    def __init__(self):
        self.busy, self.own, self.start = _busy_cpu_seconds(), time.process_time(), time.perf_counter()

    def window(self) -> float:
        return time.perf_counter() - self.start

    def others(self) -> float | None:
        """CPUs the other processes used on average since the start; None where unknown."""
        busy = _busy_cpu_seconds()
        if self.busy is None or busy is None:
            return None
        return max(0.0, busy - self.busy - (time.process_time() - self.own)) / self.window()


def quiet(threads: int, window_s: float = LOAD_MIN_WINDOW_S) -> bool:
    """Whether the other processes leave ``threads`` CPUs free now (watched for ``window_s``,
    this process idle meanwhile); True where the load cannot be read (then a stored contended
    choice is re-timed: the safe side)."""
    load = _Load()
    time.sleep(window_s)
    others = load.others()
    return others is None or not _crowded(others, threads)


def _one_attempt(calls: Mapping[str, Callable[[], Any]], budget: Budget) -> tuple[dict[str, float], int, int, float | None]:
    names = list(calls)
    best = {n: float("inf") for n in names}
    count = descheduled = 0
    load = _Load()
    for r in range(budget.rounds):
        if r >= budget.min_rounds and load.window() > budget.seconds:
            break
        for n in names[r % len(names):] + names[:r % len(names)]:
            c0 = time.thread_time()
            t0 = time.perf_counter()
            calls[n]()
            wall = time.perf_counter() - t0
            cpu = time.thread_time() - c0
            best[n] = min(best[n], wall)
            count += 1
            descheduled += cpu < QUIET_CPU_SHARE * wall
    others = load.others() if load.window() >= LOAD_MIN_WINDOW_S else None
    return best, count, descheduled, others


def time_candidates(calls: Mapping[str, Callable[[], Any]], budget: Budget = Budget(), threads: int = 1,
                    attempts: int = ATTEMPTS, host: bool = True) -> Timing:
    """Least seconds per call of each of ``calls`` (after one warm-up call each), interleaved;
    retried while contended, ``attempts`` times at most.  ``threads``: how many threads a call
    runs on.  ``host=False``: the calls wait on a device, so their threads' CPU time says nothing
    of the load, and no contention is judged."""
    for fn in calls.values():
        fn()
    best = {n: float("inf") for n in calls}
    timing = None
    for a in range(1, attempts + 1):
        seconds, count, descheduled, load = _one_attempt(calls, budget)
        if not host:
            descheduled, load = 0, None
        best = {n: min(best[n], s) for n, s in seconds.items()}
        timing = Timing(dict(best), count, descheduled, load, a, threads)
        if not timing.contended:
            break
    assert timing is not None
    return timing
