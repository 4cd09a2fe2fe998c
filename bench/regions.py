"""Regional compilation: a GPT whose blocks are ``torch.compiler.nested_compile_region``s against
the same GPT without, both through fxforge.

For each case (layers, mode, threads) both models are compiled cold (a fresh
``FXFORGE_CACHE_DIR`` each, dynamo reset) on the same seeded weights, checked against eager
(output or loss, and every gradient), then timed interleaved in one process.  Figures: the first
call, fxforge's backend time (``compile_seconds`` summed over its graphs, the regions' bodies
included), fallback nodes (and those that are ``invoke_subgraph`` calls), and the median time
per call.

    python bench/regions.py [--layers 12 32] [--modes train inference] [--threads 1 0] \
        [--calls 20] [--budget 30] [--tag regions]

writes ``bench/results/<tag>.json`` and ``.md`` (threads 0: all cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import fxforge  # noqa: E402
from fxforge.core.graph import region_body  # noqa: E402
from fxforge.entry.demo import GPT, GPTConfig  # noqa: E402
# the first call is timed as users see it: the C kernels built at -Og first where not cached
# (Config.tiered_builds); the timed calls wait for their full builds.  FXFORGE_TIERED_BUILDS=0: off.
os.environ.setdefault("FXFORGE_TIERED_BUILDS", "1")
from measure import fresh_fxforge, interleaved_medians, max_abs_err  # noqa: E402
from run import machine_info  # noqa: E402

VOCAB, SEQ, BATCH, D, HEADS = 512, 128, 2, 256, 4


def _inputs():
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return idx, torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def _step(model, train: bool):
    idx, tgt = _inputs()

    def run():
        if train:
            for p in model.parameters():
                p.grad = None
            loss = model(idx, tgt)
            loss.backward()
            return [loss.detach()] + [p.grad for p in model.parameters()]
        with torch.no_grad():
            return [model(idx)]
    return run


def _compiled(layers: int, regions: bool, train: bool) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=VOCAB, seq=SEQ, d=D, heads=HEADS, layers=layers, regions=regions)).train(train)
    be = fxforge.backend(fxforge.Config())
    step = _step(torch.compile(model, backend=be), train)
    with fresh_fxforge():
        t0 = time.perf_counter()
        out = step()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        be.wait_for_kernels()  # (the calls timed run the kernels built in full)
        full_build_wait = time.perf_counter() - t0
    graphs = be.compiled
    hop_fallbacks = sum(1 for c in graphs for name in c.stats["fallbacks"]
                        if any(n.name == name and region_body(n) is not None for n in c.graph.graph.nodes))
    return {"step": step, "out": out, "first_call_s": first, "full_build_wait_s": full_build_wait,
            "tiered_kernels": sum(c.stats["tiered_kernels"] for c in graphs),
            "backend_s": sum(c.stats["compile_seconds"] for c in graphs),
            "graphs": [{"graph": c.stats["graph"], "nodes_in": c.stats["nodes_in"], "kernels": c.stats["kernels"],
                        "fallback_nodes": c.stats["fallback_nodes"], "regions": c.stats["regions"]} for c in graphs],
            "fallback_nodes": sum(c.stats["fallback_nodes"] for c in graphs), "invoke_subgraph_fallbacks": hop_fallbacks}


def run_case(layers: int, mode: str, threads: int, calls: int, budget: float) -> dict:
    torch.set_num_threads(threads or os.cpu_count())
    train = mode == "train"
    torch.manual_seed(0)
    eager = GPT(GPTConfig(vocab=VOCAB, seq=SEQ, d=D, heads=HEADS, layers=layers)).train(train)
    expected = _step(eager, train)()
    case = {"layers": layers, "mode": mode, "threads": torch.get_num_threads()}
    runs = {}
    for regions in (False, True):
        r = _compiled(layers, regions, train)
        r["max_abs_err"] = max(max_abs_err(a, b) for a, b in zip(r["out"], expected))
        runs["regions" if regions else "plain"] = r
    times = interleaved_medians({k: r["step"] for k, r in runs.items()}, calls=calls, budget_s=budget)
    for k, r in runs.items():
        case[k] = {key: v for key, v in r.items() if key not in ("step", "out")} | {"per_call": times[k]}
    case["backend_ratio"] = case["regions"]["backend_s"] / case["plain"]["backend_s"]
    case["first_call_ratio"] = case["regions"]["first_call_s"] / case["plain"]["first_call_s"]
    case["per_call_ratio"] = times["regions"]["median_s"] / times["plain"]["median_s"]
    return case


def table(result: dict) -> str:
    m = result["machine"]
    lines = [
        "# Regional compilation: GPT with and without `nested_compile_region`",
        "",
        f"`{result['command']}`; {m['cpu']}, {m['cores']} cores, torch {m['torch']}, fxforge {m.get('fxforge_commit')}, "
        f"{m['date_utc']}. GPT (fxforge.entry.demo) of d {D}, {HEADS} heads, vocab {VOCAB}, batch {BATCH}, seq {SEQ}; "
        "both models compiled cold (fresh kernel cache), checked against eager, then timed interleaved.",
        "",
        "| layers | mode | threads | backend plain | backend regions | ratio | first call plain | first call regions "
        "| per call plain | per call regions | ratio | fallbacks plain / regions (invoke_subgraph) | max err vs eager |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for c in result["cases"]:
        p, r = c["plain"], c["regions"]
        lines.append(
            f"| {c['layers']} | {c['mode']} | {c['threads']} | {p['backend_s']:.2f} s | {r['backend_s']:.2f} s | "
            f"{c['backend_ratio']:.2f}x | {p['first_call_s']:.2f} s | {r['first_call_s']:.2f} s | "
            f"{p['per_call']['median_s'] * 1e3:.1f} ms | {r['per_call']['median_s'] * 1e3:.1f} ms | "
            f"{c['per_call_ratio']:.3f}x | {p['fallback_nodes']} / {r['fallback_nodes']} ({r['invoke_subgraph_fallbacks']}) | "
            f"{max(p['max_abs_err'], r['max_abs_err']):.1e} |")
    lines += ["", "Targets (issue: regions): 0 `invoke_subgraph` fallbacks, per call within 1.03x of the model "
              "without regions, backend compile of the 32-layer GPT with regions at most 0.3x of without."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[12, 32])
    ap.add_argument("--modes", nargs="+", default=["train", "inference"], choices=["train", "inference"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--tag", default="regions")
    args = ap.parse_args(argv)
    result = {"command": "python bench/regions.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine_info("cpu"), "cases": []}
    out = os.path.join(HERE, "results", args.tag)
    for threads in args.threads:
        for layers in args.layers:
            for mode in args.modes:
                result["cases"].append(run_case(layers, mode, threads, args.calls, args.budget))
                with open(out + ".json", "w") as f:
                    json.dump(result, f, indent=1, default=str)
                with open(out + ".md", "w") as f:
                    f.write(table(result))
                c = result["cases"][-1]
                print(f"{layers} layers {mode} {c['threads']}t: backend {c['backend_ratio']:.2f}x, "
                      f"per call {c['per_call_ratio']:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
