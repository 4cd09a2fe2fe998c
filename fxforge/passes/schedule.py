"""The order nodes run in: program order, or a memory-aware reordering when it lowers peak bytes.

``schedule`` runs a greedy list scheduler that, among the nodes whose inputs are ready, runs the
one that adds the fewest live bytes (new storages minus the storages it is the last user of),
then keeps whichever of that order and program order has the lower peak of live bytes.

Constraints kept: a node runs after its inputs; a multi-output node's getitems run right after
it; nodes with side effects (asserts, mutations, random ops) keep their relative order, so random
streams and checks are unchanged.  Kernel groups are single nodes until the fusion pass; a group
of several nodes is scheduled as one unit.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass
from typing import Collection, Iterable

import torch
import torch.fx as fx

from ..core.graph import (
    GROUP,
    VAL,
    liveness,
    node_kind,
    output_nodes,
    peak_live_bytes,
    shape_env_of,
    storage_nbytes_hint,
    storage_root,
)
from ..lowering.cleanup import has_side_effects
from ..core.plan import group_outputs


def storage_sizes(gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> dict[fx.Node, int]:
    """Bytes (at the traced sizes) of every storage the graph creates, keyed by its root node."""
    env = shape_env_of(gm)
    out = {}
    for n in nodes:
        v = n.meta.get(VAL)
        if node_kind(n) in ("compute", "getitem") and storage_root(n) is n and isinstance(v, torch.Tensor):
            out[n] = storage_nbytes_hint(v, env)
    return out


def fused_layout(gm: fx.GraphModule, order: list[fx.Node], fused: Collection[int] = (),
                 internal: set[fx.Node] | None = None) -> tuple[dict[fx.Node, int], set[fx.Node]]:
    """Positions of ``order`` as memory planning sees them (``memory.positions``), and the
    values that never reach memory (``internal``: found before for the same groups, which no
    order changes).  Every node of a group in ``fused`` (group ids whose backend emits one
    kernel per group) sits at the group's last position, with the getitems of its nodes: one
    kernel reads all its inputs and writes all its outputs; a value computed and read only inside
    such a kernel gets no buffer."""
    by_group: dict[int, list[fx.Node]] = {}
    if fused:
        for n in order:
            if GROUP.get(n) in fused:
                by_group.setdefault(GROUP.of(n), []).append(n)
    pos = fused_positions(order, by_group.values())
    if internal is None:
        outputs = set(output_nodes(gm))
        internal = set()
        for ns in by_group.values():
            if len(ns) > 1:
                written = set(group_outputs(ns, outputs))
                internal |= {n for n in ns if node_kind(n) == "compute" and n not in written}
    return pos, internal


def fused_positions(order: list[fx.Node], fused_groups: Iterable[list[fx.Node]]) -> dict[fx.Node, int]:
    """Positions of ``order`` for liveness: every node of a fused group of several nodes (and
    every getitem of one) sits at the group's last position, since one kernel reads all its
    inputs and writes all its outputs there; other nodes keep their own positions."""
    pos = {n: i for i, n in enumerate(order)}
    for ns in fused_groups:
        if len(ns) > 1:
            at = max(pos[n] for n in ns)
            for n in ns:
                pos[n] = at
                for u in n.users:
                    if u.target is operator.getitem and u in pos:
                        pos[u] = at
    return pos


def peak_bytes(gm: fx.GraphModule, order: list[fx.Node], sizes: dict[fx.Node, int] | None = None,
               fused: Collection[int] = (), internal: set[fx.Node] | None = None) -> int:
    """Max bytes of graph-created storages live at once when the nodes run in ``order``, kernel
    groups in ``fused`` each as one kernel (``fused_layout``, which ``internal`` passes on)."""
    sizes = storage_sizes(gm, order) if sizes is None else sizes
    pos, internal = fused_layout(gm, order, fused, internal)
    live = liveness(order, output_nodes(gm), pos)
    return peak_live_bytes((l.start, l.end, sizes[r]) for r, l in live.items() if r in sizes and r not in internal)


def program_order(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op != "output"]


@dataclass
class Units:
    """Scheduling units: a kernel group runs as one unit; getitems ride along with their producer."""

    nodes: list[fx.Node]  # program order
    index: dict[fx.Node, int]
    unit_of: dict[fx.Node, fx.Node]  # node -> its unit's head
    members: dict[fx.Node, list[fx.Node]]  # head -> nodes, in program order
    deps: dict[fx.Node, set[fx.Node]]  # head -> heads it waits for
    users: dict[fx.Node, list[fx.Node]]  # head -> heads waiting for it


def units(gm: fx.GraphModule) -> Units:
    nodes = program_order(gm)
    index = {n: i for i, n in enumerate(nodes)}
    unit_of: dict[fx.Node, fx.Node] = {}
    members: dict[fx.Node, list[fx.Node]] = {}
    group_head: dict[int, fx.Node] = {}
    for n in nodes:
        if n.op == "call_function" and n.target is operator.getitem and n.args[0] in unit_of:
            head = unit_of[n.args[0]]
        elif GROUP.get(n) is not None:
            head = group_head.setdefault(GROUP.of(n), n)
        else:
            head = n
        unit_of[n] = head
        members.setdefault(head, []).append(n)

    deps: dict[fx.Node, set[fx.Node]] = {h: set() for h in members}
    last_effect = None
    for h, ms in members.items():
        for m in ms:
            for a in m.all_input_nodes:
                if unit_of[a] is not h:
                    deps[h].add(unit_of[a])
        if any(has_side_effects(m) and m.op == "call_function" for m in ms):
            if last_effect is not None:
                deps[h].add(last_effect)
            last_effect = h
    users: dict[fx.Node, list[fx.Node]] = {h: [] for h in members}
    for h, ds in deps.items():
        for d in ds:
            users[d].append(h)
    return Units(nodes, index, unit_of, members, deps, users)


def unit_program_order(gm: fx.GraphModule, u: Units | None = None) -> list[fx.Node]:
    """Program order with every group's nodes together: ready units in order of their last node,
    so a group runs where its last node was, as fusion's peak guard (``fusion._PeakModel``)
    assumes: a group's inputs are then all computed before it, and its early members' outputs
    do not wait, written, for its last member's inputs."""
    u = u or units(gm)
    if all(u.index[ms[-1]] - u.index[ms[0]] == len(ms) - 1 for ms in u.members.values()):
        return u.nodes  # every unit is already contiguous
    waiting = {h: len(ds) for h, ds in u.deps.items()}
    heap = [(u.index[u.members[h][-1]], h) for h, w in waiting.items() if w == 0]
    heapq.heapify(heap)
    order: list[fx.Node] = []
    while heap:
        _, h = heapq.heappop(heap)
        order.extend(u.members[h])
        for x in u.users[h]:
            waiting[x] -= 1
            if waiting[x] == 0:
                heapq.heappush(heap, (u.index[u.members[x][-1]], x))
    if len(order) != len(u.nodes):
        raise AssertionError("kernel groups form a cycle: no order runs each group as one unit")
    return order


