"""What a group's kernel needs, from its members' facts, without building the kernel.

The fusion pass asks a backend for the cost of every candidate merge (``fusion_cost``): a chain
growing one node at a time would have the emitter build kernels for groups of 2, 3, ... 64 nodes.
For a group of static pointwise nodes and reductions the emitter's answer follows from facts of
its members, in O(the group's nodes and their reads) (``group_cost``):

* whether it is one kernel: the rules of its loop nest (``rows.py``, which the emitter builds
  by), and the language's own (C: ``schedule.frame_refusal``, which its emitter raises).  Every
  member was accepted alone: its op, dtypes and printing are the same inside a group, where its
  operands are values instead of loads;
* its launch arguments: one pointer per tensor its members read from outside (``aten.read_nodes``;
  each node outside the group one tensor), one per tensor it stores, and one per runtime scalar
  read; its io buffers, the tensors read and stored.

Groups with symbolic sizes are the emitter's to answer (``checked_cost``).  In debug mode
``checked_cost`` asks the emitter about every group and raises where the two disagree, and the
wrapper checks every fused group's cost against the kernel emitted for it
(``Wrapper.check_cost``).

A backend's ``fusion_facts`` lets the fusion pass keep each group's facts and merge them with
the groups, so that a merge costs what it changes, not the whole group.  Static pointwise
groups: each node's facts are found once per graph (``pointwise_facts``, kept with the probes'
summaries in the graph module's meta while a ``PassManager`` runs), and a merge costs the
groups' reads (``PointwiseFacts``).  Groups with reductions (``node_facts``: a language's facts
of any static node): what ``group_cost`` found of the group is kept (``GroupFacts``), and a
merge checks again only the joining pointwise members, the reads one group makes of the other
and the members no longer stored; where that cannot decide, the group is evaluated whole.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from ...core.graph import PROBES, VAL, aliased_input, free_symbols, node_kind, per_node, tensors
from ...core.iteration import kind_of, node_shape, reduction_of
from ..api import GroupCost
from .aten import read_nodes
from .rows import Frame, check_operand, check_view, domain, frame_of, internal, root
from .values import Domain, Unsupported


@dataclass(frozen=True)
class PointwiseFacts:
    """A group of static pointwise nodes with one element count: the tensors and scalars its
    members read from outside it, and how many outputs it stores.  ``merge`` combines two
    groups' facts in O(their reads)."""

    numel: int
    tensors: frozenset[fx.Node]
    scalars: frozenset[fx.Node]
    stored: int = 1
    size: int = 1  # members

    def merge(self, other, members: set[fx.Node], nodes: list[fx.Node], outputs: list[fx.Node]):
        """The facts of the two groups as one (``members``: all its nodes, views joining it
        included, ``nodes`` the same in program order, ``outputs`` those used outside it), or
        None: the emitter must answer (their element counts differ, or views join them).  With a
        group of reductions: ``GroupFacts.merge``."""
        if isinstance(other, GroupFacts):
            return other.merge(self, members, nodes, outputs)
        if not isinstance(other, PointwiseFacts) or other.numel != self.numel or len(nodes) != self.size + other.size:
            return None
        return PointwiseFacts(self.numel, frozenset(x for x in self.tensors | other.tensors if x not in members),
                              frozenset(x for x in self.scalars | other.scalars if x not in members),
                              len(outputs) or len(nodes), len(nodes))

    def cost(self) -> GroupCost:
        """The kernel's launch arguments and io buffers: a pointer per tensor read and per output,
        one per runtime scalar."""
        return GroupCost(num_args=len(self.tensors) + self.stored + len(self.scalars),
                         unique_io_buffers=len(self.tensors) + self.stored)

    def regroup(self, nodes: list[fx.Node], outputs: list[fx.Node]) -> None:
        """None: the facts of a group with views are ``GroupFacts``, which know the language."""
        return None


@dataclass(frozen=True)
class Refused:
    """A merge the facts refuse: ``cost()`` is why (``fusion_cost``'s answer, word for word)."""

    reason: str

    def cost(self) -> str:
        return self.reason


