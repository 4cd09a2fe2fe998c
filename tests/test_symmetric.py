"""Symmetric-memory planning (fxforge/passes/symmetric.py, fxforge/codegen/symmetric_runtime.py).

* real ranks (gloo, CPU, spawned by tests/partition_ranks.py, bounded in time; the arenas are
  fxforge's shared-memory emulation): a tensor-parallel block on both backends, two chained
  all-reduces sharing a slot behind a barrier (and corrupting a slow reader without it), ranks
  with different plans rejected, training with distinct allocation ids, a custom op's registered
  symmetric argument; on 2 and 4 ranks.  What each rank checks: tests/symmetric_cases.py;
* in this process over a fake process group (compiled, never run): which values go where, the
  copy-ins and their reasons, fences and barriers, the plan checker, allocation ids;
* on a CUDA machine, one real ``symm_mem`` run (skipped elsewhere).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxforge
from fxforge.spine import compile_graph
from fxforge.passes.memory import verify_memory_plan
from fxforge.passes.offsets import PlanError
from fxforge.passes.symmetric import alloc_id

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from partition_ranks import run_ranks  # noqa: E402

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
    pytest.skip("torch.distributed / symm_mem ops are not available", allow_module_level=True)

import symmetric_cases as cases  # noqa: E402


# --------------------------------------------------------------------------- real ranks


def _same_on_every_rank(results: list, key: str):
    first = results[0][key]
    assert all(r[key] == first for r in results), [r[key] for r in results]
    return first


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_plan_alike_write_in_place_and_reuse_safely(world):
    results = run_ranks(cases.all_cases, world)
    # the TP block: one comm buffer, written by its producer (out= mm; a Triton kernel), planned
    # identically on every rank
    tp = _same_on_every_rank(results, "tp_block")
    for codegen in ("torch", "triton"):
        t = tp[codegen]
        assert t["copy_bytes"] == 0 and t["symmetric_arena_bytes"] == t["comm_buffer_bytes"] == 4 * 16 * 4
        assert t["collective_bytes"] == (world - 1) * 4 * 16 * 4  # peers read this rank's input
    # two chained all-reduces of equal size: one slot, a barrier between them; without it a slow
    # reader sees the next input
    chain = [r["chain"] for r in results]
    assert all(c["plan"] == chain[0]["plan"] for c in chain)
    assert chain[0]["symmetric_arena_bytes"] == chain[0]["buffer_bytes"] == 4 * 16 * 4
    assert len(chain[0]["plan"]["buffers"]) == 2 and len(chain[0]["plan"]["barriers"]) == 1
    assert any(c["corrupted_without_barrier"] for c in chain)
    # different plans across ranks: every rank fails, naming the buffer
    for r, message in enumerate(r["mismatch"] for r in results):
        assert "planned differently across ranks" in message and "buffer mm" in message, message
    # training: forward and backward arenas have distinct ids, the same on every rank
    ids = _same_on_every_rank(results, "training")
    assert ids["forward"] != ids["backward"]
    # small all-reduces bucketed into one one-shot all-reduce, written in place in the symmetric arena
    bucketed = _same_on_every_rank(results, "bucketed")
    assert bucketed["buckets"] == {"buckets": 1, "bucketed": 3} and bucketed["one_shots"] == 1
    assert bucketed["zero_copy"] == 3 and bucketed["copy_bytes"] == 0 and bucketed["copy_ins"] == {}
    assert [b[0] for b in bucketed["plan"]["buffers"]][-1].startswith("cat")
    reg = _same_on_every_rank(results, "registered")
    if "skipped" not in reg:
        assert reg["copy_ins"] == {} and [b[0] for b in reg["plan"]["buffers"]] == ["mm"]


# --------------------------------------------------------------------------- one process, fake group


@pytest.fixture
def group():
    """A fake 2-rank process group in this process: graphs compile, collectives never run."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


def _compile(fn, *args, kind="inference", **config):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return compile_graph(gm, fxforge.Config(debug=True, **config), kind=kind)


def _symm(c) -> dict:
    mem = c.plan.memory
    return {b.name: b for b in mem.buffers.values() if b.arena is not None and b.arena.startswith("symm")}


def test_three_chained_all_reduces_share_one_slot(group):
    def f(x, w):
        for _ in range(3):
            x = torch.ops.symm_mem.one_shot_all_reduce(x @ w, "sum", group)
        return x

    c = _compile(f, torch.randn(4, 8), torch.randn(8, 8))
    assert len(_symm(c)) == 3 and c.stats["symmetric_arena_bytes"] == 4 * 8 * 4
    assert len(c.plan.memory.barriers) == 2  # after the first two all-reduces
    (a,) = [a for a in c.plan.memory.arenas if a.symmetric]
    assert a.symmetric == group and a.start_barrier  # nothing fences the last one before the next call
    verify_memory_plan(c.plan.memory)
    # the checker catches a plan reusing a slot before the fence
    first = min(_symm(c).values(), key=lambda b: b.start)
    first.end = first.released - 1
    with pytest.raises(PlanError, match="could be written while another rank still reads them"):
        verify_memory_plan(c.plan.memory)


def test_a_later_collective_on_the_group_is_a_fence_no_barrier_needed(group):
    f = torch.ops._c10d_functional

    def prog(x, w):
        y = torch.ops.symm_mem.one_shot_all_reduce(x @ w, "sum", group)
        z = f.wait_tensor(f.all_reduce(y * 2, "max", group))  # a fence: every rank left the first
        return torch.ops.symm_mem.one_shot_all_reduce(z @ w, "sum", group)

    c = _compile(prog, torch.randn(4, 8), torch.randn(8, 8))
    assert c.plan.memory.barriers == [] and c.stats["symmetric_arena_bytes"] == 4 * 8 * 4
    verify_memory_plan(c.plan.memory)


