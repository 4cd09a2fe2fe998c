"""Data movement: which ATen calls only move bytes, and how many bytes they write.

``stats["copy_bytes"]`` is the bytes a compiled call writes by data movement: concatenations,
pads (the copied input and the filled border), clones and ``contiguous``, copies and layout-only
conversions, scatters of slices, and ``*_copy`` views.  The compiler sums it over the nodes it
runs (``graph_copy_bytes``); ``fxforge.testing.CopyCounter`` measures the same thing at run time
with a dispatch mode, and on the torch backend the two agree exactly (tests/test_copies.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .graph import VAL, ZERO_COPY, expr, node_kind, tensors

aten = torch.ops.aten

# Ops that only move bytes: their result is (parts of) their inputs, rearranged.
_MOVING = {
    "cat", "constant_pad_nd", "clone", "copy", "copy_", "repeat", "slice_scatter", "select_scatter",
    "diagonal_scatter", "as_strided_scatter", "fill", "fill_",
}


def moves_data(op: Any, args: tuple = (), kwargs: dict | None = None) -> bool:
    """``op`` (an OpOverload) only moves bytes: in ``_MOVING``, a ``*_copy`` view, or a
    ``_to_copy`` that keeps the dtype (a change of layout or device)."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return False
    name = op._schema.name.split("::", 1)[1]
    if name in _MOVING or (name.endswith("_copy") and name != "_to_copy"):
        return True
    if name == "_to_copy":
        src = args[0] if args else None
        dtype = (kwargs or {}).get("dtype")
        return dtype is None or (hasattr(src, "dtype") and src.dtype == dtype)
    return False


def written_bytes(result: Any) -> int:
    """Bytes of the tensors a data-movement call writes (its result, or its out/self tensors)."""
    ts = tensors(result)
    return sum(math.prod(int(s) for s in t.shape) * t.element_size() for t in ts)


def node_moves_data(node) -> bool:
    """An FX node whose op only moves bytes (``moves_data`` on its fake arguments)."""
    import torch.fx as fx

    args = tuple(a.meta.get(VAL) if isinstance(a, fx.Node) else a for a in node.args)
    return node.op == "call_function" and moves_data(node.target, args, node.kwargs)


def _nbytes(shape, dtype, hint) -> int:
    """Bytes of a dense tensor of ``shape`` and ``dtype`` at the traced sizes."""
    return hint(math.prod([expr(s) for s in shape]) * dtype.itemsize)


def node_copy_bytes(n, hint) -> int:
    """Bytes data-movement node ``n`` writes when it runs on its own (0 for any other node), at the
    traced sizes.  A cat or pad whose inputs are written in place (``meta[ZERO_COPY]``) writes
    only the inputs copied and a pad's border."""
    from .regions import PAD, container_inputs, pad_border

    if node_kind(n) != "compute" or not node_moves_data(n):
        return 0

    val = n.meta[VAL]
    if ZERO_COPY.on(n):
        total = sum(_nbytes(a.meta[VAL].shape, val.dtype, hint)
                    for a, taken in zip(container_inputs(n), ZERO_COPY.of(n)) if not taken)
        if n.target is PAD:
            total += sum(_nbytes(shape, val.dtype, hint) for _, shape in pad_border(n))
        return total
    return sum(_nbytes(t.shape, t.dtype, hint)
               for t in ([val] if isinstance(val, torch.Tensor) else [v for v in val if isinstance(v, torch.Tensor)]))


def graph_copy_bytes(groups, hint, memory=None, demoted=()) -> int:
    """Bytes the data-movement nodes of ``groups`` (``plan.Group``) write in one call, at the traced
    sizes (``hint`` evaluates a size): every such node of an unfused group (``node_copy_bytes``),
    and such nodes whose values leave a fused kernel (inside one, nothing reaches memory).

    A group in ``demoted`` (ids of groups whose kernel failed to compile: the wrapper runs their
    nodes eagerly, ``codegen/wrapper/``) runs every node on its own, and a value of it that the
    plan (``memory``) put in a region of a cat or pad is copied there after it is computed."""
    demoted = set(demoted)
    total = 0
    for g in groups:
        eager = g.id in demoted
        written = set(g.outputs) if g.fused and not eager else None
        for n in g.nodes:
            if eager and memory is not None and node_kind(n) == "compute":
                b = memory.of(n, None)
                if b is not None and b.kind == "slice":  # the eager result, copied into its region
                    total += _nbytes(b.shape, b.dtype, hint)
            if written is None or n in written:
                total += node_copy_bytes(n, hint)
    return total
