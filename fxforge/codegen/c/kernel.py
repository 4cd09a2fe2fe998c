"""Emitting one C function (and its Python launch function) for a group of ATen nodes.

The loop nest, index math, operand reads and dtype rules are the shared walk's
(``codegen/ir/lowering.py``), with one element per iteration instead of a block: the kernel
is a loop nest over the dims of the output (pointwise) or of the reduction's kept dims (rows),
each coordinate a loop variable, so a contiguous or broadcast read is an affine index the C
compiler vectorizes; a reduction over the last dims folds each row in loops over its reduced
dims (an inner loop per fold, and one storing the row's full-size outputs), and the values it
needs are computed inside each loop; one keeping the last dim (columns, ``fold_columns``) folds
every column at once, in one loop over the reduced elements inside the vectorized kept loop.
Reads that do not vary inside a fold's loop are made before it (``load``).  Sums and moments of
float32 accumulate in double.

Shapes that are symbolic become ``int64_t`` parameters read off the tensors by the launch
function; every index is ``int64_t``.
"""

from __future__ import annotations

import math
from typing import Callable

import sympy
import torch
import torch.fx as fx

from ...core.graph import VAL, expr
from ...core.iteration import node_shape, reduction_of, shape_of
from ..ir import aten as ir_aten, values as ir
from ..ir.lowering import R, RINDEX, X, XINDEX, Emitter, Unsupported
from ..indexing import linear_in
from ..ir.rows import trailing
from ..ir.aten import REDUCTIONS, Reduction
from ..ir.stmts import Array, Index, Let, Load, Loop, Nest, Set, Stmt, Store, View, local, walk
from ..ir.values import Domain, Elem, Value, Var
from .dtypes import CTYPE, SIG_DTYPE
from . import build
from .abi import CEmitted, Scratch, c_function, launch_source
from .printer import CStatements, values
from .schedule import (COLUMN_BLOCK_MIN, COLUMN_CHUNK_MIN_ELEMENTS, COLUMN_ROW_BLOCK, COLUMN_ROW_BLOCK_MAX_STMTS,
                       QUICK_BUILD_MAX_WORK, ROW_CACHE_MAX_NUMEL, TILE_MAX_BYTES, TILE_ROWS, ColumnFold, _ceil_to,
                       accumulator, block_rows, chunks, column_folds, columns_by_rows, flat_index, frame_refusal,
                       parallel_min_work, split, tile_move)


def launch_head(name: str, reduction: bool, value_names: list[tuple[str, str]], lines: list[str]) -> list[str]:
    """The comment heading a C kernel's launch source: what it is, which node each value local
    holds (``CEmitter.value_name``), and its C function."""
    head = [f"# C kernel {name}_c ({'reduction' if reduction else 'pointwise'}; helpers: fxforge/codegen/c/prelude.py)"]
    if value_names:
        head.append("# values: " + ", ".join(f"{v} = {n}" for v, n in value_names))
    return head + ["# " + l for l in lines]


