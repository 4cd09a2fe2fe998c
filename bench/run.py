"""fxforge benchmark suite: fxforge vs eager vs Inductor (and aot_eager for compile time),
measured in the same process, written as one JSON file and one Markdown table.

    python bench/run.py                      # the model families (`make bench`) at the machine's threads
    python bench/run.py --threads 1 0        # the same at 1 thread, then at all cores
    python bench/run.py --quick              # demo + 2-layer models, inference + training
    python bench/run.py --full               # + 12-layer models and the 100k-node synthetic graph
    python bench/run.py --models gpt2-2l bert-2l --modes inference --calls 20
    python bench/run.py --gpu                # CUDA, Config(codegen="triton"), + bench_gpu_kernels.py
    fxforge bench -- --quick                 # the same through the CLI (`make bench` = default)

See bench/README.md for what each figure means and how it is measured.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import torch  # noqa: E402

import corpus  # noqa: E402
import measure  # noqa: E402
import table  # noqa: E402

QUICK_MODELS = ["demo", "gpt2-2l", "llama-2l", "bert-2l"]
# `make bench`: one model of each family (bench/corpus.py).
DEFAULT_MODELS = corpus.FAMILIES
FULL_MODELS = QUICK_MODELS + ["gpt2-12l", "llama-12l", "bert-12l"]
CONTENDERS = ("eager", "fxforge", "inductor", "aot_eager")
STAT_SUMS = ("nodes_in", "kernels", "fused_nodes", "fallback_nodes", "arena_bytes", "lower_bound_bytes",
             "eager_live_peak_bytes", "schedule_peak_bytes", "arenas", "copy_bytes", "symmetric_arena_bytes",
             "kept_arena_bytes", "recycled_bytes", "compile_seconds")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="fxforge vs eager vs Inductor on real models (bench/README.md)")
    p.add_argument("--quick", action="store_true", help=f"models {' '.join(QUICK_MODELS)}; synthetic 1k, 10k")
    p.add_argument("--full", action="store_true", help="all models incl. every 12-layer one; synthetic up to 100k")
    p.add_argument("--models", nargs="*", metavar="NAME",
                   help=f"explicit model list, none for synthetic graphs only; 'holdout' names the held-out models "
                        f"(corpus.HOLDOUT) (any of: {', '.join(corpus.all_models())})")
    p.add_argument("--modes", nargs="+", choices=("inference", "train"), default=["inference", "train"])
    p.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS),
                   help="eager is always measured (it is the reference)")
    p.add_argument("--synthetic", nargs="*", type=int, metavar="N",
                   help="synthetic graph sizes (default 1000 10000; --full adds 100000; no value: none)")
    p.add_argument("--calls", type=int, default=30, help="most timed calls per contender (default 30)")
    p.add_argument("--budget", type=float, default=20.0, help="seconds one case's timing may take (default 20)")
    p.add_argument("--threads", type=int, nargs="+", default=[0],
                   help="torch intra-op threads for every contender; several values run every case at each "
                        "(default 0: torch's default, the machine's cores; e.g. --threads 1 0)")
    p.add_argument("--gpu", action="store_true", help="CUDA, Config(codegen='triton'), + bench/bench_gpu_kernels.py")
    p.add_argument("--out", default=str(HERE / "results"), help="output directory (default bench/results)")
    p.add_argument("--tag", default=None, help="file name stem (default: bench, bench-quick, bench-gpu, ...)")
    p.add_argument("--no-partitioners", dest="partitioners", action="store_false",
                   help="skip the partitioner comparison of training cases (a second fxforge compile with the "
                        "other AOTAutograd partitioner)")
    p.add_argument("--debug", action="store_true", help="Config(debug=True): verify between passes, raise on errors")
    p.add_argument("--processes", choices=("case", "one"), default="case",
                   help="case (default): each case (model, mode, thread count) in a fresh Python process, as a "
                        "user runs one model in a process, so no case's time depends on the heap and caches the "
                        "cases before it left; one: every case in this process")
    p.add_argument("--case-of", default=None, help=argparse.SUPPRESS)  # a parent's case run: no table, no GPU kernels
    return p.parse_args(argv)


def selected_models(args) -> list[str]:
    if args.models is not None:
        return [m for name in args.models for m in (corpus.HOLDOUT if name == "holdout" else [name])]
    return FULL_MODELS if args.full else QUICK_MODELS if args.quick else DEFAULT_MODELS


def selected_sizes(args) -> list[int]:
    if args.synthetic is not None:
        return args.synthetic
    return [1000, 10_000, 100_000] if args.full else [1000, 10_000]


# --------------------------------------------------------------------------------------------
# one case = one model, one mode (inference | train)


def _step(model: corpus.Model, kw: dict, train: bool):
    """The callable one timed call runs, and ``zero`` (grads to None) for the memory figure."""

    def zero(m):
        for p in m.parameters():
            p.grad = None

    def run(m, zero_grads=True):
        if train:
            if zero_grads:
                zero(m)
            loss = model.loss(m(**kw))
            loss.backward()
            return loss
        with torch.no_grad():
            return model.output(m(**kw))

    return run, zero


def _grads(m) -> list:
    return [p.grad for p in m.parameters()]


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_case(model: corpus.Model, mode: str, args, device: str) -> dict:
    import fxforge

    train = mode == "train"
    torch._dynamo.reset()
    base = model.build().to(device)
    base.train(train)
    kw = model.inputs(device, train)
    run, zero = _step(model, kw, train)
    case: dict[str, Any] = {"model": model.name, "mode": mode, "layers": model.layers, "hidden": model.hidden,
                            "params": sum(p.numel() for p in base.parameters()), "contenders": {}, "errors": {}}
    res = case["contenders"]
    models: dict[str, torch.nn.Module] = {"eager": base}

    ref = run(base)
    measure.sync(device)
    ref_grads = _grads(base) if train else None
    res["eager"] = {}

    def first_call(compiled: torch.nn.Module) -> dict:
        t0 = time.perf_counter()
        out = run(compiled)
        measure.sync(device)
        r = {"first_call_s": time.perf_counter() - t0, "max_abs_err": measure.max_abs_err(out, ref)}
        if train:
            r["grad_max_abs_err"] = measure.max_abs_err(_grads(compiled), ref_grads)
        return r

    # aot_eager first: dynamo + AOTAutograd with no backend compile.  It is not timed further, so
    # dynamo is reset after it.  fxforge and Inductor then compile on their own model copies and
    # stay live together: the interleaved timing needs both, and a reset would drop their code.
    if "aot_eager" in args.contenders:
        m = copy.deepcopy(base)
        try:
            res["aot_eager"] = first_call(torch.compile(m, backend="aot_eager"))
        except Exception as e:
            case["errors"]["aot_eager"] = _err(e)
        del m
        torch._dynamo.reset()

    # Partitioner comparison (training): fxforge with AOTAutograd's default partitioner on its own
    # copy, one step and one measured step, then a reset; the min-cut figures come from the main
    # fxforge run below (Config's default partitioner).
    if train and "fxforge" in args.contenders and args.partitioners:
        other = "default" if fxforge.Config().partitioner == "min_cut" else "min_cut"
        m = copy.deepcopy(base)
        try:
            b = fxforge.backend(fxforge.Config(codegen="triton" if device == "cuda" else "auto", partitioner=other))
            cm = torch.compile(m, backend=b)
            with measure.fresh_fxforge():  # its kernels must not warm the measured compile below
                run(cm)
            zero(cm)
            case["partitioners"] = {
                other: {**saved_figures(b), **fxforge_peak_bytes(b, lambda: run(cm, zero_grads=False), device)}
            }
        except Exception as e:
            case["errors"][f"partitioner {other}"] = _err(e)
        del m
        torch._dynamo.reset()

    backend = None
    if "fxforge" in args.contenders:
        cfg = fxforge.Config(codegen="triton" if device == "cuda" else "auto", debug=args.debug)
        backend = fxforge.backend(cfg)
        m = copy.deepcopy(base)
        try:
            cm = torch.compile(m, backend=backend)
            with measure.fresh_fxforge():
                res["fxforge"] = first_call(cm)
            res["fxforge"]["backend_s"] = sum(c.stats["compile_seconds"] for c in backend.compiled)
            models["fxforge"] = cm
        except Exception as e:
            case["errors"]["fxforge"] = _err(e)

    if "inductor" in args.contenders:
        m = copy.deepcopy(base)
        try:
            with measure.fresh_inductor():
                before = measure.inductor_metric("compile_fx_inner")
                cm = torch.compile(m, backend="inductor")
                res["inductor"] = first_call(cm)
                after = measure.inductor_metric("compile_fx_inner")
            res["inductor"]["backend_s"] = None if before is None else after - before
            models["inductor"] = cm
        except Exception as e:
            case["errors"]["inductor"] = _err(e)

    if backend is not None:
        case["fxforge"] = fxforge_figures(backend)

    # Time per call: all live contenders, interleaved, same inputs.
    graphs_before = _unique_graphs()
    timing = measure.interleaved_medians({n: (lambda m=m: run(m)) for n, m in models.items()},
                                         calls=args.calls, budget_s=args.budget, device=device)
    case["recompiled_during_timing"] = _unique_graphs() != graphs_before
    for n, t in timing.items():
        res[n].update(time=t)

    # Peak bytes during one (warm) call, the same method for all; grads dropped before, not during.
    for n, m in models.items():
        zero(m)
        try:
            res[n]["memory"] = (fxforge_peak_bytes(backend, lambda m=m: run(m, zero_grads=False), device)
                                if n == "fxforge" else measure.peak_bytes(lambda m=m: run(m, zero_grads=False), device))
        except Exception as e:
            case["errors"][f"{n} memory"] = _err(e)
    if backend is not None:
        case["fxforge"]["failed_at_run_time"] = [r for c in backend.compiled for r in c.failures]
        if "partitioners" in case and res.get("fxforge", {}).get("memory"):
            case["partitioners"][backend.config.partitioner] = {**saved_figures(backend), **res["fxforge"]["memory"]}
    case["ratios"] = ratios(case)
    return case


def fxforge_peak_bytes(backend, fn, device: str) -> dict:
    """``measure.peak_bytes`` of a call of fxforge-compiled code, plus what the backend's graphs
    hold between calls (kept and symmetric arenas, recycled outputs: ``held_bytes``), which exists
    before the call and so makes no allocation event in it; ``allocated_peak_bytes`` is the call's
    own."""
    mem = measure.peak_bytes(fn, device)
    held = sum(c.stats.get(k, 0) for c in backend.compiled
               for k in ("kept_arena_bytes", "symmetric_arena_bytes", "recycled_bytes"))
    return {**mem, "held_bytes": held, "allocated_peak_bytes": mem["peak_bytes"], "peak_bytes": mem["peak_bytes"] + held}


def saved_figures(backend) -> dict:
    """Bytes the forward graphs saved for the backward graphs: ``saved_bytes`` = the backend's
    ``stats["saved_activation_bytes"]`` (every backward input but the incoming grads, weights
    included), ``saved_activation_bytes`` = the same without ``primals_*`` inputs (weights and
    user inputs, which exist whatever the partitioner saves)."""
    from fxforge.core.graph import VAL, hint, shape_env_of, storage_nbytes

    saved = activations = 0
    for c in backend.compiled:
        if c.stats.get("graph") != "backward":
            continue
        saved += c.stats.get("saved_activation_bytes", 0)
        env = shape_env_of(c.graph)
        for n in c.graph.graph.nodes:
            v = n.meta.get(VAL)
            if n.op == "placeholder" and isinstance(v, torch.Tensor) and not n.name.startswith(("tangents", "primals")):
                activations += hint(storage_nbytes(v), env)
    return {"saved_bytes": saved, "saved_activation_bytes": activations}


def fxforge_figures(backend) -> dict:
    """fxforge's own stats, summed over the graphs of the case, plus per graph and per pass."""
    graphs = []
    for c in backend.compiled:
        s = c.stats
        g = {k: s.get(k, 0) for k in STAT_SUMS}
        g["graph"] = s.get("graph")
        g["refused_fusions"] = dict(s.get("refused_fusions", {}))
        g["fallbacks"] = dict(s.get("fallbacks", {}))
        g["passes"] = [{k: p.get(k) for k in ("name", "seconds", "nodes_before", "nodes_after")} for p in s.get("passes", [])]
        g["arena_over_bound"] = s["arena_bytes"] / s["lower_bound_bytes"] if s.get("lower_bound_bytes") else None
        g["schedule_over_eager_live"] = (s["schedule_peak_bytes"] / s["eager_live_peak_bytes"]
                                         if s.get("eager_live_peak_bytes") and "schedule_peak_bytes" in s else None)
        graphs.append(g)
    total = {k: sum(g[k] for g in graphs) for k in STAT_SUMS}
    per_pass: dict[str, float] = {}
    for g in graphs:
        for p in g["passes"]:
            per_pass[p["name"]] = per_pass.get(p["name"], 0.0) + (p["seconds"] or 0.0)
    total["pass_seconds"] = per_pass
    total["other_compile_seconds"] = total["compile_seconds"] - sum(per_pass.values())
    ab = [g["arena_over_bound"] for g in graphs if g["arena_over_bound"] is not None]
    total["arena_over_bound_mean"] = sum(ab) / len(ab) if ab else None
    total["arena_over_bound_max"] = max(ab) if ab else None
    total["bound_over_eager_live"] = (total["lower_bound_bytes"] / total["eager_live_peak_bytes"]
                                      if total["eager_live_peak_bytes"] else None)
    se = [g["schedule_over_eager_live"] for g in graphs if g["schedule_over_eager_live"] is not None]
    total["schedule_over_eager_live"] = (total["schedule_peak_bytes"] / total["eager_live_peak_bytes"]
                                         if total["eager_live_peak_bytes"] else None)
    total["schedule_over_eager_live_max"] = max(se) if se else None
    total["graphs"] = graphs
    total["failures"] = [{"graph": k, "reason": r} for k, r in backend.failures]
    return total


