"""Composite ops split into the nodes a fusing backend runs better: ``SplitForFusion``.

A backend keeping ATen's composite kernels (``decompose="none"``) may still name ops it fuses
better than their ATen kernel runs them (``CodegenBackend.splits``): a layer norm fused with the
residual add before it and the copy after it is one kernel instead of three.  The split happens
here, on the graph being compiled, not when AOTAutograd traces: the backward graph keeps ATen's
``native_layer_norm_backward`` (one kernel), while a decomposition at trace time would give it the
decomposed ops' gradients (many nodes and reductions over leading dims).

Each split writes the op's value with nodes of the same graph (their fake values computed in the
graph's fake mode, symbolic sizes kept), and the op's users (its ``getitem`` users, for an op of
several outputs) read them.  Log-softmax and the two softmax gradients split into row
reductions and pointwise nodes, which a fusing backend runs as one row kernel; the NLL loss into
a gather of one score per row, its gradient into pointwise nodes.  The loss head's splits also
run on AOTAutograd's joint graph, before it is partitioned (``split_joint``).  An inference
batch norm splits into per-channel pointwise nodes with the running statistics, which fuse with
the activation and the residual add after it.  (A training batch norm keeps ATen's kernel: its
statistics reduce over every dim but the channels, which ATen's batch norm computes in one pass
and a generic reduction does not.)  A split may leave an output it does not compute (``None``:
the empty statistics of an inference batch norm); it is not split where a user reads that output.
"""

from __future__ import annotations

import functools
import operator
from typing import Callable

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..core.graph import VAL, expr, fake_call, fake_mode_of, inherit_meta, nodes_between
from ..infra.pass_manager import PassResult
from . import fxforge_ops as ops  # noqa: F401  (fxforge::nll_targets)
from .gathers import SinkGathers

aten = torch.ops.aten


def _layer_norm(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node] | None:
    """``native_layer_norm(x, shape, w, b, eps)`` -> ``(out, mean, rstd)``: var_mean over the
    normalized (last) dims, rsqrt(var + eps), (x - mean) * rstd, then the affine terms."""
    x, shape, w, b, eps = n.args
    if not _float_rows(x):
        return None
    dims = list(range(x.meta[VAL].dim() - len(shape), x.meta[VAL].dim()))
    var_mean = fake_call(gm, mode, aten.var_mean.correction, (x, dims), {"correction": 0, "keepdim": True})
    var = fake_call(gm, mode, operator.getitem, (var_mean, 0))
    mean = fake_call(gm, mode, operator.getitem, (var_mean, 1))
    rstd = fake_call(gm, mode, aten.rsqrt.default, (fake_call(gm, mode, aten.add.Tensor, (var, eps)),))
    return [_normalized(gm, mode, x, mean, rstd, w, b), mean, rstd]


def _at_strides(gm: fx.GraphModule, mode, v: fx.Node, want) -> fx.Node:
    """``v``, copied to the strides of ``want`` (the op's value) where its own differ: the op's
    users and their traced values expect the op's layout (a split's elementwise nodes follow
    their input's: a transposed one)."""
    have = v.meta[VAL]
    if [expr(x) for x in have.stride()] == [expr(x) for x in want.stride()]:
        return v
    return fake_call(gm, mode, torch.ops.prims.copy_strided.default, (v, list(want.stride())))


def _float_rows(x: fx.Node) -> bool:
    """Rows a split computes as eager does: float32 or float64 (eager computes low precision in
    float32 and rounds once: left to ATen)."""
    return x.meta[VAL].dtype in (torch.float32, torch.float64)


def _channels(gm: fx.GraphModule, mode, v: fx.Node, rank: int) -> fx.Node:
    """A per-channel vector ``(C,)`` viewed to broadcast against ``(N, C, *spatial)``."""
    return fake_call(gm, mode, aten.view.default, (v, [-1] + [1] * (rank - 2)))


def _normalized(gm: fx.GraphModule, mode, x, mean, rstd, w, b, affine=lambda t: t) -> fx.Node:
    """``(x - mean) * rstd * w + b``, ``w`` and ``b`` (either may be None) broadcast through
    ``affine`` (a batch norm's per channel: ``_channels``)."""
    call = functools.partial(fake_call, gm, mode)
    out = call(aten.mul.Tensor, (call(aten.sub.Tensor, (x, mean)), rstd))
    if w is not None:
        out = call(aten.mul.Tensor, (out, affine(w)))
    if b is not None:
        out = call(aten.add.Tensor, (out, affine(b)))
    return out


