"""Distributed training steps: what overlapping and bucketing the collectives buys, on gloo ranks.

Each case (model, parallelism, ranks) partitions one training step with ``fxforge.partition``
(``bench/dist_models.py``: FSDP, every parameter stored ``Shard(0)`` and gathered whole before
use, ``compute_placements``; or FSDP + Megatron TP on a 2 x 2 mesh) and runs these contenders
on the same per-rank program, interleaved step by step:

* ``fxforge-off``: fxforge with ``comm_overlap=False, bucket_bytes=0`` (the collectives as
  traced, each waited for at once);
* ``fxforge-bucketed``: buckets, no overlap (the same collectives as ``fxforge``, each waited for
  at once: what they cost when nothing hides them);
* ``fxforge``: the defaults (buckets of ``Config.bucket_bytes``, overlap within
  ``Config.prefetch_peak_growth``);
* ``inductor``: TorchInductor's ``compile_fx`` on the same per-rank graph (its defaults; where a
  rank dies running it, the case is run again with Inductor's buffer reuse off,
  ``INDUCTOR_TRIES`` times in all, then without it);
* ``eager``: that per-rank graph run by torch op by op (the collectives as traced).

Per contender: the median step time (each step's time is the slowest rank's, after a barrier),
the collectives a step issues, the per-rank peak (bytes allocated in one step,
``measure.peak_bytes``, and the arenas fxforge keeps between calls), and the communication a step
waits for: the time spent in ``wait_tensor`` (the median of ``PROFILED`` profiled steps, each the
slowest rank's).  ``exposed`` is fxforge's wait time over ``fxforge-bucketed``'s (the same
collectives, none hidden).  Every contender's loss is checked against eager on one process.

The **simulator** (``bench/comm_sim.py``) replays every rank's profiled ``fxforge`` step together:
their measured compute between collectives, each collective started when the last rank issued
it, under the link as the run found it: the model fitted at the start of the case
(``costs.calibrate``, what the compile's buckets were cut for) scaled so that the
``fxforge-bucketed`` steps profiled beside it (the same collectives, each waited for at once)
replay to the waits they measured (``comm_sim.fit_link``).  Its predicted wait is compared with
the measured one; the prediction under the unscaled model is kept beside it.

    python bench/distributed.py [--models gpt llama] [--cases fsdp:2 fsdp:4 fsdp_tp:4] \
        [--link 1gbit|loopback] [--steps 6] [--bucket-bytes N ...] [--tag distributed]

``--link 1gbit`` runs everything inside a network namespace whose loopback is limited to
1 Gbit/s (``bench/ranks.py``).  Writes ``bench/results/<tag>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from ranks import limited_link, link_name, on_ranks  # noqa: E402

CONTENDERS = ("fxforge-off", "fxforge-bucketed", "fxforge", "inductor", "eager")
PROFILED = 5  # profiled steps per contender (interleaved): the wait reported is their median


def _configs(buckets=()):
    """The contenders' Configs; ``buckets``: also fxforge's defaults at each of these
    ``bucket_bytes`` (contender ``fxforge@<n>``, ``--bucket-bytes``)."""
    import fxforge

    return {"fxforge-off": fxforge.Config(comm_overlap=False, bucket_bytes=0),
            "fxforge-bucketed": fxforge.Config(comm_overlap=False),
            "fxforge": fxforge.Config(),
            **{f"fxforge@{n}": fxforge.Config(bucket_bytes=n) for n in buckets}}


def run_case(rank: int, world: int) -> dict:
    """On every rank: compile each contender, check its loss, time interleaved steps, profile one."""
    import faulthandler

    faulthandler.enable()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.export.experimental import _export_forward_backward

    import fxforge
    import fxforge.entry.spmd as spmd
    from dist_models import batch, build, compute_placements, placements
    from fxforge.core.costs import calibrate
    from fxforge.core.dtensor import local_shard
    from measure import fresh_inductor, identical, peak_bytes

    case = json.loads(os.environ["FXFORGE_BENCH_CASE"])
    parallel, steps = case["parallel"], case["steps"]
    mesh = init_device_mesh("cpu", (world,) if parallel == "fsdp" else (world // 2, 2),
                            mesh_dim_names=("dp",) if parallel == "fsdp" else ("dp", "tp"))
    link = calibrate(name=link_name())
    dp = world if parallel == "fsdp" else world // 2
    torch.manual_seed(0)
    model = build(case["model"])
    idx, tgt = batch(case["batch"] * dp)
    ref = model(idx, tgt).item()
    joint = _export_forward_backward(torch.export.export(model, (idx, tgt)))
    pl, gathered = placements(model, parallel), compute_placements(model, parallel)
    shards = tuple(local_shard(t, mesh, pl[n]) for n, t in (("idx", idx), ("targets", tgt)))

    captured = []
    compile_graph = spmd.compile_graph

    def capture(gm, config, **kw):  # the per-rank graph, before fxforge's passes change it
        if not captured:
            captured.append(copy.deepcopy(gm))
        return compile_graph(gm, config, **kw)

    spmd.compile_graph = capture
    steps_fn, out = {}, {}
    try:
        for name, config in _configs(case.get("buckets", ())).items():
            if name not in case["contenders"]:
                continue
            config = config.replace(comm_model=link)
            t0 = time.perf_counter()
            p = fxforge.partition(joint, mesh, pl, config=config, compute_placements=gathered)
            seconds = time.perf_counter() - t0
            comm = p.stats["comm"]
            steps_fn[name] = (lambda p=p: p(*shards))
            out[name] = {"compile_s": seconds, "collectives": comm["count"], "bytes": comm["bytes"],
                         "estimated_s": comm["estimated_s"], "estimated_exposed_s": comm["exposed_s"],
                         "order_digest": comm["order_digest"], "schedule": _comm_schedule(p),
                         "kept_bytes": p.stats.get("kept_arena_bytes", 0),
                         "planned_peak": p.compiled.plan.memory.peak_bytes}
    finally:
        spmd.compile_graph = compile_graph
    graph_args = _graph_args(p, shards)
    if "eager" in case["contenders"]:
        steps_fn["eager"] = lambda: captured[0](*graph_args)
        out["eager"] = {"compile_s": 0.0, "collectives": _count(captured[0])}
    if "inductor" in case["contenders"]:
        with fresh_inductor():
            import torch._inductor.config as inductor_config
            from torch._inductor.compile_fx import compile_fx

            t0 = time.perf_counter()
            with inductor_config.patch(case.get("inductor_config", {})):
                ind = compile_fx(captured[0], list(graph_args))
            seconds = time.perf_counter() - t0
        steps_fn["inductor"] = lambda: ind(*graph_args)
        out["inductor"] = {"compile_s": seconds, "collectives": _count(captured[0])}
    first = {}
    for name, fn in steps_fn.items():
        result = fn()
        first[name] = result
        out[name]["loss_error"] = abs(_loss(result) - ref)
    for name, result in first.items():  # bit for bit what the collectives as traced give
        out[name]["same_as_off"] = identical(result, first["fxforge-off"]) if "fxforge-off" in first else None
    times = {name: [] for name in steps_fn}
    for _ in range(steps):
        for name, fn in steps_fn.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    for name, fn in steps_fn.items():
        out[name]["step_s"] = times[name]
        dist.barrier()
        out[name]["peak_bytes"] = peak_bytes(fn)["peak_bytes"]
        out[name]["traces"], out[name]["waits"] = [], []
    for _ in range(PROFILED):  # (interleaved, as the timed steps are)
        for name, fn in steps_fn.items():
            dist.barrier()
            trace, wait = _profile(fn)
            out[name]["traces"].append(trace)
            out[name]["waits"].append(wait)
    return {"contenders": out, "link": {"name": link.name, "alpha_s": link.alpha_s, "beta_s_per_byte": link.beta_s_per_byte,
                                        "reduce_scatter_as_all_reduce": link.reduce_scatter_as_all_reduce},
            "params": sum(p.numel() for p in model.parameters()), "tensors": len(list(model.parameters())),
            "reference_loss": ref}


def _loss(result) -> float:
    """The loss of a step's result: ``(loss, grads)`` from ``Partitioned``, or the compiled
    graph's outputs (the loss first)."""
    v = result[0]
    return float(v.detach().reshape(-1)[0])


