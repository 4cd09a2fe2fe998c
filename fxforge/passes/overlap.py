"""Compute-communication overlap, and the communication figures of a schedule.

A traced graph waits for each collective right after issuing it (``all_gather_into_tensor`` then
``wait_tensor``): every byte of communication is exposed.  ``overlap`` reorders a schedule so
that

* each ``wait_tensor`` runs just before the first node reading what it waited for, and
* each collective is issued as soon as its inputs are ready,

so the compute between them runs while the collective is in flight (a collective runs on its
process group's own stream or threads: NCCL's stream, gloo's workers).  What it keeps:

* **the order of the collectives**: issued in the order the graph has them, on every rank the
  same (``order_digest`` in ``stats["comm"]``: a hash of the issue order, equal on every rank
  compiling the same graph); a collective is never moved before the one issued before it;
* **dependencies**: a node after every node it reads; a fused kernel moves as one;
* **mutations**: no collective is issued before, and no wait moved past, a node that writes
  into a tensor in place (it might be one the collective reads or fills);
* **memory**: issuing a collective early allocates its output early (an all-gather's: the whole
  gathered tensor: a prefetch), and waiting late keeps an asynchronous collective's input
  alive longer.  Each move goes only as far as keeps the schedule's peak of live bytes within
  ``(1 + Config.prefetch_peak_growth)`` times the peak before overlap; the final order is
  checked exactly, and so is its memory plan's peak against the plan's with every collective
  waited for at once, where the compiler gives the pass its planner; if either is over, the
  moves are taken back: halfway, then the issues' alone, then those halfway, then all.

``comm_figures`` replays a schedule under the cost models (``core/costs.py``): the compute
kernels one after another at their roofline time, the collectives one after another on their
own stream from when they are issued; a wait stalls the compute until its collective is done.
``exposed_s`` is the time the compute stalls; ``estimated_s`` the collectives' own time.
"""

from __future__ import annotations

import hashlib
import operator
from typing import Callable, Collection

import numpy as np
import torch.fx as fx

from ..core.collectives import (async_input_ops, collective_bytes, group_name_of, group_size_of, is_collective,
                                is_wait, waited_collective)
from ..core.config import Config
from ..core.costs import CommModel, ComputeModel, node_bytes, node_flops, value_bytes
from ..core.graph import GROUP, is_mutating, live_profile, liveness, node_kind, output_nodes, storage_root
from .schedule import fused_layout, peak_bytes, storage_sizes


# --------------------------------------------------------------------------- units


def units(order: list[fx.Node]) -> list[list[fx.Node]]:
    """``order`` cut into what moves as one: a kernel group's nodes (consecutive in a schedule,
    whatever its backend: the wrapper emits a group as one call) with the getitems after them,
    and every other node alone."""
    out: list[list[fx.Node]] = []
    last_group = None
    for n in order:
        g = GROUP.get(n)
        joins = out and ((g is not None and g == last_group)
                         or (n.target is operator.getitem and n.args[0] in out[-1]))
        if joins:
            out[-1].append(n)
        else:
            out.append([n])
            last_group = g
    return out


# How far the waits sink and the issues rise, as a fraction of how far they could: tried in turn
# until the result keeps within the bound (a wait sunk keeps an asynchronous collective's input
# alive; an issue hoisted allocates its output early: either may be what the bound refuses).
_REACHES = ((1.0, 1.0), (0.5, 0.5), (0.0, 1.0), (0.0, 0.5), (0.0, 0.0))


