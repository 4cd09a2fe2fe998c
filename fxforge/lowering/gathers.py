"""Gathers moved before the pointwise nodes they read from: ``SinkGathers``.

``gather(f(a, b), dim, index)`` is ``f(gather(a, dim, index), gather(b, dim, index))`` for a
pointwise ``f``: every element of the gather's output is ``f`` of the operands' elements at the
same position.  Where the index has fewer elements than ``f``'s value, the second form computes
``f`` only where it is read.  Repeated, a gather moves up through a whole pointwise chain: a loss
reading one score per row out of a log-softmax (``x - max - log(sum(exp(x - max)))``, split by
``lowering/splits.py``) reads one element of ``x`` per row, and the scores (the size of the
vocabulary, per token) need not be stored at all when nothing else reads them.

An operand constant along the gathered dim, and elsewhere of the index's size or 1 (a row's
maximum against a gather of one class per row; a 0-d tensor), stays as it is: it broadcasts
against the gathered ones.  Another operand broadcast to ``f``'s shape is expanded to it first (a
view: the gather reads its elements), where that shape is static.  A node is left alone where
the moved form would not have the gather's dtype and shape (a promotion the operands' new shapes
change), where ``f`` draws random numbers, or where the index is not provably smaller than
``f``'s value.
"""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from ..core.graph import VAL, expr, fake_call, fake_mode_of, free_symbols, inherit_meta, nodes_between
from ..core.iteration import is_pointwise, numel, shape_of
from ..infra.pass_manager import PassResult

aten = torch.ops.aten


def _smaller(index: torch.Tensor, value: torch.Tensor, shape_env) -> bool:
    """``index`` has fewer elements than ``value`` for every value of their symbols (within the
    ranges the shape environment gives them)."""
    ratio = sympy.sympify(numel(shape_of(value)) / numel(shape_of(index)))
    if ratio.is_number:
        return bool(ratio > 1)
    if shape_env is None:
        return False
    try:
        return bool(shape_env.bound_sympy(ratio).lower > 1)
    except Exception:  # (ranges the environment cannot bound: not provably smaller)
        return False


def _movable(f) -> bool:
    return (isinstance(f, fx.Node) and f.op == "call_function" and is_pointwise(f)
            and torch.Tag.nondeterministic_seeded not in f.target.tags)


def sink(gm: fx.GraphModule, mode, g: fx.Node) -> list[fx.Node] | None:
    """Move gather ``g`` before the pointwise node it reads (module docstring): the new
    gathers, or None where ``g`` stays."""
    f, dim, index = g.args[:3]
    if g.kwargs.get("sparse_grad") or len(g.args) > 3 or not _movable(f):
        return None
    fv, iv = f.meta[VAL], index.meta[VAL]
    if not _smaller(iv, fv, mode.shape_env):
        return None
    shape, ishape = [expr(s) for s in fv.shape], [expr(s) for s in iv.shape]
    d = dim % len(shape)
    # each tensor operand: "keep" (constant along the gathered dim, the index's size or 1
    # elsewhere: it broadcasts against the gathered ones), "gather", or "expand" then gather
    plan = {}
    for a in f.all_input_nodes:
        v = a.meta.get(VAL)
        if not isinstance(v, torch.Tensor):
            continue
        have = [sympy.Integer(1)] * (len(shape) - v.dim()) + [expr(s) for s in v.shape]
        if have == shape and v.dim() == len(shape):
            plan[a] = "gather"  # (of f's rank: one of fewer dims, all its shape, is expanded first)
        elif all(h == 1 or (j != d and h == i) for j, (h, i) in enumerate(zip(have, ishape))):
            plan[a] = "keep"
        elif not free_symbols(fv):
            plan[a] = "expand"
        else:
            return None  # (an expand to symbolic sizes would need them as nodes)
    before = g.prev
    made: dict[fx.Node, fx.Node] = {}
    with gm.graph.inserting_before(g):
        for a, how in plan.items():
            if how != "keep":
                x = a if how == "gather" else fake_call(gm, mode, aten.expand.default, (a, list(fv.shape)))
                made[a] = fake_call(gm, mode, aten.gather.default, (x, dim, index))
        args, kwargs = fx.node.map_arg((f.args, f.kwargs), lambda a: made.get(a, a))
        out = fake_call(gm, mode, f.target, tuple(args), dict(kwargs))
    if out.meta[VAL].dtype != g.meta[VAL].dtype or list(out.meta[VAL].shape) != list(g.meta[VAL].shape):
        for n in reversed(nodes_between(before, g)):  # undo: none of them is used yet
            gm.graph.erase_node(n)
        return None
    inherit_meta(nodes_between(before, g), g)
    g.replace_all_uses_with(out)
    gm.graph.erase_node(g)
    if not f.users:
        gm.graph.erase_node(f)
    return list(made.values())


class SinkGathers:
    """Move every gather before the pointwise nodes it reads (module docstring)."""

    name = "sink_gathers"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        work = list(gm.graph.find_nodes(op="call_function", target=aten.gather.default))
        mode = fake_mode_of(gm) if work else None
        moved = 0
        while work and mode is not None:
            g = work.pop()
            new = sink(gm, mode, g)
            if new is not None:
                moved += 1
                work.extend(new)
        if moved:
            gm.recompile()
        return PassResult(gm, moved > 0, {"moved": moved}, recompile=False)
