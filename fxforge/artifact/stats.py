"""The figures of one compile: ``CompileStats``, a typed record built once when a graph has been
compiled (``CompileStats.collect``), read by users as ``Compiled.stats`` (its ``as_dict``: the
key names of ../docs and DESIGN.md §3), by the report, the bench and ``fxforge.package``."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch.fx as fx

from ..core.collectives import collective_stats
from ..core.copies import graph_copy_bytes
from ..core.graph import FALLBACK_BACKEND, peak_live_bytes
from ..passes.memory import arena_intervals, arena_peak_bytes, symmetric_arena_bytes
from ..core.plan import Group, MemoryPlan, Region

# The keys every compile's ``stats`` holds (with a zero or empty value where nothing was seen).
STAT_KEYS = (
    "nodes_in",
    "kernels",
    "fused_nodes",
    "fallback_nodes",
    "arena_bytes",
    "lower_bound_bytes",
    "eager_live_peak_bytes",
    "copy_bytes",
    "symmetric_arena_bytes",
    "collective_bytes",
    "compile_seconds",
    "refused_fusions",
    "refused_zero_copy",
    "custom_ops",
)


def _summed(records: Sequence, key: str) -> dict:
    """A count per reason, summed over the passes' records of ``key``."""
    return dict(sum((Counter(r.stats.get(key, {})) for r in records), Counter()))


@dataclass
class CompileStats:
    graph: str  # forward, backward, inference, export (or "graph" for a bare compile_graph)
    nodes_in: int  # compute nodes handed to the pipeline
    kernels: int
    fused_nodes: int  # nodes inside kernels of more than one node
    fallback_nodes: int
    arena_bytes: int  # the most arena bytes live at once
    arenas: int
    lower_bound_bytes: int  # the arena buffers' own live peak
    eager_live_peak_bytes: int  # the input graph's live peak in program order
    copy_bytes: int
    symmetric_arena_bytes: int
    kept_arena_bytes: int
    recycled_bytes: int
    symmetric_copy_ins: dict
    collectives: list
    refused_fusions: dict
    refused_zero_copy: dict
    refused: list
    schedule: str  # the order kept: "memory" or "program"
    schedule_peak_bytes: int
    stage_seconds: dict
    passes: list
    fallbacks: dict  # node name -> why it runs eagerly
    compile_seconds: float
    custom_ops: list = field(default_factory=list)  # the entry points fill it in (fxforge/custom_ops)
    region: str = ""  # the invoke_subgraph body this graph is ("" for a graph that is none)
    regions: list = field(default_factory=list)  # the compiled regions it calls (``region_stats``)
    # "stored", "hit" (loaded, not compiled: compile_seconds is the load's), or why it is not cached
    graph_cache: str = ""
    # C kernels the first calls run as built at -Og, their full builds left to the background
    # (``Config.tiered_builds``, ``Compiled.wait_for_kernels``)
    tiered_kernels: int = 0
    # the collectives of the schedule under the cost models (passes/overlap.py, ``comm_figures``)
    comm: dict = field(default_factory=dict)

    @property
    def collective_bytes(self) -> int:
        return sum(c["bytes"] for c in self.collectives)

    @property
    def fragmentation(self) -> float:
        """Arena bytes beyond the buffers' own peak, as a fraction of it."""
        return self.arena_bytes / self.lower_bound_bytes - 1 if self.lower_bound_bytes else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update(collective_bytes=self.collective_bytes, fragmentation=self.fragmentation)
        return out

    @classmethod
    def collect(cls, kind: str, gm: fx.GraphModule, groups: list[Group], memory: MemoryPlan, emitted, records: Sequence,
                schedule: dict, *, nodes_in: int, eager_peak: int, stages: dict, seconds: float, region: str = "",
                regions: Sequence[Region] = (), comm: dict | None = None) -> "CompileStats":
        """The record of a compile: ``emitted``, the generated wrapper (``codegen.wrapper``);
        ``records``, the passes' (``PassRecord``); ``schedule``, the scheduler's figures;
        ``regions``, the compiled bodies the graph calls (their fallbacks and copies count as its
        own: they run inside its calls)."""
        demoted = dict(emitted.demoted)
        # every node that runs eagerly, and why: refused by the backend, or its kernel failed to compile
        fallbacks = {n.name: g.reason for g in groups if g.backend == FALLBACK_BACKEND for n in g.nodes}
        fallbacks.update({n.name: demoted[g.id] for g in groups if g.id in demoted for n in g.nodes})
        fallbacks.update({f"{r.name}/{name}": why for r in regions if r.compiled is not None
                          for name, why in r.compiled.stats["fallbacks"].items()})
        fallbacks.update({site: r.failed for r in regions if r.compiled is None for site in r.sites})
        arena_live = [(iv.start, iv.end, iv.size) for a in memory.arenas if a.symmetric is None
                      for iv in arena_intervals(memory, a.name)]
        return cls(
            graph=kind,
            nodes_in=nodes_in,
            kernels=len(emitted.kernels),
            fused_nodes=sum(k.node_count for k in emitted.kernels if k.node_count > 1),
            fallback_nodes=len(fallbacks),
            arena_bytes=arena_peak_bytes(memory),
            arenas=len(memory.arenas),
            lower_bound_bytes=peak_live_bytes(arena_live),
            eager_live_peak_bytes=eager_peak,
            copy_bytes=graph_copy_bytes(groups, memory.hint, memory, demoted)
            + sum(len(r.sites) * r.compiled.stats["copy_bytes"] for r in regions if r.compiled is not None),
            symmetric_arena_bytes=symmetric_arena_bytes(memory),
            kept_arena_bytes=memory.kept_bytes,
            recycled_bytes=memory.recycled_bytes,
            symmetric_copy_ins=_summed(records, "symmetric_copy_ins"),
            collectives=collective_stats(gm),
            refused_fusions=_summed(records, "refused_fusions"),
            refused_zero_copy=_summed(records, "refused_zero_copy"),
            refused=[x for r in records for x in r.stats.get("refused", [])],
            schedule=schedule["schedule"],
            schedule_peak_bytes=schedule["schedule_peak_bytes"],
            stage_seconds=stages,
            passes=[r.as_dict() for r in records],
            fallbacks=fallbacks,
            compile_seconds=seconds,
            region=region,
            regions=[region_stats(r) for r in regions if r.compiled is not None],
            comm=comm or {},
            tiered_kernels=emitted.tiered_kernels,
        )


def region_stats(r: Region) -> dict[str, Any]:
    """A compiled region as its caller's ``stats["regions"]`` lists it: where it is called, and
    its body's own figures (compiled once for all its call sites)."""
    s = r.compiled.stats
    return {"name": r.name, "sites": list(r.sites), **{k: s[k] for k in (
        "nodes_in", "kernels", "fused_nodes", "fallback_nodes", "arena_bytes", "kept_arena_bytes", "copy_bytes",
        "compile_seconds")}}