def _reads_output(n: fx.Node, *indices: int) -> bool:
    return any(u.target is operator.getitem and u.args[1] in indices for u in n.users)


def _float_params(x: fx.Node, *params) -> bool:
    """The batch norm's input and its per-channel tensors all of one float dtype (mixed
    precision keeps ATen's kernel, which computes in the statistics' dtype)."""
    dt = x.meta[VAL].dtype
    return _float_rows(x) and all(p is None or p.meta[VAL].dtype == dt for p in params)


def _batch_norm_inference(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node | None] | None:
    """``_native_batch_norm_legit_no_training(x, w, b, mean, var, momentum, eps)`` ->
    ``(x - mean) * rsqrt(var + eps) * w + b`` per channel; its two (empty) statistics outputs
    are not computed."""
    x, w, b, mean, var, _momentum, eps = n.args
    if not _float_params(x, w, b, mean, var) or x.meta[VAL].dim() < 2 or _reads_output(n, 1, 2):
        return None
    call = functools.partial(fake_call, gm, mode)
    rank = x.meta[VAL].dim()
    rstd = call(aten.rsqrt.default, (call(aten.add.Tensor, (var, eps)),))
    per_channel = functools.partial(_channels, gm, mode, rank=rank)
    return [_normalized(gm, mode, x, per_channel(mean), per_channel(rstd), w, b, per_channel), None, None]


def _per_channel_count(x: fx.Node) -> int | None:
    """The elements per channel of ``(N, C, *spatial)`` (what a batch norm's statistics reduce
    over), where static and at least 2 (the running variance is unbiased: ``n / (n - 1)``)."""
    shape = x.meta[VAL].shape
    if len(shape) < 2 or not all(isinstance(d, int) for d in shape) or shape[1] == 0:
        return None
    count = x.meta[VAL].numel() // shape[1]
    return count if count >= 2 else None


def _channel_sum(gm: fx.GraphModule, mode, v: fx.Node) -> fx.Node:
    """``v``'s sum per channel over every other dim, ``(C,)``: a column reduction where the
    channels are innermost (channels-last)."""
    return fake_call(gm, mode, aten.sum.dim_IntList, (v, [0, *range(2, v.meta[VAL].dim())]))


def _batch_norm_training(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node] | None:
    """``_native_batch_norm_legit_functional(x, w, b, running_mean, running_var, True, momentum,
    eps)`` -> ``(out, mean, rstd, running_mean', running_var')``: the mean per channel, the
    biased variance as the mean of squared deviations from it (two column sums over the
    channels), then the per-channel pointwise normalization, which fuses with the activation
    after it; the running statistics move by ``momentum`` (the variance unbiased, as eager's)."""
    x, w, b, running_mean, running_var, training, momentum, eps = n.args
    count = _per_channel_count(x)
    if (not training or count is None or not _float_params(x, w, b, running_mean, running_var)
            or not all(isinstance(v, (int, float)) for v in (momentum, eps))):
        return None
    call = functools.partial(fake_call, gm, mode)
    per_channel = functools.partial(_channels, gm, mode, rank=x.meta[VAL].dim())
    mean = call(aten.div.Tensor, (_channel_sum(gm, mode, x), count))
    centered = call(aten.sub.Tensor, (x, per_channel(mean)))
    var = call(aten.div.Tensor, (_channel_sum(gm, mode, call(aten.mul.Tensor, (centered, centered))), count))
    rstd = call(aten.rsqrt.default, (call(aten.add.Tensor, (var, eps)),))
    out = _normalized(gm, mode, x, per_channel(mean), per_channel(rstd), w, b, per_channel)

    def moved(running: fx.Node, batch: fx.Node) -> fx.Node:
        return call(aten.add.Tensor, (call(aten.mul.Tensor, (running, 1 - momentum)), call(aten.mul.Tensor, (batch, momentum))))

    unbiased = call(aten.mul.Tensor, (var, count / (count - 1)))
    return [out, mean, rstd, moved(running_mean, mean), moved(running_var, unbiased)]


