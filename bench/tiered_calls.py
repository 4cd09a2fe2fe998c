"""Time per call of a graph's -Og kernels against its kernels built in full (tiered builds,
``Config.tiered_builds``): the synthetic graphs of ``bench/synthetic.py`` compiled in a fresh
kernel cache with the full builds held back, the median of 15 calls timed, then the full builds
let go, waited for, and 15 calls timed again.  One thread.

    python bench/tiered_calls.py [--graphs mixed pointwise] [--nodes 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
os.environ["FXFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="fxforge-tiered-calls-")

import torch  # noqa: E402

import fxforge  # noqa: E402
import synthetic  # noqa: E402
from fxforge.codegen.c import build  # noqa: E402
from fxforge.spine import compile_graph  # noqa: E402


def _median_call(c, example, calls: int = 15) -> float:
    c(*example)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        c(*example)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="+", default=["mixed", "pointwise"], choices=sorted(synthetic.GRAPHS))
    ap.add_argument("--nodes", type=int, default=10_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gate = threading.Event()
    full_build = build.shared_object

    def held_back(*a, **k):  # (the full builds wait until the -Og kernels are timed)
        if threading.current_thread().name.startswith(build.UPGRADE_THREADS):
            gate.wait()
        return full_build(*a, **k)

    build.shared_object = held_back
    for graph in args.graphs:
        gm, example = synthetic.GRAPHS[graph](args.nodes, seed=0)
        c = compile_graph(gm, fxforge.Config(tiered_builds=True), kind="synthetic", cache=False)
        first = _median_call(c, example)
        gate.set()
        c.wait_for_kernels()
        full = _median_call(c, example)
        gate.clear()
        print(f"{graph} {args.nodes}: {c.stats['tiered_kernels']} kernels built at -Og first; per call "
              f"{first * 1e3:.2f} ms at -Og, {full * 1e3:.2f} ms built in full ({first / full:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
