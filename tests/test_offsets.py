"""Arena offset planners (fxforge.passes.offsets): known optima, random lifetimes, the plan checker."""
from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxforge.passes.offsets import (
    PLANNERS, Interval, OffsetPlan, PlanError, _first_fit, _Occupancy, _pack, _units, lower_bound,
    plan_by_breadth, plan_by_size, plan_by_start, plan_offsets, verify_plan,
)

# Pisarchyk & Lee 2020, Fig. 1: (size, first op, last op); the peak, at op 5, is 36+16+8+64 = 124.
PISARCHYK = [(32, 0, 1), (28, 1, 4), (36, 2, 5), (16, 3, 5), (8, 4, 5), (64, 5, 7), (10, 6, 8), (40, 7, 8)]


def ivs(spec) -> list[Interval]:
    return [Interval(f"t{i}", size, start, end) for i, (size, start, end) in enumerate(spec)]


def arena(intervals, offsets, alignment) -> int:
    return max((offsets[iv.name] + _units(iv.size, alignment) * alignment
                for iv in intervals if iv.size), default=0)


def conflicts_brute(intervals, offsets) -> bool:
    """All pairs: live together and sharing a byte."""
    return any(a.start <= b.end and b.start <= a.end and a.size and b.size
               and offsets[a.name] < offsets[b.name] + b.size and offsets[b.name] < offsets[a.name] + a.size
               for i, a in enumerate(intervals) for b in intervals[i + 1:])


def peak_brute(intervals, alignment=1) -> int:
    steps = {t for iv in intervals for t in range(iv.start, iv.end + 1)}
    return max((sum(_units(iv.size, alignment) * alignment for iv in intervals if iv.start <= t <= iv.end)
                for t in steps), default=0)


# --- known optima -------------------------------------------------------------------------------

def test_pisarchyk_example_reaches_bound():
    t = ivs(PISARCHYK)
    assert lower_bound(t) == lower_bound(t, alignment=1) == 124
    plan = plan_offsets(t, alignment=1)
    verify_plan(t, plan)
    assert (plan.arena_bytes, plan.lower_bound_bytes, plan.fragmentation) == (124, 124, 0.0)
    # The paper's greedy by size reaches the optimum here, and so does greedy by breadth.
    for planner in (plan_by_size, plan_by_breadth):
        offsets = planner(t, 1)
        verify_plan(t, offsets, 124, 1)
        assert arena(t, offsets, 1) == 124


def test_pisarchyk_scaled_by_alignment():
    # Sizes in 64-byte units: the same problem, so the same optimum, in bytes.
    t = [Interval(iv.name, iv.size * 64, iv.start, iv.end) for iv in ivs(PISARCHYK)]
    plan = plan_offsets(t)
    verify_plan(t, plan)
    assert plan.arena_bytes == plan.lower_bound_bytes == 124 * 64


def test_plan_offsets_keeps_the_smallest():
    # Greedy by size puts the 5 at 0 and the 4 above it, stranding a 1-unit hole: arena 10. Placing
    # the longest-lived first reaches the bound, 9 (steps 3 and 4: 3 + 2 + 4).
    t = ivs([(3, 1, 4), (2, 3, 5), (5, 1, 1), (4, 2, 4)])
    assert lower_bound(t) == 9
    assert arena(t, plan_by_size(t, 1), 1) == 10
    plan = plan_offsets(t, alignment=1)
    verify_plan(t, plan)
    assert (plan.arena_bytes, plan.planner) == (9, "lifetime")
    # Here no planner meets the bound (17), so all run; by size is best (18), the last run is not.
    t = ivs([(3, 2, 2), (1, 4, 8), (7, 2, 2), (7, 2, 5), (8, 3, 6)])
    arenas = {name: arena(t, planner(t, 1), 1) for name, planner in PLANNERS}
    assert lower_bound(t) == 17 and arenas["size"] == 18 < arenas[PLANNERS[-1][0]]
    plan = plan_offsets(t, alignment=1)
    verify_plan(t, plan)
    assert (plan.arena_bytes, plan.planner) == (18, "size")


def test_empty():
    plan = plan_offsets([])
    assert (plan.offsets, plan.arena_bytes, plan.lower_bound_bytes, plan.fragmentation) == ({}, 0, 0, 0.0)
    verify_plan([], plan)
    assert lower_bound([]) == 0
    for _, planner in PLANNERS:
        assert planner([], 64) == {}


def test_single_buffer_rounds_up_to_alignment():
    t = [Interval("x", 100, 3, 7)]
    plan = plan_offsets(t)
    assert plan.offsets == {"x": 0} and plan.arena_bytes == 128 and plan.lower_bound_bytes == 128
    assert lower_bound(t) == 100 and lower_bound(t, alignment=64) == 128
    assert plan_offsets(t, alignment=1).arena_bytes == 100


