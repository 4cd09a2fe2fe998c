"""A case's ratios measured again in several fresh processes, to tell the case's own ratio from
the state of one process.

    python bench/recheck.py --cases mobilenet:inference phi-2l:train --threads 1 0 --processes 5 --tag recheck
    python bench/recheck.py --render bench/results/recheck.json   # the Markdown again

``run.py`` measures every case once, in one process.  Some cases' times depend on that process:
where the allocator placed the weights and buffers (the convolution library's speed depends on
it), what earlier cases left in the heap.  Both contenders move, not always together, so one
process's ratio can be far from the case's.  Here each (case, thread count) runs in
``--processes`` fresh processes; each builds the model, compiles it with fxforge and with
Inductor, warms up, and times eager, fxforge and Inductor with calls interleaved
(``measure.interleaved_medians``).  The table gives each process's fxforge / Inductor ratio and
their median; the times are medians over processes of each process's median.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONTENDERS = ("eager", "fxforge", "inductor")


def measure_once(case: str, calls: int, budget_s: float) -> dict:
    """One process's median seconds per call of each contender on ``case`` (``model:mode``)."""
    import torch

    import corpus
    import fxforge
    import measure
    from run import _step

    name, _, mode = case.partition(":")
    train = (mode or "train") == "train"
    model = corpus.all_models()[name]
    base = model.build()
    base.train(train)
    kw = model.inputs("cpu", train)
    run, _ = _step(model, kw, train)
    models = {"eager": base,
              "fxforge": torch.compile(copy.deepcopy(base), backend=fxforge.backend(fxforge.Config(progress=False))),
              "inductor": torch.compile(copy.deepcopy(base), backend="inductor")}
    for m in models.values():  # (compiles)
        run(m)
    res = measure.interleaved_medians({c: (lambda m=m: run(m)) for c, m in models.items()}, calls=calls,
                                      budget_s=budget_s, warmup=2)
    return {c: r["median_s"] for c, r in res.items()}


def recheck(case: str, threads: int, processes: int, calls: int, budget_s: float) -> dict:
    """``processes`` fresh processes' medians (``measure_once``) of ``case`` at ``threads``."""
    runs = []
    for _ in range(processes):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", case, "--threads", str(threads),
               "--calls", str(calls), "--budget", str(budget_s)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=str(HERE.parent))
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    ratios = [r["fxforge"] / r["inductor"] for r in runs]
    return {"threads": runs[0]["threads"], "runs": runs, "ratios": ratios,
            "median_ms": {c: statistics.median(r[c] for r in runs) * 1000 for c in CONTENDERS},
            "median_ratio": statistics.median(ratios),
            "median_ratio_eager": statistics.median(r["fxforge"] / r["eager"] for r in runs)}


def markdown(results: dict) -> str:
    m = results["meta"]
    lines = ["# One case, several processes: fxforge against Inductor", "",
             f"- date: {m['date_utc']}; command: `{m['command']}`",
             f"- machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, fxforge {m.get('fxforge_commit')}",
             "", "Each row: the case in fresh processes, eager, fxforge and Inductor interleaved in each "
             "(`bench/recheck.py`). Times: median over processes of each process's median call (ms).", "",
             "| case | eager | fxforge | Inductor | fxforge/Inductor (median) | fxforge/Inductor per process | "
             "fxforge/eager (median) |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for key, r in results["cases"].items():
        t = r["median_ms"]
        lines.append(f"| {key} | {t['eager']:.2f} | {t['fxforge']:.2f} | {t['inductor']:.2f} | "
                     f"{r['median_ratio']:.2f}x | {', '.join(f'{x:.2f}' for x in r['ratios'])} | "
                     f"{r['median_ratio_eager']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["mobilenet:inference"], metavar="MODEL:MODE")
    ap.add_argument("--threads", nargs="+", type=int, default=[0],
                    help="torch intra-op threads, one run per value (0: the machine's default)")
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="most interleaved rounds per process")
    ap.add_argument("--budget", type=float, default=15.0, help="seconds of timed rounds per process (at least 5 rounds)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--tag", default="recheck")
    ap.add_argument("--render", metavar="JSON", help="write the Markdown of a results file and stop")
    ap.add_argument("--one", metavar="MODEL:MODE", help=argparse.SUPPRESS)  # (a child process: one measurement)
    args = ap.parse_args(argv)
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
        return 0
    import torch

    if args.one:
        if args.threads[0] > 0:
            torch.set_num_threads(args.threads[0])
        medians = measure_once(args.one, args.calls, args.budget)
        print(json.dumps({**medians, "threads": torch.get_num_threads()}))
        return 0
    from run import machine_info

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python bench/recheck.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results = {"meta": {**machine_info("cpu"), "command": command}, "cases": {}}
    for threads in args.threads:
        for case in args.cases:
            name, _, mode = case.partition(":")
            r = recheck(case, threads, args.processes, args.calls, args.budget)
            key = f"{name} {mode or 'train'} ({r['threads']}t)"
            results["cases"][key] = r
            print(f"  {key}: fxforge/Inductor {r['median_ratio']:.2f}x "
                  f"({', '.join(f'{x:.2f}' for x in r['ratios'])})", flush=True)
            (out / f"{args.tag}.json").write_text(json.dumps(results, indent=1))
            (out / f"{args.tag}.md").write_text(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
