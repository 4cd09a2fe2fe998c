"""Fusion: merge single-node kernel groups into larger ones, under guarded limits.

Runs after ``AssignBackends`` (one group per compute node).  Candidates are the nodes the
selected backend runs that are pointwise or reductions (``fxforge.core.iteration``); extern ops
(matmuls, convolutions, collectives...), fallbacks and nodes with side effects (random ops,
asserts) end groups.

Two sweeps, greedy, in program order:

* vertical: a consumer with the group of each producer it reads (directly, or through views
  and getitems, which then join the group; a view also used outside it is copied first);
* horizontal: groups of nodes reading the same value.

Every candidate merge is checked, in this order, and refused with a reason code when it fails:

=========================  ======================================================================
``max_fusion_size``        more than ``Config.max_fusion_size`` compute nodes
``cycle``                  some node outside the two groups depends on one and feeds the other
``incompatible_iteration`` loop nests differ (element counts; reduction rows x reduced elements)
``backend``                the backend cannot emit the group as one kernel (its reason is kept)
``max_unique_io_buffers``  more distinct buffers read or written than
                           ``Config.max_fusion_unique_io_buffers`` (the backend's own count)
``max_kernel_args``        more launch arguments than ``Config.max_kernel_args`` or the backend's
                           own bound (``CodegenBackend.max_kernel_args``; the backend's
                           count for the kernel it would emit: pointers, sizes, strides, scalars)
``peak_memory``            the estimated peak of live bytes would exceed the unfused graph's by
                           more than ``Config.max_fusion_peak_growth``
=========================  ======================================================================

The peak estimate runs over program order with each group at the position of its last node (a
fused group reads all its inputs and writes all its outputs there; values inside a fused group
take no memory).  Fusion therefore never raises that peak above ``(1 + growth) *`` the unfused
peak.  Refusals are counted in ``stats["refused_fusions"]`` and listed (first 200) with the nodes
and details in ``stats["refused"]``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import sympy
import torch.fx as fx

from ..codegen.api import CodegenBackend, GroupCost, kernel_args_limit
from ..core.config import Config
from ..core.graph import BACKEND, GROUP, aliased_input, live_profile, node_kind, output_nodes, storage_root
from ..core.iteration import Iteration, iteration_of, joined_iteration, kind_of
from ..lowering.cleanup import has_side_effects
from ..infra.pass_manager import PassResult
from ..core.plan import group_outputs
from .schedule import program_order, storage_sizes

MAX_LISTED = 200


@dataclass
class _Group:
    id: int
    nodes: list[fx.Node]  # members (compute nodes and the views pulled in)
    hi: int  # largest program index of a member: where the group runs
    compute: int  # compute nodes
    it: Iteration  # the loop nest its compute nodes share
    # its boundary, kept as groups merge (a merge costs its boundary, not its members):
    reads: set[fx.Node]  # nodes outside it that members read
    outputs: list[fx.Node]  # compute members used outside it or returned (``plan.group_outputs``)
    facts: Any = None  # the backend's ``fusion_facts`` for it (None: ``fusion_cost`` answers)


def view_input(v: fx.Node) -> fx.Node | None:
    """The node a view (or getitem) reads its tensor from."""
    if v.target is operator.getitem:
        return v.args[0] if isinstance(v.args[0], fx.Node) else None
    return aliased_input(v)


def fusible(n: fx.Node, backend: CodegenBackend) -> bool:
    """A fusion candidate: a pointwise op or reduction the backend runs, without side effects."""
    return BACKEND.get(n) == backend.name and not has_side_effects(n) and kind_of(n) in ("pointwise", "reduction")


class FuseGroups:
    """The fusion pass.  Holds only its backend and config: each call fuses one graph in a
    ``FusionRun`` of its own, so one instance serves any number of graphs, from any thread."""

    name = "fuse_groups"

    def __init__(self, backend: CodegenBackend, config: Config):
        self.backend = backend
        self.config = config

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        return self.run(gm).result

    def run(self, gm: fx.GraphModule) -> "FusionRun":
        """Fuse ``gm``'s groups; the run keeps what it decided (groups, order, refusals)."""
        run = FusionRun(gm, self.backend, self.config)
        if self.backend.fusion_cost is None or self.config.max_fusion_size < 2:
            run.result = PassResult(gm, False, {"fused_groups": 0, "refused_fusions": {}, "refused": []})
        else:
            run.result = run.fuse()
        return run


