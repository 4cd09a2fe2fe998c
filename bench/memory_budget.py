"""Training under a memory budget: fxforge's ``Config(memory_budget=f)`` beside Inductor's
``activation_memory_budget``, per model, as (measured step peak, step time) points.

For each model (training, CPU; each model in a process of its own): eager once (the reference
loss and gradients); fxforge with no budget (its default step peak, the base of the fractions)
and at each ``--budgets`` fraction;
Inductor at each ``--inductor-budgets`` value of ``torch._functorch.config.activation_memory_budget``.
Per point: the measured step peak (``measure.peak_bytes``, allocation events, plus what fxforge's
graphs hold between calls), the median step time, the first call's time (compile included;
fxforge's the median of ``--first-calls`` rounds over its budgets in turn), the
largest gradient error against eager, or the error the compile raised (fxforge's
``MemoryBudgetError`` for a budget nothing meets).

Targets read from the points: each fxforge budget's measured peak within the bytes it resolved
to (``stats["memory_budget"]["budget_bytes"]``); its time against Inductor's point with the
least measured peak at or above fxforge's (the geomean of those ratios); the 0.6 budget's time
over fxforge's unconstrained; the first call with a budget over the first call without, and
1 + the budget's own compile time (``stats["memory_budget"]["plan_seconds"]``, the median over the
rounds) over the first call without: what the budget adds, without the rest of a first call's
swings on a busy machine.

    python bench/memory_budget.py [--models gpt2 llama bert vit resnet] [--threads 2] [--tag memory-budget]

writes ``bench/results/<tag>.json``, ``.md`` and ``.svg`` (the memory/time picture).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import corpus  # noqa: E402
import measure  # noqa: E402
import table  # noqa: E402

MODELS = ("gpt2", "llama", "bert", "vit", "resnet")
VOCAB = 8192  # a small tokenizer's: the logits do not dwarf the activations


def models(args) -> dict[str, corpus.Model]:
    """The bench's training families at sizes where saved activations dominate the step: text
    models of ``--layers`` layers, hidden 384, vocabulary 8192, ``--batch`` x ``--seq`` tokens
    (GPT-2 and BERT with their dropout on); ViT-style on 224-pixel images and a ResNet-style CNN
    on 64-pixel ones, ``--image-batch`` images."""
    import transformers as tf

    layers, hidden, heads = args.layers, 384, 6

    def text(name, make, cls):
        def build():
            torch.manual_seed(0)
            c = make()
            c.use_cache = False
            try:
                return cls(c, attn_implementation="eager")
            except TypeError:
                return cls(c)

        def inputs(device, train):
            g = torch.Generator().manual_seed(1)
            ids = torch.randint(0, VOCAB, (args.batch, args.seq), generator=g)
            return {"input_ids": ids, "labels": ids}

        return corpus.Model(name, build, inputs, lambda out: out.loss, lambda out: out.logits, layers, hidden)

    out = {
        "gpt2": text("gpt2", lambda: tf.GPT2Config(vocab_size=VOCAB, n_layer=layers, n_embd=hidden, n_head=heads,
                                                   n_positions=args.seq), tf.GPT2LMHeadModel),
        "llama": text("llama", lambda: tf.LlamaConfig(vocab_size=VOCAB, num_hidden_layers=layers, hidden_size=hidden,
                                                      num_attention_heads=heads, num_key_value_heads=heads,
                                                      intermediate_size=1024, max_position_embeddings=args.seq),
                      tf.LlamaForCausalLM),
        "bert": text("bert", lambda: tf.BertConfig(vocab_size=VOCAB, num_hidden_layers=layers, hidden_size=hidden,
                                                   num_attention_heads=heads, intermediate_size=4 * hidden,
                                                   max_position_embeddings=args.seq), tf.BertForMaskedLM),
    }

    def vit():
        torch.manual_seed(0)
        c = tf.ViTConfig(image_size=224, patch_size=16, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=4 * hidden, num_labels=corpus.CLASSES)
        return tf.ViTForImageClassification(c)

    def images(size):
        def inputs(device, train):
            return {"pixel_values": corpus._images(args.image_batch, size, device),
                    "labels": corpus._labels(args.image_batch, device)}
        return inputs

    out["vit"] = corpus.Model("vit", vit, images(224), lambda o: o.loss, lambda o: o.logits, layers, hidden)
    out["resnet"] = corpus.all_models()["resnet"]  # (its batch: corpus.IMAGE_BATCH, set by main)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--budgets", nargs="+", type=float, default=[0.8, 0.6, 0.4])
    p.add_argument("--inductor-budgets", nargs="+", type=float, default=[1.0, 0.6, 0.3, 0.1])
    p.add_argument("--batch", type=int, default=4, help="text models' batch (sequence --seq)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--image-batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--first-calls", type=int, default=3,
                   help="fxforge's first calls per budget (interleaved; the median is reported)")
    p.add_argument("--time-budget", type=float, default=60.0, help="seconds of interleaved timing per model")
    p.add_argument("--tag", default="memory-budget")
    p.add_argument("--model-out", help=argparse.SUPPRESS)  # (a model's process writes its results here)
    p.add_argument("--update", action="store_true",
                   help="keep the other models' results of an earlier run with this tag (rerun only --models)")
    return p.parse_args(argv)


def _zero(m):
    for p in m.parameters():
        p.grad = None


def _grads(m):
    return [p.grad for p in m.parameters()]


def _first_call(model: torch.nn.Module, run) -> float:
    t0 = time.perf_counter()
    run(model)
    return time.perf_counter() - t0


def _plan_seconds(backend) -> float:
    """Seconds the budget took in the partitioner (``stats["memory_budget"]["plan_seconds"]``),
    over the compiled training graphs (one plan per forward and backward pair)."""
    return sum(c.stats["memory_budget"]["plan_seconds"] for c in backend.compiled
               if c.stats.get("memory_budget") and c.stats["graph"] == "forward")


def first_step(model: torch.nn.Module, run, ref_grads, backend=None) -> dict:
    """One contender's first call (compile included), gradient error, measured step peak."""
    out = {"first_call_s": _first_call(model, run), "grad_max_abs_err": measure.max_abs_err(_grads(model), ref_grads)}
    _zero(model)
    out["peak_bytes"] = measure.peak_bytes(lambda: run(model), "cpu")["peak_bytes"]
    if backend is not None:
        out["peak_bytes"] += sum(c.stats.get(k, 0) for c in backend.compiled
                                 for k in ("kept_arena_bytes", "symmetric_arena_bytes", "recycled_bytes"))
        out["backend_s"] = sum(c.stats["compile_seconds"] for c in backend.compiled)
        plans = [c.stats["memory_budget"] for c in backend.compiled
                 if c.stats.get("memory_budget") and c.stats["graph"] == "forward"]
        if plans:  # (with graph breaks: the largest graph's plan, the budget each graph had)
            out["planned_peak_bytes"] = max(p["planned_peak_bytes"] for p in plans)
            out["budget_bytes"] = max(p["budget_bytes"] for p in plans)
            out["saved_bytes"] = sum(p["saved_bytes"] for p in plans)
            out["recomputed"] = sum(len(p["recomputed"]) for p in plans)
            out["recomputed_flops"] = sum(p["recomputed_flops"] for p in plans)
    return out


