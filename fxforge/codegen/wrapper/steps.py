"""The wrapper plan: what ``call(args)`` does, in order, as data (``plan.py`` computes it from the
schedule and the memory plan; ``source.py`` prints it as Python).

Each step is one statement of the call's body; the Python expressions inside them (a call of an
op, a view of an arena, a size read) are printed once, when the plan is made:

* ``Assign``: ``target = value`` (an input's size read, a buffer's view of its arena, an eager
  call, an arena's allocation), ``note`` a comment after it;
* ``Run``: an expression run for its effect (an arena poisoned, a value copied into its region of
  a cat, a symmetric arena's barrier);
* ``Note``: a comment line (why a node runs as it does);
* ``Launch``: a kernel called (its results bound to ``returns``), inside the profiler range
  ``range`` in the profiled variant;
* ``Guard``: a tensor an ATen kernel allocated, copied to its traced ``stride`` where it differs;
* ``Choose``: a tuned custom op's call, chosen by a size (``custom_ops.Dispatch``);
* ``Release``: the values (and arenas) dead at this point, deleted;
* ``Return``: the call's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from ..api import Kernel


@dataclass(frozen=True)
class Assign:
    target: str
    value: str
    note: str = ""


@dataclass(frozen=True)
class Run:
    expr: str
    note: str = ""


@dataclass(frozen=True)
class Note:
    text: str


@dataclass(frozen=True)
class Launch:
    kernel: str
    args: tuple[str, ...]
    returns: tuple[str, ...]
    range: str  # the profiler range of the profiled variant (``plan.kernel_range``)


@dataclass(frozen=True)
class Guard:
    name: str
    stride: str


@dataclass(frozen=True)
class Choose:
    """``target`` bound by the call of the first case whose bound ``size`` is at most (the last
    case's bound None: every size above the others')."""

    target: str
    size: str
    cases: tuple[tuple[int | None, str], ...]  # (bound, call)


@dataclass(frozen=True)
class Release:
    names: tuple[str, ...]


@dataclass(frozen=True)
class Return:
    value: str


Step = Union[Assign, Run, Note, Launch, Guard, Choose, Release, Return]


@dataclass
class KeptArenas:
    """Arenas kept across calls (``plan.memory.kept_bytes``): one block of ``nbytes`` on
    ``device``, the steps making the views in it (``setup``) and the names they bind, which
    ``call`` takes at its start (``runtime.KeptArenas``)."""

    nbytes: int
    block: str  # the block's allocation (an expression)
    setup: list[Step] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


@dataclass
class WrapperPlan:
    """One graph's wrapper as data: the inputs ``call`` unpacks, its ``steps``, the kept arenas
    (None: none), the kernels (their sources go first in the module), the values the source
    names (``globals``) and what the module's header says."""

    inputs: list[str]
    steps: list[Step]
    kept: KeptArenas | None
    kernels: list[Kernel]
    globals: dict[str, Any]
    arenas: int  # the plan's arenas (the header's count)
    op_spaces: list[str]  # the op namespaces bound at load (``runtime.bind_ops``)
    poison: bool  # kept arenas poisoned at each call's start (``Config.poison_arena``)
    recycled: bool  # the module makes a ``runtime.Recycled`` (``_recycled``)
    demoted: list[tuple[int, str]]  # groups whose kernel failed to compile: (group id, reason)
    ops: dict  # the ops bound at load: (namespace, name, overload) -> op
    units: dict  # what each backend's ``link`` was given (``KernelContext.units``), by backend