class CEmitter(Emitter):
    SIG_DTYPE = SIG_DTYPE

    def __init__(self, *args, threads: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads = threads  # the intra-op threads it is built for (``parallel_condition``)
        self.values = values(build.vector_math())  # this machine's vector math (``build.vector_math``)
        self.xvars: list[tuple[str, sympy.Expr]] = []  # the rows' loop variables and their sizes
        self.loop_order: tuple[int, ...] | None = None  # the order their loops nest in (``memory_order``)
        self.rvars: list[tuple[str, sympy.Expr]] = []
        self.columns = False  # the rows are columns (the last dim kept): see fold_columns
        self.hoisted: list[Stmt] | None = None  # inside a fold's loop: the statements before it (``load``)
        self.column_accs: dict[tuple, dict[str, Var]] = {}
        self.row_cache: dict[fx.Node, Var | None] = {}  # reduction input -> its row array (None: not yet made)
        self.fold_nest: Nest | None = None  # a column kernel's fold loop (``fold_columns``)
        # a column kernel walking its rows in order (``columns_by_rows``): accumulator array -> its fold
        self.by_rows: dict[str, ColumnFold] | None = None
        self.tile_axes: tuple[str, int, str, int] | None = None  # the rows' loop and size, the elements' (TILE_ROWS)
        self.tiles: dict[tuple, str] = {}  # (pointer, offset of the block's first row, stride, stored) -> tile
        self.value_names: list[tuple[str, str]] = []  # (local, the node whose value it holds)
        self.launch_prologue: list[str] = []  # the launch function's lines before the call (``launch``)
        self.scratch = Scratch()  # the kernel's local arrays

    def persistent(self) -> bool:
        return False  # one element per iteration: every fold is a loop

    # ---------------------------------------------------------------- the loop nests

    def frame_of(self):
        fr = super().frame_of()
        self.frame = fr
        ks = [self.size(s) for s in fr.shape]
        if fr.reduction:
            dims = fr.layouts[fr.shape]
            self.xvars = self.nest([ks[d] for d in range(len(ks)) if d not in dims], X, "xi")
            self.columns = not trailing(fr.shape, dims)
            why = frame_refusal(fr, self.reductions, self.order, self.dom)
            if why is not None:
                raise Unsupported(why)
            # columns: one flat loop over the reduced dims (a nest inside the vectorized kept loop
            # would keep the compiler from vectorizing it); coordinates from rindex where needed
            self.rvars = [("ri", fr.rnumel)] if self.columns else self.nest([ks[d] for d in dims], R, "ri")
            if self.columns:
                self.deps["ri"] = {RINDEX}
        else:
            self.xvars = self.nest(ks, X, "xi")
            self.loop_order = self.memory_order(ks)
        rn = sympy.sympify(fr.rnumel) if fr.reduction else None
        if fr.reduction and not self.columns and rn.is_Integer and int(rn) <= ROW_CACHE_MAX_NUMEL:
            passes = sum(2 if REDUCTIONS[reduction_of(n).kind].strategy == "moments" else 1
                         for n in self.reductions) + bool(self.full_outputs())
            if passes > 1:
                self.row_cache = {reduction_of(n).inp: None for n in self.reductions}
        self.tile_axes = self.tile_axes_of()
        return fr

    def tile_axes_of(self) -> tuple[str, int, str, int] | None:
        """The loop over the rows a tile holds and the loop along them, with their sizes
        (``TILE_ROWS``): a row kernel's innermost kept loop and its one reduced loop, or a
        pointwise kernel's two innermost loops; None where the kernel has no such pair."""
        if self.frame.reduction:
            if self.columns or len(self.rvars) != 1 or not self.xvars:
                return None
            (a, rows), (b, n) = self.xvars[-1], self.rvars[0]
        elif len(self.xvars) >= 2 and self.loop_order is None:
            (a, rows), (b, n) = self.xvars[-2], self.xvars[-1]
        else:
            return None
        rows, n = sympy.sympify(rows), sympy.sympify(n)
        if not (rows.is_Integer and n.is_Integer) or min(int(rows), int(n)) < TILE_ROWS:
            return None
        return a, int(rows), b, int(n)

    def tiled(self, ptr: str, off: sympy.Expr, dtype: torch.dtype, stored: bool) -> Elem | None:
        """The tile element standing for ``ptr[off]`` (``TILE_ROWS``), or None: ``off`` must step
        by 1 from row to row and by at least ``TILE_ROWS`` along them, as a function of the loop
        variables alone (a float32 tensor read or stored across the rows)."""
        if self.tile_axes is None or dtype != torch.float32:
            return None
        a, _, b, n = self.tile_axes
        sa, sb = local(a), local(b)
        symbols = off.free_symbols
        if sa not in symbols or sb not in symbols or not {x.name for x in symbols} <= {v for v, _ in self.xvars + self.rvars}:
            return None
        linear = linear_in(off, (sa, sb))
        if linear is None or linear[0][sa] != 1 or linear[0][sb] < TILE_ROWS:
            return None
        step = linear[0][sb]
        key = (ptr, linear[1] + local("xb"), step, stored)
        if key not in self.tiles:
            if (len(self.tiles) + 1) * TILE_ROWS * n * 4 > TILE_MAX_BYTES:
                return None
            self.tiles[key] = f"tile{len(self.tiles)}"
        return Elem(self.tiles[key], (sa - local("xb"), sb), dtype)

    def tiled_nest(self, top: Nest, condition) -> Nest:
        """The kernel's nest ``top`` (``open_nest``, its body the kernel's) with its rows' loop
        run ``TILE_ROWS`` rows at a time: each block's tiles read before its rows, the stored
        tiles written back after them; the blocks, and the loops around them, split across
        threads under ``condition`` (``parallel_condition``)."""
        a, rows, b, n = self.tile_axes
        at = [v for v, _ in self.xvars].index(a)
        block: list[Stmt] = [block_rows("xb", rows, TILE_ROWS)]
        after: list[Stmt] = []
        for (ptr, first, step, stored), tile in self.tiles.items():
            block.append(self.scratch.alloc("float", tile, (TILE_ROWS, n), 4))
            at_first, at_tile = Elem(ptr, (first,), torch.float32), Elem(tile, (0, 0), torch.float32)
            if stored:
                after.append(tile_move("fx_tile_out8", at_first, step, at_tile, n, n))
            else:
                block.append(tile_move("fx_tile_in8", at_tile, n, at_first, step, n))
        rows_loop = Nest([Loop(a, local("xb") + local("nb"), local("xb"))] + top.loops[at + 1:], top.body,
                         simd=None if self.frame.reduction else ())
        return split(Nest(top.loops[:at] + [Loop("xb", rows, 0, TILE_ROWS)], block + [rows_loop] + after),
                     at + 1, condition)

    def nest(self, shape: list[sympy.Expr], index: sympy.Symbol, prefix: str) -> list[tuple[str, sympy.Expr]]:
        """Loop variables over ``shape`` (size-1 dims have none): they are the coordinates of
        the flat ``index`` over ``shape`` (``coords``), in every scope."""
        loops, coords = [], []
        for d, s in enumerate(shape):
            if s == 1:
                coords.append(sympy.Integer(0))
                continue
            name = f"{prefix}{d}"
            loops.append((name, s))
            self.deps[name] = {index.name}
            coords.append(sympy.Symbol(name, integer=True, nonnegative=True))
        self.scopes[0][("coords", tuple(shape), index)] = coords
        self.flat_of[tuple(coords)] = (tuple(shape), index)
        return loops

    def open_nest(self, loops: list[tuple[str, sympy.Expr]], index: str, order: tuple[int, ...] | None = None
                  ) -> Nest:
        """A nest of ``loops`` (variables and sizes, nested in ``order``: positions from outermost
        to innermost, None as listed) whose body starts by binding ``index`` to the row-major
        flat index they stand for (over ``loops`` as listed, whatever the order)."""
        nested = loops if order is None else [loops[i] for i in order]
        return Nest([Loop(v, size) for v, size in nested], [Index(index, flat_index(tuple(loops)))])

    def memory_order(self, sizes: list[sympy.Expr]) -> tuple[int, ...] | None:
        """A pointwise kernel's loops from outermost to innermost in the memory order of its first
        output of the frame's shape (largest stride outermost, ties in dim order), where more of
        the tensors it reads and writes at that shape then step by at most one element along the
        innermost loop than in the dims' order (a channels-last chain: its channels innermost; a
        transpose keeps the dims' order and its tiles).  ``sizes``: the frame's, as the nest has
        them.  None: the dims' order."""
        shape = tuple(self.frame.shape)
        rank = len(shape)
        for n in self.outputs_of():
            v = n.meta[VAL]
            if isinstance(v, torch.Tensor) and shape_of(v) == shape:
                break
        else:
            return None
        dims = [d for d, k in enumerate(sizes) if k != 1]  # the dims ``nest`` gave loops
        if len(dims) < 2 or not all(type(v.stride()[d]) is int for d in dims):
            return None
        order = tuple(sorted(range(len(dims)), key=lambda i: -v.stride()[dims[i]]))
        if order == tuple(range(len(dims))):
            return None
        members = set(self.nodes)
        operands = [a.meta[VAL] for n in self.nodes for a in n.all_input_nodes if a not in members]
        operands += [n.meta[VAL] for n in self.outputs_of()]

        def unit_steps(d: int) -> int:  # operands stepping by 0 or 1 element along dim d
            count = 0
            for t in operands:
                if not isinstance(t, torch.Tensor) or t.ndim > rank or any(
                        type(s) is not int for s in t.stride()):
                    continue
                j = d - (rank - t.ndim)
                count += j < 0 or expr(t.shape[j]) == 1 or t.stride()[j] in (0, 1)  # (no SymInt compare: no guard)
            return count

        return order if unit_steps(dims[order[-1]]) > unit_steps(dims[-1]) else None

    def check_int64(self, vals) -> None:
        pass  # every C index is int64_t: no narrower choice to rule out

    def loop(self, body, independent: bool = False, simd: tuple[tuple[str, str], ...] = ()) -> Nest:
        """Emit ``body()`` inside the loops over a row's reduced dims, in its own scope: the nest,
        at the end of body.  ``simd``: the reductions of a fold's accumulators (operator,
        accumulator) its innermost loop combines in vector lanes (as eager's kernels sum);
        ``independent`` loops are vectorized without reductions."""
        nest = self.open_nest(self.rvars, RINDEX)
        if simd or independent:
            nest.simd = simd
        self.hoisted, self.body = self.body, nest.body  # loads of row values go before the loop
        self.scopes.append({})
        body()
        self.scopes.pop()
        self.body, self.hoisted = self.hoisted, None
        self.body.append(nest)
        return nest

    def operand(self, a, shape: tuple, dom: Domain) -> Value:
        if isinstance(a, fx.Node) and a in self.row_cache and dom == Domain.ELEMENT and shape == node_shape(a):
            return self.row_cached(a, lambda: super(CEmitter, self).operand(a, shape, dom))
        return super().operand(a, shape, dom)

    def value(self, n: fx.Node):
        if n in self.row_cache and self.dom(n) == Domain.ELEMENT:
            return self.row_cached(n, lambda: super(CEmitter, self).value(n))
        return super().value(n)

    def row_cached(self, a: fx.Node, compute) -> Value:
        """A reduction input of a multi-pass row (``ROW_CACHE_MAX_NUMEL``), inside a pass's
        loop: the first pass computes it (``compute``) and stores it in the row's array,
        declared before that pass's loop; the later passes read the array."""
        if self.hoisted is None or a not in self.row_cache:
            return compute()
        found = self.lookup(("row", a))
        if found is not None:
            return found
        row = self.row_cache[a]
        if row is None:
            v = compute()
            if self.row_cache[a] is not None:  # computing it made the row (an operand read through ``value``)
                return self.remember(("row", a), v)
            row = self.row_cache[a] = Var(self.fresh("row"), v.dtype)
            self.hoisted.append(self.scratch.alloc(CTYPE[v.dtype], row.name, (int(self.frame.rnumel),), v.dtype.itemsize))
            self.body.append(Set(Elem(row.name, (R,), v.dtype), v))
        else:
            v = self.bind(self.fresh("c"), Elem(row.name, (R,), row.dtype))
        return self.remember(("row", a), v)

    def load(self, a: fx.Node, shape: tuple, dom: Domain) -> Value:
        """A read inside a fold's loop whose offset does not vary with the reduced index (a row's
        mean, a column's bias) is made once per row, before the loop: left inside, next to the
        loop's stores, the compiler could not tell it from them and would not vectorize the loop."""
        if self.hoisted is None or dom != Domain.ELEMENT:
            return super().load(a, shape, dom)
        before = len(self.body)
        v = super().load(a, shape, dom)
        new = self.body[before:]
        if len(new) == 1 and isinstance(new[0], Load):  # the load alone (no index local made for
            # it): hoisted if its offset neither varies with the reduced index nor reads a local
            # the loop defines
            off = new[0].offset
            defined = {s.name for s in self.body if isinstance(s, Index)}
            if RINDEX not in self.deps_of(off) and not {s.name for s in off.free_symbols} & defined:
                self.hoisted.append(self.body.pop())
                self.scopes[-2][("load", a, shape, dom)] = v
        return v

    # ---------------------------------------------------------------- text

    def value_name(self, n: fx.Node) -> str:
        """Locals are numbered, not named after the graph's nodes: the same kernel in another place
        of the graph, or in another graph, is then the same text, compiled once (``c_function``).
        The launch source's head says which node each holds."""
        self.value_names.append((f"v{len(self.value_names)}", n.name))
        return self.value_names[-1][0]

    def index_bound(self, sym: sympy.Symbol) -> int | None:
        """Loop variables run over their sizes, xindex and rindex over the row and reduced counts
        (every C loop stays in range): static sizes only."""
        size = dict(self.xvars + self.rvars).get(sym.name)
        frame = getattr(self, "frame", None)
        if size is None and frame is not None:
            size = {XINDEX: frame.xnumel, RINDEX: frame.rnumel}.get(sym.name)
        size = sympy.sympify(size) if size is not None else None
        return int(size) if size is not None and size.is_Integer else None

    def add_load(self, name: str, ptr: str, off: sympy.Expr, dom: Domain, dtype: torch.dtype) -> None:
        self.body.append(Load(name, ptr, off, dtype, dom, at=self.tiled(ptr, off, dtype, stored=False)))

    def store(self, n: fx.Node, index: int | None, val: torch.Tensor, v: Value, dom: Domain) -> None:
        ptr, off = self.store_target(n, index, val, dom)
        self.body.append(Store(ptr, off, ir.cast(v, val.dtype), dom, at=self.tiled(ptr, off, val.dtype, stored=True)))

    # ---------------------------------------------------------------- reductions

    def accumulator(self, low: Reduction, in_dt: torch.dtype, out_dt: torch.dtype) -> torch.dtype:
        return accumulator(low, in_dt, out_dt)

    def element(self, r, low: Reduction, acc_dt: torch.dtype) -> Value:
        """The element of reduction ``r``'s input that the open fold loop reads, as its accumulator type."""
        return ir_aten.element(low, self.operand(r.inp, node_shape(r.inp), Domain.ELEMENT), acc_dt)

    def combine(self, low: Reduction, acc_dt: torch.dtype, acc: str, nan: str | None, element: Value) -> None:
        """Fold ``element`` into ``acc`` (max/min: the vectorizable compare, NaN tracked in ``nan``)."""
        if nan is None:
            self.body.append(Set(acc, ir_aten.combine(low, Var(acc, acc_dt), element)))
            return
        e, a = self.bind(self.fresh("e"), element), Var(acc, acc_dt)
        self.body.append(Set(acc, ir.where(ir.compare("gt" if low.combine == "max_nan" else "lt", e, a), e, a)))
        self.body.append(Set(nan, ir.isnan(e), op="|"))

    def open_fold(self, low: Reduction, acc_dt: torch.dtype, track_nan: bool = True) -> tuple[str, str | None]:
        """Declare a combine fold's accumulator (and, for max/min in an ``omp simd`` reduction,
        its NaN flag: the reduction clause needs the plain compare): their names."""
        acc = self.fresh("acc")
        self.body.append(Let(acc, ir_aten.identity(low, acc_dt), mutable=True))
        if not track_nan or low.combine not in ("max_nan", "min_nan"):
            return acc, None
        nan = self.fresh("nan")
        self.body.append(Let(nan, ir.Const(0, torch.int32), mutable=True))
        return acc, nan

    def close_fold(self, acc: str, nan: str | None, acc_dt: torch.dtype) -> None:
        if nan is not None and acc_dt.is_floating_point:
            nan_seen = ir.cast(Var(nan, torch.int32), torch.bool)  # NaN wins, as in eager
            self.body.append(Set(acc, ir.where(nan_seen, ir.Const(math.nan, acc_dt), Var(acc, acc_dt))))

    def fold_columns(self) -> None:
        """Every fold of a column kernel (the last dim kept: sums over the batch, a bias's
        gradient, a mean over tokens...) in one loop over the reduced elements, with the full
        outputs stored in the same loop: the innermost kept loop around it is the vectorized one
        (``launch``), each lane folding its own column (max/min with ``FX_MAX_NAN``: no reduction
        clause to satisfy).  Values per element derived from a fold's result cannot be computed
        in that one pass: ``frame_refusal`` refuses them."""
        kinds = column_folds(self.reductions)  # (frame_refusal took the other strategies)
        if columns_by_rows(self.frame, kinds):
            self.by_rows = {}  # the accumulators are arrays: acc[xindex]
        folds = []
        for key, (r, low, part_dt, acc_dt) in kinds.items():
            if self.by_rows is None:
                acc, _ = self.open_fold(low, acc_dt, track_nan=False)
                self.column_accs[key] = {"acc": Var(acc, acc_dt)}
                folds.append((r, low, acc_dt, acc))
            else:  # the fold loop folds a row into the column's part (``columns_by_rows``)
                acc, part = self.fresh("acc"), self.fresh("part")
                self.by_rows[acc] = ColumnFold(low, acc_dt, part, part_dt)
                self.column_accs[key] = {"acc": Elem(acc, (X,), acc_dt)}
                folds.append((r, low, part_dt, part))
        full = self.full_outputs()

        def one_pass():
            for r, low, acc_dt, acc in folds:
                self.combine(low, acc_dt, acc, None, self.element(r, low, acc_dt))
            for n in full:
                self.store(n, None, n.meta[VAL], self.value(n), Domain.ELEMENT)

        self.fold_nest = self.loop(one_pass)

    def store_full(self, full: list[fx.Node], persistent: bool) -> None:
        if not self.columns:  # a column kernel stored them in its fold loop
            super().store_full(full, persistent)

    def fold(self, r, low: Reduction, acc_dt: torch.dtype, persistent: bool) -> dict[str, Var]:
        if self.columns:
            if not self.column_accs:
                self.fold_columns()
            return self.column_accs[(r.inp, r.kind, tuple(r.dims))]

        def element() -> Value:
            return self.element(r, low, acc_dt)

        if low.strategy == "combine":
            acc, nan = self.open_fold(low, acc_dt)
            if nan is not None:
                op = "max" if low.combine == "max_nan" else "min"
                self.loop(lambda: self.combine(low, acc_dt, acc, nan, element()), simd=((op, acc), ("|", nan)))
            else:
                red = "+" if low.combine == "add" else "*"
                self.loop(lambda: self.combine(low, acc_dt, acc, None, element()), simd=((red, acc),))
            self.close_fold(acc, nan, acc_dt)
            return {"acc": Var(acc, acc_dt)}
        total, mean, m2 = self.fresh("sum"), self.fresh("mean"), self.fresh("m2")
        self.body.append(Let(total, ir.Const(0.0, acc_dt), mutable=True))
        self.loop(lambda: self.body.append(Set(total, ir.add(Var(total, acc_dt), element()))), simd=(("+", total),))
        self.body.append(Let(mean, ir.truediv(Var(total, acc_dt), ir_aten.count(self.frame.rnumel, acc_dt))))
        self.body.append(Let(m2, ir.Const(0.0, acc_dt), mutable=True))

        def deviation():
            d = self.bind(self.fresh("d"), ir.sub(element(), Var(mean, acc_dt)))
            self.body.append(Set(m2, ir.add(Var(m2, acc_dt), ir.mul(d, d))))

        self.loop(deviation, simd=(("+", m2),))
        return {"mean": Var(mean, acc_dt), "m2": Var(m2, acc_dt)}

    def columns_by_rows(self, top: Nest, condition) -> list[Stmt] | None:
        """A column kernel's body walking the rows in order (``COLUMNS_BY_ROWS_MIN``), or None.

        The body the walk down each column built -- per column: its definitions and
        accumulators, the fold loop over the rows, then what follows from the folds -- becomes
        three nests of the columns' loops (``top``): the accumulators (one array element per
        column) set, then for each block of rows (``COLUMN_ROW_BLOCK``) the columns (the vectorized
        loop) with their definitions and the fold loop's body for each row of the block, then per
        column its definitions and what follows.  Each column folds its rows in one order.  Over
        enough rows (``row_chunks``) the rows fold in chunks, each into a part of its own per
        column, the chunks split across threads under ``condition`` (``parallel_condition``), and
        the parts then fold into the columns' elements in chunk order.  Otherwise, under
        ``condition``, the outermost kept loop is cut into blocks of columns (``column_blocks``),
        one thread a block: each walks every row's columns of its block.  Either way the chunks
        and the order depend on the sizes alone: the same sums at any thread count."""
        if not self.by_rows or self.fold_nest is None:  # (decided by fold_columns: COLUMNS_BY_ROWS_MIN...)
            return None
        at = next(i for i, st in enumerate(self.body) if st is self.fold_nest)
        pre, post = self.body[:at], self.body[at + 1:]
        # what the columns' loops before the fold define (coordinates, hoisted reads), without the
        # stores of row values: those are made once, after the fold
        defs = [st for st in pre if not isinstance(st, Store)]
        columns, rn, per_block = int(self.frame.xnumel), sympy.sympify(self.frame.rnumel), COLUMN_ROW_BLOCK
        row = self.fold_nest.body  # one row's fold (``ri`` its row), from the row's index on
        small = sum(1 for _ in walk(row)) <= COLUMN_ROW_BLOCK_MAX_STMTS
        chunks = self.row_chunks(int(rn), columns) if rn.is_Integer and small else None
        blocks = self.column_blocks() if condition is not None and chunks is None else None
        loops = top.loops
        if blocks is not None:  # the outermost kept loop over the block's columns alone
            var, size, block = blocks
            loops = [Loop(var, local("xb") + local("nb"), local("xb"))] + loops[1:]

        def nest(stmts: list[Stmt]) -> Nest:
            return Nest(loops, top.body + stmts, simd=top.simd)

        def element_of(acc: str) -> Elem:
            return Elem(acc, (X,), self.by_rows[acc].dtype)

        def fold_rows(first: sympy.Expr | None, count: int, into: Callable[[str], Elem] = element_of) -> list[Stmt]:
            """Rows ``first`` to ``first + count`` of a column folded into its parts, unrolled (None:
            the row ``ri`` of the loop around), then the parts into the column's array elements
            (``into``: an accumulator's element for the column)."""
            parts = [Let(f.part, ir_aten.identity(f.low, f.part_dtype), mutable=True)
                     for f in self.by_rows.values()]
            rows = row if first is None else [Nest([], [Index("ri", first + k)] + row) for k in range(count)]
            return parts + rows + [
                Set(into(acc), ir_aten.combine(f.low, into(acc), ir.cast(Var(f.part, f.part_dtype), f.dtype)))
                for acc, f in self.by_rows.items()]

        out = [self.scratch.alloc(CTYPE[f.dtype], a, (columns,), f.dtype.itemsize) for a, f in self.by_rows.items()]
        nests = [nest([Set(Elem(acc, (X,), f.dtype), ir_aten.identity(f.low, f.dtype)) for acc, f in self.by_rows.items()])]
        if rn.is_Integer and small:
            whole = int(rn) - int(rn) % per_block
            rb = sympy.Symbol("rb", integer=True, nonnegative=True)
            if chunks is not None:  # the rows in chunks, one thread a chunk, then the chunks' parts in order
                arrays, folds = self.chunked_folds(chunks, whole, columns, condition, lambda into: nest(
                    defs + fold_rows(rb, per_block, into)), nest)
                out, nests = out + arrays, nests + folds
            elif whole:
                nests.append(Nest([Loop("rb", whole, 0, per_block)], [nest(defs + fold_rows(rb, per_block))]))
            if int(rn) % per_block:  # the rows after the last whole block
                nests.append(nest(defs + fold_rows(sympy.Integer(whole), int(rn) % per_block)))
        else:
            nests.append(Nest(self.fold_nest.loops, [nest(defs + fold_rows(None, 1))]))
        nests.append(nest(pre + post))
        if blocks is None:
            return out + nests
        return out + [split(Nest([Loop("xb", size, 0, block)], [block_rows("xb", size, block)] + nests),
                            1, condition)]

    def chunked_folds(self, chunks: tuple[int, int], whole: int, columns: int, condition,
                      fold_block: Callable[[Callable[[str], Elem]], Nest],
                      nest: Callable[[list[Stmt]], Nest]) -> tuple[list[Array], list[Stmt]]:
        """The rows ``[0, whole)`` of a column kernel walking its rows folded in ``chunks``
        (``row_chunks``): each chunk's blocks of rows (``fold_block(into)``, folding into the
        element ``into(acc)``) into a part of its own per column, the chunks split across threads
        under ``condition``; then the parts folded into the columns' elements in chunk order.
        Returns the parts' arrays and the two nests."""
        per_chunk, count = chunks
        arrays = [self.scratch.alloc(CTYPE[f.dtype], f"{a}_chunks", (count, _ceil_to(columns, 8)), f.dtype.itemsize)
                  for a, f in self.by_rows.items()]  # (each chunk's part on cache lines of its own)

        def chunk_of(acc: str) -> Elem:  # the column's part in chunk ``rc``
            return Elem(f"{acc}_chunk", (X,), self.by_rows[acc].dtype)

        def at_chunk(readonly: bool) -> list[Stmt]:
            return [View(f"{acc}_chunk", Elem(f"{acc}_chunks", (rc,), f.dtype), readonly) for acc, f in self.by_rows.items()]

        rc = local("rc")
        fold = at_chunk(False) + [
            nest([Set(chunk_of(acc), ir_aten.identity(f.low, f.dtype)) for acc, f in self.by_rows.items()]),
            Index("re", sympy.Min((rc + 1) * per_chunk, whole)),
            Nest([Loop("rb", local("re"), rc * per_chunk, COLUMN_ROW_BLOCK)], [fold_block(chunk_of)])]
        gather = at_chunk(True) + [nest([
            Set(Elem(acc, (X,), f.dtype), ir_aten.combine(f.low, Elem(acc, (X,), f.dtype), chunk_of(acc)))
            for acc, f in self.by_rows.items()])]
        return arrays, [split(Nest([Loop("rc", count)], fold), 1, condition), Nest([Loop("rc", count)], gather)]

    def row_chunks(self, rows: int, columns: int) -> tuple[int, int] | None:
        """How a column kernel walking its rows (``columns_by_rows``) folds them in chunks
        (``COLUMN_CHUNKS_MAX``): (rows a chunk, a whole number of ``COLUMN_ROW_BLOCK``; chunks), or
        None (too few rows for two chunks, or their parts over ``COLUMN_PARTS_MAX_BYTES``).  From the
        sizes alone, never the thread count."""
        whole = rows - rows % COLUMN_ROW_BLOCK
        least = _ceil_to(-(-COLUMN_CHUNK_MIN_ELEMENTS // columns), COLUMN_ROW_BLOCK)
        part_bytes = _ceil_to(columns, 8) * sum(f.dtype.itemsize for f in self.by_rows.values())
        return chunks(whole, whole // least, part_bytes, COLUMN_ROW_BLOCK)

    def column_blocks(self) -> tuple[str, int, int] | None:
        """How a column kernel walking its rows (``columns_by_rows``) cuts its outermost kept loop
        across threads: (its variable, its size, columns a block), or None (too few columns for
        two blocks of ``COLUMN_BLOCK_MIN``).  As many blocks as threads it is built for, each a
        whole number of vectors."""
        if not self.xvars:
            return None
        var, size = self.xvars[0]
        size = sympy.sympify(size)
        if not size.is_Integer or int(size) < 2 * COLUMN_BLOCK_MIN:
            return None
        size = int(size)
        blocks = min(self.threads, size // COLUMN_BLOCK_MIN)
        block = -(-size // blocks)
        block = -(-block // COLUMN_BLOCK_MIN) * COLUMN_BLOCK_MIN
        return var, size, block

    # ---------------------------------------------------------------- the function

    def work(self) -> sympy.Expr:
        """The node-elements the kernel computes: the elements it iterates times its nodes, plus one."""
        return sympy.expand(self.frame.xnumel * self.frame.rnumel * (len(self.nodes) + 1))

    def parallel_condition(self, work: sympy.Expr):
        """When the kernel's outer loops are split across threads (``parallel_min_work`` at the
        thread count it is built for; ``work``: ``self.work()``): True always, (its work, the
        least work) where it is symbolic (split when ``work >= least``), None never."""
        least = parallel_min_work(self.threads)
        if self.scratch.heap or least is None:
            return None  # (one heap block a call, shared: the arrays in it are per row)
        if work.is_Integer:
            return True if int(work) >= least else None
        return work, least

    def launch(self) -> CEmitted:
        top = self.open_nest(self.xvars, XINDEX, self.loop_order)
        # each lane of the vectorized kept loop folds a column; a pointwise kernel's elements are
        # independent (a tiled nest marks its own innermost loop, ``tiled_nest``)
        if self.columns or (not self.frame.reduction and not self.tiles):
            top.simd = ()
        if self.frame.reduction and not self.rvars:  # rows of one element: (xindex, 0) is every element
            top.body.append(Index(RINDEX, sympy.Integer(0)))
        work = self.work()
        condition = self.parallel_condition(work)
        by_rows = self.columns_by_rows(top, condition)
        if by_rows is not None:
            stmts = by_rows
        elif self.tiles:
            top.body += self.body
            stmts = [self.tiled_nest(top, condition)]
        else:
            # the threads share the rows (a row kernel), or every loop but the vectorized innermost
            # one (that one alone: its elements)
            n = len(self.xvars)
            outer = n if self.frame.reduction and not self.columns else max(n - 1, min(n, 1))
            top.body += self.body
            stmts = [split(top, outer, condition)]
        body = CStatements(self.values).lines(stmts, "    ")
        symbol, lines = c_function(self.params, body, self.scratch.heap)
        self.launch_prologue = self.prologue()
        head = launch_head(self.name, bool(self.frame.reduction), self.value_names, lines)
        launch = launch_source(self.name, self.args, self.params, self.launch_prologue, head)
        return CEmitted(symbol, "\n".join(lines) + "\n", launch, self.name, list(self.args), list(self.params),
                        len(self.nodes), len(self.storages), self.specs,
                        quick=bool(work.is_Integer and int(work) < QUICK_BUILD_MAX_WORK))
