"""A case's ratios measured again in several fresh processes, to tell the case's own ratio from
the state of one process.

    python bench/recheck.py --cases mobilenet:inference phi-2l:train --threads 1 0 --processes 5 --tag recheck
    python bench/recheck.py --render bench/results/recheck.json   # the Markdown again

``run.py`` measures every case once, in a fresh process.  Some cases' times depend on that
process: where the allocator placed the weights and buffers (the convolution library's speed
depends on it).  Both contenders move, not always together, so one process's ratio can be far
from the case's.  Here each (case, thread count) runs ``--processes`` times, each in a fresh
process as ``run.py`` runs it (``run.case_in_process``: eager, fxforge and Inductor timed with
calls interleaved).  The table gives each process's fxforge / Inductor ratio and their median;
the times are medians over processes of each process's median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import table  # noqa: E402  (bench/table.py)

CONTENDERS = ("eager", "fxforge", "inductor")


def recheck(case: str, threads: int, processes: int, calls: int, budget_s: float) -> dict:
    """``processes`` fresh processes' medians of ``case`` at ``threads``."""
    from run import case_in_process

    name, _, mode = case.partition(":")
    opts = SimpleNamespace(contenders=list(CONTENDERS), calls=calls, budget=budget_s, partitioners=False,
                           debug=False, gpu=False)
    runs = []
    for _ in range(processes):
        c = case_in_process(opts, name, mode or "train", threads)
        if c["errors"]:
            raise RuntimeError(f"{case} at {threads} threads: {c['errors']}")
        times = {k: c["contenders"][k]["time"] for k in CONTENDERS}
        runs.append({**{k: t["median_s"] for k, t in times.items()}, "threads": c["threads"],
                     "faults": {k: t.get("faults") for k, t in times.items()}})
    ratios = [r["fxforge"] / r["inductor"] for r in runs]
    return {"threads": runs[0]["threads"], "runs": runs, "ratios": ratios,
            "median_ms": {c: statistics.median(r[c] for r in runs) * 1000 for c in CONTENDERS},
            "median_ratio": statistics.median(ratios),
            "median_ratio_eager": statistics.median(r["fxforge"] / r["eager"] for r in runs)}


def markdown(results: dict) -> str:
    m = results["meta"]
    lines = ["# One case, several processes: fxforge against Inductor", "",
             f"- date: {m['date_utc']}; command: `{m['command']}`",
             f"- machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, fxforge {m.get('fxforge_commit')}"
             f"{table.allocator_note(m)}",
             "", "Each row: the case in fresh processes, eager, fxforge and Inductor interleaved in each "
             "(`bench/recheck.py`). Times: median over processes of each process's median call (ms). "
             "Faults: each process's median minor page faults per call (first writes to memory fresh "
             "from the kernel), eager / fxforge / Inductor.", "",
             "| case | eager | fxforge | Inductor | fxforge/Inductor (median) | fxforge/Inductor per process | "
             "fxforge/eager (median) | faults per call, per process |",
             "|---|---:|---:|---:|---:|---|---:|---|"]
    for key, r in results["cases"].items():
        t = r["median_ms"]
        lines.append(f"| {key} | {t['eager']:.2f} | {t['fxforge']:.2f} | {t['inductor']:.2f} | "
                     f"{r['median_ratio']:.2f}x | {', '.join(f'{x:.2f}' for x in r['ratios'])} | "
                     f"{r['median_ratio_eager']:.2f}x | "
                     f"{'; '.join(_faults(x) for x in r['runs']) if any(x.get('faults') for x in r['runs']) else '—'} |")
    return "\n".join(lines) + "\n"


def _faults(run: dict) -> str:
    f = run.get("faults") or {}
    return " / ".join("—" if f.get(k) is None else f"{f[k]:.0f}" for k in CONTENDERS)


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
    args = ap.parse_args(argv)
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
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
