"""Smoke run of the benchmark suite (bench/run.py) on its smallest model.  The full bench is not
part of the test suite (`make bench`); this checks that the suite runs end to end, writes the
JSON and Markdown, and computes its ratios and target rows.  Inductor is left out here: its cold
compile alone takes ~30 s on 2 cores (the full bench measures it)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        import run
        import table

        yield run, table
    finally:
        sys.path.remove(str(BENCH))


def test_smoke_run_writes_json_and_table(bench_modules, tmp_path):
    run, _ = bench_modules
    rc = run.main(["--models", "demo-tiny", "--contenders", "eager", "fxforge", "aot_eager", "--calls", "3",
                   "--budget", "1", "--synthetic", "200", "--out", str(tmp_path), "--tag", "smoke"])
    assert rc == 0
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert {"meta", "args", "cases", "synthetic", "targets"} <= set(data)
    for key in ("date_utc", "torch", "cpu", "cores", "torch_threads", "wall_s", "allocator_env"):
        assert key in data["meta"]
    assert [(c["model"], c["mode"]) for c in data["cases"]] == [("demo-tiny", "inference"), ("demo-tiny", "train")]
    pids = [c["pid"] for c in data["cases"]]  # each case measured in a process of its own
    assert len(set(pids)) == 2 and os.getpid() not in pids
    for case in data["cases"]:
        assert not case["errors"], case["errors"]
        res = case["contenders"]
        assert set(res) == {"eager", "fxforge", "aot_eager"}
        for n in ("eager", "fxforge"):
            assert res[n]["time"]["median_s"] > 0 and res[n]["time"]["calls"] >= 3
            assert res[n]["memory"]["peak_bytes"] > 0
        assert res["fxforge"]["first_call_s"] > 0 and res["fxforge"]["backend_s"] > 0
        mem = res["fxforge"]["memory"]  # arenas held between calls count in fxforge's peak
        assert mem["peak_bytes"] == mem["allocated_peak_bytes"] + mem["held_bytes"]
        assert res["fxforge"]["max_abs_err"] < 1e-3
        r = case["ratios"]
        for k in ("time_fxforge_over_eager", "peak_fxforge_over_eager", "first_call_fxforge_over_aot_eager"):
            assert isinstance(r[k], float) and r[k] > 0, k
        assert r["time_fxforge_over_inductor"] is None  # Inductor not run here
        f = case["fxforge"]
        for k in ("arena_bytes", "lower_bound_bytes", "eager_live_peak_bytes", "copy_bytes", "kernels",
                  "fallback_nodes", "compile_seconds", "pass_seconds", "graphs", "arena_over_bound_mean"):
            assert k in f, k
        assert f["kernels"] > 0 and f["pass_seconds"]
    inference = data["cases"][0]
    assert inference["contenders"]["fxforge"]["memory"]["held_bytes"] == \
        inference["fxforge"]["kept_arena_bytes"] + inference["fxforge"]["recycled_bytes"] > 0
    kinds = [g["graph"] for c in data["cases"] for g in c["fxforge"]["graphs"]]
    assert kinds == ["inference", "forward", "backward"]
    (row,) = data["synthetic"]["rows"]
    assert row["nodes"] == 200 and row["compile_s"] > 0 and row["matches_eager"] is True
    assert {t["target"] for t in data["targets"]} >= {"arena / lower bound", "time per call vs eager (not slower)"}
    md = (tmp_path / "smoke.md").read_text()
    assert all(c["threads"] >= 1 for c in data["cases"])
    assert (
        "| demo-tiny train (" in md and "## Geometric means per thread count" in md and "fxforge/eager" in md and "torch 2." in md
    )


def test_ratios_and_targets_with_inductor(bench_modules):
    """The fxforge/Inductor ratios and target rows, on hand-made figures."""
    run, table = bench_modules

    def contender(t, peak, first, backend):
        return {"time": {"median_s": t}, "memory": {"peak_bytes": peak}, "first_call_s": first, "backend_s": backend}

    case = {"model": "m", "mode": "train", "contenders": {
        "eager": contender(2.0, 100, None, None),
        "fxforge": contender(1.0, 80, 3.0, 0.5),
        "inductor": contender(0.5, 160, 30.0, 25.0),
        "aot_eager": {"first_call_s": 2.0}}}
    r = run.ratios(case)
    assert r["time_fxforge_over_eager"] == 0.5 and r["time_fxforge_over_inductor"] == 2.0
    assert r["peak_fxforge_over_eager"] == 0.8 and r["peak_fxforge_over_inductor"] == 0.5
    assert r["first_call_fxforge_over_inductor"] == 0.1 and r["backend_fxforge_over_inductor"] == 0.02
    # aot_eager's 2 s is the shared floor: 2/30 of Inductor's first call, fxforge adds 1 s to Inductor's 28 s
    assert r["first_call_aot_eager_over_inductor"] == 2.0 / 30.0
    assert r["first_call_above_floor_fxforge_over_inductor"] == 1.0 / 28.0
    case["ratios"] = r
    case["fxforge"] = {"graphs": [{"arena_over_bound": 1.01}, {"arena_over_bound": 1.03}]}
    tg = {t["target"]: t for t in table.targets({"cases": [case]})}
    assert tg["compile time vs Inductor cold (first call)"]["status"] == "met"
    assert tg["compile time vs Inductor cold (first call above the aot_eager floor)"]["worst"] == 1.0 / 28.0
    assert tg["training peak vs Inductor"]["status"] == "met"
    assert tg["training peak vs eager"]["status"] == "met"
    assert tg["arena / lower bound"]["status"] == "met"  # mean 1.02
    assert tg["time per call vs eager (not slower)"]["status"] == "met"
    assert tg["pass pipeline, 100k-node graph"]["status"] == "not measured"
    assert tg["time per call vs Inductor, every case"]["status"] == "MISSED"  # 2.0x
    # geomeans per thread count: a second case at another thread count, 0.5x Inductor and 0.8x eager
    fast = {**case, "threads": 2, "ratios": {**r, "time_fxforge_over_inductor": 0.5, "time_fxforge_over_eager": 0.8}}
    slow = {**case, "threads": 1, "ratios": {**r, "time_fxforge_over_inductor": 2.0}}
    rows = table.by_threads({"cases": [slow, fast]})
    assert [(x["threads"], x["fxforge_over_inductor"], x["fxforge_over_eager"]) for x in rows] == [(1, 2.0, 0.5), (2, 0.5, 0.8)]
    assert rows[0]["worst_over_inductor"] == (2.0, "m train (1t)")
    both = {t["target"]: t for t in table.targets({"cases": [slow, fast]})}
    assert both["time per call vs Inductor, geomean at each thread count"]["worst"] == 2.0
    assert both["time per call vs eager, geomean at each thread count"]["status"] == "met"  # 0.5 and 0.8
    del case["fxforge"]  # a partial dict; the real one is covered by the smoke run
    md = table.markdown({"cases": [case], "targets": list(tg.values())})
    assert "| m train | 2000.00 | 1000.00 | 500.00 | 0.50x | 2.00x |" in md


def test_fresh_fxforge_builds_every_kernel_in_a_scratch_cache(bench_modules):
    """The measured first call is cold: inside ``fresh_fxforge`` kernels are built into an empty
    directory of their own, not taken from the user's cache, and the variable is restored after."""
    import torch

    import fxforge

    sys.path.insert(0, str(BENCH))
    try:
        import measure
    finally:
        sys.path.remove(str(BENCH))
    before = os.environ.get("FXFORGE_CACHE_DIR")

    def f(x):
        return (x.cos() * 3 + 1).relu()

    x = torch.randn(16, 8)
    with measure.fresh_fxforge() as fresh:
        assert os.environ["FXFORGE_CACHE_DIR"] == fresh.dir != before and os.listdir(fresh.dir) == []
        out = torch.compile(f, backend=fxforge.backend(fxforge.Config(codegen="c")))(x)
        built = [n for n in os.listdir(os.path.join(fresh.dir, "c")) if n.endswith(".so")]
    assert built, "no kernel was built into the fresh cache"
    torch.testing.assert_close(out, f(x))
    assert os.environ.get("FXFORGE_CACHE_DIR") == before and fresh.dir in measure.SCRATCH_DIRS
    measure.SCRATCH_DIRS.remove(fresh.dir)
    shutil.rmtree(fresh.dir, ignore_errors=True)


