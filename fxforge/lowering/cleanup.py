"""Graph hygiene before planning: one getitem per output slot, identity view chains bypassed,
dead code gone (side effects kept)."""

from __future__ import annotations

import functools
import operator

import torch
import torch.fx as fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..core.graph import VAL, aliased_input, expr, is_mutating, node_kind, per_node
from ..infra.pass_manager import PassResult


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


def is_view_node(n: fx.Node) -> bool:
    """A view (``graph.node_kind``: its output shares its first argument's storage, written by
    no one) by one of ATen's true view ops: those with a generated ``<op>_copy`` twin
    (``t``/``t_copy``, ...), and ``_unsafe_view``.  Ops whose schema says ``Tensor(a)`` but that
    copy when they must (``reshape``, ``contiguous``, ``to``, ``flatten``, ``resolve_conj``...)
    have no such twin, so a chain through them is not followed: ``x.t().reshape(-1).view(x.shape)``
    has ``x``'s sizes and strides but not its data.
    """
    return (
        isinstance(n.target, torch._ops.OpOverload) and node_kind(n) == "view"
        and aliased_input(n) is (n.args[0] if n.args else None) and _true_view(n.target)
    )


@functools.cache
def _true_view(op: torch._ops.OpOverload) -> bool:
    if op is torch.ops.aten._unsafe_view.default:
        return True
    packet = op._schema.name.split("::", 1)[1]
    return op.namespace == "aten" and op not in _NOT_PLAIN_VIEWS and hasattr(torch.ops.aten, packet + "_copy")


# forward-AD duals: the result is not the argument as autograd sees it
_NOT_PLAIN_VIEWS = {torch.ops.aten._make_dual.default, torch.ops.aten._fw_primal.default}


def _layout(v) -> tuple | None:
    """dtype, device, sizes, strides, storage offset, conj/neg bits of a plain strided tensor value
    (sizes as sympy expressions, compared structurally: no guard is added), else None."""
    if not isinstance(v, torch.Tensor) or is_traceable_wrapper_subclass(v) or v.layout != torch.strided or v.is_nested:
        return None
    return (
        v.dtype, v.device,
        tuple(expr(s) for s in v.shape), tuple(expr(s) for s in v.stride()), expr(v.storage_offset()),
        v.is_conj(), v.is_neg(),
    )


class EliminateIdentityViews:
    """A chain of views that ends where it began (``x.t().t()``, ``detach(detach(x))``) is ``x``.

    Each view node whose value has its chain root's exact layout (dtype, device, sizes, strides,
    storage offset; symbolic sizes equal as expressions) has its uses replaced by the root; the
    views left unused are ``EliminateDeadCode``'s.  Kept: views some user writes into, roots whose
    value is not a plain strided tensor, and views the graph returns (an output aliasing an input
    or intermediate carries AOTAutograd's aliasing metadata) -- except, with ``returned``, those
    of a backward graph whose root it computes: its outputs are gradients, handed to autograd
    with no aliasing metadata (a linear layer's weight gradient ``mm(...).t().t()`` is the mm).
    """

    name = "eliminate_identity_views"

    def __init__(self, returned: bool = False):
        self.returned = returned

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        replaced = 0
        for n in list(gm.graph.nodes):
            if not is_view_node(n) or not n.users or any(is_mutating(u) for u in n.users):
                continue
            root = n.args[0]
            while is_view_node(root):
                root = root.args[0]
            if any(u.op == "output" for u in n.users) and not (self.returned and root.op == "call_function"):
                continue
            layout = _layout(root.meta.get(VAL))
            if layout is None or layout != _layout(n.meta.get(VAL)):
                continue
            n.replace_all_uses_with(root)
            replaced += 1
        return PassResult(gm, replaced > 0, {"removed": replaced})


@per_node
def has_side_effects(n: fx.Node) -> bool:
    """Must run even when nothing uses its value: asserts, mutations, RNG, ops returning nothing
    (kept: ``per_node``, asked of every node by fusion and the schedule)."""
    if n.op != "call_function":
        return n.op in ("placeholder", "output")
    if n.meta.get(VAL, 0) is None:
        return True  # returns nothing: runs only for its effect (e.g. an assert)
    if type(n.target) is torch._ops.OpOverload:  # (the op alone decides: asked once per op)
        return _op_has_side_effects(n.target)
    return is_mutating(n) or n.is_impure() or _target_has_side_effects(n.target)


@functools.cache
def _op_has_side_effects(op: torch._ops.OpOverload) -> bool:
    from torch._library.utils import is_impure  # (a mutable schema among what it checks)

    return is_impure(op) or _target_has_side_effects(op)


def _target_has_side_effects(target) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is not None and not schema.returns:
        return True  # returns nothing: runs only for its effect (e.g. an assert)
    name = getattr(target, "__name__", "") or ""
    return "assert" in name or torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


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
