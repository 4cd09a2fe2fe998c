"""Compute-communication overlap (``passes/overlap.py``) and the communication figures of a
schedule (``stats["comm"]``): on graphs traced against a fake process group (one process), and
end to end on two gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx

import fxforge
from fxforge.core.costs import COMM_PRESETS, CommModel, ComputeModel, comm_model
from fxforge.passes.overlap import comm_figures, is_collective, is_wait, overlap, waited_collective
from fxforge.core.graph import GROUP
from fxforge.passes.schedule import peak_bytes, program_order


@pytest.fixture
def fake_group():
    """Four ranks of torch's fake process group (no communication): graphs with collectives
    trace and compile in this one process."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


def _funcol():
    return torch.ops._c10d_functional


def fsdp_like(group: str):
    """Two layers whose weights are gathered before use, and a gradient reduce-scattered at the
    end: each collective waited for at once, as tracing leaves it."""
    f = _funcol()

    def step(x, w1, w2):
        a = f.wait_tensor(f.all_gather_into_tensor(w1, 4, group))
        h = torch.relu(x @ a.t())
        b = f.wait_tensor(f.all_gather_into_tensor(w2, 4, group))
        y = torch.tanh(h @ b)
        g = f.wait_tensor(f.reduce_scatter_tensor(y.sum(0), "sum", 4, group))
        return y, g

    return make_fx(step, tracing_mode="fake")(torch.randn(64, 128), torch.randn(64, 128), torch.randn(64, 128))


def _check_order(order: list) -> None:
    """Every node after what it reads."""
    at = {n: i for i, n in enumerate(order)}
    for n in order:
        for a in n.all_input_nodes:
            assert at[a] < at[n], f"{n.name} runs before its input {a.name}"


def test_waits_sink_to_their_readers_and_collectives_issue_when_their_inputs_are_ready(fake_group):
    gm = fsdp_like(fake_group)
    order = program_order(gm)
    new, moved = overlap(gm, order, (), fxforge.Config(prefetch_peak_growth=float("inf")))
    _check_order(new)
    at = {n: i for i, n in enumerate(new)}
    issues = [n for n in new if is_collective(n)]
    assert [n.name for n in issues] == [n.name for n in order if is_collective(n)]  # the issue order kept
    for c in issues:  # right after the last of its inputs or the collective before it
        floor = max([at[a] for a in c.all_input_nodes] + [at[x] for x in issues if at[x] < at[c]] + [-1])
        assert at[c] == floor + 1, (c.name, at[c], floor)
    for w in (n for n in new if is_wait(n)):  # just before its first reader (a returned one: at the end)
        readers = [at[u] for u in w.users if u in at]
        assert at[w] + 1 == (min(readers) if readers else len(new)), w.name
    gather2 = issues[1]
    assert at[gather2] < at[next(n for n in new if n.target is torch.ops.aten.mm.default)]  # prefetched past a matmul
    assert moved["moved_issues"] >= 1


def test_prefetching_stays_within_its_memory_bound(fake_group):
    """With no growth allowed, no collective is issued where its output would raise the peak."""
    gm = fsdp_like(fake_group)
    order = program_order(gm)
    base = peak_bytes(gm, order)
    free, _ = overlap(gm, order, (), fxforge.Config(prefetch_peak_growth=float("inf")))
    bounded, moved = overlap(gm, order, (), fxforge.Config(prefetch_peak_growth=0.0))
    assert peak_bytes(gm, free) > base  # the prefetch costs memory here...
    assert peak_bytes(gm, bounded) <= base and moved["peak_after"] <= moved["peak_before"]  # ...and is held back
    _check_order(bounded)


