"""Lowering a group of ATen nodes to one kernel: the walk every kernel language shares.

``Emitter`` decides a group's loop nest (``Frame``: pointwise, one flat index ``xindex`` over the
output's elements; reduction, rows ``xindex`` over the kept dims times ``rindex`` over the
reduced ones), its parameters (tensors, symbolic sizes read off them at launch, scalars), the
index math (coordinates of the flat indices, each tensor read or written at ``sum(coord *
stride)`` with its own strides, exact divisions folded, ``indexing.py``) and each member's value
(``codegen/ir``: what an op computes is written there once), in one walk over the members in
schedule order.  The walk writes the kernel's statements (``stmts.py``: index locals, loads,
lets, stores, loop nests) into ``body``.  A language's kernel module subclasses ``Emitter`` for
what differs (``fold``, ``loop``, ``persistent``, ``open_persistent``, and ``add_load``,
``bind`` or ``store`` where it places elements its own way), with its ``values`` printer
and its element types (``SIG_DTYPE``); its ``launch`` prints the statements.
"""


from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ...core.graph import VAL, aliased_input, expr, free_symbols, is_mutating, node_kind, tensors
from ...core.iteration import node_shape, reduction_of, same_size, shape_of
from ..indexing import floor_div, modular
from ..pyexpr import PyExprPrinter
from . import aten as ir_aten, values as ir
from .stmts import EmptyCheck, Index, Let, Load, SizeRead, Stmt, Store, prologue_lines
from .aten import REDUCTIONS, Reduction
from .printer import ValuePrinter
from .rows import Frame, check_operand, check_view, domain, frame_of, internal, leading, root, trailing
from .values import LOW_PRECISION, Const, Domain, Elem, Role, Unsupported, Value, Var, compute_dtype

INT32_MAX = 2**31 - 1


@dataclass
class Param:
    name: str  # kernel parameter
    sig: str  # signature type: ``*`` + the element type for a tensor, else "i64", "i1" or "fp32"
    launch: str  # launch-function expression passing it


# --------------------------------------------------------------------------- emitter


def _is_int(e: sympy.Expr) -> bool:
    return sympy.sympify(e).is_Integer


def _contiguous(shape: list, stride: list) -> bool:
    """Row-major dense strides (size-1 dims may have any stride)."""
    inner = sympy.Integer(1)
    for s, st in zip(reversed(shape), reversed(stride)):
        if s != 1 and not same_size(st, inner):
            return False
        inner = inner * s
    return True