class FusionRun:
    """One run of the fusion pass over one graph: every piece of per-run state lives here."""

    def __init__(self, gm: fx.GraphModule, backend: CodegenBackend, config: Config):
        self.gm, self.backend, self.config = gm, backend, config
        self.args_limit = kernel_args_limit(backend, config)
        self.result: PassResult | None = None
        self._fusible: dict[fx.Node, bool] = {}  # memo of fusible()
        nodes = program_order(gm)
        self.nodes = nodes
        self.index = {n: i for i, n in enumerate(nodes)}
        self.gid: dict[fx.Node, int] = {}
        self.groups: dict[int, _Group] = {}
        for n in nodes:
            if GROUP.get(n) is not None:
                g = GROUP.of(n)
                self.gid[n] = g
                it = iteration_of([n]) if self.fusible(n) else Iteration(sympy.Integer(1))
                self.groups[g] = _Group(g, [n], self.index[n], 1, it, set(n.all_input_nodes) - {n}, [])
        self.graph_outputs = set(output_nodes(gm))
        for g in self.groups.values():
            g.outputs = group_outputs(g.nodes, self.graph_outputs)
            if backend.fusion_facts is not None and self.fusible(g.nodes[0]):
                g.facts = backend.fusion_facts(g.nodes[0])
        self.refused: dict[str, int] = {}
        self.refused_list: list[dict] = []
        self.merges = 0
        self.copied_views = 0
        self.memory = _PeakModel(gm, nodes, self)
        self.order = _Order(self)

    def fusible(self, n: fx.Node) -> bool:
        if n not in self._fusible:
            self._fusible[n] = fusible(n, self.backend)
        return self._fusible[n]

    def fuse(self) -> PassResult:
        gm, nodes = self.gm, self.nodes
        # vertical: producer into consumer
        for c in nodes:
            if not self.fusible(c):
                continue
            for a in c.all_input_nodes:
                p = self.producer_through_views(a)
                if p is not None and self.fusible(p):
                    self.try_merge(self.gid[p], self.gid[c])
        # horizontal: consumers of the same value
        for x in nodes:
            users = sorted((u for u in x.users if u in self.gid and self.fusible(u)), key=self.index.get)
            for a, b in zip(users, users[1:]):
                self.try_merge(self.gid[a], self.gid[b])

        for g in self.groups.values():
            for n in g.nodes:
                GROUP.set(n, g.id)
                BACKEND.set(n, BACKEND.get(n, self.backend.name))  # views pulled in
        if self.copied_views:
            gm.recompile()  # the graph gained view copies: its code must say so even when run by hand
        if self.config.debug:
            self.memory.check()
            problems = verify_groups(gm, self.config, self.backend)
            if problems:
                raise AssertionError("; ".join(problems))
        return PassResult(gm, self.merges > 0, {
            "fused_groups": sum(1 for g in self.groups.values() if g.compute > 1),
            "merges": self.merges,
            "refused_fusions": dict(self.refused),
            "refused": self.refused_list,
        }, recompile=False)  # metadata, and view copies (recompiled above)

    def producer_through_views(self, a: fx.Node) -> fx.Node | None:
        """The grouped node ``a`` reads from, through views and getitems (None: not grouped)."""
        while a is not None and a not in self.gid and node_kind(a) in ("view", "getitem"):
            a = view_input(a)
        return a if a is not None and a in self.gid else None

    # ------------------------------------------------------------------ one merge

    def refuse(self, reason: str, a: _Group, b: _Group, detail: str = "") -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if len(self.refused_list) < MAX_LISTED:
            self.refused_list.append({"reason": reason, "into": b.nodes[-1].name, "group": a.nodes[-1].name,
                                      "detail": detail})

    def try_merge(self, ga: int, gb: int) -> bool:
        if ga == gb:
            return False
        a, b = self.groups[ga], self.groups[gb]
        if a.hi > b.hi:
            a, b = b, a
        cfg = self.config
        if a.compute + b.compute > cfg.max_fusion_size:
            self.refuse("max_fusion_size", a, b, f"{a.compute + b.compute} > {cfg.max_fusion_size}")
            return False
        members = {*a.nodes, *b.nodes}
        views = self.views_between(members, a.reads | b.reads)
        later = self.order.must_follow(a, b, views)
        if later is None:
            self.refuse("cycle", a, b)
            return False
        nodes = sorted(a.nodes + b.nodes + [v for v, _ in views], key=self.index.get)  # (sorted runs: linear)
        it = joined_iteration(a.it, b.it)
        if it is None:
            it = iteration_of(nodes)  # the whole scan, for the refusal's detail
            if isinstance(it, str):
                self.refuse("incompatible_iteration", a, b, it)
                return False
        if views:  # (rare) the boundary anew
            outputs = group_outputs(nodes, self.graph_outputs)
        else:  # a member used only inside a or b is used only inside the merged group
            outputs = sorted((n for n in a.outputs + b.outputs
                              if n in self.graph_outputs or any(u not in members for u in n.users)), key=self.index.get)
        # the members' facts answer where both groups have them, from what the merge changes (not
        # where a view joins as a copy: the group would hold a node the facts never saw)
        facts = a.facts.merge(b.facts, set(nodes) if views else members, nodes, outputs) \
            if a.facts is not None and b.facts is not None and not any(copy for _, copy in views) else None
        if facts is not None:
            cost = facts.cost()
            if cfg.debug:
                self.check_facts(cost, nodes, outputs)
        else:
            try:
                cost = self.backend.fusion_cost(nodes, outputs, cfg)
            except Exception as e:  # a backend's check must not take the compile down
                if cfg.debug:  # ... but a bug in it must show, not pass as a refused fusion
                    raise
                cost = f"{type(e).__name__}: {e}"
        if isinstance(cost, str):
            self.refuse("backend", a, b, cost)
            return False
        if cost.unique_io_buffers > cfg.max_fusion_unique_io_buffers:
            self.refuse("max_unique_io_buffers", a, b, f"{cost.unique_io_buffers} > {cfg.max_fusion_unique_io_buffers}")
            return False
        if cost.num_args > self.args_limit:
            self.refuse("max_kernel_args", a, b, f"{cost.num_args} > {self.args_limit}")
            return False
        grown = self.memory.try_merge(a, b, members | {v for v, copy in views if not copy}, not views)
        if grown is not None:
            self.refuse("peak_memory", a, b, grown)
            return False
        # commit
        for v, clone in views:
            if clone:
                v = self.copy_view_for(v, members)
            members.add(v)
            self.gid[v] = a.id
        a.nodes = sorted(members, key=self.index.get) if views else nodes
        a.reads = ({x for n in a.nodes for x in n.all_input_nodes} if views else a.reads | b.reads) - members
        # (a copied view's original stays outside, reading a member: the boundary anew)
        a.outputs = group_outputs(a.nodes, self.graph_outputs) if views else outputs
        if facts is None and a.facts is not None and b.facts is not None:  # (the emitter answered, or a view was copied)
            facts = a.facts.regroup(a.nodes, a.outputs)
            if facts is None and type(b.facts) is not type(a.facts):  # (the same kind would only ask again)
                facts = b.facts.regroup(a.nodes, a.outputs)
        a.facts = facts
        a.hi = max(a.hi, b.hi)
        a.compute += b.compute
        a.it = it
        for n in b.nodes:
            self.gid[n] = a.id
        del self.groups[b.id]
        self.order.merged(a, b, later)
        self.merges += 1
        return True

    def check_facts(self, cost: GroupCost, nodes: list[fx.Node], outputs: list[fx.Node]) -> None:
        """Debug mode: the merged facts' cost is the backend's ``fusion_cost``."""
        want = self.backend.fusion_cost(nodes, outputs, self.config)
        if want != cost:
            raise AssertionError(f"fusion facts of {[n.name for n in nodes]} give {cost}, fusion_cost {want}")

    def views_between(self, members: set[fx.Node], reads: set[fx.Node]) -> list[tuple[fx.Node, bool]]:
        """Views (not in any group) on the way from one member to another, which join the
        group: (view, must be copied first because it also has users outside the group).
        Getitems of members stay outside (they name the member's output buffers).  ``reads``:
        the nodes the members read."""
        out: dict[fx.Node, bool] = {}
        for a in reads:
            if a in self.gid:
                continue
            chain = []
            x = a
            while x is not None and x not in self.gid and node_kind(x) == "view":
                chain.append(x)
                x = view_input(x)
            if x is not None and x not in self.gid and node_kind(x) == "getitem":
                x = view_input(x)
            if x is None or x not in members or not chain:
                continue
            inside = members | set(chain)
            copying = False
            for v in chain:  # from the consumer up to the producer
                copying = copying or any(u not in inside for u in v.users)
                out[v] = out.get(v, False) or copying
        return list(out.items())

    def copy_view_for(self, v: fx.Node, members: set[fx.Node]) -> fx.Node:
        """A private copy of view ``v`` for its users inside the group (``v`` stays for the rest)."""
        with self.gm.graph.inserting_after(v):
            c = self.gm.graph.node_copy(v)
        self.copied_views += 1
        self.index[c] = self.index[v]
        for u in list(v.users):
            if u in members:
                u.replace_input_with(v, c)
        return c



