"""The wrapper plan of one planned graph (``steps.WrapperPlan``), computed from its schedule and
memory plan: where each node runs (``positions``), the names of its values and sizes, when each
arena is allocated and released, the kept arenas' views, the layout guards, each group's kernel
(compiled by its backend, or demoted to eager calls where that fails).  ``source.py`` prints it."""

from __future__ import annotations

import itertools
import keyword
import logging
import math
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx as fx

from ...core.collectives import symmetric_arg_nodes
from ...core.config import Config
from ...core.graph import (
    CUSTOM_OP_DISPATCH,
    FALLBACK_BACKEND,
    GUARD_INPUTS,
    REGION,
    VAL,
    ZERO_COPY,
    aliased_input,
    expr,
    fetch_attr,
    node_kind,
    op_display,
    op_path,
    output_nodes,
    storage_root,
    tensors,
)
from ...core.iteration import shape_of, strides_of
from ...core.plan import Buffer, Group, Plan
from ...core.regions import PAD, container_inputs, pad_border, regions
from .. import runtime, symmetric_runtime as symmetric
from ..api import Kernel, KernelContext
from ..pyexpr import PyExprPrinter, format_arg, format_call, literal
from ..registry import Registry
from .source import KERNEL_RANGE
from .steps import Assign, Choose, Guard, KeptArenas, Launch, Note, Release, Return, Run, Step, WrapperPlan

log = logging.getLogger("fxforge")

_DTYPE_SHORT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


@dataclass
class Positions:
    """Where each node of a plan runs in the wrapper, and when each value dies: a group runs
    where its last node is scheduled (every member is emitted there, and the getitems of its
    nodes follow its kernel, ``late``); ``order`` is the order the wrapper emits nodes in;
    ``dead_at[i]``: the values whose last use is at position ``i`` (never a returned one)."""

    emit_at: dict[fx.Node, int]
    late: set[fx.Node]
    dead_at: dict[int, list[fx.Node]]
    order: list[fx.Node]


def positions(plan: Plan, returned: set[fx.Node]) -> Positions:
    sched = plan.schedule
    emit_at = {n: i for i, n in enumerate(sched)}
    late: set[fx.Node] = set()
    for g in plan.groups:
        last = max(emit_at[n] for n in g.nodes)
        for n in g.nodes:
            emit_at[n] = last
            for u in n.users:
                if u.target is operator.getitem and u in emit_at and plan.group_of(u) is None:
                    emit_at[u] = max(emit_at[u], last)
                    late.add(u)
    last_use: dict[fx.Node, int] = {}
    for n in sched:
        for u in n.users:
            if u.op != "output" and u in emit_at:
                last_use[n] = max(last_use.get(n, -1), emit_at[u])
    dead_at: dict[int, list[fx.Node]] = {}
    for n in sched:
        if n not in returned:
            dead_at.setdefault(last_use.get(n, emit_at[n]), []).append(n)
    rank = {n: i for i, n in enumerate(sched)}
    order = sorted(sched, key=lambda n: (emit_at[n], n in late, rank[n]))
    return Positions(emit_at, late, dead_at, order)


