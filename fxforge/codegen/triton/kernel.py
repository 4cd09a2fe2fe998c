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

from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K, elementwise_dtypes
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ...graph import VAL, expr, node_kind
from ...iteration import Reduction, reduction_of, schema_bind as _schema_bind
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


class Emitter:
    def __init__(self, name: str, ref, buffer, nodes: list[fx.Node], outputs: list[fx.Node] | None = None):
        self.name = name
        self.ref, self.buffer = ref, buffer
        self.nodes = [n for n in nodes if node_kind(n) == "compute"]
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
            # sizes/strides that are plain symbols can be read off this tensor
            for d, (s, st) in enumerate(zip(val.shape, val.stride())):
                self.reads.append((expr(s), f"{var}.size({d})"))
                self.reads.append((expr(st), f"{var}.stride({d})"))
        return self.tensor_params[key]

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

    # ---------------------------------------------------------------- index math

    def coords(self, shape: list[sympy.Expr], index: str, prefix: str) -> list[sympy.Expr]:
        """Coordinates of flat ``index`` over ``shape`` (row-major), emitted as locals."""
        idx = sympy.Symbol(index, integer=True, nonnegative=True)
        out: list[sympy.Expr] = []
        inner = sympy.Integer(1)
        exprs = []
        for d in reversed(range(len(shape))):
            s = shape[d]
            if s == 1:
                exprs.append(sympy.Integer(0))
            elif d == 0 or all(x == 1 for x in shape[:d]):
                exprs.append(FloorDiv(idx, inner) if inner != 1 else idx)
            else:
                exprs.append(ModularIndexing(idx, inner, s))
            inner = inner * s
        exprs.reverse()
        pr = TritonPrinter()
        for d, e in enumerate(exprs):
            if e.is_Integer or e.is_Symbol:
                out.append(e)
            else:
                v = f"{prefix}{d}"
                self.body.append(f"{v} = {pr(e)}")
                out.append(sympy.Symbol(v, integer=True, nonnegative=True))
        return out

    def offset(self, val: torch.Tensor, coords: dict[int, sympy.Expr], out_rank: int, need=("xindex",)) -> str:
        """Element offset of ``val`` (right-aligned to ``out_rank`` dims) at ``coords``.

        ``need``: index variables the offset's block shape must depend on (a broadcast read
        still needs a pointer block of the full shape)."""
        e = sympy.Integer(0)
        lead = out_rank - val.ndim
        for j in range(val.ndim):
            if expr(val.shape[j]) == 1:
                continue  # broadcast (or trivially indexed) dim
            c = coords.get(lead + j)
            if c is None:
                continue
            e = e + c * self.size(val.stride()[j])
        out = TritonPrinter()(e)
        names = {str(s) for s in e.free_symbols}
        for ix in need:
            if not any(n == ix or n.startswith(ix[0]) and n[1:].isdigit() for n in names):
                out += f" + 0 * {ix}"
        return out

    def check_int64(self, vals: list[torch.Tensor]) -> None:
        for v in vals:
            span = 1 + sum((expr(s) - 1) * expr(st) for s, st in zip(v.shape, v.stride()))
            numel = sympy.prod([expr(s) for s in v.shape]) if v.ndim else sympy.Integer(1)
            for e in (sympy.sympify(span), sympy.sympify(numel)):
                if not e.is_Integer or int(e) > INT32_MAX // 2:
                    self.int64 = True

    # ---------------------------------------------------------------- pointwise values

    def load(self, n: fx.Node, coords: dict[int, sympy.Expr], rank: int, mask: str) -> V:
        val = n.meta[VAL]
        ptr = self.tensor(self.ref(n), val, "in")
        off = self.offset(val, coords, rank)
        v = f"tmp{len(self.body)}"
        self.body.append(f"{v} = tl.load({ptr} + ({off}), mask={mask}, other=0)")
        return cast(V(v, val.dtype), compute_dtype(val.dtype))

    def lower_node(self, n: fx.Node, env: dict[fx.Node, V], operand) -> V:
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
        if low.promotion is None:  # conversions: one operand, converted at the store
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

    def pointwise_operand(self, env, coords, rank, mask):
        def operand(a) -> V:
            if isinstance(a, fx.Node):
                if a in env:
                    return env[a]
                if isinstance(a.meta.get(VAL), torch.Tensor):
                    env[a] = self.load(a, coords, rank, mask)
                else:
                    env[a] = self.scalar(a)
                return env[a]
            raise Unsupported(f"operand {a!r}")

        return operand

    # ---------------------------------------------------------------- kernels

    def emit(self) -> Emitted:
        reds = [n for n in self.nodes if reduction_of(n) is not None]
        if reds:
            if len(self.nodes) != 1:
                raise Unsupported("only single-node reduction groups")
            return self.emit_reduction(self.nodes[0], reduction_of(self.nodes[0]))
        return self.emit_pointwise()

    def outputs_of(self) -> list[fx.Node]:
        if self.outputs:
            return [n for n in self.outputs if n in set(self.nodes)]
        return list(self.nodes)

    def emit_pointwise(self) -> Emitted:
        if any(not isinstance(n.meta.get(VAL), torch.Tensor) for n in self.nodes):
            raise Unsupported("multi-output pointwise node")
        outs = self.outputs_of()
        shape_vals = {tuple(expr(s) for s in n.meta[VAL].shape) for n in self.nodes}
        if len(shape_vals) != 1:
            raise Unsupported("pointwise group with different output shapes")
        out0 = outs[0].meta[VAL]
        rank = out0.ndim
        out_vars = [self.buffer(n, None) for n in outs]
        for n, var in zip(outs, out_vars):
            self.tensor(var, n.meta[VAL], "out")
        for n in self.nodes:
            for a in n.all_input_nodes:
                if isinstance(a.meta.get(VAL), torch.Tensor):
                    self.reads += [(expr(s), f"{self.ref(a)}.size({d})") for d, s in enumerate(a.meta[VAL].shape)]
                    self.reads += [(expr(s), f"{self.ref(a)}.stride({d})") for d, s in enumerate(a.meta[VAL].stride())]
        shape = [self.size(s) for s in out0.shape]
        numel = sympy.prod(shape) if shape else sympy.Integer(1)
        self.check_int64([n.meta[VAL] for n in self.nodes] + [a.meta[VAL] for n in self.nodes for a in n.all_input_nodes if isinstance(a.meta.get(VAL), torch.Tensor)])
        pr = TritonPrinter()
        head = [
            f"xoffset = tl.program_id(0){'.to(tl.int64)' if self.int64 else ''} * XBLOCK",
            "xindex = xoffset + tl.arange(0, XBLOCK)",
            f"xmask = xindex < {pr(numel)}",
        ]
        cs = self.coords(shape, "xindex", "x")
        coords = dict(enumerate(cs))
        env: dict[fx.Node, V] = {}
        operand = self.pointwise_operand(env, coords, rank, "xmask")
        for n in self.nodes:
            v = self.lower_node(n, env, operand)
            dt = n.meta[VAL].dtype
            if dt in LOW_PRECISION and n not in outs:
                v = cast(cast(v, dt), compute_dtype(dt))  # round like eager between nodes
            if _is_literal(v.expr):
                env[n] = v
                continue
            name = f"v_{n.name}"
            self.body.append(f"{name} = {v.expr}")
            env[n] = V(name, v.dtype)
        for n in outs:
            val = n.meta[VAL]
            ptr = self.tensor_params[(self.buffer(n, None), "out")]
            v = cast(env[n], val.dtype)
            if _is_literal(env[n].expr):  # a constant: a block of it in the output dtype
                lit = env[n].expr
                if lit.startswith("tl.full([], "):  # tl.full([], c, dtype): take c
                    lit = lit[len("tl.full([], "):].rsplit(",", 1)[0]
                v = V(f"tl.full([XBLOCK], {lit}, {TL_DTYPE[val.dtype]})", val.dtype)
            self.body.append(
                f"tl.store({ptr} + ({self.offset(val, coords, rank)}), tl.broadcast_to({v.expr}, [XBLOCK]), mask=xmask)"
            )
        xblock = POINTWISE_XBLOCK
        if _is_int(numel):
            xblock = max(16, min(POINTWISE_XBLOCK, _next_pow2(int(numel))))
        py = PyExprPrinter({s: s.name for s in self.all_symbols()})
        launch_pre = [f"xnumel = {py(numel)}", "if xnumel <= 0:", "    return"]
        grid = f"((xnumel + {xblock - 1}) // {xblock},)"
        return self.finish(head, {"XBLOCK": xblock}, launch_pre, grid, num_warps=4 if xblock >= 512 else 1, kind="pointwise")

    def all_symbols(self):
        return list(self.sym_names.values()) + list(self.expr_syms.values())

    def emit_reduction(self, n: fx.Node, r: Reduction) -> Emitted:
        x = r.inp
        xval = x.meta[VAL]
        ndim = xval.ndim
        val = n.meta[VAL]
        multi = isinstance(val, (tuple, list))
        out_vals = list(val) if multi else [val]
        out_vars = [self.buffer(n, i if multi else None) for i in range(len(out_vals))]
        for var, ov in zip(out_vars, out_vals):
            self.tensor(var, ov, "out")
        self.reads += [(expr(s), f"{self.ref(x)}.size({d})") for d, s in enumerate(xval.shape)]
        self.reads += [(expr(s), f"{self.ref(x)}.stride({d})") for d, s in enumerate(xval.stride())]
        in_shape = [self.size(s) for s in xval.shape]
        kept = [d for d in range(ndim) if d not in r.dims]
        xshape = [in_shape[d] for d in kept]
        rshape = [in_shape[d] for d in r.dims]
        xnumel = sympy.prod(xshape) if xshape else sympy.Integer(1)
        rnumel = sympy.prod(rshape) if rshape else sympy.Integer(1)
        self.check_int64([xval] + out_vals)
        pr = TritonPrinter()
        persistent = _is_int(rnumel) and int(rnumel) <= PERSISTENT_RBLOCK_MAX
        if persistent:
            rblock = _next_pow2(int(rnumel))
            xblock = max(1, min(64, PERSISTENT_RBLOCK_MAX // rblock))
        else:
            rblock = LOOP_RBLOCK
            xblock = 1
        if _is_int(xnumel):
            xblock = max(1, min(xblock, _next_pow2(int(xnumel))))
        i64 = ".to(tl.int64)" if self.int64 else ""
        head = [
            f"xoffset = tl.program_id(0){i64} * XBLOCK",
            "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
            f"xmask = xindex < {pr(xnumel)}",
        ]
        body = self.body
        xc = self.coords(xshape, "xindex", "x")
        coords_x = {d: c for d, c in zip(kept, xc)}
        kind = r.kind
        in_dt = xval.dtype
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
        ptr = self.tensor(self.ref(x), xval, "in")

        def load_block(rprefix: str) -> None:
            """Emit loads of one [XBLOCK, RBLOCK] block of the input into ``v``."""
            rc = self.coords(rshape, "rindex", rprefix)
            coords = dict(coords_x)
            coords.update({d: c for d, c in zip(r.dims, rc)})
            off = self.offset(xval, coords, ndim, need=("xindex", "rindex"))
            raw = f"tl.load({ptr} + ({off}), mask=rmask & xmask, other=0)"
            if kind in ("any", "all"):
                v = f"({raw} != 0).to(tl.int32)"
            else:
                v = cast(V(raw, in_dt), acc_dt).expr
            body.append(f"v = tl.where(rmask & xmask, {v}, {identity})")

        combine = {"sum": "_sum_combine", "mean": "_sum_combine", "prod": "_prod_combine", "amax": "_max_nan",
                   "amin": "_min_nan", "any": "_max_nan", "all": "_min_nan"}
        argk = {"argmax": "_argmax_combine", "max_dim": "_argmax_combine", "argmin": "_argmin_combine",
                "min_dim": "_argmin_combine"}
        results: list[str] = []
        rn = pr(rnumel)
        if persistent:
            body.append("rindex = tl.arange(0, RBLOCK)[None, :]")
            body.append(f"rmask = rindex < {rn}")
            load_block("r")
            if kind in combine:
                body.append(f"acc = tl.reduce(v, 1, {combine[kind]})[:, None]")
            elif kind in argk:
                body.append("ridx = tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)")
                body.append(f"accv, acci = tl.reduce((v, ridx), 1, {argk[kind]})")
                body.append("accv = accv[:, None]")
                body.append("acci = acci[:, None]")
            else:  # var / var_mean: two passes over the block in registers
                body.append(f"mean = (tl.reduce(v, 1, _sum_combine) / {rn})[:, None]")
                body.append("d = tl.where(rmask & xmask, v - mean, 0.0)")
                body.append("m2 = tl.reduce(d * d, 1, _sum_combine)[:, None]")
        else:
            if kind in combine:
                body.append(f"acc = tl.full([XBLOCK, RBLOCK], {identity}, {tacc})")
            elif kind in argk:
                body.append(f"accv = tl.full([XBLOCK, RBLOCK], {identity}, {tacc})")
                body.append(f"acci = tl.full([XBLOCK, RBLOCK], {INT32_MAX}, tl.int64)")
            else:
                body.append(f"accs = tl.full([XBLOCK, RBLOCK], 0, {tacc})")
            body.append(f"for roffset in range(0, {rn}, RBLOCK):")
            start = len(body)
            body.append("rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
            body.append(f"rmask = rindex < {rn}")
            load_block("r")
            if kind in combine:
                body.append(f"acc = {combine[kind]}(acc, v)")
            elif kind in argk:
                body.append("ridx = tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)")
                body.append(f"accv, acci = {argk[kind]}(accv, acci, v, ridx)")
            else:
                body.append("accs = accs + v")
            body[start:] = ["    " + l for l in body[start:]]
            if kind in combine:
                body.append(f"acc = tl.reduce(acc, 1, {combine[kind]})[:, None]")
            elif kind in argk:
                body.append(f"accv, acci = tl.reduce((accv, acci), 1, {argk[kind]})")
                body.append("accv = accv[:, None]")
                body.append("acci = acci[:, None]")
            else:
                body.append(f"mean = (tl.reduce(accs, 1, _sum_combine) / {rn})[:, None]")
                body.append(f"accm = tl.full([XBLOCK, RBLOCK], 0, {tacc})")
                body.append(f"for roffset in range(0, {rn}, RBLOCK):")
                start = len(body)
                body.append("rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
                body.append(f"rmask = rindex < {rn}")
                load_block("q")
                body.append("d = tl.where(rmask & xmask, v - mean, 0.0)")
                body.append("accm = accm + d * d")
                body[start:] = ["    " + l for l in body[start:]]
                body.append("m2 = tl.reduce(accm, 1, _sum_combine)[:, None]")
        if kind in ("sum", "prod", "amax", "amin"):
            results = ["acc"]
        elif kind == "mean":
            results = [f"(acc / {rn})"]
        elif kind in ("any", "all"):
            results = ["(acc != 0)"]
        elif kind in ("argmax", "argmin"):
            results = ["acci"]
        elif kind in ("max_dim", "min_dim"):
            results = ["accv", "acci"]
        else:
            corr = r.correction
            if _is_int(rnumel):
                denom = repr(float(max(int(rnumel) - corr, 0.0)))
            else:
                denom = f"tl.maximum({rn}.to(tl.float32) - {corr!r}, 0.0)"
            var = f"(m2 / {denom})"
            results = [var] if kind == "var" else [var, "mean"]
        if len(results) != len(out_vals):
            raise Unsupported(f"{kind}: {len(out_vals)} outputs")
        # output coordinates: kept dims (and size-1 reduced dims when keepdim)
        for var, ov, res in zip(out_vars, out_vals, results):
            optr = self.tensor_params[(var, "out")]
            ocoords = {}
            if r.keepdim:
                ocoords = {d: c for d, c in zip(kept, xc)}
            else:
                ocoords = {i: c for i, c in enumerate(xc)}
            off = self.offset(ov, ocoords, ov.ndim)
            vexpr = f"({res})"
            resv = cast(V(vexpr, torch.int64 if res == "acci" else (torch.bool if kind in ("any", "all") else acc_dt)), ov.dtype)
            body.append(f"tl.store({optr} + ({off}), tl.broadcast_to({resv.expr}, [XBLOCK, 1]), mask=xmask)")
        py = PyExprPrinter({s: s.name for s in self.all_symbols()})
        launch_pre = [f"xnumel = {py(xnumel)}", "if xnumel <= 0:", "    return"]
        if not (_is_int(rnumel) and int(rnumel) > 0):
            if _is_int(rnumel):
                raise Unsupported("empty reduction")
            if kind in ("amax", "amin", "argmax", "argmin", "max_dim", "min_dim"):
                # eager raises; sum/prod/mean/var/any/all of an empty row are the loop's identity
                launch_pre += [f"if {py(rnumel)} <= 0:", f"    raise IndexError('{kind}(): cannot reduce over an empty dimension')"]
        grid = f"((xnumel + {xblock - 1}) // {xblock},)"
        return self.finish(head, {"XBLOCK": xblock, "RBLOCK": rblock}, launch_pre, grid,
                           num_warps=8 if rblock >= 1024 else 4 if rblock >= 128 else 2,
                           kind="persistent_reduction" if persistent else "looped_reduction")

    def finish(self, head, constexprs, launch_pre, grid, num_warps, kind) -> Emitted:
        params = [p.name for p in self.params] + [f"{k}: tl.constexpr" for k in constexprs]
        lines = [f"def {KERNEL_NAME}({', '.join(params)}):"]
        lines += ["    " + l for l in head + self.body]
        module = "\n".join(lines) + "\n"
        jit = f"{self.name}_triton"
        launch = [f"def {self.name}({', '.join(self.args)}):"]
        body = list(self.launch_lines) + launch_pre
        call_args = [p.launch for p in self.params] + [f"{k}={v}" for k, v in constexprs.items()]
        # no FMA contraction: eager rounds a*b and + c separately (separate ops / kernels)
        body.append(f"{jit}[{grid}]({', '.join(call_args)}, num_warps={num_warps}, enable_fp_fusion=False)")
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
            constexprs=dict(constexprs),
            num_warps=num_warps,
            kind=kind,
            node_count=len(self.nodes),
            unique_io_buffers=len(self.storages),
        )
