"""Triton's names for torch dtypes (what the ops compute is written once, in ``codegen/ir/aten.py``;
how values are printed, in ``printer.py``)."""

from __future__ import annotations

import torch

TL_DTYPE = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
# Signature names for ahead-of-time compiles.
SIG_DTYPE = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "i1",
}
# The Triton helper folding two accumulators of a reduction's combine op (``ir.aten.Reduction``).
COMBINE_FN = {"add": "_sum_combine", "mul": "_prod_combine", "max_nan": "_max_nan", "min_nan": "_min_nan",
              "argmax": "_argmax_combine", "argmin": "_argmin_combine"}
