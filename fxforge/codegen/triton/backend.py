"""The ``triton`` codegen backend: capability check + compile hook (the registry's ``triton`` entry).

``accepts`` runs the kernel emitter on the node itself (with placeholder variable names): a
node is accepted exactly when a kernel can be emitted for it, so the check and the emitter
cannot disagree.  ``compile`` emits the group's kernel, writes its module to the on-disk cache
(``cache.py``), loads it with ``triton.jit`` (the interpreter under ``TRITON_INTERPRET=1``) and
returns the launch function as the group's ``Kernel``.
"""

from __future__ import annotations

import torch.fx as fx

from ...core.config import Config
from ...core.graph import VAL, tensors
from ...core.plan import Group
from ..api import GroupCost, Kernel, KernelContext
from ..ir.facts import checked_cost, node_facts
from ..probes import memoized
from . import cache
from .autotune import Tuner
from .kernel import TritonEmitter, Unsupported, node_refusal
from .launch import KERNEL_NAME, Emitted
from .dtypes import SIG_DTYPE
from .prelude import helper_names, interpreting, module_text


def unavailable(device_types: frozenset[str]) -> str | None:
    """Why Triton kernels cannot run on these device types in this process (None: they can)."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed (pip install triton), or use Config(codegen='torch')"
    if "cpu" in device_types and not interpreting():
        return ("Triton runs on CPU tensors only under its interpreter: set TRITON_INTERPRET=1 before the "
                "first compile, or use Config(codegen='torch') on CPU")
    return None


def _probe(nodes: list[fx.Node], outputs: list[fx.Node] | None = None) -> GroupCost:
    """The kernel's launch arguments and storages: the emitter run on the group (raises where it
    refuses, what the interpreter's module lacks included), memoized by the group's structure
    (``probes.py``; the interpreter's refusals with the tag)."""
    def run() -> GroupCost:
        em = TritonEmitter("probe", lambda n: n.name, lambda n, i: f"{n.name}_{i}", nodes, outputs).emit()
        return GroupCost(num_args=len(em.params), unique_io_buffers=em.unique_io_buffers)

    return memoized("triton-interp" if interpreting() else "triton", nodes, outputs, run)


def accepts(node: fx.Node, config: Config) -> str | None:
    why = node_refusal(node, SIG_DTYPE, "Triton")
    if why is not None:
        return why
    for t in tensors(node.meta.get(VAL)) + [t for a in node.all_input_nodes for t in tensors(a.meta.get(VAL))]:
        if t.device.type == "cpu" and not interpreting():
            return "CPU tensors need TRITON_INTERPRET=1"
        if t.device.type not in ("cuda", "cpu"):
            return f"device {t.device.type}"
    try:
        cost = _probe([node])
    except (Unsupported, NotImplementedError) as e:
        return f"triton: {e}"
    if cost.num_args > config.max_kernel_args:
        return f"triton: {cost.num_args} kernel arguments > Config.max_kernel_args={config.max_kernel_args}"
    return None


def writes_views(node: fx.Node, config: Config) -> bool:
    """A Triton kernel stores its outputs at whatever layout the plan gives them (offset in the
    data pointer, the region's strides in the store): any node it runs may write into a region."""
    return True


def fusion_cost(nodes: list[fx.Node], outputs: list[fx.Node], config: Config) -> GroupCost | str:
    """The emitted kernel's launch arguments and storages, or why no single kernel can be emitted:
    from the members' facts where they decide it (``ir/facts.py``), else from the emitter."""
    return checked_cost(nodes, outputs, config, "triton", None, lambda: _probe(nodes, outputs))


def fusion_facts(node: fx.Node):
    """The fusion facts of ``node`` alone (``ir/facts.node_facts``)."""
    return node_facts(node, "triton", None)


def load_kernel(em: Emitted, mode: str | None = None):
    """The runnable kernel of ``em`` (``triton.jit``: the interpreter under TRITON_INTERPRET=1)."""
    mode = mode or ("interp" if interpreting() else "gpu")
    mod = cache.load(module_text(em.kernel_source, mode), helper_names(mode) + [KERNEL_NAME])
    return getattr(mod, KERNEL_NAME)


def compile_group(group: Group, ctx: KernelContext) -> Kernel:
    em = TritonEmitter(ctx.name, ctx.ref, ctx.buffer, group.nodes, group.outputs or None, autotune=ctx.config.autotune,
                 layout=ctx.layout).emit()
    fn = load_kernel(em)
    scope = {f"{em.name}_triton": fn}
    if ctx.config.autotune:
        scope[f"{em.name}_tuner"] = Tuner(cache.source_key(em.kernel_source), em.configs, em.n_out)
    return Kernel(
        name=em.name,
        source=em.launch_source,
        args=list(em.args),
        globals=scope,
        node_count=em.node_count,
        unique_io_buffers=em.unique_io_buffers,
        launch_args=len(em.params),
        backend="triton",
        detail=em,
    )