def ratios(case: dict) -> dict:
    r = case["contenders"]

    def get(n, *path):
        return table.get_path(r, n, *path)

    out = {}
    for other in ("eager", "inductor"):
        out[f"time_fxforge_over_{other}"] = table.ratio(get("fxforge", "time", "median_s"), get(other, "time", "median_s"))
        out[f"peak_fxforge_over_{other}"] = table.ratio(
            get("fxforge", "memory", "peak_bytes"), get(other, "memory", "peak_bytes")
        )
    out["time_inductor_over_eager"] = table.ratio(get("inductor", "time", "median_s"), get("eager", "time", "median_s"))
    out["first_call_fxforge_over_inductor"] = table.ratio(get("fxforge", "first_call_s"), get("inductor", "first_call_s"))
    out["first_call_fxforge_over_aot_eager"] = table.ratio(get("fxforge", "first_call_s"), get("aot_eager", "first_call_s"))
    # aot_eager's first call (dynamo + AOTAutograd, no backend compile) is the floor every backend shares
    fx, ind, floor = (get(n, "first_call_s") for n in ("fxforge", "inductor", "aot_eager"))
    out["first_call_aot_eager_over_inductor"] = table.ratio(floor, ind)

    def above(t):
        return None if t is None or floor is None else max(t - floor, 0.0)

    out["first_call_above_floor_fxforge_over_inductor"] = table.ratio(above(fx), above(ind))
    out["backend_fxforge_over_inductor"] = table.ratio(get("fxforge", "backend_s"), get("inductor", "backend_s"))
    return out