def test_the_memory_plans_peak_takes_back_the_moves_that_raise_it(fake_group):
    """``overlap`` given the memory plan's peak of a schedule: moves raising it past the bound
    (here: any wait not right after its collective, as an arena kept whole might) are taken
    back, the issues' moves kept where they alone fit; end to end, a compiled graph's plan stays
    within the bound of the same graph compiled with the collectives waited for at once."""
    f = _funcol()

    def step(x, w):
        g = f.wait_tensor(f.all_gather_into_tensor(w, 4, fake_group))
        h = torch.relu(x @ x.t()) @ x  # (independent of the gather: its wait can sink past it)
        return h + g.sum()

    gm = make_fx(step, tracing_mode="fake")(torch.randn(64, 64), torch.randn(16, 64))
    order = program_order(gm)
    config = fxforge.Config(prefetch_peak_growth=float("inf"))

    def sunk_waits(o):
        at = {n: i for i, n in enumerate(o)}
        return sum(1 for n in o if is_wait(n) and at[n] != at[waited_collective(n)] + 1)

    free, moved = overlap(gm, order, (), config, lambda o: 1000 + 1000 * sunk_waits(o))
    assert moved["moved_waits"] > 0 and moved["planned_peak_after"] > 1000  # (no bound: all moves stay)
    held, moved = overlap(gm, order, (), config.replace(prefetch_peak_growth=0.5), lambda o: 1000 + 1000 * sunk_waits(o))
    assert sunk_waits(held) == 0 and moved["moved_waits"] == 0
    assert moved["planned_peak_after"] == moved["planned_peak_before"] == 1000
    _check_order(held)
    for growth in (0.0, 0.1):
        plans = [fxforge.spine.compile_graph(fsdp_like(fake_group), fxforge.Config(comm_overlap=on,
                                             prefetch_peak_growth=growth), kind="inference", cache=False).plan.memory
                 for on in (False, True)]
        assert plans[1].peak_bytes <= (1 + growth) * plans[0].peak_bytes


def test_a_write_in_place_bounds_the_moves(fake_group):
    """A collective is never issued before, nor a wait moved past, a node writing in place."""
    f = _funcol()

    def step(x, w, buf):
        y = torch.relu(x @ x)
        buf.add_(1.0)
        a = f.wait_tensor(f.all_gather_into_tensor(w, 4, fake_group))
        z = torch.tanh(y)
        buf.mul_(2.0)
        return z @ a.t(), buf

    gm = make_fx(step, tracing_mode="fake")(torch.randn(32, 32), torch.randn(8, 32), torch.randn(4))
    order = program_order(gm)
    new, _ = overlap(gm, order, (), fxforge.Config(prefetch_peak_growth=float("inf")))
    at = {n: i for i, n in enumerate(new)}
    writes = [at[n] for n in new if n.target in (torch.ops.aten.add_.Tensor, torch.ops.aten.mul_.Tensor)]
    c = next(n for n in new if is_collective(n))
    w = next(n for n in new if is_wait(n))
    assert writes[0] < at[c] and at[w] < writes[1]
    _check_order(new)


def test_the_figures_say_how_much_compute_hides(fake_group):
    gm = fsdp_like(fake_group)
    order = program_order(gm)
    new, _ = overlap(gm, order, (), fxforge.Config(prefetch_peak_growth=float("inf")))
    link = CommModel("slow", 20e-6, 1 / 1e9)
    cpu = ComputeModel("cpu", 20e9, 10e9)
    before, after = comm_figures(gm, order, (), link, cpu), comm_figures(gm, new, (), link, cpu)
    assert before["count"] == after["count"] == 3 and before["bytes"] == after["bytes"] > 0
    assert before["estimated_s"] == pytest.approx(after["estimated_s"])
    assert before["exposed_s"] == pytest.approx(before["estimated_s"])  # traced: every wait right after its issue
    assert after["exposed_s"] < before["exposed_s"]
    assert before["order_digest"] == after["order_digest"]
    # the all-gathers' figure follows the alpha-beta formula: (n-1) alpha + bytes sent beta
    g = after["collectives"][0]
    assert g["estimated_s"] == pytest.approx(3 * 20e-6 + g["bytes"] * 1e-9)


def test_compiled_graphs_carry_the_figures(fake_group):
    """Every compiled graph's stats hold ``comm`` (count, bytes, estimated and exposed time)."""
    gm = fsdp_like(fake_group)
    c = fxforge.spine.compile_graph(gm, fxforge.Config(comm_model="infiniband"), kind="inference", cache=False)
    comm = c.stats["comm"]
    assert comm["count"] == sum(map(is_collective, c.plan.schedule)) >= 2 and comm["model"] == "infiniband"
    assert 0.0 <= comm["exposed_s"] <= comm["estimated_s"]
    plain = fxforge.spine.compile_graph(fsdp_like(fake_group), fxforge.Config(comm_overlap=False), kind="inference",
                                        cache=False)
    assert plain.stats["comm"]["exposed_s"] == pytest.approx(plain.stats["comm"]["estimated_s"])


