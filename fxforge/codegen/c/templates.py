"""Hand-written C kernels for composite ops the emitter cannot write in one pass (``TEMPLATES``).

The emitter's kernels have one frame: rows folded over their last dims, or columns folded over
their leading dims.  Layer norm's gradient needs both at once: each row's two sums give the
input's gradient, and the weight's and bias's gradients are sums down the columns.  ATen's CPU
kernel for it is slow at the sizes of small models (a 128 x 64 norm took 19.6 us, 8 calls a
mixer step), and two emitted kernels (a row kernel and a column kernel) read the inputs twice.
The template reads each row once for the row sums and once more for the input's gradient, adding
each element's share of the column sums to per-column accumulators in that same loop.

Attention's weights: ``_softmax`` over the last dim (a masked score's weight exactly 0, as
eager's); its gradient is split into a row kernel.

Token embeddings: ``embedding`` gathers rows (an index out of range is error 2), its gradient
adds each index's row in eager's order; integer ``arange`` fills positions.  Each replaces a
small ATen call that runs cold in a training step.

Each template's docstring says why the kernel IR's group walk (``codegen/ir``: one frame of rows
or columns, values computed from loads and constants) cannot express it.  A template writes the
IR's statements itself (``ir/stmts.py``: nests, loads, stores, accumulators, local arrays and
views of their rows, the prelude's tile helpers, an index check's early return, a skipped index;
its arithmetic in the value vocabulary), and the C statement printer prints them as it prints
every kernel: no template writes C text.

A template kernel runs its node alone (``fusion_cost`` keeps it out of groups); shapes must be
static, float tensors float32 or float64 (indices and targets int64; an embedding's may be
int32).  Sums accumulate in double, as the emitter's do, but for the embedding gradient's,
which adds rows in eager's order and type.
"""

from __future__ import annotations

import math

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import ModularIndexing

from ...core.graph import VAL, free_symbols, tensors
from ..ir import values as ir
from ..ir.lowering import Param
from ..ir.stmts import Check, Index, Let, Load, Loop, Nest, Set, Skip, Stmt, Store, View, local
from ..ir.values import Domain, Elem, Role, Var
from . import build
from .abi import INDEX_OUT_OF_RANGE, CEmitted, Scratch, c_function, launch_source
from .schedule import COLUMN_CHUNK_MIN_ELEMENTS, TILE_ROWS, block_rows, chunks, parallel_min_work, split, tile_move
from .dtypes import CTYPE, ONE_THREAD_MAX_NUMEL
from .printer import CStatements, values

aten = torch.ops.aten

# Per-column accumulators live on the C stack (a double a column for each of dw and db).
LAYER_NORM_MAX_COLUMNS = 8192
# What the layer norm gradient computes an element, in the emitter's node-elements
# (``schedule.WORK_NS``): dx's five ops, the two row sums' three, dw's three, db's one.
LAYER_NORM_BACKWARD_OPS = 12
# Strided rows staged ``schedule.TILE_ROWS`` at a time where they start one element apart, in at
# most this many bytes of C stack.
STAGE_BLOCK_MAX_BYTES = 64 << 10


def _flat_stride(shape: tuple[int, ...], stride: tuple[int, ...]) -> int | None:
    """The one stride that walks dims ``shape`` in row-major order, or None (they do not merge)."""
    dims = [(s, st) for s, st in zip(shape, stride) if s != 1]
    if not dims:
        return 1
    for (s0, st0), (s1, st1) in zip(dims, dims[1:]):
        if st0 != st1 * s1:
            return None
    return dims[-1][1]


def _static_floats_refusal(what: str, node: fx.Node, skip: fx.Node | None = None) -> str | None:
    """Every template's own needs of ``node``'s tensors (but ``skip``'s dtype): one dtype, float32
    or float64, and static sizes."""
    outs = tensors(node.meta[VAL])
    ins = [(a, t) for a in node.all_input_nodes for t in tensors(a.meta.get(VAL))]
    if {t.dtype for t in outs + [t for a, t in ins if a is not skip]} not in ({torch.float32}, {torch.float64}):
        return f"{what} template: float32 or float64 tensors of one dtype only"
    if any(free_symbols(t) for t in outs + [t for _, t in ins]):
        return f"{what} template: symbolic sizes run as ATen's kernel"
    return None