def _graph_args(p, shards) -> list:
    """The per-rank graph's arguments as ``Partitioned`` passes them."""
    from torch.export.graph_signature import InputKind

    user = iter(shards)
    return [next(user) if i.kind == InputKind.USER_INPUT else p.state[i.name] for i in p.inputs]


def _count(gm) -> int:
    from fxforge.core.collectives import is_collective

    return sum(1 for n in gm.graph.nodes if is_collective(n))


def _comm_schedule(p) -> list:
    """The schedule's collectives and waits in order: ("issue", kind, ranks, bytes) / ("wait", k)."""
    from fxforge.core.collectives import collective_bytes, group_size_of, is_collective, is_wait, waited_collective

    seen, rows = {}, []
    for n in p.compiled.plan.schedule:
        if is_collective(n):
            kind, sent = collective_bytes(n)
            seen[n] = len(seen)
            rows.append(("issue", kind, group_size_of(n), sent))
        elif is_wait(n) and waited_collective(n) in seen:
            rows.append(("wait", seen[waited_collective(n)]))
    return rows


def _profile(fn) -> tuple[list, float]:
    """One step's top-level operations on this thread, in order: (name, start_us, duration_us);
    and the seconds spent in ``wait_tensor`` (at any depth: Inductor's calls sit inside its graph's
    range)."""
    from torch.profiler import ProfilerActivity, profile

    from comm_sim import WAIT

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.events()
    top = sorted((e for e in events if e.cpu_parent is None and e.thread == events[0].thread),
                 key=lambda e: e.time_range.start)
    wait = sum(e.time_range.elapsed_us() for e in events if e.name == WAIT) * 1e-6
    return [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in top], wait