def run_model(model: corpus.Model, args) -> dict:
    import fxforge
    import torch._inductor.config as inductor_config
    from torch._functorch import config as functorch_config

    base = model.build()
    base.train(True)
    kw = model.inputs("cpu", True)

    def run(m):
        torch.manual_seed(3)  # (the same dropout masks in every contender that draws them as eager does)
        loss = model.loss(m(**kw))
        loss.backward()
        return loss

    run(base)
    ref = _grads(base)
    res: dict = {"model": model.name, "params": sum(p.numel() for p in base.parameters()), "fxforge": {},
                 "inductor": {}, "errors": {}}
    live: dict[str, torch.nn.Module] = {}
    # fxforge's first calls: every budget in turn, --first-calls rounds; the median per budget
    # (one first call is one sample of a noisy machine; the first round also pays what the
    # process does once). The first round's compiled models are the ones measured after.
    for r in range(args.first_calls):
        for budget in [None, *args.budgets]:
            key = "none" if budget is None else str(budget)
            if f"fxforge {key}" in res["errors"]:
                continue
            torch._dynamo.reset()
            b = fxforge.backend(fxforge.Config(memory_budget=budget))
            m = torch.compile(copy.deepcopy(base), backend=b)
            try:
                with measure.fresh_fxforge():
                    if r == 0:
                        res["fxforge"][key] = first_step(m, run, ref, b)
                        res["fxforge"][key]["first_calls_s"] = [res["fxforge"][key].pop("first_call_s")]
                        live[f"fxforge {key}"] = m
                    else:
                        res["fxforge"][key]["first_calls_s"].append(_first_call(m, run))
                    if budget is not None:
                        res["fxforge"][key].setdefault("plans_s", []).append(_plan_seconds(b))
            except Exception as e:
                res["errors"][f"fxforge {key}"] = f"{type(e).__name__}: {str(e)[:600]}"
    for point in res["fxforge"].values():
        point["first_call_s"] = statistics.median(point["first_calls_s"])
        if point.get("plans_s"):
            point["plan_s"] = statistics.median(point["plans_s"])
    for budget in args.inductor_budgets:
        key = str(budget)
        torch._dynamo.reset()
        m = torch.compile(copy.deepcopy(base), backend="inductor")
        try:
            # (fallback_random: Inductor draws dropout masks as eager does, so its gradients compare)
            with measure.fresh_inductor(), functorch_config.patch(activation_memory_budget=budget), \
                    inductor_config.patch(fallback_random=True):
                res["inductor"][key] = first_step(m, run, ref)
            live[f"inductor {key}"] = m
        except Exception as e:
            res["errors"][f"inductor {key}"] = f"{type(e).__name__}: {str(e)[:600]}"
    # step times: every live contender, interleaved (a busy machine slows them alike)
    times = measure.interleaved_medians({k: (lambda m=m: (_zero(m), run(m))) for k, m in live.items()},
                                        calls=args.calls, budget_s=args.time_budget)
    for k, t in times.items():
        who, key = k.split()
        res[who][key].update(median_s=t["median_s"], p25_s=t["p25_s"], p75_s=t["p75_s"])
    res["targets"] = targets(res, args.budgets)
    return res