def layer_norm_backward_refusal(node: fx.Node) -> str | None:
    """What the template needs besides what every C kernel needs (``backend.accepts`` checked
    that: ATen op, strided CPU tensors of C types, outputs left out only by the mask)."""
    grad, x, shape = node.args[:3]
    why = _static_floats_refusal("layer norm backward", node)
    if why is not None:
        return why
    xv = x.meta[VAL]
    lead = xv.dim() - len(shape)
    n = math.prod(int(s) for s in shape)
    if lead <= 0 or n == 0 or xv.numel() == 0:
        return "layer norm backward template: no rows to normalize"
    if n > LAYER_NORM_MAX_COLUMNS:
        return f"layer norm backward template: over {LAYER_NORM_MAX_COLUMNS} normalized elements"
    for a in (grad, x):
        t = a.meta[VAL]
        if _flat_stride(tuple(t.shape[lead:]), tuple(t.stride()[lead:])) is None:
            return f"layer norm backward template: {a.name}'s normalized dims are not one strided run"
    return None


def _offset(coords: list[sympy.Symbol], stride: tuple[int, ...]) -> sympy.Expr:
    """The element offset of ``coords`` (loop variables) at ``stride``."""
    return sympy.Add(*[st * c for c, st in zip(coords, stride) if st != 0])


def _loops(sizes, prefix: str = "i") -> tuple[list[Loop], list[sympy.Symbol]]:
    """Loops over ``sizes`` (variables ``i0``, ``i1``...) and their variables."""
    return [Loop(f"{prefix}{d}", int(s)) for d, s in enumerate(sizes)], [local(f"{prefix}{d}") for d in range(len(sizes))]


def _elem(ptr: str, off: sympy.Expr, dt: torch.dtype) -> Elem:
    """Element ``off`` of tensor ``ptr`` as a value (a read inside an expression)."""
    return Elem(ptr, (off,), dt)


class _Tensors:
    """A template kernel's tensor parameters: each one's C pointer (``ptr[key]``) and its sizes
    and strides as the plan lays it out (``layouts[key]``; ``KernelContext.layout``)."""

    def __init__(self, layout):
        self.layout = layout
        self.params: list[Param] = []
        self.ptr: dict[str, str] = {}
        self.layouts: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.specs: dict[str, tuple] = {}  # CEmitted.specs
        self.scratch = Scratch()  # the kernel's local arrays

    def add(self, key: str, var: str, role: Role, a: fx.Node, i: int | None, t: torch.Tensor) -> None:
        self.ptr[key] = f"{role}_ptr{sum(1 for p in self.params if p.name.startswith(role))}"
        self.params.append(Param(self.ptr[key], "*" + CTYPE[t.dtype], var))
        sizes, strides = self.layout(a, i) if self.layout is not None else (t.shape, t.stride())
        self.layouts[key] = tuple(int(s) for s in sizes), tuple(int(s) for s in strides)
        self.specs[self.ptr[key]] = (t.dtype, *self.layouts[key])

    def kernel(self, name: str, what: str, stmts: list[Stmt]) -> CEmitted:
        """The kernel ``name`` running ``stmts`` (printed as every kernel's, ``CStatements``), and
        its launch (``what``: the template's name)."""
        body = CStatements(values(build.vector_math())).lines(stmts, "    ")
        symbol, c_lines = c_function(self.params, body, self.scratch.heap)
        args = list(dict.fromkeys(p.launch for p in self.params))  # a tensor passed twice is one argument
        head = [f"# C kernel {name}_c (template: {what}, fxforge/codegen/c/templates.py)"]
        launch = launch_source(name, args, self.params, [], head + ["# " + l for l in c_lines])
        return CEmitted(symbol, "\n".join(c_lines) + "\n", launch, name, args, self.params, 1, len(args), self.specs)