def _batch_norm_backward(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node | None] | None:
    """``native_batch_norm_backward(g, x, w, running_mean, running_var, mean, invstd, True, eps,
    mask)`` -> with the per-channel sums ``s = sum(g)`` and ``d = sum(g * (x - mean))``:
    ``(g - s / n - (x - mean) * d * invstd**2 / n) * invstd * w``, ``d * invstd``, ``s`` (the
    outputs ``mask`` asks for; ``n`` the elements per channel): two column sums and a pointwise
    gradient, which fuse with the activation's gradient before them.  Each computes ``x - mean``
    itself: recomputed, it costs a read of ``x``, where stored it would cost a write and a read."""
    g, x, w, _rm, _rv, mean, invstd, train, _eps, mask = n.args
    count = _per_channel_count(x)
    if (not train or mean is None or invstd is None or count is None
            or not _float_params(x, w, mean, invstd) or g.meta[VAL].dtype != x.meta[VAL].dtype):
        return None
    call = functools.partial(fake_call, gm, mode)
    per_channel = functools.partial(_channels, gm, mode, rank=x.meta[VAL].dim())

    def centered() -> fx.Node:
        return call(aten.sub.Tensor, (x, per_channel(mean)))

    sum_g = _channel_sum(gm, mode, g)
    dot = _channel_sum(gm, mode, call(aten.mul.Tensor, (g, centered())))
    grad_in = None
    if mask[0]:
        k = call(aten.div.Tensor, (call(aten.mul.Tensor, (call(aten.mul.Tensor, (dot, invstd)), invstd)), count))
        grad_in = call(aten.sub.Tensor, (g, per_channel(call(aten.div.Tensor, (sum_g, count)))))
        grad_in = call(aten.sub.Tensor, (grad_in, call(aten.mul.Tensor, (centered(), per_channel(k)))))
        scale = invstd if w is None else call(aten.mul.Tensor, (invstd, w))
        grad_in = call(aten.mul.Tensor, (grad_in, per_channel(scale)))
    grad_w = call(aten.mul.Tensor, (dot, invstd)) if mask[1] else None
    return [grad_in, grad_w, sum_g if mask[2] else None]


def _log_softmax(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node] | None:
    """``_log_softmax(x, dim, half_to_float)`` -> ``(x - m) - log(sum(exp(x - m)))``, ``m`` the
    row's max (``amax``: a row of NaN or of -inf only is NaN, as eager's).  Rows that may be
    empty are left to ATen: ``amax`` has no identity to reduce an empty row to."""
    x, dim, half_to_float = n.args
    xv = x.meta[VAL]
    if half_to_float or not _float_rows(x) or not statically_known_true((xv.shape[dim] if xv.dim() else 1) > 0):
        return None
    call = functools.partial(fake_call, gm, mode)
    shifted = call(aten.sub.Tensor, (x, call(aten.amax.default, (x, [dim], True))))
    total = call(aten.sum.dim_IntList, (call(aten.exp.default, (shifted,)), [dim], True))
    return [call(aten.sub.Tensor, (shifted, call(aten.log.default, (total,))))]


def _log_softmax_backward(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node] | None:
    """``_log_softmax_backward_data(g, y, dim, dtype)`` -> ``g - exp(y) * sum(g)``."""
    g, y, dim, dtype = n.args
    if dtype != g.meta[VAL].dtype or not _float_rows(g):
        return None
    call = functools.partial(fake_call, gm, mode)
    total = call(aten.sum.dim_IntList, (g, [dim], True))
    return [call(aten.sub.Tensor, (g, call(aten.mul.Tensor, (call(aten.exp.default, (y,)), total))))]


def _softmax_backward(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node] | None:
    """``_softmax_backward_data(g, y, dim, dtype)`` -> ``y * (g - sum(g * y))``."""
    g, y, dim, dtype = n.args
    if dtype != g.meta[VAL].dtype or not _float_rows(g):
        return None
    call = functools.partial(fake_call, gm, mode)
    total = call(aten.sum.dim_IntList, (call(aten.mul.Tensor, (g, y)), [dim], True))
    return [call(aten.mul.Tensor, (y, call(aten.sub.Tensor, (g, total))))]