@dataclass(frozen=True)
class GroupFacts:
    """A group of static pointwise nodes and reductions (``_evaluate``'s findings) for a
    language (``refusal``: its own rules, as ``group_cost`` takes them).

    ``merge`` with another group re-checks what their boundary changes: a pointwise group's
    members in this frame (their domains and reads), the reads of either group that the other
    now computes, and whether members stored before are still needed by the kernel; a merge it
    cannot decide so (two groups of reductions whose rows are laid out differently, a refusal,
    a value nothing needs) is evaluated whole, as ``group_cost`` does."""

    group: _Group
    language: str
    refusal: Callable[..., str | None] | None

    def cost(self) -> GroupCost:
        return self.group.cost

    def regroup(self, nodes: list[fx.Node], outputs: list[fx.Node]) -> "GroupFacts | None":
        """The facts of the group of ``nodes`` in this language, evaluated whole (None: it has
        none: the emitter answers for it)."""
        g = _evaluate(nodes, outputs, self.refusal)
        return GroupFacts(g, self.language, self.refusal) if isinstance(g, _Group) else None

    def merge(self, other, members: set[fx.Node], nodes: list[fx.Node], outputs: list[fx.Node]):
        """``PointwiseFacts.merge``'s contract; a refused merge gives ``Refused``."""
        if not isinstance(other, (GroupFacts, PointwiseFacts)):
            return None
        g = _merged(self.group, other.group if isinstance(other, GroupFacts) else None, members, nodes, outputs,
                    self.refusal)
        if g is None:
            g = _evaluate(nodes, outputs, self.refusal)
        if isinstance(g, str):
            return Refused(f"{self.language}: {g}")
        return None if g is None else GroupFacts(g, self.language, self.refusal)


def node_facts(n: fx.Node, language: str, refusal: Callable[..., str | None] | None):
    """The facts of ``n`` alone for a language (a backend's ``fusion_facts``): ``PointwiseFacts``
    of a static pointwise node, ``GroupFacts`` of a static reduction, else None.  Memoized per
    graph (module docstring)."""
    facts = pointwise_facts(n)
    if facts is not None or _member_kind(n) != "reduction":
        return facts
    gm = n.graph.owning_module
    memo = PROBES.get(gm) if gm is not None else None
    key = ("row facts", n, language)
    if memo is None or key not in memo:
        g = _evaluate([n], [n], refusal)
        facts = GroupFacts(g, language, refusal) if isinstance(g, _Group) else None
        if memo is None:
            return facts
        memo[key] = facts
    return memo[key]


def pointwise_facts(n: fx.Node) -> PointwiseFacts | None:
    """The facts of ``n`` alone, or None: not a static pointwise node (a backend's
    ``fusion_facts``).  Memoized per graph (module docstring)."""
    gm = n.graph.owning_module
    memo = PROBES.get(gm) if gm is not None else None
    if memo is None:  # not while a PassManager runs
        return _facts(n)
    key = ("facts", n)
    if key not in memo:
        memo[key] = _facts(n)
    return memo[key]


def _facts(n: fx.Node) -> PointwiseFacts | None:
    v = n.meta.get(VAL)
    if node_kind(n) != "compute" or not isinstance(v, torch.Tensor) or kind_of(n) != "pointwise" or free_symbols(v):
        return None
    read = read_nodes(n)
    if read is None:
        return None
    read = [a for a in read if a is not n]
    tensors = frozenset(a for a in read if isinstance(a.meta.get(VAL), torch.Tensor))
    return PointwiseFacts(v.numel(), tensors, frozenset(read) - tensors)


def group_cost(nodes: list[fx.Node], outputs: list[fx.Node] | None,
               refusal: Callable[..., str | None] | None = None) -> GroupCost | str | None:
    """The cost of a group of static pointwise nodes and reductions, with the views between them
    (``outputs``: those used outside; None or empty: every computed member), why its kernel
    cannot be emitted (a str), or None: the emitter must answer (symbolic sizes, another kind of
    node).

    The group is checked against the rules its kernel's frame keeps (``rows.py``: the rows every
    reduction shares, each member's domain, each operand read in its reader's domain, each view
    of a computed value keeping its elements) and the language's own (``refusal(frame,
    reductions, nodes, dom)``: C's ``frame_refusal``), which the emitter raises as it builds the
    kernel; every member was accepted alone, so its op, dtypes and printing hold inside the
    group, where its operands are values instead of loads.  Its launch arguments are then a
    pointer per tensor read from outside (a member view of one reads the tensor it views) and
    per tensor stored, and one per runtime scalar read.  O(the group's nodes and their reads):
    no kernel is built."""
    answer = _evaluate(nodes, outputs, refusal)
    return answer.cost if isinstance(answer, _Group) else answer


