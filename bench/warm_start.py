"""Warm starts: fxforge's backend time in a second process, against the first.

For each case (model, mode) three fresh processes run one step of the same seeded model on the
same inputs, compiled by fxforge (default Config), with one ``FXFORGE_CACHE_DIR`` made empty for
the case:

* ``cold``: nothing cached (every pass, plan and kernel build runs);
* ``kernels``: the graph cache off (``FXFORGE_GRAPH_CACHE=0``), the C kernels' shared objects
  cached by the first process: what a second process paid before the graph cache;
* ``warm``: both caches on: each graph is loaded from the graph cache.

Figures per process: fxforge's backend time (``compile_seconds`` summed over its graphs: the
load's time on a hit), the first step's wall time (Dynamo and AOTAutograd included), and whether
the outputs (training: the loss and every gradient) are bit-identical to the cold process's.

    python bench/warm_start.py [--models resnet gpt2-2l ...] [--modes inference train] [--tag warm-start]

writes ``bench/results/<tag>.json`` and ``.md`` (default models: ``corpus.FAMILIES``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# the processes compile as a user's do: C kernels built at -Og first where not cached
# (Config.tiered_builds; bench/measure.py, imported here later, would turn it off)
os.environ.setdefault("FXFORGE_TIERED_BUILDS", "1")

CASE = r"""
import json, sys, time, torch
sys.path.insert(0, HERE)
import corpus, fxforge
torch.set_num_threads(1)
name, mode, out = sys.argv[1:4]
model = corpus.all_models()[name]
train = mode == "train"
m = model.build().train(train)
kw = model.inputs("cpu", train)
be = fxforge.backend(fxforge.Config())
f = torch.compile(m, backend=be)
def step():
    if train:
        for p in m.parameters():
            p.grad = None
        loss = model.loss(f(**kw))
        loss.backward()
        return [loss.detach()] + [p.grad for p in m.parameters() if p.grad is not None]
    with torch.no_grad():
        return [t for t in torch.utils._pytree.tree_leaves(model.output(f(**kw))) if isinstance(t, torch.Tensor)]
t0 = time.perf_counter()
step()
first = time.perf_counter() - t0
be.wait_for_kernels()  # (a cold process's first calls may run kernels built at -Og: Config.tiered_builds)
torch.save(step(), out)
print(json.dumps({"backend_s": sum(c.stats["compile_seconds"] for c in be.compiled), "first_call_s": first,
                  "graphs": [c.stats["graph_cache"] for c in be.compiled]}))
""".replace("HERE", repr(HERE))


def _process(name: str, mode: str, out: str, env: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", CASE, name, mode, out], capture_output=True, text=True, env=env,
                       timeout=1800)
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _identical(a: str, b: str) -> bool:
    import torch

    from measure import identical

    return identical(torch.load(a), torch.load(b))


def run_case(name: str, mode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="fxforge-warm-") as d:
        env = dict(os.environ, FXFORGE_CACHE_DIR=os.path.join(d, "cache"), FXFORGE_GRAPH_CACHE="1")
        case = {"model": name, "mode": mode}
        for run, extra in (("cold", {}), ("kernels", {"FXFORGE_GRAPH_CACHE": "0"}), ("warm", {})):
            case[run] = _process(name, mode, os.path.join(d, f"{run}.pt"), {**env, **extra})
        for run in ("kernels", "warm"):
            if "error" not in case[run] and "error" not in case["cold"]:
                case[run]["identical"] = _identical(os.path.join(d, "cold.pt"), os.path.join(d, f"{run}.pt"))
    if all("error" not in case[r] for r in ("cold", "kernels", "warm")):
        case["warm_over_cold"] = case["warm"]["backend_s"] / case["cold"]["backend_s"]
        case["warm_over_kernels"] = case["warm"]["backend_s"] / case["kernels"]["backend_s"]
    return case


def table(result: dict) -> str:
    m = result["machine"]
    lines = [
        "# Warm starts: fxforge's backend time in a second process",
        "",
        f"`{result['command']}`; {m['cpu']}, {m['cores']} cores, torch {m['torch']}, fxforge {m.get('fxforge_commit')}, "
        f"{m['date_utc']}, 1 thread. Each column a fresh process on one cache directory, empty for the case: cold "
        "(nothing cached), kernels (graph cache off, the C kernels cached), warm (each graph loaded from the graph cache).",
        "",
        "| model | mode | backend cold | backend kernels cached | backend warm | warm / cold | warm / kernels cached "
        "| first call cold | first call warm | warm graphs | bit-identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for c in result["cases"]:
        if "warm_over_cold" not in c:
            err = next(c[r]["error"] for r in ("cold", "kernels", "warm") if "error" in c[r])
            lines.append(f"| {c['model']} | {c['mode']} | error: {err.strip().splitlines()[-1][:120]} |")
            continue
        cold, kern, warm = c["cold"], c["kernels"], c["warm"]
        lines.append(
            f"| {c['model']} | {c['mode']} | {cold['backend_s']:.3f} s | {kern['backend_s']:.3f} s | "
            f"{warm['backend_s']:.3f} s | {c['warm_over_cold']:.3f}x | {c['warm_over_kernels']:.3f}x | "
            f"{cold['first_call_s']:.2f} s | {warm['first_call_s']:.2f} s | {', '.join(warm['graphs'])} | "
            f"{'yes' if warm['identical'] else 'NO'} |")
    ok = [c for c in result["cases"] if "warm_over_cold" in c]
    if ok:
        worst = max(ok, key=lambda c: c["warm_over_cold"])
        lines += ["", f"Furthest from the target: {worst['model']} {worst['mode']}, warm / cold "
                  f"{worst['warm_over_cold']:.3f}x (target: at most 0.1x, outputs bit-identical)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    sys.path.insert(0, HERE)
    import corpus
    from run import machine_info

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=corpus.FAMILIES)
    ap.add_argument("--modes", nargs="+", default=["inference", "train"], choices=["inference", "train"])
    ap.add_argument("--tag", default="warm-start")
    args = ap.parse_args(argv)
    models = corpus.all_models()
    result = {"command": "python bench/warm_start.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine_info("cpu"), "cases": []}
    out = os.path.join(HERE, "results", args.tag)
    for name in args.models:
        for mode in args.modes:
            if mode not in models[name].modes:
                continue
            result["cases"].append(run_case(name, mode))
            with open(out + ".json", "w") as f:
                json.dump(result, f, indent=1, default=str)
            with open(out + ".md", "w") as f:
                f.write(table(result))
            c = result["cases"][-1]
            print(name, mode, f"{c.get('warm_over_cold', float('nan')):.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
