"""The C kernels' element types, and the size past which a one-thread template leaves its op to ATen.

What each op computes is written once, in ``codegen/ir/aten.py``; how a value prints as C is
``printer.py``'s.  Only ops a C compiler turns into vector code print as C: arithmetic, the
prelude's branch-free helpers (``fx_expf``, ``fx_tanhf``, ``fx_erff``) and the C library's
vector math where this machine has it (``build.vector_math``); an op that would run element by
element through the C library is left to its ATen kernel, which is vectorized.  fp16/bf16
tensors are not read or written (``SIG_DTYPE`` leaves them out).
"""

from __future__ import annotations

import torch


CTYPE = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}
# The kernel parameter type of a tensor's elements (the emitter's ``Param.sig`` is ``*`` + this).
# bool tensors are read and written as bytes (0 or 1): C compilers do not vectorize loads of ``bool``
# (a masked fill over a bool mask ran 10x slower); the values read are ``bool`` locals again.
SIG_DTYPE = {**CTYPE, torch.bool: "uint8_t"}


# The templates (``templates.py``) run on one thread: an op they would run on more elements than
# this (the row, loss and embedding templates) stays ATen's, whose kernel runs on every intra-op
# thread.
ONE_THREAD_MAX_NUMEL = 1 << 18
