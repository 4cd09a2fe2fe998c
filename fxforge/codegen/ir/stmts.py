"""A kernel's statements: the loop nest, its loads and stores, the locals it binds and the
accumulators its folds update, as the group walk (``lowering.py``) builds them.

Every kernel language prints these (``codegen/c/printer.py``, ``codegen/triton/printer.py``)
and nothing reads printed text back: what a language changes about a kernel (a read made once
before a loop, a nest split across threads, a column kernel walking its rows in order) it
changes here, on the statements.

* ``Index``: an integer local bound to an index expression (sympy, Python floor semantics);
* ``Load`` / ``Store``: an element of a tensor parameter at an offset (an index expression in
  the kernel's indices and locals), in a domain (``values.Domain``: ``ROW``, one per row;
  ``ELEMENT``, one per element of the rows);
* ``Let``: a local bound to a value (``values.py``), ``mutable`` for an accumulator;
* ``Set``: an accumulator (a local, or an element of a local array: ``values.Elem``) updated;
* ``Reduce``: a fold step of a block language, lane by lane or across each row's lanes;
* ``Nest``: perfectly nested loops around a body (none: a block of its own), with what a
  printer may do with them: vectorize the innermost loop (its iterations independent but for the
  named reductions), split the outer ones across threads;
* ``Array``: a local array (``Scratch`` in C decides where it lives), ``View``: a local naming
  one row of it;
* ``Do``: a helper of the language's prelude called for its effect (``values.Call``: a tile
  moved between a tensor and a local array);
* ``Check``: the kernel ends with an error where a condition holds (an index out of range),
  ``Skip``: the rest of the innermost loop's iteration is skipped where one holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import sympy
import torch

from .values import Call, Domain, Elem, Value


def local(name: str) -> sympy.Symbol:
    """An index local or loop variable of the kernel (a non-negative integer) in index expressions."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


@dataclass(eq=False)
class Index:
    name: str
    expr: sympy.Expr


@dataclass(eq=False)
class Load:
    name: str
    ptr: str
    offset: sympy.Expr
    dtype: torch.dtype
    dom: Domain
    at: Elem | None = None  # where the language reads the element instead (a C tile's element)


@dataclass(eq=False)
class Store:
    ptr: str
    offset: sympy.Expr
    value: Value  # of the stored dtype
    dom: Domain
    at: Elem | None = None  # where the language writes the element instead (a C tile's element)


@dataclass(eq=False)
class Let:
    name: str
    value: Value  # (the local has its dtype)
    mutable: bool = False


@dataclass(eq=False)
class Set:
    target: str | Elem  # a local, or an element of a local array
    value: Value
    op: str = ""  # a compound update: ``target op= value``


@dataclass(eq=False)
class Reduce:
    """A fold step of a block language: ``targets`` (locals of the accumulators' dtypes) take
    ``combine`` (a fold's combine function, ``aten.Reduction.combine``) of themselves and
    ``args``, lane by lane (``across`` False: a loop iteration's block folded into the
    accumulators), or of ``args`` across each row's lanes (``across``: the row's result, kept as a
    column of the block where ``keep``)."""

    targets: tuple[str, ...]
    args: tuple[Value, ...]
    combine: str
    across: bool = False
    keep: bool = True


@dataclass(eq=False)
class Loop:
    """``for var in range(start, stop, step)``: bounds are index expressions (over the kernel's
    sizes and locals, and a block language's block sizes: ``RBLOCK``)."""

    var: str
    stop: sympy.Expr | int
    start: sympy.Expr | int = 0
    step: sympy.Expr | int = 1

    def __post_init__(self):
        self.stop, self.start, self.step = (sympy.sympify(b) for b in (self.stop, self.start, self.step))