def overlap(gm: fx.GraphModule, order: list[fx.Node], fused: Collection[int], config: Config,
            planned_peak: Callable[[list[fx.Node]], int] | None = None) -> tuple[list[fx.Node], dict]:
    """The schedule ``order`` with its collectives overlapped (module docstring), and what the
    pass did: ``moved_waits``, ``moved_issues``, ``peak_before``, ``peak_after`` (live bytes).

    ``planned_peak`` (a schedule -> the bytes its memory plan holds at its peak: arenas as
    allocated, held for the whole call where they are kept, and the storages outside them)
    checks the result as the rank will hold it: within ``1 + prefetch_peak_growth`` of the
    plan's peak with every collective waited for at once (what ``comm_overlap=False`` runs),
    else the moves are taken back (``_REACHES``).  Live bytes alone miss that an arena kept across
    calls is held whole while a prefetched tensor lives beside it, and how the arenas pack
    (``planned_peak_before``, ``planned_peak_after``)."""
    if not any(is_collective(n) for n in order):
        return order, {}
    sizes = storage_sizes(gm, order)
    before = peak_bytes(gm, order, sizes, fused)
    bound = before * (1.0 + config.prefetch_peak_growth)
    planned: dict = {}
    if planned_peak is not None:
        planned["planned_peak_before"] = planned_peak(wait_at_once(order))
    for sink, hoist in _REACHES:
        seq = units(order)
        if sink:
            _sink_copy_outs(seq)
        waits = _sink_waits(gm, seq, sizes, fused, bound, sink)
        issues = _hoist_issues(gm, seq, sizes, fused, bound, hoist)
        new = [n for u in seq for n in u]
        after = peak_bytes(gm, new, sizes, fused)
        last = not (sink or hoist)
        if after > bound and not last:
            continue
        if planned_peak is not None:
            planned["planned_peak_after"] = planned_peak(new)
            if planned["planned_peak_after"] > planned["planned_peak_before"] * (1.0 + config.prefetch_peak_growth) \
                    and not last:
                continue
        break
    return new, {"moved_waits": waits, "moved_issues": issues, "peak_before": before, "peak_after": after, **planned}


def _profile(gm: fx.GraphModule, seq: list[list[fx.Node]], sizes: dict, fused: Collection[int]) -> np.ndarray:
    """Live bytes at each unit of ``seq``."""
    order = [n for u in seq for n in u]
    _, internal = fused_layout(gm, order, fused)
    upos = {n: i for i, u in enumerate(seq) for n in u}
    return live_profile(((live.start, live.end, sizes[r]) for r, live in liveness(order, output_nodes(gm), upos).items()
                         if r in sizes and r not in internal), len(seq))


def _barrier(u: list[fx.Node]) -> bool:
    """A unit nothing crosses: it writes into a tensor in place."""
    return any(is_mutating(n) and not is_collective(n) and not is_wait(n) for n in u)


def _sink_waits(gm, seq, sizes, fused, bound: float, reach: float) -> int:
    """Each wait moved to just before the first unit reading what it waited for (or before a
    barrier), as far as the bound allows the collective's input to stay alive; the last wait
    first, each once; how many moved."""
    prof = _profile(gm, seq, sizes, fused)
    moved = 0
    for w in reversed([u[0] for u in seq if len(u) == 1 and is_wait(u[0])]):
        i = next(k for k, u in enumerate(seq) if u[0] is w)
        readers = set(w.users)
        j = i + 1
        while j < len(seq) and not _barrier(seq[j]) and not readers.intersection(seq[j]):
            j += 1
        target = i + int((j - i - 1) * reach)  # the unit it goes after
        extra = _kept_input_bytes(w, sizes)
        while target > i and extra and prof[i + 1:target + 1].max(initial=0) + extra > bound:
            target -= 1
        if target > i:
            seq.insert(target, seq.pop(i))  # (the units between move up one)
            prof[i:target] = prof[i + 1:target + 1] + extra
            moved += 1
    return moved