@pytest.mark.parametrize("staggered", [False, True])
def test_all_live_at_once_is_sum_of_aligned_sizes(staggered):
    rng = random.Random(0)
    sizes = [rng.randint(1, 5000) for _ in range(40)]
    # Identical lifetimes, or different ones that all contain step 50.
    t = [Interval(f"b{i}", s, rng.randint(0, 50) if staggered else 0,
                  rng.randint(50, 99) if staggered else 0) for i, s in enumerate(sizes)]
    total = sum(_units(s, 64) * 64 for s in sizes)
    assert lower_bound(t, 64) == total
    for _, planner in PLANNERS:
        offsets = planner(t, 64)
        verify_plan(t, offsets, total, 64)
        assert arena(t, offsets, 64) == total
    assert plan_offsets(t).arena_bytes == total


def test_disjoint_lifetimes_share_one_slot():
    t = [Interval(f"b{i}", 64 * (1 + i % 5), 2 * i, 2 * i + 1) for i in range(30)]
    for _, planner in PLANNERS:
        offsets = planner(t, 64)
        assert set(offsets.values()) == {0}
    assert plan_offsets(t).arena_bytes == 5 * 64


def test_ping_pong_chain():
    # Each op reads the previous buffer and writes the next: two slots suffice.
    t = [Interval(f"b{i}", 1000, i, i + 1) for i in range(50)]
    plan = plan_offsets(t)
    verify_plan(t, plan)
    assert plan.arena_bytes == plan.lower_bound_bytes == 2 * 1024


def test_zero_size_buffers_take_no_space():
    t = [Interval("z0", 0, 0, 9), Interval("a", 64, 0, 9), Interval("z1", 0, 3, 4), Interval("b", 64, 2, 5)]
    plan = plan_offsets(t)
    verify_plan(t, plan)
    assert plan.arena_bytes == plan.lower_bound_bytes == 128
    assert plan_offsets([Interval("z", 0, 0, 0)]).arena_bytes == 0


def test_sparse_and_negative_steps():
    # Steps are compressed internally: huge or negative step numbers behave like small ones.
    t = [Interval("a", 64, -(10**12), 0), Interval("b", 64, 0, 10**12), Interval("c", 64, 1, 10**12)]
    plan = plan_offsets(t)
    verify_plan(t, plan)
    assert plan.arena_bytes == 128


def test_interval_validation():
    with pytest.raises(ValueError):
        Interval("x", 8, 5, 4)
    with pytest.raises(ValueError):
        Interval("x", -1, 0, 0)
    with pytest.raises(ValueError):
        plan_offsets([], alignment=0)
    with pytest.raises(ValueError, match="unique"):
        plan_offsets([Interval("x", 8, 0, 0), Interval("x", 8, 1, 1)])
    assert OffsetPlan({}, 110, 100, "size").fragmentation == pytest.approx(0.1)


def test_dump_lists_every_buffer_by_offset():
    t = ivs(PISARCHYK)
    plan = plan_offsets(t, alignment=1)
    text = plan.dump(t)
    lines = text.splitlines()
    assert "arena 124 B" in lines[0] and "lower bound 124 B" in lines[0]
    assert lines[1].split() == ["buffer", "offset", "size", "live"]
    rows = [line.split() for line in lines[2:]]
    assert sorted(r[0] for r in rows) == sorted(iv.name for iv in t)
    offs = [int(r[1]) for r in rows]
    assert offs == sorted(offs)
    assert all(r[3] == f"{iv.start}..{iv.end}" for r in rows for iv in t if iv.name == r[0])


# --- random lifetimes ---------------------------------------------------------------------------

interval_sets = st.lists(
    st.tuples(st.one_of(st.just(0), st.integers(1, 300), st.integers(1, 5000)),
              st.integers(0, 40), st.integers(0, 12)),
    max_size=60,
).map(lambda spec: [Interval(f"b{i}", size, start, start + length)
                    for i, (size, start, length) in enumerate(spec)])


@settings(max_examples=300, deadline=None)
@given(interval_sets, st.sampled_from([1, 8, 64]))
def test_random_plans_verify_and_respect_bound(t, alignment):
    bound = lower_bound(t, alignment)
    assert bound == peak_brute(t, alignment)
    total = sum(_units(iv.size, alignment) * alignment for iv in t)
    arenas = {}
    for name, planner in PLANNERS:
        offsets = planner(t, alignment)
        a = arena(t, offsets, alignment)
        verify_plan(t, offsets, a, alignment)
        assert not conflicts_brute(t, offsets)
        assert all(o % alignment == 0 and o >= 0 for o in offsets.values())
        assert bound <= a <= total
        arenas[name] = a
    plan = plan_offsets(t, alignment)
    verify_plan(t, plan)
    best = min(arenas.values())
    assert plan.arena_bytes == best and plan.lower_bound_bytes == bound
    assert plan.planner == next(n for n, a in arenas.items() if a == best)  # first on ties
    assert plan.arena_bytes % alignment == 0


@settings(max_examples=150, deadline=None)
@given(interval_sets)
def test_first_fit_sweep_matches_occupancy_tree(t):
    # Two independent ways to find the buffers a newcomer overlaps must place identically.
    order = sorted(t, key=lambda iv: (iv.start, -iv.size, iv.end))
    assert plan_by_start(t, 8) == _pack(order, 8, _first_fit)