def targets(res: dict, budgets) -> dict:
    fx, ind = res["fxforge"], res["inductor"]
    base = fx.get("none")
    out: dict = {"within_budget": {}, "vs_inductor": {}}
    if not base:
        return out
    for f in budgets:
        p = fx.get(str(f))
        if p is None:
            continue
        out["within_budget"][str(f)] = p["peak_bytes"] <= p.get("budget_bytes", f * base["peak_bytes"])
        above = [q for q in ind.values() if q["peak_bytes"] >= p["peak_bytes"]]
        if above:
            q = min(above, key=lambda q: q["peak_bytes"])
            out["vs_inductor"][str(f)] = p["median_s"] / q["median_s"]
    if "0.6" in fx:
        out["overhead_0.6"] = fx["0.6"]["median_s"] / base["median_s"]
    firsts = [fx[str(f)]["first_call_s"] / base["first_call_s"] for f in budgets if str(f) in fx]
    out["first_call_ratio"] = max(firsts) if firsts else None
    # what the budget's own work adds (the partitioner's plans and choices, measured in the compile:
    # the first call's other parts are the compile's and vary from call to call on a busy machine)
    planning = [fx[str(f)]["plan_s"] / base["first_call_s"] for f in budgets if "plan_s" in fx.get(str(f), {})]
    out["planning_ratio"] = 1 + max(planning) if planning else None
    return out


