"""Crops as views: ``constant_pad_nd`` by a negative amount drops elements, which a ``slice``
view does without copying.  ``LowerCrops`` rewrites such pads into slice views, followed by a
pad by the positive amounts left (none: the crop is all there is).  Runs with the lowering
passes, before backend assignment; the gradient of a pad is such a crop.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..core.graph import VAL, fake_call, fake_mode_of, node_kind, output_nodes, with_views
from ..infra.pass_manager import PassResult

aten = torch.ops.aten
PAD = aten.constant_pad_nd.default
_END = 2**63 - 1  # slice's "to the end"


class LowerCrops:
    name = "lower_crops"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        return PassResult(gm, lower_crops(gm))


def lower_crops(gm: fx.GraphModule) -> bool:
    """``constant_pad_nd`` by negative amounts crops: those dims become ``slice`` views, and a pad
    by the remaining positive amounts follows (none: the crop is all there is)."""
    mode = fake_mode_of(gm)
    returned = set(output_nodes(gm))
    changed = False
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not PAD:
            continue
        pads = list(n.args[1])
        if not all(isinstance(p, int) for p in pads) or all(p >= 0 for p in pads):
            continue
        if _returned(n, returned):
            continue  # a view of the input would be returned: the caller's tensors must not alias
        x = n.args[0]
        rank = x.meta[VAL].dim()
        with gm.graph.inserting_before(n):
            cur = x
            for i in range(len(pads) // 2):
                left, right = pads[2 * i], pads[2 * i + 1]
                if left >= 0 and right >= 0:
                    continue
                d = rank - 1 - i
                end = right if right < 0 else _END  # a negative end counts from the dim's end
                cur = fake_call(gm, mode, aten.slice.Tensor, (cur, d, max(0, -left), end))
            rest = [max(0, p) for p in pads]
            if any(rest):
                cur = fake_call(gm, mode, PAD, (cur, rest, *n.args[2:]), dict(n.kwargs))
        n.replace_all_uses_with(cur)
        gm.graph.erase_node(n)
        _refresh_views(cur, mode)
        changed = True
    return changed


def _refresh_views(n: fx.Node, mode) -> None:
    """Views of ``n`` were traced on a fresh (contiguous) result; ``n`` is now a region of its
    input, so their strides and offsets change: propagate their fake values again.  (Kernels
    reading a region still produce what they did: a row-major order of strides is kept.)"""
    for u in list(n.users):
        if node_kind(u) != "view" or u.op != "call_function":
            continue
        args = [a.meta[VAL] if isinstance(a, fx.Node) else a for a in u.args]
        kwargs = {k: v.meta[VAL] if isinstance(v, fx.Node) else v for k, v in u.kwargs.items()}
        with mode:
            u.meta[VAL] = u.target(*args, **kwargs)
        _refresh_views(u, mode)


def _returned(n: fx.Node, outputs: set) -> bool:
    """``n``, or a view of it, is returned by the graph."""
    return any(x in outputs for x in with_views(n))
