"""The plan: what the passes decided, in the form codegen consumes (graph -> plan -> code).

* ``Group``: nodes one backend runs as one kernel, in schedule order.
* ``Buffer``: one planned output storage: where it lives (an arena region, or a fresh
  allocation when it escapes to the caller), its dtype, shape, stride and live range.
* ``MemoryPlan``: every buffer plus the arenas (per device, one per window of the schedule).
* ``Plan``: schedule + groups + memory plan.
* ``Region``: an ``invoke_subgraph`` body compiled once, called from each node invoking it.

Sizes, strides and offsets are sympy expressions over the graph's size symbols; ``hint``
evaluates them at the sizes of the traced example inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import sympy
import torch
import torch.fx as fx

from .graph import hint, node_kind


@dataclass
class Group:
    id: int
    backend: str
    nodes: list[fx.Node]
    # Values read from outside the group (tensors and scalars), in first-use order.
    inputs: list[fx.Node] = field(default_factory=list)
    # Values of this group used after it or returned (each written into a buffer).
    outputs: list[fx.Node] = field(default_factory=list)
    # Why the group runs as an eager fallback (backend == "fallback" only).
    reason: str = ""
    # The backend runs the group as one kernel (``CodegenBackend.fuses``): values inside it never
    # reach memory, only ``outputs`` get buffers, and all its reads and writes happen together.
    fused: bool = False
    # A fused kernel of one output may write it over an input it reads (``CodegenBackend.overwrites_inputs``).
    overwrites_inputs: bool = False


@dataclass(eq=False)
class Region:
    """An ``invoke_subgraph`` body compiled once by the spine (``spine.compile_regions``), called
    by the kernel of every node invoking it (``sites``): the region itself is what the generated
    code calls, ``region(args)``, which runs ``call``, the body's generated ``call(args)``, once
    the spine has finished the body (``finish``: links and loads it, giving its ``Compiled``).
    A body that failed to finish runs eagerly (``call``: its graph module) and says why
    (``failed``)."""

    name: str
    call: Callable[[list], Any] | None = None
    compiled: Any = None
    sites: list[str] = field(default_factory=list)
    finish: Callable[[], Any] | None = None
    body: Any = None  # the body's graph module
    failed: str = ""

    def __post_init__(self) -> None:
        self.__name__ = f"region_{self.name}"  # (its name as a global of the generated code)

    def __call__(self, args: list) -> Any:
        return self.call(args)


def group_outputs(nodes: list[fx.Node], graph_outputs: set[fx.Node]) -> list[fx.Node]:
    """The compute nodes of a group whose values are used outside it or returned."""
    if len(nodes) == 1:  # (every group before fusion: any user is outside it)
        n = nodes[0]
        return [n] if node_kind(n) == "compute" and (n in graph_outputs or n.users) else []
    members = set(nodes)
    return [n for n in nodes
            if node_kind(n) == "compute" and (n in graph_outputs or any(u not in members for u in n.users))]


@dataclass
class Buffer:
    name: str
    # The compute node writing it, and which of its outputs (None: its only output).
    producer: fx.Node
    index: int | None
    dtype: torch.dtype
    device: torch.device
    shape: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    nbytes: sympy.Expr
    # "arena": a region of ``arena`` at ``offset``; "fresh": allocated per call (escapes to caller);
    # "slice": a region of buffer ``base`` (zero-copy cat/pad: its producer writes into its place).
    kind: str
    start: int
    end: int
    arena: str | None = None
    offset: sympy.Expr | None = None
    # The buffer whose bytes this one takes over in place (it dies where this one is written).
    reuses: str | None = None
    # kind "slice": the buffer this one is a region of, and the region's start in each of its dims
    # (the region has this buffer's shape; its strides are the base's), or, ``flat``, the start of
    # the run of a 1-D base this buffer fills, laid out as traced (a flattened input of a cat).
    base: str | None = None
    region: tuple[sympy.Expr, ...] | None = None
    # In a symmetric arena: the last position a collective reads it (peers may read it until the
    # next fence; ``end`` holds it that long).
    released: int | None = None
    # kind "fresh": allocated over the bytes it had on an earlier call when nothing holds them any
    # more (``Config.recycle_outputs``; ``runtime.Recycled``).
    recycled: bool = False

    @property
    def flat(self) -> bool:
        """A region that is a run of a 1-D base, laid out as traced (not in the base's strides)."""
        return self.region is not None and len(self.region) != len(self.shape)

    def extent(self) -> tuple[sympy.Expr, ...]:
        """The region's sizes in its base's dims."""
        return (sympy.Mul(*self.shape),) if self.flat else self.shape


@dataclass
class Arena:
    name: str
    device: torch.device
    nbytes: sympy.Expr
    # Which placement produced the offsets ("size", "breadth", ... or "slots" for symbolic sizes).
    planner: str = ""
    # Live range (schedule positions): from its first buffer's start to its last buffer's end.
    # The wrapper allocates it just before that first buffer is written and drops it with the
    # last of its buffers.
    start: int = 0
    end: int = 0
    # A symmetric-memory arena (passes/symmetric.py): its process group, its allocation id (from
    # the graph), whether each call starts with a barrier, and the fence points (schedule
    # positions; a barrier after position p is at p + 0.5).  It persists across calls.
    symmetric: str | None = None
    alloc_id: int | None = None
    start_barrier: bool = False
    fences: tuple[float, ...] = ()
    # Kept arenas (``MemoryPlan.kept_bytes``): where this one sits in the block made once.
    block_offset: int | None = None


@dataclass(frozen=True)
class PeakParts:
    """What a memory plan holds at its peak (``MemoryPlan.peak_bytes``): its arenas, the storages
    outside them (outputs, saved values, self-allocating kernels' results), and the scratch an
    eager op allocates inside itself there (``workspace_of`` names the op)."""

    arenas: int
    storages: int
    workspace: int
    workspace_of: str | None = None


@dataclass
class MemoryPlan:
    buffers: dict[str, Buffer]
    arenas: list[Arena]
    alignment: int
    shape_env: object = None
    # Barriers the plan needs, as (node after which, symmetric arena): passes/symmetric.py.
    barriers: list[tuple[str, str]] = field(default_factory=list)
    # Bytes of the one block holding every (non-symmetric) arena when they are kept across calls
    # (``Config.keep_arenas``; static sizes); 0: each arena is allocated per call over its window.
    kept_bytes: int = 0
    # The most bytes the plan has live at once around its kernel calls, at the traced sizes: arenas
    # as allocated, and the storages outside them (outputs, self-allocating kernels' results, a
    # backward's saved inputs until their last use); the caller's inputs are not counted.
    peak_bytes: int = 0
    peak_parts: PeakParts | None = None  # (where they were at the peak)

    def __post_init__(self) -> None:
        self._slots = {(b.producer, b.index): b for b in self.buffers.values()}

    def of(self, producer: fx.Node, index: int | None) -> Buffer | None:
        """The buffer written for output ``index`` of ``producer`` (None: not planned)."""
        return self._slots.get((producer, index))

    @property
    def recycled_bytes(self) -> int:
        """Bytes of the fresh buffers handed out again over an earlier call's bytes
        (``Buffer.recycled``: static sizes)."""
        return sum(int(b.nbytes) for b in self.buffers.values() if b.recycled)

    def hint(self, e) -> int:
        return hint(e, self.shape_env)

    def root(self, b: Buffer) -> Buffer:
        """The buffer holding ``b``'s bytes: ``b``, or for a slice the outermost buffer it is a region of."""
        while b.kind == "slice":
            b = self.buffers[b.base]
        return b

    def region_text(self, b: Buffer) -> str:
        """``b``'s region in its base, at the traced sizes: ``0:64, 48:96``."""
        return ", ".join(f"{self.hint(s)}:{self.hint(s + n)}" for s, n in zip(b.region, b.extent()))

    def dump(self) -> str:
        """One line per buffer: name, where it lives, size, live range (at traced sizes)."""
        rows = [("buffer", "where", "offset", "bytes", "live", "dtype", "shape")]
        for b in sorted(self.buffers.values(), key=lambda b: (b.kind, b.arena or "", self.hint(b.offset or 0))):
            rows.append(
                (
                    b.name,
                    b.arena if b.kind == "arena" else f"in {b.base}[{self.region_text(b)}]" if b.kind == "slice" else "fresh",
                    str(self.hint(b.offset)) if b.offset is not None else "-",
                    str(self.hint(b.nbytes)),
                    f"{b.start}..{b.end}" + (f" (in place of {b.reuses})" if b.reuses else ""),
                    str(b.dtype).replace("torch.", ""),
                    "(" + ", ".join(str(s) for s in b.shape) + ")",
                )
            )
        for a in self.arenas:
            rows.append((a.name, str(a.device), "", str(self.hint(a.nbytes)), f"{a.start}..{a.end}", "uint8", ""))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


@dataclass
class Plan:
    schedule: list[fx.Node]
    groups: list[Group]
    memory: MemoryPlan

    def __post_init__(self) -> None:
        self._group_of = {n: g for g in self.groups for n in g.nodes}

    def group_of(self, node: fx.Node) -> Group | None:
        return self._group_of.get(node)
