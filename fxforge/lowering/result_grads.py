"""Activation gradients read from the activation's result, not its input: ``GradsFromResults``.

Some activations' gradients depend on their input only through which side of a bound it lies,
and the result lies on the same side:

* ``hardtanh(x, lo, hi)`` (ReLU6, clamps written as hardtanh), ``lo < hi``: its gradient is
  ``g`` where ``lo < x < hi``, else 0, and ``lo < x < hi`` exactly where ``lo < result < hi``
  (a NaN input gives a NaN result, inside neither, in both forms).  So ``hardtanh_backward(g, x,
  lo, hi)`` is ``hardtanh_backward(g, hardtanh(x, lo, hi), lo, hi)``.
* ``leaky_relu(x, slope)``, ``slope >= 0``: ``x > 0`` exactly where ``result > 0``: ATen's
  ``leaky_relu_backward(g, result, slope, self_is_result=True)`` is the same gradient.
* ``elu(x, alpha, scale, input_scale)``, ``alpha >= 0`` and positive scales: ``x > 0`` exactly
  where ``result > 0``, and ATen's ``elu_backward(..., is_result=True, result)`` computes the
  gradient from the result.

On a joint training graph, before AOTAutograd's partitioner, the rewrite changes what the
forward saves for the backward: the activation's result, which the next layer's gradient mostly
reads anyway (a convolution's or a matmul's input), instead of its input as well.  A
convolution, batch norm, ReLU6 chain then saves two tensors per layer, not three.  A gradient
keeps reading the input where the backward reads the input elsewhere and the result nowhere
(rewritten, it would save both).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..core.graph import is_tangent
from ..infra.pass_manager import PassResult

aten = torch.ops.aten


def _arg(n: fx.Node, i: int, name: str, default):
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _hardtanh(grad: fx.Node):
    """``hardtanh_backward(g, x, lo, hi)`` -> (the forward node whose result stands for ``x``,
    the gradient's new args and kwargs), or None: the form every rule here returns."""
    g, x, lo, hi = grad.args[:4]
    if not (_number(lo) and _number(hi) and lo < hi):
        return None
    for u in x.users:
        if u.target is aten.hardtanh.default and u.args[0] is x \
                and (_arg(u, 1, "min_val", -1.0), _arg(u, 2, "max_val", 1.0)) == (lo, hi):
            return u, (g, u, lo, hi), {}
    return None


def _leaky_relu(grad: fx.Node):
    g, x, slope, is_result = grad.args[:4]
    if is_result or not (_number(slope) and slope >= 0):
        return None
    for u in x.users:
        if u.target is aten.leaky_relu.default and u.args[0] is x and _arg(u, 1, "negative_slope", 0.01) == slope:
            return u, (g, u, slope, True), {}
    return None


def _elu(grad: fx.Node):
    g, alpha, scale, input_scale, is_result, x = grad.args[:6]
    if is_result or not all(_number(v) for v in (alpha, scale, input_scale)) \
            or not (alpha >= 0 and scale > 0 and input_scale > 0):
        return None
    for u in x.users:
        if u.target is aten.elu.default and u.args[0] is x \
                and (_arg(u, 1, "alpha", 1), _arg(u, 2, "scale", 1), _arg(u, 3, "input_scale", 1)) == (alpha, scale, input_scale):
            return u, (g, alpha, scale, input_scale, True, u), {}
    return None


RULES = {
    aten.hardtanh_backward.default: (_hardtanh, 1),
    aten.leaky_relu_backward.default: (_leaky_relu, 1),
    aten.elu_backward.default: (_elu, 5),
}


def backward_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes of a joint graph computed from the incoming gradients (``tangents_*``)."""
    seen: set[fx.Node] = set()
    todo = [n for n in gm.graph.nodes if is_tangent(n)]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.users)
    return seen


class GradsFromResults:
    """Rewrite activation gradients to read the activation's result (module docstring)."""

    name = "grads_from_results"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        backward = backward_nodes(gm)
        rewritten = 0
        for n in list(gm.graph.nodes):
            rule = RULES.get(n.target) if n.op == "call_function" else None
            found = rule[0](n) if rule is not None else None
            if found is None:
                continue
            result, args, kwargs = found
            x = n.args[rule[1]]
            read_elsewhere = any(u is not n and u in backward for u in x.users)
            if result in backward or (read_elsewhere and not any(u in backward for u in result.users)):
                continue
            n.args, n.kwargs = args, kwargs
            rewritten += 1
        if rewritten:
            gm.recompile()
        return PassResult(gm, rewritten > 0, {"rewritten": rewritten}, recompile=False)
