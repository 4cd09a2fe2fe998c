"""Codegen backends: a registry entry with a capability check, not a class hierarchy.

A backend is a ``CodegenBackend``: a name, the device types it runs on, ``accepts(node, config)``
(None when it can run the node, else the reason it cannot) and ``compile(group, ctx)`` returning
a ``Kernel``: Python source defining one function that the generated wrapper calls with the
group's input values and output buffers.  Register one with ``register_backend``; select it
with ``Config(codegen=name)``.  Nodes the selected backend refuses run as eager fallbacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch.fx as fx

from ..config import Config
from ..plan import Group


@dataclass
class Kernel:
    """One compiled group: ``source`` defines a function ``name`` taking ``args`` in order."""

    name: str
    source: str
    # Wrapper-level values the call passes (input values first, then output buffers).
    args: list[str]
    # Names ``source`` needs besides ``torch``, ``operator`` and ``math``.
    globals: dict[str, Any] = field(default_factory=dict)
    node_count: int = 1
    unique_io_buffers: int = 0
    # Launch arguments of the emitted kernel (pointers + sizes/strides/scalars); None: len(args).
    launch_args: int | None = None
    # Wrapper variables bound from the call's return value (outputs the kernel allocates itself).
    returns: list[str] = field(default_factory=list)
    # The backend that compiled it (filled in by the wrapper from the group).
    backend: str = ""

    @property
    def num_args(self) -> int:
        return self.launch_args if self.launch_args is not None else len(self.args)


@dataclass(frozen=True)
class GroupCost:
    """What the kernel a backend would emit for a candidate group needs (fusion's limits)."""

    num_args: int  # launch arguments: tensor pointers + sizes/strides/scalars
    unique_io_buffers: int  # distinct storages read or written


@dataclass
class KernelContext:
    """What a backend may ask the wrapper while compiling a group."""

    name: str  # the kernel's function name
    ref: Callable[[fx.Node], str]  # wrapper variable holding a node's value
    buffer: Callable[[fx.Node, int | None], str]  # wrapper variable of a planned output buffer
    const: Callable[[Any], str]  # a global name for a constant that has no literal form
    config: Config


@dataclass(frozen=True)
class CodegenBackend:
    name: str
    devices: tuple[str, ...]
    accepts: Callable[[fx.Node, Config], str | None]
    compile: Callable[[Group, KernelContext], Kernel]
    description: str = ""
    # True for nodes whose kernel allocates its own outputs instead of writing planned buffers.
    allocates: Callable[[fx.Node, Config], bool] | None = None
    # A group is one kernel whose intermediate values stay in registers (only the group's outputs
    # are written to buffers). False: the group's nodes run one after another, each writing its own.
    fuses: bool = False
    # ``fusion_cost(nodes, outputs, config)``: the GroupCost of the one kernel the backend would
    # emit for these nodes (``outputs``: those used outside), or why it cannot emit one.
    # None: the backend runs single-node groups only (the fusion pass leaves its groups alone).
    fusion_cost: Callable[[list[fx.Node], list[fx.Node], Config], "GroupCost | str"] | None = None


class Registry:
    """Name -> backend.  fxforge keeps one default instance; tests may build their own."""

    def __init__(self) -> None:
        self._backends: dict[str, CodegenBackend] = {}
        self._loaders: dict[str, Callable[[], CodegenBackend]] = {}

    def register(self, backend: CodegenBackend, *, replace: bool = False) -> CodegenBackend:
        if not replace and backend.name in self._backends:
            raise ValueError(f"codegen backend {backend.name!r} is already registered (pass replace=True)")
        if backend.name == "fallback":
            raise ValueError("'fallback' is reserved for nodes no backend runs")
        self._backends[backend.name] = backend
        return backend

    def register_lazy(self, name: str, loader: Callable[[], CodegenBackend]) -> None:
        """Register a backend whose module is imported only when first selected."""
        self._loaders[name] = loader

    def unregister(self, name: str) -> None:
        self._backends.pop(name, None)
        self._loaders.pop(name, None)

    def names(self) -> list[str]:
        return sorted(set(self._backends) | set(self._loaders))

    def get(self, name: str) -> CodegenBackend:
        if name not in self._backends and name in self._loaders:
            self._backends[name] = self._loaders.pop(name)()
        if name not in self._backends:
            raise ValueError(
                f"unknown codegen backend {name!r}; registered: {', '.join(self.names())} "
                "(register one with fxforge.register_backend)"
            )
        return self._backends[name]

    def select(self, config: Config, device_types: set[str]) -> CodegenBackend:
        """The backend ``config.codegen`` names; "auto" is triton on CUDA, torch elsewhere."""
        name = config.codegen
        if name == "auto":
            name = "triton" if "cuda" in device_types and "triton" in self.names() else "torch"
        return self.get(name)


def _default_registry() -> Registry:
    from . import torch_backend

    reg = Registry()
    reg.register(torch_backend.BACKEND)
    try:
        from .triton import backend as _triton_backend  # noqa: F401  (registered by the triton issue)
    except ImportError:
        pass
    else:
        reg.register_lazy("triton", _triton_backend.load)
    return reg


DEFAULT_REGISTRY = _default_registry()


def register_backend(backend: CodegenBackend, *, replace: bool = False) -> CodegenBackend:
    """Make ``backend`` selectable by name in ``Config(codegen=...)``."""
    return DEFAULT_REGISTRY.register(backend, replace=replace)