class _Planner:
    """Walks the schedule once (``build``), appending each node's steps and keeping what the walk
    needs to know at each point: the names bound, the arenas allocated and the buffers still to be
    written in each, the values laid out as traced, the kept arenas' views."""

    def __init__(self, gm: fx.GraphModule, plan: Plan, registry: Registry, config: Config, graph: str = "graph",
                 units: dict[str, Any] | None = None):
        self.gm, self.plan, self.registry, self.config = gm, plan, registry, config
        self.graph = graph
        self.taken = {n.name for n in gm.graph.nodes} | {"torch", "operator", "math", "call", "args"}
        self.globals: dict[str, Any] = {"torch": torch, "operator": operator, "math": math}
        self.const_names: dict[int, str] = {}
        self.sym: dict[sympy.Symbol, str] = {}
        self.pexpr = PyExprPrinter(self.sym)
        self.steps: list[Step] = []  # call()'s body (``steps.py``)
        self.kernels: list[Kernel] = []
        self.demoted: list[tuple[int, str]] = []
        self.demoted_nodes: set[fx.Node] = set()
        self.node_names = {n.name for n in gm.graph.nodes}
        self.returned = set(output_nodes(gm))
        # returned values whose storage nothing else the caller holds shares: no input, no other
        # returned value (``reinterpreted``)
        roots = {n: storage_root(n) for n in self.returned}
        holders = Counter(roots.values())
        self.private_returns = {n for n, r in roots.items() if r.op != "placeholder" and holders[r] == 1}
        self.unheld: list[str] = []
        self.bound: set[str] = set()  # local names currently bound in call(); only these are del'ed
        # values whose sizes and strides at run time are the traced ones (their storage offset may
        # differ): inputs (guarded, or restrided by inputs.check_inputs), planned buffers but
        # regions, values guard_layout checked, and views of these
        self.traced: set[str] = set()
        self.arena_alloced: set[str] = set()
        self.arena_pending: dict[str, int] = {}  # arena -> its buffers not yet bound
        self.arena_bound: dict[str, set[str]] = {}  # arena -> its buffers bound and not yet deleted
        self.arena_of: dict[str, str] = {}  # arena buffer name -> arena
        self.buffers_bound: set[str] = set()  # planned buffers given their names
        # Kept arenas (plan.memory.kept_bytes): the block, the arenas and the buffer views in them
        # are made once, by ``setup`` (a function of its own); ``call`` takes them at its start.
        self.kept = plan.memory.kept_bytes > 0
        self.arenas = {a.name: a for a in plan.memory.arenas}
        self.setup: list[Step] = []
        self.kept_names: dict[str, None] = {}  # made by _arenas(), in order
        self.ops: dict[tuple[str, str, str], torch._ops.OpOverload] = {}  # bound once: runtime.bind_ops
        # KernelContext.units: what each backend links at the end (begun by its ``ahead``, where given)
        self.units: dict[str, Any] = units if units is not None else {}

    # ------------------------------------------------------------------ naming

    def fresh(self, base: str) -> str:
        for i in itertools.count():
            name = base if i == 0 else f"{base}_{i}"
            if name not in self.taken:
                self.taken.add(name)
                return name
        raise AssertionError

    def const(self, v: Any) -> str:
        key = id(v)
        if key not in self.const_names:
            base = getattr(v, "__name__", None) or type(v).__name__
            base = "".join(c if c.isalnum() else "_" for c in base).strip("_") or "c"
            name = self.fresh(f"_{base}")
            self.globals[name] = v
            self.const_names[key] = name
        return self.const_names[key]

    def ref(self, n: fx.Node) -> str:
        return n.name

    def op(self, op: torch._ops.OpOverload) -> str:
        """Source calling ``op``: ``aten.mm.out``, a namespace of ops bound once at load (or
        torch's generated binding, ``runtime.PUBLIC_OUT``)."""
        if op in runtime.PUBLIC_OUT:
            return runtime.PUBLIC_OUT[op]
        ns, rest = op.name().split("::", 1)
        name, _, overload = rest.partition(".")
        key = (ns, name, overload or "default")
        if not all(k.isidentifier() and not keyword.iskeyword(k) for k in key) or ns in self.node_names:
            return op_path(op)
        self.ops[key] = op
        return ".".join(key)

    def buffer(self, node: fx.Node, index: int | None) -> str:
        b = self.plan.memory.of(node, index)
        if b is None:
            raise KeyError(f"no planned buffer for output {index} of {node.name}")
        return b.name

    def layout(self, node: fx.Node, index: int | None) -> tuple[tuple, tuple]:
        """The sizes and strides of a node's value as the plan lays it out: a region of a
        zero-copy cat/pad has its container's strides; every other value is laid out as traced."""
        src, i = (node.args[0], node.args[1]) if node_kind(node) == "getitem" else (node, index)
        b = self.plan.memory.of(src, i) if node_kind(src) == "compute" else None
        if b is not None and b.kind == "slice":
            return tuple(b.shape), tuple(b.stride)
        val = node.meta[VAL] if index is None else node.meta[VAL][index]
        return shape_of(val), strides_of(val)

    def size(self, e) -> str:
        return self.pexpr(e)

    # ------------------------------------------------------------------ symbols

    def bind_symbols_from(self, var: str, val: Any) -> None:
        """Bind every still-unbound plain symbol in ``val``'s sizes to a read of ``var``."""
        if isinstance(val, torch.Tensor):
            reads = [(s, f"{var}.size({d})") for d, s in enumerate(val.shape)]
            reads += [(s, f"{var}.stride({d})") for d, s in enumerate(val.stride())]
            reads.append((val.storage_offset(), f"{var}.storage_offset()"))
        elif isinstance(val, torch.SymInt):
            reads = [(val, var)]
        else:
            return
        for s, read in reads:
            e = expr(s) if isinstance(s, torch.SymInt) else None
            if isinstance(e, sympy.Symbol) and e not in self.sym:
                name = self.fresh(str(e) if str(e) not in self.taken else f"_{e}")
                self.sym[e] = name
                self.steps.append(Assign(name, read))

    # ------------------------------------------------------------------ emission

    def call_source(self, node: fx.Node) -> str:
        emulated = self.emulated_symmetric(node)
        if emulated is not None:
            return emulated
        t = node.target
        if t is operator.getitem:
            return f"{self.ref(node.args[0])}[{format_arg(node.args[1], self.ref, self.const)}]"
        if node_kind(node) == "view":
            view = self.reinterpreted(node)
            if view is not None:
                return view
        if t is torch.ops.aten._unsafe_view.default and node not in self.returned:
            # inside the call the same tensor as ``view`` (the graph is run without autograd); a
            # returned one stays ``_unsafe_view``: autograd must not see a view of an internal tensor
            t = torch.ops.aten.view.default
        if t in VIEW_METHODS and isinstance(node.args[0], fx.Node) and not node.kwargs:
            # a view through the Tensor method: torch's generated binding, the same ATen op
            return format_call(f"{self.ref(node.args[0])}.{VIEW_METHODS[t]}", node.args[1:], {}, self.ref, self.const)
        if isinstance(t, torch._ops.OpOverload):
            fn = self.op(t)
        elif getattr(operator, getattr(t, "__name__", ""), None) is t:
            fn = f"operator.{t.__name__}"
        else:
            fn = self.const(t)
        return format_call(fn, node.args, node.kwargs, self.ref, self.const)

    def reinterpreted(self, node: fx.Node) -> str | None:
        """A view of a value laid out as traced, at the view's traced sizes and strides and its
        offset from its base's (``runtime.reinterpret``: no view function, no argument parsing);
        None for views that are more than a layout (``conj``, ``_neg_view``: a bit on the tensor;
        a dtype view), where sizes are symbolic, or where the base may be laid out otherwise (a
        region of a cat or pad, a tensor an ATen kernel returned).  A returned one is made so too
        where its storage is its own among what the caller holds (``private_returns``): it is no
        autograd view of its base (as an ``_unsafe_view``), so AOTAutograd saves it for the
        backward as it is where it would detach a view first.  A returned view of
        an input, or sharing its storage with another returned value, keeps its op: it shares
        its base's version counter, so writing to one of them in place is seen by autograd's
        checks of the other, as in eager."""
        base = node.args[0] if node.args else None
        if node.target not in LAYOUT_VIEWS or not isinstance(base, fx.Node) or base.name not in self.traced:
            return None
        if node in self.returned and node not in self.private_returns:
            return None
        val, bval = node.meta.get(VAL), base.meta.get(VAL)
        if not (isinstance(val, torch.Tensor) and isinstance(bval, torch.Tensor)) or val.dtype != bval.dtype:
            return None
        if not all(type(x) is int for x in (*val.shape, *val.stride(), val.storage_offset(), bval.storage_offset())):
            return None
        self.globals["reinterpret"] = runtime.reinterpret
        return (f"reinterpret({self.ref(base)}, {_tuple(str(s) for s in val.shape)}, "
                f"{_tuple(str(s) for s in val.stride())}, {val.storage_offset() - bval.storage_offset()})")

    def traced_view(self, n: fx.Node) -> None:
        """``n``, a view just bound, is laid out as traced where its base is."""
        if n.args and isinstance(n.args[0], fx.Node) and n.args[0].name in self.traced:
            self.traced.add(n.name)

    def emulated_symmetric(self, node: fx.Node) -> str | None:
        """A symmetric-memory collective on CPU: the call of its emulation (``codegen/symmetric.py``),
        given the handle of the arena its input lives in."""
        t = node.target
        v = node.meta.get(VAL)
        ts = tensors(v)
        if not isinstance(t, torch._ops.OpOverload) or t.namespace != "symm_mem" or not ts or ts[0].device.type == "cuda":
            return None
        name = t.name().split("::", 1)[1].split(".", 1)[0]
        if name in symmetric.WORKSPACE_EMULATED:
            return format_call(self.const(symmetric.WORKSPACE_EMULATED[name]), node.args, node.kwargs, self.ref, self.const)
        args = [a for _, a in symmetric_arg_nodes(node)]
        b = self.plan.memory.of(args[0], None) if args else None
        if name not in symmetric.EMULATED or b is None or b.arena is None:
            return None  # not planned: runs as registered (and raises where it has no kernel)
        self.allocate_arena(b.arena)
        parts = [f"{b.arena}_h"] + [format_arg(a, self.ref, self.const) for a in node.args]
        parts += [f"{k}={format_arg(v, self.ref, self.const)}" for k, v in node.kwargs.items()]
        return f"{self.const(symmetric.EMULATED[name])}({', '.join(parts)})"

    def alloc(self, b: Buffer) -> str:
        shape = _tuple(self.size(s) for s in b.shape)
        stride = _tuple(self.size(s) for s in b.stride)
        if b.kind == "fresh" and b.reuses is not None:
            # written in place over a fresh buffer that dies here (passes/memory.py), read here
            # through a value laid out as the output from its first byte: hand out that buffer
            # in the output's layout, through the nearest bound name of that value's storage --
            # as a tensor of its own over that storage, no autograd view of it (the output may be
            # returned: the caller may write to it in place, as to eager's fresh result)
            x = next(a for a in b.producer.all_input_nodes if storage_root(a).name == b.reuses)
            while x is not None and x.name not in self.bound:  # a view made inside the kernel: what it was passed
                x = aliased_input(x)
            if x is None:
                raise AssertionError(f"{b.name}: no bound value holds the storage of {b.reuses}")
            self.globals["reinterpret"] = runtime.reinterpret
            return f"reinterpret({x.name}, {shape}, {stride}, -{x.name}.storage_offset())"
        if b.recycled:  # over the bytes of an earlier call's result that nothing holds any more
            self.globals["Recycled"] = runtime.Recycled
            return f"_recycled.empty({b.name!r}, {shape}, {stride}, {literal(b.dtype)})"
        if b.kind == "fresh":
            return self.empty(shape, stride, b.dtype, b.device)
        typed = self.typed_arena(b.arena, b.dtype)
        itemsize = b.dtype.itemsize
        at = sympy.sympify(b.offset)
        if self.held(b.arena):  # a typed view of the block: as_strided's offset counts from its start
            at = at + self.arenas[b.arena].block_offset
        offset = self.size(at / itemsize) if itemsize > 1 else self.size(at)
        return f"{typed}.as_strided({shape}, {stride}, {offset})"

    def empty(self, shape: str, stride: str, dtype: torch.dtype, device: Any) -> str:
        """A fresh tensor: on CPU through torch's fast allocator (``runtime.empty_strided_cpu``)."""
        if torch.device(device).type == "cpu":
            self.globals["empty_strided_cpu"] = runtime.empty_strided_cpu
            return f"empty_strided_cpu({shape}, {stride}, {literal(dtype)})"
        return f"torch.empty_strided({shape}, {stride}, dtype={literal(dtype)}, device={literal(device)})"

    def typed_arena(self, arena: str, dtype: torch.dtype) -> str:
        self.allocate_arena(arena)
        held = self.held(arena)
        if held:
            arena = "_block"  # kept arenas are places in one block: buffers are views of it
        name = f"{arena}_{_DTYPE_SHORT.get(dtype, str(dtype).replace('torch.', ''))}"
        if (arena, dtype) not in self._typed:
            self._typed[(arena, dtype)] = name
            (self.setup if held else self.steps).append(Assign(name, f"{arena}.view({literal(dtype)})"))
        return name

    def view_of_kept(self, n: fx.Node) -> bool:
        """``n`` views a value made once with the kept arenas, with constant arguments."""
        base = n.args[0] if n.args else None
        return (self.kept and isinstance(base, fx.Node) and base.name in self.kept_names
                and not _has_nodes((n.args[1:], n.kwargs)))

    def held(self, arena: str | None) -> bool:
        """The arena is kept in the block across calls: it and the views in it are made once, in
        ``setup`` (a symmetric arena is kept by its own ``SymmetricArena``)."""
        return self.kept and arena is not None and self.arenas[arena].symmetric is None

    def allocate_arena(self, arena: str) -> None:
        """Emit the arena's allocation, once, just before its first buffer is written."""
        if arena in self.arena_alloced:
            return
        self.arena_alloced.add(arena)
        a = self.arenas[arena]
        if a.symmetric is not None:
            self.globals[f"_{a.name}"] = symmetric.SymmetricArena(
                a.name, a.device, a.symmetric, a.alloc_id, a.start_barrier,
                sorted((b.name, self.plan.memory.hint(b.offset), self.plan.memory.hint(b.nbytes))
                       for b in self.plan.memory.buffers.values() if b.arena == a.name))
            self.steps += [Assign(f"{a.name}_h", f"_{a.name}.acquire({self.size(a.nbytes)})",
                                  f"{a.name}: symmetric memory of group {a.symmetric!r}, alloc id {a.alloc_id:#x}, "
                                  "kept across calls"),
                           Assign(a.name, f"{a.name}_h.local")]
        elif self.kept:
            end = a.block_offset + int(a.nbytes)
            self.setup.append(Note(f"{a.name}: bytes {a.block_offset}..{end} of the block, live {a.start}..{a.end}"))
            return  # the block is poisoned once per call
        else:
            self.steps.append(Assign(a.name, self.empty(f"({self.size(a.nbytes)},)", "(1,)", torch.uint8, a.device),
                                     f"{a.name}: live {a.start}..{a.end}"))
        if self.config.poison_arena:
            self.steps.append(Run(f"{a.name}.fill_(255)", "poison: NaN for floats"))

    def released(self, dead: list[str]) -> list[str]:
        """``dead`` plus every arena (and its typed views) whose last bound buffer is in ``dead``
        and none of whose buffers is still to be written."""
        extra = []
        for d in dead:
            arena = self.arena_of.get(d)
            if arena is None:
                continue
            bound = self.arena_bound[arena]
            bound.discard(d)
            if not bound and self.arena_pending[arena] == 0 and arena in self.arena_alloced:
                extra.append(arena)
                extra += [v for (a, _), v in self._typed.items() if a == arena]
        return dead + extra

    def bind_buffer(self, b: Buffer) -> None:
        if b.name in self.buffers_bound:
            return  # a cat/pad result, bound already for an input written into it
        self.buffers_bound.add(b.name)
        if b.kind != "slice":
            self.traced.add(b.name)
        if self.held(self.plan.memory.root(b).arena):
            if b.kind == "slice":
                self.bind_buffer(self.plan.memory.buffers[b.base])
            rhs = self.slice_source(b) if b.kind == "slice" else self.alloc(b)
            self.setup.append(Assign(b.name, rhs))
            self.kept_names[b.name] = None
            return
        if b.kind == "slice":
            self.bind_buffer(self.plan.memory.buffers[b.base])
            self.assign(b.name, self.slice_source(b))
            return
        self.assign(b.name, self.alloc(b))
        if b.kind == "arena":
            self.arena_pending[b.arena] -= 1
            self.arena_bound[b.arena].add(b.name)

    def slice_source(self, b: Buffer) -> str:
        """Source for slice buffer ``b``: its region of its base (a flat one viewed in its shape)."""
        base = self.plan.memory.buffers[b.base]
        if b.flat:
            (start,), (n,) = b.region, b.extent()
            return f"{base.name}[{self.size(start)}:{self.size(start + n)}].view({_tuple(self.size(x) for x in b.shape)})"
        return self.region(base.name, base, b.region, b.shape)

    def region(self, var: str, base: Buffer, start, shape) -> str:
        """Source for the view of ``var`` (laid out as ``base``) starting at ``start`` with ``shape``."""
        index = []
        for s, n, full in zip(start, shape, base.shape):
            index.append(":" if s == 0 and sympy.expand(n - full) == 0 else f"{self.size(s)}:{self.size(s + n)}")
        while index and index[-1] == ":":
            index.pop()
        return f"{var}[{', '.join(index)}]" if index else var

    def emit_zero_copy(self, g: Group) -> None:
        """A cat/pad whose inputs were written in place (passes/padcat.py): copy the others into
        their regions, fill a pad's border."""
        (n,) = [m for m in g.nodes if node_kind(m) == "compute"]
        b = self.plan.memory.of(n, None)
        self.bind_buffer(b)
        self.steps.append(Note(f"{n.name}: {op_display(n.target)} in place "
                               f"({sum(ZERO_COPY.of(n))} of {len(ZERO_COPY.of(n))} inputs written into it)"))
        for a, start, taken in zip(container_inputs(n), regions(n), ZERO_COPY.of(n)):
            if not taken:
                self.steps.append(Run(f"{self.region(b.name, b, start, _shape(a))}.copy_({format_arg(a, self.ref, self.const)})"))
        if n.target is PAD:
            value = n.args[2] if len(n.args) > 2 else n.kwargs.get("value", 0)
            for start, shape in pad_border(n):
                self.steps.append(Run(f"{self.region(b.name, b, start, shape)}.fill_({format_arg(value, self.ref, self.const)})"))

    def planned(self, g: Group) -> list[Buffer]:
        """The planned buffers the group's kernel writes."""
        out = []
        for n in g.nodes:
            if node_kind(n) != "compute":
                continue
            val = n.meta[VAL]
            for index in ([None] if isinstance(val, torch.Tensor) else range(len(val))):
                b = self.plan.memory.of(n, index)
                if b is not None:
                    out.append(b)
        return out

    def forget_buffers(self, g: Group) -> None:
        """A demoted group writes none of its planned buffers."""
        for b in self.planned(g):
            if b.kind == "arena":
                self.arena_pending[b.arena] -= 1

    def compile_group(self, g: Group) -> Kernel | None:
        backend = self.registry.get(g.backend)
        ctx = KernelContext(self.fresh(f"kernel{g.id}"), self.ref, self.buffer, self.const, self.config, self.layout,
                            self.op, self.units)
        try:
            k = backend.compile(g, ctx)
        except Exception as e:
            if self.config.debug:
                raise
            reason = f"{g.backend} failed to compile the group: {type(e).__name__}: {e}"
            log.warning("fxforge: group %d (%s) runs as eager fallback: %s", g.id, ", ".join(n.name for n in g.nodes), reason)
            self.demoted.append((g.id, reason))
            return None
        k.backend = g.backend
        if self.config.on_kernel is not None:
            self.config.on_kernel(k)
        if self.config.debug:
            self.check_cost(backend, g, k)
        self.globals.update(k.globals)
        return k

    def check_cost(self, backend, g: Group, k: Kernel) -> None:
        """What fusion was told a fused group's kernel takes is what the emitted kernel takes
        (debug mode): the check and the emitter cannot disagree."""
        if backend.fusion_cost is None or not backend.fuses or sum(node_kind(n) == "compute" for n in g.nodes) < 2:
            return
        cost = backend.fusion_cost(g.nodes, g.outputs, self.config)
        if isinstance(cost, str) or cost.num_args != k.num_args or cost.unique_io_buffers != k.unique_io_buffers:
            raise AssertionError(f"group {g.id} ({', '.join(n.name for n in g.nodes)}): {g.backend}'s fusion cost "
                                 f"{cost} disagrees with its kernel {k.name} ({k.num_args} launch arguments, "
                                 f"{k.unique_io_buffers} io buffers)")

    def build(self) -> WrapperPlan:
        plan = self.plan
        self._typed: dict[tuple[str, torch.dtype], str] = {}
        for b in plan.memory.buffers.values():
            if b.kind == "arena":
                self.arena_of[b.name] = b.arena
                self.arena_pending[b.arena] = self.arena_pending.get(b.arena, 0) + 1
                self.arena_bound.setdefault(b.arena, set())
        barriers: dict[str, list[str]] = {}
        for node_name, arena in plan.memory.barriers:
            barriers.setdefault(node_name, []).append(arena)
        at = positions(plan, self.returned)
        placeholders = [n for n in plan.schedule if n.op == "placeholder"]
        for n in placeholders:
            self.bound.add(n.name)
            self.bind_symbols_from(n.name, n.meta.get(VAL))
            if GUARD_INPUTS.get(self.gm):  # (a compiled region's caller passes its values as it has them)
                self.guard_layout(n)
            self.traced.add(n.name)
        next_node = dict(zip(at.order, at.order[1:]))
        for n in at.order:
            i = at.emit_at[n]
            self.emit_node(n)
            for arena in barriers.get(n.name, ()):
                self.steps.append(Run(f"{arena}_h.barrier()",
                                      f"every rank is done reading {arena}: its bytes may be written again"))
            if i == at.emit_at.get(next_node.get(n), -1):
                continue  # more nodes run at this position: release after the last of them
            dead = [d.name for d in at.dead_at.get(i, ()) if d.name in self.bound]
            dead += self.unheld  # buffers of outputs no node holds: dead once written
            self.unheld = []
            if dead:
                self.bound.difference_update(dead)
                self.steps.append(Release(tuple(self.released(dead))))
        out = next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")
        self.steps.append(Return(format_arg(out.args[0], self.ref, self.const)))
        return self.wrapper_plan(placeholders)

    @staticmethod
    def zero_copy(g: Group) -> bool:
        """Group ``g`` is a zero-copy cat or pad's views (``emit_zero_copy``)."""
        return any(ZERO_COPY.on(m) for m in g.nodes)

    def emit_node(self, n: fx.Node) -> None:
        """The lines of node ``n`` at its position: its group's kernel (at the group's last node),
        a zero-copy group's views, an eager call, or nothing (a kernel wrote it)."""
        kind = node_kind(n)
        g = self.plan.group_of(n)
        if kind == "placeholder":
            pass
        elif kind == "get_attr":
            if not (n.users and all(REGION.on(u) for u in n.users)):  # (a compiled region's body: never read)
                self.bind_attr(n)
        elif g is not None and (g.backend != FALLBACK_BACKEND or self.zero_copy(g)):
            # (asked of a kernel group once, at its last node; the other members: nothing)
            if n is g.nodes[-1]:
                if self.zero_copy(g):
                    self.emit_zero_copy(g)
                else:
                    self.emit_group(g)
        elif kind == "getitem" and self.written_by_kernel(n.args[0], n.args[1]):
            pass  # the producer's kernel wrote this planned buffer
        elif kind == "view" and g is None and self.view_of_kept(n):
            self.setup.append(Assign(n.name, self.call_source(n)))  # a view of kept bytes: made once too
            self.kept_names[n.name] = None
            self.traced_view(n)
        else:
            dispatches = CUSTOM_OP_DISPATCH.get(self.gm)  # custom_ops.Dispatches
            dispatch = dispatches.of(n) if dispatches else None
            if dispatch is not None:
                self.emit_dispatch(n, dispatch)
            else:
                if g is not None:
                    self.steps.append(Note(f"{n.name}: eager fallback ({g.reason})"))
                self.assign(n.name, self.call_source(n))
            if kind == "view" and g is None:
                self.traced_view(n)
            if kind in ("compute", "scalar"):
                self.bind_symbols_from(n.name, n.meta.get(VAL))
            if kind in ("compute", "getitem"):
                self.guard_layout(n)

    def wrapper_plan(self, placeholders: list[fx.Node]) -> WrapperPlan:
        """The plan of the module: the steps, the kept arenas, the kernels (each backend's
        ``units``, linked later: ``wrapper.link``) and the ops bound once at load."""
        if self.ops:
            self.globals.update(runtime.bind_ops(self.ops))
        kept = None
        if self.kept:
            device = next(a.device for a in self.plan.memory.arenas if a.symmetric is None)
            block = self.empty(f"({self.plan.memory.kept_bytes},)", "(1,)", torch.uint8, device)
            kept = KeptArenas(self.plan.memory.kept_bytes, block, self.setup, list(self.kept_names))
            self.globals["KeptArenas"] = runtime.KeptArenas
        self.globals[KERNEL_RANGE] = torch.profiler.record_function
        return WrapperPlan([n.name for n in placeholders], self.steps, kept, self.kernels, self.globals,
                           len(self.plan.memory.arenas), sorted({ns for ns, _, _ in self.ops}), self.config.poison_arena,
                           "Recycled" in self.globals, self.demoted, self.ops, self.units)

    def emit_dispatch(self, n: fx.Node, d) -> None:
        """A tuned custom op chosen per range of one size (``custom_ops.Dispatch``): an ``if``
        chain on the size, each branch calling its range's winner."""
        size = f"{format_arg(d.size_arg(n), self.ref, self.const)}.size({d.dim})"
        self.steps.append(Note(f"{n.name}: {n.target.name()} chosen per range of {d.tensor}.size({d.dim}) (custom-op tuning)"))
        cases = [(bound, format_call(self.op(branch) if isinstance(branch, torch._ops.OpOverload) else self.const(branch),
                                     n.args, n.kwargs, self.ref, self.const)) for bound, branch in zip(d.bounds, d.branches)]
        self.steps.append(Choose(n.name, size, tuple(cases)))
        self.bound.add(n.name)

    def assign(self, name: str, rhs: str) -> None:
        self.steps.append(Assign(name, rhs))
        self.bound.add(name)

    def bind_attr(self, n: fx.Node) -> None:
        """The value of get_attr node ``n``, a global of the wrapper."""
        self.globals[n.name] = fetch_attr(self.gm, n.target)
        self.traced.add(n.name)

    def read_at_traced_layout(self, node: fx.Node) -> bool:
        """A generated kernel reads ``node``'s value, or a view of it, indexing with the strides
        traced (a fusing backend that does not read its inputs' own strides)."""
        for u in node.users:
            if node_kind(u) == "view" and self.read_at_traced_layout(u):
                return True
            g = self.plan.group_of(u)
            if g is None or g.backend == FALLBACK_BACKEND or u in self.demoted_nodes:
                continue
            backend = self.registry.get(g.backend)
            if backend.fuses and not backend.reads_views:
                return True
        return False

    def guard_layout(self, node: fx.Node) -> None:
        """A tensor an ATen kernel allocated (an eager fallback, an op without an out form) may
        come back laid out otherwise than its meta function traced it: on CPU,
        ``native_layer_norm_backward`` returns a contiguous grad_input where the trace follows
        grad_out's strides.  A kernel reading it at the traced strides would read the wrong
        elements, so where one does, a mismatch is copied to the traced layout."""
        val = node.meta.get(VAL)
        if not isinstance(val, torch.Tensor) or not self.read_at_traced_layout(node):
            return
        try:
            stride = _tuple(self.size(s) for s in val.stride())
        except KeyError:  # a size the wrapper has no name for: the kernel's own checks apply
            return
        self.steps.append(Guard(node.name, stride))
        self.globals["as_traced"] = runtime.as_traced
        self.traced.add(node.name)

    def written_by_kernel(self, producer: fx.Node, index: int | None) -> bool:
        return producer not in self.demoted_nodes and self.plan.memory.of(producer, index) is not None

    def emit_group(self, g: Group) -> None:
        k = self.compile_group(g)
        if k is None:
            self.demoted_nodes.update(g.nodes)
            self.forget_buffers(g)
            for n in g.nodes:
                self.steps.append(Note(f"{n.name}: eager fallback (kernel failed to compile)"))
                for a in n.all_input_nodes:
                    if a.op == "get_attr":
                        self.bind_attr(a)
                self.assign(n.name, self.call_source(n))
                b = self.plan.memory.of(n, None) if node_kind(n) == "compute" else None
                if b is not None and b.kind == "slice":  # its cat/pad expects it in place
                    self.bind_buffer(self.plan.memory.buffers[b.base])
                    self.steps.append(Run(f"{self.slice_source(b)}.copy_({n.name})"))
            return
        for b in self.planned(g):
            self.bind_buffer(b)
            if b.name not in self.node_names and b.name not in self.kept_names:
                self.unheld.append(b.name)
        self.kernels.append(k)
        self.steps.append(Launch(k.name, tuple(k.args), tuple(k.returns), kernel_range(self.graph, k, g)))
        self.bound.update(k.returns)
        for n in g.nodes:
            if n.name in k.returns:
                self.guard_layout(n)


