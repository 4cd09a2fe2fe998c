"""Where one step's time goes, fxforge against Inductor, op by op and kernel by kernel.

    python bench/breakdown.py --cases mobilenet:train vit-2l:train --threads 0 --tag breakdown
    python bench/breakdown.py --render bench/results/breakdown-16t.json   # the Markdown again

For each case (``model:mode``, models of ``corpus.py``) and thread count, fxforge and Inductor each
compile their own copy of the model, warm up, then run ``--steps`` steps timed (median) with the
process's minor page faults counted (``getrusage``: first touches of memory the allocator got fresh
from the kernel), then ``--steps`` steps under ``torch.profiler``.  Rows are the profiler's self CPU
time per step: fxforge's kernel ranges (``fxforge <graph> [c] ops``; a ``[torch]`` range's time is
in the ATen op under it), Inductor's kernels (``cpp.enable_kernel_profile``), the ATen ops both call,
and the compiled functions' own time (Python, allocation, what no range covers).  Rows are summed
into categories; the Markdown shows those side by side and each contender's largest rows.

Self times under the profiler add its overhead, so they add up to more than the timed median;
compare rows between contenders, not with the median.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import re
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import table  # noqa: E402  (bench/table.py)

LIBRARY = re.compile(r"aten::(mm|addmm|bmm|baddbmm|_?convolution\w*|mkldnn_\w+|_slow_conv\w+|linear|matmul)$")
WRAPPER = ("CompiledFunction", "CompiledFunctionBackward", "Torch-Compiled Region", "TorchDynamo Cache Lookup")
CATEGORIES = ("matmul and convolution (ATen)", "generated kernels", "other ATen ops", "compiled functions' own time",
              "other")


def category(key: str) -> str:
    if LIBRARY.match(key):
        return CATEGORIES[0]
    if re.match(r"fxforge \w+ \[(c|triton)\]", key) or "cpp_fused" in key:
        return CATEGORIES[1]
    if key.startswith("aten::"):
        return CATEGORIES[2]
    if key.startswith(WRAPPER) or key.startswith("## Call CompiledFxGraph") or key.startswith("fxforge "):
        return CATEGORIES[3]  # a [torch] range's self time is the Python around its ATen call
    return CATEGORIES[4]


def row_key(name: str) -> str:
    """A profiler row's name with graph and kernel numbers dropped: rows of one kind merge."""
    name = re.sub(r"(forward|backward|inference)-\d+ kernel\d+ ", r"\1 ", name)
    name = re.sub(r"^graph_\d+_cpp_fused_", "cpp_fused_", name)
    name = re.sub(r"^(cpp_fused_\w+?)_\d+$", r"\1", name)
    name = re.sub(r"^## Call CompiledFxGraph \w+ ##$", "## Call CompiledFxGraph ##", name)
    return name[:110]


def measure_case(name: str, mode: str, steps: int) -> dict:
    import torch
    import torch._inductor.config as ic
    from torch.profiler import profile

    import corpus
    import fxforge
    from run import _step

    if hasattr(ic, "cpp") and hasattr(ic.cpp, "enable_kernel_profile"):
        ic.cpp.enable_kernel_profile = True
    model = corpus.all_models()[name]
    train = mode == "train"
    torch.manual_seed(0)
    base = model.build()
    base.train(train)
    kw = model.inputs("cpu", train)
    run, _ = _step(model, kw, train)
    out = {}
    for contender in ("fxforge", "inductor"):
        torch._dynamo.reset()
        backend = fxforge.backend(fxforge.Config(progress=False)) if contender == "fxforge" else "inductor"
        m = torch.compile(copy.deepcopy(base), backend=backend)
        for _ in range(3):
            run(m)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            run(m)
            times.append(time.perf_counter() - t0)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps
        with profile() as prof:
            for _ in range(steps):
                run(m)
        rows: collections.Counter = collections.Counter()
        for e in prof.key_averages():
            rows[row_key(e.key)] += e.self_cpu_time_total / steps / 1000.0
        out[contender] = {"median_ms": statistics.median(times) * 1000, "faults_per_step": faults,
                          "rows": dict(rows)}
        print(f"  {name} {mode} {contender}: {out[contender]['median_ms']:.2f} ms, {faults:.0f} faults/step",
              flush=True)
        del m
    return out


def markdown(results: dict, top: int = 12) -> str:
    meta = results.get("meta", {})
    lines = ["# Where a step's time goes: fxforge against Inductor", ""]
    if meta:
        lines += [f"- date: {meta.get('date_utc')}; command: `{meta.get('command')}`",
                  f"- machine: {meta.get('cpu')}, {meta.get('cores')} cores, torch threads {meta.get('torch_threads')}; "
                  f"torch {meta.get('torch')}, fxforge {meta.get('fxforge_commit')}{table.allocator_note(meta)}", ""]
    lines += ["Self CPU time per step under torch.profiler (ms; the profiler's overhead included, so "
              "compare contenders row by row, not with the timed median). Faults: minor page faults "
              "per step, first touches of memory fresh from the kernel. How it is measured: "
              "`bench/breakdown.py`.", ""]
    for case, res in results["cases"].items():
        lines += [f"## {case}", ""]
        names = [c for c in ("fxforge", "inductor") if c in res]
        lines += ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        lines.append("| timed median (ms) | " + " | ".join(f"{res[c]['median_ms']:.2f}" for c in names) + " |")
        lines.append("| minor faults per step | " + " | ".join(f"{res[c]['faults_per_step']:.0f}" for c in names) + " |")
        for cat in CATEGORIES:
            vals = [sum(v for k, v in res[c]["rows"].items() if category(k) == cat) for c in names]
            lines.append(f"| {cat} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
        lines.append("")
        for c in names:
            lines += [f"{c}, largest rows:", "", "| ms | row |", "|---:|---|"]
            for k, v in sorted(res[c]["rows"].items(), key=lambda kv: -kv[1])[:top]:
                lines.append(f"| {v:.3f} | `{k}` |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["mobilenet:train", "vit-2l:train"], metavar="MODEL:MODE")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: the machine's default)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--tag", default="breakdown")
    ap.add_argument("--render", metavar="JSON", help="write the Markdown of a results file and stop")
    args = ap.parse_args(argv)
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
        return 0
    import torch

    from run import machine_info

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python bench/breakdown.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results = {"meta": {**machine_info("cpu"), "command": command}, "cases": {}}
    for case in args.cases:
        name, _, mode = case.partition(":")
        results["cases"][f"{name} {mode or 'train'} ({torch.get_num_threads()}t)"] = measure_case(
            name, mode or "train", args.steps
        )
        (out / f"{args.tag}.json").write_text(json.dumps(results, indent=1))
        (out / f"{args.tag}.md").write_text(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