class _Order:
    """A topological order of the group graph, kept as times (program index at first): every
    edge goes from an earlier time to a later one.  A merged group runs at the later group's
    time T; a cycle would need a path out of it and back in, and on such a path every time is
    below T, so a search over earlier-than-T vertices decides it exactly.  The vertices that
    search finds must run after the merged group: they are moved just after T, in their order.
    Nodes with side effects (collectives, their waits, in-place writes) keep their program order,
    as the schedule keeps it: each is an edge to the next, so no group may need one before and
    the one before it after."""

    def __init__(self, fuser: FusionRun):
        self.f = fuser
        self.time: dict = {}
        effects = sorted((n for n in fuser.index if n.op == "call_function" and has_side_effects(n)),
                         key=fuser.index.__getitem__)
        # (by vertex: a node with side effects is never fused, so its vertex stays its own)
        self.next_effect = {self.vertex(a): self.vertex(b) for a, b in zip(effects, effects[1:])}

    def vertex(self, n: fx.Node):
        return group_vertex(n, self.f.gid)

    def time_of(self, v):
        if v not in self.time:
            self.time[v] = self.f.index[v] if not isinstance(v, tuple) else self.f.index[self.f.groups[v[1]].nodes[0]]
        return self.time[v]

    def successors(self, v) -> list:
        """Vertices using a value of ``v`` (its members' getitems are part of ``v``)."""
        # a group's values used outside it are its outputs' (and their getitems')
        stack = list(self.f.groups[v[1]].outputs) if isinstance(v, tuple) else [v]
        out = [self.next_effect[v]] if v in self.next_effect else []
        while stack:
            n = stack.pop()
            for u in n.users:
                if u.op == "output":
                    continue
                w = self.vertex(u)
                if w != v:
                    out.append(w)
                elif u.target is operator.getitem and u not in self.f.gid:
                    stack.append(u)
        return out

    def must_follow(self, a: _Group, b: _Group, views: list[tuple[fx.Node, bool]]) -> list | None:
        """The vertices that must move after the merged group, or None if merging forms a cycle."""
        va, vb = ("g", a.id), ("g", b.id)
        T = max(self.time_of(va), self.time_of(vb))
        joined = {v for v, copy in views if not copy}
        copied = {v for v, copy in views if copy}
        inside = {va, vb} | joined
        stack = [w for v in inside for w in self.successors(v) if w not in inside]
        seen: set = set()
        while stack:
            v = stack.pop()
            if v in seen or self.time_of(v) >= T:
                continue
            seen.add(v)
            for w in self.successors(v):
                if w in inside:
                    if v in copied:
                        continue  # this edge moves to the view's private copy
                    return None
                stack.append(w)
        # a view's private copy reads what the view reads (a copied view it reads: that one's
        # copy): reached from the group through one of those inputs, the copy would close a cycle
        if any(self.vertex(x) in seen for v in copied if v in seen for x in v.all_input_nodes if x not in copied):
            return None
        return sorted(seen, key=self.time_of)

    def merged(self, a: _Group, b: _Group, later: list) -> None:
        """Times once ``b``'s members (and the views that joined, and the copies) are in ``a``:
        the merged group keeps the later time T; ``later`` (``must_follow``) moves just after it."""
        va, vb = ("g", a.id), ("g", b.id)
        T = max(self.time[va], self.time[vb])  # both timed by must_follow
        self.time[va] = T
        del self.time[vb]
        if later:
            # strictly between T and the next time any successor of theirs has
            moving = set(later)
            bound = min((self.time_of(w) for v in later for w in self.successors(v) if w not in moving), default=T + 1)
            if bound <= T:
                raise AssertionError(f"fusion order broken: a vertex after group {a.id} runs at {bound} <= {T}")
            step = Fraction(min(bound, T + 1) - T) / (len(later) + 1)
            for i, v in enumerate(later):
                self.time[v] = T + step * (i + 1)


