"""Graph hygiene before planning: one getitem per output slot, dead code gone (side effects kept)."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..graph import VAL, is_mutating
from ..pipeline import PassResult


class DedupeGetitems:
    """Two ``getitem(x, i)`` nodes are one value: keep the first so each output has one buffer."""

    name = "dedupe_getitems"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        seen: dict[tuple[fx.Node, int], fx.Node] = {}
        removed = 0
        for n in list(gm.graph.nodes):
            if n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[0], fx.Node):
                key = (n.args[0], n.args[1])
                if key in seen:
                    n.replace_all_uses_with(seen[key])
                    gm.graph.erase_node(n)
                    removed += 1
                else:
                    seen[key] = n
        return PassResult(gm, removed > 0, {"removed": removed})


def has_side_effects(n: fx.Node) -> bool:
    """Must run even when nothing uses its value: asserts, mutations, RNG, ops returning nothing."""
    if n.op != "call_function":
        return n.op in ("placeholder", "output")
    if is_mutating(n) or n.is_impure():
        return True
    schema = getattr(n.target, "_schema", None)
    if n.meta.get(VAL, 0) is None or (schema is not None and not schema.returns):
        return True  # returns nothing: runs only for its effect (e.g. an assert)
    name = getattr(n.target, "__name__", "") or ""
    return "assert" in name or torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())


class EliminateDeadCode:
    """Removes nodes whose values nobody uses, keeping every node with a side effect."""

    name = "eliminate_dead_code"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        removed = 0
        for n in reversed(list(gm.graph.nodes)):
            if not n.users and not has_side_effects(n):
                gm.graph.erase_node(n)
                removed += 1
        return PassResult(gm, removed > 0, {"removed": removed})
