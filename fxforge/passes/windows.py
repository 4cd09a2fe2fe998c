"""Arena windows: which blocks share an arena (the window search) and where each sits in it.

Plain data, no FX: `passes/memory.py` turns a schedule into blocks, name -> (bytes, first start,
last end), and an array of the other bytes live at each position, then calls `window_options`
and `place_windows`.  The search is `WindowSearch` (greedy, two phases, every move of every
window judged at once); the placement runs the offset planners of `passes/offsets.py` on static
sizes and lays out slots on symbolic ones.  How and why: docs/memory.md.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np
import sympy
from torch.utils._sympy.functions import FloorDiv

from ..core.graph import hint, live_profile, peak_live_bytes
from .offsets import Interval, RangeMax, plan_offsets

__all__ = [
    "WindowSearch", "window_options", "split_windows",
    "place", "place_static", "place_symbolic", "place_windows", "placed_peaks", "arena_calls_profile", "align_up",
]

Spans = dict[str, tuple[int, int, int]]  # block -> (bytes, first start, last end), at the traced sizes
Calls = tuple[np.ndarray, np.ndarray]  # (first, last) position of the kernel call of each position


# ---------------------------------------------------------------------------------------------
# The window search


def window_options(spans: Spans, other: np.ndarray, calls: Calls | None = None) -> list[list[list[str]]]:
    """``split_windows`` holding the arena peak and, only if holding it changed a choice, not
    holding it (unchanged choices give the same windows)."""
    holding = WindowSearch(spans, other, calls=calls, hold_arena_peak=True)
    windows = [holding.run()]
    if holding.held:
        windows.append(WindowSearch(spans, other, calls=calls, hold_arena_peak=False).run())
    return windows


def split_windows(spans: Spans, other: np.ndarray, **options) -> list[list[str]]:
    """Group blocks into arenas: ``WindowSearch(spans, other, **options).run()``."""
    return WindowSearch(spans, other, **options).run()


class WindowSearch:
    """One run of the greedy window search over blocks (name -> (bytes, start, end), at the
    traced sizes), with ``other`` the bytes live at each position outside the arenas.

    An arena is estimated at its blocks' peak of live bytes, live from their first start to their
    last end (widened to whole kernel calls by ``calls``, ``memory.call_spans``' arrays).  Moves
    split a window: a *cut* at a start position, a *clean cut* (its at most ``isolate`` crossing
    blocks into arenas of their own), *isolating* one of the ``isolate`` longest-lived blocks.
    Phase 0 lowers (peak with ``other``, excess over the blocks' own bytes, waste), holding the
    arena peak near the bound if ``hold_arena_peak``; phase 1 lowers the arena peak toward the
    bound.  At most ``max_cuts`` moves, stopping once the moves judged add up to ``work_budget``
    profile entries; candidate cuts thinned to ``max_candidates``.  docs/memory.md, "Windows",
    says why and how.

    ``run()`` returns the windows (lists of block names, sorted by first start); ``held`` then
    says whether holding the arena peak ruled out a move phase 0 would otherwise have made."""

    def __init__(self, spans: Spans, other: np.ndarray, max_cuts: int = 64, max_candidates: int = 1024,
                 work_budget: float = 5e7, isolate: int = 4, calls: Calls | None = None,
                 hold_arena_peak: bool = True):
        self.spans, self.max_cuts, self.work_budget = spans, max_cuts, work_budget
        self.isolate, self.hold_arena_peak = isolate, hold_arena_peak
        self.work = 0.0  # profile entries a move-by-move scan would have touched so far
        self.held = False
        self.names = sorted(spans, key=lambda k: (spans[k][1], spans[k][2], k))
        if spans:
            self._setup(other, calls, max_candidates)

    def _setup(self, other: np.ndarray, calls: Calls | None, max_candidates: int) -> None:
        spans, names = self.spans, self.names
        n = len(names)
        size = self.size = np.array([spans[k][0] for k in names], dtype=np.float64)
        start = self.start = np.array([spans[k][1] for k in names], dtype=np.int64)
        end = self.end = np.array([spans[k][2] for k in names], dtype=np.int64)
        length = self.length = max(len(other), int(end.max()) + 1)
        self.first, self.last = calls if calls is not None else (np.arange(length), np.arange(length))
        prof = self.prof = np.zeros(length, dtype=np.float64)  # other + the arenas live at each position
        prof[: len(other)] = other
        other = prof.copy()
        own = np.cumsum(np.bincount(start, size, length + 1) - np.bincount(end + 1, size, length + 1))[:length]
        self.bound = float(own.max())  # the blocks' own peak: no split of them goes below it
        self.floor = other + own  # the profile minus this is the excess
        fine = self.fine = np.zeros(length, dtype=np.float64)  # the arenas over their blocks' own positions
        self.alone = np.zeros(n, dtype=bool)  # blocks isolated into arenas of their own
        # candidate cuts: indices where a new start position begins (a cut never splits one position)
        firsts = [i for i in range(1, n) if start[i] != start[i - 1]]
        if len(firsts) > max_candidates:
            firsts = [firsts[int(k * len(firsts) / max_candidates)] for k in range(max_candidates)]
        self.firsts = firsts
        self.tables: dict[tuple[int, int], _Moves] = {}  # the current windows' moves
        self.bounds = [0, n]  # windows: names[bounds[k]:bounds[k + 1]], less isolated blocks
        nbytes, lo, hi, f_lo, f_hi = self._moves_of(0, n).window
        prof[lo:hi + 1] += nbytes
        fine[f_lo:f_hi + 1] += nbytes
        self.peak, self.excess, self.area = float(prof.max()), float((prof - self.floor).max()), nbytes * (hi - lo + 1)
        self.min_gain = 0.005 * (self.area - float((size * (end - start + 1)).sum()))
        self.min_excess_gain = 0.01 * nbytes
        self.fine_area = nbytes * (f_hi - f_lo + 1)  # the arenas' bytes summed over their own positions

    def _moves_of(self, i: int, j: int) -> _Moves:
        """The moves of window ``names[i:j]`` (made when first asked for, after earlier moves)."""
        if (i, j) not in self.tables:
            cuts = self.firsts[bisect.bisect_right(self.firsts, i):bisect.bisect_left(self.firsts, j)]
            self.tables[(i, j)] = _Moves(i, np.flatnonzero(~self.alone[i:j]) + i, cuts, self.start, self.end,
                                         self.size, self.first, self.last, self.isolate)
        return self.tables[(i, j)]

    def run(self) -> list[list[str]]:
        """Phase 0, then phase 1, while the best move is accepted; the windows made."""
        if not self.spans:
            return []
        moves_made = 0
        for phase in (0, 1):
            while moves_made < self.max_cuts and self.work <= self.work_budget and self.min_gain > 0:
                if phase == 1 and float(self.fine.max()) <= 1.01 * self.bound:
                    break
                move = self._best_move(phase)
                if move is None or not self._accepts(phase, move):
                    break
                *figures, k, c, xs = move
                self._apply(k, c, xs)
                self.peak, self.excess, self.area = figures[-3:]
                moves_made += 1
        return self.windows()

    def _accepts(self, phase: int, move: tuple) -> bool:
        """Phase 0: the move lowers the peak by 0.1%, or keeps it and lowers the excess by
        ``min_excess_gain``, or keeps both and lowers the waste by ``min_gain``.  Phase 1: it
        keeps the peak and lowers the arena peak (or keeps it and lowers the arena area)."""
        if phase == 0:
            c_peak, c_excess, c_area, *_ = move
            peak, excess, area = self.peak, self.excess, self.area
            return (c_peak < peak * (1 - 1e-3) or (c_peak <= peak and c_excess <= excess - self.min_excess_gain)
                    or (c_peak <= peak and c_excess <= excess and c_area <= area - self.min_gain))
        c_apeak, c_fine_area, c_peak, *_ = move
        a_peak = float(self.fine.max())
        return c_peak <= self.peak and (c_apeak < a_peak or (c_apeak == a_peak and c_fine_area < self.fine_area))

    def windows(self) -> list[list[str]]:
        """The current windows, then every isolated block alone, sorted by (first start, last end)."""
        names, alone, bounds = self.names, self.alone, self.bounds
        out = [[names[x] for x in range(i, j) if not alone[x]] for i, j in zip(bounds, bounds[1:])]
        out += [[names[x]] for x in np.flatnonzero(alone)]
        return sorted((w for w in out if w), key=lambda w: self.spans[w[0]][1:])

    def _best_move(self, phase: int) -> tuple | None:
        """Phase 0: (peak, excess, waste, window, cut, isolated) of the move with the lowest
        (peak, excess, waste), among those keeping the arena peak within 1% of the bound or below
        its current value when holding it; phase 1: (arena peak, arena area, *that) of the move
        with the lowest arena peak, among windows live at that peak.  Every move of every window
        is judged at once (docs/memory.md, "Judging every move at once")."""
        ks, tabs = self._judged_windows(phase)
        if not tabs:
            return None
        count = [len(t.moves) for t in tabs]
        w = np.array([t.window for t in tabs])
        self.work += float((np.array(count) * ((w[:, 2] - w[:, 1] + 1) + (w[:, 4] - w[:, 3] + 1))).sum())  # as a scan
        curves = (self.prof, self.prof - self.floor, self.fine)
        self._judge_stale(tabs, curves)
        t_peak, t_excess, a_peak = self._figures(tabs, curves, w, count)
        t_area = self.area + np.concatenate([t.d_area for t in tabs])
        t_fine_area = self.fine_area + np.concatenate([t.d_fine_area for t in tabs])
        k_of = np.repeat(np.array(ks), count)
        rank = np.concatenate([t.rank for t in tabs])
        keys = [t_peak, t_excess, t_area, k_of, rank]
        if phase:
            keys = [a_peak, t_fine_area, *keys]
        x = self._pick(phase, keys, a_peak)
        if x is None:
            return None
        row = ks.index(int(k_of[x]))
        c, xs = tabs[row].moves[x - sum(count[:row])]
        trial = (float(t_peak[x]), float(t_excess[x]), float(t_area[x]), int(k_of[x]), c, xs)
        return (float(a_peak[x]), float(t_fine_area[x]), *trial) if phase else trial

    def _judged_windows(self, phase: int) -> tuple[list[int], list[_Moves]]:
        """The windows (indices k into ``bounds``, and their moves) with any move; in phase 1
        only those live where the arena peak is (no other can lower it)."""
        bounds = self.bounds
        ks = [k for k in range(len(bounds) - 1) if len(self._moves_of(bounds[k], bounds[k + 1]).moves)]
        tabs = [self.tables[(bounds[k], bounds[k + 1])] for k in ks]
        if phase:
            hot = self.fine >= self.fine.max()
            keep = [hot[t.window[3]:t.window[4] + 1].any() for t in tabs]
            ks, tabs = [k for k, h in zip(ks, keep) if h], [t for t, h in zip(tabs, keep) if h]
        return ks, tabs

    @staticmethod
    def _judge_stale(tabs: list[_Moves], curves: tuple[np.ndarray, ...]) -> None:
        """Each move's peak, excess and arena peak within its window's ranges, for the windows
        whose figures a move changed (``seg``: valid until ``_apply`` changes the profiles there)."""
        stale = [t for t in tabs if t.seg is None]
        if not stale:
            return
        sw = np.repeat(np.array([t.window for t in stale]), [len(t.moves) for t in stale], axis=0)
        s_bytes, (s_lo, s_hi, sf_lo, sf_hi) = sw[:, 0], sw[:, 1:].astype(np.int64).T
        pb = np.concatenate([t.bytes for t in stale])
        plo, phi, pflo, pfhi = (np.concatenate([getattr(t, f) for t in stale]) for f in ("lo", "hi", "flo", "fhi"))
        ranges = ((s_lo, s_hi, plo, phi), (s_lo, s_hi, plo, phi), (sf_lo, sf_hi, pflo, pfhi))
        seg = np.stack([_covered_max(RangeMax(curve), lo, hi, pb, p_lo, p_hi) - s_bytes
                        for curve, (lo, hi, p_lo, p_hi) in zip(curves, ranges)], axis=1)
        for t, part in zip(stale, np.split(seg, np.cumsum([len(t.moves) for t in stale])[:-1])):
            t.seg = part

    def _figures(self, tabs: list[_Moves], curves: tuple[np.ndarray, ...], w: np.ndarray,
                 count: list[int]) -> list[np.ndarray]:
        """Per move: (peak, excess, arena peak) over all positions, the max of the curve outside
        its window's range (prefix and suffix maxima) and its ``seg`` inside."""
        figures = []
        for q, (curve, (lo, hi)) in enumerate(zip(curves, ((w[:, 1], w[:, 2]), (w[:, 1], w[:, 2]), (w[:, 3], w[:, 4])))):
            lo, hi = lo.astype(np.int64), hi.astype(np.int64)
            left, right = np.maximum.accumulate(curve), np.maximum.accumulate(curve[::-1])[::-1]
            outside = np.maximum(np.where(lo > 0, left[np.maximum(lo - 1, 0)], 0.0),
                                 np.where(hi + 1 < self.length, right[np.minimum(hi + 1, self.length - 1)], 0.0))
            figures.append(np.maximum(np.repeat(outside, count), np.concatenate([t.seg[:, q] for t in tabs])))
        return figures

    def _pick(self, phase: int, keys: list[np.ndarray], a_peak: np.ndarray) -> int | None:
        """The move lowest in ``keys`` (lexicographic); in phase 0, when holding the arena peak,
        the lowest of those keeping it at most max(its current value, 1% over the bound)."""
        x = int(np.lexsort(keys[::-1])[0])
        a_limit = max(float(self.fine.max()), 1.01 * self.bound)
        if not phase and self.hold_arena_peak and a_peak[x] > a_limit:
            self.held = True  # phase 0 may not push the arena peak above the bound's tolerance
            allowed = np.flatnonzero(a_peak <= a_limit)
            if not len(allowed):
                return None
            x = int(allowed[np.lexsort([key[allowed] for key in reversed(keys)])[0]])
        return x

    def _apply(self, k: int, c: int, xs: tuple[int, ...]) -> None:
        """Make move (cut ``c`` or -1, isolated blocks ``xs``) of window k: the profiles trade
        the window's arena for the arenas the move leaves."""
        prof, fine, tables = self.prof, self.fine, self.tables
        i, j = self.bounds[k], self.bounds[k + 1]
        t = tables.pop((i, j))
        w_bytes, w_lo, w_hi, wf_lo, wf_hi = t.window
        prof[w_lo:w_hi + 1] -= w_bytes
        fine[wf_lo:wf_hi + 1] -= w_bytes
        self.fine_area -= w_bytes * (wf_hi - wf_lo + 1)
        r = t.moves.index((c, xs))
        if c >= 0:
            self.bounds.insert(k + 1, c)
        if xs:
            self.alone[list(xs)] = True
        for p_bytes, p_lo, p_hi, pf_lo, pf_hi in zip(t.bytes[r], t.lo[r], t.hi[r], t.flo[r], t.fhi[r]):
            prof[p_lo:p_hi + 1] += p_bytes
            fine[pf_lo:pf_hi + 1] += p_bytes
            self.fine_area += p_bytes * (pf_hi - pf_lo + 1)
        for other in tables.values():  # the profiles changed over this window's ranges only
            _, o_lo, o_hi, of_lo, of_hi = other.window
            if o_lo <= w_hi and w_lo <= o_hi or of_lo <= wf_hi and wf_lo <= of_hi:
                other.seg = None


class _Moves:
    """The moves that split one window (blocks ``members``, indices into start order, less the
    isolated ones) and, per move, the arenas it leaves, one row each padded to one width:
    ``bytes``, ``lo``/``hi`` (allocated .. freed, whole calls) and ``flo``/``fhi`` (first start ..
    last end of their blocks).  ``moves[r]`` is row r's (cut index or -1, isolated blocks);
    ``window`` is the window's own arena, (bytes, lo, hi, flo, fhi)."""

    def __init__(self, i: int, members: np.ndarray, cuts: list[int], start: np.ndarray, end: np.ndarray,
                 size: np.ndarray, first: np.ndarray, last: np.ndarray, isolate: int):
        self.start, self.end, self.size, self.first, self.last = start, end, size, first, last
        width = 2 + isolate  # a clean cut: both sides and up to ``isolate`` blocks alone
        self.moves: list[tuple[int, tuple[int, ...]]] = []
        if not len(members):  # every block isolated
            b, lo, hi, flo, fhi = self._nothing(i)
            self.window = (float(b), int(lo), int(hi), int(flo), int(fhi))
            self._table(np.zeros((0, width, 5)))
            return
        s, e, b = start[members], end[members], size[members]
        f_lo, f_hi = int(s[0]), int(e.max())
        L = f_hi - f_lo + 1
        own = np.cumsum(np.bincount(s - f_lo, b, L + 1) - np.bincount(e + 1 - f_lo, b, L + 1))[:L]
        self.window = (float(own.max()), int(first[f_lo]), int(last[f_hi]), f_lo, f_hi)
        own_max = RangeMax(own)
        rows: list[np.ndarray] = []  # (moves, parts, 5) per kind of move
        cuts = np.asarray(cuts, dtype=np.int64)
        if len(cuts):
            rows += self._cut_rows(i, members, cuts, own, own_max, isolate)
        if len(members) > 1:
            rows += self._isolation_rows(members, own_max, isolate)
        self._table(np.concatenate([np.concatenate([r, np.zeros((len(r), width - r.shape[1], 5))], axis=1)
                                    if r.shape[1] < width else r for r in rows]) if rows else np.zeros((0, width, 5)))

    def _arenas(self, nbytes, lo, hi) -> np.ndarray:
        """Rows of (bytes, allocated, freed, first start, last end); no bytes: empty (padding)."""
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        cols = np.broadcast_arrays(np.asarray(nbytes, dtype=np.float64), self.first[lo], self.last[hi], lo, hi)
        return np.stack(cols, axis=-1).astype(np.float64)

    def _nothing(self, at) -> np.ndarray:
        """No blocks left: no bytes, allocated and freed where the range of ``at`` starts."""
        r = self._arenas(0.0, self.start[at], self.start[at])
        r[..., 2] = r[..., 1]
        return r

    def _cut_rows(self, i: int, members: np.ndarray, cuts: np.ndarray, own: np.ndarray, own_max: RangeMax,
                  isolate: int) -> list[np.ndarray]:
        """Cuts (the blocks starting before it, and the rest: each side's peak of live bytes),
        then clean cuts (the few blocks still live where the right side starts each in an arena
        of its own, so the left arena ends before the right one begins)."""
        start, end, size = self.start, self.end, self.size
        s, e, b = start[members], end[members], size[members]
        f_lo, L = int(s[0]), len(own)
        before = np.searchsorted(members, cuts)
        at = start[cuts] - f_lo  # where the right side starts, locally
        has_left, has_right = before > 0, before < len(members)
        nxt = np.minimum(before, len(members) - 1)
        # left of a cut only its blocks have started, and after the cut they only end
        left_peak = np.maximum.accumulate(own)[np.clip(at - 1, 0, L - 1)]
        left = self._arenas(left_peak, f_lo, np.maximum.accumulate(e)[np.maximum(before - 1, 0)])
        right = self._arenas(_right_peaks(s - f_lo, e - f_lo, b, before, L), s[nxt],
                             np.maximum.accumulate(e[::-1])[::-1][nxt])
        left = np.where(has_left[:, None], left, self._nothing(i))
        right = np.where(has_right[:, None], right, self._nothing(cuts))
        rows = [np.stack([left, right], axis=1)]
        self.moves += [(int(c), ()) for c in cuts]
        clean, crossing = _crossing(members, e, before, at + f_lo, isolate)
        if clean:
            q = np.array(clean)
            xs = np.array([x + [-1] * (isolate - len(x)) for x in crossing])  # padded with -1
            real = xs >= 0
            x_bytes = np.where(real, size[xs], 0.0)
            x_start = np.where(real, start[xs] - f_lo, 0)
            hi = at[q] - 1
            kept_peak = _covered_max(own_max, np.zeros_like(hi), hi, -x_bytes, x_start, np.broadcast_to(hi[:, None], xs.shape))
            ends = np.sort(e)
            kept_hi = ends[np.searchsorted(ends, at[q] + f_lo) - 1]
            kept_lo = s[np.searchsorted(-np.minimum.accumulate(e), -(at[q] + f_lo), side="right")]
            singles = self._arenas(x_bytes, np.where(real, start[xs], f_lo), np.where(real, end[xs], f_lo))
            rows.append(np.concatenate([self._arenas(kept_peak, kept_lo, kept_hi)[:, None], right[q][:, None], singles], axis=1))
            self.moves += [(int(cuts[k]), tuple(int(x) for x in xx)) for k, xx in zip(q, crossing)]
        return rows

    def _isolation_rows(self, members: np.ndarray, own_max: RangeMax, isolate: int) -> list[np.ndarray]:
        """Isolating one of the ``isolate`` longest-lived blocks: the rest, and that block alone."""
        start, end, size = self.start, self.end, self.size
        s, e = start[members], end[members]
        f_lo, L = int(s[0]), int(e.max()) - int(s[0]) + 1
        xs = members[np.argsort(s - e, kind="stable")[:isolate]]
        zero = np.zeros(len(xs), dtype=np.int64)
        peaks = _covered_max(own_max, zero, zero + L - 1, -size[xs][:, None], (start[xs] - f_lo)[:, None],
                             (end[xs] - f_lo)[:, None])
        rows = []
        for x, peak in zip(xs, peaks):
            keep = members != x
            rows.append(np.stack([self._arenas(peak, s[keep][0], e[keep].max()), self._arenas(size[x], start[x], end[x])])[None])
            self.moves.append((-1, (int(x),)))
        return rows

    def _table(self, table: np.ndarray) -> None:
        # padding parts hold no bytes at positions 0..0 (within every range, adds nothing)
        self.bytes = table[:, :, 0]
        self.lo, self.hi, self.flo, self.fhi = (table[:, :, q].astype(np.int64) for q in range(1, 5))
        w_bytes, w_lo, w_hi, wf_lo, wf_hi = self.window
        # what each move adds to the arenas' bytes summed over their positions (whole calls; own)
        self.d_area = (self.bytes * (self.hi - self.lo + 1)).sum(axis=1) - w_bytes * (w_hi - w_lo + 1)
        self.d_fine_area = (self.bytes * (self.fhi - self.flo + 1)).sum(axis=1) - w_bytes * (wf_hi - wf_lo + 1)
        self.seg: np.ndarray | None = None  # per move: peak, excess, arena peak within the window's ranges
        # ties go to the lower (cut, isolated blocks), as in a scan of the moves in that order
        self.rank = np.empty(len(self.moves), dtype=np.int64)
        self.rank[sorted(range(len(self.moves)), key=self.moves.__getitem__)] = np.arange(len(self.moves))


def _crossing(members: np.ndarray, e: np.ndarray, before: np.ndarray, at: np.ndarray,
              isolate: int) -> tuple[list[int], list[list[int]]]:
    """The cuts q with a few (1..``isolate``) blocks left of them still live at ``at[q]``, not all
    of the left ones, and those blocks (in index order): one sweep with a heap by end."""
    live: list[tuple[int, int]] = []  # (end, member) of left blocks
    clean, crossing = [], []
    k = 0
    for q in range(len(before)):
        while k < before[q]:
            heapq.heappush(live, (int(e[k]), int(members[k])))
            k += 1
        while live and live[0][0] < at[q]:
            heapq.heappop(live)
        if 0 < len(live) <= isolate and len(live) < before[q]:
            clean.append(q)
            crossing.append(sorted(m for _, m in live))
    return clean, crossing


def _right_peaks(s: np.ndarray, e: np.ndarray, b: np.ndarray, before: np.ndarray, length: int) -> np.ndarray:
    """Most bytes live at once among the blocks right of each cut (the window's blocks in start
    order, live over local positions ``s``..``e``; ``before[q]`` of them left of cut q): adding
    the blocks from the last one back, the profile only grows, so its max is the old max or the
    max over the range the new blocks cover (time: the blocks' lifetimes, not cuts x positions)."""
    out = np.full(len(before), -np.inf)
    prof = np.zeros(length)
    peak, k = -np.inf, len(s)
    for q in range(len(before) - 1, -1, -1):
        if k > before[q]:
            lo, hi = int(s[before[q]]), int(e[before[q]:k].max())
            while k > before[q]:
                k -= 1
                prof[s[k]:e[k] + 1] += b[k]
            peak = max(peak, float(prof[lo:hi + 1].max()))
        out[q] = peak
    return out


def _covered_max(curve: RangeMax, lo: np.ndarray, hi: np.ndarray, p_bytes: np.ndarray, p_lo: np.ndarray,
                 p_hi: np.ndarray) -> np.ndarray:
    """For each row r: max over positions lo[r]..hi[r] of the curve plus ``p_bytes[r, q]`` over
    every part q with ``p_lo[r, q] <= position <= p_hi[r, q]`` (parts lie within the range)."""
    cuts = np.concatenate([lo[:, None], hi[:, None] + 1, p_lo, p_hi + 1], axis=1)
    cuts = np.sort(np.clip(cuts, lo[:, None], hi[:, None] + 1), axis=1)
    a, b = cuts[:, :-1], cuts[:, 1:]  # elementary ranges a..b-1, each under a constant set of parts
    cover = ((p_lo[:, None, :] <= a[:, :, None]) & (a[:, :, None] <= p_hi[:, None, :])) * p_bytes[:, None, :]
    return (curve(a, b) + cover.sum(axis=2)).max(axis=1)


# ---------------------------------------------------------------------------------------------
# Placement: offsets inside each window's arena


def align_up(e: sympy.Expr, alignment: int) -> sympy.Expr:
    """``e`` rounded up to a multiple of ``alignment`` (a sympy expression for symbolic sizes)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return sympy.Integer(-(-int(e) // alignment) * alignment)
    return FloorDiv(e + (alignment - 1), alignment) * alignment


def place_static(spans: dict[str, tuple[sympy.Expr, int, int]], alignment: int) -> tuple[dict[str, sympy.Expr], int, str]:
    """Offsets from the best of the offset planners: (offsets, arena bytes, planner name)."""
    plan = plan_offsets([Interval(k, int(n), s, e) for k, (n, s, e) in spans.items()], alignment)
    return {k: sympy.Integer(o) for k, o in plan.offsets.items()}, plan.arena_bytes, plan.planner


def place_symbolic(
    spans: dict[str, tuple[sympy.Expr, int, int]], alignment: int
) -> tuple[dict[str, sympy.Expr], sympy.Expr, str]:
    """Slots shared by blocks of the same size expression with disjoint lifetimes, laid out one
    after another: sound for every value of the symbols, nothing re-planned at run time."""
    free: dict[sympy.Expr, list[tuple[int, int]]] = {}  # size -> heap of (last end, slot)
    slot_of: dict[str, int] = {}
    slot_sizes: list[sympy.Expr] = []
    for k, (nbytes, start, end) in sorted(spans.items(), key=lambda kv: (kv[1][1], kv[1][2])):
        heap = free.setdefault(nbytes, [])
        if heap and heap[0][0] < start:
            _, slot = heapq.heappop(heap)
        else:
            slot = len(slot_sizes)
            slot_sizes.append(nbytes)
        slot_of[k] = slot
        heapq.heappush(heap, (end, slot))
    offsets, at = [], sympy.Integer(0)
    for size in slot_sizes:
        offsets.append(at)
        at = at + align_up(size, alignment)
    return {k: offsets[s] for k, s in slot_of.items()}, at, "slots"


def place(window: dict[str, tuple[sympy.Expr, int, int]], alignment: int) -> tuple[dict[str, sympy.Expr], sympy.Expr, str]:
    """Offsets of one arena's blocks: the offset planners for static sizes, slots otherwise."""
    if all(sympy.sympify(n).is_Integer for n, _, _ in window.values()):
        offsets, nbytes, planner = place_static(window, alignment)
        return offsets, sympy.Integer(nbytes), planner
    return place_symbolic(window, alignment)


def place_windows(
    windows: list[list[str]],
    spans: dict[str, tuple[sympy.Expr, int, int]],
    hinted: Spans,
    alignment: int,
    calls: Calls | None = None,
    rounds: int = 8,
    tries: int = 4,
    max_blocks: int = 4096,
) -> list[tuple[list[str], tuple[dict[str, sympy.Expr], sympy.Expr, str]]]:
    """Place every window (``place``), then repair what the search could not see (it sizes a
    window at its blocks' peak of live bytes; the offset planners may need more): while the
    most arena bytes live at once exceed the blocks' own peak by more than 1%, take the window
    live there that its planner packs worst and move the one of its ``tries`` longest-lived
    blocks whose removal lowers that figure most into an arena of its own (never growing what is
    allocated around kernel calls), at most ``rounds`` times, stopping when no move lowers it.
    Windows of more than ``max_blocks`` blocks are left as they are.  docs/memory.md, "Placement"."""
    placed = {tuple(w): place({k: spans[k] for k in w}, alignment) for w in windows}
    if not spans:
        return []
    length = max(e for _, _, e in hinted.values()) + 1
    first, last = calls if calls is not None else (np.arange(length), np.arange(length))
    length = max(length, len(last))
    bound = peak_live_bytes((s, e, n) for n, s, e in hinted.values())

    def size(w: tuple[str, ...]) -> int:
        return hint(placed[w][1]) if sympy.sympify(placed[w][1]).is_Integer else 0

    def span(w: tuple[str, ...], calls: bool = False) -> tuple[int, int]:  # first start .. last end
        lo, hi = min(hinted[k][1] for k in w), max(hinted[k][2] for k in w)
        return (int(first[lo]), int(last[hi])) if calls else (lo, hi)

    def profile(ws, calls: bool = False) -> np.ndarray:
        return live_profile(((*span(w, calls), size(w)) for w in ws), length)

    current = list(placed)
    for _ in range(rounds):
        prof = profile(current)
        at, top = int(prof.argmax()), int(prof.max())
        allocated = int(profile(current, True).max())  # around whole calls: must not grow
        if top <= 1.01 * bound:
            break
        waste = {w: size(w) - peak_live_bytes((hinted[k][1], hinted[k][2], hinted[k][0]) for k in w)
                 for w in current if 1 < len(w) <= max_blocks and span(w)[0] <= at <= span(w)[1] and size(w) > 0}
        fragmented = [w for w, wasted in waste.items() if wasted > 0]
        if not fragmented:
            break
        w = max(fragmented, key=waste.get)
        best = None
        for x in sorted(w, key=lambda k: (hinted[k][1] - hinted[k][2], -hinted[k][0], k))[:tries]:
            rest = tuple(k for k in w if k != x)
            for part in (rest, (x,)):
                if part not in placed:
                    placed[part] = place({k: spans[k] for k in part}, alignment)
            trial = [v for v in current if v != w] + [rest, (x,)]
            t = int(profile(trial).max())
            if int(profile(trial, True).max()) > allocated:
                continue
            if best is None or t < best[0]:
                best = (t, trial)
        if best is None or best[0] >= top:
            break
        current = best[1]
    current.sort(key=lambda w: span(w))
    return [(list(w), placed[w]) for w in current]


def placed_peaks(placed, hinted: Spans, other: np.ndarray, first: np.ndarray,
                 last: np.ndarray, env) -> tuple[int, int, int]:
    """(most of ``other`` + arenas allocated at once around kernel calls, most arena bytes live at
    once over their buffers' own positions, number of arenas) of placed windows."""
    calls = arena_calls_profile(placed, hinted, first, last, env)
    calls[:len(other)] += other.astype(calls.dtype)
    own = live_profile(_arena_spans(placed, hinted, env), len(first))
    return int(calls.max()), int(own.max()), len(placed)


def arena_calls_profile(placed, hinted: Spans, first: np.ndarray, last: np.ndarray, env) -> np.ndarray:
    """Bytes of placed windows' arenas allocated at each position: from the first call of their
    first buffer's span to the last call of their last's."""
    return live_profile(((first[lo], last[hi], b) for lo, hi, b in _arena_spans(placed, hinted, env)), len(first))


def _arena_spans(placed, hinted: Spans, env) -> list[tuple[int, int, int]]:
    return [(min(hinted[k][1] for k in heads), max(hinted[k][2] for k in heads), hint(nbytes, env))
            for heads, (_, nbytes, _) in placed]