def _normalize(ranges) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [tuple(r) for r in out]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_occupancy_sees_exactly_the_overlapping_buffers(data):
    # Enough steps for a three-level 16-way tree; long and short lifetimes mixed.
    steps = data.draw(st.integers(1, 700))
    step = st.integers(0, steps - 1)
    occ, placed = _Occupancy(steps), []
    for _ in range(data.draw(st.integers(1, 40))):
        l, r = sorted((data.draw(step), data.draw(step)))
        lo = data.draw(st.integers(0, 200))
        hi = lo + data.draw(st.integers(1, 30))
        occ.add(occ.tiles(l, r), l, r, lo, hi)
        placed.append((l, r, lo, hi))
        for _ in range(3):
            a, b = sorted((data.draw(step), data.draw(step)))
            want = _normalize((lo_, hi_) for l_, r_, lo_, hi_ in placed if l_ <= b and a <= r_)
            assert _normalize(occ.taken(occ.tiles(a, b), a, b)) == want


# --- the checker catches planted errors ---------------------------------------------------------

def good_plan() -> tuple[list[Interval], OffsetPlan]:
    t = [Interval(iv.name, iv.size * 64, iv.start, iv.end) for iv in ivs(PISARCHYK)]
    plan = plan_offsets(t)
    verify_plan(t, plan)
    return t, plan


def test_verify_catches_shared_bytes():
    t, plan = good_plan()
    bad = dict(plan.offsets, t7=plan.offsets["t5"] + 64)  # t5 and t7 are both live at op 7
    with pytest.raises(PlanError, match="t5.*t7|t7.*t5"):
        verify_plan(t, bad, plan.arena_bytes * 2, 64)


def test_verify_catches_misalignment_and_arena_escape_and_missing():
    t, plan = good_plan()
    with pytest.raises(PlanError, match="not aligned"):
        verify_plan(t, dict(plan.offsets, t0=plan.offsets["t0"] + 32), plan.arena_bytes * 2, 64)
    with pytest.raises(PlanError, match="outside the arena"):
        verify_plan(t, plan.offsets, plan.arena_bytes - 64, 64)
    with pytest.raises(PlanError, match="outside the arena"):
        verify_plan(t, dict(plan.offsets, t0=-64), None, 64)
    with pytest.raises(PlanError, match="no offset"):
        verify_plan(t, {k: v for k, v in plan.offsets.items() if k != "t3"}, plan.arena_bytes, 64)
    with pytest.raises(PlanError, match="twice"):
        verify_plan(t + t[:1], plan.offsets, plan.arena_bytes, 64)


def test_verify_boundaries():
    # Byte ranges that touch, lifetimes that touch, and zero-size buffers are all fine ...
    ok = [Interval("a", 64, 0, 5), Interval("b", 64, 0, 5), Interval("c", 64, 6, 9), Interval("z", 0, 0, 9)]
    verify_plan(ok, {"a": 0, "b": 64, "c": 0, "z": 0}, 128, 64)
    # ... but one shared step is enough to conflict, and so is one shared byte.
    with pytest.raises(PlanError, match="'a'.*'c'|'c'.*'a'"):
        verify_plan([Interval("a", 64, 0, 5), Interval("c", 64, 5, 9)], {"a": 0, "c": 0}, 64, 64)
    with pytest.raises(PlanError):
        verify_plan([Interval("a", 65, 0, 5), Interval("b", 64, 0, 5)], {"a": 0, "b": 64}, 128)


@settings(max_examples=200, deadline=None)
@given(interval_sets, st.data())
def test_verify_agrees_with_brute_force(t, data):
    # Random offsets in a small range, so conflicts are common: the sweep must flag exactly those.
    offsets = {iv.name: 8 * data.draw(st.integers(0, 40)) for iv in t}
    if conflicts_brute(t, offsets):
        with pytest.raises(PlanError, match="share bytes"):
            verify_plan(t, offsets, None, 8)
    else:
        verify_plan(t, offsets, None, 8)


# --- speed ----------------------------------------------------------------------------------------

def network_like(n: int, seed: int = 0) -> list[Interval]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.random()
        end = n - 1 - i if r < 0.03 else i + rng.randint(5, 80) if r < 0.15 else i + rng.randint(1, 4)
        out.append(Interval(f"b{i}", rng.choice((1 << 20, 1 << 20, 4 << 20, 3 << 19, 2048)), i, max(i, end)))
    return out


def test_plan_1000_buffers_is_fast():
    # The target is 50 ms (bench/bench_planner.py reports it); 0.5 s leaves room for a loaded CI box.
    t = network_like(1000)
    plan_offsets(t)  # warm up
    start = time.perf_counter()
    plan = plan_offsets(t)
    elapsed = time.perf_counter() - start
    verify_plan(t, plan)
    assert elapsed < 0.5, f"planning 1000 buffers took {elapsed * 1e3:.0f} ms"
    assert plan.arena_bytes <= 1.1 * plan.lower_bound_bytes