def _nll_loss_forward(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node] | None:
    """``nll_loss_forward(x, target, weight, reduction, ignore_index)`` -> ``(loss, total_weight)``:
    each row's score at its target, ``gather(x, -1, target)`` (row 0's for an ignored row, masked
    out), times ``-weight[target]``; summed (``total_weight``: the weights, or the count, of the
    rows not ignored), divided by ``total_weight`` for a mean; per row for ``reduction='none'``
    (``total_weight`` 0, as eager's).  The targets are checked first (``ops.nll_targets``).  The
    gather reads one score per row: where the scores are computed by pointwise nodes (a
    log-softmax's ``x - max - log(sum)``), ``SinkGathers`` moves it before them, and the scores
    need not be stored.  (Static class counts only: the check takes the count as a constant.)"""
    x, target, weight, reduction, ignore_index = n.args[:5]
    xv, tv = x.meta[VAL], target.meta[VAL]
    if (not _float_rows(x) or xv.dim() not in (1, 2) or tv.dtype != torch.int64 or tv.dim() != xv.dim() - 1
            or (weight is not None and weight.meta[VAL].dtype != xv.dtype) or reduction not in (0, 1, 2)
            or not isinstance(xv.shape[-1], int)):
        return None
    call = functools.partial(fake_call, gm, mode)
    valid = call(aten.ne.Scalar, (target, ignore_index))
    safe = call(torch.ops.fxforge.nll_targets.default, (target, xv.shape[-1], ignore_index))
    picked = call(aten.squeeze.dim, (call(aten.gather.default, (x, -1, call(aten.unsqueeze.default, (safe, -1)))), -1))
    w = call(aten.index.Tensor, (weight, [safe])) if weight is not None else None
    loss = call(aten.neg.default, (picked if w is None else call(aten.mul.Tensor, (picked, w)),))
    loss = call(aten.where.ScalarOther, (valid, loss, 0.0))
    if reduction == 0 and xv.dim() == 2:
        return [loss, call(aten.zeros.default, ([],), {"dtype": xv.dtype, "device": xv.device})]
    if w is None:
        total = call(aten._to_copy.default, (call(aten.sum.default, (valid,)),), {"dtype": xv.dtype})
    else:
        total = call(aten.sum.default, (call(aten.where.ScalarOther, (valid, w, 0.0)),))
    if reduction != 0:
        loss = call(aten.sum.default, (loss,))
    if reduction == 1:
        loss = call(aten.div.Tensor, (loss, total))
    return [loss, total]


def _nll_loss_backward(gm: fx.GraphModule, mode, n: fx.Node) -> list[fx.Node] | None:
    """``nll_loss_backward(g, x, target, weight, reduction, ignore_index, total_weight)`` ->
    ``where(class == target & target != ignore_index, -(g / total_weight) * weight[target], 0)``
    (a sum: ``-g``; none: ``-g`` per row), the class an ``arange`` over the last dim: pointwise
    nodes, which a fusing backend computes inside the log-softmax gradient's row kernel instead
    of zeroing a tensor of the scores' size and writing each row's target into it.  A target
    outside ``[0, C)`` that is not ``ignore_index`` raises, as eager's kernel does."""
    g, x, target, weight, reduction, ignore_index, total = n.args
    xv, tv = x.meta[VAL], target.meta[VAL]
    if (not _float_rows(x) or xv.dim() not in (1, 2) or tv.dtype != torch.int64 or tv.dim() != xv.dim() - 1
            or g.meta[VAL].dtype != xv.dtype or (weight is not None and weight.meta[VAL].dtype != xv.dtype)):
        return None
    call = functools.partial(fake_call, gm, mode)
    classes = xv.shape[-1]
    valid = call(aten.ne.Scalar, (target, ignore_index))
    inside = call(aten.logical_and.default, (call(aten.ge.Scalar, (target, 0)), call(aten.lt.Scalar, (target, classes))))
    ok = call(aten.all.default, (call(aten.logical_or.default, (inside, call(aten.logical_not.default, (valid,)))),))
    call(aten._assert_async.msg, (ok, f"nll_loss_backward: a target is out of bounds: [0, {classes}) or ignore_index "
                                  f"{ignore_index} expected"))
    scale = call(aten.neg.default, (call(aten.div.Tensor, (g, total)) if reduction == 1 else g,))
    if weight is not None:  # the weight of each row's class (class 0 where the row is ignored)
        safe = call(aten.where.ScalarOther, (valid, target, 0))
        scale = call(aten.mul.Tensor, (scale, call(aten.index.Tensor, (weight, [safe]))))
    classes_v = call(aten.arange.start_step, (0, classes, 1), {"dtype": torch.int64, "device": xv.device})

    def column(v: fx.Node) -> fx.Node:  # a per-row value against the (N, C) scores
        return call(aten.unsqueeze.default, (v, -1)) if xv.dim() == 2 else v

    hit = call(aten.logical_and.default, (call(aten.eq.Tensor, (classes_v, column(target))), column(valid)))
    if scale.meta[VAL].dim() == 1:
        scale = column(scale)
    return [call(aten.where.ScalarOther, (hit, scale, 0.0))]