def markdown(results: list[dict], args) -> str:
    lines = [f"# Memory budgets (training, CPU, {args.threads or torch.get_num_threads()} threads)", "",
             "`python bench/memory_budget.py`" + (" (then `" + " ".join(sys.argv[1:]) + "`)" if args.update else ""),
             "",
             "Peaks are measured (allocation events of one step plus bytes fxforge's graphs hold); "
             "fxforge's budgets are fractions of its own unconstrained measured peak. fxforge's first call "
             f"is the median of {args.first_calls} (its budgets compiled in turn, {args.first_calls} rounds).", "",
             "| model | contender | budget | peak MiB | peak / fxforge default | budget MiB | step ms | first call s "
             "| grad err | recomputed |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        base = r["fxforge"].get("none", {}).get("peak_bytes")
        for who in ("fxforge", "inductor"):
            for key, p in r[who].items():
                rel = f"{p['peak_bytes'] / base:.2f}" if base else "-"
                lines.append(f"| {r['model']} | {who} | {key} | {table._mib(p['peak_bytes'])} | {rel} | "
                             f"{table._mib(p.get('budget_bytes'))} | "
                             f"{p['median_s'] * 1e3:.1f} | {p['first_call_s']:.1f} | {p['grad_max_abs_err']:.1e} | "
                             f"{p.get('recomputed', '')} |")
        for k, e in r["errors"].items():
            why = e.split("MemoryBudgetError: ")[-1].split(". At that peak")[0] if "MemoryBudgetError" in e else e
            lines.append(f"| {r['model']} | {k.split()[0]} | {k.split()[1]} | raised: {why.splitlines()[0][:220]} |"
                         " | | | | | |")
    lines += ["", "## Targets", "", "| model | measured peak within budget | time / Inductor at >= peak | "
              "0.6 time / default | first call with budget / without (max) | 1 + budget's planning / first call "
              "without (max) |", "|---|---|---|---|---|---|"]
    vs, over = [], []
    for r in results:
        t = r["targets"]
        vs += list(t.get("vs_inductor", {}).values())
        if t.get("overhead_0.6"):
            over.append(t["overhead_0.6"])
        lines.append(f"| {r['model']} | {t.get('within_budget')} | "
                     f"{ {k: round(v, 2) for k, v in t.get('vs_inductor', {}).items()} } | "
                     f"{t.get('overhead_0.6', float('nan')):.2f} | {t.get('first_call_ratio') or float('nan'):.2f} | "
                     f"{t.get('planning_ratio') or float('nan'):.2f} |")
    lines += ["", f"Geomean time / Inductor: {table.geomean(vs) or float('nan'):.2f} (target <= 0.95); "
              f"geomean 0.6 overhead: {table.geomean(over) or float('nan'):.2f} (target <= 1.15)."]
    return "\n".join(lines) + "\n"


def svg(results: list[dict]) -> str:
    """One panel per model: step time (y) against measured peak (x), fxforge and Inductor."""
    w, h, pad = 300, 220, 40
    panels = []
    for i, r in enumerate(results):
        pts = {who: sorted((p["peak_bytes"], p["median_s"], k) for k, p in r[who].items())
               for who in ("fxforge", "inductor")}
        allp = [x for v in pts.values() for x in v]
        if not allp:
            continue
        x0, x1 = 0, max(p[0] for p in allp) * 1.05
        y0, y1 = 0, max(p[1] for p in allp) * 1.15
        ox = (i % 3) * (w + 20)
        oy = (i // 3) * (h + 30)

        def sx(v):
            return ox + pad + (v - x0) / (x1 - x0) * (w - pad - 10)

        def sy(v):
            return oy + h - pad + 10 - (v - y0) / (y1 - y0) * (h - pad - 10)

        g = [f'<text x="{ox + w / 2}" y="{oy + 14}" text-anchor="middle" font-size="12">{r["model"]}</text>',
             f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(x1)}" y2="{sy(0)}" stroke="#444"/>',
             f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(0)}" y2="{sy(y1)}" stroke="#444"/>',
             f'<text x="{sx(x1 / 2)}" y="{sy(0) + 28}" text-anchor="middle" font-size="10">'
             f'step peak, MiB (max {x1 / 2 ** 20:.0f})</text>',
             f'<text x="{ox + 10}" y="{sy(y1 / 2)}" font-size="10" transform="rotate(-90 {ox + 10} {sy(y1 / 2)})">'
             f'step ms (max {y1 * 1e3:.0f})</text>']
        for who, color in (("fxforge", "#1f77b4"), ("inductor", "#d62728")):
            ps = pts[who]
            if len(ps) > 1:
                line = " ".join(f"{sx(a)},{sy(b)}" for a, b, _ in ps)
                g.append(f'<polyline fill="none" stroke="{color}" points="{line}"/>')
            for a, b, k in ps:
                g.append(f'<circle cx="{sx(a)}" cy="{sy(b)}" r="3" fill="{color}"><title>{who} {k}: '
                         f'{a / 2 ** 20:.1f} MiB, {b * 1e3:.1f} ms</title></circle>')
                g.append(f'<text x="{sx(a) + 4}" y="{sy(b) - 4}" font-size="8" fill="{color}">{k}</text>')
        panels.append("\n".join(g))
    rows = (len(results) + 2) // 3
    legend = ('<text x="10" y="%d" font-size="11"><tspan fill="#1f77b4">fxforge memory_budget</tspan>  '
              '<tspan fill="#d62728">Inductor activation_memory_budget</tspan> (labels: the knob\'s value)</text>'
              % (rows * (h + 30) + 10))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{3 * (w + 20)}" height="{rows * (h + 30) + 20}" '
            f'font-family="sans-serif">\n' + "\n".join(panels) + "\n" + legend + "\n</svg>\n")


