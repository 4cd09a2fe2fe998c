"""Synthetic large ATen graphs for pass-pipeline time scaling (1k, 10k, 100k nodes).

A graph is built directly as FX (no tracing): ``inputs`` placeholders, then ``n`` pointwise
nodes.  Each node applies a unary op to the previous node (a long chain), or a binary op to the
previous node and an earlier one (a tree/DAG edge that keeps a value alive for a while, like a
skip connection), drawn with a fixed seed.  ``meta["val"]`` comes from ``FakeTensorProp`` under a
``FakeTensorMode``, as AOTAutograd would leave it.  Tensors are small (``shape``): only the
compiler's time is of interest here, not the kernels'.

``make_mixed_graph`` mixes what real graphs hold instead (pointwise DAGs, row and column
reductions broadcast back, transposes and reshapes, bias broadcasts, ``var_mean``
normalizations, softmax, cat of slices, matmuls):
``python bench/synthetic.py 10000 100000 --graph mixed [--seed S]`` (another seed: a graph the
pipeline was not tuned on).
"""

from __future__ import annotations

import gc
import operator
import os
import random
import tempfile
import time

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

aten = torch.ops.aten
UNARY = (aten.relu.default, aten.neg.default, aten.sin.default, aten.exp.default, aten.tanh.default)
BINARY = (aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor, aten.maximum.default)