def _err(e: BaseException) -> str:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return f"{type(e).__name__}: {str(e)[:500]}\n" + "".join(tb[-3:])[-1500:]


# --------------------------------------------------------------------------------------------


def warm_process(device: str, contenders) -> float:
    """Pay one-time process costs (imports, Inductor's compile worker pool, fxforge's C launcher
    and compiler probes) before any timed compile, so the first model does not carry them.
    Returns the seconds it took."""
    import fxforge

    t0 = time.perf_counter()

    def f(x):
        return (x.sin() + 1).relu().sum(-1)

    x = torch.randn(8, 8, device=device)
    for b in [c for c in ("aot_eager", "inductor", "fxforge") if c in contenders]:
        torch._dynamo.reset()
        try:
            with measure.fresh_inductor(), measure.fresh_fxforge():
                torch.compile(f, backend=fxforge.backend() if b == "fxforge" else b)(x)
        except Exception as e:  # the case then measures it; say so rather than pass silently
            print(f"bench: warming up {b} failed, its first case carries the one-time costs: {_err(e)}",
                  file=sys.stderr, flush=True)
    torch._dynamo.reset()
    return time.perf_counter() - t0


def machine_info(device: str) -> dict:
    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
    }
    for mod in ("transformers", "triton", "fxforge"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    try:
        info["fxforge_commit"] = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
                                                capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:
        info["fxforge_commit"] = None
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    # the allocator's settings move every contender's page faults (docs/memory.md, "Page faults")
    info["allocator_env"] = {k: v for k, v in os.environ.items()
                             if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    return info


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def run_gpu_kernels(out_dir: Path) -> dict:
    """Run bench/bench_gpu_kernels.py (owned by the kernel issue) if present, in a subprocess
    so a failure there cannot take the suite down.  Its stdout is kept in the results."""
    path = HERE / "bench_gpu_kernels.py"
    if not path.is_file():
        return {"status": "absent", "path": str(path)}
    cmd = [sys.executable, str(path)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=str(HERE.parent))
    except subprocess.TimeoutExpired as e:
        return {"status": "timeout", "cmd": cmd, "stdout": (e.stdout or "")[-20000:] if isinstance(e.stdout, str) else ""}
    (out_dir / "gpu_kernels.txt").write_text(p.stdout + ("\n--- stderr ---\n" + p.stderr if p.stderr else ""))
    return {"status": "ok" if p.returncode == 0 else f"exit {p.returncode}", "cmd": cmd,
            "seconds": time.perf_counter() - t0, "stdout": p.stdout[-20000:], "stderr": p.stderr[-5000:]}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cpu"
    if args.gpu:
        if not torch.cuda.is_available():
            print("bench --gpu: no CUDA device here (torch.cuda.is_available() is False); "
                  "run it on a GPU machine, or drop --gpu for the CPU suite. Nothing was run.", file=sys.stderr)
            return 2
        device = "cuda"
    if "eager" not in args.contenders:
        args.contenders = ["eager"] + list(args.contenders)
    names = selected_models(args)
    known = corpus.all_models()
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown model(s) {unknown}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = args.tag or "bench" + ("-gpu" if args.gpu else "") + ("-full" if args.full else "-quick" if args.quick else "")
    import torch._dynamo.config as dconf

    # Process-wide knobs, restored at the end (the smoke test runs main() inside pytest).
    saved = [(dconf, k, getattr(dconf, k)) for k in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                                                      "accumulated_cache_size_limit") if hasattr(dconf, k)]
    threads = torch.get_num_threads()
    try:
        for mod, knob, v in saved:
            setattr(mod, knob, max(v, 64))
        return _run(args, device, names, known, out_dir, tag)
    finally:
        for mod, knob, v in saved:
            setattr(mod, knob, v)
        torch.set_num_threads(threads)
        torch._dynamo.reset()
        for d in measure.SCRATCH_DIRS:  # the cold-compile cache dirs; everything in them is loaded
            shutil.rmtree(d, ignore_errors=True)
        measure.SCRATCH_DIRS.clear()


def case_in_process(args, name: str, mode: str, threads: int) -> dict:
    """One case measured by ``bench/run.py`` in a fresh process (``--processes case``): the case
    it wrote, or one carrying the process's error."""
    with tempfile.TemporaryDirectory(prefix="fxforge-bench-case-") as tmp:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--models", name, "--modes", mode,
               "--threads", str(threads), "--contenders", *args.contenders, "--calls", str(args.calls),
               "--budget", str(args.budget), "--synthetic", "--processes", "one", "--out", tmp, "--tag", "case",
               "--case-of", f"{name}:{mode}"]
        cmd += ([] if args.partitioners else ["--no-partitioners"]) + (["--debug"] if args.debug else []) + \
            (["--gpu"] if args.gpu else [])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200, cwd=str(HERE.parent))
            cases = json.loads((Path(tmp) / "case.json").read_text())["cases"] if p.returncode == 0 else []
            error = f"exit {p.returncode}: {p.stderr[-4000:]}"
        except (subprocess.TimeoutExpired, OSError, ValueError) as e:
            cases, error = [], _err(e)
    if len(cases) == 1:
        return cases[0]
    return {"model": name, "mode": mode, "contenders": {}, "ratios": {}, "threads": threads,
            "errors": {"case": f"the case's own process wrote no case ({error})"}}