def test_the_report_draws_collectives_beside_the_kernels(fake_group):
    """``stats["comm"]["timeline"]`` is the replay the figures come from: one communication event
    per collective, stalls adding up to ``exposed_s``, compute events in schedule order without
    overlap; the report's Schedule section draws every one of them and lists each collective."""
    from fxforge.report.html import render

    for overlapped in (False, True):
        c = fxforge.spine.compile_graph(fsdp_like(fake_group), fxforge.Config(comm_overlap=overlapped,
                                                                              comm_model="loopback-1gbit"),
                                        kind="inference", cache=False)
        comm = c.stats["comm"]
        events = comm["timeline"]
        lanes = [e[0] for e in events]
        assert lanes.count("comm") == comm["count"] > 0
        assert sum(e[3] - e[2] for e in events if e[0] == "stall") == pytest.approx(comm["exposed_s"])
        assert all(e[2] <= e[3] for e in events)
        work = [e for e in events if e[0] in ("compute", "stall")]  # (one lane: each after the last)
        assert all(a[3] <= b[2] + 1e-15 for a, b in zip(work, work[1:]))
        if not overlapped:
            assert lanes.count("stall") == comm["count"]  # (traced: every wait right after its issue)
        page = render(c)
        section = page[page.index('id="g0-schedule"'):]
        section = section[:section.index("</section>")]
        assert section.count("<rect ") == len(events)
        for r in comm["collectives"]:
            assert f"collective {r['node']}:" in section and f"<code>{r['node']}</code>" in section
        assert section.count('fill="#d62728"') == lanes.count("stall")


def _collectives(gm) -> list:
    return [n for n in gm.graph.nodes if is_collective(n)]


def test_small_collectives_are_bucketed_where_their_results_are_first_needed(fake_group):
    from fxforge.passes.bucketing import BucketCollectives

    gm = fsdp_like(fake_group)
    before = [(n.target, n.args[0].meta["val"].shape) for n in _collectives(gm)]
    r = BucketCollectives(fxforge.Config())(gm)
    gm.graph.lint()
    after = _collectives(gm)
    assert r.stats == {"buckets": 1, "bucketed": 2} and len(after) == len(before) - 1
    gather = after[0]
    assert gather.args[0].target is torch.ops.aten.cat.default  # one flat buffer...
    assert gather.meta["val"].shape == (4 * 2 * 64 * 128,)  # ...of both weights, from 4 ranks
    # issued before the first matmul reading the first weight (the second is prefetched with it)
    at = {n: i for i, n in enumerate(gm.graph.nodes)}
    assert at[gather] < at[next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default)]
    assert r.modified and not BucketCollectives(fxforge.Config(bucket_bytes=0))(fsdp_like(fake_group)).modified


def test_a_collective_whose_input_needs_another_ones_result_is_not_bucketed_with_it(fake_group):
    from fxforge.passes.bucketing import BucketCollectives

    f = _funcol()

    def chained(w):
        a = f.wait_tensor(f.all_gather_into_tensor(w, 4, fake_group))
        return f.wait_tensor(f.all_gather_into_tensor(torch.relu(a), 4, fake_group))

    gm = make_fx(chained, tracing_mode="fake")(torch.randn(4, 8))
    assert not BucketCollectives(fxforge.Config())(gm).modified and len(_collectives(gm)) == 2
    small = fsdp_like(fake_group)
    assert not BucketCollectives(fxforge.Config(bucket_bytes=64 * 128 * 4))(small).modified  # one weight a bucket


