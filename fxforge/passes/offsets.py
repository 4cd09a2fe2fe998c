"""Arena offset planning: give every buffer a byte offset in one arena so that two buffers live at
the same step never share bytes, in as little arena as possible.

Pure algorithm, no FX: `passes/windows.py` turns each arena's blocks into `Interval`s and calls
`plan_offsets`. No plan can use less than the peak of live bytes (`lower_bound`); the planners are
cheap greedy heuristics that usually land on or near it, so all of them run and the smallest wins.
"""
from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from itertools import chain
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from ..core.graph import peak_live_bytes

__all__ = [
    "Interval", "OffsetPlan", "PlanError", "PLANNERS", "RangeMax", "arena_bytes", "lower_bound",
    "plan_offsets", "verify_plan", "plan_by_size", "plan_by_breadth", "plan_by_lifetime", "plan_by_start",
]


@dataclass(frozen=True, slots=True)
class Interval:
    """A buffer of `size` bytes, live from schedule step `start` to `end`, both inclusive."""

    name: str
    size: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.size < 0 or self.start > self.end:
            raise ValueError(f"invalid interval {self}: needs size >= 0 and start <= end")


class PlanError(ValueError):
    """An offset plan that lets two live buffers share bytes or breaks the arena's rules."""


def _units(size: int, alignment: int) -> int:
    return -(-size // alignment)


def lower_bound(intervals: Iterable[Interval], alignment: int = 1) -> int:
    """Peak live bytes over the schedule (sizes rounded up to `alignment`): no plan fits in less."""
    return peak_live_bytes((iv.start, iv.end, _units(iv.size, alignment) * alignment) for iv in intervals)


# ---------------------------------------------------------------------------------------------
# Occupancy: which arena ranges are taken at some step of a window, found without visiting every
# placed buffer that overlaps the window (long-lived buffers overlap almost everything).
#
# A 16-way segment tree over (compressed) steps. A placed buffer is recorded in `own` at the
# O(log T) nodes that exactly tile its lifetime; `sub[v]` is the union of `own` over v's subtree.
# A buffer overlaps a window iff it sits at a node inside one of the window's tiles (read `sub` of
# the tiles) or at a node above one (read `own` on the paths from the window's two end steps to the
# root). Each set is kept merged, in alignment units, so buffers packed side by side read as one
# range. 16-way rather than binary: a short buffer (the common case) then touches ~log16 T nodes
# instead of ~log2 T, which dominates the cost; a few more tiles per level is cheap (measured: 8-
# and 16-way both ~1.6x faster than binary at 1k-10k buffers).
# A range set is (los, his): sorted, disjoint, never touching.

_Ranges = tuple[list[int], list[int]]
_FAN_BITS = 4
_TOP = 1 << 62  # end of the unbounded free range above everything, in units


def _merge_in(rs: _Ranges, lo: int, hi: int) -> None:
    los, his = rs
    i = bisect.bisect_left(his, lo)  # first range ending at or after lo
    j = bisect.bisect_right(los, hi, i)  # ranges i..j-1 overlap or touch [lo, hi)
    if j == i + 1:  # the common case in a tight packing: grow one neighbour in place
        if lo < los[i]:
            los[i] = lo
        if hi > his[i]:
            his[i] = hi
    elif j == i:
        los.insert(i, lo)
        his.insert(i, hi)
    else:
        los[i:j], his[i:j] = [min(lo, los[i])], [max(hi, his[j - 1])]


def _merge_into(store: list[_Ranges | None], v: int, lo: int, hi: int) -> None:
    rs = store[v]
    if rs is None:
        store[v] = ([lo], [hi])
    else:
        _merge_in(rs, lo, hi)


class _Occupancy:
    def __init__(self, steps: int) -> None:
        counts = [max(steps, 1)]  # nodes per level, leaves first
        while counts[-1] > 1:
            counts.append(((counts[-1] - 1) >> _FAN_BITS) + 1)
        self.own: list[list[_Ranges | None]] = [[None] * c for c in counts]
        self.sub = [self.own[0], *([None] * c for c in counts[1:])]  # a leaf's subtree is itself

    @staticmethod
    def tiles(l: int, r: int) -> list[tuple[int, int, int]]:
        """(level, first, stop) runs of nodes that exactly tile steps l..r, at most 2 per level."""
        out, a, b, k, fan = [], l, r + 1, 0, 1 << _FAN_BITS
        while a < b:
            pa, pb = (a + fan - 1) >> _FAN_BITS, b >> _FAN_BITS  # parents wholly inside
            if pa >= pb:
                out.append((k, a, b))
                break
            if a < pa << _FAN_BITS:
                out.append((k, a, pa << _FAN_BITS))
            if pb << _FAN_BITS < b:
                out.append((k, pb << _FAN_BITS, b))
            a, b, k = pa, pb, k + 1
        return out

    def add(self, tiles: list[tuple[int, int, int]], l: int, r: int, lo: int, hi: int) -> None:
        for k, first, stop in tiles:
            own, sub = self.own[k], self.sub[k]
            for v in range(first, stop):
                _merge_into(own, v, lo, hi)
                if k:
                    _merge_into(sub, v, lo, hi)
        for sub in self.sub[1:]:  # ancestors of the tiles: all on the paths up from l and r
            l, r = l >> _FAN_BITS, r >> _FAN_BITS
            _merge_into(sub, l, lo, hi)
            if r != l:
                _merge_into(sub, r, lo, hi)

    def taken(self, tiles: list[tuple[int, int, int]], l: int, r: int) -> Iterable[tuple[int, int]]:
        """Ranges taken at some step in l..r, sorted by start (they may overlap one another)."""
        sets = [s for k, first, stop in tiles for s in self.sub[k][first:stop] if s]
        for own in self.own[1:]:  # nodes above the tiles: on the paths up from l and r
            l, r = l >> _FAN_BITS, r >> _FAN_BITS
            if own[l]:
                sets.append(own[l])
            if r != l and own[r]:
                sets.append(own[r])
        if len(sets) == 1:
            return zip(*sets[0])
        return sorted(chain.from_iterable(zip(*s) for s in sets))


def _best_fit(taken: Iterable[tuple[int, int]], need: int) -> int:
    """Lowest start of the smallest gap that holds `need` units; above everything if none does."""
    best, best_len, top = -1, 0, 0  # top: end of the covered prefix so far
    for lo, hi in taken:
        gap = lo - top
        if gap >= need and (best < 0 or gap < best_len):
            best, best_len = top, gap
        if hi > top:
            top = hi
    return top if best < 0 else best


def _first_fit(taken: Iterable[tuple[int, int]], need: int) -> int:
    """Start of the lowest gap that holds `need` units; above everything if none does."""
    top = 0
    for lo, hi in taken:
        if lo - top >= need:
            return top
        if hi > top:
            top = hi
    return top


class RangeMax:
    """Max of a fixed array over any index range in O(1), for many ranges at once (sparse table:
    row k holds the max of each run of 2**k entries)."""

    def __init__(self, a: np.ndarray):
        rows = [a]
        while 2 ** len(rows) <= len(a):
            prev, half = rows[-1], 2 ** (len(rows) - 1)
            rows.append(np.concatenate([np.maximum(prev[:-half], prev[half:]), np.full(half, -np.inf)]))
        self.table = np.stack(rows)

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """max(a[lo:hi]) elementwise; -inf where the range is empty."""
        ok = hi > lo
        lo = np.where(ok, lo, 0)
        k = np.frexp(np.where(ok, hi - lo, 1))[1] - 1  # floor(log2(length)), exactly
        out = np.maximum(self.table[k, lo], self.table[k, np.where(ok, hi - (1 << k), 0)])
        return np.where(ok, out, -np.inf)


def _step_ranks(intervals: Sequence[Interval]) -> dict[int, int]:
    # Compressing steps to their ranks keeps the tree as small as the number of distinct events and
    # preserves overlap (a monotone map keeps s1 <= e2 and s2 <= e1).
    return {t: i for i, t in enumerate(sorted({t for iv in intervals for t in (iv.start, iv.end)}))}


_Fit = Callable[[Iterable[tuple[int, int]], int], int]  # (taken ranges sorted by start, need) -> at


def _pack(order: Sequence[Interval], alignment: int, fit: _Fit, ranks: dict[int, int] | None = None
          ) -> dict[str, int]:
    """Place buffers one by one in `order`, each at the gap `fit` picks among the buffers already
    placed whose lifetimes overlap it."""
    ranks = ranks if ranks is not None else _step_ranks(order)
    occ = _Occupancy(len(ranks))
    offsets: dict[str, int] = {}
    for iv in order:
        need = _units(iv.size, alignment)
        if need == 0:  # holds no bytes: conflicts with nothing
            offsets[iv.name] = 0
            continue
        l, r = ranks[iv.start], ranks[iv.end]
        tiles = occ.tiles(l, r)
        at = fit(occ.taken(tiles, l, r), need)
        occ.add(tiles, l, r, at, at + need)
        offsets[iv.name] = at * alignment
    return offsets


def plan_by_size(intervals: Sequence[Interval], alignment: int = 64) -> dict[str, int]:
    """Largest buffers first, each into the best-fitting gap (Pisarchyk & Lee's greedy by size).
    Networks repeat a few sizes, so ties are common: the longer-lived goes first, as it has more
    neighbours to fit around."""
    order = sorted(intervals, key=lambda iv: (-iv.size, iv.start - iv.end, iv.start))
    return _pack(order, alignment, _best_fit)


def plan_by_breadth(intervals: Sequence[Interval], alignment: int = 64) -> dict[str, int]:
    """Buffers live at the busiest steps first (largest first within a step), best fit: the peak
    steps decide the arena, so they get first pick of the gaps (greedy by breadth)."""
    ranks = _step_ranks(intervals)
    live = [0] * (len(ranks) + 1)  # live bytes per compressed step, via a difference array
    for iv in intervals:
        b = _units(iv.size, alignment)
        live[ranks[iv.start]] += b
        live[ranks[iv.end] + 1] -= b
    for i in range(1, len(live)):
        live[i] += live[i - 1]
    # the busiest step over each lifetime, all at once (sparse table)
    lo = np.array([ranks[iv.start] for iv in intervals], dtype=np.int64)
    hi = np.array([ranks[iv.end] for iv in intervals], dtype=np.int64)
    busiest = RangeMax(np.array(live, dtype=np.float64))(lo, hi + 1)
    order = [intervals[i] for i in sorted(range(len(intervals)),
                                          key=lambda i: (-busiest[i], -intervals[i].size, intervals[i].start))]
    return _pack(order, alignment, _best_fit, ranks)


def plan_by_lifetime(intervals: Sequence[Interval], alignment: int = 64) -> dict[str, int]:
    """Longest-lived buffers first (then largest), best fit: long lifetimes constrain the most
    neighbours, so they settle low in the arena before short ones fill around them."""
    order = sorted(intervals, key=lambda iv: (iv.start - iv.end, -iv.size, iv.start))
    return _pack(order, alignment, _best_fit)


def plan_by_start(intervals: Sequence[Interval], alignment: int = 64) -> dict[str, int]:
    """Sweep in schedule order, each buffer into the lowest gap that fits (first fit): what an
    online allocator would do, strong when lifetimes are short and sizes repeat.

    In start order the placed buffers overlapping a newcomer are exactly those still live, so a
    malloc/free simulation over a free list replaces the occupancy tree; it gives the same offsets
    as `_pack(order, alignment, _first_fit)`, just faster."""
    order = sorted(intervals, key=lambda iv: (iv.start, -iv.size, iv.end))
    free: _Ranges = ([0], [_TOP])  # free ranges in units; the last one is unbounded
    live: list[tuple[int, int, int]] = []  # heap of (end step, lo, hi) of placed buffers
    offsets: dict[str, int] = {}
    for iv in order:
        while live and live[0][0] < iv.start:
            _, lo, hi = heapq.heappop(live)
            _merge_in(free, lo, hi)
        need = _units(iv.size, alignment)
        if need == 0:
            offsets[iv.name] = 0
            continue
        los, his = free
        i = next(i for i, (lo, hi) in enumerate(zip(los, his)) if hi - lo >= need)
        at = los[i]
        if his[i] - at == need:
            del los[i], his[i]
        else:
            los[i] = at + need
        heapq.heappush(live, (iv.end, at, at + need))
        offsets[iv.name] = at * alignment
    return offsets


Planner = Callable[[Sequence[Interval], int], dict[str, int]]
# Run in this order; on a tie in arena size the earlier one wins.
PLANNERS: tuple[tuple[str, Planner], ...] = (
    ("size", plan_by_size), ("breadth", plan_by_breadth),
    ("lifetime", plan_by_lifetime), ("start", plan_by_start),
)


def arena_bytes(intervals: Iterable[Interval], offsets: Mapping[str, int], alignment: int = 64) -> int:
    """Bytes of the arena a placement needs: the highest end of a buffer, rounded up to `alignment`."""
    ends = (offsets[iv.name] + _units(iv.size, alignment) * alignment for iv in intervals if iv.size)
    return _units(max(ends, default=0), alignment) * alignment


@dataclass
class OffsetPlan:
    """Where each buffer lives in the arena, and how close the arena is to the bound."""

    offsets: dict[str, int]
    arena_bytes: int
    lower_bound_bytes: int  # peak live bytes, sizes rounded up to `alignment`
    planner: str
    alignment: int = 64

    @property
    def fragmentation(self) -> float:
        return self.arena_bytes / self.lower_bound_bytes - 1 if self.lower_bound_bytes else 0.0

    def dump(self, intervals: Iterable[Interval]) -> str:
        """A text table, one buffer a row, sorted by offset."""
        ivs = sorted(intervals, key=lambda iv: (self.offsets.get(iv.name, -1), iv.start, iv.name))
        rows = [(iv.name, str(self.offsets.get(iv.name, "-")), str(iv.size), f"{iv.start}..{iv.end}")
                for iv in ivs]
        head = ("buffer", "offset", "size", "live")
        widths = [max(len(c) for c in col) for col in zip(head, *rows)]
        fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
        title = (f"arena {self.arena_bytes} B, lower bound {self.lower_bound_bytes} B, "
                 f"fragmentation {self.fragmentation:.2%}, planner {self.planner}, "
                 f"alignment {self.alignment}")
        return "\n".join([title, fmt.format(*head), *(fmt.format(*row) for row in rows)])


def plan_offsets(intervals: Iterable[Interval], alignment: int = 64) -> OffsetPlan:
    """Run every planner and keep the smallest arena (the first on ties)."""
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    intervals = list(intervals)
    if len({iv.name for iv in intervals}) != len(intervals):
        raise ValueError("buffer names must be unique")
    bound = lower_bound(intervals, alignment)
    best: OffsetPlan | None = None
    for name, planner in PLANNERS:
        offsets = planner(intervals, alignment)
        arena = arena_bytes(intervals, offsets, alignment)
        if best is None or arena < best.arena_bytes:
            best = OffsetPlan(offsets, arena, bound, name, alignment)
        if arena == bound:  # optimal: no later planner can win
            break
    assert best is not None
    return best


def verify_plan(intervals: Iterable[Interval], plan_or_offsets: OffsetPlan | Mapping[str, int],
                arena_bytes: int | None = None, alignment: int | None = None) -> None:
    """Raise PlanError unless every buffer has an aligned offset, lies inside [0, arena_bytes), and
    shares no byte with any buffer whose lifetime overlaps its own. Zero-size buffers hold no bytes.
    For an OffsetPlan, arena_bytes and alignment default to the plan's; for a bare mapping, a
    missing arena_bytes skips the upper-end check and a missing alignment means 1."""
    if isinstance(plan_or_offsets, OffsetPlan):
        offsets = plan_or_offsets.offsets
        arena_bytes = plan_or_offsets.arena_bytes if arena_bytes is None else arena_bytes
        alignment = plan_or_offsets.alignment if alignment is None else alignment
    else:
        offsets = plan_or_offsets
    alignment = alignment or 1
    ivs = list(intervals)
    seen: set[str] = set()
    for iv in ivs:
        if iv.name in seen:
            raise PlanError(f"buffer {iv.name!r} appears twice")
        seen.add(iv.name)
        at = offsets.get(iv.name)
        if at is None:
            raise PlanError(f"buffer {iv.name!r} has no offset")
        if at % alignment:
            raise PlanError(f"buffer {iv.name!r} at offset {at} is not aligned to {alignment}")
        if at < 0 or (arena_bytes is not None and at + iv.size > arena_bytes):
            raise PlanError(f"buffer {iv.name!r} at [{at}, {at + iv.size}) lies outside the arena "
                            f"[0, {arena_bytes})")

    # Sweep steps keeping the live buffers sorted by offset. They are disjoint (else we would have
    # raised), so a newcomer can only collide with its two neighbours in offset order.
    events = sorted(chain(((iv.start, 1, i) for i, iv in enumerate(ivs) if iv.size),
                          ((iv.end + 1, 0, i) for i, iv in enumerate(ivs) if iv.size)))
    los: list[int] = []
    who: list[int] = []
    for _, starts, i in events:
        lo = offsets[ivs[i].name]
        k = bisect.bisect_left(los, lo)
        if not starts:
            del los[k], who[k]
            continue
        hi = lo + ivs[i].size
        for j in (k - 1, k):
            if 0 <= j < len(los):
                other = ivs[who[j]]
                olo = los[j]
                if olo < hi and lo < olo + other.size:
                    a, b = ivs[i], other
                    raise PlanError(
                        f"buffers {b.name!r} (bytes [{olo}, {olo + b.size}), steps {b.start}..{b.end}) "
                        f"and {a.name!r} (bytes [{lo}, {hi}), steps {a.start}..{a.end}) are live "
                        f"together and share bytes [{max(lo, olo)}, {min(hi, olo + b.size)})")
        los.insert(k, lo)
        who.insert(k, i)