def _run(args, device, names, known, out_dir, tag) -> int:
    t_start = time.perf_counter()
    results: dict[str, Any] = {"meta": machine_info(device), "args": vars(args), "cases": [], "skipped": []}
    if args.processes == "one":  # (each case's own process warms itself)
        results["meta"]["warmup_s"] = warm_process(device, args.contenders)
    if args.case_of is None:
        print(f"bench: {device}, models {' '.join(names)}, modes {' '.join(args.modes)}, "
              f"synthetic {selected_sizes(args)} -> {out_dir}/{tag}.{{json,md}}", flush=True)

    def save():
        results["meta"]["wall_s"] = time.perf_counter() - t_start
        results["targets"] = table.targets(results)
        (out_dir / f"{tag}.json").write_text(json.dumps(results, indent=1, default=str))
        (out_dir / f"{tag}.md").write_text(table.markdown(results))

    have_tf = corpus.have_transformers()
    default_threads = torch.get_num_threads()
    for threads in args.threads:
        # Each thread count compiles afresh: Inductor fixes its kernels' thread count when it compiles.
        torch.set_num_threads(threads if threads > 0 else default_threads)
        for name in names:
            model = known[name]
            if model.needs_transformers and not have_tf:
                if threads == args.threads[0]:
                    results["skipped"].append({"model": name, "reason": "transformers is not installed"})
                    print(f"  {name}: skipped (transformers is not installed)", flush=True)
                continue
            for mode in [m for m in args.modes if m in model.modes]:
                t0 = time.perf_counter()
                if args.processes == "case":
                    case = case_in_process(args, name, mode, threads)
                else:
                    try:
                        case = run_case(model, mode, args, device)
                    except Exception as e:
                        case = {"model": name, "mode": mode, "contenders": {}, "errors": {"case": _err(e)}, "ratios": {}}
                    case["threads"] = torch.get_num_threads()
                    case["pid"] = os.getpid()
                case["wall_s"] = time.perf_counter() - t0
                results["cases"].append(case)
                print("  " + table.one_line(case), flush=True)
                save()
                torch._dynamo.reset()
    torch.set_num_threads(default_threads)
    if args.case_of is not None:
        return 0

    sizes = selected_sizes(args)
    if sizes:
        import synthetic

        rows = []
        for n in sizes:
            t0 = time.perf_counter()
            try:
                row = synthetic.pipeline_times(n)
            except Exception as e:
                row = {"nodes": n, "error": _err(e)}
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
            print(f"  synthetic {n} nodes: " + (f"compile {row['compile_s']:.2f}s (passes {row['passes_s']:.2f}s)"
                                                 if "compile_s" in row else row["error"].splitlines()[0]), flush=True)
        results["synthetic"] = synthetic.add_scaling(rows)
        save()

    if args.gpu:
        results["gpu_kernels"] = run_gpu_kernels(out_dir)
    save()
    print(f"bench: done in {time.perf_counter() - t_start:.0f}s; wrote {out_dir / (tag + '.md')} and .json", flush=True)
    print(table.markdown(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
