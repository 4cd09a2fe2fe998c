"""What the report needs from a compile that the ``Compiled`` does not keep: recorded cheaply.

``PassRecorder`` is the ``PassManager`` observer ``compile_graph`` installs.  It keeps, without
formatting anything during the compile:

* a *sketch* of the input graph: one tuple per node (the node, op, target, args, kwargs, value).
  FX args are immutable, so the tuples stay as they were when passes later rewrite the graph;
  ``rebuild`` makes a throw-away ``fx.Graph`` of them when the report is written (the eager-order
  live-bytes curve is computed on it with the same helpers as ``eager_live_peak_bytes``);
* the graph's nodes before the first pass and after every pass (one tuple per node, the same
  list object where a pass changed no node: it reported none modified, or the nodes compare
  equal): its code is generated from them when the report is written (``ReportData.codes``), not
  while the graph compiles;
* per snapshot a count of kernel groups, of nodes per backend and of fallback nodes, since
  backend assignment and fusion change metadata, not code.

``ReportData`` bundles that with the wrapper's kernels (name, launch arguments, source).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch.fx as fx

from ..core.graph import BACKEND, FALLBACK, GROUP, VAL


@dataclass
class MetaSummary:
    groups: int
    backends: dict[str, int]
    fallbacks: int


@dataclass
class ReportData:
    sketch: list[tuple] = field(default_factory=list)  # the input graph (see ``rebuild``)
    # the graph's nodes before the first pass, then after each: (node, op, target, args, kwargs)
    snapshots: list[list[tuple]] = field(default_factory=list)
    meta: list[MetaSummary] = field(default_factory=list)  # same positions as ``snapshots``
    kernels: list[Any] = field(default_factory=list)  # the wrapper's ``codegen.api.Kernel`` objects

    @functools.cached_property
    def codes(self) -> list[str]:
        """The graph's code at each snapshot (the input's, then after each pass), made once."""
        made: dict[int, str] = {}
        for snap in self.snapshots:
            if id(snap) not in made:
                made[id(snap)] = _code(snap)
        return [made[id(snap)] for snap in self.snapshots]


def _code(snapshot: list[tuple]) -> str:
    g, _ = _replay(snapshot)
    try:
        return g.python_code(root_module="self").src
    except Exception:  # (a graph FX cannot print: the report shows no code for it)
        return ""


def _summary(gm: fx.GraphModule) -> MetaSummary:
    groups: set = set()
    backends: dict[str, int] = {}
    fallbacks = 0
    for n in gm.graph.nodes:
        m = n.meta
        g = m.get(GROUP)
        if g is not None:
            groups.add(g)
            b = m.get(BACKEND)
            backends[b] = backends.get(b, 0) + 1
        if FALLBACK in m:
            fallbacks += 1
    return MetaSummary(len(groups), backends, fallbacks)


class PassRecorder:
    """``PassManager(..., observer=PassRecorder())``: called with ``("<input>", gm, True)`` before
    the first pass and ``(pass_name, gm, modified)`` after each."""

    def __init__(self) -> None:
        self.data = ReportData()

    def __call__(self, name: str, gm: fx.GraphModule, modified: bool = True) -> None:
        d = self.data
        if not d.snapshots:
            d.sketch = [(n, n.op, n.target, n.args, n.kwargs, n.meta.get(VAL)) for n in gm.graph.nodes]
        if d.snapshots and not modified:
            snap = d.snapshots[-1]
        else:
            snap = [(n, n.op, n.target, n.args, n.kwargs) for n in gm.graph.nodes]
            if d.snapshots and _same(d.snapshots[-1], snap):
                snap = d.snapshots[-1]  # (no node changed: the same list, its code made once)
        d.snapshots.append(snap)
        d.meta.append(_summary(gm))

    def finish(self, kernels: list) -> ReportData:
        self.data.kernels = list(kernels)
        return self.data


def _same(a: list[tuple], b: list[tuple]) -> bool:
    """The same nodes with the same ops, targets and arguments (by identity where they are nodes)."""
    return len(a) == len(b) and all(x[0] is y[0] and x[2] is y[2] and x[3] == y[3] and x[4] == y[4]
                                    for x, y in zip(a, b))


def rebuild(sketch: list[tuple]) -> SimpleNamespace:
    """A stand-in GraphModule (``.graph`` only) of a recorded graph, for the liveness helpers."""
    g, made = _replay(sketch)
    for (node, *_, val), new in zip(sketch, made):
        if val is not None or VAL in node.meta:
            new.meta[VAL] = val
    return SimpleNamespace(graph=g)


def _replay(rows: list[tuple]) -> tuple[fx.Graph, list[fx.Node]]:
    """A new graph of recorded nodes (rows ``(node, op, target, args, kwargs, ...)``), and its
    nodes in their order."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}

    def remap(a):
        return env[a] if a in env else a

    for node, op, target, args, kwargs, *_ in rows:
        env[node] = g.create_node(op, target, fx.node.map_arg(args, remap), fx.node.map_arg(kwargs, remap),
                                  name=node.name)
    return g, list(env.values())
