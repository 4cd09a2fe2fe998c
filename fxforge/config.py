"""Every knob of fxforge, its default, and what it does. Passed explicitly; never global."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Config:
    # Codegen backend: "auto" (triton on CUDA, torch on CPU), "torch", "triton", or any registered name.
    codegen: str = "auto"
    # Decompositions before lowering: "auto" (per backend), "none" (ATen as traced), "core" (core ATen).
    decompose: str = "auto"
    # AOTAutograd partitioner for training graphs: "min_cut" (recompute cheap ops in the backward
    # instead of saving them: fewer saved-activation bytes) or "default" (save what the forward has).
    partitioner: str = "min_cut"
    # Most compute nodes one fusion group may hold (1: no fusion). Views inside a group are free.
    max_fusion_size: int = 64
    # Most distinct buffers (storages) one fusion group may read or write, as the backend counts them.
    max_fusion_unique_io_buffers: int = 32
    # Most launch arguments (tensor pointers + sizes/strides/scalars) of one emitted kernel, as
    # the backend counts them for the kernel it would emit; Triton also refuses single nodes over it.
    max_kernel_args: int = 64
    # Fusion refuses a merge that would raise the estimated peak of live bytes more than this
    # fraction above the unfused graph's (0.0: fusion may never raise it).
    max_fusion_peak_growth: float = 0.05
    # Triton: on each kernel's first call per size, time a few launch configurations (block sizes,
    # warps) and keep the fastest, cached on disk (codegen/triton/autotune.py). Meant for GPUs.
    autotune: bool = False
    # Byte alignment of every buffer placed in an arena.
    alignment: int = 64
    # Op names (e.g. "aten.add.Tensor") always run as eager fallback calls, never by a backend.
    fallback_ops: frozenset = frozenset()
    # Let a pointwise op write its output over an input buffer that dies there (same layout).
    inplace: bool = True
    # Split each device's arena into several arenas by lifetime window (passes/memory.py), each
    # allocated just before its first buffer is written and dropped after its last buffer's last
    # use; False: one arena per device, held for the whole call.
    arena_windows: bool = True
    # Fill every arena with 0xFF bytes (NaN for floats) on each call: exposes reads of unwritten bytes.
    poison_arena: bool = False
    # Directory where an HTML report is written for every compiled graph (None: no reports).
    report_dir: str | None = None
    # Verify the graph between passes (lint, metadata, re-propagated fake values) and the plan.
    debug: bool = field(default_factory=lambda: _env_flag("FXFORGE_DEBUG"))

    def __post_init__(self) -> None:
        if self.decompose not in ("auto", "none", "core"):
            raise ValueError(
                f"Config.decompose={self.decompose!r}: expected 'auto', 'none' or 'core'"
            )
        if self.partitioner not in ("min_cut", "default"):
            raise ValueError(f"Config.partitioner={self.partitioner!r}: expected 'min_cut' or 'default'")
        for knob in ("max_fusion_size", "max_fusion_unique_io_buffers", "max_kernel_args", "alignment"):
            v = getattr(self, knob)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Config.{knob}={v!r}: expected a positive int")
        g = self.max_fusion_peak_growth
        if isinstance(g, bool) or not isinstance(g, (int, float)) or g < 0:
            raise ValueError(f"Config.max_fusion_peak_growth={g!r}: expected a fraction >= 0 (e.g. 0.05)")
        if self.alignment & (self.alignment - 1):
            raise ValueError(f"Config.alignment={self.alignment}: expected a power of two")
        object.__setattr__(self, "fallback_ops", frozenset(self.fallback_ops))

    def replace(self, **changes) -> "Config":
        return replace(self, **changes)