def _in_own_process(name: str, argv: list[str]) -> dict:
    """``run_model`` for model ``name`` in a new process, as a user's first call meets it (a
    process that compiled other models first makes a budgeted first call slower than a fresh
    one does)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fxforge-memory-budget-") as d:
        path = os.path.join(d, f"{name}.json")
        subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--models", name, "--model-out", path],
                       check=True)
        with open(path) as f:
            return json.load(f)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus.IMAGE_BATCH = args.image_batch
    if args.model_out:  # (one model, in a process of its own: ``_in_own_process``)
        (name,) = args.models
        try:
            with open(args.model_out, "w") as f:
                json.dump(run_model(models(args)[name], args), f)
        finally:
            for d in measure.SCRATCH_DIRS:  # the cold-compile cache dirs
                shutil.rmtree(d, ignore_errors=True)
        return 0
    results = []
    for name in args.models:
        print(f"== {name}", flush=True)
        r = _in_own_process(name, sys.argv[1:] if argv is None else list(argv))
        print(json.dumps(r["targets"]), r["errors"], flush=True)
        results.append(r)
    out = os.path.join(HERE, "results", args.tag)
    if args.update and os.path.exists(out + ".json"):
        with open(out + ".json") as f:
            earlier = json.load(f)["results"]
        rerun = {r["model"]: r for r in results}
        results = [rerun.pop(r["model"], r) for r in earlier] + list(rerun.values())
    with open(out + ".json", "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(markdown(results, args))
    with open(out + ".svg", "w") as f:
        f.write(svg(results))
    print(open(out + ".md").read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
