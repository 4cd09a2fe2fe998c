"""fxforge's own operators (``torch.ops.fxforge``), which its lowering passes put in graphs.

Each is a functional operator with an out variant in its packet, so the ``torch`` backend calls it
into a planned buffer like any ATen op, and a fake (meta) kernel for tracing.

* ``nll_targets(target, classes, ignore_index)``: an NLL loss's targets with the ignored ones as
  class 0, checked as eager's loss checks them (``lowering/splits.py``).
* ``embedding_grad_add(self, grad, indices, padding_idx)``: ``self`` plus an embedding's gradient,
  each index's gradient row added to its row of ``self`` in index order (rows of ``padding_idx``
  skipped), the gradient ``embedding_dense_backward`` would return without its table of zeros
  (``lowering/embedding_grads.py``).  Its out variant may write over ``self``: where ``self``
  dies there, the rows are added in place.
"""

from __future__ import annotations

import torch


def _nll_targets(target: torch.Tensor, classes: int, ignore_index: int, *, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """The first target outside ``[0, classes)`` that is not ``ignore_index`` raises eager's
    ``IndexError``; the others come back, the ignored ones as 0."""
    valid = target != ignore_index
    bad = valid & ((target < 0) | (target >= classes))
    if bool(bad.any()):
        raise IndexError(f"Target {int(target[bad][0])} is out of bounds.")
    safe = target.masked_fill(~valid, 0)
    return safe if out is None else out.copy_(safe)


def _embedding_grad_add(self: torch.Tensor, grad: torch.Tensor, indices: torch.Tensor, padding_idx: int, *,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    if out is None:
        out = self.clone()
    elif out.data_ptr() != self.data_ptr():  # (the same bytes: the memory plan runs it in place)
        out.copy_(self)
    rows, index = grad.reshape(-1, grad.shape[-1]), indices.reshape(-1)
    if padding_idx >= 0:
        kept = index != padding_idx
        rows, index = rows[kept], index[kept]
    return out.index_add_(0, index, rows)


# a library handle lives as long as its registrations
_LIB = torch.library.Library("fxforge", "DEF")
_LIB.define("nll_targets(Tensor target, int classes, int ignore_index) -> Tensor")
_LIB.define("nll_targets.out(Tensor target, int classes, int ignore_index, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.impl("nll_targets", _nll_targets, "CompositeExplicitAutograd")
_LIB.impl("nll_targets.out", _nll_targets, "CompositeExplicitAutograd")
_LIB.impl("nll_targets", lambda target, classes, ignore_index: torch.empty_like(target), "Meta")
_LIB.define("embedding_grad_add(Tensor self, Tensor grad, Tensor indices, int padding_idx) -> Tensor")
_LIB.define("embedding_grad_add.out(Tensor(a) self, Tensor grad, Tensor indices, int padding_idx, *, "
            "Tensor(a!) out) -> Tensor(a!)")
_LIB.impl("embedding_grad_add", _embedding_grad_add, "CompositeExplicitAutograd")
_LIB.impl("embedding_grad_add.out", _embedding_grad_add, "CompositeExplicitAutograd")
_LIB.impl("embedding_grad_add", lambda self, grad, indices, padding_idx: torch.empty_like(self), "Meta")