# --------------------------------------------------------------------------- driver


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["gpt", "llama"])
    ap.add_argument("--cases", nargs="+", default=["fsdp:2", "fsdp:4", "fsdp_tp:4"])
    ap.add_argument("--link", default="1gbit", help="1gbit (a rate-limited namespace), or loopback")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    ap.add_argument("--bucket-bytes", nargs="+", type=int, default=[],
                    help="also run fxforge at each of these Config.bucket_bytes (contenders fxforge@<n>)")
    ap.add_argument("--batch", type=int, default=16, help="sequences of 128 tokens per data-parallel rank")
    ap.add_argument("--simulate", type=int, nargs="*", default=None,
                    help="instead: predict the exposed communication at these world sizes (bench/comm_sim.py)")
    ap.add_argument("--tag", default="distributed")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if args.simulate is not None:
        return simulate_worlds(args)
    if args.link != "loopback":
        rc = limited_link(args.link)
        if rc is not None:
            return rc
    path = os.path.join(args.out, f"{args.tag}.json")
    data = _with_command(json.load(open(path)) if os.path.exists(path) else {"cases": []})
    from comm_sim import fit_link

    for model in args.models:
        for spec in args.cases:
            parallel, world = spec.split(":")
            case = {"model": model, "parallel": parallel, "world": int(world), "steps": args.steps, "batch": args.batch,
                    "contenders": args.contenders + [f"fxforge@{n}" for n in args.bucket_bytes],
                    "buckets": args.bucket_bytes}
            os.environ["FXFORGE_BENCH_CASE"] = json.dumps(case)
            t0 = time.perf_counter()
            ranks, case, failed = _run_with_inductor_retries(case, int(world), f"{model} {spec}")
            row = {**case, "link": link_name(), "wall_s": time.perf_counter() - t0, "params": ranks[0]["params"],
                   "inductor_failed": "; ".join(failed) or None,
                   "inductor_tries": len(failed) + ("inductor" in case["contenders"]),
                   "tensors": ranks[0]["tensors"],
                   "link_model": ranks[0]["link"], "contenders": {}}
            # the link as the run found it: the calibrated one scaled to the steps that wait for each collective at once
            bucketed = [r["contenders"]["fxforge-bucketed"] for r in ranks if "fxforge-bucketed" in r["contenders"]]
            fit = fit_link([[r["traces"][i] for r in bucketed] for i in range(PROFILED)], [r["schedule"] for r in bucketed],
                           ranks[0]["link"]) if bucketed else None
            row["link_fitted"] = dataclasses.asdict(fit) if fit is not None else None
            for name in ranks[0]["contenders"]:
                row["contenders"][name] = _summary([r["contenders"][name] for r in ranks], ranks[0]["link"], fit)
            data["cases"] = [x for x in data["cases"] if (x["model"], x["parallel"], x["world"], x["link"]) !=
                             (model, parallel, int(world), row["link"])] + [row]
            os.makedirs(args.out, exist_ok=True)
            with open(path, "w") as f:
                json.dump(data, f, indent=1)
            _print(row)
    write_md(path)
    return 0


