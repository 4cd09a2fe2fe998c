"""Which decompositions run before lowering.

"none": ATen as traced (composite ops already decomposed by tracing, e.g. ``linear`` -> ``addmm``):
each node is an ATen kernel eager would run, the best input for the torch backend.
"core": core ATen, plus softmax / log-softmax / layer norm split into pointwise + reduction
nodes: what fusing backends want.
"auto": what the selected backend declares (``CodegenBackend.decompose``): "core" for backends
that generate kernels, "none" for the torch backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core.config import Config

if TYPE_CHECKING:
    from ..codegen.api import CodegenBackend

# Attention stays one node: its decomposition materialises the full score matrix.
_KEEP = {
    torch.ops.aten.scaled_dot_product_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
}


# Core ATen ops that kernel-generating backends still want as pointwise + reduction nodes.
_SPLIT_FOR_FUSION = (
    torch.ops.aten._softmax.default,
    torch.ops.aten._log_softmax.default,
    torch.ops.aten.native_layer_norm.default,
)


def _fusion_splits() -> dict:
    from torch._decomp import decomposition_table

    return {op: decomposition_table[op] for op in _SPLIT_FOR_FUSION if op in decomposition_table}


def level(config: Config, backend: "CodegenBackend") -> str:
    return backend.decompose if config.decompose == "auto" else config.decompose


def aot_table(config: Config, backend: "CodegenBackend") -> dict:
    """Decompositions for AOTAutograd tracing."""
    if level(config, backend) == "none":
        return {}
    from torch._decomp import core_aten_decompositions

    table = {k: v for k, v in core_aten_decompositions().items() if k not in _KEEP}
    table.update(_fusion_splits())
    return table


def export_table(config: Config, backend: "CodegenBackend"):
    """Decompositions for ``ExportedProgram.run_decompositions``.

    At "none" only composite-implicit ops are decomposed, to what eager dispatch would run;
    ops with kernels of their own (``_softmax``, ``native_layer_norm``, ``addmm``...) stay.
    """
    table = torch.export.default_decompositions()
    for op in _KEEP:
        table.pop(op, None)
    if level(config, backend) == "none":
        cia = torch._C.DispatchKey.CompositeImplicitAutograd
        for op in list(table.keys()):
            if not (isinstance(op, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), cia)):
                table.pop(op)
    else:
        table.update(_fusion_splits())
    return table
