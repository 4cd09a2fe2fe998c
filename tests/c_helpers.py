"""Helpers for the C templates' tests (tests/test_c_loss_head.py, test_c_embedding.py,
test_c_softmax.py): compile with ``codegen="c"`` (debug, fullgraph), read what was generated."""

from __future__ import annotations

import torch

import fxforge


def compile_c(fn, **kw):
    """``(backend, compiled fn)``: ``fn`` compiled with codegen="c" (debug, fullgraph)."""
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    return b, torch.compile(fn, backend=b, fullgraph=True, **kw)


def sources(b) -> str:
    """Every compiled graph's wrapper source, C kernels included."""
    return "".join(c.source for c in b.compiled)
