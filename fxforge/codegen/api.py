"""The codegen backend interface: what a backend declares, what it is given, what it returns.

This module imports no backend.  Passes that need to ask a backend something (assignment,
fusion) import only this module; the registry (``registry.py``) and the wrapper
(``wrapper/``) sit above it, the backends beside it.

A backend is a ``CodegenBackend``: a registry entry with capability checks, not a class to
subclass.  ``accepts(node, config)`` says whether it can run a node (None) or why not;
``compile(group, ctx)`` returns a ``Kernel``: Python source defining one function that the
generated wrapper calls with the group's input values and output buffers.  What it needs
(device types, decompositions, its rank among backends) it declares as data, and
``Registry.select`` honours it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from typing import TYPE_CHECKING

import torch.fx as fx

if TYPE_CHECKING:  # types only: config.py asks the registry (built on this module) about names
    from ..core.config import Config
    from ..core.plan import Group


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
    # What the backend emitted, in its own terms, for tools (``Config.on_kernel``): the Triton
    # backend's ``Emitted`` (kernel source, kind, parameters); None where a backend says nothing.
    detail: Any = None

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
    # The planned layout of a node's value (output ``index``): (sizes, strides) over the graph's
    # symbols; the traced layout unless the plan placed it in a region of a larger buffer.
    layout: Callable[[fx.Node, int | None], tuple[tuple, tuple]] | None = None
    # Source calling an OpOverload from the kernel (``aten.mm.out``: bound once at load); None:
    # use its ``torch.ops`` path.
    op: Callable[[Any], str] | None = None
    # Per-wrapper state a backend keeps between its groups, by backend name (what its ``link``
    # is given once every group is compiled): e.g. the C sources compiled together.
    units: dict[str, Any] = field(default_factory=dict)


DECOMPOSE_LEVELS = ("none", "core")


@dataclass(frozen=True)
class CodegenBackend:
    name: str
    # Device types the backend targets: ``Config(codegen="auto")`` picks among the backends
    # targeting every device type of the graph.  Named explicitly, a backend may still run
    # elsewhere; its ``accepts`` decides node by node.
    devices: tuple[str, ...]
    accepts: Callable[[fx.Node, Config], str | None]
    compile: Callable[[Group, KernelContext], Kernel]
    description: str = ""
    # True for nodes whose kernel allocates its own outputs instead of writing planned buffers.
    allocates: Callable[[fx.Node, Config], bool] | None = None
    # A group is one kernel whose intermediate values stay in registers (only the group's outputs
    # are written to buffers). False: the group's nodes run one after another, each writing its own.
    fuses: bool = False
    # A fused kernel with one output per element reads each element of its inputs (and each row
    # its folds reduce) before it writes the same element (row) of that output: the memory plan
    # may then write the output over an input of the same layout that dies there
    # (``passes/memory.py``, ``group_inplace_source``).
    overwrites_inputs: bool = False
    # ``fusion_cost(nodes, outputs, config)``: the GroupCost of the one kernel the backend would
    # emit for these nodes (``outputs``: those used outside), or why it cannot emit one.
    # None: the backend runs single-node groups only (the fusion pass leaves its groups alone).
    fusion_cost: Callable[[list[fx.Node], list[fx.Node], Config], "GroupCost | str"] | None = None
    # ``fusion_facts(node)``: facts of a one-node group (None: ``fusion_cost`` must answer) that
    # the fusion pass merges as groups merge (``.merge(other, members, nodes, outputs)``, None
    # where they cannot say) and asks for the cost (``.cost()``: a GroupCost, or why not) instead
    # of calling ``fusion_cost``, and ``.regroup(nodes, outputs)``: facts of a group the merge made
    # without them (``fusion_cost`` answered, a view was copied in), or None:
    # ``codegen/ir/facts.py``'s ``pointwise_facts`` and ``node_facts``.
    # Their answer must be ``fusion_cost``'s (checked for every merge in debug mode).  None: every
    # merge asks ``fusion_cost``.
    fusion_facts: Callable[[fx.Node], Any] | None = None
    # What ``Config(decompose="auto")`` means for this backend's graphs: "none" (ATen as traced:
    # each node a kernel eager would run) or "core" (core ATen, softmax and layer norm split into
    # pointwise + reduction nodes: what a fusing code generator wants).
    decompose: str = "core"
    # Composite ops split on the compiled graph itself (``lowering/splits.py``), for a backend
    # that keeps ATen's composite kernels but fuses these better (``"aten.native_layer_norm.default"``:
    # the norm with the residual add before it); the backward keeps ATen's kernel for their gradient.
    splits: tuple[str, ...] = ()
    # ``Config(codegen="auto")`` picks the highest priority among the backends targeting the
    # graph's devices; ties go to the backend registered first (the built-in ``torch`` backend).
    priority: int = 0
    # ``unavailable(device_types)``: why the backend cannot run on these device types in this
    # process (a missing package, a missing environment variable), with the fix; None: it can.
    # "auto" skips an unavailable backend; one named explicitly is used with a warning (its nodes
    # then run as eager fallbacks, each with its reason).
    unavailable: Callable[[frozenset[str]], str | None] | None = None
    # Zero-copy cat/pad (passes/padcat.py): ``writes_views(node, config)``: the kernel for ``node``
    # can write its output into a strided region of a larger buffer (None: never);
    # ``reads_views``: every kernel reads its inputs through their actual strides (a value may then
    # live in such a region), rather than indexing with the strides traced.
    writes_views: Callable[[fx.Node, "Config"], bool] | None = None
    reads_views: bool = False
    # ``reads_planned``: a kernel reads a value that lives in such a region at the layout the plan
    # gives it (``KernelContext.layout``), but indexes views of it with their traced strides.
    reads_planned: bool = False
    # The backend that runs the nodes this one refuses (its extern calls: matmuls, sorts, custom
    # ops with out variants...) into planned buffers, before they fall back to eager; None: none.
    extern: str | None = None
    # ``link(unit)``: called once per wrapper, after its groups are compiled, with what the
    # backend's ``compile`` left in ``KernelContext.units[name]``; returns wrapper globals the
    # kernels' sources use (e.g. compiled functions: built together per wrapper, not per group).
    link: Callable[[Any], dict[str, Any]] | None = None
    # ``ahead(groups, config, units)``: called once per wrapper before its schedule and memory
    # plan, with its fused groups in program order and the ``units`` its ``compile`` calls will be
    # given (``KernelContext.units``): the backend may emit kernels under the layouts it expects
    # the plan to give and start building them; ``compile`` must still give each group the kernel
    # its plan asks for.
    ahead: Callable[[list[Group], Config, dict], None] | None = None
    # ``seal(unit)``: called once per wrapper when its groups are all compiled, before ``link``
    # (which may come later: a region's body is linked with its caller): the backend may start
    # on what is left (the C backend builds its last translation units).  None: nothing to do.
    seal: Callable[[Any], None] | None = None
    # ``save_unit(unit)``: what ``link`` was given, as JSON-able data; ``load_unit(data)``: the unit
    # back, for ``link`` in another process (the compiled-graph cache stores a wrapper this way).
    # None: wrappers with units of this backend are compiled in every process.
    save_unit: Callable[[Any], Any] | None = None
    load_unit: Callable[[Any], Any] | None = None
    # The most launch arguments one of its kernels can take (None: no bound of its own): the
    # limit fusion and ``accepts`` use is the lower of this and ``Config.max_kernel_args``
    # (``kernel_args_limit``); a Config naming the backend with a higher limit is refused.
    max_kernel_args: int | None = None

    def __post_init__(self) -> None:
        if self.decompose not in DECOMPOSE_LEVELS:
            raise ValueError(
                f"CodegenBackend {self.name!r}: decompose={self.decompose!r}; expected one of {DECOMPOSE_LEVELS}"
            )
        if isinstance(self.devices, str) or not all(isinstance(d, str) for d in self.devices):
            raise ValueError(f"CodegenBackend {self.name!r}: devices={self.devices!r}; expected a tuple of device types")


def kernel_args_limit(backend: CodegenBackend | None, config: Config) -> float:
    """The most launch arguments a kernel of ``backend`` may take under ``config``."""
    bound = backend.max_kernel_args if backend is not None and backend.max_kernel_args is not None else float("inf")
    return min(config.max_kernel_args, bound)


def deferred(module: str, attr: str) -> Callable[..., Any]:
    """A callable standing for ``module.attr``, imported on its first call.

    A backend entry made of deferred callables costs nothing to register: its module (and what
    that imports) loads when the backend is first used, not at ``import fxforge``."""
    target: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not target:
            target.append(getattr(importlib.import_module(module), attr))
        return target[0](*args, **kwargs)

    call.__name__ = attr
    call.__qualname__ = f"deferred({module}.{attr})"
    return call