# How many times a case runs with Inductor among its contenders before it runs without it, and
# what Inductor runs with after its defaults took the ranks down.  In the GPT cases a gloo rank
# running Inductor's code dies a few steps in on most runs with its defaults, and on fewer with its
# buffer reuse off (a corrupted heap, seen by malloc in one of gloo's worker threads running an
# all-gather while the program issued all its all-gathers at its start; or a segmentation fault).
INDUCTOR_TRIES = 3
INDUCTOR_RETRY_CONFIG = {"allow_buffer_reuse": False}


def _run_with_inductor_retries(case: dict, world: int, label: str) -> tuple[list[dict], dict, list[str]]:
    """The case on its ranks, again (up to ``INDUCTOR_TRIES`` in all, Inductor under
    ``INDUCTOR_RETRY_CONFIG`` after the first) while a rank dies with Inductor among the
    contenders, then without Inductor.  Returns the ranks' results, the case as run, and what took
    the ranks down on each failed try."""
    failed: list[str] = []
    while True:
        os.environ["FXFORGE_BENCH_CASE"] = json.dumps(case)
        try:
            return on_ranks(run_case, world), case, failed
        except AssertionError as e:  # a contender took its ranks down
            if "inductor" not in case["contenders"]:
                raise
            failed.append(_crash(str(e)))
            if len(failed) < INDUCTOR_TRIES:
                print(f"{label}: a rank failed with Inductor in the case ({failed[-1]}); again with {INDUCTOR_RETRY_CONFIG}",
                      flush=True)
                case = {**case, "inductor_config": INDUCTOR_RETRY_CONFIG}
            else:
                print(f"{label}: a rank failed with Inductor in the case ({failed[-1]}); again without it", flush=True)
                case = {k: v for k, v in case.items() if k != "inductor_config"}
                case["contenders"] = [c for c in case["contenders"] if c != "inductor"]