def test_warm_process_warms_every_contender(bench_modules, capsys):
    """Each contender's one-time costs are paid before the first case; a failure is reported."""
    run, _ = bench_modules
    run.warm_process("cpu", ["aot_eager", "fxforge"])
    assert "failed" not in capsys.readouterr().err


def test_gpu_flag_without_cuda_exits_clearly(bench_modules, capsys, tmp_path, monkeypatch):
    run, _ = bench_modules
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run.main(["--gpu", "--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_breakdown_rows_categories_and_table(bench_modules):
    """bench/breakdown.py: profiler rows of one kind merge (graph and kernel numbers dropped),
    each falls in its category, and the table puts the contenders' sums side by side."""
    import breakdown

    assert breakdown.row_key("fxforge backward-1 kernel94 [c] hardtanh_backward") == "fxforge backward [c] hardtanh_backward"
    assert breakdown.row_key("graph_1_cpp_fused_gelu_view_3") == "cpp_fused_gelu_view"
    cats = {k: breakdown.category(k) for k in ("aten::mm", "aten::mkldnn_convolution", "fxforge forward [c] gelu",
                                                "cpp_fused_gelu_view", "aten::native_batch_norm_backward",
                                                "CompiledFunctionBackward", "fxforge forward [torch] convolution")}
    assert list(cats.values()) == [breakdown.CATEGORIES[i] for i in (0, 0, 1, 1, 2, 3, 3)]
    res = {"cases": {"m train (2t)": {
        "fxforge": {"median_ms": 10.0, "faults_per_step": 100, "rows": {"aten::mm": 4.0, "fxforge forward [c] gelu": 1.5}},
        "inductor": {"median_ms": 9.0, "faults_per_step": 7, "rows": {"aten::mm": 3.0, "cpp_fused_gelu": 0.25}}}}}
    md = breakdown.markdown(res)
    assert "| matmul and convolution (ATen) | 4.00 | 3.00 |" in md and "| generated kernels | 1.50 | 0.25 |" in md
    assert "| minor faults per step | 100 | 7 |" in md and "| 1.500 | `fxforge forward [c] gelu` |" in md


def test_the_simulator_waits_for_the_last_rank_to_issue():
    """bench/comm_sim.simulate_ranks: a collective starts when the last rank has issued it, so
    the rank that issues first waits for the other as well as for the link; one rank alone
    waits for the link only (``simulate``)."""
    sys.path.insert(0, str(BENCH))
    try:
        from comm_sim import WAIT, simulate, simulate_ranks
    finally:
        sys.path.remove(str(BENCH))
    link = {"name": "test", "alpha_s": 0.0, "beta_s_per_byte": 1e-6}  # 1 ms per kB
    schedule = [("issue", "all_gather", 2, 1000), ("wait", 0)]

    def trace(compute_before_us):  # (name, start_us, duration_us): compute, the issue, compute, the wait
        return [("mm", 0, compute_before_us), ("_c10d_functional::all_gather_into_tensor", compute_before_us, 10),
                ("mm", compute_before_us + 10, 500), (WAIT, compute_before_us + 510, 1)]

    alone = simulate(trace(0), schedule, link)
    assert alone["wait_s"] == pytest.approx(1e-3 - 500e-6) and alone["matched"]
    early, late = simulate_ranks([trace(0), trace(3000)], [schedule, schedule], link)
    assert late["wait_s"] == pytest.approx(1e-3 - 500e-6)  # the link only: the other had issued already
    assert early["wait_s"] == pytest.approx(3e-3 + 1e-3 - 500e-6)  # the other rank's 3 ms, then the link
    assert early["matched"] and late["matched"]


def test_the_link_fitted_in_the_run_is_the_one_its_waits_were_made_by():
    """bench/comm_sim.fit_link: steps whose collectives are each waited for at once, made by a
    link 1.5x slower than the model calibrated before, scale that model by 1.5: the replay of
    those steps under the fit waits what they waited."""
    sys.path.insert(0, str(BENCH))
    try:
        from comm_sim import WAIT, fit_link, simulate_ranks
        from fxforge.core.costs import CommModel
    finally:
        sys.path.remove(str(BENCH))
    base = CommModel("calibrated", 300e-6, 2e-8, reduce_scatter_as_all_reduce=True)
    true = CommModel("true", 450e-6, 3e-8, reduce_scatter_as_all_reduce=True)
    schedule = [("issue", "all_gather", 2, 1 << 20), ("wait", 0), ("issue", "reduce_scatter", 2, 1 << 16), ("wait", 1),
                ("issue", "all_reduce", 2, 1 << 18), ("wait", 2)]
    issues = [r for r in schedule if r[0] == "issue"]

    def trace(compute_us):  # compute, then each collective issued and waited for: its time under the true link
        rows, t = [("mm", 0, compute_us)], compute_us
        for _, kind, n, sent in issues:
            d = true.time(kind, sent, n) * 1e6
            rows += [(f"_c10d_functional::{kind}", t, 5), (WAIT, t + 5, d)]
            t += d + 5
        return rows

    steps = [[trace(100), trace(100)], [trace(100), trace(100)], [trace(0), trace(0)]]
    fit = fit_link(steps, [schedule, schedule], base)
    assert fit.alpha_s == pytest.approx(true.alpha_s) and fit.beta_s_per_byte == pytest.approx(true.beta_s_per_byte)
    assert fit.reduce_scatter_as_all_reduce
    measured = sum(d for op, _, d in trace(100) if op == WAIT) * 1e-6
    assert simulate_ranks([trace(100)] * 2, [schedule] * 2, fit)[0]["wait_s"] == pytest.approx(measured)
    assert fit_link([[trace(0)[:1], trace(0)[:1]]], [schedule, schedule], base) is None  # nothing waited: no fit