def layer_norm_backward(name: str, node: fx.Node, ref, buffer, layout, threads: int) -> CEmitted:
    """``native_layer_norm_backward(dy, x, shape, mean, rstd, w, b, mask)``: dx, dw, db.

    Why a template: it folds rows (the input's gradient) and columns (the weight's and bias's)
    in one pass; a kernel of the IR's group walk has one frame, rows or columns.  One function
    (over 80 lines) holds the one kernel, its rows' staging and its chunking, each decided from
    the others' sizes.

    Enough rows are walked in chunks (``_row_chunks``, from the sizes alone): each chunk adds
    its rows' shares of dw and db into a part of its own, the chunks split across ``threads``
    where that pays (``schedule.parallel_min_work``), then the parts are added in chunk order: the
    same sums at any thread count.

    Per row (mean ``mu``, ``rs`` = rstd, g = dy * w over the row's n elements, as ATen):
    ``ds = sum(g * x)``, ``db = sum(g)``, ``b = (db * mu - ds) * rs^3 / n``, ``c = -b * mu - db * rs / n``,
    ``dx = rs * g + b * x + c``; ``dw += dy * (x - mu) * rs`` and ``dbias += dy`` per column.
    Tensors are indexed at the plan's layouts (``layout``, ``KernelContext.layout``)."""
    grad, x, shape, mean, rstd, weight = node.args[:6]
    val = node.meta[VAL]
    xv = x.meta[VAL]
    ct, isz = CTYPE[xv.dtype], xv.dtype.itemsize
    lead = xv.dim() - len(shape)
    n = math.prod(int(s) for s in shape)

    ts = _Tensors(layout)
    ptr, layouts = ts.ptr, ts.layouts  # dx, dw, db, dy, x, mean, rstd, w -> the C parameter, its layout
    for i, key in enumerate(("dx", "dw", "db")):
        if isinstance(val[i], torch.Tensor):
            ts.add(key, buffer(node, i), Role.OUT, node, i, val[i])
    ins = {"dy": grad, "x": x, "mean": mean, "rstd": rstd}
    if "dx" in ptr and isinstance(weight, fx.Node):  # only the input's gradient reads the weight
        ins["w"] = weight
    for key, a in ins.items():
        ts.add(key, ref(a), Role.IN, a, None, a.meta[VAL])

    loops, coords = _loops(xv.shape[:lead])
    j = local("j")
    row = {}  # key -> offset of the row's first element (the row tensors)
    col = {}  # key -> stride along the normalized elements
    for key, (sizes, strides) in layouts.items():
        if key in ("mean", "rstd"):
            row[key] = _offset(coords, strides[:lead])
            continue
        rows = key in ("dy", "x", "dx")
        if rows:
            row[key] = _offset(coords, strides[:lead])
        col[key] = _flat_stride(sizes[lead:], strides[lead:]) if rows else _flat_stride(sizes, strides)
        if col[key] is None:  # the plan laid it out otherwise than traced (accepts checked that)
            raise NotImplementedError(f"{key}: normalized dims that are not one strided run")

    # a row read by both loops (dy, x where grad_input is computed) at a stride other than 1
    # (a transposed gradient...) is copied once into a contiguous local row: the loops then read
    # it as vectors instead of gathering it twice
    staged = [key for key in ("dy", "x") if "dx" in ptr and col[key] != 1]
    # Staged rows whose neighbours along the last row dim are next to each other in memory (a
    # transposed gradient's rows start one element apart) are staged a block of rows at a time:
    # float32 through the emitter's tiles (``fx_tile_in8``/``fx_tile_out8``: 8 x 8 blocks
    # transposed in vector registers), float64 a column of the block at a time.
    inner = int(xv.shape[lead - 1])
    block = min(TILE_ROWS, inner)
    adjacent = [k for k in ("dy", "x", "dx") if k in staged or (k == "dx" and k in ptr and col[k] != 1)]
    blocked = bool(staged) and block > 1 and all(layouts[k][1][lead - 1] == 1 for k in adjacent) and \
        block * n * xv.element_size() * len(adjacent) <= STAGE_BLOCK_MAX_BYTES
    written = ["dx"] if blocked and "dx" in adjacent else []  # computed into the block, stored by columns
    dt, f64 = xv.dtype, torch.float64

    def where(key: str) -> tuple[str, sympy.Expr]:
        """The array and offset of element ``j`` of tensor ``key`` (of its current row: a staged one's local copy)."""
        if key in staged or key in written:
            return f"row_{key}", j
        return ptr[key], col[key] * j + row.get(key, 0)

    def at(key: str) -> Var:
        return _elem(*where(key), dt)

    def wide(v) -> ir.Value:
        return ir.cast(v, f64)

    g = ir.mul(at("dy"), at("w")) if "w" in ptr else at("dy")
    mu, rs = Var("mu", dt), Var("rs", dt)
    accs = [(key, f"acc_{key}") for key in ("dw", "db") if key in ptr]
    # the rows' outer loops: the lead dims, the last one by blocks where blocked
    outer = loops[:-1] + [Loop("ib", inner, 0, block)] if blocked else loops
    chunking = _row_chunks(outer, xv.numel(), n * 8 * len(accs))
    stmts: list[Stmt] = []
    if chunking is None:  # one pass over the rows, into one accumulator a column
        stmts += [ts.scratch.alloc("double", acc, (n,), 8) for _, acc in accs]
        if accs:
            stmts.append(Nest([Loop("j", n)], [Set(Elem(acc, (j,), f64), ir.Const(0.0, f64)) for _, acc in accs]))
    body: list[Stmt] = [
        Load("mu", ptr["mean"], row["mean"], dt, Domain.ROW),
        Load("rs", ptr["rstd"], row["rstd"], dt, Domain.ROW),
    ]
    if blocked:
        in_block = (local(f"i{lead - 1}") - local("ib"),)  # the row's place in its block
        body += [View(f"row_{key}", Elem(f"blk_{key}", in_block, dt), readonly=key in staged) for key in staged + written]
    else:
        for key in staged:
            body += [ts.scratch.alloc(ct, f"row_{key}", (n,), isz),
                     Nest([Loop("j", n)], [Set(Elem(f"row_{key}", (j,), dt), _elem(ptr[key], row[key] + col[key] * j, dt))])]
    if "dx" in ptr:
        ds, db = Var("ds", f64), Var("db", f64)
        body += [Let("ds", ir.Const(0.0, f64), mutable=True), Let("db", ir.Const(0.0, f64), mutable=True),
                 Nest([Loop("j", n)], [Let("g", g), Set("ds", wide(ir.mul(Var("g", dt), at("x"))), op="+"),
                                       Set("db", wide(Var("g", dt)), op="+")], simd=(("+", "ds"), ("+", "db"))),
                 Let("b", ir.cast(ir.truediv(ir.mul(ir.mul(ir.mul(ir.sub(ir.mul(db, wide(mu)), ds), wide(rs)), wide(rs)),
                                                    wide(rs)), ir.Const(float(n), f64)), dt)),
                 Let("c", ir.cast(ir.sub(ir.mul(ir.neg(wide(Var("b", dt))), wide(mu)),
                                         ir.truediv(ir.mul(db, wide(rs)), ir.Const(float(n), f64))), dt))]
    per_element: list[Stmt] = []
    if "dx" in ptr:
        dx = ir.add(ir.add(ir.mul(rs, g), ir.mul(Var("b", dt), at("x"))), Var("c", dt))
        per_element.append(Store(*where("dx"), dx, Domain.ELEMENT))
    if "dw" in ptr:
        per_element.append(Set(Elem("acc_dw", (j,), f64), wide(ir.mul(at("dy"), ir.mul(ir.sub(at("x"), mu), rs))), op="+"))
    if "db" in ptr:
        per_element.append(Set(Elem("acc_db", (j,), f64), wide(at("dy")), op="+"))
    body.append(Nest([Loop("j", n)], per_element))
    if blocked:  # the last row loop runs block by block: stage the block's rows, then each row
        r, ib = local("r"), local("ib")
        stage: list[Stmt] = [block_rows("ib", inner, block)]
        first = {k: _offset(coords[:-1] + [ib], layouts[k][1][:lead]) for k in adjacent}  # the block's first row
        tiles = ct == "float"
        for key in staged:
            stage.append(ts.scratch.alloc(ct, f"blk_{key}", (block, n), isz))
            stage.append(tile_move("fx_tile_in8", Elem(f"blk_{key}", (0, 0), dt), n, Elem(ptr[key], (first[key],), dt),
                                   col[key], n)
                         if tiles else Nest([Loop("j", n), Loop("r", local("nb"))], [
                             Set(Elem(f"blk_{key}", (r, j), dt), _elem(ptr[key], first[key] + r + col[key] * j, dt))]))
        stage += [ts.scratch.alloc(ct, f"blk_{key}", (block, n), isz) for key in written]
        store = [tile_move("fx_tile_out8", Elem(ptr[key], (first[key],), dt), col[key], Elem(f"blk_{key}", (0, 0), dt), n, n)
                 if tiles else Nest([Loop("j", n), Loop("r", local("nb"))], [
                     Store(ptr[key], first[key] + r + col[key] * j, Elem(f"blk_{key}", (r, j), dt), Domain.ELEMENT)])
                 for key in written]
        i = f"i{lead - 1}"
        rows_nest = Nest(outer, stage + [Nest([Loop(i, ib + local("nb"), ib)], body)] + store)
    else:
        rows_nest = Nest(outer, body)
    if chunking is None:
        stmts.append(rows_nest)
        stmts += [Nest([Loop("j", n)], [Store(ptr[key], col[key] * j, ir.cast(Elem(acc, (j,), f64), dt), Domain.ELEMENT)])
                  for key, acc in accs]
        return ts.kernel(name, "layer norm backward", stmts)
    # (a row's local arrays are private to the thread running its chunk where they are on the
    # stack; in the call's one heap block they would be shared: then one thread runs them all)
    least = parallel_min_work(threads)
    parallel = least is not None and not ts.scratch.heap and xv.numel() * LAYER_NORM_BACKWARD_OPS >= least
    per_chunk, count = chunking
    units = _units(outer)
    width = -(-n // 8) * 8  # each chunk's part on cache lines of its own
    stmts += [ts.scratch.alloc("double", f"{acc}_chunks", (count, width), 8) for _, acc in accs]
    rc = local("rc")
    chunk: list[Stmt] = [View(acc, Elem(f"{acc}_chunks", (rc,), f64)) for _, acc in accs]
    if accs:
        chunk.append(Nest([Loop("j", n)], [Set(Elem(acc, (j,), f64), ir.Const(0.0, f64)) for _, acc in accs]))
    chunk += [Index("ue", sympy.Min((rc + 1) * per_chunk, units)),
              Nest([Loop("u", local("ue"), rc * per_chunk)], _unravel(outer, local("u")) + rows_nest.body)]
    stmts.append(split(Nest([Loop("rc", count)], chunk), 1, True if parallel else None))
    for key, acc in accs:  # the parts, added in chunk order
        total = Var(f"sum_{key}", f64)
        stmts.append(Nest([Loop("j", n)], [
            Let(total.name, ir.Const(0.0, f64), mutable=True),
            Nest([Loop("rc", count)], [Set(total.name, Elem(f"{acc}_chunks", (local("rc"), j), f64), op="+")]),
            Store(ptr[key], col[key] * j, ir.cast(total, dt), Domain.ELEMENT)]))
    return ts.kernel(name, "layer norm backward", stmts)


def _trips(loop: Loop) -> int:
    return -(-(int(loop.stop) - int(loop.start)) // int(loop.step))


def _units(loops: list[Loop]) -> int:
    """The iterations of ``loops`` nested (static bounds)."""
    return math.prod(_trips(l) for l in loops)


def _unravel(loops: list[Loop], u: sympy.Symbol) -> list[Stmt]:
    """Each of ``loops``' variables at iteration ``u`` of their nest (row-major)."""
    out, inner = [], 1
    for loop in reversed(loops):
        trips = _trips(loop)
        out.append(Index(loop.var, ModularIndexing(u, inner, trips) * int(loop.step) + int(loop.start)))
        inner *= trips
    return out[::-1]


def _row_chunks(loops: list[Loop], elements: int, part_bytes: int) -> tuple[int, int] | None:
    """How a template walks the iterations of ``loops`` (rows, or blocks of rows; ``elements``
    in all) in chunks, as the emitter's column kernels walk their rows (``kernel.chunks``, each
    at least ``COLUMN_CHUNK_MIN_ELEMENTS`` elements, parts of ``part_bytes`` each): (iterations
    a chunk, chunks), or None (fewer than two)."""
    units = _units(loops)
    return chunks(units, min(units, elements // COLUMN_CHUNK_MIN_ELEMENTS), part_bytes)


def _last_dim_rows_refusal(what: str, node: fx.Node, x: fx.Node, dim: int) -> str | None:
    """Why a row template over the last dim (``softmax``) cannot run ``node`` whose rows are those
    of ``x`` along ``dim``."""
    why = _static_floats_refusal(what, node)
    if why is not None:
        return why
    xv = x.meta[VAL]
    if xv.dim() == 0 or xv.numel() == 0:
        return f"{what} template: no rows"
    if dim % xv.dim() != xv.dim() - 1:
        return f"{what} template: over the last dim only"
    if xv.numel() > ONE_THREAD_MAX_NUMEL:
        return f"{what} template: over {ONE_THREAD_MAX_NUMEL} elements runs as ATen's kernel, parallel over rows"
    return None


def _softmax_refusal(what: str):
    """The refusal of the ``what`` template (``softmax``): ``(x, dim, half_to_float)``, rows over
    the last dim."""
    def refusal(node: fx.Node) -> str | None:
        x, dim, half_to_float = node.args[:3]
        if half_to_float:
            return f"{what} template: half_to_float runs as ATen's kernel"
        return _last_dim_rows_refusal(what, node, x, dim)

    return refusal


def _rows(ts: _Tensors, ndim: int):
    """Loops over every row (all dims but the last) and ``at(key, j)``: the tensor and offset of
    element ``j`` of the current row of tensor ``key``."""
    lead = ndim - 1
    sizes = next(iter(ts.layouts.values()))[0]
    loops, coords = _loops(sizes[:lead])

    def at(key: str, j: sympy.Expr) -> tuple[str, sympy.Expr]:
        strides = ts.layouts[key][1]
        return ts.ptr[key], _offset(coords, strides[:lead]) + strides[lead] * j

    return loops, at


def _row_kernel(name: str, node: fx.Node, ref, buffer, layout, what: str, out: str, ins: dict[str, fx.Node],
                body) -> CEmitted:
    """A row template over the last dim: the node's output ``out`` and inputs ``ins`` (key ->
    node), one row's statements ``body(dt, n, at)`` (the dtype, the row length, ``_rows``' ``at``)."""
    first = next(iter(ins.values())).meta[VAL]
    ts = _Tensors(layout)
    ts.add(out, buffer(node, None), Role.OUT, node, None, node.meta[VAL])
    for key, a in ins.items():
        ts.add(key, ref(a), Role.IN, a, None, a.meta[VAL])
    loops, at = _rows(ts, first.dim())
    return ts.kernel(name, what, [Nest(loops, body(first.dtype, int(first.shape[-1]), at))])


def softmax(name: str, node: fx.Node, ref, buffer, layout, threads: int) -> CEmitted:
    """``_softmax(x, dim=-1)``, per row as ATen's CPU kernel (why a template: it stores ``exp``
    while summing it, then scales what it stored: the IR reads no output back, and would compute
    the exponentials twice): ``m = max(x)``, ``e = exp(x - m)``
    stored in the output while summing it (in double), then the output scaled by ``1 / sum``.
    float32's ``exp`` is ``fx_expf_neg`` (its argument is never above 0), and 0 where eager's is
    below float32's normal range (``d < log(FLT_MIN)``; ``fx_expf_neg`` stops at about 1e-38): a
    masked score's weight is exactly 0, as eager's.  A row with a NaN, or of -inf only, is NaN, as
    eager's."""
    def body(dt: torch.dtype, n: int, at) -> list[Stmt]:
        j, f64 = local("j"), torch.float64
        x, m, d, e, s = _elem(*at("x", j), dt), Var("m", dt), Var("d", dt), Var("e", dt), Var("s", f64)
        if dt == torch.float32:  # (the vocabulary's exp is eager's over the whole range: a helper here)
            exp = Let("e", ir.where(ir.compare("lt", d, ir.neg(Var("FX_EXPF_MIN_ARG", dt))), ir.Const(0.0, dt),
                                    ir.Call("fx_expf_neg", (d,), dt)))
        else:
            exp = Let("e", ir.exp(d))
        return [Let("m", ir.Const(-math.inf, dt), mutable=True),
                Nest([Loop("j", n)], [Set("m", ir.where(ir.compare("gt", m, x), m, x))], simd=(("max", "m"),)),
                Let("s", ir.Const(0.0, f64), mutable=True),
                Nest([Loop("j", n)], [Let("d", ir.sub(x, m)), exp, Store(*at("out", j), e, Domain.ELEMENT),
                                      Set("s", ir.cast(e, f64), op="+")], simd=(("+", "s"),)),
                Let("r", ir.cast(ir.truediv(ir.Const(1.0, f64), s), dt)),
                Nest([Loop("j", n)], [Store(*at("out", j), ir.mul(_elem(*at("out", j), dt), Var("r", dt)), Domain.ELEMENT)])]

    return _row_kernel(name, node, ref, buffer, layout, "softmax", "out", {"x": node.args[0]}, body)


def _embedding_refusal(node: fx.Node) -> str | None:
    """``embedding(weight, indices, ...)`` and ``embedding_dense_backward(grad, indices,
    num_weights, padding_idx, scale_grad_by_freq)``: a float (V, D) table, int64 or int32 indices."""
    backward = node.target == aten.embedding_dense_backward.default
    indices = node.args[1]
    what = "embedding backward" if backward else "embedding"
    if indices.meta[VAL].dtype not in (torch.int64, torch.int32):
        return f"{what} template: int64 or int32 indices only"
    why = _static_floats_refusal(what, node, skip=indices)
    if why is not None:
        return why
    table = node.meta[VAL] if backward else node.args[0].meta[VAL]
    if table.dim() != 2:
        return f"{what} template: a 2-d table only"
    if backward and (node.args[4] if len(node.args) > 4 else False):
        return f"{what} template: scale_grad_by_freq runs as ATen's kernel"
    if node.meta[VAL].numel() > ONE_THREAD_MAX_NUMEL:
        return f"{what} template: over {ONE_THREAD_MAX_NUMEL} elements runs as ATen's kernel, parallel over rows"
    return None


def _index_rows(ts: _Tensors, indices: torch.Tensor, per_index) -> Nest:
    """Loops over every index in row-major order around the statements ``per_index(row, k)``,
    where ``k`` is the index's value (int64) and ``row(key)`` the offset of the current index's
    row of tensor ``key`` (the index dims leading its dims)."""
    loops, coords = _loops(indices.shape)
    loops = loops or [Loop("i", 1)]  # one index: still a loop (``continue``)

    def row(key: str) -> sympy.Expr:
        return _offset(coords, ts.layouts[key][1][:len(coords)])

    k = sympy.Symbol("k", integer=True)
    read = [Load("k", ts.ptr["indices"], row("indices"), torch.int64, Domain.ROW)] if indices.dtype == torch.int64 else [
        Load("ki", ts.ptr["indices"], row("indices"), indices.dtype, Domain.ROW),
        Let("k", ir.cast(Var("ki", indices.dtype), torch.int64))]
    return Nest(loops, read + per_index(row, k))


_K = Var("k", torch.int64)  # an index read by a gather's or scatter's loop (``_index_rows``)


def _outside(low: int, high: int) -> ir.Value:
    """``k`` outside ``[low, high)``."""
    return ir.bit_or(ir.compare("lt", _K, ir.Index(sympy.Integer(low))), ir.compare("ge", _K, ir.Index(sympy.Integer(high))))


def embedding(name: str, node: fx.Node, ref, buffer, layout, threads: int) -> CEmitted:
    """``embedding(weight, indices)``: ``out[i..., j] = weight[indices[i...], j]``, as ATen's
    ``index_select``; an index outside ``[0, V)`` raises eager's ``IndexError`` (error 2 of
    ``abi.KERNEL_ERRORS``).  ``padding_idx`` only matters to the gradient.

    Why a template: a gather (rows at indices read from another tensor) that checks each index,
    which the IR's loads cannot say."""
    weight, indices = node.args[:2]
    wv, iv = weight.meta[VAL], indices.meta[VAL]
    ts = _Tensors(layout)
    ts.add("out", buffer(node, None), Role.OUT, node, None, node.meta[VAL])
    ts.add("weight", ref(weight), Role.IN, weight, None, wv)
    ts.add("indices", ref(indices), Role.IN, indices, None, iv)
    (w0, w1), os = ts.layouts["weight"][1], ts.layouts["out"][1][-1]
    j = local("j")
    return ts.kernel(name, "embedding", [_index_rows(ts, iv, lambda row, k: [
        Check(_outside(0, int(wv.shape[0])), INDEX_OUT_OF_RANGE, _K),
        Nest([Loop("j", int(wv.shape[1]))], [
            Store(ts.ptr["out"], row("out") + os * j, _elem(ts.ptr["weight"], w0 * k + w1 * j, wv.dtype), Domain.ELEMENT)])])])


def embedding_backward(name: str, node: fx.Node, ref, buffer, layout, threads: int) -> CEmitted:
    """``embedding_dense_backward(grad, indices, num_weights, padding_idx, False)``: zeros, then
    ``dw[k] += grad[i...]`` for each index ``k`` in row-major order, skipping ``padding_idx`` and
    indices outside ``[0, num_weights)``: ATen's CPU kernel, in its order (each row's sum rounds
    as eager's).

    Why a template: a scatter-add in eager's order (rows added at indices read from another
    tensor), which the IR's stores cannot say."""
    grad, indices, num_weights, padding_idx = node.args[:4]
    ov = node.meta[VAL]
    ts = _Tensors(layout)
    ts.add("dw", buffer(node, None), Role.OUT, node, None, ov)
    ts.add("grad", ref(grad), Role.IN, grad, None, grad.meta[VAL])
    ts.add("indices", ref(indices), Role.IN, indices, None, indices.meta[VAL])
    (d0, d1), gs = ts.layouts["dw"][1], ts.layouts["grad"][1][-1]
    rows, cols = int(ov.shape[0]), int(ov.shape[1])
    dw, dt = ts.ptr["dw"], ov.dtype
    r, j = local("r"), local("j")
    zeros = Nest([Loop("r", rows), Loop("j", cols)], [Store(dw, d0 * r + d1 * j, ir.const(0, dt), Domain.ELEMENT)])
    return ts.kernel(name, "embedding backward", [zeros, _index_rows(ts, indices.meta[VAL], lambda row, k: [
        Skip(ir.bit_or(ir.compare("eq", _K, ir.Index(sympy.Integer(int(padding_idx)))), _outside(0, rows))),
        Nest([Loop("j", cols)], [Store(dw, d0 * k + d1 * j, ir.add(_elem(dw, d0 * k + d1 * j, dt),
                                                                     _elem(ts.ptr["grad"], row("grad") + gs * j, dt)),
                                       Domain.ELEMENT)])])])


_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)


def _arange_terms(node: fx.Node) -> tuple | None:
    """(start, step) of an ``arange`` node, None where an argument is not a Python int."""
    args = node.args
    start, step = (0, 1) if node.target == aten.arange.default else (args[0], args[2] if len(args) > 2 else 1)
    ends = args[0] if node.target == aten.arange.default else args[1]
    return (start, step) if all(type(x) is int for x in (start, step, ends)) else None


def _arange_refusal(node: fx.Node) -> str | None:
    if node.meta[VAL].dtype not in (torch.int64, torch.int32):
        return "arange template: int64 or int32 only (a float range rounds as ATen's vector kernel does)"
    if _arange_terms(node) is None:  # (int bounds: a static size)
        return "arange template: symbolic bounds run as ATen's kernel"
    return None


def arange(name: str, node: fx.Node, ref, buffer, layout, threads: int) -> CEmitted:
    """``arange(start, end, step)`` of ints: ``out[i] = start + i * step``.

    Why a template: the value is the element's index; the IR's ATen semantics compute values from
    loads and constants only, to be given the index."""
    start, step = _arange_terms(node)
    ov = node.meta[VAL]
    ts = _Tensors(layout)
    ts.add("out", buffer(node, None), Role.OUT, node, None, ov)
    (st,) = ts.layouts["out"][1]
    i = local("i")
    return ts.kernel(name, "arange", [Nest([Loop("i", ov.numel())], [
        Store(ts.ptr["out"], st * i, ir.cast(ir.Index(start + step * i), ov.dtype), Domain.ELEMENT)])])


# op -> (why it cannot run as the template, or None; the emitter)
TEMPLATES = {
    aten.native_layer_norm_backward.default: (layer_norm_backward_refusal, layer_norm_backward),
    aten._softmax.default: (_softmax_refusal("softmax"), softmax),
    aten.embedding.default: (_embedding_refusal, embedding),
    aten.embedding_dense_backward.default: (_embedding_refusal, embedding_backward),
    **{op: (_arange_refusal, arange) for op in _ARANGES},
}


def template_of(node: fx.Node):
    return TEMPLATES.get(node.target) if node.op == "call_function" else None
