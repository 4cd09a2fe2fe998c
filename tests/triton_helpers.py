"""Helpers for the Triton backend's tests (tests/test_triton_*.py): compile with
``codegen="triton"``, count what ran in Triton, compile new kernels ahead of time.

``TRITON_INTERPRET`` is read by ``triton.jit`` when a kernel is loaded, and by this backend's
capability check, so setting it before the first compile is enough (tests use a fixture).
"""

from __future__ import annotations

import collections
import hashlib

import torch

import fxforge
from fxforge.codegen.triton import aot

# What the Triton backend emitted for every kernel compiled through ``triton_config`` (its
# ``Config.on_kernel``), in order; bounded.
GENERATED: collections.deque = collections.deque(maxlen=4096)


def record(kernel) -> None:
    if kernel.backend == "triton":
        GENERATED.append(kernel.detail)


def triton_config(**knobs) -> fxforge.Config:
    """``Config(codegen="triton", debug=True, **knobs)`` recording every Triton kernel in ``GENERATED``."""
    return fxforge.Config(codegen="triton", debug=True, on_kernel=record, **knobs)

_aot_checked: dict[str, dict] = {}


def aot_check_new(since: int, archs=(80, 90)) -> list:
    """AOT-compile (sm_80, sm_90) every kernel generated after ``GENERATED[since]``; once per source."""
    out = []
    for em in list(GENERATED)[since:]:
        key = hashlib.sha256(em.kernel_source.encode()).hexdigest()
        if key not in _aot_checked:
            _aot_checked[key] = aot.check_kernel(em, archs)
        out.append((em, _aot_checked[key]))
    return out


def run_compiled(fn, *args, dynamic=False, config=None, aot_check=None):
    """``(backend, result)``: ``fn(*args)`` compiled with codegen="triton" (fullgraph, debug);
    every new kernel also compiled ahead of time for sm_80 and sm_90 unless ``aot_check`` is
    False (default: where the arguments are not on a GPU, which compiles them anyway)."""
    if aot_check is None:
        aot_check = not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    torch._dynamo.reset()
    b = fxforge.backend(config or triton_config())
    start = len(GENERATED)
    out = torch.compile(fn, backend=b, fullgraph=True, dynamic=dynamic)(*args)
    if aot_check:
        aot_check_new(start)
    return b, out


def triton_kernels(b) -> int:
    return sum(1 for c in b.compiled for k in c.kernels if k.backend == "triton")


def triton_nodes(b) -> int:
    """Compute nodes run inside Triton kernels (a fused kernel counts each of its nodes)."""
    return sum(k.node_count for c in b.compiled for k in c.kernels if k.backend == "triton")


def fallbacks(b) -> dict:
    out = {}
    for c in b.compiled:
        out.update(c.stats["fallbacks"])
    return out