def test_all_reduces_are_bucketed_and_their_results_are_views(fake_group):
    """Data-parallel gradients (all-reduced, read only by the graph's output) go in one
    all-reduce over their flat buffer, each result a view of its slice; an all-reduce whose
    input needs another one's result stays apart, as do other reductions and dtypes."""
    from fxforge.passes.bucketing import BucketCollectives

    f = _funcol()

    def step(x, w1, w2):
        h = torch.relu(x @ w1)
        y = h @ w2
        g2 = f.wait_tensor(f.all_reduce(h.t() @ y, "sum", fake_group))
        g1 = f.wait_tensor(f.all_reduce(x.t() @ y, "sum", fake_group))
        top = f.wait_tensor(f.all_reduce(y.amax(), "max", fake_group))
        chained = f.wait_tensor(f.all_reduce(g1 * 2.0, "sum", fake_group))
        return g1, g2, top, chained

    args = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    gm = make_fx(step, tracing_mode="fake")(*args)
    r = BucketCollectives(fxforge.Config())(gm)
    gm.graph.lint()
    assert r.stats == {"buckets": 1, "bucketed": 2}
    reduces = _collectives(gm)
    assert len(reduces) == 3
    merged = next(n for n in reduces if n.args[0].target is torch.ops.aten.cat.default)
    assert merged.meta["val"].shape == (2 * 16 * 16,)
    (wait,) = merged.users
    assert {u.target for u in wait.users} == {torch.ops.aten.slice.Tensor}  # no copy-out
    gm.recompile()
    plain = make_fx(step, tracing_mode="real")(*args)  # (fake group: each all-reduce returns its input)
    for got, want in zip(gm(*args), plain(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_data_parallel_gradients_are_all_reduced_in_buckets_on_two_ranks():
    """``partition`` with every parameter whole on each rank and the batch split (data parallel)
    on two gloo ranks: eager's loss and gradients; the gradients' all-reduces bucketed, bit for
    bit what the unbucketed step gives, the bucket written in place."""
    from partition_ranks import run_ranks

    from overlap_cases import ddp_training

    ranks = run_ranks(ddp_training, 2, timeout=300)
    for r in ranks:
        assert r["bucketed"]["kinds"].count("all_reduce") < r["plain"]["kinds"].count("all_reduce") == r["params"] + 1
        assert r["bucketed"]["copy_bytes"] == 0  # no copy-in: each gradient written into its run of the bucket
        assert r["same"]


def _stall(runs, seconds) -> float:
    """The compute's stall for ``runs`` sent one after another (bucketing's model, written out
    directly: the link's clock, and the compute's, shifted by what it has stalled)."""
    link = stalled = 0.0
    for run in runs:
        start = max(link, max(m.ready_s for m in run) + stalled)
        link = start + seconds(sum(m.sent for m in run))
        due = min(m.due_s for m in run) + stalled
        stalled += max(0.0, link - due)
    return stalled


def _cuts(n: int):
    """Every way to cut ``range(n)`` into runs."""
    for mask in range(1 << (n - 1)):
        runs, run = [], [0]
        for i in range(1, n):
            if mask >> (i - 1) & 1:
                runs.append(run)
                run = []
            run.append(i)
        yield runs + [run]


def test_bucket_cuts_stall_the_compute_least():
    """Bucketing cuts one key's collectives into runs for the least stall, each run costing one
    latency more: on random members (when made, when read, bytes) the same cost as the best of
    every possible cut, within the byte limit; gathers all read at once go in one bucket, and
    under a slow link the gather read first is sent alone and the gradient made last is
    reduce-scattered alone."""
    import random

    from fxforge.passes.bucketing import _Member, _partition

    def seconds(sent):
        return 1e-4 + sent * 1e-9

    rng = random.Random(0)
    for trial in range(200):
        n = rng.randint(1, 7)
        ready = sorted(rng.uniform(0, 0.01) for _ in range(n))
        members = [_Member(None, i, 100 + i, b, b, ready[i], ready[i] + rng.uniform(0, 0.01))
                   for i, b in enumerate(rng.choice([1e5, 1e6, 4e6]) for _ in range(n))]
        limit = rng.choice([2e6, 8e6, 1e9])
        got = _partition(members, limit, seconds)
        assert [m for run in got for m in run] == members, trial
        assert all(len(run) == 1 or sum(m.nbytes for m in run) <= limit for run in got), trial
        best = min(_stall([[members[i] for i in run] for run in cut], seconds) + len(cut) * seconds(0)
                   for cut in _cuts(n)
                   if all(len(run) == 1 or sum(members[i].nbytes for i in run) <= limit for run in cut))
        assert _stall(got, seconds) + len(got) * seconds(0) == pytest.approx(best, abs=1e-12), trial

    def gathers(due):  # parameters: inputs ready at once, each read at its layer's time
        return [_Member(None, 0, 10 + i, 1e6, 1e6, 0.0, d) for i, d in enumerate(due)]

    assert len(_partition(gathers([0.0] * 6), 1e9, seconds)) == 1  # all read at once: one bucket
    runs = _partition(gathers([0.003 * i for i in range(8)]), 1e9, seconds)
    assert len(runs[0]) == 1 and len(runs) < 8  # the first alone, later ones merged where the link keeps up
    grads = [_Member(None, 10 + i, 100, 1e6, 1e6, 0.002 * i, 0.0155) for i in range(8)]  # made one by one, read at the end
    runs = _partition(grads, 1e9, seconds)
    assert len(runs[-1]) == 1 and len(runs) < 8


def test_comm_model_names_and_errors():
    assert comm_model("auto", "nccl").name == "nvlink" and comm_model("auto", "gloo").name == "gloo-loopback"
    m = comm_model({"alpha_s": 1e-5, "bandwidth": 2e9})
    assert m.time("all_reduce", 2_000_000, 4) == pytest.approx(6 * 1e-5 + 1e-3)
    assert set(COMM_PRESETS) >= {"nvlink", "infiniband", "pcie"}
    with pytest.raises(ValueError, match="comm_model"):
        fxforge.Config(comm_model="token-ring")


def test_two_gloo_ranks_overlap_in_the_same_order_and_match_eager():
    from partition_ranks import run_ranks

    from overlap_cases import fsdp_training

    ranks = run_ranks(fsdp_training, 2, timeout=300)
    on = [r[True] for r in ranks]
    off = [r[False] for r in ranks]
    assert ranks[0]["link"] == ranks[1]["link"]  # calibrated: one model on both ranks
    assert on[0]["digest"] == on[1]["digest"] and off[0]["digest"] == off[1]["digest"]  # one issue order on both
    assert on[0]["order"] == on[1]["order"]  # one schedule on both ranks
    assert 0 < on[0]["count"] < off[0]["count"]  # buckets
    assert max(on[0]["gaps"]) > 1 and max(off[0]["gaps"]) == 1  # traced: wait right after; overlapped: compute between
    assert on[0]["exposed_s"] <= off[0]["exposed_s"]


def test_a_copy_in_moves_up_with_its_collective(fake_group):
    """What computes a collective's input for it alone (a flat buffer's copy-in) is hoisted with
    it: the gather is issued before unrelated compute, not behind it."""
    f = _funcol()

    def step(x, w1, w2):
        h = torch.relu(x @ x)
        flat = torch.cat([w1.flatten(), w2.flatten()])
        g = f.wait_tensor(f.all_gather_into_tensor(flat, 4, fake_group))
        return h @ g.view(-1, 32)[:32], g

    gm = make_fx(step, tracing_mode="fake")(torch.randn(32, 32), torch.randn(8, 32), torch.randn(8, 32))
    order = program_order(gm)
    new, moved = overlap(gm, order, (), fxforge.Config(prefetch_peak_growth=float("inf")))
    _check_order(new)
    at = {n: i for i, n in enumerate(new)}
    first_mm = min(at[n] for n in new if n.target is torch.ops.aten.mm.default)
    cat = next(n for n in new if n.target is torch.ops.aten.cat.default)
    gather = next(n for n in new if is_collective(n))
    assert at[cat] < at[gather] < first_mm and moved["moved_issues"] == 1


def test_fusion_keeps_collectives_in_program_order(fake_group):
    """A kernel that would need one collective issued before it and an earlier one after it (so
    the collectives' order could not be kept) is not formed: the graph compiles and runs."""
    f = _funcol()

    def step(x, y):
        a = x * 2.0
        r1 = f.wait_tensor(f.all_reduce(a, "sum", fake_group))
        r2 = f.wait_tensor(f.all_reduce(y, "sum", fake_group))
        return a + r2, r1

    gm = make_fx(step, tracing_mode="fake")(torch.randn(64), torch.randn(64))
    traced = [n.args[0].name for n in gm.graph.nodes if is_collective(n)]
    c = fxforge.spine.compile_graph(gm, fxforge.Config(debug=True, bucket_bytes=0), kind="inference", cache=False)
    assert [n.args[0].name for n in c.plan.schedule if is_collective(n)] == traced  # the program's order
    a, b = (next(n for n in c.plan.schedule if n.target is op) for op in (torch.ops.aten.mul.Tensor,
                                                                         torch.ops.aten.add.Tensor))
    assert GROUP.get(a) is None or GROUP.get(a) != GROUP.get(b)  # not one kernel


def test_partition_trains_a_gpt_with_cross_entropy_on_two_ranks():
    """FSDP-style ``partition`` of a GPT (cross-entropy, fused kernels around collectives) on two
    gloo ranks: eager's loss and gradients, one collective order on both."""
    from partition_ranks import run_ranks

    from overlap_cases import gpt_fsdp_training

    ranks = run_ranks(gpt_fsdp_training, 2, timeout=300)
    assert ranks[0]["digest"] == ranks[1]["digest"] and ranks[0]["count"] > 0


def test_a_kernel_group_moves_as_one_whatever_its_backend(fake_group):
    """The wrapper emits every kernel group as one call, fused or not: no collective or wait is
    moved between a group's nodes (a collective reading the group's first value would be issued
    before the call that computes it)."""
    f = _funcol()

    def step(x, w):
        a = x * 2.0
        b = torch.tanh(x @ x)
        r = f.wait_tensor(f.all_reduce(a, "sum", fake_group))
        g = f.wait_tensor(f.all_gather_into_tensor(w, 4, fake_group))
        return r + b, g

    gm = make_fx(step, tracing_mode="fake")(torch.randn(32, 32), torch.randn(8, 32))
    order = program_order(gm)
    mul, mm, tanh = (next(n for n in order if n.target is op) for op in
                     (torch.ops.aten.mul.Tensor, torch.ops.aten.mm.default, torch.ops.aten.tanh.default))
    for n in (mul, mm, tanh):  # one group of a backend that does not fuse (fused=() below)
        GROUP.set(n, 7)
    order = [n for n in order if n not in (mm, tanh)]
    order.insert(order.index(mul) + 1, mm)
    order.insert(order.index(mm) + 1, tanh)
    new, _ = overlap(gm, order, (), fxforge.Config(prefetch_peak_growth=float("inf")))
    _check_order(new)
    at = {n: i for i, n in enumerate(new)}
    assert at[mm] == at[mul] + 1 and at[tanh] == at[mm] + 1
    reduce = next(n for n in new if n.target is torch.ops._c10d_functional.all_reduce.default)
    assert at[reduce] > at[tanh]


def _max_in_flight(order) -> int:
    live, most = set(), 0
    for n in order:
        if is_collective(n):
            live.add(n)
            most = max(most, len(live))
        elif is_wait(n):
            live.discard(waited_collective(n))
    return most


def test_collectives_in_flight_are_bounded(fake_group):
    """Twelve gathers issued before any wait (as a schedule may order them): at most
    ``Config.max_collectives_in_flight`` outstanding at once, the oldest waited for first; every
    node still after what it reads.  (gloo corrupts its heap with a few tens outstanding.)"""
    from fxforge.passes.overlap import bound_in_flight

    f = _funcol()

    def step(*ws):
        handles = [f.all_gather_into_tensor(w, 4, fake_group) for w in ws]
        return sum(f.wait_tensor(h).sum() for h in handles)

    gm = make_fx(step, tracing_mode="fake")(*[torch.randn(8, 8) for _ in range(12)])
    order = program_order(gm)
    assert _max_in_flight(order) == 12
    bounded, moved = bound_in_flight(order, 4)
    _check_order(bounded)
    assert _max_in_flight(bounded) == 4 and moved == 8 and sorted(bounded, key=id) == sorted(order, key=id)
    assert bound_in_flight(order, 0) == (order, 0)
    c = fxforge.spine.compile_graph(gm, fxforge.Config(max_collectives_in_flight=3, bucket_bytes=0), kind="inference",
                                    cache=False)
    assert _max_in_flight(c.plan.schedule) <= 3
    with pytest.raises(ValueError, match="max_collectives_in_flight"):
        fxforge.Config(max_collectives_in_flight=-1)


def test_buckets_whose_results_feed_other_buckets(fake_group):
    """Gathered weights reduce-scattered at once (as tensor parallelism on a 2-D mesh makes
    them), the reduce-scatters' bucket closed before the gathers' is (the third does not fit):
    both are made, every node made lands in the graph, and the graph compiles."""
    from fxforge.passes.bucketing import BucketCollectives

    f = _funcol()

    def step(w1, w2, w3):
        gathered = [f.wait_tensor(f.all_gather_into_tensor(w, 4, fake_group)) for w in (w1, w2, w3)]
        return [f.wait_tensor(f.reduce_scatter_tensor(a, "sum", 4, fake_group)) * 2.0 for a in gathered]

    def traced():
        return make_fx(step, tracing_mode="fake")(*[torch.randn(8, 16) for _ in range(3)])

    config = fxforge.Config(bucket_bytes=2 * 32 * 16 * 4, debug=True)  # two gathered weights a bucket
    gm = traced()
    r = BucketCollectives(config)(gm)
    assert r.stats == {"buckets": 2, "bucketed": 5}
    listed = set(gm.graph.nodes)
    for n in gm.graph.nodes:  # nothing reads a node that is not in the graph
        assert all(a in listed for a in n.all_input_nodes), n.name
        assert all(u in listed for u in n.users), n.name
    c = fxforge.spine.compile_graph(traced(), config, kind="inference", cache=False)
    assert c.stats["comm"]["count"] == 3


def test_gradients_reduced_over_both_mesh_dims_are_bucketed_on_both(fake_group):
    """A 2-D mesh's gradients, each reduce-scattered over one dimension where it is made and the
    result reduced again over the other (a cat laying out the blocks for one of them, as DTensor
    traces it), and returned: the second collectives move to the output, so the first ones are
    bucketed together (traced, each one's result was read at once), and so are the second ones.
    The values are the unbucketed graph's."""
    from torch.distributed.device_mesh import init_device_mesh

    from fxforge.passes.bucketing import BucketCollectives

    f = _funcol()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_group().group_name, mesh["tp"].get_group().group_name

    def step(x, w1, w2, w3):
        out = []
        for i, w in enumerate((w1, w2, w3)):
            g = f.wait_tensor(f.reduce_scatter_tensor(x.t() @ torch.tanh(x @ w), "sum", 2, dp))
            if i == 1:  # (reduce-scattered along its columns: blocks cat'ed first)
                out.append(f.wait_tensor(f.reduce_scatter_tensor(torch.cat(g.split(8, 1)), "sum", 2, tp)))
            else:
                out.append(f.wait_tensor(f.all_reduce(g, "sum", tp)))
        return out

    args = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16), torch.randn(16, 16))
    traced = make_fx(step, tracing_mode="fake")
    gm = traced(*args)
    r = BucketCollectives(fxforge.Config(debug=True))(gm)
    gm.graph.lint()
    assert r.stats == {"buckets": 2, "bucketed": 5}, r.stats  # three reduce-scatters; two all-reduces
    kinds = sorted((c.target.__name__, c.args[-1]) for c in _collectives(gm))
    assert kinds == [("all_reduce.default", tp), ("reduce_scatter_tensor.default", dp),
                     ("reduce_scatter_tensor.default", tp)]
    gm.recompile()
    plain = make_fx(step, tracing_mode="real")(*args)  # (fake group: deterministic results)
    for got, want in zip(gm(*args), plain(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert BucketCollectives(fxforge.Config())(traced(*args)).stats == r.stats  # (not debug: the same)


def test_a_second_collective_stays_before_a_write_into_what_it_reads(fake_group):
    """The first collective's result written in place after the second one read it: the second
    one is neither moved past that write nor bucketed with the next one (the bucket would be
    issued after the write): either would reduce the written values."""
    from torch.distributed.device_mesh import init_device_mesh

    from fxforge.passes.bucketing import BucketCollectives

    f = _funcol()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_group().group_name, mesh["tp"].get_group().group_name

    def step(x, w1, w2):
        out = []
        for w in (w1, w2):
            g = f.wait_tensor(f.reduce_scatter_tensor(x.t() @ torch.tanh(x @ w), "sum", 2, dp))
            out.append(f.wait_tensor(f.all_reduce(g, "sum", tp)))
            g.mul_(2.0)
            out.append(g)
        return out

    args = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    gm = make_fx(step, tracing_mode="fake")(*args)
    BucketCollectives(fxforge.Config(debug=True))(gm)
    gm.graph.lint()
    gm.recompile()
    plain = make_fx(step, tracing_mode="real")(*args)
    for got, want in zip(gm(*args), plain(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_graph_whose_collective_result_nobody_reads_is_left_as_it_is(fake_group):
    """A collective whose wait's result is unused has no bucket to join: the pass leaves the graph
    as it was (it once failed on a graph with no collective it could bucket)."""
    from fxforge.passes.bucketing import BucketCollectives

    f = _funcol()

    def step(x):
        f.wait_tensor(f.all_reduce(x * 2, "sum", fake_group))
        return x + 1

    gm = make_fx(step, tracing_mode="fake")(torch.randn(4))
    before = gm.code
    r = BucketCollectives(fxforge.Config(debug=True))(gm)
    assert not r.modified and r.stats == {"buckets": 0, "bucketed": 0}
    gm.recompile()
    assert gm.code == before


def test_distributed_docs_example_with_torchrun(tmp_path):
    """docs/distributed.md's FSDP-style step, run as written with torchrun (2 processes): the
    loss of the whole batch, one collective order on both ranks; bounded at 180 s."""
    import os
    import re

    from partition_ranks import run_documented_torchrun

    doc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "distributed.md")
    stdout = run_documented_torchrun(doc, "<!-- runs with torchrun --nproc-per-node 2 in tests/test_overlap.py -->",
                                     tmp_path, timeout=180)
    # (the digest is 16 hex digits: the two ranks' lines can reach stdout without a newline between)
    lines = re.findall(r"(\d+) collectives, (\d+) bytes sent, order ([0-9a-f]{16})", stdout)
    assert len(lines) == 2 and lines[0] == lines[1], stdout


def test_a_graph_without_collectives_is_left_unchanged():
    """No collective: overlap, bucketing and the in-flight bound change nothing, and the
    schedule is the one compiled with them off."""
    from fxforge.passes.bucketing import BucketCollectives
    from fxforge.passes.overlap import bound_in_flight

    def f(x, w):
        return torch.relu(x @ w).sum(0) + torch.tanh(x).mean()

    def traced():
        return make_fx(f, tracing_mode="fake")(torch.randn(16, 32), torch.randn(32, 8))

    gm = traced()
    order = program_order(gm)
    assert overlap(gm, order, (), fxforge.Config()) == (order, {})
    assert bound_in_flight(order, 1) == (order, 0)
    assert not BucketCollectives(fxforge.Config())(gm).modified
    on = fxforge.spine.compile_graph(traced(), fxforge.Config(), kind="inference", cache=False)
    off = fxforge.spine.compile_graph(traced(), fxforge.Config(comm_overlap=False, bucket_bytes=0,
                                                               max_collectives_in_flight=0),
                                      kind="inference", cache=False)
    assert [n.name for n in on.plan.schedule] == [n.name for n in off.plan.schedule]
    assert on.stats["comm"]["count"] == 0 and on.stats["comm"]["exposed_s"] == 0.0
    assert "timeline" not in on.stats["comm"]  # (and the report has no Schedule section)
    from fxforge.report.html import render

    assert "-schedule" not in render(on)


def test_fsdp_gathers_each_parameter_once_and_scatters_gradients_where_they_are_made():
    """``compute_placements`` (stored ``Shard(0)``, read ``Replicate()``) on two gloo ranks: each
    parameter all-gathered once, eager's loss and gradients; with the defaults the gathers and
    scatters are bucketed; overlapped, the first gradient is reduce-scattered while the backward
    still has matmuls to run (its collective is traced where the gradient is made, not at the
    graph's output)."""
    from partition_ranks import run_ranks

    from overlap_cases import gpt_fsdp_gathered

    ranks = run_ranks(gpt_fsdp_gathered, 2, timeout=300)
    traced, default = ranks[0]["traced"], ranks[0]["default"]
    gathered = traced["gathered_inputs"]
    assert len(gathered) == len(set(gathered)) == ranks[0]["params"]  # every parameter, once
    assert traced["kinds"].count("reduce_scatter") >= ranks[0]["params"] - 2  # (a grad may be all-reduced instead)
    assert len(default["kinds"]) * 3 <= len(traced["kinds"])
    assert ranks[0]["unbucketed"]["first_scatter_before_last_matmul"]
    assert default["exposed_s"] < traced["exposed_s"]
    assert ranks[0]["default"]["digest"] == ranks[1]["default"]["digest"]


def test_copy_outs_wait_for_their_readers(fake_group):
    """A schedule that copies every member out of a gathered bucket at once (as one by live bytes
    does) is reordered so that each copy-out comes just before what reads it, and the bucket's
    wait just before the first: the second weight's copy-out follows the first matmul."""
    from fxforge.passes.bucketing import BucketCollectives

    gm = fsdp_like(fake_group)
    assert BucketCollectives(fxforge.Config())(gm).modified
    order = program_order(gm)
    wait = next(n for n in order if is_wait(n) and waited_collective(n).target is _funcol().all_gather_into_tensor.default)
    clones = [n for n in order if n.target is torch.ops.aten.clone.default]
    assert len(clones) == 2
    chain, todo = set(), [clones[1]]  # (its slice of the gathered rows back to the wait, its view after)
    while todo:
        n = todo.pop()
        if n is not wait and n not in chain:
            chain.add(n)
            todo += n.all_input_nodes
    chain.update(u for u in clones[1].users if u.target is torch.ops.aten.view.default)
    second = [n for n in order if n in chain]
    early = [n for n in order if n not in second]
    early[early.index(wait) + 1:early.index(wait) + 1] = second  # (copied out right after the wait)
    _check_order(early)
    new, _ = overlap(gm, early, (), fxforge.Config(prefetch_peak_growth=float("inf")))
    _check_order(new)
    at = {n: i for i, n in enumerate(new)}
    first_mm = min(at[n] for n in new if n.target is torch.ops.aten.mm.default)
    assert at[clones[1]] > first_mm
    assert at[wait] < at[clones[0]] and at[wait] > min(at[n] for n in new if n.target is torch.ops.aten.cat.default)