@dataclass(frozen=True)
class _Group:
    """What ``_evaluate`` found of a group it accepts: its cost, and what a merge with another
    group re-checks only at their boundary (``GroupFacts``)."""

    cost: GroupCost
    members: frozenset[fx.Node]
    computed: frozenset[fx.Node]
    reductions: tuple[fx.Node, ...]  # in program order
    frame: Frame
    doms: dict[fx.Node, Domain]  # every computed member's, and others asked (not changed once made)
    scalars: frozenset[fx.Node]
    reads: dict[fx.Node, tuple[_Read, ...]]  # each tensor read from outside: the reads reaching it
    stored: tuple[fx.Node, ...]


@dataclass(frozen=True)
class _Read:
    """Member ``reader`` reads ``node`` as a value of ``shape`` in domain ``want``."""

    reader: fx.Node
    node: fx.Node
    shape: tuple
    want: Domain


def _evaluate(nodes: list[fx.Node], outputs: list[fx.Node] | None,
              refusal: Callable[..., str | None] | None) -> _Group | str | None:
    """``group_cost``'s answer, with what it found where it accepts the group (``_Group``)."""
    sorted_members = _computed_members(nodes)
    if sorted_members is None:
        return None
    computed, reductions = sorted_members
    members = set(nodes)
    is_computed = set(computed)
    stored = [n for n in outputs if n in is_computed] if outputs else computed
    try:
        fr = frame_of(nodes, reductions)
        doms: dict[fx.Node, Domain] = {}

        def dom(n: fx.Node) -> Domain:
            if n not in doms:
                doms[n] = domain(fr, n, reductions)
            return doms[n]

        if fr.reduction and not _all_computed(members, computed, stored, reductions, dom):
            return None  # a value per element nothing stored needs: whether it is computed is the language's
        operands = _operands(fr, members, computed, reductions, dom)
        if operands is None:
            return None
        scalars, reads = operands
        why = refusal(fr, reductions, nodes, dom) if refusal is not None else None
    except Unsupported as e:
        return str(e)
    if why is not None:
        return why
    return _Group(_cost(reads, scalars, stored), frozenset(members), frozenset(computed), tuple(reductions), fr,
                  doms, frozenset(scalars), reads, tuple(stored))


def _cost(read_from_outside, scalars, stored) -> GroupCost:
    n_stored = sum(len(tensors(n.meta[VAL])) for n in stored)
    return GroupCost(num_args=len(read_from_outside) + n_stored + len(scalars),
                     unique_io_buffers=len(read_from_outside) + n_stored)


def _computed_members(nodes: list[fx.Node]) -> tuple[list[fx.Node], list[fx.Node]] | None:
    """The group's computed members and its reductions among them; None where a member is not a
    static pointwise node, reduction or view."""
    computed, reductions = [], []
    for n in nodes:
        kind = _member_kind(n)
        if kind is None:
            return None
        if kind == "view":
            continue
        computed.append(n)
        if kind == "reduction":
            reductions.append(n)
    return computed, reductions


@per_node
def _static(n: fx.Node) -> bool:
    """The node's value has no symbolic size, stride or offset (kept: ``per_node``)."""
    return not free_symbols(n.meta.get(VAL))


@per_node
def _member_kind(n: fx.Node) -> str | None:
    """"view", "pointwise" or "reduction" for a group member of static sizes the facts answer
    for, else None (kept: ``per_node``, asked of each member at every candidate merge)."""
    k = node_kind(n)
    if k not in ("compute", "view") or not _static(n):
        return None
    if k == "view":
        return k
    kind = kind_of(n)
    return kind if kind in ("reduction", "pointwise") else None


def _operands(fr: Frame, members: set[fx.Node], computed: list[fx.Node], reductions: list[fx.Node],
              dom: Callable[[fx.Node], Domain]) -> tuple[set[fx.Node], dict[fx.Node, tuple[_Read, ...]]] | None:
    """Every operand of the computed members checked in its reader's domain (and each member view
    on the way to it): the runtime scalars read, and each tensor read from outside with the
    reads reaching it; None where a read's sizes are symbolic (the emitter answers); raises
    ``Unsupported``."""
    scalars: set[fx.Node] = set()
    reads: dict[fx.Node, list[_Read]] = {}
    viewed: set[fx.Node] = set()
    for n in computed:
        found = _reads_of(n, reductions, dom)
        if found is None:
            return None
        scalars.update(found[0])
        for r in found[1]:
            outside = _check_read(fr, members, r, dom, viewed)
            if outside is False:
                return None
            if outside is not None:
                reads.setdefault(outside, []).append(r)
    return scalars, {k: tuple(v) for k, v in reads.items()}