def memory_order(gm: fx.GraphModule, sizes: dict[fx.Node, int], un: Units | None = None) -> list[fx.Node]:
    """Greedy: run the ready unit that raises live bytes least (ties: program order, a group
    where its last node was, as in ``unit_program_order``)."""
    un = un or units(gm)
    nodes, unit_of, members, deps, users = un.nodes, un.unit_of, un.members, un.deps, un.users
    index = {h: un.index[ms[-1]] for h, ms in members.items()}
    outputs = {storage_root(o) for o in output_nodes(gm)}

    # Storage bookkeeping: a storage is freed once every unit touching any alias of it has run.
    touching: dict[fx.Node, set[fx.Node]] = {}
    for n in nodes:
        r = storage_root(n)
        if r in sizes:
            touching.setdefault(r, set()).add(unit_of[n])
            for u in n.users:
                if u.op != "output":
                    touching[r].add(unit_of[u])
    remaining = {r: len(us) for r, us in touching.items()}
    storages_of: dict[fx.Node, list[fx.Node]] = {h: [] for h in members}
    for r, us in touching.items():
        for u in us:
            storages_of[u].append(r)
    creates = {h: sum(sizes.get(m, 0) for m in ms if storage_root(m) is m) for h, ms in members.items()}

    def delta(h: fx.Node) -> int:
        frees = sum(sizes[r] for r in storages_of[h] if remaining[r] == 1 and r not in outputs and unit_of[r] is not h)
        return creates[h] - frees

    waiting = {h: len(ds) for h, ds in deps.items()}
    heap = [(delta(h), index[h], h) for h, w in waiting.items() if w == 0]
    heapq.heapify(heap)
    done: set[fx.Node] = set()
    order: list[fx.Node] = []
    while heap:
        d, _, h = heapq.heappop(heap)
        if h in done:
            continue
        cur = delta(h)
        if cur != d:  # stale key: frees changed since it was pushed
            heapq.heappush(heap, (cur, index[h], h))
            continue
        done.add(h)
        order.extend(members[h])
        for r in storages_of[h]:
            remaining[r] -= 1
            if remaining[r] == 1:  # its last toucher now frees it: that unit got cheaper
                last = next(u for u in touching[r] if u not in done)
                if waiting[last] == 0:
                    heapq.heappush(heap, (delta(last), index[last], last))
        for u in users[h]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (delta(u), index[u], u))
    if len(order) != len(nodes):
        raise AssertionError("memory-aware scheduling lost nodes: the graph has a cycle")
    return order


def schedule(gm: fx.GraphModule, fused: Collection[int] = ()) -> tuple[list[fx.Node], dict]:
    """The schedule with the lower peak of live bytes, and figures on the choice.  ``fused``: the
    kernel groups run as one kernel each (their values inside never reach memory); peaks are
    computed as memory planning lays the schedule out (``fused_layout``)."""
    un = units(gm)
    prog = unit_program_order(gm, un)
    sizes = storage_sizes(gm, prog)
    _, internal = fused_layout(gm, prog, fused)
    prog_peak = peak_bytes(gm, prog, sizes, fused, internal)
    mem = memory_order(gm, {r: b for r, b in sizes.items() if r not in internal}, un)
    mem_peak = peak_bytes(gm, mem, sizes, fused, internal)
    if mem_peak < prog_peak:
        return mem, {"schedule": "memory", "schedule_peak_bytes": mem_peak}
    return prog, {"schedule": "program", "schedule_peak_bytes": prog_peak}