def node_refusal(node: fx.Node, dtypes, language: str, masked_outputs: bool = False) -> str | None:
    """Why a kernel emitted by this emitter (in ``language``, for element types ``dtypes``) cannot
    run ``node``, whatever the op: not an ATen operator, mutating, non-tensor outputs, a dtype
    without a lowering, a non-strided tensor, tensors on several devices, an output whose size
    depends on data or is statically empty.  None: it is up to the op's lowering.
    ``masked_outputs``: outputs an op leaves uncomputed (None, by an output mask) are allowed, for
    kernels that write only the others (``codegen/c/templates.py``)."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return "not an ATen operator"
    if is_mutating(node):
        return "mutates its inputs"
    val = node.meta.get(VAL)
    outs = tensors(val)
    computed = [v for v in val if not (masked_outputs and v is None)] if isinstance(val, (list, tuple)) else None
    if not outs or (computed is not None and len(outs) != len(computed)):
        return "returns non-tensor values"
    every = outs + [t for a in node.all_input_nodes for t in tensors(a.meta.get(VAL))]
    for t in every:
        if t.dtype not in dtypes:
            return f"dtype {t.dtype} has no {language} lowering"
        if t.layout != torch.strided or t.is_sparse:
            return "non-strided layout"
    if len({t.device for t in every}) > 1:
        return "tensors on several devices"
    if any(s.name.startswith("u") for s in free_symbols(val)):
        return "data-dependent output size"
    if any(t.numel() == 0 for t in outs if not free_symbols(t)):
        return "empty output"
    return None


XINDEX, RINDEX = "xindex", "rindex"
X = sympy.Symbol(XINDEX, integer=True, nonnegative=True)
R = sympy.Symbol(RINDEX, integer=True, nonnegative=True)


@dataclass(frozen=True)
class Placed:
    """A tensor value as the plan lays it out when that differs from its trace: a region of a
    larger buffer (zero-copy cat/pad), strided as that buffer.  Its data pointer is the region's
    first element.  Offers what the emitter reads of a tensor value."""

    dtype: torch.dtype
    shape: tuple
    strides: tuple

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def stride(self) -> tuple:
        return self.strides

    def storage_offset(self) -> int:
        return 0


class Emitter:
    """Walks a group's members and writes a kernel body (module docstring)."""

    values: ValuePrinter  # the language's
    SIG_DTYPE: dict[torch.dtype, str]  # element types the language reads and writes

    def __init__(self, name: str, ref, buffer, nodes: list[fx.Node], outputs: list[fx.Node] | None = None,
                 layout=None):
        self.name = name
        self.ref, self.buffer = ref, buffer
        self.layout = layout  # KernelContext.layout (None: every value as traced)
        self.nodes = [n for n in nodes if node_kind(n) == "compute"]
        self.order = list(nodes)  # members in schedule order (what reaches the source follows it)
        self.members = set(nodes)
        self.outputs = outputs
        self.params: list[Param] = []
        self.args: list[str] = []  # launch-function parameters (wrapper variable names)
        self.arg_index: dict[str, int] = {}
        self.size_reads: list[SizeRead] = []  # the launch's size parameters, in order
        self.sym_names: dict[sympy.Symbol, str] = {}  # graph symbol -> ks param symbol
        self.expr_syms: dict[sympy.Expr, sympy.Symbol] = {}
        self.reads: list[tuple[sympy.Expr, tuple[str, str, int]]] = []  # (fake expr, (arg, "size"/"stride", dim))
        self.body: list[Stmt] = []  # the statements of the open scope (``stmts.py``)
        self.tensor_params: dict[tuple[str, int | None], str] = {}
        self.specs: dict[str, tuple] = {}  # tensor parameter -> (dtype, sizes, strides) as traced or planned
        self.int64 = False
        self.scalar_params: dict[fx.Node, str] = {}
        self.storages: set[str] = set()
        self.scopes: list[dict] = [{}]  # the kernel's top level, then the open loop's body
        self.n_locals = 0
        self.deps: dict[str, set[str]] = {}  # index local -> the indices it varies with
        self.defs: dict[sympy.Symbol, sympy.Expr] = {}  # index local -> the expression it holds
        self.flat_of: dict[tuple, tuple] = {}  # coordinates -> (shape, flat index) they decompose
        self.launch_checks: list[EmptyCheck] = []
        self.reductions: list[fx.Node] = []
        self.out_set = set(self.outputs_of())

    # ---------------------------------------------------------------- arguments

    def launch_arg(self, var: str) -> str:
        if var not in self.arg_index:
            self.arg_index[var] = len(self.args)
            self.args.append(var)
        return var

    def tensor(self, var: str, val: torch.Tensor, role: Role) -> str:
        key = (var, role)
        if key not in self.tensor_params:
            pname = f"{role}_ptr{sum(1 for k in self.tensor_params if k[1] == role)}"
            if val.dtype not in self.SIG_DTYPE:
                raise Unsupported(f"dtype {val.dtype}")
            self.params.append(Param(pname, "*" + self.SIG_DTYPE[val.dtype], self.launch_arg(var)))
            self.tensor_params[key] = pname
            self.specs[pname] = (val.dtype, tuple(val.shape), tuple(val.stride()))
            self.storages.add(var)
            self.readable(var, val)
        return self.tensor_params[key]

    def placed(self, n: fx.Node, index: int | None, val: torch.Tensor):
        """``val`` (output ``index`` of ``n``) as the kernel indexes it: at the planned layout."""
        if self.layout is None:
            return val
        shape, stride = self.layout(n, index)
        if all(same_size(a, expr(b)) for a, b in zip(stride, val.stride())):
            return val
        return Placed(val.dtype, tuple(val.shape), tuple(stride))

    def readable(self, var: str, val: torch.Tensor) -> None:
        """Sizes/strides of ``val`` that are plain symbols can be read off ``var`` at launch."""
        for d, (s, st) in enumerate(zip(val.shape, val.stride())):
            self.reads.append((expr(s), (var, "size", d)))
            self.reads.append((expr(st), (var, "stride", d)))

    def size(self, e: Any) -> sympy.Expr:
        """A fake size/stride as an expression over kernel parameter symbols."""
        e = sympy.sympify(expr(e) if not isinstance(e, sympy.Basic) else e)
        if e.is_Integer:
            return e
        for s in sorted(e.free_symbols, key=str):  # (in one order: the same kernel text in every process)
            if s not in self.sym_names:
                read = next((r for x, r in self.reads if x == s), None)
                if read is None:
                    break
                self.sym_names[s] = self.new_param(read, positive=True)
        else:
            return e.xreplace(self.sym_names)
        if e not in self.expr_syms:
            read = next((r for x, r in self.reads if x == e), None)
            if read is None:
                raise Unsupported(f"cannot read size {e} off the kernel's tensors")
            self.expr_syms[e] = self.new_param(read, positive=False)
        return self.expr_syms[e]

    def new_param(self, read: tuple[str, str, int], positive: bool) -> sympy.Symbol:
        name = f"ks{sum(1 for p in self.params if p.name.startswith('ks'))}"
        self.params.append(Param(name, "i64", name))
        self.launch_arg(read[0])
        self.size_reads.append(SizeRead(name, *read))
        self.int64 = True  # symbolic sizes: indices may exceed int32 for some sizes
        return sympy.Symbol(name, integer=True, positive=True) if positive else sympy.Symbol(name, integer=True, nonnegative=True)

    def scalar(self, n: fx.Node) -> Var:
        if n not in self.scalar_params:
            v = n.meta.get(VAL)
            dt = torch.bool if isinstance(v, (bool, torch.SymBool)) else (
                torch.float32 if isinstance(v, (float, torch.SymFloat)) else torch.int64)
            pname = f"sc{len(self.scalar_params)}"
            sig = {torch.bool: "i1", torch.float32: "fp32", torch.int64: "i64"}[dt]
            self.params.append(Param(pname, sig, self.launch_arg(self.ref(n))))
            self.scalar_params[n] = pname
        return Var(self.scalar_params[n], {"i1": torch.bool, "fp32": torch.float32, "i64": torch.int64}[
            next(p.sig for p in self.params if p.name == self.scalar_params[n])])

    # ---------------------------------------------------------------- scopes and index math
    #
    # Values and coordinates are computed once per scope: the kernel's top level, or the body of
    # one ``for roffset`` loop of a looped reduction (whatever a loop computes is gone after it).

    def lookup(self, key):
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def remember(self, key, v):
        self.scopes[-1][key] = v
        return v

    def fresh(self, prefix: str) -> str:
        self.n_locals += 1
        return f"{prefix}{self.n_locals}"

    def deps_of(self, e: sympy.Expr) -> set[str]:
        """Which of ``xindex`` / ``rindex`` an index expression varies with."""
        out: set[str] = set()
        for s in sympy.sympify(e).free_symbols:
            out |= {s.name} if s.name in (XINDEX, RINDEX) else self.deps.get(s.name, set())
        return out

    def local(self, e: sympy.Expr) -> sympy.Expr:
        """``e`` as an integer local of the kernel (named after the indices it varies with)."""
        if e.is_Integer or e.is_Symbol:
            return e
        deps = self.deps_of(e)
        name = self.fresh("x" if deps == {XINDEX} else "r" if deps == {RINDEX} else "f")
        self.body.append(Index(name, e))
        return self.define(name, e, deps)

    def define(self, name: str, e: sympy.Expr, deps: set[str]) -> sympy.Symbol:
        """The symbol of the index local ``name``, which holds ``e`` (emitted by ``local``)."""
        self.deps[name] = deps
        sym = sympy.Symbol(name, integer=True, nonnegative=True)
        self.defs[sym] = e
        return sym

    def index_bound(self, sym: sympy.Symbol) -> int | None:
        """An exclusive upper bound of the loop index ``sym`` that holds for every element the
        kernel computes (None: unknown).  None here: a Triton block's masked lanes run past it."""
        return None

    def fold_index(self, index: sympy.Expr, div: sympy.Expr, mod: sympy.Expr | None) -> sympy.Expr | None:
        """``index // div`` (``% mod``) with the divisions the loop indices' ranges make exact
        folded away (``indexing.py``), or None."""
        if not div.is_Integer or (mod is not None and not mod.is_Integer):
            return None
        e = index
        for _ in range(4):  # through locals holding other locals
            e = e.xreplace(self.defs)
        if mod is None:
            return floor_div(e, int(div), self.index_bound) if div != 1 else None
        return modular(e, int(div), int(mod), self.index_bound)

    def coords(self, shape: list[sympy.Expr], index: sympy.Expr) -> list[sympy.Expr]:
        """Row-major coordinates of the flat ``index`` over ``shape`` (kernel-parameter sizes)."""
        key = ("coords", tuple(shape), index)
        found = self.lookup(key)
        if found is not None:
            return found
        exprs: list[sympy.Expr] = []
        inner = sympy.Integer(1)
        for d in reversed(range(len(shape))):
            s = shape[d]
            if s == 1 or inner == 0:  # (an inner dim of size 0: the shape has no element to place)
                exprs.append(sympy.Integer(0))
            elif d == 0 or all(x == 1 for x in shape[:d]):
                folded = self.fold_index(index, inner, None)  # (a sympy 0 is falsy: compare with None)
                exprs.append(folded if folded is not None else FloorDiv(index, inner) if inner != 1 else index)
            else:
                folded = self.fold_index(index, inner, s)
                exprs.append(folded if folded is not None else ModularIndexing(index, inner, s))
            inner = inner * s
        out = [self.local(e) for e in reversed(exprs)]
        self.flat_of[tuple(out)] = (tuple(shape), index)
        return self.remember(key, out)

    def coords_of(self, shape: tuple, dom: Domain) -> dict[int, sympy.Expr]:
        """Coordinates of the element that a value of (graph) ``shape`` computes in domain ``dom``:
        row values (``Domain.ROW``) sit at the flat row index ``xindex``; full values (``ELEMENT``)
        at the element (xindex, rindex) of a reduction's input layout, or at the flat position of
        that element in the frame's shape (values reshaped from it)."""
        ks = [self.size(s) for s in shape]
        layout = self.frame.layouts.get(shape)
        if dom == Domain.ROW:
            return dict(enumerate(self.coords(ks, X)))
        if layout is not None:
            kept = [d for d in range(len(shape)) if d not in layout]
            xc = self.coords([ks[d] for d in kept], X)
            rc = self.coords([ks[d] for d in layout], R)
            c = {**dict(zip(kept, xc)), **dict(zip(layout, rc))}
            if trailing(shape, layout):  # row-major: row xindex holds [xindex * rnumel, ...)
                self.flat_of[tuple(c[d] for d in range(len(shape)))] = (tuple(ks), X * self.frame.rnumel + R)
            elif leading(shape, layout):  # columns: element (xindex, rindex) at rindex * xnumel + xindex
                self.flat_of[tuple(c[d] for d in range(len(shape)))] = (tuple(ks), R * self.frame.xnumel + X)
            return c
        return dict(enumerate(self.coords(ks, self.flat_index())))

    def flat_index(self) -> sympy.Expr:
        """Row-major position, in the frame's shape, of the element (xindex, rindex) computes."""
        found = self.lookup(("flat",))
        if found is None:
            shape = self.frame.shape
            c = self.coords_of(shape, Domain.ELEMENT)
            e, inner = sympy.Integer(0), sympy.Integer(1)
            for d in reversed(range(len(shape))):
                e, inner = e + c[d] * inner, inner * self.size(shape[d])
            found = self.remember(("flat",), self.local(e))
        return found

    def offset(self, val: torch.Tensor, coords: dict[int, sympy.Expr], out_rank: int, dom: Domain,
               base: sympy.Expr = sympy.Integer(0)) -> sympy.Expr:
        """Element offset of ``val`` (right-aligned to ``out_rank`` dims, broadcast dims have no
        stride) at ``coords``, plus ``base``.  The offset varies with every index of ``dom`` (a
        broadcast read still needs a pointer block of the full shape)."""
        e = base
        lead = out_rank - val.ndim
        flat = self.flat_of.get(tuple(coords[d] for d in range(out_rank)) if len(coords) == out_rank else None)
        shape = [self.size(s) for s in val.shape]
        strides = [self.size(s) for s in val.stride()]
        if lead == 0 and flat is not None and list(flat[0]) == shape and _contiguous(shape, strides):
            return e + flat[1]  # a contiguous tensor read at its own flat index
        done: set[int] = set()
        for j, index, inner in self.contiguous_groups(coords, lead, shape, strides):
            if not done & set(j):  # (groups may overlap: a row's coordinates and every element's)
                e, done = e + index * inner, done | set(j)
        for j in range(val.ndim):
            if shape[j] == 1 or j in done:
                continue
            c = coords.get(lead + j)
            if c is not None:
                e = e + c * strides[j]
        return e

    def contiguous_groups(self, coords: dict[int, sympy.Expr], lead: int, shape: list, strides: list):
        """The dims of a tensor (``shape``, ``strides``; right-aligned at ``lead``) whose
        coordinates one flat index made (``coords``: ``flat_of``), at least two of more than one
        element, laid out contiguously one in the next: their offset is that index times the
        innermost one's stride (a channels-last batch norm's sums over N, H and W read rows of C
        at ``C * rindex``, with no coordinate of their own).  Yields (dims, index, stride)."""
        at = {c: d - lead for d, c in coords.items() if d >= lead and not isinstance(c, sympy.Integer)}
        for group, (sizes, index) in self.flat_of.items():
            # (a constant coordinate is a dim of one element, which adds nothing to the index)
            if any(isinstance(c, sympy.Integer) and s != 1 for s, c in zip(sizes, group)):
                continue
            real = [(s, c) for s, c in zip(sizes, group) if not isinstance(c, sympy.Integer)]
            dims = [at.get(c) for _, c in real]
            if len(dims) < 2 or None in dims or dims != sorted(set(dims)) or [shape[j] for j in dims] != [s for s, _ in real]:
                continue
            if all(sympy.expand(strides[a] - strides[b] * shape[b]) == 0 for a, b in zip(dims, dims[1:])):
                yield dims, index, strides[dims[-1]]

    def check_int64(self, vals: list[torch.Tensor]) -> None:
        for v in vals:
            span = 1 + sum((expr(s) - 1) * expr(st) for s, st in zip(v.shape, v.stride()))
            numel = sympy.prod([expr(s) for s in v.shape]) if v.ndim else sympy.Integer(1)
            for e in (sympy.sympify(span), sympy.sympify(numel)):
                if not e.is_Integer or int(e) > INT32_MAX // 2:
                    self.int64 = True

    # ---------------------------------------------------------------- values

    def internal(self, a: fx.Node) -> bool:
        """``a``'s value is computed by this kernel (it is never read from memory: ``rows.internal``)."""
        return internal(self.members, a)

    def root(self, a: fx.Node) -> fx.Node:
        """The tensor outside the kernel that a member view of one reads (``a`` itself otherwise)."""
        return root(self.members, a)

    def dom(self, n: fx.Node) -> Domain:
        """``Domain.ROW``: one value per row; ``ELEMENT``: one per element of the rows (``rows.domain``)."""
        return domain(self.frame, n, self.reductions)

    def load(self, a: fx.Node, shape: tuple, dom: Domain) -> Value:
        """Tensor ``a``, read from memory for a value of ``shape`` in ``dom`` (broadcast as eager)."""
        key = ("load", a, shape, dom)
        found = self.lookup(key)
        if found is not None:
            return found
        val = a.meta[VAL]
        root = self.root(a)
        rval = root.meta[VAL]
        if not isinstance(rval, torch.Tensor) or rval.dtype != val.dtype:
            raise Unsupported(f"{a.name}: a view changing the dtype inside the kernel")
        rval = self.placed(root, None, rval)
        ptr = self.tensor(self.ref(root), rval, Role.IN)
        base = sympy.Integer(0)
        if root is not a:  # a view of it, with the view's own layout
            if isinstance(rval, Placed):
                raise Unsupported(f"{a.name}: a view of {root.name}, which the plan placed in a region of a larger buffer")
            base = self.size(val.storage_offset()) - self.size(rval.storage_offset())
        else:
            val = rval
        off = self.offset(val, self.coords_of(shape, dom), len(shape), dom, base)
        name = self.fresh("tmp")
        self.add_load(name, ptr, off, dom, val.dtype)
        return self.remember(key, ir.cast(Var(name, val.dtype), compute_dtype(val.dtype)))

    def operand(self, a: Any, shape: tuple, dom: Domain) -> Value:
        """Argument ``a`` of a member computing a value of ``shape`` in ``dom``."""
        if not isinstance(a, fx.Node):
            raise Unsupported(f"operand {a!r}")
        if not isinstance(a.meta.get(VAL), torch.Tensor):
            return self.scalar(a)
        if not self.internal(a):
            return self.load(a, shape, dom)
        v = self.value(a)
        check_operand(self.frame, a, self.dom(a), shape, dom)
        return v

    def value(self, n: fx.Node):
        """The value of member ``n`` (a ``Value``; a list for a multi-output reduction)."""
        found = self.lookup(("v", n))
        if found is not None:
            return found
        if n.target is operator.getitem:
            return self.value(n.args[0])[n.args[1]]
        if n in self.reductions:
            raise Unsupported(f"{n.name} is read before its reduction ran")
        if node_kind(n) == "view":
            v = self.value(aliased_input(n))
            check_view(self.frame, n, self.dom)
            return self.remember(("v", n), v)
        shape, dom = node_shape(n), self.dom(n)
        v = ir_aten.lower(n, lambda a: self.operand(a, shape, dom), self.scalar)
        dt = n.meta[VAL].dtype
        # the value has the node's dtype from here on (rounded like eager between ops): a
        # conversion (float -> int truncates, int64 -> int32 wraps, -> bool tests != 0, fp64 ->
        # fp32 rounds) takes effect for the members reading it, not only at a store
        v = ir.cast(v, dt)
        if dt in LOW_PRECISION:
            v = ir.cast(v, compute_dtype(dt))
        if not isinstance(v, Const):
            v = self.bind(self.value_name(n), v)
        return self.remember(("v", n), v)

    def value_name(self, n: fx.Node) -> str:
        """The kernel local holding member ``n``'s value."""
        return f"v_{n.name}"

    def outputs_of(self) -> list[fx.Node]:
        if self.outputs:
            members = set(self.nodes)
            return [n for n in self.outputs if n in members]
        return list(self.nodes)

    def emit(self):
        """The group's kernel (``launch``'s).  Members are lowered in schedule order; in a looped
        reduction the full values are recomputed inside each loop that needs them (each
        reduction's loop, then one loop storing the full outputs)."""
        self.reductions = [n for n in self.nodes if reduction_of(n) is not None]
        for n in self.nodes:
            if n not in self.reductions and not isinstance(n.meta.get(VAL), torch.Tensor):
                raise Unsupported("multi-output pointwise node")
        outs = self.outputs_of()
        outs_placed = []
        for n in outs:
            val = n.meta[VAL]
            multi = isinstance(val, (tuple, list))
            for i, t in enumerate(val if multi else [val]):
                t = self.placed(n, i if multi else None, t)
                self.tensor(self.buffer(n, i if multi else None), t, Role.OUT)
                outs_placed.append(t)
        ins = []
        for n in self.order:
            for a in n.all_input_nodes:
                if a not in self.members and not self.internal(a) and isinstance(a.meta.get(VAL), torch.Tensor):
                    ins.append(self.placed(a, None, a.meta[VAL]))
                    self.readable(self.ref(a), ins[-1])
        self.frame = self.frame_of()
        fr = self.frame
        self.check_int64([t for n in self.members for t in tensors(n.meta.get(VAL))] + outs_placed + ins)
        persistent = self.persistent()
        if fr.reduction:  # the rows' coordinates, once at the top level
            ks = [self.size(s) for s in fr.shape]
            self.coords([ks[d] for d in range(len(ks)) if d not in fr.layouts[fr.shape]], X)
        if fr.reduction and persistent:
            self.open_persistent()
        for n in self.nodes:
            if n in self.reductions:
                self.reduce(n, persistent)
            elif persistent or self.dom(n) == Domain.ROW:
                self.value(n)
        full = self.full_outputs()
        for n in outs:
            if n not in self.reductions and n not in full:
                self.store(n, None, n.meta[VAL], self.value(n), Domain.ROW)
        if full:
            self.store_full(full, persistent)
        return self.launch()

    def full_outputs(self) -> list[fx.Node]:
        """The outputs with one value per element of the rows (``Domain.ELEMENT``), not per row."""
        return [n for n in self.outputs_of() if n not in self.reductions and self.dom(n) == Domain.ELEMENT]

    def store_full(self, full: list[fx.Node], persistent: bool) -> None:
        """Store the full outputs (after the folds, recomputing their values in a loop of their own)."""
        def store():
            for n in full:
                self.store(n, None, n.meta[VAL], self.value(n), Domain.ELEMENT)
        store() if persistent else self.loop(store, independent=True)

    def frame_of(self) -> Frame:
        """The group's loop nest (``rows.frame_of``), its sizes over the kernel's parameters."""
        return frame_of(self.order, self.reductions, self.size_expr)

    def size_expr(self, e) -> sympy.Expr:
        e = sympy.sympify(e)
        return e if e.is_Integer else sympy.sympify(e).xreplace({s: self.size(s) for s in sorted(e.free_symbols, key=str)})

    def reduce(self, n: fx.Node, persistent: bool) -> None:
        """Emit reduction ``n`` (at the kernel's top level): its row results, stored if it is an
        output, and remembered for the members after it.  How it folds a row is the kind's
        ``ir.aten.REDUCTIONS`` entry."""
        r = reduction_of(n)
        low = REDUCTIONS[r.kind]
        val = n.meta[VAL]
        multi = isinstance(val, (tuple, list))
        out_vals = list(val) if multi else [val]
        acc_dt = self.accumulator(low, r.inp.meta[VAL].dtype, out_vals[0].dtype)
        accs = self.fold(r, low, acc_dt, persistent)
        results = [ir_aten.result(k, accs, self.frame.rnumel, r.correction) for k in low.results]
        if len(results) != len(out_vals):
            raise Unsupported(f"{r.kind}: {len(out_vals)} outputs")
        rounded = []
        for i, (ov, res) in enumerate(zip(out_vals, results)):
            res = ir.cast(res, ov.dtype)
            if not isinstance(res, (Var, Elem)):  # (a name or an array element: already a reference)
                res = self.bind(self.fresh("red"), res)
            if n in self.out_set:
                self.store(n, i if multi else None, ov, res, Domain.ROW)
            rounded.append(ir.cast(res, compute_dtype(ov.dtype)))
        self.remember(("v", n), rounded if multi else rounded[0])
        self.check_rows_not_empty(r.kind)

    def accumulator(self, low: Reduction, in_dt: torch.dtype, out_dt: torch.dtype) -> torch.dtype:
        """The dtype a fold of ``low`` accumulates in (``ir.aten.accumulator_dtype``)."""
        return ir_aten.accumulator_dtype(low, in_dt, out_dt)

    def check_rows_not_empty(self, kind: str) -> None:
        """Rows of a static length 0 are refused; rows of a symbolic length may be empty at run
        time: sum/prod/mean/var/any/all then give the fold's identity (as eager), min/max and
        arg folds raise like eager, from the launch function."""
        rnumel = self.frame.rnumel
        if _is_int(rnumel) and int(rnumel) > 0:
            return
        if _is_int(rnumel):
            raise Unsupported("empty reduction")
        if REDUCTIONS[kind].identity in ("lowest", "highest"):
            self.launch_checks.append(EmptyCheck(rnumel, kind))

    def all_symbols(self):
        return list(self.sym_names.values()) + list(self.expr_syms.values())

    def prologue(self, *middle: str) -> list[str]:
        """The launch function's first lines: the size reads, ``middle`` (a language's own), the
        checks (``stmts.prologue_lines``)."""
        py = PyExprPrinter({s: s.name for s in self.all_symbols()})
        return prologue_lines(self.size_reads, py) + list(middle) + prologue_lines(self.launch_checks, py)

    def store_target(self, n: fx.Node, index: int | None, val: torch.Tensor, dom: Domain) -> tuple[str, sympy.Expr]:
        """Where output ``index`` of ``n`` (traced value ``val``) is stored in domain ``dom``: its
        pointer parameter and the element offset, at the planned layout (a region of a cat/pad's
        buffer: its container's strides)."""
        ptr = self.tensor_params[(self.buffer(n, index), Role.OUT)]
        shape = shape_of(val)
        return ptr, self.offset(self.placed(n, index, val), self.coords_of(shape, dom), len(shape), dom)

    # ---------------------------------------------------------------- the language's hooks

    def add_load(self, name: str, ptr: str, off: sympy.Expr, dom: Domain, dtype: torch.dtype) -> None:
        """Bind ``name`` to the element of tensor ``ptr`` at offset ``off``."""
        self.body.append(Load(name, ptr, off, dtype, dom))

    def bind(self, name: str, v: Value) -> Var:
        """Bind ``v`` to the kernel local ``name``."""
        self.body.append(Let(name, v))
        return Var(name, v.dtype)

    def store(self, n: fx.Node, index: int | None, val: torch.Tensor, v: Value, dom: Domain) -> None:
        """Store ``v`` as output ``index`` of ``n`` (``val``: its traced value)."""
        ptr, off = self.store_target(n, index, val, dom)
        self.body.append(Store(ptr, off, ir.cast(v, val.dtype), dom))

    def persistent(self) -> bool:
        """A reduction whose rows are folded without a loop over them."""
        raise NotImplementedError

    def open_persistent(self) -> None:
        """What a persistent reduction's body starts with."""
        raise NotImplementedError

    def loop(self, body, independent: bool = False) -> None:
        """Emit ``body()`` inside a loop over a row's reduced elements, in its own scope.
        ``independent``: no iteration reads what another one writes (each element stored on
        its own), so a printer may run iterations side by side in vector lanes."""
        raise NotImplementedError

    def fold(self, r, low: Reduction, acc_dt: torch.dtype, persistent: bool) -> dict[str, Var]:
        """Emit the fold of each row: the accumulators it leaves (``ir.aten.result``)."""
        raise NotImplementedError

    def launch(self):
        """The kernel as the language's backend takes it, from what the walk decided."""
        raise NotImplementedError
