"""Backends' emitter probes, memoized per graph by the structure of the group probed.

A backend answers ``accepts`` and ``fusion_cost`` by running its emitter on the node or the
candidate group (the check and the emitter cannot disagree).  The fusion pass asks once per
candidate merge, so a graph of repeated blocks (a model's layers, a chain of the same few ops)
runs the emitter on the same group, up to names, many times.  ``memoized`` keeps each
probe's summary in the graph module's meta (``PROBES``, made when a ``PassManager`` run starts
and dropped when it ends; outside a run nothing is kept; graphs of one program compiled together
may be handed in sharing one, as the memory budget's partitioner does), keyed by ``structure``: every
member's op, arguments and traced value, the traced values of the tensors it reads from
outside, which of those are one multi-output member's outputs, and the outputs.
That is everything an emitter reads of a group but names, which only appear in the kernel's
text.  A refusal (``Unsupported``, ``NotImplementedError``) is kept too, and said again of a
group of the same structure in that group's names.
"""

from __future__ import annotations

import operator
import re
from typing import Any, Callable

import torch
import torch.fx as fx

from ..core.graph import PROBES, VAL, expr, per_node
from .ir.values import Unsupported


def _value_key(v: Any) -> Any:
    """A traced value as a hashable key: a tensor's layout, dtype and device; sizes as sympy."""
    if isinstance(v, torch.Tensor):
        strided = v.layout == torch.strided
        return ("T", _sizes(v.shape), _sizes(v.stride()) if strided else None,
                _sizes((v.storage_offset(),)) if strided else None, v.dtype, v.device, v.layout)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_value_key(x) for x in v))
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("S", type(v).__name__, expr(v))
    if isinstance(v, float):
        return ("float", repr(v))  # -0.0 == 0.0, and nan != nan
    return (type(v).__name__, v) if v is None or isinstance(v, (bool, int, str)) else ("?", repr(v))


@per_node
def node_value_key(n: fx.Node) -> Any:
    """``_value_key`` of the node's traced value (kept: ``per_node``, read at every probe of a
    group holding or reading it)."""
    return _value_key(n.meta.get(VAL))


def _sizes(sizes) -> tuple:
    """Sizes as a key: ints as they are (equal to and hashing as their sympy forms), symbols as sympy."""
    return tuple(x if type(x) is int else expr(x) for x in sizes)


def structure(nodes: list[fx.Node], outputs: list[fx.Node] | None) -> tuple:
    """The group ``nodes`` (with ``outputs``; None: every member) up to names."""
    member = {n: i for i, n in enumerate(nodes)}
    outside: dict[fx.Node, int] = {}
    described: list[Any] = []

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a in member:
                return ("m", member[a])
            if a not in outside:
                outside[a] = len(outside)
                source = a.args[0] if a.target is operator.getitem and a.args else None
                described.append(("item", member[source], a.args[1]) if source in member
                                 else ("read", node_value_key(a)))
            return ("o", outside[a])
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, arg(x)) for k, x in a.items()))
        return _value_key(a)  # a constant (dtypes, devices...: by their repr)

    body = tuple((n.op, n.target, arg(n.args), arg(n.kwargs), node_value_key(n)) for n in nodes)
    return body, tuple(described), None if outputs is None else tuple(member.get(n, -1) for n in outputs)


def memoized(tag: str, nodes: list[fx.Node], outputs: list[fx.Node] | None, probe: Callable[[], Any]) -> Any:
    """``probe()`` (a backend's emitter run on ``nodes``, summarized), or its summary from an
    earlier probe of a group of the same structure in this graph; ``tag`` names the backend."""
    gm = nodes[0].graph.owning_module if nodes else None
    memo = PROBES.get(gm) if gm is not None else None
    if memo is None:  # not while a PassManager runs: nothing to keep it in
        return probe()
    key = (tag, structure(nodes, outputs))
    if key not in memo:
        try:
            memo[key] = probe()
        except (Unsupported, NotImplementedError) as e:  # a refusal: kept with the names it was said in
            memo[key] = _Refusal(type(e), str(e), _names(nodes))
            raise
    got = memo[key]
    if isinstance(got, _Refusal):
        raise got.again(_names(nodes))
    return got


class _Refusal:
    """An emitter's refusal of a group, kept to be said again of a group of the same structure,
    in that group's names (members and the values it reads, by position)."""

    def __init__(self, kind: type[Exception], message: str, names: list[str]):
        self.kind, self.message, self.names = kind, message, names

    def again(self, names: list[str]) -> Exception:
        swap = {a: b for a, b in zip(self.names, names) if a != b}
        if not swap:
            return self.kind(self.message)
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(swap, key=len, reverse=True))) + r")\b")
        return self.kind(pattern.sub(lambda m: swap[m.group(1)], self.message))


def outside_of(nodes: list[fx.Node]) -> list[fx.Node]:
    """The nodes outside the group ``nodes`` that its members read, in the order ``structure``
    meets them (its ``("o", i)`` is the i-th)."""
    member = set(nodes)
    return list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes if a not in member))


def _names(nodes: list[fx.Node]) -> list[str]:
    """The group's members' names, then those of the values it reads from outside, in the order
    ``structure`` meets them."""
    return [n.name for n in nodes] + [a.name for a in outside_of(nodes)]
