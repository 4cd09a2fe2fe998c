"""``Compiled``: the callable artifact of one graph, with its stats, kernels and source."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from .inputs import InputError
from .stats import STAT_KEYS  # noqa: F401  (re-exported: its old home)

log = logging.getLogger("fxforge")

# Calls whose generated code failed (each re-run eagerly) before a graph runs eagerly for good.
MAX_FAILURES = 3
# Whether a profiler (torch.profiler, torch.autograd.profiler) is recording: one check per call.
_profiling = torch._C._autograd._profiler_enabled


class GeneratedCodeError(RuntimeError):
    """Generated code failed where the call could not be re-run eagerly (its inputs were freed)."""


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
    ``report_data``: what ``write_report`` needs beyond these (``fxforge.report.record``).
    """

    # The compiled regions (``plan.Region``: ``invoke_subgraph`` bodies compiled once) this graph calls.
    regions: list = []
    # Its key in the compiled-graph cache (``graph_cache.py``), where it was stored or loaded from.
    cache_key: str | None = None
    # A graph loaded from that cache was not compiled here: what only a compile makes (the graph
    # after the passes, the plan, the report's records, the wrapper object) comes from compiling it
    # again, once, when first asked for (None: nothing to make).
    _materialize: Callable[[], "Compiled"] | None = None

    def __init__(
        self,
        fn: Callable[[list], Any],
        *,
        profiled: Callable[[], Callable[[list], Any]] | None = None,
        source: str,
        stats: dict,
        kernels: list[KernelInfo],
        graph: fx.GraphModule | None,
        plan: Any = None,
        eager: Callable[[list], Any] | None = None,
        debug: bool = False,
        holds_inputs: bool = True,
        communicates: bool = False,
        n_inputs: int | None = None,
    ):
        self._fn = fn
        # ``call_profiled``, made on first use: ``fn`` with each kernel in a profiler range
        self._load_profiled = profiled
        self.source = source
        self.stats = stats
        self.kernels = kernels
        self._graph = graph
        self._plan = plan
        self._report_data = None  # set by compile_graph
        # The generated wrapper the source came from, with its globals and each backend's units
        # (set by compile_graph; what ``fxforge.package`` writes): None for a loaded package.
        self._artifact = None
        self._eager = eager
        self._debug = debug
        # the caller holds the inputs during a call anyway (not so for a backward graph, whose
        # saved activations the call frees as it goes): a failed call can be re-run eagerly
        self.holds_inputs = holds_inputs
        # a graph with collectives is never re-run eagerly: the other ranks would not re-run theirs
        self.communicates = communicates
        # (``graph``: None for a loaded package, which says how many inputs it takes)
        self.n_inputs = sum(1 for n in graph.graph.nodes if n.op == "placeholder") if graph is not None else n_inputs
        # The strides of the graph's outputs where static (None where symbolic), in order.
        self.output_strides: list = _output_strides(graph) if graph is not None else []
        self.failures: list[str] = []  # why calls of the generated code failed (each ran eagerly)
        self.failed: str | None = None  # why the graph switched to eager for good, if it did
        self._proven = False  # a call has succeeded

    @property
    def upgrades(self) -> list:
        """The futures of the full builds of the C kernels this graph's first calls run as built
        at -Og (``Config.tiered_builds``; ``Wrapper.upgrades``), each swapped in when done."""
        return self._artifact.upgrades if self._artifact is not None else []

    def wait_for_kernels(self, timeout: float | None = None) -> bool:
        """Wait until every kernel of this graph and of the regions it calls runs as built in
        full (``Config.tiered_builds``: the first calls may run kernels built at -Og while the
        full builds run in the background); at most ``timeout`` seconds.  True when they do (a
        full build that failed leaves its first kernels, logged: True too)."""
        from concurrent.futures import wait

        pending = list(self.upgrades) + [f for r in self.regions if r.compiled is not None for f in r.compiled.upgrades]
        return not wait(pending, timeout=timeout).not_done

    def _made(self, name: str) -> Any:
        """Attribute ``name``, made by compiling again where this graph came from the cache."""
        if getattr(self, name) is None and self._materialize is not None:
            full, self._materialize = self._materialize(), None
            for a in ("_graph", "_plan", "_report_data", "_artifact"):
                setattr(self, a, getattr(full, a))
        return getattr(self, name)

    @property
    def graph(self) -> fx.GraphModule | None:
        """The graph after the passes (the one the wrapper runs)."""
        return self._made("_graph")

    @property
    def plan(self) -> Any:
        """The schedule, groups and memory plan the source was generated from."""
        return self._made("_plan")

    @property
    def report_data(self) -> Any:
        return self._made("_report_data")

    @report_data.setter
    def report_data(self, v: Any) -> None:
        self._report_data = v

    @property
    def artifact(self) -> Any:
        return self._made("_artifact")

    @artifact.setter
    def artifact(self, v: Any) -> None:
        self._artifact = v

    @property
    def generated(self) -> Callable[[list], Any]:
        """The generated ``call(args)`` itself: no input check, no eager re-run on failure, no
        grad mode set (a compiled region's caller calls it from its own generated code)."""
        return self._fn

    def call_boxed(self, args: list) -> Any:
        """AOTAutograd's calling convention: one list of inputs, emptied by the call.

        The generated code clears ``args`` so every input is freed after its last use.  What a
        failing call does (``MAX_FAILURES``; README, "Failures"):

        * the wrong number of inputs raises ``InputError`` (nothing runs, nothing is disabled);
        * generated code that raises is re-run eagerly on the same inputs, on any call where they
          are still held (every call, except a backward graph's calls after its first success):
          if eager raises too, the error is the program's own (an index out of range...) and
          eager's exception propagates, the compiled code staying in use; otherwise the call
          returns eager's result and the failure is logged and kept in ``failures``.  After
          ``MAX_FAILURES`` of them the graph runs eagerly for good (``failed``), logged once;
        * where the inputs are gone, or the graph communicates with other ranks (a re-run on one
          rank would leave the others waiting in their collectives), the error propagates as
          ``GeneratedCodeError``.

        With ``Config(debug=True)`` every failure raises.
        """
        if len(args) != self.n_inputs:
            raise InputError(f"the compiled graph takes {self.n_inputs} inputs, got {len(args)}")
        if self.failed is not None:
            out = self._eager(args)
            args.clear()
            return out
        kept = list(args) if (self.holds_inputs or not self._proven) and self._eager is not None else None
        # under torch.profiler (or torch.autograd.profiler), each kernel in a range of its own
        fn = self._fn if self._load_profiled is None or not _profiling() else self._load_profiled()
        try:
            # Graphs are ATen-level and functional: autograd, if any, happens outside them
            # (AOTAutograd), and out= ops refuse inputs that require grad.  AOTAutograd runs a
            # training step's graphs with grad off already: no context to enter then
            if torch.is_grad_enabled():
                with torch.no_grad():
                    out = fn(args)
            else:
                out = fn(args)
        except Exception as e:
            if self._debug:
                raise
            if self.communicates:
                raise GeneratedCodeError(
                    f"the generated code of this {self.stats.get('graph', 'graph')} graph failed "
                    f"({type(e).__name__}: {e}); it communicates with other ranks, so it is not re-run "
                    "eagerly on this rank alone; FXFORGE_DEBUG=1 raises at the failing line of Compiled.source"
                ) from e
            if kept is None:
                why = "it has no graph to run eagerly (a loaded package)" if self._eager is None else \
                    "its inputs were freed"
                raise GeneratedCodeError(
                    f"the generated code of this {self.stats.get('graph', 'graph')} graph failed "
                    f"({type(e).__name__}: {e}) and the call cannot be re-run eagerly: {why}; "
                    "FXFORGE_DEBUG=1 raises at the failing line of Compiled.source"
                ) from e
            return self._recover(kept, e)
        self._proven = True
        return out

    def _recover(self, args: list, error: Exception) -> Any:
        """The call, re-run eagerly after the generated code raised ``error``."""
        try:
            out = self._eager(args)
        except Exception as eager_error:
            raise eager_error from None  # eager fails too: the program's own error, not fxforge's
        finally:
            args.clear()
        reason = f"{type(error).__name__}: {error}"
        self.failures.append(reason)
        if len(self.failures) >= MAX_FAILURES:
            self.failed = reason
            log.warning("fxforge: generated code failed on %d calls (last: %s); this graph now runs eagerly",
                        len(self.failures), reason)
        else:
            log.warning("fxforge: generated code failed (%s); this call ran eagerly", reason)
        return out

    call_boxed._boxed_call = True  # type: ignore[attr-defined]

    def __call__(self, *args: Any) -> Any:
        return self.call_boxed(list(args))

    def write_report(self, path: str) -> str:
        """Write the self-contained HTML report of this graph (memory picture, graph picture,
        pass timeline, kernels, stats, source) to ``path``; returns ``path``."""
        from ..report.html import write_report

        return write_report(self, path)

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"<fxforge.Compiled {s.get('graph', 'graph')}: {s.get('nodes_in')} nodes, "
            f"{s.get('kernels')} kernels, {s.get('fallback_nodes')} fallbacks, arena {s.get('arena_bytes')} B>"
        )


def _output_strides(gm: fx.GraphModule) -> list:
    """The strides of ``gm``'s outputs where static, else None (what AOTAutograd is told of a
    training forward's saved values)."""
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    strides = []
    for a in out.args[0] if isinstance(out.args[0], (tuple, list)) else [out.args[0]]:
        v = a.meta.get("val") if isinstance(a, fx.Node) else None
        static = isinstance(v, torch.Tensor) and all(type(s) is int for s in v.stride())
        strides.append(tuple(v.stride()) if static else None)
    return strides
