"""Markdown tables and the target check from the results dict that bench/run.py writes as JSON.

    python bench/table.py bench/results/bench.json     # re-render the Markdown of a JSON file
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

MiB = 1024 * 1024


def get_path(d: Any, *path):
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _ms(s):
    return "—" if s is None else f"{s * 1e3:.2f}"


def _s(s):
    return "—" if s is None else f"{s:.2f}"


def _mib(b):
    return "—" if b is None else f"{b / MiB:.1f}"


def _x(r):
    return "—" if r is None else f"{r:.2f}x"


def _case_name(c):
    return f"{c['model']} {c['mode']}" + (f" ({c['threads']}t)" if c.get("threads") else "")


def geomean(values) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def by_threads(results: dict) -> list[dict]:
    """Per thread count: the geometric means of fxforge / eager and fxforge / Inductor over the
    cases timed at it, and the case furthest behind Inductor."""
    out = []
    cases = [c for c in results.get("cases", []) if c.get("ratios")]
    for t in sorted({c.get("threads") for c in cases}, key=lambda t: t or 0):
        cs = [c for c in cases if c.get("threads") == t]
        vs_ind = [(c["ratios"].get("time_fxforge_over_inductor"), _case_name(c)) for c in cs]
        vs_ind = [(r, n) for r, n in vs_ind if r is not None]
        out.append({"threads": t, "cases": len(cs),
                    "fxforge_over_eager": geomean(c["ratios"].get("time_fxforge_over_eager") for c in cs),
                    "fxforge_over_inductor": geomean(r for r, _ in vs_ind),
                    "worst_over_inductor": max(vs_ind) if vs_ind else None})
    return out


def one_line(c: dict) -> str:
    r = c.get("ratios", {})
    res = c.get("contenders", {})
    parts = [f"{_case_name(c)}:"]
    for n in ("eager", "fxforge", "inductor"):
        if get_path(res, n, "time", "median_s") is not None:
            parts.append(f"{n} {_ms(get_path(res, n, 'time', 'median_s'))}ms")
    parts.append(f"fx/eager {_x(r.get('time_fxforge_over_eager'))}")
    parts.append(f"peak fx/eager {_x(r.get('peak_fxforge_over_eager'))} fx/ind {_x(r.get('peak_fxforge_over_inductor'))}")
    parts.append(
        f"first call fx {_s(get_path(res, 'fxforge', 'first_call_s'))}s ind {_s(get_path(res, 'inductor', 'first_call_s'))}s"
    )
    if c.get("errors"):
        parts.append("ERRORS: " + ", ".join(c["errors"]))
    if "wall_s" in c:
        parts.append(f"[{c['wall_s']:.0f}s]")
    return " ".join(parts)


def targets(results: dict) -> list[dict]:
    """Each project target with the measured value, pass/miss, and what it was computed from."""
    cases = [c for c in results.get("cases", []) if c.get("contenders")]
    out = []

    def add(name, goal, values, ok_fn, how):
        vals = [v for v in values if v is not None]
        if not vals:
            out.append({"target": name, "goal": goal, "status": "not measured", "how": how})
            return
        out.append({"target": name, "goal": goal, "worst": max(vals), "mean": sum(vals) / len(vals), "n": len(vals),
                    "status": "met" if ok_fn(vals) else "MISSED", "how": how})

    add("compile time vs Inductor cold (first call)", "<= 0.2x",
        [get_path(c, "ratios", "first_call_fxforge_over_inductor") for c in cases], lambda v: max(v) <= 0.2,
        "first call (dynamo + AOTAutograd + backend + run) fxforge / Inductor, per case; worst case")
    add("compile time vs Inductor cold (first call above the aot_eager floor)", "<= 0.2x",
        [get_path(c, "ratios", "first_call_above_floor_fxforge_over_inductor") for c in cases], lambda v: max(v) <= 0.2,
        "(fxforge - aot_eager) / (Inductor - aot_eager) first call: what each backend adds to dynamo + AOTAutograd, "
        "per case; worst case")
    add("compile time vs Inductor cold (backend only)", "<= 0.2x",
        [get_path(c, "ratios", "backend_fxforge_over_inductor") for c in cases], lambda v: max(v) <= 0.2,
        "sum of fxforge compile_seconds / Inductor compile_fx_inner seconds, per case")
    ab = [g["arena_over_bound"] for c in cases for g in get_path(c, "fxforge", "graphs") or [] if g.get("arena_over_bound")]
    add("arena / lower bound", "<= 1.02 mean", ab, lambda v: sum(v) / len(v) <= 1.02, "per compiled graph, all cases")
    train = [c for c in cases if c["mode"] == "train"]
    se = [g.get("schedule_over_eager_live") for c in train for g in get_path(c, "fxforge", "graphs") or []]
    add("schedule peak / eager live peak, training graphs", "<= 0.9", se, lambda v: max(v) <= 0.9,
        "planned: max live bytes of every storage the graph creates, fxforge's schedule / program order, "
        "per forward and backward graph")
    add("training peak vs Inductor", "<= 1.0x", [get_path(c, "ratios", "peak_fxforge_over_inductor") for c in train],
        lambda v: max(v) <= 1.0, "measured peak bytes of one training step, fxforge / Inductor")
    add("training peak vs eager", "<= 0.9x", [get_path(c, "ratios", "peak_fxforge_over_eager") for c in train],
        lambda v: max(v) <= 0.9, "measured peak bytes of one training step, fxforge / eager")
    rows = by_threads(results)
    add("time per call vs Inductor, geomean at each thread count", "<= 1.0x",
        [r["fxforge_over_inductor"] for r in rows], lambda v: max(v) <= 1.0,
        "geometric mean over the cases of fxforge / Inductor median time, per thread count; worst thread count")
    add("time per call vs Inductor, every case", "<= 1.15x",
        [get_path(c, "ratios", "time_fxforge_over_inductor") for c in cases], lambda v: max(v) <= 1.15,
        "fxforge / Inductor median time per call, per case and thread count; worst case")
    add("time per call vs eager, geomean at each thread count", "<= 0.9x",
        [r["fxforge_over_eager"] for r in rows], lambda v: max(v) <= 0.9,
        "geometric mean over the cases of fxforge / eager median time, per thread count; worst thread count")
    add("time per call vs eager (not slower)", "<= 1.0x",
        [get_path(c, "ratios", "time_fxforge_over_eager") for c in cases], lambda v: max(v) <= 1.0,
        "median time per call fxforge / eager, per case (target 'fxforge >= 1.0x eager speed')")
    rows = [r for r in get_path(results, "synthetic", "rows") or [] if r.get("nodes") == 100_000 and "compile_s" in r]
    add("pass pipeline, 100k-node graph", "< 10 s", [r["passes_s"] for r in rows], lambda v: max(v) < 10,
        "sum of the pass manager's per-pass seconds (stats['passes'])")
    add("whole compile_graph, 100k-node graph", "< 10 s (same goal, stricter reading)",
        [r["compile_s"] for r in rows], lambda v: max(v) < 10,
        "stats['compile_seconds']: passes + schedule + memory plan + codegen + loading the wrapper")
    return out


def markdown(results: dict) -> str:
    m = results.get("meta", {})
    L = [
        "# fxforge benchmarks: fxforge vs eager vs Inductor",
        "",
        f"- date: {m.get('date_utc')}; wall time of this run: {_s(m.get('wall_s'))} s; command: "
        f"`python bench/run.py {' '.join(_argv(results.get('args', {})))}`",
        f"- machine: {m.get('cpu')}, {m.get('cores')} cores, torch threads {m.get('torch_threads')}, "
        f"device {m.get('device')}{' (' + m['gpu'] + ')' if m.get('gpu') else ''}; load average at start "
        f"{', '.join(f'{x:.1f}' for x in m.get('loadavg_start', []))}{allocator_note(m)}",
        f"- versions: python {m.get('python')}, torch {m.get('torch')}, transformers {m.get('transformers')}, "
        f"triton {m.get('triton')}, fxforge {m.get('fxforge')} ({m.get('fxforge_commit')})",
        "- how each figure is measured: bench/README.md. Ratios are fxforge / other (lower is better for all).",
        "",
    ]
    cases = [c for c in results.get("cases", [])]
    if cases:
        L += ["## Time per call (median of interleaved calls after warm-up, ms)", "",
              "| case | eager | fxforge | Inductor | fxforge/eager | fxforge/Inductor | Inductor/eager | calls |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for c in cases:
            res, r = c["contenders"], c.get("ratios", {})
            L.append(
                f"| {_case_name(c)} | {_ms(get_path(res, 'eager', 'time', 'median_s'))} | "
                f"{_ms(get_path(res, 'fxforge', 'time', 'median_s'))} | {_ms(get_path(res, 'inductor', 'time', 'median_s'))} | "
                f"{_x(r.get('time_fxforge_over_eager'))} | {_x(r.get('time_fxforge_over_inductor'))} | "
                f"{_x(r.get('time_inductor_over_eager'))} | {get_path(res, 'eager', 'time', 'calls') or '—'} |"
            )
        L += ["", "## Geometric means per thread count", "",
              "| threads | cases | fxforge/eager | fxforge/Inductor | furthest behind Inductor |",
              "|---:|---:|---:|---:|---|"]
        for r in by_threads(results):
            w = r["worst_over_inductor"]
            L.append(f"| {r['threads'] or '—'} | {r['cases']} | {_x(r['fxforge_over_eager'])} | "
                     f"{_x(r['fxforge_over_inductor'])} | {'—' if w is None else f'{w[1]}: {_x(w[0])}'} |")
        L += ["", "## Peak bytes allocated during one call (MiB, profiler allocation events)", "",
              "| case | eager | fxforge | Inductor | fxforge/eager | fxforge/Inductor |", "|---|---:|---:|---:|---:|---:|"]
        for c in cases:
            res, r = c["contenders"], c.get("ratios", {})
            L.append(
                f"| {_case_name(c)} | {_mib(get_path(res, 'eager', 'memory', 'peak_bytes'))} | "
                f"{_mib(get_path(res, 'fxforge', 'memory', 'peak_bytes'))} | {_mib(get_path(res, 'inductor', 'memory', 'peak_bytes'))} | "  # noqa: E501
                f"{_x(r.get('peak_fxforge_over_eager'))} | {_x(r.get('peak_fxforge_over_inductor'))} |"
            )
        L += ["", "## Compile time (s): first call, cold", "",
              "aot_eager (dynamo + AOTAutograd, no backend compile) is the floor every backend shares; "
              "floor/Inductor is the least first-call ratio any backend could reach.", "",
              "| case | aot_eager | fxforge | Inductor | fxforge/Inductor | floor/Inductor | fxforge backend | "
              "Inductor backend | backend fxforge/Inductor | max abs err fxforge / Inductor |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for c in cases:
            res, r = c["contenders"], c.get("ratios", {})
            err = " / ".join(_e(res.get(n)) for n in ("fxforge", "inductor"))
            L.append(
                f"| {_case_name(c)} | {_s(get_path(res, 'aot_eager', 'first_call_s'))} | {_s(get_path(res, 'fxforge', 'first_call_s'))} | "  # noqa: E501
                f"{_s(get_path(res, 'inductor', 'first_call_s'))} | {_x(r.get('first_call_fxforge_over_inductor'))} | "
                f"{_x(r.get('first_call_aot_eager_over_inductor'))} | {_s(get_path(res, 'fxforge', 'backend_s'))} | {_s(get_path(res, 'inductor', 'backend_s'))} | "  # noqa: E501
                f"{_x(r.get('backend_fxforge_over_inductor'))} | {err} |"
            )
        L += ["", "## fxforge memory plan and graphs (summed over the graphs of each case; MiB)", "",
              "arena: most arena bytes live at once (arenas live over windows of the schedule); schedule peak / "
              "eager live peak: every storage the graph creates, fxforge's schedule vs program order (like for "
              "like; per graph, max over the case's graphs in brackets).", "",
              "| case | graphs | nodes | kernels | fallbacks | arenas | arena | lower bound | arena/bound (mean, max) | "
              "eager live peak | schedule peak | schedule/eager live | bound/eager live | copy | failures |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---|"]
        for c in cases:
            f = c.get("fxforge")
            if not f:
                continue
            kinds = ",".join(str(g["graph"]) for g in f["graphs"])
            fails = len(f.get("failures", [])) + len(f.get("failed_at_run_time", []))
            L.append(f"| {_case_name(c)} | {kinds} | {f['nodes_in']} | {f['kernels']} | {f['fallback_nodes']} | "
                     f"{f.get('arenas', '—')} | {_mib(f['arena_bytes'])} | {_mib(f['lower_bound_bytes'])} | "
                     f"{_x(f['arena_over_bound_mean'])}, {_x(f['arena_over_bound_max'])} | {_mib(f['eager_live_peak_bytes'])} | "
                     f"{_mib(f.get('schedule_peak_bytes'))} | {_x(f.get('schedule_over_eager_live'))} "
                     f"({_x(f.get('schedule_over_eager_live_max'))}) | "
                     f"{_x(f['bound_over_eager_live'])} | {_mib(f['copy_bytes'])} | {fails or ''} |")
        parts = [c for c in cases if c.get("partitioners")]
        if parts:
            L += ["", "## Training: AOTAutograd partitioner (fxforge; MiB)", "",
                  "saved: bytes the forward saves for the backward (backward inputs but incoming grads), with and "
                  "without weights/user inputs (`primals_*`); peak: measured as above, one training step.", "",
                  "| case | saved min_cut | saved default | activations min_cut | activations default | "
                  "min_cut/default | peak min_cut | peak default |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
            for c in parts:
                pm, pd = c["partitioners"].get("min_cut", {}), c["partitioners"].get("default", {})
                L.append(f"| {_case_name(c)} | {_mib(pm.get('saved_bytes'))} | {_mib(pd.get('saved_bytes'))} | "
                         f"{_mib(pm.get('saved_activation_bytes'))} | {_mib(pd.get('saved_activation_bytes'))} | "
                         f"{_x(ratio(pm.get('saved_activation_bytes'), pd.get('saved_activation_bytes')))} | "
                         f"{_mib(pm.get('peak_bytes'))} | {_mib(pd.get('peak_bytes'))} |")
        names = []
        for c in cases:
            for n in (get_path(c, "fxforge", "pass_seconds") or {}):
                if n not in names:
                    names.append(n)
        if names:
            L += ["", "## fxforge compile time per pass (ms, summed over the graphs of each case)", "",
                  "| case | " + " | ".join(names) + " | rest of compile (schedule, plan, codegen, load) | total |",
                  "|---|" + "---:|" * (len(names) + 2)]
            for c in cases:
                f = c.get("fxforge")
                if not f:
                    continue
                ps = f["pass_seconds"]
                L.append(f"| {_case_name(c)} | " + " | ".join(_ms(ps.get(n)) for n in names)
                         + f" | {_ms(f['other_compile_seconds'])} | {_ms(f['compile_seconds'])} |")
        errs = [(c, k, v) for c in cases for k, v in (c.get("errors") or {}).items()]
        if errs:
            L += ["", "## Errors", ""]
            for c, k, v in errs:
                L.append(f"- {_case_name(c)}, {k}: `{v.splitlines()[0][:300]}`")
        recompiled = [_case_name(c) for c in cases if c.get("recompiled_during_timing")]
        if recompiled:
            L += ["", f"Note: dynamo compiled a new graph during the timed calls of: {', '.join(recompiled)}."]
    for s in results.get("skipped", []):
        L.append(f"- skipped {s['model']}: {s['reason']}")
    syn = get_path(results, "synthetic", "rows")
    if syn:
        L += [
            "",
            "## Pass-pipeline time vs graph size (synthetic pointwise chains/trees)",
            "",
            "| nodes | build + FakeTensorProp (s) | passes (s) | schedule | groups | memory plan | codegen | load wrapper | "
            f"compile_seconds (s) | compile CPU s | µs/node ({'CPU' if get_path(results, 'synthetic', 'per_node_from') == 'compile_cpu_s' else 'wall'}) | "  # noqa: E501
            "per node vs smallest | matches eager |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in syn:
            if "compile_s" not in r:
                L.append(f"| {r['nodes']} | error: `{r.get('error', '').splitlines()[0][:200]}` |")
                continue
            st = r.get("stages_s", {})
            L.append(f"| {r['nodes']} | {_s(r['build_s'])} | {_s(r['passes_s'])} | {_s(st.get('schedule'))} | "
                     f"{_s(st.get('groups'))} | {_s(st.get('memory_plan'))} | {_s(st.get('codegen'))} | {_s(st.get('load'))} | "
                     f"{_s(r['compile_s'])} | {_s(r.get('compile_cpu_s'))} | "
                     f"{r['us_per_node']:.0f} | {_x(r['per_node_vs_smallest'])} | {r.get('matches_eager')} |")
    gk = results.get("gpu_kernels")
    if gk:
        L += ["", f"## GPU kernel microbenchmarks (bench/bench_gpu_kernels.py): {gk.get('status')}", ""]
        if gk.get("stdout"):
            L += ["```", gk["stdout"][-8000:].rstrip(), "```"]
    tg = results.get("targets") or targets(results)
    if tg:
        L += ["", "## Targets", "", "| target | goal | worst | mean | status | computed from |", "|---|---|---:|---:|---|---|"]
        for t in tg:
            L.append(f"| {t['target']} | {t['goal']} | {_num(t.get('worst'))} | {_num(t.get('mean'))} | "
                     f"{t['status']} | {t['how']} |")
    return "\n".join(L) + "\n"


def _e(r):
    if not r:
        return "—"
    e = r.get("grad_max_abs_err", r.get("max_abs_err"))
    return "—" if e is None else f"{e:.1e}"


def allocator_note(meta: dict) -> str:
    """``; allocator environment: K=V ...`` for a header line where the run set any, else ''."""
    env = meta.get("allocator_env") or {}
    return "; allocator environment: " + " ".join(f"`{k}={v}`" for k, v in sorted(env.items())) if env else ""


def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _num(v):
    return "—" if v is None else f"{v:.3g}"


def _argv(args: dict) -> list[str]:
    out = []
    for k in ("quick", "full", "gpu", "debug"):
        if args.get(k):
            out.append(f"--{k}")
    if args.get("partitioners") is False:
        out.append("--no-partitioners")
    if args.get("models"):
        out += ["--models", *args["models"]]
    if args.get("modes") and args["modes"] != ["inference", "train"]:
        out += ["--modes", *args["modes"]]
    if args.get("contenders") and sorted(args["contenders"]) != sorted(["eager", "fxforge", "inductor", "aot_eager"]):
        out += ["--contenders", *args["contenders"]]
    if args.get("synthetic") is not None:
        out += ["--synthetic", *map(str, args["synthetic"])]
    for k in ("calls", "budget", "threads"):
        if k in args:
            v = args[k]
            out += [f"--{k}", *map(str, v if isinstance(v, list) else [v])]
    if args.get("tag"):
        out += ["--tag", args["tag"]]
    return out


if __name__ == "__main__":
    print(markdown(json.load(open(sys.argv[1]))))
