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

Static pointwise groups go further: each node's facts are found once per graph
(``pointwise_facts``, kept with the probes' summaries in the graph module's meta while a
``PassManager`` runs).  A backend offering ``pointwise_facts`` as its ``fusion_facts`` lets the
fusion pass keep each group's facts (``PointwiseFacts``) and merge them with the groups: a merge
then costs its groups' reads, not their members.
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
    members read from outside it.  ``merge`` combines two groups' facts in O(their reads)."""

    numel: int
    tensors: frozenset[fx.Node]
    scalars: frozenset[fx.Node]

    def merge(self, other: "PointwiseFacts", members: set[fx.Node]) -> "PointwiseFacts | None":
        """The facts of the two groups as one (``members``: all its nodes), or None: their
        element counts differ, the emitter must answer."""
        if other.numel != self.numel:
            return None
        return PointwiseFacts(self.numel, frozenset(x for x in self.tensors | other.tensors if x not in members),
                              frozenset(x for x in self.scalars | other.scalars if x not in members))

    def cost(self, stored: int) -> GroupCost:
        """The kernel's launch arguments and io buffers, storing ``stored`` outputs: a pointer per
        tensor read and per output, one per runtime scalar."""
        return GroupCost(num_args=len(self.tensors) + stored + len(self.scalars),
                         unique_io_buffers=len(self.tensors) + stored)


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
        tensors_read, scalars = operands
        why = refusal(fr, reductions, nodes, dom) if refusal is not None else None
    except Unsupported as e:
        return str(e)
    if why is not None:
        return why
    n_stored = sum(len(tensors(n.meta[VAL])) for n in stored)
    return GroupCost(num_args=len(tensors_read) + n_stored + len(scalars),
                     unique_io_buffers=len(tensors_read) + n_stored)


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
              dom: Callable[[fx.Node], Domain]) -> tuple[set[fx.Node], set[fx.Node]] | None:
    """Every operand of the computed members checked in its reader's domain (and each member view
    on the way to it): the tensors read from outside and the runtime scalars read; None where a
    read's sizes are symbolic (the emitter answers); raises ``Unsupported``."""
    tensors_read: set[fx.Node] = set()
    scalars: set[fx.Node] = set()
    viewed: set[fx.Node] = set()
    for n in computed:
        if n in reductions:
            r = reduction_of(n)
            shape, want, read = node_shape(r.inp), Domain.ELEMENT, [r.inp]
        else:
            shape, want, read = node_shape(n), dom(n), read_nodes(n)
            if read is None:
                return None
        for a in read:
            if a is n:
                continue
            val = a.meta.get(VAL)
            if not isinstance(val, torch.Tensor):
                scalars.add(a)
            elif internal(members, a):
                v = a
                while v in members and node_kind(v) == "view" and v not in viewed:
                    viewed.add(v)
                    check_view(fr, v, dom)
                    v = aliased_input(v)
                check_operand(fr, a, dom(a), shape, want)
            else:  # read from memory: the tensor outside that it is, or that a member view views
                outside = root(members, a)
                rval = outside.meta.get(VAL)
                if not isinstance(rval, torch.Tensor) or rval.dtype != val.dtype:
                    raise Unsupported(f"{a.name}: a view changing the dtype inside the kernel")
                if not _static(outside) or not _static(a):  # its sizes become the kernel's parameters
                    return None
                tensors_read.add(outside)
    return tensors_read, scalars


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
