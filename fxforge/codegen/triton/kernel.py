"""Emitting one Triton kernel (module source + launch function) for a group of ATen nodes.

Shapes of the kernels:

* pointwise: one flat index ``xindex`` over the output's elements (row-major over its shape),
  decomposed into coordinates; each tensor is read or written at ``sum(coord * stride)`` with
  its own strides (broadcast dims have none), so strided, sliced and offset views (their data
  pointer carries the offset) are read and written in place.
* reduction: rows ``xindex`` over the kept dims, ``rindex`` over the reduced dims; *persistent*
  (a whole row in one ``[XBLOCK, RBLOCK]`` block) when the row is static and small, else
  *looped* (``for roffset in range(0, rnumel, RBLOCK)`` with a block-shaped accumulator).

Sizes and strides that are symbolic become kernel arguments (``ks0``...) read off the tensors
at launch; static ones are baked in.  Indices are int64 when a tensor's span or the element
count may exceed 2**31 - 1 (always for symbolic sizes).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K, elementwise_dtypes
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ...graph import VAL, aliased_input, expr, node_kind
from ...iteration import numel as _numel, reduction_of, same_size as _same, schema_bind as _schema_bind, shape_of
from ..pyexpr import PyExprPrinter
from .ops import LOW_PRECISION, SIG_DTYPE, TL_DTYPE, V, cast, compute_dtype, const, lowering_of, round_to
from .printer import TritonPrinter

INT32_MAX = 2**31 - 1
# Rows of at most this many elements (static) reduce in one block; longer or symbolic rows loop.
PERSISTENT_RBLOCK_MAX = 1024
LOOP_RBLOCK = 1024
POINTWISE_XBLOCK = 1024

PRELUDE = '''import triton
import triton.language as tl
from triton.language.extra import libdevice


def _remainder(a, b):
    # Python / torch.remainder: the result takes the divisor's sign (Triton's % is C fmod)
    r = a % b
    return tl.where(r == 0, r, tl.where((r < 0) != (b < 0), r + b, r))


def _div_floor_f(a, b):
    # torch's div_floor_floating: floor of the exact quotient, computed from fmod
    mod = a % b
    div = (a - mod) / b
    div = tl.where(mod == 0, div, tl.where((b < 0) != (mod < 0), div - 1.0, div))
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    fl = tl.where(div == 0, 0.0 * (a / b), fl)
    return tl.where(b == 0, a / b, fl)


def _max_nan(a, b):
    # NaN wins (eager propagates it); no `|` of scalars (the interpreter rejects it)
    return tl.where(a != a, a, tl.where(a > b, a, b))


def _min_nan(a, b):
    return tl.where(a != a, a, tl.where(a < b, a, b))


def _sum_combine(a, b):
    return a + b


def _prod_combine(a, b):
    return a * b


def _argmax_combine(v1, i1, v2, i2):
    # NaN is the largest value; ties go to the first index (eager's argmax)
    n1 = v1 != v1
    n2 = v2 != v2
    pick = tl.where(n1, tl.where(n2, i1 < i2, True),
                    tl.where(n2, False, tl.where(v1 > v2, True, tl.where(v1 == v2, i1 < i2, False))))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)


def _argmin_combine(v1, i1, v2, i2):
    n1 = v1 != v1
    n2 = v2 != v2
    pick = tl.where(n1, tl.where(n2, i1 < i2, True),
                    tl.where(n2, False, tl.where(v1 < v2, True, tl.where(v1 == v2, i1 < i2, False))))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)
'''

# Math functions outside core `tl`: libdevice on GPU; the interpreter has no libdevice, so
# under TRITON_INTERPRET=1 the same names are defined from core `tl` functions (accurate to a
# few ulp; ops with no formula here are refused under the interpreter, see ops.INTERP_MISSING).
LIBDEVICE_GPU = "\n\n".join(
    f"def _ld_{n}({', '.join(a)}):\n    return libdevice.{n}({', '.join(a)})"
    for n, a in [("tanh", "x"), ("pow", "ab"), ("trunc", "x"), ("expm1", "x"), ("log1p", "x"), ("log10", "x"),
                 ("nearbyint", "x"), ("sinh", "x"), ("cosh", "x"), ("tan", "x"), ("erfc", "x"), ("asin", "x"),
                 ("acos", "x"), ("atan", "x"), ("asinh", "x"), ("acosh", "x"), ("atanh", "x"), ("erfinv", "x"),
                 ("lgamma", "x"), ("atan2", "ab"), ("sqrt", "x")]
) + '''

def _to_bf16(x):
    return x.to(tl.bfloat16)
'''

LIBDEVICE_INTERP = '''def _ld_tanh(x):
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = ax * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    r = tl.where(ax < 0.1, small, big)
    return tl.where(x < 0, -r, r)


def _ld_pow(a, b):
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    bint = tl.floor(b) == b
    odd = tl.where(bint, tl.floor(b * 0.5) != b * 0.5, False)
    r = tl.where(a < 0, tl.where(bint, tl.where(odd, -r, r), float("nan")), r)
    return tl.where((b == 0) | (a == 1), 1.0, r)


def _ld_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


def _ld_expm1(x):
    u = tl.exp(x)
    um1 = u - 1.0
    r = tl.where(u == 1.0, x, tl.where(um1 == -1.0, -1.0, um1 * x / tl.log(u)))
    return tl.where(u == float("inf"), u, r)


def _ld_log1p(x):
    u = 1.0 + x
    r = tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))
    return tl.where(u == float("inf"), u, r)


def _ld_log10(x):
    return tl.log(x) * 0.4342944819032518


def _ld_nearbyint(x):
    f = tl.floor(x)
    d = x - f
    even = tl.floor(f * 0.5) == f * 0.5
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(even, f, f + 1.0)))


def _ld_sinh(x):
    m = _ld_expm1(x)
    small = 0.5 * (m + m / (m + 1.0))  # no cancellation near 0
    return tl.where(tl.abs(x) < 1.0, small, 0.5 * (tl.exp(x) - tl.exp(-x)))


def _ld_cosh(x):
    e = tl.exp(tl.abs(x))
    return 0.5 * (e + 1.0 / e)


def _ld_tan(x):
    return tl.sin(x) / tl.cos(x)


def _ld_erfc(x):
    return 1.0 - tl.math.erf(x)


def _ld_sqrt(x):
    return tl.sqrt_rn(x)


def _to_bf16(x):
    # the interpreter truncates fp32 -> bf16; round to nearest even on the bits, like eager
    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    r = tl.where(x != x, u, r)
    return r.to(tl.float32, bitcast=True).to(tl.bfloat16)
'''

HELPERS = ["_remainder", "_div_floor_f", "_max_nan", "_min_nan", "_sum_combine", "_prod_combine",
           "_argmax_combine", "_argmin_combine"]


def helper_names(mode: str) -> list[str]:
    text = LIBDEVICE_GPU if mode == "gpu" else LIBDEVICE_INTERP
    return HELPERS + [l[4:l.index("(")] for l in text.splitlines() if l.startswith("def ")]


def module_text(kernel_source: str, mode: str) -> str:
    """The cache module for ``mode`` ("gpu": libdevice helpers, "interp": core-tl helpers)."""
    return PRELUDE + "\n\n" + (LIBDEVICE_GPU if mode == "gpu" else LIBDEVICE_INTERP) + "\n\n" + kernel_source


KERNEL_NAME = "kernel"


class Unsupported(Exception):
    """The emitter cannot lower this group (the capability check should have said so)."""


@dataclass
class Param:
    name: str  # kernel parameter
    sig: str  # Triton signature type ("*fp32", "i64", "i1", ...)
    launch: str  # launch-function expression passing it


@dataclass
class Emitted:
    """A generated kernel: the module source, its launch function and what AOT checks need."""

    kernel_source: str  # the kernel function; module_text() adds the helpers
    launch_source: str  # defines ``name(*args)``
    name: str
    args: list[str]  # wrapper variables, in launch-function parameter order
    params: list[Param]
    constexprs: dict[str, int]
    num_warps: int
    kind: str  # "pointwise" | "persistent_reduction" | "looped_reduction"
    node_count: int = 1
    unique_io_buffers: int = 0
    configs: list = None  # launch configurations: the default (``constexprs``, ``num_warps``) first
    n_out: int = 0  # the first n_out parameters are the output pointers


# --------------------------------------------------------------------------- emitter


def _is_int(e: sympy.Expr) -> bool:
    return sympy.sympify(e).is_Integer


def _is_literal(e: str) -> bool:
    if e in ("True", "False") or e.startswith("float(") or e.startswith("tl.full([], "):
        return True
    try:
        float(e)
        return True
    except ValueError:
        return False


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _trailing(shape: tuple, dims: list[int]) -> bool:
    """The reduced dims are the last ones: row i holds the flat elements [i * rnumel, (i+1) * rnumel)."""
    return list(dims) == list(range(len(shape) - len(dims), len(shape)))


def _contiguous(shape: list, stride: list) -> bool:
    """Row-major dense strides (size-1 dims may have any stride)."""
    inner = sympy.Integer(1)
    for s, st in zip(reversed(shape), reversed(stride)):
        if s != 1 and sympy.expand(st - inner) != 0:
            return False
        inner = inner * s
    return True


def tensors(v) -> list[torch.Tensor]:
    """The tensors of a value (a tensor, or a tuple/list with tensors among other things)."""
    return [t for t in (v if isinstance(v, (tuple, list)) else [v]) if isinstance(t, torch.Tensor)]


aten = torch.ops.aten
XINDEX, RINDEX = "xindex", "rindex"
X = sympy.Symbol(XINDEX, integer=True, nonnegative=True)
R = sympy.Symbol(RINDEX, integer=True, nonnegative=True)

# Views that keep the row-major order of their input's elements (same element count): a value the
# kernel computes at flat position i is the view's value at flat position i.
ORDER_KEEPING_VIEWS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default,
    aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
    aten.flatten.using_ints, aten.expand.default,
}


@dataclass
class Frame:
    """A kernel's loop nest.  Pointwise: one flat index ``xindex`` over ``xnumel`` elements.
    Reduction: rows ``xindex`` (``[XBLOCK, 1]``) over the kept dims of ``shape`` (the first
    reduction's input) times ``rindex`` (``[1, RBLOCK]``) over its reduced dims; ``layouts`` maps
    each reduction input shape to its reduced dims.  ``xnumel``/``rnumel`` are over kernel
    parameters, ``xnumel_g``/``rnumel_g`` over the graph's symbols."""

    reduction: bool
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    xnumel_g: sympy.Expr
    rnumel_g: sympy.Expr
    shape: tuple
    layouts: dict

    def indices(self, dom: str) -> tuple[str, ...]:
        return (XINDEX,) if dom == "x" else (XINDEX, RINDEX)

    def mask(self, dom: str) -> str:
        return "xmask" if dom == "x" else "rmask & xmask"

    def block(self, dom: str) -> str:
        if not self.reduction:
            return "[XBLOCK]"
        return "[XBLOCK, 1]" if dom == "x" else "[XBLOCK, RBLOCK]"


class Emitter:
    def __init__(self, name: str, ref, buffer, nodes: list[fx.Node], outputs: list[fx.Node] | None = None,
                 autotune: bool = False):
        self.name = name
        self.autotune = autotune  # the launch asks ``<name>_tuner`` for its configuration
        self.ref, self.buffer = ref, buffer
        self.nodes = [n for n in nodes if node_kind(n) == "compute"]
        self.order = list(nodes)  # members in schedule order (what reaches the source follows it)
        self.members = set(nodes)
        self.outputs = outputs
        self.params: list[Param] = []
        self.args: list[str] = []  # launch-function parameters (wrapper variable names)
        self.arg_index: dict[str, int] = {}
        self.launch_lines: list[str] = []
        self.sym_names: dict[sympy.Symbol, str] = {}  # graph symbol -> ks param symbol
        self.expr_syms: dict[sympy.Expr, sympy.Symbol] = {}
        self.reads: list[tuple[sympy.Expr, str]] = []  # (fake expr, launch-time read)
        self.body: list[str] = []
        self.tensor_params: dict[tuple[str, int | None], str] = {}
        self.int64 = False
        self.scalar_params: dict[fx.Node, str] = {}
        self.storages: set[str] = set()
        self.scopes: list[dict] = [{}]  # the kernel's top level, then the open loop's body
        self.n_locals = 0
        self.deps: dict[str, set[str]] = {}  # index local -> the indices it varies with
        self.flat_of: dict[tuple, tuple] = {}  # coordinates -> (shape, flat index) they decompose
        self.launch_checks: list[str] = []
        self.reductions: list[fx.Node] = []
        self.out_set = set(self.outputs_of())

    # ---------------------------------------------------------------- arguments

    def launch_arg(self, var: str) -> str:
        if var not in self.arg_index:
            self.arg_index[var] = len(self.args)
            self.args.append(var)
        return var

    def tensor(self, var: str, val: torch.Tensor, role: str) -> str:
        key = (var, role)
        if key not in self.tensor_params:
            pname = f"{role}_ptr{sum(1 for k in self.tensor_params if k[1] == role)}"
            if val.dtype not in SIG_DTYPE:
                raise Unsupported(f"dtype {val.dtype}")
            self.params.append(Param(pname, "*" + SIG_DTYPE[val.dtype], self.launch_arg(var)))
            self.tensor_params[key] = pname
            self.storages.add(var)
            self.readable(var, val)
        return self.tensor_params[key]

    def readable(self, var: str, val: torch.Tensor) -> None:
        """Sizes/strides of ``val`` that are plain symbols can be read off ``var`` at launch."""
        for d, (s, st) in enumerate(zip(val.shape, val.stride())):
            self.reads.append((expr(s), f"{var}.size({d})"))
            self.reads.append((expr(st), f"{var}.stride({d})"))

    def size(self, e: Any) -> sympy.Expr:
        """A fake size/stride as an expression over kernel parameter symbols."""
        e = sympy.sympify(expr(e) if not isinstance(e, sympy.Basic) else e)
        if e.is_Integer:
            return e
        for s in e.free_symbols:
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

    def new_param(self, read: str, positive: bool) -> sympy.Symbol:
        name = f"ks{sum(1 for p in self.params if p.name.startswith('ks'))}"
        self.params.append(Param(name, "i64", name))
        self.launch_arg(read.split(".", 1)[0])
        self.launch_lines.append(f"{name} = {read}")
        self.int64 = True  # symbolic sizes: indices may exceed int32 for some sizes
        return sympy.Symbol(name, integer=True, positive=True) if positive else sympy.Symbol(name, integer=True, nonnegative=True)

    def scalar(self, n: fx.Node) -> V:
        if n not in self.scalar_params:
            v = n.meta.get(VAL)
            dt = torch.bool if isinstance(v, (bool, torch.SymBool)) else (
                torch.float32 if isinstance(v, (float, torch.SymFloat)) else torch.int64)
            pname = f"sc{len(self.scalar_params)}"
            sig = {torch.bool: "i1", torch.float32: "fp32", torch.int64: "i64"}[dt]
            self.params.append(Param(pname, sig, self.launch_arg(self.ref(n))))
            self.scalar_params[n] = pname
        return V(self.scalar_params[n], {"i1": torch.bool, "fp32": torch.float32, "i64": torch.int64}[
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
        self.body.append(f"{name} = {TritonPrinter()(e)}")
        self.deps[name] = deps
        return sympy.Symbol(name, integer=True, nonnegative=True)

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
            if s == 1:
                exprs.append(sympy.Integer(0))
            elif d == 0 or all(x == 1 for x in shape[:d]):
                exprs.append(FloorDiv(index, inner) if inner != 1 else index)
            else:
                exprs.append(ModularIndexing(index, inner, s))
            inner = inner * s
        out = [self.local(e) for e in reversed(exprs)]
        self.flat_of[tuple(out)] = (tuple(shape), index)
        return self.remember(key, out)

    def coords_of(self, shape: tuple, dom: str) -> dict[int, sympy.Expr]:
        """Coordinates of the element that a value of (graph) ``shape`` computes in domain ``dom``:
        row values ("x") sit at the flat row index ``xindex``; full values ("xr") at the element
        (xindex, rindex) of a reduction's input layout, or at the flat position of that element
        in the frame's shape (values reshaped from it)."""
        ks = [self.size(s) for s in shape]
        layout = self.frame.layouts.get(shape)
        if dom == "x":
            return dict(enumerate(self.coords(ks, X)))
        if layout is not None:
            kept = [d for d in range(len(shape)) if d not in layout]
            xc = self.coords([ks[d] for d in kept], X)
            rc = self.coords([ks[d] for d in layout], R)
            c = {**dict(zip(kept, xc)), **dict(zip(layout, rc))}
            if _trailing(shape, layout):  # row-major: row xindex holds [xindex * rnumel, ...)
                self.flat_of[tuple(c[d] for d in range(len(shape)))] = (tuple(ks), X * self.frame.rnumel + R)
            return c
        return dict(enumerate(self.coords(ks, self.flat_index())))

    def flat_index(self) -> sympy.Expr:
        """Row-major position, in the frame's shape, of the element (xindex, rindex) computes."""
        found = self.lookup(("flat",))
        if found is None:
            shape = self.frame.shape
            c = self.coords_of(shape, "xr")
            e, inner = sympy.Integer(0), sympy.Integer(1)
            for d in reversed(range(len(shape))):
                e, inner = e + c[d] * inner, inner * self.size(shape[d])
            found = self.remember(("flat",), self.local(e))
        return found

    def offset(self, val: torch.Tensor, coords: dict[int, sympy.Expr], out_rank: int, dom: str,
               base: sympy.Expr = sympy.Integer(0)) -> str:
        """Element offset of ``val`` (right-aligned to ``out_rank`` dims, broadcast dims have no
        stride) at ``coords``, plus ``base``.  The offset varies with every index of ``dom`` (a
        broadcast read still needs a pointer block of the full shape)."""
        e = base
        lead = out_rank - val.ndim
        flat = self.flat_of.get(tuple(coords[d] for d in range(out_rank)) if len(coords) == out_rank else None)
        shape = [self.size(s) for s in val.shape]
        if lead == 0 and flat is not None and list(flat[0]) == shape and _contiguous(shape, [self.size(s) for s in val.stride()]):
            e = e + flat[1]  # a contiguous tensor read at its own flat index
        else:
            for j in range(val.ndim):
                if shape[j] == 1:
                    continue
                c = coords.get(lead + j)
                if c is not None:
                    e = e + c * self.size(val.stride()[j])
        out = TritonPrinter()(e)
        have = self.deps_of(e)
        for ix in self.frame.indices(dom):
            if ix not in have:
                out += f" + 0 * {ix}"
        return out

    def check_int64(self, vals: list[torch.Tensor]) -> None:
        for v in vals:
            span = 1 + sum((expr(s) - 1) * expr(st) for s, st in zip(v.shape, v.stride()))
            numel = sympy.prod([expr(s) for s in v.shape]) if v.ndim else sympy.Integer(1)
            for e in (sympy.sympify(span), sympy.sympify(numel)):
                if not e.is_Integer or int(e) > INT32_MAX // 2:
                    self.int64 = True

    # ---------------------------------------------------------------- values

    def internal(self, a: fx.Node) -> bool:
        """``a``'s value is computed by this kernel (it is never read from memory)."""
        if a in self.members:
            k = node_kind(a)
            return k == "compute" or (k == "view" and self.internal(aliased_input(a)))
        return a.target is operator.getitem and isinstance(a.args[0], fx.Node) and a.args[0] in self.members

    def root(self, a: fx.Node) -> fx.Node:
        """The tensor outside the kernel that a member view of one reads (``a`` itself otherwise)."""
        while a in self.members and node_kind(a) == "view":
            a = aliased_input(a)
        return a

    def dom(self, n: fx.Node) -> str:
        """"x": one value per row; "xr": one per element of the rows (reduction kernels only)."""
        if not self.frame.reduction:
            return "x"
        if n.target is operator.getitem:
            return self.dom(n.args[0])
        if n in self.reductions:
            return "x"
        numel = _numel(shape_of(n.meta[VAL]))
        if _same(numel, self.frame.xnumel_g):
            return "x"
        if _same(numel, self.frame.xnumel_g * self.frame.rnumel_g):
            return "xr"
        raise Unsupported(f"{n.name} has {numel} elements; the kernel runs "
                          f"{self.frame.xnumel_g} rows x {self.frame.rnumel_g}")

    def load(self, a: fx.Node, shape: tuple, dom: str) -> V:
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
        ptr = self.tensor(self.ref(root), rval, "in")
        base = sympy.Integer(0)
        if root is not a:  # a view of it, with the view's own layout
            base = self.size(val.storage_offset()) - self.size(rval.storage_offset())
        off = self.offset(val, self.coords_of(shape, dom), len(shape), dom, base)
        name = self.fresh("tmp")
        self.body.append(f"{name} = tl.load({ptr} + ({off}), mask={self.frame.mask(dom)}, other=0)")
        return self.remember(key, cast(V(name, val.dtype), compute_dtype(val.dtype)))

    def check_rows(self, a: fx.Node, shape: tuple) -> None:
        """A row value ``a`` broadcast into a full value of ``shape`` must give each element its
        own row's value: ``shape`` is a reduction's input and ``a`` has its kept dims, in place."""
        fr = self.frame
        layout = fr.layouts.get(shape)
        if layout is None and _trailing(fr.shape, fr.layouts[fr.shape]):
            # rows are runs of rnumel consecutive elements: the dims of ``shape`` after the first
            # k, whose sizes multiply to rnumel, run within a row
            k = next((k for k in range(len(shape) + 1) if _same(_numel(shape[k:]), fr.rnumel_g)), None)
            layout = None if k is None else list(range(k, len(shape)))
        ashape = shape_of(a.meta[VAL])
        lead = len(shape) - len(ashape)
        if layout is None or lead < 0 or not all(
                _same(ashape[j - lead] if j >= lead else 1, 1 if j in layout else shape[j]) for j in range(len(shape))):
            raise Unsupported(f"{a.name} {list(ashape)} is not one value per row of {list(shape)}")

    def operand(self, a: Any, shape: tuple, dom: str) -> V:
        """Argument ``a`` of a member computing a value of ``shape`` in ``dom``."""
        if not isinstance(a, fx.Node):
            raise Unsupported(f"operand {a!r}")
        if not isinstance(a.meta.get(VAL), torch.Tensor):
            return self.scalar(a)
        if not self.internal(a):
            return self.load(a, shape, dom)
        v = self.value(a)
        have = self.dom(a)
        if have == "x" and dom == "xr":
            self.check_rows(a, shape)
        elif have != dom:
            raise Unsupported(f"{a.name}: a full value read per row")
        return v

    def value(self, n: fx.Node):
        """The value of member ``n`` (a ``V``; a list for a multi-output reduction)."""
        found = self.lookup(("v", n))
        if found is not None:
            return found
        if n.target is operator.getitem:
            return self.value(n.args[0])[n.args[1]]
        if n in self.reductions:
            raise Unsupported(f"{n.name} is read before its reduction ran")
        if node_kind(n) == "view":
            base = aliased_input(n)
            v = self.value(base)
            numel, bnumel = _numel(shape_of(n.meta[VAL])), _numel(shape_of(base.meta[VAL]))
            if n.target in ORDER_KEEPING_VIEWS and _same(numel, bnumel):
                return self.remember(("v", n), v)
            if n.target == aten.expand.default and self.dom(base) == "x" and self.dom(n) == "xr":
                self.check_rows(base, shape_of(n.meta[VAL]))
                return self.remember(("v", n), v)
            raise Unsupported(f"{n.target} of a value computed in the kernel")
        shape, dom = shape_of(n.meta[VAL]), self.dom(n)
        v = self.lower_node(n, lambda a: self.operand(a, shape, dom))
        dt = n.meta[VAL].dtype
        # the value has the node's dtype from here on (rounded like eager between ops): a
        # conversion (float -> int truncates, int64 -> int32 wraps, -> bool tests != 0, fp64 ->
        # fp32 rounds) takes effect for the members reading it, not only at a store
        v = cast(v, dt)
        if dt in LOW_PRECISION:
            v = cast(v, compute_dtype(dt))
        if not _is_literal(v.expr):
            name = f"v_{n.name}"
            self.body.append(f"{name} = {v.expr}")
            v = V(name, v.dtype)
        return self.remember(("v", n), v)

    def block(self, v: V, dom: str) -> str:
        """``v`` as a block of the domain's shape (literals become ``tl.full``)."""
        shape = self.frame.block(dom)
        if _is_literal(v.expr):
            lit = v.expr
            if lit.startswith("tl.full([], "):  # tl.full([], c, dtype): take c
                lit = lit[len("tl.full([], "):].rsplit(",", 1)[0]
            return f"tl.full({shape}, {lit}, {TL_DTYPE[v.dtype]})"
        return f"tl.broadcast_to({v.expr}, {shape})"

    def store(self, n: fx.Node, index: int | None, val: torch.Tensor, v: V, dom: str) -> None:
        ptr = self.tensor_params[(self.buffer(n, index), "out")]
        shape = shape_of(val)
        off = self.offset(val, self.coords_of(shape, dom), len(shape), dom)
        self.body.append(f"tl.store({ptr} + ({off}), {self.block(cast(v, val.dtype), dom)}, mask={self.frame.mask(dom)})")

    def lower_node(self, n: fx.Node, operand) -> V:
        b0 = _schema_bind(n)
        opname = n.target.name().split("::", 1)[1]
        if opname in ("full", "full_like", "scalar_tensor", "fill.Scalar", "zeros_like", "ones_like"):
            out_dt = n.meta[VAL].dtype
            value = {"zeros_like": 0, "ones_like": 1}.get(opname, b0.get("fill_value", b0.get("value", b0.get("s"))))
            cdt = compute_dtype(out_dt)
            if isinstance(value, fx.Node):
                return cast(self.scalar(value), cdt)
            if not isinstance(value, (bool, int, float)):
                raise Unsupported(f"fill value {value!r}")
            return const(value, cdt)
        low = lowering_of(n.target)
        if low is None:
            raise Unsupported(f"no Triton lowering for {n.target}")
        b = _schema_bind(n)
        out_dt = n.meta[VAL].dtype
        raw = [b.get(a) for a in low.operands]
        if low.promotion is None:  # conversions: one operand, converted by value() (to the node dtype)
            x = operand(raw[0])
            return V(x.expr, x.dtype)
        fake_args = []
        for name, a in zip(low.operands, raw):
            if name == "condition":
                continue
            if isinstance(a, fx.Node):
                fake_args.append(a.meta[VAL])
            elif a is not None:
                fake_args.append(a)
        cdt, rdt = elementwise_dtypes(*fake_args, type_promotion_kind=low.promotion)
        if low.promotion == K.ALWAYS_BOOL:
            # comparisons compute in the common dtype (bool results)
            _, common = elementwise_dtypes(*fake_args, type_promotion_kind=K.DEFAULT)
            cdt, rdt = compute_dtype(common), common
        cdt = compute_dtype(cdt)
        if low.dtypes == "float" and not cdt.is_floating_point:
            raise Unsupported(f"{opname} on {cdt}")
        if low.dtypes == "int" and cdt.is_floating_point:
            raise Unsupported(f"{opname} on {cdt}")
        if n.target.name().startswith("aten::pow") and not isinstance(raw[1], fx.Node):
            x = cast(operand(raw[0]), cdt)
            e = raw[1]
            if float(e) == 2.0:
                return V(f"({x.expr} * {x.expr})", cdt)
            if float(e) == 0.5 and cdt.is_floating_point:
                return V(f"tl.sqrt_rn({x.expr})" if cdt == torch.float32 else f"_ld_sqrt({x.expr})", cdt)
            if not cdt.is_floating_point:
                raise Unsupported("integer pow")
            return V(f"_ld_pow({x.expr}, {const(e, cdt).expr})", cdt)
        ops = []
        for name, a in zip(low.operands, raw):
            if a is None:
                ops.append(None)
            elif name == "condition":
                ops.append(cast(operand(a), torch.bool) if isinstance(a, fx.Node) else const(a, torch.bool))
            elif isinstance(a, fx.Node):
                ops.append(cast(operand(a), cdt))
            else:
                if low.round_scalars and rdt in LOW_PRECISION:
                    a = round_to(a, rdt)
                ops.append(const(a, cdt))
        kw = {k: v for k, v in b.items() if k not in low.operands}
        if any(isinstance(v, fx.Node) for v in kw.values()):
            raise Unsupported("a runtime value in a non-operand argument")
        return low.fn(*ops, kw)

    # ---------------------------------------------------------------- kernels

    def outputs_of(self) -> list[fx.Node]:
        if self.outputs:
            return [n for n in self.outputs if n in set(self.nodes)]
        return list(self.nodes)

    def emit(self) -> Emitted:
        """The group's kernel: one program per ``XBLOCK`` rows.  Members are lowered in schedule
        order; in a looped reduction the full values are recomputed inside each loop that needs
        them (each reduction's loop, then one loop storing the full outputs)."""
        self.reductions = [n for n in self.nodes if reduction_of(n) is not None]
        for n in self.nodes:
            if n not in self.reductions and not isinstance(n.meta.get(VAL), torch.Tensor):
                raise Unsupported("multi-output pointwise node")
        outs = self.outputs_of()
        for n in outs:
            val = n.meta[VAL]
            for i, t in enumerate(val if isinstance(val, (tuple, list)) else [val]):
                self.tensor(self.buffer(n, i if isinstance(val, (tuple, list)) else None), t, "out")
        ins = []
        for n in self.order:
            for a in n.all_input_nodes:
                if a not in self.members and not self.internal(a) and isinstance(a.meta.get(VAL), torch.Tensor):
                    ins.append(a.meta[VAL])
                    self.readable(self.ref(a), a.meta[VAL])
        self.frame = self.frame_of()
        fr = self.frame
        self.check_int64([t for n in self.members for t in tensors(n.meta.get(VAL))] + ins)
        persistent = fr.reduction and _is_int(fr.rnumel) and int(fr.rnumel) <= PERSISTENT_RBLOCK_MAX
        if fr.reduction:  # the rows' coordinates, once at the top level
            ks = [self.size(s) for s in fr.shape]
            self.coords([ks[d] for d in range(len(ks)) if d not in fr.layouts[fr.shape]], X)
        if fr.reduction and persistent:
            self.body.append("rindex = tl.arange(0, RBLOCK)[None, :]")
            self.body.append(f"rmask = rindex < {TritonPrinter()(fr.rnumel)}")
        for n in self.nodes:
            if n in self.reductions:
                self.reduce(n, persistent)
            elif persistent or self.dom(n) == "x":
                self.value(n)
        full = [n for n in outs if n not in self.reductions and self.dom(n) == "xr"]
        for n in outs:
            if n not in self.reductions and n not in full:
                self.store(n, None, n.meta[VAL], self.value(n), "x")
        if full:
            def store_full():
                for n in full:
                    self.store(n, None, n.meta[VAL], self.value(n), "xr")
            store_full() if persistent else self.loop(store_full)
        return self.launch(persistent)

    def frame_of(self) -> "Frame":
        if not self.reductions:
            shapes = [shape_of(n.meta[VAL]) for n in self.order if isinstance(n.meta.get(VAL), torch.Tensor)]
            numel = _numel(shapes[0])
            if any(not _same(_numel(s), numel) for s in shapes):
                raise Unsupported("pointwise group with different element counts")
            return Frame(False, self.size_expr(numel), sympy.Integer(1), numel, sympy.Integer(1), shapes[0], {})
        def layout(n):  # input shape, reduced dims (size-1 dims count as kept: one coordinate, 0)
            r = reduction_of(n)
            s = shape_of(r.inp.meta[VAL])
            return s, [d for d in r.dims if s[d] != 1]

        shape, dims = layout(self.reductions[0])
        layouts = {shape: dims}
        xg = _numel([s for d, s in enumerate(shape) if d not in dims])
        rg = _numel([s for d, s in enumerate(shape) if d in dims])
        for n in self.reductions[1:]:
            s, ds = layout(n)
            same_rows = _same(_numel([x for d, x in enumerate(s) if d in ds]), rg) and _same(_numel(s), xg * rg)
            if layouts.get(s, ds) != ds or not (s in layouts or (same_rows and _trailing(s, ds) and _trailing(shape, dims))):
                raise Unsupported(f"reductions over different rows: {list(shape)} dims {dims} and {list(s)} dims {ds}")
            layouts[s] = ds
        return Frame(True, self.size_expr(xg), self.size_expr(rg), xg, rg, shape, layouts)

    def size_expr(self, e) -> sympy.Expr:
        e = sympy.sympify(e)
        return e if e.is_Integer else sympy.sympify(e).xreplace({s: self.size(s) for s in e.free_symbols})

    def loop(self, body) -> None:
        """Emit ``body()`` inside ``for roffset in range(0, rnumel, RBLOCK)``, in its own scope."""
        rn = TritonPrinter()(self.frame.rnumel)
        self.body.append(f"for roffset in range(0, {rn}, RBLOCK):")
        start = len(self.body)
        self.body.append("rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
        self.body.append(f"rmask = rindex < {rn}")
        self.scopes.append({})
        body()
        self.scopes.pop()
        self.body[start:] = ["    " + l for l in self.body[start:]]

    def reduce(self, n: fx.Node, persistent: bool) -> None:
        """Emit reduction ``n`` (at the kernel's top level): its row results, stored if it is an
        output, and remembered for the members after it."""
        r = reduction_of(n)
        val = n.meta[VAL]
        multi = isinstance(val, (tuple, list))
        out_vals = list(val) if multi else [val]
        kind = r.kind
        in_dt = r.inp.meta[VAL].dtype
        out_dt = out_vals[0].dtype
        if kind in ("sum", "prod", "mean"):
            acc_dt = torch.float64 if out_dt == torch.float64 else (torch.float32 if out_dt.is_floating_point else torch.int64)
        elif kind in ("var", "var_mean"):
            acc_dt = torch.float64 if in_dt == torch.float64 else torch.float32
        elif kind in ("any", "all"):
            acc_dt = torch.int32
        else:
            acc_dt = compute_dtype(in_dt)
            if acc_dt == torch.bool:
                acc_dt = torch.int32
        tacc = TL_DTYPE[acc_dt]
        if acc_dt.is_floating_point:
            lowest, highest = 'float("-inf")', 'float("inf")'
        else:
            ii = torch.iinfo(acc_dt)
            lowest, highest = str(ii.min), str(ii.max)
        identity = {"sum": "0", "mean": "0", "var": "0", "var_mean": "0", "prod": "1", "amax": lowest, "amin": highest,
                    "argmax": lowest, "argmin": highest, "max_dim": lowest, "min_dim": highest, "any": "0", "all": "1"}[kind]
        combine = {"sum": "_sum_combine", "mean": "_sum_combine", "prod": "_prod_combine", "amax": "_max_nan",
                   "amin": "_min_nan", "any": "_max_nan", "all": "_min_nan"}.get(kind)
        argk = {"argmax": "_argmax_combine", "max_dim": "_argmax_combine", "argmin": "_argmin_combine",
                "min_dim": "_argmin_combine"}.get(kind)
        inp_shape = shape_of(r.inp.meta[VAL])
        rn = TritonPrinter()(self.frame.rnumel)
        body = self.body
        acc, accv, acci, mean, m2 = (self.fresh(p) for p in ("acc", "accv", "acci", "mean", "m2"))

        def block() -> str:
            """The [XBLOCK, RBLOCK] block of the input, as the accumulator's type, masked to the identity."""
            x = self.operand(r.inp, inp_shape, "xr")
            x = V(self.block(x, "xr"), x.dtype) if _is_literal(x.expr) else x
            v = f"({x.expr} != 0).to(tl.int32)" if kind in ("any", "all") else cast(x, acc_dt).expr
            name = self.fresh("rv")
            body.append(f"{name} = tl.where(rmask & xmask, {v}, {identity})")
            return name

        def ridx() -> str:
            body.append("ridx = tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)")
            return "ridx"

        def m2_block(v: str) -> str:
            d = self.fresh("d")
            body.append(f"{d} = tl.where(rmask & xmask, {v} - {mean}, 0.0)")
            return f"{d} * {d}"

        if persistent:
            v = block()
            if combine:
                body.append(f"{acc} = tl.reduce({v}, 1, {combine})[:, None]")
            elif argk:
                body.append(f"{accv}, {acci} = tl.reduce(({v}, {ridx()}), 1, {argk})")
                body.append(f"{accv} = {accv}[:, None]")
                body.append(f"{acci} = {acci}[:, None]")
            else:  # var / var_mean: two passes over the block in registers
                body.append(f"{mean} = (tl.reduce({v}, 1, _sum_combine) / {rn})[:, None]")
                body.append(f"{m2} = tl.reduce({m2_block(v)}, 1, _sum_combine)[:, None]")
        else:
            if combine:
                body.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {identity}, {tacc})")
                self.loop(lambda: body.append(f"{acc} = {combine}({acc}, {block()})"))
                body.append(f"{acc} = tl.reduce({acc}, 1, {combine})[:, None]")
            elif argk:
                body.append(f"{accv} = tl.full([XBLOCK, RBLOCK], {identity}, {tacc})")
                body.append(f"{acci} = tl.full([XBLOCK, RBLOCK], {INT32_MAX}, tl.int64)")
                self.loop(lambda: body.append(f"{accv}, {acci} = {argk}({accv}, {acci}, {block()}, {ridx()})"))
                body.append(f"{accv}, {acci} = tl.reduce(({accv}, {acci}), 1, {argk})")
                body.append(f"{accv} = {accv}[:, None]")
                body.append(f"{acci} = {acci}[:, None]")
            else:
                body.append(f"{acc} = tl.full([XBLOCK, RBLOCK], 0, {tacc})")
                self.loop(lambda: body.append(f"{acc} = {acc} + {block()}"))
                body.append(f"{mean} = (tl.reduce({acc}, 1, _sum_combine) / {rn})[:, None]")
                body.append(f"{m2} = tl.full([XBLOCK, RBLOCK], 0, {tacc})")
                self.loop(lambda: body.append(f"{m2} = {m2} + {m2_block(block())}"))
                body.append(f"{m2} = tl.reduce({m2}, 1, _sum_combine)[:, None]")
        if kind in ("sum", "prod", "amax", "amin"):
            results = [V(acc, acc_dt)]
        elif kind == "mean":
            results = [V(f"({acc} / {rn})", acc_dt)]
        elif kind in ("any", "all"):
            results = [V(f"({acc} != 0)", torch.bool)]
        elif kind in ("argmax", "argmin"):
            results = [V(acci, torch.int64)]
        elif kind in ("max_dim", "min_dim"):
            results = [V(accv, acc_dt), V(acci, torch.int64)]
        else:
            if _is_int(self.frame.rnumel):
                denom = repr(float(max(int(self.frame.rnumel) - r.correction, 0.0)))
            else:
                denom = f"tl.maximum({rn}.to(tl.float32) - {r.correction!r}, 0.0)"
            var = V(f"({m2} / {denom})", acc_dt)
            results = [var] if kind == "var" else [var, V(mean, acc_dt)]
        if len(results) != len(out_vals):
            raise Unsupported(f"{kind}: {len(out_vals)} outputs")
        rounded = []
        for i, (ov, res) in enumerate(zip(out_vals, results)):
            res = cast(res, ov.dtype)
            if not res.expr.isidentifier():
                name = self.fresh("red")
                body.append(f"{name} = {res.expr}")
                res = V(name, res.dtype)
            if n in self.out_set:
                self.store(n, i if multi else None, ov, res, "x")
            rounded.append(cast(res, compute_dtype(ov.dtype)))
        self.remember(("v", n), rounded if multi else rounded[0])
        if not (_is_int(self.frame.rnumel) and int(self.frame.rnumel) > 0):
            if _is_int(self.frame.rnumel):
                raise Unsupported("empty reduction")
            if kind in ("amax", "amin", "argmax", "argmin", "max_dim", "min_dim"):
                # eager raises; sum/prod/mean/var/any/all of an empty row are the loop's identity
                rp = PyExprPrinter({s: s.name for s in self.all_symbols()})(self.frame.rnumel)
                self.launch_checks += [f"if {rp} <= 0:", f"    raise IndexError('{kind}(): cannot reduce over an empty dimension')"]

    def all_symbols(self):
        return list(self.sym_names.values()) + list(self.expr_syms.values())

    def launch(self, persistent: bool) -> Emitted:
        """Head, launch function and launch configurations (the default first, then the
        alternatives an autotuner may time: block sizes and warps)."""
        fr = self.frame
        py = PyExprPrinter({s: s.name for s in self.all_symbols()})
        launch_pre = [f"xnumel = {py(fr.xnumel)}", "if xnumel <= 0:", "    return"] + self.launch_checks
        i64 = ".to(tl.int64)" if self.int64 else ""
        xn = TritonPrinter()(fr.xnumel)
        xmax = _next_pow2(int(fr.xnumel)) if _is_int(fr.xnumel) else None  # no block beyond the rows
        if not fr.reduction:
            xmax = max(16, xmax) if xmax is not None else None
            pairs = [(min(POINTWISE_XBLOCK, xmax or POINTWISE_XBLOCK), None), (256, 2), (512, 4), (1024, 4), (2048, 8)]
            configs = [{"XBLOCK": x, "num_warps": w or (4 if x >= 512 else 1)} for x, w in pairs if xmax is None or x <= xmax]
            head = [f"xoffset = tl.program_id(0){i64} * XBLOCK", "xindex = xoffset + tl.arange(0, XBLOCK)",
                    f"xmask = xindex < {xn}"]
            kind = "pointwise"
        else:
            if persistent:
                rblock = _next_pow2(int(fr.rnumel))
                xs = [max(1, min(64, PERSISTENT_RBLOCK_MAX // rblock))] + [x for x in (1, 2, 4, 8, 16, 32)
                                                                           if x * rblock <= 8 * PERSISTENT_RBLOCK_MAX]
                pairs = [(x, rblock) for x in xs]
            else:
                pairs = [(1, LOOP_RBLOCK), (1, 2 * LOOP_RBLOCK), (2, LOOP_RBLOCK // 2), (4, LOOP_RBLOCK // 4),
                         (8, LOOP_RBLOCK // 8)]
            configs = [{"XBLOCK": max(1, min(x, xmax or x)), "RBLOCK": r,
                        "num_warps": 8 if r >= 1024 else 4 if r >= 128 else 2} for x, r in pairs if r >= 1]
            head = [f"xoffset = tl.program_id(0){i64} * XBLOCK", "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
                    f"xmask = xindex < {xn}"]
            kind = "persistent_reduction" if persistent else "looped_reduction"
        unique = []
        for c in configs:
            if c not in unique:
                unique.append(c)
        return self.finish(head, launch_pre, unique, kind)

    def used_body(self) -> list[str]:
        """The body without index locals nothing reads (coordinates a contiguous access skipped)."""
        body = list(self.body)
        while True:
            text = "\n".join(body)
            dead = {n for n in self.deps if len(re.findall(rf"\b{n}\b", text)) == 1}
            if not dead:
                return body
            body = [l for l in body if l.strip().split(" = ", 1)[0] not in dead]

    def finish(self, head, launch_pre, configs: list[dict], kind: str) -> Emitted:
        default = configs[0]
        constexprs = {k: v for k, v in default.items() if k != "num_warps"}
        params = [p.name for p in self.params] + [f"{k}: tl.constexpr" for k in constexprs]
        lines = [f"def {KERNEL_NAME}({', '.join(params)}):"]
        lines += ["    " + l for l in head + self.used_body()]
        module = "\n".join(lines) + "\n"
        jit = f"{self.name}_triton"
        launch = [f"def {self.name}({', '.join(self.args)}):"]
        body = list(self.launch_lines) + launch_pre
        args = ", ".join(p.launch for p in self.params)
        # no FMA contraction: eager rounds a*b and + c separately (separate ops / kernels)
        if self.autotune:
            key = ", ".join(["xnumel"] + [p.name for p in self.params if p.name.startswith("ks")])
            body.append(f"{self.name}_tuner(({key},), lambda c, a: {jit}[((xnumel + c['XBLOCK'] - 1) // c['XBLOCK'],)]"
                        f"(*a, **c, enable_fp_fusion=False), ({args},))")
        else:
            x = default["XBLOCK"]
            cfg = ", ".join(f"{k}={v}" for k, v in default.items())
            body.append(f"{jit}[((xnumel + {x - 1}) // {x},)]({args}, {cfg}, enable_fp_fusion=False)")
        launch += ["    " + l for l in body]
        commented = "\n".join("# " + l for l in lines)
        src = f"# Triton kernel {jit} ({kind}; helpers: PRELUDE in fxforge/codegen/triton/kernel.py)\n{commented}\n"
        src += "\n".join(launch) + "\n"
        return Emitted(
            kernel_source=module,
            launch_source=src,
            name=self.name,
            args=self.args,
            params=self.params,
            constexprs=constexprs,
            num_warps=default["num_warps"],
            kind=kind,
            node_count=len(self.nodes),
            unique_io_buffers=len(self.storages),
            configs=configs,
            n_out=sum(1 for p in self.params if p.name.startswith("out_ptr")),
        )