SPLITTERS: dict[str, Callable[[fx.GraphModule, object, fx.Node], list[fx.Node | None] | None]] = {
    "aten.native_layer_norm.default": _layer_norm,
    "aten._log_softmax.default": _log_softmax,
    "aten._log_softmax_backward_data.default": _log_softmax_backward,
    "aten._softmax_backward_data.default": _softmax_backward,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm_inference,
    "aten._native_batch_norm_legit_functional.default": _batch_norm_training,
    "aten.native_batch_norm_backward.default": _batch_norm_backward,
    "aten.nll_loss_forward.default": _nll_loss_forward,
    "aten.nll_loss_backward.default": _nll_loss_backward,
}


# The splits that run on AOTAutograd's joint graph, before it is partitioned into forward and
# backward (``split_joint``): the partitioner then sees their pieces, and recomputes cheap ones in
# the backward instead of saving them.  A log-softmax's gradient reads the log-softmax's output, a
# tensor the size of its input: split, the backward recomputes it from the input (saved anyway, or
# an output of the forward) and two values per row.  The NLL loss's gather then moves up to the
# input (``lowering/gathers.py``), and the forward stores no scores at all.  (A layer norm's
# gradient stays ATen's kernel, reading the statistics, not the output: split after.)
BEFORE_PARTITION = ("aten._log_softmax.default", "aten._log_softmax_backward_data.default",
                    "aten.nll_loss_forward.default", "aten.nll_loss_backward.default")


def split_joint(gm: fx.GraphModule, splits: tuple[str, ...]) -> dict:
    """Apply the ``BEFORE_PARTITION`` splits among ``splits`` (a backend's) to AOTAutograd's joint
    graph ``gm``, and move gathers up (``SinkGathers``); their nodes take the partitioner's tag
    of the node they replace.  Returns the passes' stats."""
    early = tuple(s for s in splits if s in BEFORE_PARTITION)
    if not early:
        return {}
    split = SplitForFusion(early)(gm)
    stats = {"split": split.stats, "sink_gathers": SinkGathers()(gm).stats}
    if not split.modified:
        return stats
    for n in gm.graph.find_nodes(op="call_function", target=aten.detach.default):
        n.replace_all_uses_with(n.args[0])  # a no-op on values, which would hide a saved value's producer
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return stats


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
            several = isinstance(n.meta.get(VAL), (list, tuple))  # its users pick outputs (getitem)
            if fn is None or mode is None or several and any(u.target is not operator.getitem for u in n.users):
                continue
            before = n.prev
            with gm.graph.inserting_before(n):
                values = fn(gm, mode, n)
                if values is not None:
                    wanted = n.meta[VAL] if several else [n.meta[VAL]]
                    values = [v if v is None else _at_strides(gm, mode, v, w) for v, w in zip(values, wanted)]
            if values is None:
                continue
            inherit_meta(nodes_between(before, n), n)
            if several:
                for u in list(n.users):
                    u.replace_all_uses_with(values[u.args[1]])
                    gm.graph.erase_node(u)
            else:
                n.replace_all_uses_with(values[0])
            gm.graph.erase_node(n)
            split += 1
        if split:
            gm.recompile()  # runnable when called by hand; the PassManager need not again
        return PassResult(gm, split > 0, {"split": split}, recompile=False)