def _reads_of(n: fx.Node, reductions, dom) -> tuple[list[fx.Node], list[_Read]] | None:
    """What computed member ``n`` reads: the runtime scalars, and the tensors (each in the shape
    and domain ``n`` reads it); None where ``n`` has no semantics here.  Raises ``Unsupported``
    where ``n`` has no domain in the frame."""
    if n in reductions:
        r = reduction_of(n)
        shape, want, read = node_shape(r.inp), Domain.ELEMENT, [r.inp]
    else:
        shape, want, read = node_shape(n), dom(n), read_nodes(n)
        if read is None:
            return None
    scalars, tensor_reads = [], []
    for a in read:
        if a is not n:
            if isinstance(a.meta.get(VAL), torch.Tensor):
                tensor_reads.append(_Read(n, a, shape, want))
            else:
                scalars.append(a)
    return scalars, tensor_reads


def _check_read(fr: Frame, members: set[fx.Node], r: _Read, dom, viewed: set[fx.Node]) -> fx.Node | None | bool:
    """Check a tensor read ``r`` of a group: None where the kernel computes the value read (checked
    in the reader's domain, and each member view on the way), the tensor outside it is read from,
    or False: its sizes are symbolic (the emitter answers).  Raises ``Unsupported``."""
    a = r.node
    if internal(members, a):
        v = a
        while v in members and node_kind(v) == "view" and v not in viewed:
            viewed.add(v)
            check_view(fr, v, dom)
            v = aliased_input(v)
        check_operand(fr, a, dom(a), r.shape, r.want)
        return None
    # read from memory: the tensor outside that it is, or that a member view views
    outside = root(members, a)
    rval = outside.meta.get(VAL)
    if not isinstance(rval, torch.Tensor) or rval.dtype != a.meta[VAL].dtype:
        raise Unsupported(f"{a.name}: a view changing the dtype inside the kernel")
    if not _static(outside) or not _static(a):  # its sizes become the kernel's parameters
        return False
    return outside


def _all_computed(members: set[fx.Node], computed: list[fx.Node], stored: list[fx.Node], reductions: list[fx.Node],
                  dom: Callable[[fx.Node], Domain]) -> bool:
    """Every computed member is needed by the kernel: stored, a reduction or a row value (each
    computed once per row), or read, through member views, by a member that is.  A kernel computes
    a value per element only where something needs it (some languages all of them, when the rows
    are folded without a loop): the facts do not say which."""
    needed: set[fx.Node] = set()
    roots = set(stored) | set(reductions)
    stack = [n for n in computed if n in roots or dom(n) == Domain.ROW]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        read = read_nodes(n)  # a fill reads its operand's shape only
        for a in n.all_input_nodes if read is None else read:
            a = root(members, a)
            if a.target is operator.getitem and a.args[0] in members:
                a = a.args[0]
            if a in members and node_kind(a) == "compute":
                stack.append(a)
    return len(needed) == len(computed)


class _Bail(Exception):
    """The boundary alone cannot decide the merge (``_merged``)."""


