"""The built-in ``torch`` backend: a group runs as calls to ATen ops writing into planned buffers.

Each node calls the op's out variant (``lowering/out_variant.py``) with the planned buffers as
outputs, custom operators included (``clone`` and the scatter ops copy into them instead); an
ATen op without a usable one runs functionally and keeps its result (``allocates``), a custom
operator without one runs as an eager fallback.  An ``invoke_subgraph`` node whose body the
spine compiled (``REGION``) calls that compiled body and keeps what it returns.  CPU reference
backend, and the default on CPU.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from ..core.graph import (ALLOCATES, REGION, VAL, free_symbols, is_mutating, node_kind, op_display, op_path, storage_root,
                          tensor_val)
from ..core.plan import Group
from ..core.iteration import reduction_of
from ..lowering.out_variant import out_variant, usable_on
from .api import CodegenBackend, GroupCost, Kernel, KernelContext
from .pyexpr import format_arg

if TYPE_CHECKING:  # types only: config.py asks the registry (which holds this backend) about names
    from ..core.config import Config

_RUNNABLE_NAMESPACES = ("aten", "prims")
aten = torch.ops.aten


def accepts(node: fx.Node, config: Config) -> str | None:
    op = node.target
    if REGION.on(node):
        return None  # a compiled region: its kernel calls the body's generated code
    if not isinstance(op, torch._ops.OpOverload):
        return f"not an ATen operator ({op_display(op)})"
    if is_mutating(node):
        return "mutates its inputs"
    val = node.meta.get(VAL)
    vals = val if isinstance(val, (list, tuple)) else [val]
    if isinstance(val, list) or not all(isinstance(v, torch.Tensor) for v in vals):
        return "returns a list or non-tensor values"
    if any(s.name.startswith("u") for s in free_symbols(val)):
        return "output size depends on data (unbacked symbol)"
    if op.namespace == "_c10d_functional":
        return "functional collective: communication runs eagerly, as registered"
    if op.namespace == "symm_mem":
        return "symmetric-memory collective: runs as registered (on CPU, fxforge's emulation)"
    if op.namespace not in _RUNNABLE_NAMESPACES:
        # a custom operator runs through its out variant, writing planned buffers, or not at all
        found = out_variant(op)
        if found is None or not usable_on(found, _device_type(node)):
            return (f"custom operator {op_display(op)} has no out variant with a kernel for {_device_type(node)} "
                    "(declare one in its packet, or fxforge.register_out_variant); it runs as registered")
    return None


def _device_type(node: fx.Node) -> str:
    val = node.meta.get(VAL)
    t = val if isinstance(val, torch.Tensor) else next(v for v in val if isinstance(v, torch.Tensor))
    return t.device.type


# A scatter op's result is its ``self`` with ``src`` written over one view of it: into a planned
# buffer, two copies. (ATen's own kernels clone ``self``'s whole storage to keep its strides: a
# planned ``self`` is a view of an arena, and the arena would be copied at every call.)
_SCATTER_VIEWS = {
    aten.slice_scatter.default: aten.slice.Tensor,
    aten.select_scatter.default: aten.select.int,
    aten.diagonal_scatter.default: aten.diagonal.default,
}


def writes_by_copy(node: fx.Node) -> bool:
    """``clone`` into a planned buffer is one ``copy_`` (its out= overload copies twice); a
    scatter op (``_SCATTER_VIEWS``) is a copy of ``self`` and one of ``src`` over its view."""
    return node.target is torch.ops.aten.clone.default or node.target in _SCATTER_VIEWS


def allocates(node: fx.Node, config: Config) -> bool:
    """Run the functional op and keep its result when the device has no real out= kernel.

    Out= overloads registered only as composites (``native_layer_norm.out``, ``embedding.out``...)
    run the functional op and copy its result: a planned buffer would cost a full extra write.
    """
    if REGION.on(node):
        return True
    if writes_by_copy(node):
        return False
    found = out_variant(node.target)
    return found is None or not usable_on(found, _device_type(node))


def _slots(node: fx.Node) -> list[int | None]:
    val = node.meta[VAL]
    return list(range(len(val))) if isinstance(val, (list, tuple)) else [None]


def compile_group(group: Group, ctx: KernelContext) -> Kernel:
    """A Python function running the group's nodes in order into the planned buffers.

    Compute nodes write their planned buffers; view and scalar nodes a fusion pass put inside
    the group become local variables.
    """
    params: list[str] = []  # kernel parameter names == wrapper variable names
    body: list[str] = []
    storages: set[object] = set()  # distinct storages read or written
    returns: list[str] = []  # outputs the kernel allocates itself
    members = set(group.nodes)
    op_source = ctx.op or op_path  # how the kernel calls an op

    def param(name: str) -> str:
        if name not in params:
            params.append(name)
        return name

    def ref(n: fx.Node) -> str:
        if n in members and node_kind(n) == "compute":
            return n.name if ALLOCATES.get(n) else param(ctx.buffer(n, None))
        if node_kind(n) == "getitem" and n.args[0] in members:  # an output of a multi-output op
            if ALLOCATES.get(n.args[0]):
                return f"{n.args[0].name}[{n.args[1]}]"
            return param(ctx.buffer(n.args[0], n.args[1]))
        if n in members:
            return n.name  # a local computed earlier in this kernel
        if tensor_val(n) is not None:
            storages.add(storage_root(n))
        return param(ctx.ref(n))

    def call(fn: str, node: fx.Node, extra: list[str] = ()) -> str:
        args = [format_arg(a, ref, ctx.const) for a in node.args]
        args += [f"{k}={format_arg(v, ref, ctx.const)}" for k, v in node.kwargs.items()]
        return f"{fn}({', '.join(args + list(extra))})"

    for node in group.nodes:
        op = node.target
        kind = node_kind(node)
        if kind == "getitem":
            continue  # resolved by ref() to the producer's buffer
        if kind != "compute":
            body.append(f"{node.name} = {call(op_source(op) if isinstance(op, torch._ops.OpOverload) else ctx.const(op), node)}")
            continue
        if ALLOCATES.get(node):  # the kernel keeps what the op (or a compiled region's body) returns
            body += _region_call(node, ref, ctx) if REGION.on(node) else \
                [f"# {node.name}: {op_display(op)}", f"{node.name} = {call(op_source(op), node)}"]
            returns.append(node.name)
            continue
        body.append(f"# {node.name}: {op_display(op)}")
        found = out_variant(op)
        if writes_by_copy(node):
            body += _copies(node, param(ctx.buffer(node, None)), lambda a: format_arg(a, ref, ctx.const), op_source)
        elif found is not None:
            head = call(op_source(found.op), node)[:-1]  # reads are bound before the outputs
            outs = [param(ctx.buffer(node, i)) for i in _slots(node)]
            sep = ", " if not head.endswith("(") else ""
            body.append(head + sep + ", ".join(f"{k}={b}" for k, b in zip(found.outs, outs)) + ")")
        else:
            body.append(f"_r = {call(op_source(op), node)}")
            outs = [param(ctx.buffer(node, i)) for i in _slots(node)]
            if _slots(node) == [None]:
                body.append(f"{outs[0]}.copy_(_r)")
            else:
                body.extend(f"{b}.copy_(_r[{i}])" for i, b in enumerate(outs))
        storages.update((node, i) for i in _slots(node))
    if returns:
        body.append(f"return {', '.join(returns)}{',' if len(returns) == 1 else ''}")
    lines = [f"def {ctx.name}({', '.join(params)}):"] + ["    " + l for l in body]
    return Kernel(
        name=ctx.name,
        backend="torch",
        source="\n".join(lines) + "\n",
        args=list(params),
        returns=returns,
        node_count=sum(1 for n in group.nodes if node_kind(n) == "compute"),
        unique_io_buffers=len(storages),
    )


def _copies(node: fx.Node, out: str, arg, op_source) -> list[str]:
    """``writes_by_copy``: the lines writing ``node``'s result into its planned buffer ``out``."""
    lines = [f"{out}.copy_({arg(node.args[0])})"]
    if node.target in _SCATTER_VIEWS:  # (the view's arguments are the scatter's after self and src)
        rest = [arg(a) for a in node.args[2:]] + [f"{k}={arg(v)}" for k, v in node.kwargs.items()]
        lines.append(f"{op_source(_SCATTER_VIEWS[node.target])}({', '.join([out, *rest])}).copy_({arg(node.args[1])})")
    return lines