@dataclass(eq=False)
class Nest:
    loops: list[Loop]  # outermost first; none: the body is a block of its own
    body: list["Stmt"]
    # the innermost loop's iterations run side by side in vector lanes: None no, () they are
    # independent, else the reductions they combine into ((operator, accumulator), ...)
    simd: tuple[tuple[str, str], ...] | None = None
    parallel: int = 0  # the outer loops split across threads (collapsed into one iteration space)
    parallel_if: tuple[sympy.Expr, int] | None = None  # split only when expr >= bound (None: always)


@dataclass(eq=False)
class Array:
    name: str
    ctype: str
    dims: tuple[int, ...]
    heap_at: int | None = None  # an offset in the kernel's heap block (None: a local array)


@dataclass(eq=False)
class View:
    """``name``: a row of a local array (``of``: the array indexed by its leading dims), read
    (and, unless ``readonly``, written) through the name as a one-dim array."""

    name: str
    of: Elem
    readonly: bool = False


@dataclass(eq=False)
class Do:
    """``call`` made for its effect."""

    call: Call


@dataclass(eq=False)
class Check:
    """The kernel ends with error ``code`` (a code of the language's calling convention) where
    ``cond`` holds, leaving ``value`` (an int64 value) for the error's message."""

    cond: Value
    code: int
    value: Value


@dataclass(eq=False)
class Skip:
    """The rest of the innermost loop's iteration is skipped where ``cond`` holds."""

    cond: Value


Stmt = Union[Index, Load, Store, Let, Set, Reduce, Nest, Array, View, Do, Check, Skip]


def walk(stmts: list[Stmt]):
    """Every statement, nests' bodies included, in order."""
    for s in stmts:
        yield s
        if isinstance(s, Nest):
            yield from walk(s.body)


def without_dead_indices(stmts: list[Stmt], defs: dict[sympy.Symbol, sympy.Expr]) -> list[Stmt]:
    """``stmts`` without the index locals (of ``defs``: local -> expression) that no offset reads,
    directly or through other locals (coordinates a contiguous access skipped)."""
    live: set[sympy.Symbol] = set()
    stack = [x for s in walk(stmts) if isinstance(s, (Load, Store)) for x in s.offset.free_symbols]
    while stack:
        x = stack.pop()
        if x not in live:
            live.add(x)
            stack.extend(sympy.sympify(defs.get(x, sympy.Integer(0))).free_symbols)
    dead = {x.name for x in defs if x not in live}

    def keep(body: list[Stmt]) -> list[Stmt]:
        out = []
        for s in body:
            if isinstance(s, Index) and s.name in dead:
                continue
            if isinstance(s, Nest):
                s = Nest(s.loops, keep(s.body), s.simd, s.parallel, s.parallel_if)
            out.append(s)
        return out

    return keep(stmts)


# --------------------------------------------------------------------------- the launch function


@dataclass(frozen=True)
class SizeRead:
    """A size parameter read off a launch argument when the kernel is launched:
    ``name = arg.size(dim)`` (or ``.stride(dim)``)."""

    name: str
    arg: str
    attr: str  # "size" or "stride"
    dim: int

    def source(self) -> str:
        return f"{self.arg}.{self.attr}({self.dim})"


@dataclass(frozen=True)
class EmptyCheck:
    """Rows of a symbolic length that may be empty where the fold has no identity (min, max, the
    arg folds): the launch raises eager's error when ``rows`` is not positive."""

    rows: sympy.Expr
    kind: str


Prologue = Union[SizeRead, EmptyCheck]


def prologue_lines(items: list[Prologue], printer) -> list[str]:
    """The launch function's first lines (Python, whatever the kernel's language), ``printer``
    printing size expressions: each size read, each check."""
    out = []
    for p in items:
        if isinstance(p, SizeRead):
            out.append(f"{p.name} = {p.source()}")
        else:
            out += [f"if {printer(p.rows)} <= 0:", f"    raise IndexError('{p.kind}(): cannot reduce over an empty dimension')"]
    return out