def _sink_copy_outs(seq: list[list[fx.Node]]) -> None:
    """What a wait's result feeds alone (a bucket's copy-outs: each member's slice of the gathered
    buffer copied out, its views) moved down to just before the first unit reading what it makes,
    the last first: a schedule by live bytes copies every member out at once, and the wait would
    then stall before all of them rather than before the first value needed."""
    unit_of = {n: u for u in seq for n in u}
    for w in [u[0] for u in seq if len(u) == 1 and is_wait(u[0])]:
        at = {id(u): k for k, u in enumerate(seq)}
        fed, chain, todo = {w}, [], [unit_of[r] for r in w.users if r in unit_of]
        while todo:  # (the units reading only what the wait feeds, found through users)
            u = todo.pop()
            if any(x is u for x in chain) or _barrier(u) or any(is_collective(n) or is_wait(n) for n in u):
                continue
            if all(a in fed or a in u for n in u for a in n.all_input_nodes):
                fed.update(u)
                chain.append(u)
                todo += [unit_of[r] for n in u for r in n.users if r in unit_of]
        for u in sorted(chain, key=lambda u: -at[id(u)]):
            i = at[id(u)]  # (the units moved so far were after it: it has not moved)
            members = set(u)
            j = next((k for k in range(i + 1, len(seq)) if any(a in members for n in seq[k] for a in n.all_input_nodes)),
                     None)
            if j is not None and j > i + 1:
                seq.insert(j - 1, seq.pop(i))


def _kept_input_bytes(w: fx.Node, sizes: dict) -> int:
    """Bytes a wait moved later keeps alive: an asynchronous collective's input, read until then."""
    c = waited_collective(w)
    if c is None or c.target not in async_input_ops():
        return 0
    inputs = c.args[0] if isinstance(c.args[0], (list, tuple)) else [c.args[0]]
    return sum(sizes.get(storage_root(a), 0) for a in inputs if isinstance(a, fx.Node))


def _hoist_issues(gm, seq, sizes, fused, bound: float, reach: float) -> int:
    """Each collective moved to just after the last unit it reads, the collective issued before
    it, or a barrier, as far as the bound allows its output to be allocated early; in issue
    order, each once; how many moved.  What computes a collective's input for it alone (a
    bucket's copy-in, the views it reads) moves up first, as far as its own inputs allow: the
    collective is then ready as soon as the values it sends are."""
    prof = _profile(gm, seq, sizes, fused)
    unit_of = {n: u for u in seq for n in u}
    moved = 0
    last_issue = -1
    for c in [u[0] for u in seq if len(u) == 1 and is_collective(u[0])]:
        for p in _feeders(unit_of[c], unit_of):
            _hoist(seq, prof, p, -1, sizes, bound, reach)
        at = _hoist(seq, prof, unit_of[c], last_issue, sizes, bound, reach)
        moved += at[1]
        last_issue = at[0]
    return moved


def _feeders(u: list[fx.Node], unit_of: dict) -> list[list[fx.Node]]:
    """The compute units that only ``u`` reads from, and theirs, the farthest first."""
    out: list = []
    members = set(u)
    for a in dict.fromkeys(x for n in u for x in n.all_input_nodes if x not in members):
        p = unit_of.get(a)
        if p is None or any(p is q for q in out) or p[0].op != "call_function" or is_collective(p[0]) or is_wait(p[0]) \
                or _barrier(p):  # (a placeholder keeps its place: the wrapper's arguments come in that order)
            continue
        inside = set(p)
        if all(user in inside or user in members for n in p for user in n.users):
            out += [q for q in _feeders(p, unit_of) if not any(q is r for r in out)] + [p]
    return out


def _hoist(seq, prof, u, floor: int, sizes, bound: float, reach: float) -> tuple[int, bool]:
    """Unit ``u`` moved up to just after the last unit it reads (not above ``floor`` or a
    barrier), as far as the bound allows what it allocates; (its index, whether it moved)."""
    i = next(k for k, x in enumerate(seq) if x is u)
    members = set(u)
    deps = {a for n in u for a in n.all_input_nodes} - members
    j = i - 1
    while j > floor and not _barrier(seq[j]) and not deps.intersection(seq[j]):
        j -= 1
    target = i - int((i - j - 1) * reach)  # the index it goes to
    out = sum(sizes.get(n, 0) for n in u)
    while target < i and out and prof[target:i].max(initial=0) + out > bound:
        target += 1
    if target >= i:
        return i, False
    seq.insert(target, seq.pop(i))
    prof[target + 1:i + 1] = prof[target:i] + out
    return target, True


