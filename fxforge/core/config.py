"""Every knob of fxforge, its default, and what it does. Passed explicitly; never global.

Every knob is checked when the ``Config`` is built: a wrong value raises ``ValueError`` naming
the knob, the value and the forms it accepts.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

# Named points of the pipeline where ``Config(passes=...)`` inserts user passes, in pipeline order.
PASS_POINTS = {
    "after_lowering": "after decompositions and graph cleanup, before backend assignment",
    "after_assignment": "after every compute node has a backend and a group, before fusion",
    "after_fusion": "after fusion, before scheduling, memory planning and codegen",
}


def _budget(b: Any) -> int | float | None:
    if b is None:
        return None
    if isinstance(b, float) and 0 < b <= 1:
        return b
    if isinstance(b, int) and not isinstance(b, bool) and b > 0:
        return b
    raise ValueError(f"Config.memory_budget={b!r}: expected bytes (an int > 0), a fraction of the default "
                     "step peak (a float, 0 < f <= 1), or None (no budget)")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _env_unless_off(name: str) -> bool:
    """True unless the environment sets ``name`` to 0, false, no or off."""
    return os.environ.get(name, "").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class Config:
    # Codegen backend: "auto" (triton on CUDA, c or torch on CPU), "torch", "c", "triton", or any name of
    # the registry the entry point uses (checked there: Registry.check).
    codegen: str = "auto"
    # Decompositions before lowering: "auto" (per backend), "none" (ATen as traced), "core" (core ATen).
    decompose: str = "auto"
    # AOTAutograd partitioner for training graphs: "min_cut" (recompute cheap ops in the backward
    # instead of saving them: fewer saved-activation bytes) or "default" (save what the forward has).
    partitioner: str = "min_cut"
    # A training step's peak bytes (passes/memory_budget.py; docs/memory-budget.md): an int is
    # bytes, a float 0 < f <= 1 a fraction of the step peak with ``partitioner``'s choice. Values
    # the step saved for the backward are recomputed there, cheapest first, until the planned peak
    # fits; a budget nothing meets raises MemoryBudgetError at compile. None: no budget.
    memory_budget: int | float | None = None
    # Most compute nodes one fusion group may hold (1: no fusion; math.inf: no limit). Views
    # inside a group are free.
    max_fusion_size: int = 64
    # Most distinct buffers (storages) one fusion group may read or write, as the backend counts
    # them (math.inf: no limit).
    max_fusion_unique_io_buffers: int = 32
    # Most launch arguments (tensor pointers + sizes/strides/scalars) of one emitted kernel, as
    # the backend counts them for the kernel it would emit; Triton also refuses single nodes over
    # it (math.inf: no limit).
    max_kernel_args: int = 64
    # Fusion refuses a merge that would raise the estimated peak of live bytes more than this
    # fraction above the unfused graph's (0.0: fusion may never raise it; math.inf: no limit).
    max_fusion_peak_growth: float = 0.05
    # Triton: on each kernel's first call per size, time a few launch configurations (block sizes,
    # warps) and keep the fastest, cached on disk (codegen/triton/autotune.py). Meant for GPUs.
    autotune: bool = False
    # Byte alignment of every buffer placed in an arena (a power of two).
    alignment: int = 64
    # Ops always run as eager fallback calls, never by a backend: OpOverloads
    # (torch.ops.aten.add.Tensor) or their names ("aten.add.Tensor"); a packet ("aten.add",
    # torch.ops.aten.add) means all its overloads.  Stored as names.
    fallback_ops: frozenset = frozenset()
    # Let a pointwise op write its output over an input buffer that dies there (same layout).
    inplace: bool = True
    # Split each device's arena into several arenas by lifetime window (passes/memory.py), each
    # allocated just before its first buffer is written and dropped after its last buffer's last
    # use; False: one arena per device, held for the whole call.
    arena_windows: bool = True
    # Keep a static-shape graph's arenas, and the views of the buffers in them, from one call to
    # the next (made once, laid out in one block: the arena windows at their own offsets) instead
    # of allocating them on every call: "inference" (every graph but a training step's forward
    # and backward whose block is over keep_training_arenas_max_bytes: those would hold their
    # arenas through the whole step), "always", "never".
    # Kept arenas hold their bytes between calls (stats["kept_arena_bytes"]).
    keep_arenas: str = "inference"
    # Under keep_arenas="inference", a training step's forward or backward keeps its arenas when
    # their block is at most this many bytes: graphs with small temporaries, whose kernels are
    # short enough that making arenas and views per call (a few µs of Python each) is a visible
    # share of the step, hold at most this much more between steps (and during the other graph
    # of the step).
    keep_training_arenas_max_bytes: int = 4 << 20
    # Hand a static-shape CPU graph's fresh buffer (an output, or what an output is written over)
    # out again over the bytes it had on an earlier call, when nothing holds them any more (no
    # tensor, view or storage object of that result is alive): "inference" (every graph but a
    # training step's forward and backward, which would hold their released outputs through the
    # step), "always", "never".  Only buffers of at least recycle_min_bytes: the allocator serves
    # those as fresh pages from the OS, each faulted in on its first write (glibc's malloc from
    # 128 KiB, its default mmap threshold).  Each keeps the bytes of its last two calls (for the
    # loop ``out = f(x)``, which holds the last result while the next call runs): once the caller
    # drops the results, up to twice stats["recycled_bytes"] stays allocated between calls.
    recycle_outputs: str = "inference"
    recycle_min_bytes: int = 128 << 10
    # Memory layout of convolutions' operands and of the values computed from their outputs
    # (lowering/conv_layout.py): "auto" (channels-last on CPU graphs where oneDNN runs the
    # convolutions), "channels_last" (on every device), "as_traced".  Static sizes only; what the
    # caller receives keeps its traced strides (a training forward's saved activations need not).
    conv_layout: str = "auto"
    # The intra-op threads the CPU kernels are built for: a C kernel splits its loops across
    # threads only where the work saved pays for waking them at this count (codegen/c/kernel.py,
    # ``parallel_min_work``; 1: every kernel on the calling thread).  None: torch.get_num_threads()
    # when the graph compiles.  Kernels run on torch's threads whatever this says.
    threads: int | None = None
    # Write each input of a cat or pad straight into its place in the result, so cat copies
    # nothing and pad fills only its border (passes/padcat.py); False: copy them.
    zero_copy: bool = True
    # Fill every arena with 0xFF bytes (NaN for floats) on each call: exposes reads of unwritten bytes.
    poison_arena: bool = False
    # Functional all-reduces (sum) of at most this many bytes (a bucket of them counted whole)
    # become one-shot all-reduces on symmetric memory, their inputs written into a
    # rank-identical arena (passes/symmetric.py); 0: never.
    symmetric_all_reduce_bytes: int = 0
    # Reorder a graph's collectives so compute hides them: each issued as soon as its inputs are
    # ready, each waited for just before its result is read, their order kept (passes/overlap.py).
    comm_overlap: bool = True
    # How far overlapping collectives may raise a schedule's peak of live bytes (their outputs,
    # an all-gather's prefetched tensor), and its memory plan's peak, as a fraction of those
    # with every collective waited for at once.
    prefetch_peak_growth: float = 0.1
    # All-gathers (reduce-scatters, all-reduces) of one process group and dtype merged into one collective over
    # a flat buffer, in program order, up to this many bytes of input each, the runs cut where the
    # compute waits least under comm_model (passes/bucketing.py); 0: never.
    bucket_bytes: int = 4 << 20
    # The link buckets are cut for and stats["comm"] estimates collectives on, the same on every
    # rank (core/costs.py): "auto" (nvlink for NCCL,
    # gloo-loopback otherwise), a preset's name (costs.COMM_PRESETS), a costs.CommModel, or
    # {"alpha_s": seconds per step, "bandwidth": bytes per second}.
    comm_model: Any = "auto"
    # At most this many collectives in flight (issued, not yet waited for) at any point of a
    # schedule: where more would be, the oldest is waited for first (passes/overlap.py
    # bound_in_flight).  gloo corrupts its heap with a few tens outstanding; one stream gains
    # nothing from more.  0: no bound.
    max_collectives_in_flight: int = 8
    # Custom ops registered with fxforge.register_custom_op_autotuning: "on" (check each
    # candidate against the op, time the ones that agree, inline the fastest; fxforge/custom_ops),
    # "off" (the op itself, called opaquely).
    custom_op_tuning: str = "on"
    # Directory where an HTML report is written for every compiled graph (None: no reports).
    report_dir: str | None = field(default_factory=lambda: os.environ.get("FXFORGE_REPORT_DIR") or None)
    # User passes inserted at named points of the pipeline: {"after_fusion": [my_pass], ...}
    # (points: ``PASS_POINTS``).  A pass takes a GraphModule and returns what PassManager accepts;
    # it is timed, recorded in stats["passes"] and, in debug mode, verified like fxforge's own.
    # Stored as a tuple of (point, passes) pairs in pipeline order.
    passes: Any = ()
    # Verify the graph between passes (lint, metadata, re-propagated fake values) and the plan.
    debug: bool = field(default_factory=lambda: _env_flag("FXFORGE_DEBUG"))
    # C kernels not in the kernel cache are built at -Og first (a third of the compiler's time), and
    # the wrapper runs with them while they are built in full in the background; each kernel is
    # swapped in once built (``Compiled.wait_for_kernels``).  The first calls run slower, and
    # where a reduction sums in vector lanes their results may differ from the later calls' in the
    # last bits.  Never in a multi-rank job.  FXFORGE_TIERED_BUILDS=0 turns it off.
    tiered_builds: bool = field(default_factory=lambda: _env_unless_off("FXFORGE_TIERED_BUILDS"))
    # Called with every kernel a compile builds (``codegen.api.Kernel``; its ``detail``: what the
    # backend emitted, in its own terms), as it is built: for tools that need every kernel (a kernel
    # dump, a test's record).  None: nothing is called.
    on_kernel: Any = None
    # A compile running longer than about 2 s shows one progress line on stderr, where stderr is a
    # terminal (progress.py).  FXFORGE_PROGRESS=0 turns it off.
    progress: bool = field(default_factory=lambda: _env_unless_off("FXFORGE_PROGRESS"))

    def __post_init__(self) -> None:
        _choice("decompose", self.decompose, ("auto", "none", "core"))
        _choice("partitioner", self.partitioner, ("min_cut", "default"))
        _choice("keep_arenas", self.keep_arenas, ("inference", "always", "never"))
        _choice("recycle_outputs", self.recycle_outputs, ("inference", "always", "never"))
        _choice("conv_layout", self.conv_layout, ("auto", "channels_last", "as_traced"))
        _choice("custom_op_tuning", self.custom_op_tuning, ("on", "off"))
        self._set("memory_budget", _budget(self.memory_budget))
        m = self.max_collectives_in_flight
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"Config.max_collectives_in_flight={m!r}: expected a count >= 0 (0: no bound)")
        for knob in ("max_fusion_size", "max_fusion_unique_io_buffers", "max_kernel_args"):
            self._set(knob, _limit(knob, getattr(self, knob)))
        self._set("max_fusion_peak_growth", _fraction("max_fusion_peak_growth", self.max_fusion_peak_growth))
        self._set("prefetch_peak_growth", _fraction("prefetch_peak_growth", self.prefetch_peak_growth))
        from .costs import comm_model

        comm_model(self.comm_model)  # (a wrong name fails here, with the names it knows)
        for knob in ("symmetric_all_reduce_bytes", "keep_training_arenas_max_bytes", "recycle_min_bytes", "bucket_bytes"):
            s = getattr(self, knob)
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ValueError(f"Config.{knob}={s!r}: expected a byte count >= 0")
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ValueError(f"Config.threads={t!r}: expected a thread count >= 1, or None (torch.get_num_threads())")
        a = self.alignment
        if isinstance(a, bool) or not isinstance(a, int) or a < 1 or a & (a - 1):
            raise ValueError(f"Config.alignment={a!r}: expected a power of two (an int such as 16 or 64)")
        for knob in ("autotune", "inplace", "arena_windows", "zero_copy", "poison_arena", "debug", "progress",
                     "comm_overlap", "tiered_builds"):
            v = getattr(self, knob)
            if not isinstance(v, bool):
                raise ValueError(f"Config.{knob}={v!r}: expected True or False (a bool, not {type(v).__name__})")
        if self.on_kernel is not None and not callable(self.on_kernel):
            raise ValueError(f"Config.on_kernel={self.on_kernel!r}: expected None or a function taking each Kernel")
        if self.report_dir is not None:
            if not isinstance(self.report_dir, (str, os.PathLike)):
                raise ValueError(f"Config.report_dir={self.report_dir!r}: expected a directory path (str) or None")
            self._set("report_dir", os.fspath(self.report_dir))
        self._set("fallback_ops", _op_names(self.fallback_ops))
        self._set("passes", _pass_points(self.passes))
        self._set("codegen", _codegen(self.codegen))

    def _set(self, knob: str, value: Any) -> None:
        object.__setattr__(self, knob, value)

    def replace(self, **changes) -> "Config":
        return replace(self, **changes)

    def passes_at(self, point: str) -> tuple[Callable, ...]:
        """The user passes inserted at ``point`` (one of ``PASS_POINTS``), in order."""
        if point not in PASS_POINTS:
            raise ValueError(f"unknown pass point {point!r}; expected one of {list(PASS_POINTS)}")
        return next((ps for p, ps in self.passes if p == point), ())


def _choice(knob: str, v: Any, allowed: tuple[str, ...]) -> None:
    if v not in allowed or not isinstance(v, str):
        raise ValueError(f"Config.{knob}={v!r}: expected one of {', '.join(repr(a) for a in allowed)}")


def _limit(knob: str, v: Any):
    """A positive int, or math.inf for no limit."""
    if isinstance(v, float) and v == math.inf:
        return math.inf
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"Config.{knob}={v!r}: expected a positive int, or math.inf for no limit")
    return v


def _fraction(knob: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
        raise ValueError(f"Config.{knob}={v!r}: expected a fraction >= 0 (e.g. 0.05), or math.inf for no limit")
    return float(v)


_OP_NAME = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")


def _op_names(ops: Any) -> frozenset:
    """``fallback_ops`` as op names: "ns.name.overload", or "ns.name" for every overload."""
    import torch

    if isinstance(ops, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        ops = [ops]  # one op, not a collection of characters
    try:
        items = list(ops)
    except TypeError:
        raise ValueError(
            f"Config.fallback_ops={ops!r}: expected a collection of ops: OpOverloads "
            "(torch.ops.aten.add.Tensor), packets (torch.ops.aten.add) or their names ('aten.add.Tensor')"
        ) from None
    out = set()
    for op in items:
        if isinstance(op, torch._ops.OpOverload):
            name = op.name().replace("::", ".")
            out.add(name if "." in op.name().split("::", 1)[1] else name + ".default")
            continue
        if isinstance(op, torch._ops.OpOverloadPacket):
            out.add(op._qualified_op_name.replace("::", "."))
            continue
        if not isinstance(op, str):
            raise ValueError(
                f"Config.fallback_ops: {op!r} ({type(op).__name__}) is not an op; expected an OpOverload "
                "(torch.ops.aten.add.Tensor), a packet (torch.ops.aten.add) or a name ('aten.add.Tensor')"
            )
        name = op.removeprefix("torch.ops.").replace("::", ".")
        if not _OP_NAME.match(name):
            raise ValueError(
                f"Config.fallback_ops: {op!r} is not an op name; expected 'namespace.op.overload' "
                "('aten.add.Tensor') or 'namespace.op' ('aten.add': every overload)"
            )
        ns, packet, *overload = name.split(".")
        if ns in ("aten", "prims"):  # always loaded: a typo is caught now, not never
            p = getattr(getattr(torch.ops, ns), packet, None)
            if p is None or (overload and overload[0] not in p.overloads()):
                raise ValueError(f"Config.fallback_ops: there is no operator {name!r}")
        out.add(name)
    return frozenset(out)


def _pass_points(passes: Any) -> tuple:
    """``{point: [pass, ...]}`` (or (point, passes) pairs) as a tuple of pairs in pipeline order."""
    if passes is None:
        return ()
    pairs = passes.items() if isinstance(passes, Mapping) else passes
    by_point: dict[str, tuple] = {}
    try:
        pairs = [(p, ps) for p, ps in pairs]
    except (TypeError, ValueError):
        raise ValueError(
            f"Config.passes={passes!r}: expected a dict {{point: [pass, ...]}} with points from {list(PASS_POINTS)}"
        ) from None
    for point, ps in pairs:
        if point not in PASS_POINTS:
            raise ValueError(f"Config.passes: unknown point {point!r}; expected one of {list(PASS_POINTS)}")
        ps = (ps,) if callable(ps) else tuple(ps)
        for p in ps:
            if not callable(p):
                raise ValueError(f"Config.passes[{point!r}]: {p!r} is not callable; a pass takes a GraphModule")
        by_point[point] = by_point.get(point, ()) + ps
    return tuple((p, by_point[p]) for p in PASS_POINTS if by_point.get(p))


def _codegen(name: Any) -> str:
    """A backend's name in the form one takes; whether a registry holds it is checked by the
    entry point that uses the Config, against its own registry (``Registry.check``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"Config.codegen={name!r}: expected 'auto' or a registered backend name such as 'torch'")
    return name
