"""Cats of reshaped values, rewritten to cat the values before the reshape: ``CatThroughReshapes``.

Attention's backward concatenates the query, key and value gradients, each computed at
``(batch, seq, heads, head_dim)`` and merged to ``(batch, seq, heads * head_dim)`` by a view just
before the ``cat``.  The zero-copy pass (``passes/padcat.py``) takes only values computed by a
kernel in place, not views of them, so such a ``cat`` copied every byte again.  Here

    cat([view(p0, (B, T, 128)), w1, view(p2, (B, T, 128))], 2)        # p0, p2: (B, T, 4, 32)

becomes

    view(cat([p0, view(w1, (B, T, 4, 32)), p2], 2), (B, T, 384))

the same elements in the same order: the cat dim is split into ``(k, c)`` in every input (a view,
always possible: one dim split in two), the cat runs over ``k`` and a view merges the result back
(a cat's result is row-major).  ``p0`` and ``p2`` are then inputs the zero-copy pass can place.

A cat is rewritten when at least one input is a ``view``/``_unsafe_view`` of a value whose shape
is that input's with the cat dim split in two, all such inputs split it by the same ``c``, and
every other input's size along the cat dim is a multiple of ``c``, and the graph does not return
the cat (``NodeRewrite``); static sizes only.  Runs with
the lowering passes (``Config.zero_copy``), before backend assignment.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..core.graph import VAL, fake_call, node_kind
from .node_rewrites import NodeRewrite, replace

aten = torch.ops.aten
_RESHAPES = (aten.view.default, aten._unsafe_view.default)


class CatThroughReshapes(NodeRewrite):
    name, target, stat = "cat_through_reshapes", aten.cat.default, "cats_through_reshapes"

    def rewrite(self, gm: fx.GraphModule, mode, n: fx.Node) -> bool:
        return _rewrite(gm, mode, n)


def _static(shape) -> tuple[int, ...] | None:
    return tuple(shape) if all(isinstance(s, int) for s in shape) else None


def _split_source(a: fx.Node, d: int) -> tuple[fx.Node, int] | None:
    """(``s``, ``c``) where input ``a`` is a reshape of ``s`` whose shape is ``a``'s with dim ``d``
    split into ``(k, c)``."""
    if node_kind(a) != "view" or a.op != "call_function" or a.target not in _RESHAPES:
        return None
    s = a.args[0]
    if not isinstance(s, fx.Node) or not isinstance(s.meta.get(VAL), torch.Tensor):
        return None
    shape, src = _static(a.meta[VAL].shape), _static(s.meta[VAL].shape)
    if shape is None or src is None or len(src) != len(shape) + 1:
        return None
    if src[:d] != shape[:d] or src[d + 2:] != shape[d + 1:] or src[d] * src[d + 1] != shape[d] or src[d + 1] < 1:
        return None
    return s, src[d + 1]


def _rewrite(gm: fx.GraphModule, mode, n: fx.Node) -> bool:
    inputs = n.args[0]
    out = n.meta.get(VAL)
    if not isinstance(out, torch.Tensor) or _static(out.shape) is None or not isinstance(inputs, (list, tuple)):
        return False
    if not all(isinstance(a, fx.Node) and isinstance(a.meta.get(VAL), torch.Tensor) for a in inputs):
        return False
    d = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % out.dim()
    vals = [a.meta[VAL] for a in inputs]
    if any(v.dim() != out.dim() or _static(v.shape) is None for v in vals):
        return False  # (a 1-d empty input, which cat skips, has another rank)
    splits = [_split_source(a, d) for a in inputs]
    widths = {s[1] for s in splits if s is not None}
    if len(widths) != 1:
        return False
    (c,) = widths
    if any(v.shape[d] % c for v in vals):
        return False
    with gm.graph.inserting_before(n):
        parts = []
        for a, v, split in zip(inputs, vals, splits):
            if split is not None:
                parts.append(split[0])
                continue
            shape = list(v.shape[:d]) + [v.shape[d] // c, c] + list(v.shape[d + 1:])
            parts.append(fake_call(gm, mode, aten.view.default, (a, shape)))
        cat = fake_call(gm, mode, aten.cat.default, (parts, d))
        merged = fake_call(gm, mode, aten.view.default, (cat, list(out.shape)))
    replace(n, merged, cat)
    return True
