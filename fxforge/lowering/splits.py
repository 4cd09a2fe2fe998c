"""Composite ops split into the nodes a fusing backend runs better: ``SplitForFusion``.

A backend keeping ATen's composite kernels (``decompose="none"``) may still name ops it fuses
better than their ATen kernel runs them (``CodegenBackend.splits``): a layer norm fused with the
residual add before it and the copy after it is one kernel instead of three.  The split happens
here, on the graph being compiled, not when AOTAutograd traces: the backward graph keeps ATen's
``native_layer_norm_backward`` (one kernel), while a decomposition at trace time would give it the
decomposed ops' gradients (many nodes and reductions over leading dims).

Each split writes the op's value with nodes of the same graph (their fake values computed in the
graph's fake mode, symbolic sizes kept), and the op's ``getitem`` users read them.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.fx as fx

from ..graph import VAL, fake_call, fake_mode_of
from ..pipeline import PassResult

aten = torch.ops.aten


def _layer_norm(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node] | None:
    """``native_layer_norm(x, shape, w, b, eps)`` -> ``(out, mean, rstd)``: var_mean over the
    normalized (last) dims, rsqrt(var + eps), (x - mean) * rstd, then the affine terms."""
    x, shape, w, b, eps = n.args
    if x.meta[VAL].dtype not in (torch.float32, torch.float64):
        return None  # low precision: eager computes in float32 and rounds once; left to ATen
    dims = list(range(x.meta[VAL].dim() - len(shape), x.meta[VAL].dim()))
    var_mean = fake_call(gm, mode, aten.var_mean.correction, (x, dims), {"correction": 0, "keepdim": True})
    var = fake_call(gm, mode, operator.getitem, (var_mean, 0))
    mean = fake_call(gm, mode, operator.getitem, (var_mean, 1))
    rstd = fake_call(gm, mode, aten.rsqrt.default, (fake_call(gm, mode, aten.add.Tensor, (var, eps)),))
    out = fake_call(gm, mode, aten.mul.Tensor, (fake_call(gm, mode, aten.sub.Tensor, (x, mean)), rstd))
    if w is not None:
        out = fake_call(gm, mode, aten.mul.Tensor, (out, w))
    if b is not None:
        out = fake_call(gm, mode, aten.add.Tensor, (out, b))
    return [out, mean, rstd]


SPLITTERS: dict[str, Callable[[fx.GraphModule, object, fx.Node], list[fx.Node] | None]] = {
    "aten.native_layer_norm.default": _layer_norm,
}


class SplitForFusion:
    """Split the ops named in ``splits`` (keys of ``SPLITTERS``)."""

    name = "split_for_fusion"

    def __init__(self, splits: tuple[str, ...]):
        unknown = [s for s in splits if s not in SPLITTERS]
        if unknown:
            raise ValueError(f"CodegenBackend.splits names {unknown}; fxforge splits {sorted(SPLITTERS)}")
        self.splits = {getattr(getattr(aten, s.split(".")[1]), s.split(".")[2]): SPLITTERS[s] for s in splits}

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        mode = fake_mode_of(gm)
        split = 0
        for n in list(gm.graph.nodes):
            fn = self.splits.get(n.target) if n.op == "call_function" else None
            if fn is None or mode is None or any(u.target is not operator.getitem for u in n.users):
                continue
            with gm.graph.inserting_before(n):
                values = fn(gm, mode, n)
            if values is None:
                continue
            for u in list(n.users):
                u.replace_all_uses_with(values[u.args[1]])
                gm.graph.erase_node(u)
            gm.graph.erase_node(n)
            split += 1
        if split:
            gm.recompile()  # runnable when called by hand; the PassManager need not again
        return PassResult(gm, split > 0, {"split": split}, recompile=False)