def _summary(per: list[dict], link: dict, fit) -> dict:
    """One contender's figures over its ranks; for fxforge's own, the simulator's wait of the
    median profiled step, under the link ``fit`` to the run (else the one calibrated at its start)
    and under the calibrated one."""
    from comm_sim import simulate_ranks

    steps = [max(r["step_s"][i] for r in per) for i in range(len(per[0]["step_s"]))]
    waits = [max(r["waits"][i] for r in per) for i in range(PROFILED)]  # each step's slowest rank's
    mid = sorted(range(PROFILED), key=waits.__getitem__)[PROFILED // 2]  # the median profiled step
    c = {"step_s": statistics.median(steps), "steps": steps, "collectives": per[0]["collectives"],
         "peak_bytes": max(r["peak_bytes"] for r in per), "wait_s": waits[mid], "waits": waits,
         "loss_error": max(r["loss_error"] for r in per), "compile_s": max(r["compile_s"] for r in per),
         "same_as_off": all(r["same_as_off"] for r in per) if per[0]["same_as_off"] is not None else None}
    if "kept_bytes" in per[0]:
        c["kept_bytes"] = max(r["kept_bytes"] for r in per)
        c["planned_peak"] = max(r["planned_peak"] or 0 for r in per)
    if "order_digest" in per[0]:
        c["same_order"] = len({r["order_digest"] for r in per}) == 1
        c["estimated_s"] = per[0]["estimated_s"]
        for key, model in (("simulated", fit if fit is not None else link), ("simulated_calibrated", link)):
            sims = simulate_ranks([r["traces"][mid] for r in per], [r["schedule"] for r in per], model)
            c[f"{key}_wait_s"] = max(s["wait_s"] for s in sims)
            c[f"{key}_comm_s"] = max(s["comm_s"] for s in sims)
            c[f"{key}_matched"] = all(s["matched"] for s in sims)
    return c


def simulate_worlds(args) -> int:
    """Predicted exposed communication at ``args.simulate`` world sizes, under the presets and the
    1 Gbit/s link fitted on two ranks, with this machine's measured compute (one thread)."""
    from comm_sim import predict
    from fxforge.core.costs import COMM_PRESETS

    torch.set_num_threads(1)
    links = {k: COMM_PRESETS[k] for k in ("loopback-1gbit", "ethernet-100g", "infiniband", "nvlink")}
    path = os.path.join(args.out, f"{args.tag}-simulated.json")
    rows = json.load(open(path)) if os.path.exists(path) else []
    for model in args.models:
        for spec in args.cases:
            parallel = spec.split(":")[0]
            for world in args.simulate:
                r = {"model": model, "parallel": parallel, "batch": args.batch,
                     **predict(model, parallel, world, args.batch, links)}
                rows = [x for x in rows if (x["model"], x["parallel"], x["world"], x["batch"]) !=
                        (model, parallel, world, args.batch)] + [r]
                with open(path, "w") as f:
                    json.dump(rows, f, indent=1)
                print(f"{model} {parallel} x{world}: compute {r['compute_s'] * 1e3:.0f} ms, " + ", ".join(
                    f"{k} comm {v['comm_s'] * 1e3:.0f} ms exposed {v['wait_s'] * 1e3:.0f} ms"
                    for k, v in r["links"].items()), flush=True)
    main_path = os.path.join(args.out, f"{args.tag}.json")
    if os.path.exists(main_path):
        with open(main_path) as f:
            data = _with_command(json.load(f))
        with open(main_path, "w") as f:
            json.dump(data, f, indent=1)
    write_md(main_path)
    return 0


def _with_command(data: dict) -> dict:
    """``data`` with this run's command last among those that made its results."""
    command = "python bench/distributed.py " + " ".join(sys.argv[1:])
    data["commands"] = [c for c in data.get("commands", []) if c != command] + [command]
    return data


def _crash(text: str) -> str:
    """What took a rank down, in a few words (the error's first line, or its signal)."""
    for line in text.splitlines():
        if "exit code -" in line:
            return line.strip(" -")
    return text.splitlines()[-1][:160] if text else "unknown"


def _print(row: dict) -> None:
    off = row["contenders"].get("fxforge-off")  # (absent: not among the contenders run)
    print(f"{row['model']} {row['parallel']} x{row['world']} ({row['link']}): " + ", ".join(
        f"{n} {c['step_s'] * 1e3:.0f} ms ({_ratio(c, off) + 'x, ' if off else ''}wait {c['wait_s'] * 1e3:.0f} ms, "
        f"{c['collectives']} coll, sim {c.get('simulated_wait_s', 0) * 1e3:.0f} ms)"
        for n, c in row["contenders"].items()), flush=True)


def _ratio(c: dict, base: dict | None) -> str:
    """``c``'s step time over ``base``'s, or "" where that contender was not run."""
    return f"{c['step_s'] / base['step_s']:.2f}" if base else ""


def _rank_peak(c: dict) -> int:
    """A contender's per-rank peak: what one step allocates at most at once, and the arenas fxforge
    keeps between calls (none for eager and Inductor)."""
    return c["peak_bytes"] + (c.get("kept_bytes") or 0)


def _vs(c: dict, ind: dict | None, row: dict) -> str:
    """``c``'s step over Inductor's, saying where Inductor's ranks crashed on a try (or on every one)."""
    if ind and row.get("inductor_failed"):
        return f"{c['step_s'] / ind['step_s']:.2f} (try {row['inductor_tries']}, Inductor with " \
               f"{row.get('inductor_config', {})}; before: {row['inductor_failed']})"
    if ind:
        return f"{c['step_s'] / ind['step_s']:.2f}"
    return f"Inductor's ranks crashed: {row['inductor_failed']}" if row.get("inductor_failed") else ""


def _sim_ratio(c: dict) -> str:
    """Simulated over measured wait: under the link scaled in the run (the unscaled one's in brackets)."""
    fitted = f"{c.get('simulated_wait_s', 0) / c['wait_s']:.2f}"
    if "simulated_calibrated_wait_s" not in c:
        return fitted
    return f"{fitted} ({c['simulated_calibrated_wait_s'] / c['wait_s']:.2f} unscaled)"


def _bucket_md(data: dict) -> list[str]:
    """Per case run with ``--bucket-bytes``: each bucket size's collectives, step and wait."""
    rows = []
    for r in data["cases"]:
        off = r["contenders"].get("fxforge-off")
        sizes = sorted((int(k.split("@")[1]), c) for k, c in r["contenders"].items() if k.startswith("fxforge@"))
        for n, c in sizes:
            rows.append(f"| {r['model']} | {r['parallel']} | {r['world']} | {n / 2**20:g} | {c['collectives']} | "
                        f"{2 * r.get('tensors', 0) / c['collectives']:.1f}x | {c['step_s'] * 1e3:.0f} | "
                        f"{_ratio(c, off)} | {c['wait_s'] * 1e3:.0f} | {c['peak_bytes'] / 2**20:.1f} | "
                        f"{'yes' if c.get('same_as_off') else '**no**'} |")
    if not rows:
        return []
    return ["", "## Bucket size (`--bucket-bytes`)", "",
            "fxforge's defaults (overlap on) at each `Config.bucket_bytes`; fewer: one per parameter and gradient "
            "over the collectives a step issues.", "",
            "| model | parallel | ranks | bucket MiB | collectives | fewer | step (ms) | vs fxforge-off | wait (ms) | "
            "peak MiB | bit-equal to off |", "|---|---|---|---|---|---|---|---|---|---|---|", *rows]


def write_md(path: str) -> None:
    data = json.load(open(path)) if os.path.exists(path) else {"cases": []}
    made = " then ".join(f"`{c}`" for c in data.get("commands", [])) or "`python bench/distributed.py --link 1gbit`"
    lines = ["# Distributed training steps (bench/distributed.py)", "",
             f"{made} on this machine: 2 cores, gloo ranks of one thread each, the ranks' loopback limited to 1 Gbit/s in a "
             "network namespace (shared by all ranks). `fxforge.partition` of one training step "
             "(`bench/dist_models.py`), `batch` sequences of 128 tokens per data-parallel rank. Step: median over "
             "the steps of the slowest rank's time. Peak: the rank's bytes at most at once in one step: "
             "those allocated during the step (`measure.peak_bytes`) and fxforge's arenas, kept between calls "
             f"(`kept_arena_bytes`). Wait: time in `wait_tensor`, the median of {PROFILED} profiled steps (each the slowest "
             "rank's). "
             "Exposed: fxforge's wait over fxforge-bucketed's (the same collectives, each waited for at once). "
             "Simulated: `bench/comm_sim.py` replaying every rank's profiled fxforge step together (a collective "
             "starts when the last rank has issued it), the collectives under the model `costs.calibrate` fitted at "
             "the start of the case, scaled so that the fxforge-bucketed steps profiled beside it (the same "
             "collectives, each waited for at once) replay to the waits they measured (`comm_sim.fit_link`); in "
             "brackets, unscaled (rows run before the scaling existed have the unscaled figure alone). "
             "`*`: Inductor's ranks died on an earlier try of the case, and Inductor ran with its buffer reuse "
             "off (the targets table says how).", "",
             "| model | parallel | ranks | batch | contender | step (ms) | vs fxforge-off | vs inductor | vs eager | "
             "collectives | peak MiB | wait (ms) | exposed | simulated wait (ms) | loss error | bit-equal to off |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["cases"]:
        cs = r["contenders"]
        off, bucketed, ind, eager = cs.get("fxforge-off"), cs.get("fxforge-bucketed"), cs.get("inductor"), cs.get("eager")
        for name, c in cs.items():
            exposed = f"{c['wait_s'] / bucketed['wait_s']:.0%}" if name == "fxforge" and bucketed and bucketed["wait_s"] \
                else ""
            sim = f"{c['simulated_wait_s'] * 1e3:.0f}" if name == "fxforge" and "simulated_wait_s" in c else ""
            vs_ind = f"{c['step_s'] / ind['step_s']:.2f}{'*' if r.get('inductor_failed') else ''}" if ind else (
                "(Inductor crashed)" if r.get("inductor_failed") else "")
            vs_eager = f"{c['step_s'] / eager['step_s']:.2f}" if eager else ""
            same = "" if name in ("inductor", "eager") else {True: "yes", False: "**no**", None: ""}[c.get("same_as_off")]
            lines.append(f"| {r['model']} | {r['parallel']} | {r['world']} | {r.get('batch', '')} | {name} | "
                         f"{c['step_s'] * 1e3:.0f} | {_ratio(c, off)} | {vs_ind} | {vs_eager} | "
                         f"{c['collectives']} | "
                         f"{_rank_peak(c) / 2**20:.1f} | {c['wait_s'] * 1e3:.0f} | {exposed} | {sim} | "
                         f"{c['loss_error']:.1e} | {same} |")
    lines += ["", "## Targets", "",
              "| model | parallel | ranks | exposed (target <= 25%) | step vs overlap off (<= 0.8) | vs inductor (<= 1.0) | "
              "collectives: one per parameter and gradient / bucketed (>= 5x) | peak vs no prefetch (fxforge-bucketed, <= 1.1) | "
              "simulated / measured wait (within 20%) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data["cases"]:
        cs = r["contenders"]
        on, off, b, ind = cs.get("fxforge"), cs.get("fxforge-off"), cs.get("fxforge-bucketed"), cs.get("inductor")
        per_param = 2 * r.get("tensors", 0)
        lines.append(f"| {r['model']} | {r['parallel']} | {r['world']} | "
                     f"{on['wait_s'] / b['wait_s']:.0%} | {_ratio(on, off)} | "
                     f"{_vs(on, ind, r)} | {per_param} / {on['collectives']} = "
                     f"{per_param / on['collectives']:.1f}x (as traced: {off['collectives']}, "
                     f"{off['collectives'] / on['collectives']:.1f}x) | {_rank_peak(on) / _rank_peak(b):.2f} | "
                     f"{_sim_ratio(on)} |" if on and off and b and on["wait_s"] else
                     f"| {r['model']} | {r['parallel']} | {r['world']} | (incomplete) |")
    lines += _bucket_md(data)
    sim_path = path[:-5] + "-simulated.json"
    if os.path.exists(sim_path):
        rows = json.load(open(sim_path))
        links = list(rows[0]["links"]) if rows else []
        lines += ["", "## Predicted at more ranks (simulator)", "",
                  "Each rank's part compiled for N ranks (its buckets cut for `loopback-1gbit`) against torch's "
                  "fake process group, run and profiled here "
                  "(one thread: its compute is this machine's), the collectives replayed under the link's model "
                  "(`fxforge.core.costs.COMM_PRESETS`; `loopback-1gbit` is the 1 Gbit/s link as measured per rank "
                  "with two ranks). Exposed communication (ms) / the collectives' time (ms):", "",
                  "| model | parallel | ranks | batch | collectives | MB sent | planned peak, prefetch / none | compute (ms) | "
                  + " | ".join(links) + " |",
                  "|---|---|---|---|---|---|---|---|" + "---|" * len(links)]
        for r in rows:
            lines.append(f"| {r['model']} | {r['parallel']} | {r['world']} | {r['batch']} | {r['collectives']} | "
                         f"{r['bytes'] / 1e6:.1f} | {r['planned_peak'] / r['planned_peak_no_prefetch']:.2f} | "
                         f"{r['compute_s'] * 1e3:.0f} | " + " | ".join(
                             f"{r['links'][k]['wait_s'] * 1e3:.0f} / {r['links'][k]['comm_s'] * 1e3:.0f}" for k in links)
                         + " |")
    with open(path[:-5] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