def make_graph(n: int, *, inputs: int = 4, shape=(64,), seed: int = 0, skip_p: float = 0.3, reach: int = 64):
    """An ``fx.GraphModule`` of ``n`` pointwise compute nodes with ``meta["val"]`` on every node,
    and the real example inputs (the graph runs)."""
    rng = random.Random(seed)
    g = fx.Graph()
    values = [g.placeholder(f"arg{i}") for i in range(inputs)]
    for i in range(n):
        prev = values[-1]
        if rng.random() < skip_p:
            other = values[max(0, len(values) - 1 - rng.randint(1, reach))]
            node = g.call_function(rng.choice(BINARY), (prev, other))
        else:
            node = g.call_function(rng.choice(UNARY), (prev,))
        values.append(node)
    # A few outputs from across the graph, like a real graph's (outputs, saved activations).
    outs = [values[-1]] + [values[inputs + (k * n) // 4] for k in range(1, 4) if n >= 4]
    g.output(tuple(dict.fromkeys(outs)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    gen = torch.Generator().manual_seed(seed)
    example = [torch.randn(shape, generator=gen) for _ in range(inputs)]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(t) for t in example])
    return gm, example


MIXED_UNARY = (aten.relu.default, aten.neg.default, aten.sin.default, aten.tanh.default, aten.sigmoid.default,
               aten.abs.default)
MIXED_BINARY = (aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor, aten.maximum.default)
ROW_FOLDS = (aten.sum.dim_IntList, aten.amax.default, aten.mean.dim)


def make_mixed_graph(n: int, *, rows: int = 16, cols: int = 64, seed: int = 0, reach: int = 48):
    """An ``fx.GraphModule`` of about ``n`` compute nodes of what real graphs mix, on
    ``rows x cols`` activations: pointwise chains and DAG edges, row and column reductions
    broadcast back, transposes and reshapes around pointwise work, a bias broadcast, multi-output
    nodes (``var_mean`` normalizations, softmax), slices cat'ed together and a few matmuls;
    ``meta["val"]`` on every node, and the real example inputs (the graph runs)."""
    rng = random.Random(seed)
    g = fx.Graph()
    x0, x1 = g.placeholder("x0"), g.placeholder("x1")
    bias, weight = g.placeholder("bias"), g.placeholder("weight")
    values = [x0, x1]
    count = [0]

    def op(target, *args, **kwargs):
        count[0] += 1
        return g.call_function(target, args, kwargs)

    def earlier():
        return values[max(0, len(values) - 1 - rng.randint(1, reach))]

    def step(x):
        r = rng.random()
        if r < 0.30:
            return op(rng.choice(MIXED_UNARY), x)
        if r < 0.48:
            return op(rng.choice(MIXED_BINARY), x, earlier())
        if r < 0.56:
            fold = rng.choice(ROW_FOLDS)
            red = op(fold, x, [1], True) if fold is not aten.amax.default else op(fold, x, [1], True)
            return op(aten.sub.Tensor, x, red)
        if r < 0.60:
            return op(aten.mul.Tensor, x, op(aten.sum.dim_IntList, x, [0], True))
        if r < 0.68:
            t = op(aten.permute.default, x, [1, 0])
            return op(aten.permute.default, op(rng.choice(MIXED_UNARY), t), [1, 0])
        if r < 0.72:
            v = op(aten.view.default, x, [4, rows // 4, cols])
            return op(aten.view.default, op(rng.choice(MIXED_UNARY), v), [rows, cols])
        if r < 0.77:
            return op(aten.add.Tensor, x, bias)
        if r < 0.85:
            vm = op(aten.var_mean.correction, x, [1], correction=0, keepdim=True)
            var, mean = op(operator.getitem, vm, 0), op(operator.getitem, vm, 1)
            return op(aten.mul.Tensor, op(aten.sub.Tensor, x, mean), op(aten.rsqrt.default, op(aten.add.Tensor, var, 1e-5)))
        if r < 0.91:
            e = op(aten.exp.default, op(aten.sub.Tensor, x, op(aten.amax.default, x, [1], True)))
            return op(aten.div.Tensor, e, op(aten.sum.dim_IntList, e, [1], True))
        if r < 0.97:
            a = op(aten.slice.Tensor, x, 1, 0, cols // 2)
            b = op(aten.slice.Tensor, earlier(), 1, cols // 2, cols)
            return op(aten.cat.default, [a, b], 1)
        return op(aten.mm.default, x, weight)

    while count[0] < n:
        values.append(step(values[-1]))
    outs = [values[-1]] + [values[(k * len(values)) // 5] for k in range(1, 5)]
    g.output(tuple(dict.fromkeys(outs)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    gen = torch.Generator().manual_seed(seed)
    example = [torch.randn(rows, cols, generator=gen), torch.randn(rows, cols, generator=gen),
               torch.randn(cols, generator=gen), torch.randn(cols, cols, generator=gen) / cols]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(t) for t in example])
    return gm, example


GRAPHS = {"pointwise": make_graph, "mixed": make_mixed_graph}


def _timed_stages(fn, stages: dict):
    """Run ``fn`` with fxforge.spine's stage functions wrapped in timers (kernels ahead of the plan,
    schedule, groups (also counted inside kernels ahead), memory plan, wrapper generation,
    linking the kernels: the C builds waited for), restored afterwards.  Read-only
    instrumentation: fxforge's stats time the passes only; the rest of ``compile_seconds`` is
    split here."""
    from fxforge import spine as compiler
    from fxforge.codegen import wrapper

    targets = [(compiler, "kernels_ahead", "kernels_ahead"), (compiler, "make_schedule", "schedule"),
               (compiler, "build_groups", "groups"),
               (compiler, "plan_memory", "memory_plan"), (wrapper, "generate", "codegen"), (wrapper, "link", "link"),
               (getattr(wrapper, "Wrapper", None), "load", "load")]
    saved = []
    for mod, attr, label in targets:
        orig = getattr(mod, attr, None) if mod is not None else None
        if orig is None:
            continue
        saved.append((mod, attr, orig))

        def timed(*a, _orig=orig, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _orig(*a, **k)
            finally:
                stages[_label] = stages.get(_label, 0.0) + time.perf_counter() - t0

        setattr(mod, attr, timed)
    try:
        return fn()
    finally:
        for mod, attr, orig in saved:
            setattr(mod, attr, orig)


def pipeline_times(n: int, *, seed: int = 0, graph: str = "pointwise", cached: bool = False) -> dict:
    """Build a graph of ``n`` nodes (``graph``: ``GRAPHS``' kind) and compile it with the default
    Config, its kernels built anew: in a fresh, temporary kernel cache, set up first by
    compiling a small graph there (``setup_s``: the machine's one-time costs, such as building
    the C launcher and probing the compiler, and the process's first compile); ``cached``: the
    graph is compiled once there first, and the second compile is timed (its kernels built
    already: the passes, the plan and emitting alone).

    Returns ``nodes``, ``build_s`` (graph + FakeTensorProp, not fxforge's time), ``compile_s``
    (the wall time of the ``compile_graph`` call, what its caller waits: passes + kernels ahead
    of the plan + schedule + memory plan + codegen + linking and loading the wrapper, and the
    collector's pass when it runs again; ``compile_seconds``: the part ``stats`` counts),
    ``passes_s`` (sum of the pass manager's per-pass times), ``passes`` (per pass: name,
    seconds, nodes before/after), ``other_s`` = compile - passes, ``stages_s`` (kernels
    ahead of the plan, schedule, groups, memory plan, codegen, link, load: wall seconds of
    fxforge.spine's stages) and
    ``compile_cpu_s`` (process CPU seconds of the compile: single-threaded, so less sensitive to
    other jobs on the machine than wall time), ``tiered_kernels`` (kernels built at -Og first:
    ``Config.tiered_builds``), ``built_unused`` (C functions built ahead of the plan that no
    kernel launches: ``CUnit.unused``) and ``full_build_s`` (the wait for their full builds
    after the compile returned)."""
    with tempfile.TemporaryDirectory(prefix="fxforge-synthetic-") as cache:
        saved = os.environ.get("FXFORGE_CACHE_DIR")
        os.environ["FXFORGE_CACHE_DIR"] = cache
        try:
            return _pipeline_times(n, seed, GRAPHS[graph], cached)
        finally:
            if saved is None:
                del os.environ["FXFORGE_CACHE_DIR"]
            else:
                os.environ["FXFORGE_CACHE_DIR"] = saved


def _pipeline_times(n: int, seed: int, make=make_graph, cached: bool = False) -> dict:
    import fxforge
    from fxforge.spine import compile_graph

    small, _ = make(8, seed=seed + 1)
    t0 = time.perf_counter()
    compile_graph(small, fxforge.Config(debug=False), kind="synthetic", cache=False)
    setup_s = time.perf_counter() - t0
    if cached:  # the same graph compiled once before: its kernels are in the cache, only Python is timed
        # (its kernels built in full: a tiered build still running would be built again at -Og)
        compile_graph(make(n, seed=seed)[0], fxforge.Config(debug=False), kind="synthetic", cache=False).wait_for_kernels()
    t0 = time.perf_counter()
    gm, example = make(n, seed=seed)
    build_s = time.perf_counter() - t0
    stages: dict[str, float] = {}
    gc.collect()  # a collection of the bench's own garbage must not land inside the timed compile
    cpu0, wall0 = time.process_time(), time.perf_counter()
    c = _timed_stages(lambda: compile_graph(gm, fxforge.Config(debug=False), kind="synthetic", cache=False), stages)
    compile_s, compile_cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    t0 = time.perf_counter()
    c.wait_for_kernels()
    full_build_s = time.perf_counter() - t0
    s = c.stats
    passes = [{k: p[k] for k in ("name", "seconds", "nodes_before", "nodes_after")} for p in s["passes"]]
    passes_s = sum(p["seconds"] for p in passes)
    ok = None
    if n <= 10_000:  # a correctness spot check where it is cheap
        ok = _as_close_as_eager(gm, example, c(*example))
    return {
        "graph": getattr(make, "__name__", "graph"),
        "nodes": n,
        "nodes_in": s["nodes_in"],
        "build_s": build_s,
        "setup_s": setup_s,
        "compile_s": compile_s,
        "compile_seconds": s["compile_seconds"],
        "compile_cpu_s": compile_cpu_s,
        "tiered_kernels": s["tiered_kernels"],
        "built_unused": getattr(c.artifact.units.get("c"), "unused", 0),
        "full_build_s": full_build_s,
        "passes_s": passes_s,
        "other_s": s["compile_seconds"] - passes_s,
        "passes": passes,
        "stages_s": stages,
        "kernels": s["kernels"],
        "arena_bytes": s["arena_bytes"],
        "lower_bound_bytes": s["lower_bound_bytes"],
        "matches_eager": ok,
    }


def _as_close_as_eager(gm, example, got) -> bool:
    """``got`` is as close to the float64 result as eager's float32 one is (within 2x, or 1e-5):
    random graphs of normalizations, exponentials and matmuls amplify rounding, so a plain
    ``allclose`` against eager would judge the graph, not the compiler."""
    want = gm(*example)
    ref = gm(*[t.double() for t in example])
    def worst(x: torch.Tensor) -> float:
        return x.abs().max().item() if x.numel() else 0.0

    for a, b, r in zip(want, got, ref):
        fin = r.isfinite() & a.isfinite()
        if not torch.equal(b.isfinite(), a.isfinite()):
            return False
        if worst((b.double() - r)[fin]) > max(2 * worst((a.double() - r)[fin]), 1e-5):
            return False
    return True


def add_scaling(rows: list[dict]) -> dict:
    """Compile CPU time per node of each size relative to the smallest size (about constant =
    linear growth).  CPU time, not wall: the compile is single-threaded, and on a shared machine
    wall time mostly measures the neighbours."""
    ok = [r for r in rows if "compile_s" in r]
    key = "compile_cpu_s" if all("compile_cpu_s" in r for r in ok) else "compile_s"
    base = ok[0][key] / ok[0]["nodes"] if ok else 0
    pbase = ok[0]["passes_s"] / ok[0]["nodes"] if ok else 0
    for r in ok:
        r["us_per_node"] = r[key] / r["nodes"] * 1e6
        r["per_node_vs_smallest"] = (r[key] / r["nodes"]) / base if base else None
        r["passes_per_node_vs_smallest"] = (r["passes_s"] / r["nodes"]) / pbase if pbase else None
    return {"rows": rows, "per_node_from": key}


def scaling(sizes, graph: str = "pointwise") -> dict:
    return add_scaling([pipeline_times(n, graph=graph) for n in sizes])


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description="compile time of synthetic graphs (module docstring)")
    ap.add_argument("sizes", type=int, nargs="*", default=[1000, 10_000])
    ap.add_argument("--graph", choices=sorted(GRAPHS), default="pointwise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cached", action="store_true", help="time a second compile, its kernels already built")
    a = ap.parse_args()
    print(json.dumps(add_scaling([pipeline_times(n, graph=a.graph, seed=a.seed, cached=a.cached) for n in a.sizes]), indent=1))
