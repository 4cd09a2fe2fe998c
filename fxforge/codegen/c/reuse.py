"""A wrapper's C kernels emitted once per group structure.

A model of repeated blocks (a GPT's layers, its backward's) fuses into the same groups, up to
names, once per block: the emitter would walk each of them and print the same C function again
(``c_function`` names it by its text, so it is compiled once either way).  ``Emitted`` keeps,
for each kernel it emitted, the group's key: ``probes.structure`` (every member's op,
arguments and traced value, the values read from outside, the outputs), the planned layout of
every value read or stored, which of the wrapper variables it may be handed are the same one,
and the threads it is built for.  That is everything the emitter reads of a group but names.
A group with the key of an earlier one gets that kernel, its launch arguments, the names in its
launch source's head and its own launch function name swapped in by position.

Kept only where the launch source is names and the call (no prologue: sizes read at launch,
checks) and every launch argument is one of the group's values read or buffers stored.  In
debug mode every reused kernel is checked against the emitter's own for the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from ...core.graph import VAL, node_kind
from ..api import KernelContext
from ..ir.lowering import Param
from ..probes import outside_of, structure
from .abi import CEmitted, launch_source
from .kernel import CEmitter, launch_head


@dataclass(frozen=True)
class _Kept:
    kernel: CEmitted
    args: tuple[int, ...]  # each launch argument: its position among the group's names (``_names``)
    launches: tuple[int, ...]  # each parameter's launch expression, the same way
    values: tuple[tuple[str, int], ...]  # (value local, the member it holds, by position)
    reduction: bool


class Emitted:
    """One wrapper's C kernels by group key (module docstring)."""

    def __init__(self, debug: bool = False):
        self.debug = debug
        self.kept: dict[tuple, _Kept | None] = {}  # None: that structure's kernel is not kept
        # each group's structure (its members and outputs, in order), found ahead of the plan:
        # the plan's groups are the same nodes, which nothing changes in between
        self.structures: dict[tuple, tuple] = {}

    def structure(self, nodes: list[fx.Node], outputs: list[fx.Node] | None) -> tuple:
        """``probes.structure`` of a group, computed once per group."""
        group = (tuple(nodes), tuple(outputs or ()))
        found = self.structures.get(group)
        if found is None:
            found = self.structures[group] = structure(nodes, outputs)
        return found

    def emit(self, nodes: list[fx.Node], outputs: list[fx.Node] | None, ctx: KernelContext, threads: int,
             make: Callable[[], CEmitter]) -> CEmitted:
        """The kernel of group ``nodes`` named ``ctx.name``: an earlier group's of the same key
        renamed, else ``make()``'s emitter run (and kept where it can be)."""
        names, key = self._key(nodes, outputs, ctx, threads)
        kept = self.kept.get(key) if key is not None else None
        if kept is None:
            return self._emitted(make, nodes, names, key)
        k = _renamed(kept, ctx.name, nodes, names)
        if self.debug:
            want = make().emit()
            if k != want:
                raise AssertionError(f"the C kernel reused for {[n.name for n in nodes]} differs from the "
                                     f"emitter's:\n{k}\n{want}")
        return k

    def ahead(self, nodes: list[fx.Node], outputs: list[fx.Node] | None, ctx: KernelContext, threads: int,
              make: Callable[[], CEmitter]) -> CEmitted | None:
        """The kernel of group ``nodes`` emitted ahead of the plan (``backend.kernels_ahead``:
        ``ctx`` what the plan is expected to give) and kept for the group ``emit`` is later asked
        for under that key; None where it could not be kept (``emit`` would emit it again), or
        where a kernel of its key was kept already."""
        names, key = self._key(nodes, outputs, ctx, threads)
        if key is None or key in self.kept:
            return None
        k = self._emitted(make, nodes, names, key)
        return k if self.kept[key] is not None else None

    def _key(self, nodes: list[fx.Node], outputs: list[fx.Node] | None, ctx: KernelContext,
             threads: int) -> tuple[list[str] | None, tuple | None]:
        """The wrapper variables the group's kernel may be handed (``_names``) and its key; None
        and None where its sizes are symbolic."""
        names = _names(nodes, ctx)
        if names is None:
            return None, None
        return names[0], (self.structure(nodes, outputs), names[1], threads)

    def _emitted(self, make: Callable[[], CEmitter], nodes: list[fx.Node], names: list[str] | None,
                 key: tuple | None) -> CEmitted:
        """``make()``'s emitter run, its kernel kept under ``key`` unless one is already."""
        e = make()
        k = e.emit()
        if key is not None and key not in self.kept:
            self.kept[key] = _keep(e, k, nodes, names)
        return k


def _names(nodes: list[fx.Node], ctx: KernelContext) -> tuple[list[str], tuple] | None:
    """The wrapper variables a group's kernel may be handed (each value read from outside, then
    each buffer a member stores) and the part of the key they give: which of them are one
    variable, and every one's planned layout.  None: a group whose sizes are symbolic (its
    launch reads them)."""
    names: list[str] = []
    layouts: list = []
    for a in outside_of(nodes):
        names.append(ctx.ref(a))
        v = a.meta.get(VAL)
        layouts.append(ctx.layout(a, None) if isinstance(v, torch.Tensor) and ctx.layout is not None else None)
    for n in nodes:
        if node_kind(n) != "compute":
            continue
        v = n.meta.get(VAL)
        for i in ([None] if isinstance(v, torch.Tensor) else range(len(v or ()))):
            try:
                names.append(ctx.buffer(n, i))
            except KeyError:  # a value the kernel keeps to itself
                names.append("")
            layouts.append(ctx.layout(n, i) if ctx.layout is not None else None)
    for layout in layouts:
        if layout is not None and not all(getattr(x, "is_Integer", False) for part in layout for x in part):
            return None
    first = {}
    same = tuple(first.setdefault(s, i) for i, s in enumerate(names))
    return names, (same, tuple(layouts))


def _keep(e: CEmitter, k: CEmitted, nodes: list[fx.Node], names: list[str]) -> _Kept | None:
    at = {}
    for i, s in enumerate(names):
        if s:
            at.setdefault(s, i)
    member = {n.name: i for i, n in enumerate(nodes)}
    if e.launch_prologue or any(a not in at for a in k.args) or any(p.launch not in at for p in k.params) \
            or any(n not in member for _, n in e.value_names):
        return None
    return _Kept(k, tuple(at[a] for a in k.args), tuple(at[p.launch] for p in k.params),
                 tuple((v, member[n]) for v, n in e.value_names), bool(e.frame.reduction))


def _renamed(kept: _Kept, name: str, nodes: list[fx.Node], names: list[str]) -> CEmitted:
    k = kept.kernel
    args = [names[i] for i in kept.args]
    params = [Param(p.name, p.sig, names[i]) for p, i in zip(k.params, kept.launches)]
    head = launch_head(name, kept.reduction, [(v, nodes[i].name) for v, i in kept.values], k.c_source.split("\n")[:-1])
    return CEmitted(k.symbol, k.c_source, launch_source(name, args, params, [], head), name, args, params,
                    k.node_count, k.unique_io_buffers, dict(k.specs), quick=k.quick)
