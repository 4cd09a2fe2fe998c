"""How a C kernel runs on a CPU, decided from sizes alone: which kernels fold columns and how
(row caches, columns walked by rows, column blocks, row chunks), tiles for values read across
the rows, when a kernel splits across threads (``parallel_min_work``) and when it is built
quickly; the facts ``kernel.py``'s ``CEmitter`` reads to print a kernel, and the checks the
fusion pass asks (``frame_refusal``).
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import sympy
import torch
import torch.fx as fx

from ...core.graph import VAL, node_kind
from ...core.iteration import reduction_of
from ..ir import aten as ir_aten
from ..ir.rows import Frame, trailing
from ..ir.aten import REDUCTIONS, Reduction
from ..ir import values as ir
from ..ir.stmts import Do, Index, Nest, local
from ..ir.values import Domain, Elem


# A column kernel walks down its columns (one cache line per row for each vector of columns), so
# the data it reduces has to stay in cache: a BERT vocabulary bias gradient (256 x 30,522 floats)
# took 19.7 ms where ATen's row-blocked column sum takes well under 1 ms.
COLUMN_MAX_NUMEL = 1 << 18
# A row kernel making several passes over each row (a layer norm: the sum, the deviations, the
# normalized output) keeps the row's reduction inputs, computed in its first pass, in a local
# array for the later ones, when the row has at most this many elements (static): the later
# passes read it as a contiguous vector instead of reloading (and recomputing) it, which counts
# most where the input is read at a stride (a residual added from a transposed value).
ROW_CACHE_MAX_NUMEL = 4096
# A column kernel with at least this many columns (static) walks its rows in order, each row's
# columns in the vectorized inner loop, folding into one accumulator per column (an array on the
# stack, of at most COLUMNS_BY_ROWS_MAX_BYTES): memory is read as it lies, where walking down each
# vector of columns touches a new cache line at every row.  Fewer columns fit one vector: they
# walk down, the accumulators in registers.
COLUMNS_BY_ROWS_MIN = 32
COLUMNS_BY_ROWS_MAX_BYTES = 64 << 10
# Such a kernel folds its rows COLUMN_ROW_BLOCK at a time (static row counts, a fold body of at
# most COLUMN_ROW_BLOCK_MAX_STMTS statements, unrolled): each column folds the block's rows into
# a local of the fold's own accumulator type, then that into its array element.  A float32 sum
# then adds eight floats in vector registers for each double it adds to the array.  The sums
# stay in one order, whatever the thread count.  (Unrolled: a block loop of run-time length
# inside the vector loop stays scalar.)
COLUMN_ROW_BLOCK = 8
COLUMN_ROW_BLOCK_MAX_STMTS = 48
# Such a kernel splits across threads by blocks of at least this many columns of its outermost
# kept loop (``column_blocks``): one vector of float32 at AVX-512's width.
COLUMN_BLOCK_MIN = 16
# Such a kernel over enough rows folds them in chunks instead (``row_chunks``): each chunk (at
# most COLUMN_CHUNKS_MAX, each at least COLUMN_CHUNK_MIN_ELEMENTS elements) folds its rows into
# its own part of every column, then the parts fold in chunk order.  One thread takes a chunk:
# it reads (and stores) rows of its own, where a block of columns reads a strip of every row and
# shares every page with the other threads, and a few columns still split across many threads.
# The chunks depend on the sizes alone: the same sums at any thread count.
COLUMN_CHUNKS_MAX = 64
COLUMN_CHUNK_MIN_ELEMENTS = 16384
COLUMN_PARTS_MAX_BYTES = 256 << 10
# A float32 tensor read or stored across the rows a kernel walks (element j of row x at x + s*j:
# a transposed value, a permuted copy) moves through a tile: TILE_ROWS consecutive rows at a
# time, copied before them into a local array holding each row contiguously (or stored from it
# after them) by ``fx_tile_in8``/``fx_tile_out8``, 8 x 8 blocks transposed in vector registers.
# The rows then read and write it as vectors, where each element was a scalar load or store of
# its own (a mixer's layer norm reading a transposed residual).
# The rows are the innermost kept loop of a row kernel (the elements: its reduced loop), or a
# pointwise kernel's second-innermost loop (the elements: its innermost); both of static size,
# at least TILE_ROWS; the tiles of a kernel take at most TILE_MAX_BYTES of C stack.
TILE_ROWS = 8
TILE_MAX_BYTES = 64 << 10
# A kernel's outer loops are split across T OpenMP threads (``build.openmp``) where the time
# saved pays for waking them: ``parallel_min_work``.  The model: the kernel computes about
# WORK_NS for each node-element (the elements it iterates times its nodes, plus one: vector code,
# a float op and its loads), so splitting saves (1 - 1/T) of that; libgomp wakes and joins its
# threads in a tree, about FORK_NS for each doubling of T (measured with two threads: an
# ``omp parallel for`` over a float multiply-add broke even at 16,384 elements, 0.8 µs).
WORK_NS = 0.05
FORK_NS = 800


# A kernel whose run time by the same model (``WORK_NS`` a node-element, static sizes) is under
# QUICK_BUILD_MAX_NS is built at -O1 with the loop vectorizer (``build.flags``, ``quick``): that
# is about what the wrapper spends calling it, so what -O2 could save of it is little, and the
# compiler builds such kernels in three quarters of the time (a 10,000-node graph of small
# tensors: 3.4 against 4.6 CPU-s).  Larger kernels are built at -O2.
QUICK_BUILD_MAX_NS = 1000
QUICK_BUILD_MAX_WORK = round(QUICK_BUILD_MAX_NS / WORK_NS)  # node-elements: 20,000


def parallel_min_work(threads: int) -> int | None:
    """The fewest node-elements a kernel splits across ``threads`` for (None: one thread, no
    split): where the fork and join cost as much as the split saves (``WORK_NS``, ``FORK_NS``)."""
    if threads <= 1:
        return None
    fork = FORK_NS * math.log2(threads)
    return math.ceil(fork / (WORK_NS * (1 - 1 / threads)))


# Kernel parameter types: tensors are ``*`` + their element type (``ops.SIG_DTYPE``); sizes and
# scalars keep the emitter's names.


@functools.lru_cache(maxsize=4096)
def flat_index(loops: tuple[tuple[str, sympy.Expr], ...]) -> sympy.Expr:
    """The row-major flat index over the loop variables of ``loops`` (their sizes)."""
    flat, inner = sympy.Integer(0), sympy.Integer(1)
    for v, s in reversed(loops):
        flat, inner = flat + sympy.Symbol(v, integer=True, nonnegative=True) * inner, inner * s
    return flat


def _ceil_to(n: int, multiple: int) -> int:
    """The least multiple of ``multiple`` at least ``n`` (and at least ``multiple``)."""
    return max(1, -(-n // multiple)) * multiple


def chunks(units: int, most: int, part_bytes: int, step: int = 1) -> tuple[int, int] | None:
    """``units`` iterations cut into chunks (``COLUMN_CHUNKS_MAX``): at most ``most`` of them and
    as many as their parts (``part_bytes`` each, 0: none) fit in ``COLUMN_PARTS_MAX_BYTES``;
    (iterations a chunk, a multiple of ``step``; chunks), or None (fewer than two).  A column
    kernel's rows (``CEmitter.row_chunks``) and a template's rows (``templates._row_chunks``) are
    chunked so; from the sizes alone, never the thread count."""
    fit = COLUMN_PARTS_MAX_BYTES // part_bytes if part_bytes else COLUMN_CHUNKS_MAX
    count = min(COLUMN_CHUNKS_MAX, most, fit)
    if count < 2:
        return None
    per_chunk = _ceil_to(-(-units // count), step)
    return per_chunk, -(-units // per_chunk)


@dataclass
class ColumnFold:
    """A fold of a column kernel walking its rows in order (``CEmitter.columns_by_rows``): its
    array (one element per column, of ``dtype``) and ``part``, the local (of ``part_dtype``, the
    fold's own accumulator type) that folds a block of a column's rows before the array element
    takes it in."""

    low: Reduction
    dtype: torch.dtype
    part: str
    part_dtype: torch.dtype


def split(nest: Nest, loops: int, condition) -> Nest:
    """``nest`` with its first ``loops`` loops split across threads under ``condition``
    (``CEmitter.parallel_condition``: True always, (work, least) when ``work >= least``, None
    never).  Each element or row is still computed by one thread, in one order: the results do
    not depend on the thread count."""
    if condition is not None and loops:
        nest.parallel, nest.parallel_if = loops, (None if condition is True else condition)
    return nest


def block_rows(start: str, rows: int, block: int) -> Index:
    """``nb``, the rows of the block of ``rows`` starting at row ``start`` (``block``, the last one
    fewer where ``rows`` is no multiple of it)."""
    if rows % block == 0:
        return Index("nb", sympy.Integer(block))
    return Index("nb", sympy.Min(rows - local(start), block))


def tile_move(fn: str, dst: Elem, dst_step, src: Elem, src_step, n: int) -> Do:
    """The prelude's tile helper ``fn`` (``fx_tile_in8`` into a tile, ``fx_tile_out8`` out of one)
    moving the block's ``nb`` rows (``block_rows``) of ``n`` float32 elements from ``src`` to
    ``dst``: element ``j`` of a row ``*_step * j`` elements after the row's first (a tensor's
    stride along the row, or the tile's row length)."""
    args = (ir.Addr(dst), ir.Index(sympy.sympify(dst_step)), ir.Addr(src), ir.Index(sympy.sympify(src_step)),
            ir.Index(sympy.Integer(n)), ir.Var("nb", torch.int64))
    return Do(ir.Call(fn, args))


def accumulator(low: Reduction, in_dt: torch.dtype, out_dt: torch.dtype) -> torch.dtype:
    """The type a C fold of ``low`` accumulates in: float32 sums and moments in double (the row is
    folded in order, not in a tree)."""
    acc = ir_aten.accumulator_dtype(low, in_dt, out_dt)
    return torch.float64 if acc == torch.float32 and low.accumulate in ("sum", "moments") else acc


def innermost_dim(reductions: list[fx.Node], dims: list[int]) -> int:
    """Of ``dims`` (of the frame's shape), the one the first reduction's input steps along by the
    fewest elements (static strides; the last where they are symbolic or tie)."""
    strides = reduction_of(reductions[0]).inp.meta[VAL].stride()
    if any(type(strides[d]) is not int for d in dims):
        return dims[-1]
    return min(reversed(dims), key=lambda d: strides[d])


def column_folds(reductions: list[fx.Node]) -> dict[tuple, tuple]:
    """A column kernel's folds, one per (input, kind, dims): the reduction, its lowering, the
    fold's own accumulator type and C's (float32 sums in double)."""
    kinds = {}
    for n in reductions:
        r = reduction_of(n)
        low = REDUCTIONS[r.kind]
        dts = r.inp.meta[VAL].dtype, n.meta[VAL].dtype
        kinds.setdefault((r.inp, r.kind, tuple(r.dims)),
                         (r, low, ir_aten.accumulator_dtype(low, *dts), accumulator(low, *dts)))
    return kinds


def columns_by_rows(fr: Frame, kinds: dict[tuple, tuple]) -> bool:
    """A column kernel walks its rows in order, its accumulators an array per fold
    (``COLUMNS_BY_ROWS_MIN``), rather than down each column."""
    columns = sympy.sympify(fr.xnumel_g)
    return (columns.is_Integer and int(columns) >= COLUMNS_BY_ROWS_MIN
            and int(columns) * sum(dt.itemsize for *_, dt in kinds.values()) <= COLUMNS_BY_ROWS_MAX_BYTES)


def frame_refusal(fr: Frame, reductions: list[fx.Node], nodes: list[fx.Node], dom) -> str | None:
    """Why a C kernel does not run the group of ``nodes`` (its members in schedule order) in frame
    ``fr``, beyond the rules every language keeps (``ir/rows.py``), or None.  ``dom(n)``: a
    computed member's domain.
    ``CEmitter`` raises it as it builds the frame; the fusion facts ask it of a candidate group
    (``facts.group_cost``): the two cannot disagree."""
    if not fr.reduction:
        return None
    if any(REDUCTIONS[reduction_of(n).kind].strategy == "arg" for n in reductions):
        return "arg reductions (argmax, max.dim...) run as ATen kernels"
    dims = fr.layouts[fr.shape]
    if trailing(fr.shape, dims):
        return None
    inner = [d for d, s in enumerate(fr.shape) if s != 1]
    if inner and inner[-1] in dims and innermost_dim(reductions, inner) in dims:
        # (the last dim reduced with others not next to it, and reduced in memory too: rows of
        # short runs, whose folds' vector loops would be a few elements long)
        return "a reduction over the last dim and others not next to it runs as an ATen kernel"
    # (a channels-last batch norm's sums over N, H and W: columns, C innermost in memory)
    for n in reductions:
        if REDUCTIONS[reduction_of(n).kind].strategy != "combine":
            return f"{reduction_of(n).kind} over leading dims runs as an ATen kernel"
    if not columns_by_rows(fr, column_folds(reductions)):  # walking down each column: data in cache only
        numel = sympy.sympify(fr.xnumel_g * fr.rnumel_g)
        if not (numel.is_Integer and int(numel) <= COLUMN_MAX_NUMEL):
            return (f"a column reduction over more than {COLUMN_MAX_NUMEL} elements (or a symbolic count), with "
                    f"fewer than {COLUMNS_BY_ROWS_MIN} columns or more accumulators than {COLUMNS_BY_ROWS_MAX_BYTES} "
                    "bytes, runs as ATen's kernel: walking down columns of data that is not in cache waits on "
                    "memory at every row")
    # every fold and every value per element in one pass (``fold_columns``): none of those
    # values may need a fold's result
    after = set(reductions)
    for n in nodes:
        if n not in after and any((a.args[0] if a.target is operator.getitem else a) in after
                                  for a in n.all_input_nodes):
            if node_kind(n) == "compute" and dom(n) == Domain.ELEMENT:
                return f"{n.name} is read before its reduction ran (a column kernel folds in one pass)"
            after.add(n)
    return None