class _PeakModel:
    """Live bytes over program positions, with each group at its last node's position (values
    inside a fused group take none): checks that a merge keeps the peak within the guard."""

    def __init__(self, gm: fx.GraphModule, nodes: list[fx.Node], fuser: FusionRun):
        self.fuser = fuser
        self.fused = fuser.backend.fuses
        self.back: dict[fx.Node, int] = {}  # grouped node -> how many positions before its group's last
        self.size = storage_sizes(gm, nodes)
        self.touch: dict[fx.Node, list[fx.Node]] = {}  # storage root -> nodes reading any alias of it
        for n in nodes:
            self.touch.setdefault(storage_root(n), []).extend(n.users)
        self.escapes = {storage_root(o) for o in output_nodes(gm)}
        self.last = len(nodes) - 1
        self.spans: dict[fx.Node, tuple[int | None, int]] = {}  # each storage's span now
        ranges = []
        for r, size in self.size.items():
            s, e = self.spans[r] = self.span(r, {})
            if s is not None:
                ranges.append((s, e, size))
        self.profile = live_profile(ranges, len(nodes) + 1)
        growth = fuser.config.max_fusion_peak_growth
        self.limit = math.inf if growth == math.inf else int(self.profile.max(initial=0) * (1.0 + growth))

    def pos(self, n: fx.Node, moved: dict[fx.Node, int]) -> int:
        if n in moved:
            return moved[n]
        g = self.fuser.gid.get(n)
        return self.fuser.groups[g].hi - self.back.get(n, 0) if g is not None else self.fuser.index[n]

    def group_of(self, n: fx.Node, moved: dict[fx.Node, int]):
        return "merged" if n in moved else self.fuser.gid.get(n)

    def positions(self, members: set[fx.Node], at: int) -> dict[fx.Node, int]:
        """Where a merged group's nodes run: all at ``at`` (one fused kernel), or one after
        another ending at ``at``, none before its own program position (a backend running them
        in order; copied views share their original's position)."""
        if self.fused:
            return {n: at for n in members}
        ordered = sorted(members, key=self.fuser.index.get)
        index = self.fuser.index
        return {n: max(index[n], at - (len(ordered) - 1 - i)) for i, n in enumerate(ordered)}

    def commit(self, moved: dict[fx.Node, int], at: int, changes: list) -> None:
        if not self.fused:  # (one fused kernel: every member at its group's last position)
            for n, p in moved.items():
                self.back[n] = at - p
        for r, _, new in changes:
            self.spans[r] = new

    def span(self, r: fx.Node, moved: dict[fx.Node, int]) -> tuple[int | None, int]:
        """(start, end) of storage ``r``; start None: it never reaches memory (inside a fused group)."""
        producer = r.args[0] if r.target is operator.getitem else r
        start = self.pos(producer, moved)
        if r in self.escapes:
            return start, self.last
        home = self.group_of(producer, moved)
        inside = self.fused and home is not None  # so far every reader is in its fused kernel
        end = start
        gid, groups, index, back = self.fuser.gid, self.fuser.groups, self.fuser.index, self.back
        for u in self.touch.get(r, ()):  # (pos and group_of, inline: the fusion pass's hottest loop)
            if u.op == "output":
                continue
            if u in moved:
                g, p = "merged", moved[u]
            else:
                g = gid.get(u)
                p = index[u] if g is None else groups[g].hi - back.get(u, 0)
            inside = inside and g == home
            end = max(end, p)
        return (None, start) if inside else (start, end)

    def try_merge(self, a: _Group, b: _Group, members: set[fx.Node], bounded: bool) -> str | None:
        """Apply the merge to the profile; None if within the limit, else undo and say why.
        ``bounded``: the groups' ``reads`` and ``outputs`` are their whole boundary (no view
        joins them)."""
        at = max(a.hi, b.hi)
        moved = self.positions(members, at)
        # a storage's span moves only with the position of its producer or of a reader, or (one
        # fused kernel) with which group its producer and readers belong to.  In one fused
        # kernel only the earlier group ``a``'s members move (``b``'s run at ``at`` already:
        # ``FusionRun.try_merge`` orders them), and a storage can only start to stay inside the
        # kernel if ``a`` stores it (``b``'s values are not read by ``a``): the storages ``a``
        # reads from outside or stores
        changes = []
        if self.fused and bounded:
            roots = {storage_root(x) for n in a.outputs for x in (n, *(u for u in n.users if u.target is operator.getitem))}
            # a storage ``a`` reads whose producer is in neither group keeps its start, and only
            # ``a``'s readers move (to ``at``): its end is the later of the two, no reader asked
            for r in {storage_root(x) for x in a.reads} - roots:
                if r not in self.size:
                    continue
                if (r.args[0] if r.target is operator.getitem else r) in moved:
                    roots.add(r)
                    continue
                old = self.spans[r]
                if old[1] < at:
                    changes.append((r, old, (old[0], at)))
        else:
            changed = members if self.fused else [n for n in members if self.pos(n, {}) != moved[n]]
            roots = {storage_root(x) for n in changed
                     for x in (n, *n.all_input_nodes, *(u for u in n.users if u.target is operator.getitem))}
        for r in roots:
            if r not in self.size:
                continue
            old = self.spans[r]
            new = self.span(r, moved)
            if old != new:
                changes.append((r, old, new))
        grown = [g for _, old, new in changes for g in _grown(old, new)]
        if changes:
            self.shift(changes, 1)
        if not grown:  # (no position gained bytes: the peak cannot have risen)
            self.commit(moved, at, changes)
            return None
        lo, hi = min(s for s, _ in grown), max(e for _, e in grown)
        peak = int(self.profile[lo:hi + 1].max())  # (elsewhere it is what a merge kept within the limit)
        if peak <= self.limit:
            self.commit(moved, at, changes)
            return None
        self.shift(changes, -1)
        return f"{peak} live bytes > {self.limit} allowed"

    def check(self) -> None:
        """Debug mode: the profile kept merge by merge is the one the final groups give."""
        ranges = []
        for r, size in self.size.items():
            span = self.span(r, {})
            if span != self.spans[r] and (span[0], self.spans[r][0]) != (None, None):  # (inside a kernel: no span)
                raise AssertionError(f"fusion's peak model: storage {r.name} spans {self.spans[r]}, recomputed {span}")
            if span[0] is not None:
                ranges.append((*span, size))
        if not np.array_equal(live_profile(ranges, len(self.profile)), self.profile):
            raise AssertionError("fusion's peak model: the live-bytes profile differs from its recomputation")

    def shift(self, changes: list, sign: int) -> None:
        """Move each changed storage from its old span to its new one (sign -1: back), all at
        once: the spans' ends as steps of a difference array over the positions they cover,
        summed (where an old and a new span overlap, their steps cancel)."""
        steps: dict[int, int] = {}
        for r, (s1, e1), (s2, e2) in changes:
            k = sign * self.size[r]
            for s, e, v in ((s1, e1, -k), (s2, e2, k)):
                if s is not None:
                    steps[s] = steps.get(s, 0) + v
                    steps[e + 1] = steps.get(e + 1, 0) - v
        steps = {p: v for p, v in steps.items() if v}  # (a span's end moved: its unchanged start cancels)
        if not steps:
            return
        lo, hi = min(steps), max(steps)  # (hi: one past the last position a span covers)
        d = np.zeros(hi - lo, dtype=np.int64)
        for p, v in steps.items():
            if p < hi:
                d[p - lo] = v
        self.profile[lo:hi] += np.cumsum(d)


