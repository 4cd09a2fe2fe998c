"""Out variants: the overload of an op that writes its results into tensors it is given.

A functional op ``f(args) -> (Tensor, ...)`` has an *out variant* ``f.out(args, *, Tensor(a!)
out0, ...) -> (Tensor(a!), ...)``: the same arguments (names and types, in order) plus one mutable,
keyword-only ``out`` tensor per return, in return order (``out`` when there is one return, any
names for several).  The codegen backends call it with planned buffers, so the results of
ATen ops and custom operators land straight in the memory plan's arenas: no allocation per call,
and buffers reused across the graph like any other.

``out_variant(op)`` finds it: an explicit registration first (``register_out_variant``, for an
out form living in another op or namespace), else the overload of the same packet whose schema
is the functional one plus the outs.  ``usable_on(variant, device_type)`` says whether calling it
on a device saves anything: for ATen/prims ops only an out overload with a real kernel for the
device (a composite out overload runs the functional op and copies); for any other namespace, an
out overload with any kernel for the device or a composite one (its author wrote it).  An out
argument that shares an alias set with an input (``g.out(Tensor(a) x, *, Tensor(a!) out)``)
declares that the op may write its result over that input: the memory planner then lets it run
in place when the input dies there.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# ATen out= overloads that misbehave into a planned buffer: they run functionally instead.  Found
# by tests/test_opinfo.py (OutOverloadCheck), measured on torch 2.13 CPU.  With reduction="mean" /
# "sum" these loss kernels use ``out`` as scratch for the unreduced loss: they resize the 0-dim
# ``out`` to the input's shape, which inside an arena overwrites the neighbouring buffers.
BROKEN_OUT_OVERLOADS: dict[str, str] = {
    # ...and the reduced value it returns is wrong too (0.74 instead of 1.03)
    "aten::binary_cross_entropy": "out= resizes out to the input's shape and returns a wrong value when reducing",
    "aten::huber_loss": "out= resizes out to the input's shape when reducing",
    "aten::mse_loss": "out= resizes out to the input's shape when reducing",
    "aten::smooth_l1_loss": "out= resizes out to the input's shape when reducing",
    "aten::soft_margin_loss": "out= resizes out to the input's shape when reducing",
}

_KERNEL_NAMESPACES = ("aten", "prims")  # out overloads here may be composite wrappers: see usable_on
_DEVICE_KEYS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mps": "MPS", "meta": "Meta"}


@dataclass(frozen=True)
class OutVariant:
    """``op`` called with the functional arguments plus ``outs`` (keyword names, in return order).
    ``aliases[i]``: the position of the functional argument out ``i`` may be written over (it
    shares that argument's alias set), else None."""

    op: torch._ops.OpOverload
    outs: tuple[str, ...]
    aliases: tuple[int | None, ...]


class OutVariantRegistry:
    """Explicit pairings, for out forms the packet search cannot find.  fxforge keeps one
    (``register_out_variant`` fills it); tests may build their own."""

    def __init__(self) -> None:
        self._pairs: dict[torch._ops.OpOverload, OutVariant] = {}

    def register(self, functional_op, out_op) -> OutVariant:
        variant = pair(functional_op, out_op)
        self._pairs[functional_op] = variant
        return variant

    def unregister(self, functional_op) -> None:
        self._pairs.pop(functional_op, None)

    def registered(self) -> list[tuple[str, str]]:
        """The explicit pairings, by op name (what a cache of compiled graphs keys on)."""
        return sorted((str(f), str(v.op)) for f, v in self._pairs.items())

    def find(self, op) -> OutVariant | None:
        """The out variant of ``op``: registered, else from its packet (None: it has none)."""
        if not isinstance(op, torch._ops.OpOverload):
            return None
        found = self._pairs.get(op)
        return found if found is not None else packet_out_variant(op)


OUT_VARIANTS = OutVariantRegistry()


def register_out_variant(functional_op, out_op) -> OutVariant:
    """Use ``out_op`` as the out variant of ``functional_op`` (an out form in another packet or
    namespace).  The pairing is checked: a ``ValueError`` names the argument or return that does
    not match and what was expected."""
    return OUT_VARIANTS.register(functional_op, out_op)


def out_variant(op) -> OutVariant | None:
    return OUT_VARIANTS.find(op)


def _arg(a) -> str:
    return f"{a.name}: {a.type}{' (keyword-only)' if a.kwarg_only else ''}"


def _mismatch(functional, out_op) -> str | None:
    """Why ``out_op``'s schema is not ``functional``'s plus one out per return (None: it is)."""
    fs, os_ = functional._schema, out_op._schema
    if fs.is_mutable:
        return f"{functional} mutates its inputs: only a functional op has an out variant"
    for i, r in enumerate(fs.returns):
        if str(r.type) != "Tensor":
            return f"return {i} of {functional} is {r.type}: only Tensor returns can be written into out tensors"
    if not fs.returns:
        return f"{functional} returns nothing"
    outs = [a for a in os_.arguments if a.is_out]
    ins = [a for a in os_.arguments if not a.is_out]
    for i, (want, got) in enumerate(zip(fs.arguments, ins)):
        if (want.name, str(want.type), want.kwarg_only) != (got.name, str(got.type), got.kwarg_only):
            return f"argument {i} of {out_op} is '{_arg(got)}', expected '{_arg(want)}' (argument {i} of {functional})"
    if len(ins) != len(fs.arguments):
        extra = ins[len(fs.arguments):] or fs.arguments[len(ins):]
        which = out_op if len(ins) > len(fs.arguments) else functional
        return f"{which} has an argument the other lacks: '{_arg(extra[0])}'"
    if len(outs) != len(fs.returns):
        return (f"{out_op} has {len(outs)} out arguments (keyword-only, mutable: Tensor(a!)), expected one per "
                f"return of {functional}: {len(fs.returns)}")
    for i, (o, r) in enumerate(zip(outs, fs.returns)):
        if str(o.type) != str(r.type):
            return f"out argument '{o.name}' of {out_op} is {o.type}, expected {r.type} (return {i})"
    return None


def pair(functional_op, out_op) -> OutVariant:
    """The ``OutVariant`` of ``functional_op`` made of ``out_op``; ValueError if they do not pair."""
    for what, op in (("functional_op", functional_op), ("out_op", out_op)):
        if not isinstance(op, torch._ops.OpOverload):
            raise ValueError(f"register_out_variant: {what}={op!r} is not an OpOverload "
                             "(e.g. torch.ops.mylib.f.default, torch.ops.mylib.f.out)")
    why = _mismatch(functional_op, out_op)
    if why:
        raise ValueError(f"register_out_variant({functional_op}, {out_op}): {why}")
    return _variant(functional_op, out_op)


def _variant(functional_op, out_op) -> OutVariant:
    args = out_op._schema.arguments
    ins = [a for a in args if not a.is_out]
    aliases = []
    for o in (a for a in args if a.is_out):
        sets = o.alias_info.before_set if o.alias_info is not None else set()
        aliases.append(next((i for i, a in enumerate(ins) if a.alias_info is not None and a.alias_info.before_set & sets
                             and str(a.type) == "Tensor"), None))
    return OutVariant(out_op, tuple(a.name for a in args if a.is_out), tuple(aliases))


@functools.lru_cache(maxsize=None)
def packet_out_variant(op: torch._ops.OpOverload) -> OutVariant | None:
    """The overload of ``op``'s packet pairing with it (schemas never change: cached per op)."""
    if op._schema.name in BROKEN_OUT_OVERLOADS:
        return None
    try:
        packet = getattr(getattr(torch.ops, op.namespace), op._schema.name.split("::")[-1])
    except AttributeError:
        return None
    for name in packet.overloads():
        cand = getattr(packet, name)
        if cand is not op and any(a.is_out for a in cand._schema.arguments) and _mismatch(op, cand) is None:
            return _variant(op, cand)
    return None


def usable_on(variant: OutVariant, device_type: str) -> bool:
    """Calling ``variant`` on ``device_type`` writes the results in place of allocating them."""
    name = variant.op.name()
    key = _DEVICE_KEYS.get(device_type)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if key is not None and has(name, key):
        return True
    if variant.op.namespace in _KERNEL_NAMESPACES:
        return False  # a composite ATen out overload runs the functional op, then copies
    return any(has(name, k) for k in ("CompositeExplicitAutograd", "CompositeImplicitAutograd"))
