"""Custom-op tuning on a busy machine: is the choice the one a quiet machine makes?

A custom op (a row norm followed by ``--copies`` copies of its result, as an op that wastes work
does) has one decomposition, the norm alone, which fxforge fuses into one kernel: it wins by
several times.  Each trial is a fresh process with a fresh cache that compiles a graph calling the
op and reports the winner, both times and whether the timing saw contention.  Trials run on a
quiet machine and with ``--busy`` processes spinning (one per busy core), at torch's default
thread count (all cores).

    python bench/tuning_load.py [--trials 10] [--busy 1 2] [--rows 16] [--d 1024] [--copies 2] \
        [--load spin|torch] [--tag tuning-under-load]

writes ``bench/results/<tag>.json`` and ``.md``.  ``PYTHONPATH`` decides which fxforge is
measured (an older checkout gives the figures before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

TRIAL = r"""
import json, os, sys, torch, fxforge

rows, d, copies = map(int, sys.argv[1:4])

@torch.library.custom_op("fxbench::norm_copies", mutates_args=())
def norm_copies(x: torch.Tensor) -> torch.Tensor:
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    for _ in range(copies):
        out = out.clone()
    return out

norm_copies.register_fake(lambda x: torch.empty_like(x))

def norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

fxforge.register_custom_op_autotuning(norm_copies, [fxforge.CustomOpConfig(norm)], min_speedup=1.0)
b = fxforge.backend(fxforge.Config(codegen="c"))
f = torch.compile(lambda x: norm_copies(x + 1) * 2, backend=b)
x = torch.randn(rows, d)
torch.testing.assert_close(f(x), norm(x + 1) * 2)
(rec,) = [r for c in b.compiled for r in c.stats["custom_ops"]]
print(json.dumps({"winner": rec["winner"], "candidates": rec["candidates"], "contended": rec.get("contended"),
                  "threads": torch.get_num_threads()}))
"""


LOADS = {
    "spin": "while True: pass",  # one thread spinning
    # another torch job: matmuls on one thread each, as a second training process pinned to a core would run
    "torch": "import torch; torch.set_num_threads(1); a = torch.randn(256, 256)\nwhile True: a = (a @ a).tanh()",
}


def trial(args, busy: int) -> dict:
    spinners = [subprocess.Popen([sys.executable, "-c", LOADS[args.load]]) for _ in range(busy)]
    try:
        time.sleep(0.2 if busy else 0)
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, FXFORGE_CACHE_DIR=cache)
            out = subprocess.run([sys.executable, "-c", TRIAL, str(args.rows), str(args.d), str(args.copies)],
                                 capture_output=True, text=True, env=env, timeout=600)
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def table(results: dict, args) -> str:
    lines = [
        "# Custom-op tuning on a busy machine",
        "",
        f"Command: `python bench/tuning_load.py --trials {args.trials} --busy {' '.join(map(str, args.busy))} --rows {args.rows} "
        f"--d {args.d} --copies {args.copies} --load {args.load}` ({os.cpu_count()} cores, torch's default thread count; "
        "each trial a fresh process and cache).",
        "",
        "| machine | trials | decomposition chosen | fallback | decomposition | fallback / decomposition | "
        "largest decomposition time | contended timings |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rs in results.items():
        def med(key):
            return statistics.median(r["candidates"][key] for r in rs)

        ratio = statistics.median(r["candidates"]["fallback"] / r["candidates"]["norm"] for r in rs)
        lines.append(f"| {name} | {len(rs)} | {sum(r['winner'] == 'norm' for r in rs)} | {med('fallback') * 1e6:.1f} us | "
                     f"{med('norm') * 1e6:.1f} us | {ratio:.1f}x | {max(r['candidates']['norm'] for r in rs) * 1e6:.1f} us | "
                     f"{sum(bool(r.get('contended')) for r in rs)} |")
    lines += ["", "Times: each trial's figure for the candidate as tuning measured it, the median over trials; "
              "the largest: the worst trial's."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--busy", type=int, nargs="+", default=[1], help="cores kept busy in the loaded trials (one run each)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--load", choices=sorted(LOADS), default="spin", help="what each busy core runs")
    ap.add_argument("--tag", default="tuning-under-load")
    args = ap.parse_args()
    results = {}
    for name, busy in (("quiet", 0), *((f"{n} core(s) busy", n) for n in args.busy)):
        results[name] = [trial(args, busy) for _ in range(args.trials)]
        print(name, [r["winner"] for r in results[name]], flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"{args.tag}.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = table(results, args)
    with open(os.path.join(HERE, "results", f"{args.tag}.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