def _grown(old: tuple[int | None, int], new: tuple[int | None, int]) -> list[tuple[int, int]]:
    """The positions a storage's ``new`` span covers and its ``old`` one did not, as inclusive
    ranges (a start None: no span)."""
    (s1, e1), (s2, e2) = old, new
    if s2 is None:
        return []
    if s1 is None or e2 < s1 or s2 > e1:
        return [(s2, e2)]
    return [r for r in ((s2, s1 - 1), (e1 + 1, e2)) if r[0] <= r[1]]


# --------------------------------------------------------------------------- verification


def group_vertex(n: fx.Node, gid: dict[fx.Node, int]):
    """``("g", id)`` for a node of a group, else the node itself.  A getitem of a grouped node
    rides with its group (it names one of the group's outputs; the schedule keeps it there)."""
    g = gid.get(n)
    if g is None and n.target is operator.getitem and node_kind(n) == "getitem":
        g = gid.get(n.args[0])
    return ("g", g) if g is not None else n


def group_graph(gm: fx.GraphModule):
    """Kernel groups (and ungrouped nodes) as a ``networkx.DiGraph``: an edge wherever one's value
    feeds another."""
    import networkx as nx  # only checks use it: not loaded by import fxforge

    g = nx.DiGraph()
    gid = {n: GROUP.of(n) for n in gm.graph.nodes if GROUP.get(n) is not None}
    vertex = {n: group_vertex(n, gid) for n in gm.graph.nodes}
    for n in gm.graph.nodes:
        g.add_node(vertex[n])
        for u in n.users:
            if vertex[u] != vertex[n]:
                g.add_edge(vertex[n], vertex[u])
    return g