def test_copy_ins_have_reasons_and_count_as_copies(group):
    def prog(x, y, w):
        a = torch.ops.symm_mem.one_shot_all_reduce(x, "sum", group)  # a graph input
        h = y @ w
        b = torch.ops.symm_mem.one_shot_all_reduce(h, "sum", group)  # h is also returned
        return a + b, h

    c = _compile(prog, torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 8), codegen="torch")  # copies as copy_
    assert c.stats["symmetric_copy_ins"] == {"graph_input": 1, "graph_output": 1}
    assert c.stats["copy_bytes"] == 2 * 4 * 8 * 4
    assert c.source.count(".copy_(") == 2


def test_functional_all_reduces_lower_below_the_threshold(group):
    f = torch.ops._c10d_functional

    def prog(x, big):
        return f.wait_tensor(f.all_reduce(x * 2, "sum", group)), f.wait_tensor(f.all_reduce(big * 2, "sum", group))

    c = _compile(prog, torch.randn(4, 8), torch.randn(64, 64), symmetric_all_reduce_bytes=4096, bucket_bytes=0)
    (lowered,) = [p for p in c.stats["passes"] if p["name"] == "lower_all_reduce_to_symmetric"]
    assert lowered["stats"] == {"lowered_all_reduces": 1}  # 128 B lowered, 16 KiB kept
    # on CPU the one-shot all-reduce runs as fxforge's emulation, given its arena
    assert "_one_shot_all_reduce(symm0_h, " in c.source and "_c10d_functional.all_reduce" in c.source
    assert c.stats["symmetric_copy_ins"] == {} and c.stats["symmetric_arena_bytes"] == 128
    with pytest.raises(ValueError, match="symmetric_all_reduce_bytes"):
        fxforge.Config(symmetric_all_reduce_bytes=-1)


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_bucket_of_all_reduces_is_written_in_place_by_its_members_producers(group, symmetric):
    """Small all-reduces bucketed into one over a flat buffer: each member's producer writes its
    run of the buffer (no copy-in), and below ``symmetric_all_reduce_bytes`` the bucket is one
    one-shot all-reduce whose flat buffer is in the symmetric arena."""
    f = torch.ops._c10d_functional

    def prog(x, w):
        outs = []
        for i in range(4):
            outs.append(f.wait_tensor(f.all_reduce(((x * (i + 1)) @ w).tanh(), "sum", group)))
        return [o * 2 for o in outs]

    args = torch.randn(4, 8), torch.randn(8, 8)
    c = _compile(prog, *args, symmetric_all_reduce_bytes=4096 if symmetric else 0)
    stats = {p["name"]: p.get("stats") for p in c.stats["passes"]}
    assert stats["bucket_collectives"] == {"buckets": 1, "bucketed": 4}
    assert stats["zero_copy_cat_pad"]["zero_copy_inputs"] == 4 and c.stats["copy_bytes"] == 0
    (cat,) = [b for b in c.plan.memory.buffers.values() if b.producer.target is torch.ops.aten.cat.default]
    runs = [b for b in c.plan.memory.buffers.values() if b.kind == "slice" and b.base == cat.name]
    assert len(runs) == 4 and all(r.flat and r.shape == (4, 8) for r in runs)
    assert sorted(c.plan.memory.hint(r.region[0]) for r in runs) == [0, 32, 64, 96]
    verify_memory_plan(c.plan.memory)
    if symmetric:
        assert stats["lower_all_reduce_to_symmetric"] == {"lowered_all_reduces": 1}
        assert cat.arena.startswith("symm") and c.stats["symmetric_copy_ins"] == {}
        assert c.stats["symmetric_arena_bytes"] == 4 * 4 * 8 * 4
        assert c.source.count("_one_shot_all_reduce(") == 1
    else:
        assert c.source.count("_c10d_functional.all_reduce.default(cat_default") == 1


def test_allocation_ids_come_from_the_graph():
    a = alloc_id("forward\ncode", "0", 0)
    assert a == alloc_id("forward\ncode", "0", 0) and 0 <= a < 2**63
    assert len({a, alloc_id("backward\ncode", "0", 0), alloc_id("forward\ncode", "1", 0),
                alloc_id("forward\ncode", "0", 1)}) == 4


# --------------------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU path is tested above)")
def test_cuda_symmetric_memory_world_size_one(tmp_path):
    """One real run through torch's symm_mem on a GPU: world size 1, the arena from
    empty_strided_p2p with the plan's allocation id, the one-shot all-reduce torch's own kernel."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        g = dist.group.WORLD.group_name
        w = torch.randn(64, 64, device="cuda")

        def f(x):
            return torch.ops.symm_mem.one_shot_all_reduce(x @ w, "sum", g) * 2

        b = fxforge.backend(fxforge.Config(debug=True))
        cf = torch.compile(f, backend=b, fullgraph=True)
        for _ in range(3):
            x = torch.randn(32, 64, device="cuda")
            torch.testing.assert_close(cf(x), (x @ w) * 2)
        (c,) = b.compiled
        assert c.stats["symmetric_arena_bytes"] > 0 and c.stats["symmetric_copy_ins"] == {}
    finally:
        dist.destroy_process_group()