# Ops named in a kernel's range, at most (then "...").
RANGE_OPS = 6


def kernel_range(graph: str, k: Kernel, g: Group) -> str:
    """The profiler range of kernel ``k`` (group ``g``) of ``graph``: ``fxforge forward-0
    kernel3 [c] add, mul, gelu``, its group's distinct ops in schedule order."""
    ops = list(dict.fromkeys(op_display(n.target).split(".")[1] if isinstance(n.target, torch._ops.OpOverload)
                             else op_display(n.target) for n in g.nodes if node_kind(n) == "compute"))
    shown = ", ".join(ops[:RANGE_OPS]) + (", ..." if len(ops) > RANGE_OPS else "")
    return f"fxforge {graph} {k.name} [{k.backend}] {shown}"


def _has_nodes(args) -> bool:
    found: list[fx.Node] = []
    fx.node.map_arg(args, found.append)
    return bool(found)


def _shape(n: fx.Node) -> tuple:
    return tuple(expr(s) for s in n.meta[VAL].shape)


def _tuple(items) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def plan_wrapper(gm: fx.GraphModule, plan: Plan, registry: Registry, config: Config, graph: str = "graph",
                 units: dict[str, Any] | None = None) -> WrapperPlan:
    """The wrapper plan of ``gm`` (``graph``: its name in profiler ranges; ``units``: the
    backends' units their ``ahead`` began)."""
    return _Planner(gm, plan, registry, config, graph, units).build()