def verify_groups(gm: fx.GraphModule, config: Config, backend: CodegenBackend | None = None) -> list[str]:
    """What is wrong with the graph's kernel groups (empty: nothing): a cycle between groups, a
    group over ``max_fusion_size``, or (given the backend) over the io-buffer or argument limit."""
    problems = []
    import networkx as nx

    if not nx.is_directed_acyclic_graph(group_graph(gm)):
        problems.append("the kernel groups form a cycle")
    groups: dict[int, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        if GROUP.get(n) is not None:
            groups.setdefault(GROUP.of(n), []).append(n)
    outs = set(output_nodes(gm))
    for gid, nodes in groups.items():
        compute = sum(1 for n in nodes if node_kind(n) == "compute")
        if compute > config.max_fusion_size:
            problems.append(f"group {gid}: {compute} nodes > max_fusion_size={config.max_fusion_size}")
        if backend is None or backend.fusion_cost is None or len(nodes) < 2:
            continue
        cost = backend.fusion_cost(nodes, group_outputs(nodes, outs), config)
        if isinstance(cost, str):
            problems.append(f"group {gid}: {backend.name} cannot emit it: {cost}")
            continue
        if cost.unique_io_buffers > config.max_fusion_unique_io_buffers:
            problems.append(f"group {gid}: {cost.unique_io_buffers} io buffers > {config.max_fusion_unique_io_buffers}")
        limit = kernel_args_limit(backend, config)
        if cost.num_args > limit:
            problems.append(f"group {gid}: {cost.num_args} kernel args > {limit}")
    return problems
