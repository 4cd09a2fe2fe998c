"""The ``c`` codegen backend: fused C kernels for CPU graphs (the registry's ``c`` entry).

The graph keeps ATen's composite kernels (``decompose="none"``: most composite backward kernels
run as ATen's vector kernels) but for layer norm, log-softmax, the NLL loss and the softmax
gradients, split on the compiled graph (``splits``, ``lowering/splits.py``; in training, the loss
head's on the joint graph, before the partitioner); the pointwise chains around them (bias
adds, residuals, scaling, masking, GELU and the pointwise backward kernels) and row and column
reductions become one C function per group, compiled for this CPU with the wrapper's other C
kernels (``build.py``), its loops split across torch's threads (``kernel.split``).
Matmuls, convolutions, arg reductions and ops without a C lowering run as the ``torch``
backend's ATen calls into the same planned buffers (``extern``).  Layer norm's gradient, softmax
and embeddings run as hand-written C kernels (``templates.py``).
``accepts`` runs the emitter on the node itself, as the Triton backend does: the check and the
emitter cannot disagree (memoized by group structure, ``codegen/probes.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx

from ...core.config import Config
from ...core.graph import SLICE_OF, VAL, node_kind, tensors
from ...core.iteration import shape_of, strides_of
from ...core.plan import Group
from ..api import GroupCost, Kernel, KernelContext
from ..ir.lowering import Unsupported, node_refusal
from ..ir.facts import checked_cost, node_facts
from ..probes import memoized
from ..registry import C_MAX_KERNEL_ARGS
from .build import CUnit, compiler
from .launcher import refusal
from .kernel import CEmitter
from .reuse import Emitted
from .schedule import frame_refusal
from .dtypes import CTYPE
from .templates import template_of

log = logging.getLogger(__name__)


def unavailable(device_types: frozenset[str]) -> str | None:
    cc = compiler()
    if cc is None:
        return "no C compiler found (install gcc or clang, or set CC), or use Config(codegen='torch')"
    if device_types - {"cpu"}:
        return f"C kernels run on CPU tensors only (the graph has {', '.join(sorted(device_types - {'cpu'}))})"
    why = refusal(cc)
    return None if why is None else f"{why}; set CC to another compiler, or use Config(codegen='torch')"


def _probe(nodes: list[fx.Node], outputs: list[fx.Node] | None = None) -> GroupCost:
    """The kernel's launch arguments and storages (the emitter run on the group; raises where it
    refuses), memoized by the group's structure (``probes.py``)."""
    def run() -> GroupCost:
        k = CEmitter("probe", lambda n: n.name, lambda n, i: f"{n.name}_{i}", nodes, outputs).emit()
        return GroupCost(num_args=len(k.params), unique_io_buffers=k.unique_io_buffers)

    return memoized("c", nodes, outputs, run)


def accepts(node: fx.Node, config: Config) -> str | None:
    """Why the C backend cannot run ``node`` (None: it can).  Answered once per node structure in a
    graph (``codegen/probes.py``: the op, its arguments and the values it reads and makes, all
    this check reads), a refusal said again in the node's own names."""
    limit = min(config.max_kernel_args, C_MAX_KERNEL_ARGS)
    try:
        memoized(f"c accepts, {limit} arguments", [node], None, lambda: _check(node, limit))
    except Unsupported as e:
        return str(e)
    return None


def _check(node: fx.Node, limit: int) -> bool:
    """``accepts``' checks: raises ``Unsupported`` with the reason where one refuses."""
    template = template_of(node)  # a hand-written kernel (templates.py) for the op, or None
    why = node_refusal(node, CTYPE, "C", masked_outputs=template is not None) or unavailable(frozenset({"cpu"}))
    if why is not None:  # (the backend named explicitly, maybe without a compiler)
        raise Unsupported(why)
    if tensors(node.meta.get(VAL))[0].device.type != "cpu":
        raise Unsupported("not a CPU tensor")
    if template is not None:
        why = template[0](node)
        if why is not None:
            raise Unsupported(f"c: {why}")
        return True
    try:
        cost = _probe([node])
    except (Unsupported, NotImplementedError) as e:
        raise Unsupported(f"c: {e}") from None
    if cost.num_args > limit:
        raise Unsupported(f"c: {cost.num_args} kernel arguments > {limit} (Config.max_kernel_args, the C launcher's bound)")
    return True


def writes_views(node: fx.Node, config: Config) -> bool:
    """A C kernel stores at whatever layout the plan gives its outputs: it may write into a region."""
    return True


def fusion_cost(nodes: list[fx.Node], outputs: list[fx.Node], config: Config) -> GroupCost | str:
    computed = [n for n in nodes if node_kind(n) == "compute"]
    if len(computed) > 1 and any(template_of(n) for n in computed):
        return "c: a template kernel (templates.py) runs alone"
    # from the members' facts where they decide it (``ir/facts.py``; C's own rules,
    # ``kernel.frame_refusal``), else from the emitter
    return checked_cost(nodes, outputs, config, "c", frame_refusal, lambda: _probe(nodes, outputs))


def fusion_facts(node: fx.Node):
    """The fusion facts of ``node`` alone (``ir/facts.node_facts``, C's rules); None for a
    template's node (it runs alone: ``fusion_cost`` says so)."""
    return None if template_of(node) is not None else node_facts(node, "c", frame_refusal)


