"""The codegen registry: backend name -> ``CodegenBackend`` entry, and which one a graph gets.

The interface itself (``CodegenBackend``, ``Kernel``, ``KernelContext``, ``GroupCost``) lives in
``codegen/api.py``.  Register a backend with ``fxforge.register_backend``; select it with
``Config(codegen=name)``, or let ``Config(codegen="auto")`` choose from what the backends
declare (device types, priority, availability).  Nodes the selected backend refuses run as
eager fallbacks.

The built-in entries: ``torch`` (ATen out= calls, every device, the default) and ``triton``
(generated kernels; targets CUDA, runs on CPU under ``TRITON_INTERPRET=1``).  The triton entry
is made of ``deferred`` callables: its modules load on its first use, not at ``import fxforge``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

from .api import CodegenBackend, deferred

if TYPE_CHECKING:  # types only: config.py asks this registry which backend names exist
    from ..core.config import Config

log = logging.getLogger("fxforge")


class Registry:
    """Name -> backend.  fxforge keeps one default instance; tests may build their own."""

    def __init__(self) -> None:
        self._backends: dict[str, CodegenBackend] = {}  # in registration order (ties of "auto")
        self._warned: set[tuple[str, str]] = set()  # (backend, reason) already logged

    def register(self, backend: CodegenBackend, *, replace: bool = False) -> CodegenBackend:
        if not replace and backend.name in self._backends:
            raise ValueError(f"codegen backend {backend.name!r} is already registered (pass replace=True)")
        if backend.name in ("fallback", "auto"):
            raise ValueError(f"{backend.name!r} is reserved (Config.codegen / nodes no backend runs)")
        self._backends[backend.name] = backend
        return backend

    def unregister(self, name: str) -> None:
        self._backends.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._backends)

    def describe(self) -> str:
        """One entry per backend: its name and what it declares it does."""
        return "; ".join(f"{n} ({self._backends[n].description})" if self._backends[n].description else n
                         for n in self.names())

    def get(self, name: str) -> CodegenBackend:
        if name not in self._backends:
            raise ValueError(
                f"unknown codegen backend {name!r}; registered: {self.describe()} "
                "(register one with fxforge.register_backend)"
            )
        return self._backends[name]

    def check(self, config: Config) -> None:
        """``config``'s backend is one of this registry's, and its kernel-argument bound holds:
        a ValueError naming the knob otherwise (every entry point checks the Config it is given
        against the registry it uses)."""
        name = config.codegen
        if name == "auto":
            return
        if name not in self._backends:
            raise ValueError(
                f"Config.codegen={name!r}: unknown codegen backend; expected 'auto' or one of: "
                f"{self.describe()} (register yours with fxforge.register_backend first, or pass your "
                "registry to the entry point)"
            )
        bound = self._backends[name].max_kernel_args
        if bound is not None and config.max_kernel_args > bound:
            raise ValueError(
                f"Config.max_kernel_args={config.max_kernel_args!r}: the {name} backend's kernels take at most {bound} "
                f"launch arguments; set max_kernel_args <= {bound} (with codegen='auto' the lower limit applies by "
                "itself)"
            )

    def select(self, config: Config, device_types: Iterable[str]) -> CodegenBackend:
        """The backend ``config.codegen`` names, or for "auto" the highest-priority available
        backend targeting every device type of the graph (ties: the one registered first)."""
        devices = frozenset(device_types) or frozenset({"cpu"})
        self.check(config)
        if config.codegen != "auto":
            b = self.get(config.codegen)
            why = b.unavailable(devices) if b.unavailable is not None else None
            if why and (b.name, why) not in self._warned:
                self._warned.add((b.name, why))
                instead = (f"the {b.extern} backend's calls (eager fallbacks where it refuses them)" if b.extern
                           else "eager fallbacks")
                log.warning("fxforge: Config(codegen=%r) cannot run here: %s; its nodes run as %s", b.name, why, instead)
            return b
        best: CodegenBackend | None = None
        for b in self._backends.values():
            if not devices <= set(b.devices) or (best is not None and b.priority <= best.priority):
                continue
            if b.unavailable is None or b.unavailable(devices) is None:
                best = b
        if best is None:
            raise ValueError(
                f"no registered codegen backend targets device types {sorted(devices)} "
                f"(registered: {', '.join(f'{b.name} {b.devices}' for b in self._backends.values())})"
            )
        return best


_TRITON = "fxforge.codegen.triton.backend"


_C = "fxforge.codegen.c.backend"
# The launcher passes a kernel's arguments in arrays on the C stack: a bound keeps them small.
C_MAX_KERNEL_ARGS = 1024


def _default_registry() -> Registry:
    from . import torch_backend

    reg = Registry()
    reg.register(torch_backend.BACKEND)
    reg.register(CodegenBackend(
        name="triton",
        devices=("cuda",),
        accepts=deferred(_TRITON, "accepts"),
        compile=deferred(_TRITON, "compile_group"),
        fuses=True,
        overwrites_inputs=True,
        fusion_cost=deferred(_TRITON, "fusion_cost"),
        fusion_facts=deferred(_TRITON, "fusion_facts"),
        decompose="core",
        priority=10,
        unavailable=deferred(_TRITON, "unavailable"),
        writes_views=deferred(_TRITON, "writes_views"),
        reads_planned=True,
        extern="torch",
        description="Triton kernels (pointwise, reductions, fused); CPU only under TRITON_INTERPRET=1",
    ))
    reg.register(CodegenBackend(
        name="c",
        devices=("cpu",),
        accepts=deferred(_C, "accepts"),
        compile=deferred(_C, "compile_group"),
        fuses=True,
        overwrites_inputs=True,
        fusion_cost=deferred(_C, "fusion_cost"),
        fusion_facts=deferred(_C, "fusion_facts"),
        decompose="none",
        splits=("aten.native_layer_norm.default", "aten._log_softmax.default",
                "aten._log_softmax_backward_data.default", "aten._softmax_backward_data.default",
                "aten._native_batch_norm_legit_no_training.default", "aten._native_batch_norm_legit_functional.default",
                "aten.native_batch_norm_backward.default", "aten.nll_loss_forward.default",
                "aten.nll_loss_backward.default"),
        priority=5,
        unavailable=deferred(_C, "unavailable"),
        writes_views=deferred(_C, "writes_views"),
        reads_planned=True,
        extern="torch",
        link=deferred("fxforge.codegen.c.launcher", "link"),
        ahead=deferred(_C, "kernels_ahead"),
        seal=deferred("fxforge.codegen.c.build", "seal"),
        save_unit=deferred("fxforge.codegen.c.build", "save_unit"),
        load_unit=deferred("fxforge.codegen.c.build", "load_unit"),
        max_kernel_args=C_MAX_KERNEL_ARGS,
        description="fused C kernels for CPU (pointwise chains, row reductions), built with the system C compiler",
    ))
    return reg


DEFAULT_REGISTRY = _default_registry()


def register_backend(backend: CodegenBackend, *, replace: bool = False) -> CodegenBackend:
    """Make ``backend`` selectable by name in ``Config(codegen=...)``."""
    return DEFAULT_REGISTRY.register(backend, replace=replace)