def _region_call(node: fx.Node, ref, ctx: KernelContext) -> list[str]:
    """The lines calling a compiled region's body (``REGION``) with the node's operands."""
    region = REGION.of(node)
    operands = ", ".join(format_arg(a, ref, ctx.const) for a in node.args[2:])
    return [f"# {node.name}: region {region.name}, compiled once, called at {len(region.sites)} sites",
            f"{node.name} = {ctx.const(region)}([{operands}])"]


def fusion_cost(nodes: list[fx.Node], outputs: list[fx.Node], config: Config) -> GroupCost:
    """What ``compile_group`` would give the group: one parameter per value read from outside
    and per planned output buffer; storages: those read plus those written."""
    members = set(nodes)
    params: set = set()
    storages: set = set()
    for n in nodes:
        for a in n.all_input_nodes:
            if a in members or (a.target is operator.getitem and a.args[0] in members) or \
                    (REGION.on(n) and a is n.args[0]):  # (a region's body is no argument of its call)
                continue
            params.add(a)
            if tensor_val(a) is not None:
                storages.add(storage_root(a))
        if node_kind(n) == "compute" and not ALLOCATES.get(n):
            slots = [(n, i) for i in _slots(n)]
            params.update(slots)
            storages.update(slots)
    return GroupCost(num_args=len(params), unique_io_buffers=len(storages))


# Extern kernels that write a strided ``out`` in place: BLAS takes a leading dimension, cat and
# clone (a copy_) walk any strides.  Pointwise ops and reductions are TensorIterator kernels,
# which do too.
_WRITES_STRIDED = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.cat.default, aten.clone.default}


def writes_views(node: fx.Node, config: Config) -> bool:
    """The out= call of ``node`` writes a region of a larger buffer as well as a buffer of its own."""
    if ALLOCATES.get(node) or not isinstance(node.target, torch._ops.OpOverload):
        return False
    return torch.Tag.pointwise in node.target.tags or node.target in _WRITES_STRIDED or reduction_of(node) is not None


BACKEND = CodegenBackend(
    name="torch",
    devices=("cpu", "cuda", "meta", "xpu", "mps"),
    accepts=accepts,
    compile=compile_group,
    allocates=allocates,
    fusion_cost=fusion_cost,
    decompose="none",  # each node an ATen kernel eager would run: what out= calls want
    writes_views=writes_views,
    reads_views=True,  # ATen kernels read any strides
    description="ATen out= calls into planned buffers (reference backend, default on CPU)",
)