# Views that are only a layout (sizes, strides, offset) of their base's elements: the wrapper
# may make them with ``runtime.reinterpret`` (``_Planner.reinterpreted``).  Not ``conj`` or
# ``_neg_view`` (a bit on the tensor), not dtype views, not ``reshape`` (a copy where no view fits).
LAYOUT_VIEWS = {
    torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
    torch.ops.aten.t.default, torch.ops.aten.transpose.int, torch.ops.aten.permute.default,
    torch.ops.aten.expand.default, torch.ops.aten.unsqueeze.default, torch.ops.aten.squeeze.default,
    torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims, torch.ops.aten.select.int,
    torch.ops.aten.slice.Tensor, torch.ops.aten.as_strided.default, torch.ops.aten.alias.default,
    torch.ops.aten.detach.default, torch.ops.aten.diagonal.default, torch.ops.aten.unfold.default,
}


# Views the wrapper makes through the Tensor method (torch's generated binding) rather than
# through the op: the same ATen op, without the generic path.
VIEW_METHODS = {
    torch.ops.aten.view.default: "view",
    torch.ops.aten.permute.default: "permute",
    torch.ops.aten.t.default: "t",
    torch.ops.aten.transpose.int: "transpose",
    torch.ops.aten.expand.default: "expand",
    torch.ops.aten.unsqueeze.default: "unsqueeze",
    torch.ops.aten.squeeze.dim: "squeeze",
    torch.ops.aten.select.int: "select",
    torch.ops.aten.as_strided.default: "as_strided",
}