def tiered(config: Config) -> bool:
    """Whether a wrapper's C units are built at -Og first (``build.py``, ``Config.tiered_builds``):
    not in a process of a multi-rank job, where every rank must compute its replicated values
    with the same kernels from the first call."""
    dist = torch.distributed
    return config.tiered_builds and not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _unit(units: dict, config: Config) -> CUnit:
    """The wrapper's C unit (``KernelContext.units["c"]``), made on first use."""
    unit = units.get("c")
    if unit is None:
        unit = units["c"] = CUnit(debug=config.debug, background=True, tiered=tiered(config))
    if unit.emitted is None:
        unit.emitted = Emitted(config.debug)
    return unit


def kernels_ahead(groups: list[Group], config: Config, units: dict) -> None:
    """The C backend's ``ahead``: each group's kernel emitted before the schedule and memory plan
    are made, and its C function put in a translation unit (``CUnit.ahead``), so that the units
    build while they are made.  The kernel is emitted under what the plan gives a value unless
    it places it in the storage of another: its layout (``expected_layout``) and a buffer of its
    own for each value read outside its group (``own_buffer``).  ``compile_group`` then finds it
    in ``reuse.Emitted``, whose key holds all of that, where the plan gave the group what was
    assumed; where it did not, or where the kernel cannot be reused (``reuse.Emitted.ahead``), the
    group's kernel is emitted then, and the function built ahead goes unused (``CUnit.unused``).
    A group the emitter refuses is left to ``compile_group``, which says why."""
    unit = _unit(units, config)
    threads = config.threads or torch.get_num_threads()
    for g in groups:
        computed, template = _computed(g.nodes)
        if g.reason or not computed or template is not None:
            continue
        ctx = KernelContext(f"ahead{g.id}", _own_name, own_buffer(g.nodes), _no_constant, config, expected_layout,
                            units=units)
        outputs = g.outputs or None
        try:
            k = unit.emitted.ahead(g.nodes, outputs, ctx, threads, _emitter(ctx, g.nodes, outputs, threads))
        except Exception as e:  # noqa: BLE001  (compile_group emits it again, and says what failed)
            log.debug("fxforge: group %d not emitted ahead of the plan: %s: %s", g.id, type(e).__name__, e)
            continue
        if k is not None:
            unit.ahead(k)


def _own_name(n: fx.Node) -> str:
    return n.name


def _no_constant(value) -> str:
    raise Unsupported("a constant without a literal form (its global is named by the wrapper)")


def own_buffer(nodes: list[fx.Node]):
    """``KernelContext.buffer`` as a plan gives it where every value read outside the group has a
    buffer of its own, named after it (an output of several, after the ``getitem`` taking it out);
    a value read only inside the group has none (``KeyError``, as the plan's)."""
    members = set(nodes)

    def buffer(n: fx.Node, index: int | None) -> str:
        if index is not None:
            n = next((u for u in n.users if node_kind(u) == "getitem" and u.args[1] == index), None)
            if n is None:
                raise KeyError(f"no getitem takes output {index} out")
            if n not in members:
                return n.name
        if n.users and all(u in members for u in n.users):
            raise KeyError(f"{n.name} is read inside its group only")
        return n.name

    return buffer


def expected_layout(node: fx.Node, index: int | None) -> tuple[tuple, tuple]:
    """``KernelContext.layout`` as the memory plan gives it (``memory.place_slices``): a value a
    cat or pad takes in place (``SLICE_OF``) in its outermost container's strides, unless it fills
    a run of a 1-D one; every other value as traced."""
    val = node.meta[VAL] if index is None else node.meta[VAL][index]
    at = SLICE_OF.get(node) if index is None else None
    if at is None or len(at[1]) != val.dim():
        return shape_of(val), strides_of(val)
    root = node
    while at is not None:
        root = next((u for u in root.users if u.name == at[0]), None)
        if root is None:  # (not read by its container: no region the plan can find either)
            return shape_of(val), strides_of(val)
        at = SLICE_OF.get(root)
    return shape_of(val), strides_of(root.meta[VAL])


def _computed(nodes: list[fx.Node]) -> tuple[list[fx.Node], Any]:
    """A group's computed members, and the hand-written kernel (``templates.py``) of a group of
    one, or None."""
    computed = [n for n in nodes if node_kind(n) == "compute"]
    return computed, template_of(computed[0]) if len(computed) == 1 else None


def _emitter(ctx: KernelContext, nodes: list[fx.Node], outputs: list[fx.Node] | None, threads: int):
    """The emitter of a group's kernel, made when called (``reuse.Emitted`` makes it where it
    has no kernel to reuse)."""
    return lambda: CEmitter(ctx.name, ctx.ref, ctx.buffer, nodes, outputs, layout=ctx.layout, threads=threads)


def compile_group(group: Group, ctx: KernelContext) -> Kernel:
    computed, template = _computed(group.nodes)
    threads = ctx.config.threads or torch.get_num_threads()
    unit = _unit(ctx.units, ctx.config)
    if template is not None:
        k = template[1](ctx.name, computed[0], ctx.ref, ctx.buffer, ctx.layout, threads)
    else:
        outputs = group.outputs or None
        k = unit.emitted.emit(group.nodes, outputs, ctx, threads, _emitter(ctx, group.nodes, outputs, threads))
    unit.add(k)
    return Kernel(name=k.name, source=k.launch_source, args=list(k.args), node_count=k.node_count,
                  unique_io_buffers=k.unique_io_buffers, launch_args=len(k.params), backend="c")