def waits_of(order: list[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    """Each collective's waits in ``order``, in order."""
    waits: dict[fx.Node, list[fx.Node]] = {}
    for n in order:
        c = waited_collective(n) if is_wait(n) else None
        if c is not None:
            waits.setdefault(c, []).append(n)
    return waits


def wait_at_once(order: list[fx.Node]) -> list[fx.Node]:
    """``order`` with each collective waited for right after it is issued (``Config(comm_overlap=
    False)``: every collective exposed, as tracing leaves them; a schedule by live bytes may
    otherwise run compute between the two by chance)."""
    issued = set(order)
    after = {c: [x for w in ws for x in ([] if w.args[0] is c else [w.args[0]]) + [w]]  # (a coalesced one's getitem)
             for c, ws in waits_of(order).items() if c in issued}
    moved = {x for xs in after.values() for x in xs}
    out: list[fx.Node] = []
    for n in order:
        if n not in moved:
            out.append(n)
            out.extend(dict.fromkeys(after.get(n, ())))
    return out


def bound_in_flight(order: list[fx.Node], limit: int) -> tuple[list[fx.Node], int]:
    """``order`` with at most ``limit`` collectives in flight at any point (0: no bound).  A
    collective that would exceed it is issued later, in its turn, when one in flight has been
    waited for; only where something needs it sooner (its wait, a reader of its result, a node
    writing in place, which it must not be moved past) is the oldest in flight waited for early
    (a wait depends only on its collective: moving it up is always legal).  The collectives keep
    their order.  Returns the order and how many collectives or waits moved."""
    if not limit:
        return order, 0
    waits = waits_of(order)
    out: list[fx.Node] = []
    done: set[fx.Node] = set()
    in_flight: list[fx.Node] = []
    held: list[fx.Node] = []  # collectives issued later than their place, in order
    moved = 0

    def emit(x: fx.Node) -> None:
        out.append(x)
        done.add(x)

    def issue(upto: fx.Node | None) -> None:
        """Issue the held collectives (through ``upto``, or all), waiting for the oldest in
        flight early where the bound needs it."""
        nonlocal moved
        while held:
            c = held.pop(0)
            while len(in_flight) >= limit:
                old = in_flight.pop(0)
                for w in waits[old]:
                    if w not in done:
                        if w.args[0] is not old and w.args[0] not in done:
                            emit(w.args[0])  # (the getitem of a coalesced collective)
                        emit(w)
                        moved += 1
            emit(c)
            in_flight.append(c)
            if c is upto:
                return

    for n in order:
        if n in done:
            continue
        if is_collective(n) and n in waits:
            if len(in_flight) < limit and not held:
                emit(n)
                in_flight.append(n)
            else:
                held.append(n)
                moved += 1
            continue
        needed = [a for a in n.all_input_nodes if a in held]
        if needed:
            issue(max(needed, key=held.index))
        elif held and _barrier([n]):
            issue(None)
        emit(n)
        c = waited_collective(n) if is_wait(n) else None
        if c in in_flight:
            in_flight.remove(c)
            while held and len(in_flight) < limit:
                issue(held[0])
    issue(None)
    return out, moved


# --------------------------------------------------------------------------- figures


def replay(order: list[fx.Node], fused: Collection[int], comm: CommModel,
           compute: ComputeModel) -> list[tuple[str, fx.Node, float, float]]:
    """The schedule ``order`` replayed: each unit (``units``) at its estimated time under
    ``compute``, one after another; the collectives one after another on their own stream, each
    from when it is issued and the previous one is done, for its time under ``comm``; a wait for
    one not done stalls the compute until it is.  Events ``(lane, node, start, end)`` in order:
    lane "compute" (a unit, its first node), "comm" (a collective) or "stall" (a wait, the
    collective it waits for)."""
    clock = stream = 0.0
    done: dict[fx.Node, float] = {}
    events: list[tuple[str, fx.Node, float, float]] = []
    for u in units(order):
        head = u[0]
        if len(u) == 1 and is_collective(head):
            kind, sent = collective_bytes(head)
            start = max(clock, stream)
            stream = done[head] = start + comm.time(kind, sent, group_size_of(head))
            events.append(("comm", head, start, stream))
        elif len(u) == 1 and is_wait(head):
            c = waited_collective(head)
            if c in done and done[c] > clock:
                events.append(("stall", c, clock, done[c]))
                clock = done[c]
        else:
            t = _unit_time(u, fused, compute)
            if t:
                events.append(("compute", head, clock, clock + t))
                clock += t
    return events


def comm_figures(gm: fx.GraphModule, order: list[fx.Node], fused: Collection[int], comm: CommModel,
                 compute: ComputeModel) -> dict:
    """``stats["comm"]`` of a schedule (``replay``): ``count``, ``bytes`` (this rank sends),
    ``estimated_s`` (the collectives' time under ``comm``), ``exposed_s`` (the compute's stalls),
    ``overlapped`` (1 - exposed / estimated), ``model``, ``order_digest``, per collective its node,
    kind, ranks, bytes, time and stall, and where there are collectives the ``timeline``: each
    event as ``[lane, name, start_s, end_s]``, what the report draws."""
    rows: dict[fx.Node, dict] = {}
    digest = hashlib.sha256()
    exposed = 0.0
    events = replay(order, fused, comm, compute) if any(is_collective(n) for n in order) else []
    for lane, n, start, end in events:
        if lane == "comm":
            kind, sent = collective_bytes(n)
            ranks = group_size_of(n)
            rows[n] = {"node": n.name, "collective": kind, "ranks": ranks, "bytes": sent, "estimated_s": end - start,
                       "exposed_s": 0.0}
            digest.update(f"{kind}|{group_name_of(n)}|{ranks}|{sent};".encode())
        elif lane == "stall":
            exposed += end - start
            rows[n]["exposed_s"] += end - start
    total = sum(r["estimated_s"] for r in rows.values())
    exposed = min(exposed, total)  # (stalls are differences of sums: a rounding past the total)
    out = {"count": len(rows), "bytes": sum(r["bytes"] for r in rows.values()), "estimated_s": total,
           "exposed_s": exposed, "overlapped": 1.0 - exposed / total if total else 1.0, "model": comm.name,
           "compute_model": compute.name, "order_digest": digest.hexdigest()[:16], "collectives": list(rows.values())}
    if rows:
        out["timeline"] = [[lane, n.name, start, end] for lane, n, start, end in events]
    return out


def _unit_time(u: list[fx.Node], fused: Collection[int], compute: ComputeModel) -> float:
    """A unit's estimated time: a fused kernel's members' work at once and only the bytes it reads
    from and writes to memory; other nodes each their own."""
    members = set(u)
    flops = sum(node_flops(n) for n in u)
    if len(u) > 1 and GROUP.get(u[0]) in fused:
        nbytes = 0.0
        for n in u:
            if node_kind(n) == "compute" and any(x not in members for x in n.users):
                nbytes += value_bytes(n)
            nbytes += sum(value_bytes(a) for a in n.all_input_nodes if a not in members and node_kind(a) != "view")
    else:
        nbytes = sum(node_bytes(n) for n in u)
    return compute.time(flops, nbytes) if (flops or nbytes) else 0.0
