"""``Compiled``: the callable artifact of one graph, with its stats, kernels and source."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

log = logging.getLogger("fxforge")

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
    "compile_seconds",
    "refused_fusions",
)


@dataclass(frozen=True)
class KernelInfo:
    name: str
    backend: str
    node_count: int
    num_args: int
    unique_io_buffers: int


class Compiled:
    """A compiled graph.  Call it like the graph: ``c(*inputs)``.

    ``stats``: figures of this compile (keys in ``STAT_KEYS``, plus ``passes`` with per-pass
    time and node counts, ``graph`` = forward/backward/inference/export).  ``kernels``: one
    ``KernelInfo`` per emitted kernel.  ``source``: the generated wrapper and kernel sources.
    ``plan``: the schedule, groups and memory plan the source was generated from.
    """

    def __init__(
        self,
        fn: Callable[[list], Any],
        *,
        source: str,
        stats: dict,
        kernels: list[KernelInfo],
        graph: fx.GraphModule,
        plan: Any = None,
        eager: Callable[[list], Any] | None = None,
        debug: bool = False,
    ):
        self._fn = fn
        self.source = source
        self.stats = stats
        self.kernels = kernels
        self.graph = graph
        self.plan = plan
        self._eager = eager
        self._debug = debug
        self.failed: str | None = None  # why calls switched to eager, if they did
        self._proven = False  # a call has succeeded: later calls keep no copy of their inputs

    def call_boxed(self, args: list) -> Any:
        """AOTAutograd's calling convention: one list of inputs, emptied by the call.

        The generated code clears ``args`` so every input is freed after its last use.  Until
        one call has succeeded a copy of the inputs is kept, so that code which fails on its
        first run falls back to running the graph eagerly instead of crashing the model.
        """
        # Graphs are ATen-level and functional: autograd, if any, happens outside them
        # (AOTAutograd), and out= ops refuse inputs that require grad.
        if self.failed is None and self._proven:
            with torch.no_grad():
                return self._fn(args)
        if self.failed is None:
            kept = list(args)
            try:
                with torch.no_grad():
                    out = self._fn(args)
                self._proven = True
                return out
            except Exception as e:
                if self._debug or self._eager is None:
                    raise
                self.failed = f"{type(e).__name__}: {e}"
                log.warning("fxforge: generated code failed (%s); this graph now runs eagerly", self.failed)
                args = kept
        out = self._eager(args)
        args.clear()
        return out

    call_boxed._boxed_call = True  # type: ignore[attr-defined]

    def __call__(self, *args: Any) -> Any:
        return self.call_boxed(list(args))

    def write_report(self, path: str) -> str:
        from .report.html import write_report

        return write_report(self, path)

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"<fxforge.Compiled {s.get('graph', 'graph')}: {s.get('nodes_in')} nodes, "
            f"{s.get('kernels')} kernels, {s.get('fallback_nodes')} fallbacks, arena {s.get('arena_bytes')} B>"
        )
