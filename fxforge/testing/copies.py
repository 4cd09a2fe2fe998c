"""``CopyCounter``: the bytes a call really writes by data movement, measured at the dispatcher.

    with CopyCounter() as copies:
        compiled(x)
    assert copies.bytes == compiled_graph.stats["copy_bytes"]

A ``TorchDispatchMode`` seeing every ATen call that reaches the dispatcher from Python (calls an
ATen kernel makes internally are not seen, as they are not data movement the program asked for).
Calls that only move bytes (``fxforge.core.copies.moves_data``: cat, pads, clones, copies, fills,
scatters of slices, ``*_copy`` views, layout-only ``_to_copy``) count the bytes they write: their
results, or their ``out=``/``self`` tensors.  ``calls`` keeps (op, bytes) per counted call.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

from ..core.copies import moves_data, written_bytes


class CopyCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    @property
    def bytes(self) -> int:
        return sum(b for _, b in self.calls)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if moves_data(func, args, kwargs):
            outs = [v for k, v in kwargs.items() if func._schema.arguments and any(
                a.name == k and a.is_out for a in func._schema.arguments)]
            self.calls.append((str(func), written_bytes(outs or result)))
        return result
