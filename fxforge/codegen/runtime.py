"""Objects generated wrappers use at run time (``wrapper/`` puts them in the source's globals).

* ``bind_ops``: the ops a wrapper calls, by namespace: ``aten.mm.out(a, b, out=c)`` in the source
  is ``torch.ops.aten.mm.out``, bound once at load to the dispatcher entry that
  ``OpOverload.__call__`` forwards to, so a call costs no attribute path under ``torch.ops`` and no
  Python frame.
* ``PUBLIC_OUT``: out= overloads called through torch's generated Python binding (``torch.mm(a, b,
  out=c)``), which parses its arguments in C++ without the dispatcher's generic Python path: about
  0.5 us less a call, and matmuls are most of a small model's extern calls.  Each binding,
  given ``out=`` and the overload's other arguments as the wrapper passes them, resolves to that
  overload (``tests/test_overhead.py`` checks it).
* ``empty_strided_cpu``: a fresh CPU buffer without the keyword parsing of ``torch.empty_strided``
  (torch's own fast path where this torch has it: 0.4 us against 1.1 us).
* ``as_traced``: a tensor copied to the layout it was traced with (``wrapper.steps.Guard``).
* ``reinterpret``: a tensor over its base's storage at given sizes and strides, ``offset`` elements
  past its base's start (``reinterpret(x, size, stride, offset)``), without a view function or
  argument parsing (torch's own fast path where this torch has it: 0.56 us against 1.4 us for
  ``x.view(shape)`` and 2.3 us for ``aten._unsafe_view``); like ``_unsafe_view``'s result, no
  autograd view of its base.  The wrapper makes the views of values laid out as traced this way
  (``_Planner.reinterpreted``).
* ``KeptArenas``: a static graph's arenas and the views of their buffers, made on the first call
  and reused by every later call that finds them free; a call made while another holds them (a
  re-entrant call, another thread) makes its own, as a graph without kept arenas does.
* ``Recycled``: fresh buffers allocated over the bytes they had on one of the last two calls,
  when the caller holds nothing of them any more (``Buffer.recycled``).
"""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import torch

aten = torch.ops.aten
PUBLIC_OUT: dict[torch._ops.OpOverload, str] = {
    aten.mm.out: "torch.mm", aten.addmm.out: "torch.addmm", aten.bmm.out: "torch.bmm",
    aten.baddbmm.out: "torch.baddbmm",
}


def _empty_strided_cpu_fallback(size: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


try:
    from torch._C._dynamo.guards import _empty_strided_cpu as empty_strided_cpu
except ImportError:  # pragma: no cover - older or trimmed builds
    empty_strided_cpu = _empty_strided_cpu_fallback


def _reinterpret_fallback(t: torch.Tensor, size: tuple, stride: tuple, offset: int) -> torch.Tensor:
    """``reinterpret`` where torch lacks its own: a tensor of its own over ``t``'s storage (as
    torch's, no autograd view of ``t``)."""
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset() + offset, size, stride)


try:
    from torch._C._dynamo.guards import _reinterpret_tensor as reinterpret
except ImportError:  # pragma: no cover - older or trimmed builds
    reinterpret = _reinterpret_fallback


def entry(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """What calling ``op`` calls: ``OpOverload.__call__`` is ``self._op(*args, **kwargs)``; other
    kinds of overloads (torchbind, ops dispatched in Python) keep their own ``__call__``."""
    return op._op if type(op) is torch._ops.OpOverload and callable(getattr(op, "_op", None)) else op


def bind_ops(ops: dict[tuple[str, str, str], torch._ops.OpOverload]) -> dict[str, SimpleNamespace]:
    """(namespace, name, overload) -> op, as namespaces: ``out["aten"].mm.out``."""
    spaces: dict[str, dict[str, dict[str, Any]]] = {}
    for (ns, name, overload), op in ops.items():
        spaces.setdefault(ns, {}).setdefault(name, {})[overload] = entry(op)
    return {ns: SimpleNamespace(**{n: SimpleNamespace(**ovs) for n, ovs in names.items()})
            for ns, names in spaces.items()}


class KeptArenas:
    """The views ``make()`` returns (arenas and the buffers in them), made once and lent to one
    call at a time."""

    def __init__(self, make: Callable[[], tuple]):
        self._make = make
        self._views: tuple | None = None
        self._lock = threading.Lock()

    def take(self) -> tuple:
        if self._lock.acquire(blocking=False):
            if self._views is None:
                try:
                    self._views = self._make()
                except BaseException:
                    self._lock.release()
                    raise
            return self._views
        return self._make()  # held by a running call: this call gets arenas of its own

    def give(self, views: tuple) -> None:
        if views is self._views:
            self._lock.release()


_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _hold(t: torch.Tensor) -> tuple[torch.UntypedStorage, torch.Tensor]:
    """What ``Recycled`` keeps of a buffer it handed out: its storage object (the one every
    ``untyped_storage()`` of that storage returns while it lives) and a tensor of its own over it."""
    return t.untyped_storage(), reinterpret(t, tuple(t.shape), t.stride(), 0)


def _counts(held: tuple[torch.UntypedStorage, torch.Tensor]) -> tuple[int, int]:
    """References to a held storage: to its Python object, and to the storage itself."""
    storage = held[0]
    return sys.getrefcount(storage), _use_count(storage._cdata)


# the counts of a held buffer once nothing else refers to it (measured: they depend on how this
# torch keeps a storage's Python object alive); None: this torch cannot tell, nothing is recycled
_FREE = _counts(_hold(torch.empty(1))) if _use_count is not None else None


class Recycled:
    """A graph's recycled fresh buffers (``Buffer.recycled``), by name: the bytes each had on the
    last two calls, handed out again when nothing but this object refers to them -- no tensor,
    view or storage object of what that call returned is alive -- and otherwise a fresh
    allocation that takes the older one's place.  Two, for the loop ``out = f(x)``: the name
    still holds the last result while the next call runs.  No lock: a call takes a buffer's
    entries out before it checks them, so two calls at once never share one (the other
    allocates fresh)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, tuple[tuple[torch.UntypedStorage, torch.Tensor], ...]] = {}

    def empty(self, name: str, size: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
        held = self._held.pop(name, ())
        for h in held:
            if _counts(h) == _FREE:
                self._held[name] = held
                return reinterpret(h[1], size, stride, 0)
        t = empty_strided_cpu(size, stride, dtype)
        if _FREE is not None:
            self._held[name] = held[-1:] + (_hold(t),)
        return t


def same_layout(t: torch.Tensor, stride: Sequence[int]) -> bool:
    """``t`` is laid out at ``stride`` (the strides of size-1 dims, and an empty tensor's, carry
    no meaning)."""
    return t.numel() == 0 or all(w == g or s == 1 for w, g, s in zip(stride, t.stride(), t.shape))


def as_traced(t: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """``t``, or a copy of it laid out at ``stride`` where it is not: the layout a graph was traced
    or compiled with, at which generated kernels index it (a caller's transposed input,
    ``inputs.check_inputs``; a tensor an ATen kernel returned in another layout than its meta
    function traced, ``wrapper.steps.Guard``)."""
    if same_layout(t, stride):
        return t
    return torch.empty_strided(tuple(t.shape), tuple(stride), dtype=t.dtype, device=t.device).copy_(t)