def _merged(g: _Group, og: _Group | None, members: set[fx.Node], nodes: list[fx.Node], outputs: list[fx.Node],
            refusal: Callable[..., str | None] | None) -> _Group | None:
    """``_evaluate`` of the group of ``g`` and another (``og``: its findings, None: a pointwise
    group, its members those of ``nodes`` not in ``g``), asking again only what the merge
    changes; None where it must be evaluated whole (see ``GroupFacts``).

    What holds: both frames have the same rows (a second group of reductions must lay its rows
    out as ``g`` does), so every member keeps its domain, each read the kernel computed keeps its
    check, and each read from memory of a tensor that stays outside keeps its tensor.  A
    computed member is needed by the kernel (``_all_computed``) when it is stored, a reduction,
    a row value or read by value by another computed member (each one needed in turn, down to
    the last); only members no longer stored, and the pointwise group's, can have changed."""
    joined = _joined(g, og, members, nodes)
    if joined is None:
        return None
    added, reductions, fr, doms, computed, joining = joined

    def dom(n: fx.Node) -> Domain:
        if n not in doms:
            doms[n] = domain(fr, n, reductions)
        return doms[n]

    reads = dict(g.reads)
    viewed: set[fx.Node] = set()

    def read(r: _Read) -> None:
        outside = _check_read(fr, members, r, dom, viewed)
        if outside is False:
            raise _Bail
        if outside is not None:
            reads[outside] = reads.get(outside, ()) + (r,)

    try:
        if any(_member_kind(n) != "pointwise" for n in added):
            return None
        for n in added:
            dom(n)
        stored = tuple(n for n in outputs if n in computed) if outputs else tuple(computed)
        kept = set(stored)
        again = [n for n in g.stored + (og.stored if og is not None else ()) if n not in kept] + list(added)
        red = set(reductions)
        if not all(_needed_alone(n, members, kept, red, dom) for n in again):
            return None
        # reads of g's that the kernel computes now (or reads through the other's views): of a
        # joining member, or of a getitem of one (getitems of members stay outside the group)
        for t in joining:
            for u in (t, *(u for u in t.users if u.target is operator.getitem)):
                for r in reads.pop(u, ()):
                    read(r)
        scalars = g.scalars
        if og is not None:
            scalars |= og.scalars
            for t, rs in og.reads.items():
                if t in g.members or (t.target is operator.getitem and t.args[0] in g.members):
                    for r in rs:
                        read(r)
                else:
                    reads[t] = reads.get(t, ()) + rs
        for n in added:
            found = _reads_of(n, reductions, dom)
            if found is None:
                return None
            scalars |= frozenset(found[0])
            for r in found[1]:
                read(r)
        if scalars & members:
            return None
        if refusal is not None and refusal(fr, list(reductions), nodes, dom) is not None:
            return None
    except (Unsupported, _Bail):
        return None
    return _Group(_cost(reads, scalars, stored), frozenset(members), frozenset(computed), tuple(reductions), fr,
                  doms, frozenset(scalars), reads, stored)


def _joined(g: _Group, og: _Group | None, members: set[fx.Node], nodes: list[fx.Node]):
    """The merged group's frame as ``_merged`` starts from: (the pointwise group's members,
    the reductions in program order, the frame, the domains known, the computed members, the
    nodes ``g`` gains), or None: the boundary cannot decide (see ``_merged``)."""
    if not g.reductions:
        return None  # (a pointwise group with views: evaluated whole)
    if og is None:
        added = members - g.members
        return added, g.reductions, g.frame, dict(g.doms), g.computed | added, added
    if og.frame.layouts != g.frame.layouts or len(members) != len(g.members) + len(og.members):
        return None  # (rows laid out otherwise, or views joining the two)
    red = set(g.reductions) | set(og.reductions)
    reductions = tuple(n for n in nodes if n in red)
    fr = g.frame if reductions[0] in g.members else og.frame
    return (), reductions, fr, {**g.doms, **og.doms}, g.computed | og.computed, og.members


def _needed_alone(m: fx.Node, members: set[fx.Node], stored: set[fx.Node], reductions: set[fx.Node],
                  dom: Callable[[fx.Node], Domain]) -> bool:
    """Computed member ``m`` is stored, a reduction, a row value, or a computed member reads its
    value (itself, a getitem of it, or a member view of either: what ``_all_computed`` follows)."""
    if m in stored or m in reductions or dom(m) == Domain.ROW:
        return True
    stack, seen = [m], {m}
    while stack:
        x = stack.pop()
        for u in x.users:
            if u in seen:
                continue
            kind = node_kind(u) if u in members else None
            if kind == "compute":
                read = read_nodes(u)
                if x in (u.all_input_nodes if read is None else read):
                    return True
            elif (kind == "view" and aliased_input(u) is x) or (x is m and u.target is operator.getitem):
                seen.add(u)
                stack.append(u)
    return False


def checked_cost(nodes: list[fx.Node], outputs: list[fx.Node] | None, config, language: str,
                 refusal: Callable[..., str | None] | None, probe: Callable[[], GroupCost]) -> GroupCost | str:
    """A backend's ``fusion_cost``: ``group_cost`` where the facts decide, else ``probe()`` (the
    emitter run on the group; raises where it refuses).  In debug mode both answer and must
    agree: on refusing, and on the cost."""
    cost = group_cost(nodes, outputs, refusal)
    if isinstance(cost, str):
        cost = f"{language}: {cost}"
    if cost is None or config.debug:
        try:
            want = probe()
        except (Unsupported, NotImplementedError) as e:
            want = f"{language}: {e}"
        if cost is None:
            return want
        if isinstance(cost, str) != isinstance(want, str) or (not isinstance(cost, str) and cost != want):
            raise AssertionError(f"fusion facts of {[n.name for n in nodes]} give {cost!r}, the emitter {want!r}")
    return cost
