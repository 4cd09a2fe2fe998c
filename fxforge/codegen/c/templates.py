"""Hand-written C kernels for composite ops the emitter cannot write in one pass (``TEMPLATES``).

The emitter's kernels have one frame: rows folded over their last dims, or columns folded over
their leading dims.  Layer norm's gradient needs both at once: each row's two sums give the
input's gradient, and the weight's and bias's gradients are sums down the columns.  ATen's CPU
kernel for it is slow at the sizes of small models (a 128 x 64 norm took 19.6 us, 8 calls a
mixer step), and two emitted kernels (a row kernel and a column kernel) read the inputs twice.
The template reads each row once for the row sums and once more for the input's gradient, adding
each element's share of the column sums to per-column accumulators in that same loop.

A template kernel runs its node alone (``fusion_cost`` keeps it out of groups); shapes must be
static, and every tensor float32 or float64.  Sums accumulate in double, as the emitter's do.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from ...graph import VAL, free_symbols, tensors
from ..triton.launch import Param
from .kernel import CEmitted
from .ops import CTYPE

aten = torch.ops.aten

# Per-column accumulators live on the C stack (two doubles a column).
LAYER_NORM_MAX_COLUMNS = 8192


def _layout(t: torch.Tensor, layout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape, stride = layout if layout is not None else (t.shape, t.stride())
    return tuple(int(s) for s in shape), tuple(int(s) for s in stride)


def _flat_stride(shape: tuple[int, ...], stride: tuple[int, ...]) -> int | None:
    """The one stride that walks dims ``shape`` in row-major order, or None (they do not merge)."""
    dims = [(s, st) for s, st in zip(shape, stride) if s != 1]
    if not dims:
        return 1
    for (s0, st0), (s1, st1) in zip(dims, dims[1:]):
        if st0 != st1 * s1:
            return None
    return dims[-1][1]


def layer_norm_backward_refusal(node: fx.Node) -> str | None:
    grad, x, shape, mean, rstd, weight, bias, mask = (list(node.args) + [None] * 8)[:8]
    val = node.meta.get(VAL)
    if not isinstance(val, (list, tuple)) or len(val) != 3 or not any(isinstance(v, torch.Tensor) for v in val):
        return "layer norm backward computing no tensor"
    ins = [a for a in (grad, x, mean, rstd, weight) if isinstance(a, fx.Node)]
    every = tensors(val) + [a.meta.get(VAL) for a in ins]
    if not all(isinstance(t, torch.Tensor) for t in every):
        return "an input without a traced tensor value"
    dtypes = {t.dtype for t in every}
    if len(dtypes) != 1 or dtypes.pop() not in (torch.float32, torch.float64):
        return "layer norm backward template: float32 or float64 tensors of one dtype only"
    if any(free_symbols(t) for t in every):
        return "layer norm backward template: symbolic sizes run as ATen's kernel"
    if any(t.device.type != "cpu" for t in every):
        return "not a CPU tensor"
    xv = x.meta[VAL]
    n = math.prod(int(s) for s in shape)
    if xv.dim() <= len(shape) or n == 0 or xv.numel() == 0:
        return "layer norm backward template: no rows to normalize"
    if n > LAYER_NORM_MAX_COLUMNS:
        return f"layer norm backward template: over {LAYER_NORM_MAX_COLUMNS} normalized elements"
    lead = xv.dim() - len(shape)
    for a in (grad, x):
        t = a.meta[VAL]
        if _flat_stride(tuple(t.shape[lead:]), tuple(t.stride()[lead:])) is None:
            return f"layer norm backward template: {a.name}'s normalized dims are not one strided run"
    return None


def _offset(coords: list[str], stride: tuple[int, ...]) -> str:
    terms = [f"{st}*{c}" for c, st in zip(coords, stride) if st != 0]
    return " + ".join(terms) or "0"


def layer_norm_backward(name: str, node: fx.Node, ref, buffer, layout) -> CEmitted:
    """``native_layer_norm_backward(dy, x, shape, mean, rstd, w, b, mask)``: dx, dw, db.

    Per row (mean ``mu``, ``rs`` = rstd, g = dy * w over the row's n elements, as ATen):
    ``ds = sum(g * x)``, ``db = sum(g)``, ``b = (db * mu - ds) * rs^3 / n``, ``c = -b * mu - db * rs / n``,
    ``dx = rs * g + b * x + c``; ``dw += dy * (x - mu) * rs`` and ``dbias += dy`` per column."""
    grad, x, shape, mean, rstd, weight = node.args[:6]
    val = node.meta[VAL]
    xv = x.meta[VAL]
    ct = CTYPE[xv.dtype]
    lead = xv.dim() - len(shape)
    n = math.prod(int(s) for s in shape)
    lead_shape = tuple(int(s) for s in xv.shape[:lead])

    params: list[Param] = []
    args: list[str] = []
    ptr: dict[str, str] = {}

    def tensor(key: str, var: str, role: str, t: torch.Tensor, lay) -> tuple[tuple[int, ...], tuple[int, ...]]:
        pname = f"{role}_ptr{sum(1 for p in params if p.name.startswith(role))}"
        params.append(Param(pname, "*" + ct, var))
        args.append(var)
        ptr[key] = pname
        return _layout(t, lay)

    def lay(a: fx.Node, i: int | None):
        return layout(a, i) if layout is not None else None

    outs = {}
    for i, key in enumerate(("dx", "dw", "db")):
        if isinstance(val[i], torch.Tensor):
            outs[key] = tensor(key, buffer(node, i), "out", val[i], lay(node, i))
    ins = {"dy": grad, "x": x, "mean": mean, "rstd": rstd}
    if isinstance(weight, fx.Node):
        ins["w"] = weight
    strides = dict(outs)
    for key, a in ins.items():
        strides[key] = tensor(key, ref(a), "in", a.meta[VAL], lay(a, None))

    coords = [f"i{d}" for d in range(lead)]
    row_stride = {}  # key -> offset of the row's first element (C expression)
    col_stride = {}  # key -> stride along the normalized elements
    for key in ("dy", "x", "dx"):
        if key not in strides:
            continue
        sh, st = strides[key]
        row_stride[key] = _offset(coords, st[:lead])
        cs = _flat_stride(sh[lead:], st[lead:])
        if cs is None:
            raise NotImplementedError(f"{key}: normalized dims that do not merge")
        col_stride[key] = cs
    stat = {k: _offset(coords, strides[k][1][:lead]) for k in ("mean", "rstd")}
    for key in ("w", "dw", "db"):
        if key in strides:
            cs = _flat_stride(*strides[key])
            if cs is None:
                raise NotImplementedError(f"{key}: dims that do not merge")
            col_stride[key] = cs

    def at(key: str, j: str = "j") -> str:
        base = row_stride.get(key)
        off = f"{col_stride[key]}*{j}"
        return f"{ptr[key]}[{base} + {off}]" if base else f"{ptr[key]}[{off}]"

    g = f"({at('dy')} * {at('w')})" if "w" in ptr else at("dy")
    lines = []
    if "dw" in ptr or "db" in ptr:
        lines += [f"double acc_dw[{n}];", f"double acc_db[{n}];",
                  f"for (int64_t j = 0; j < {n}; j++) {{ acc_dw[j] = 0; acc_db[j] = 0; }}"]
    for d, s in enumerate(lead_shape):
        lines.append(f"for (int64_t i{d} = 0; i{d} < {s}; i{d}++)")
    body = [f"const {ct} mu = {ptr['mean']}[{stat['mean']}];", f"const {ct} rs = {ptr['rstd']}[{stat['rstd']}];"]
    if "dx" in ptr:
        body += ["double ds = 0, db = 0;", "#pragma omp simd reduction(+:ds) reduction(+:db)",
                 f"for (int64_t j = 0; j < {n}; j++)", "{",
                 f"    const {ct} g = {g};",
                 f"    ds += (double)(g * {at('x')});",
                 "    db += (double)g;", "}",
                 f"const {ct} b = ({ct})((db * (double)mu - ds) * (double)rs * (double)rs * (double)rs / {n}.0);",
                 f"const {ct} c = ({ct})(-(double)b * (double)mu - db * (double)rs / {n}.0);"]
    body += [f"for (int64_t j = 0; j < {n}; j++)", "{"]
    if "dx" in ptr:
        body += [f"    {at('dx')} = rs * {g} + b * {at('x')} + c;"]
    if "dw" in ptr:
        body += [f"    acc_dw[j] += (double)({at('dy')} * (({at('x')} - mu) * rs));"]
    if "db" in ptr:
        body += [f"    acc_db[j] += (double){at('dy')};"]
    body += ["}"]
    lines += ["{"] + ["    " + l for l in body] + ["}"]
    for key, acc in (("dw", "acc_dw"), ("db", "acc_db")):
        if key in ptr:
            lines.append(f"for (int64_t j = 0; j < {n}; j++) {ptr[key]}[{col_stride[key]}*j] = ({ct}){acc}[j];")

    sig = [f"{'const ' if p.name.startswith('in') else ''}{p.sig[1:]}* {p.name}" for p in params]
    c_lines = [f"void {name}({', '.join(sig)})", "{"] + ["    " + l for l in lines] + ["}"]
    call = ", ".join(f"{p.launch}.data_ptr()" for p in params)
    launch = [f"# C kernel {name}_c (template: layer norm backward, fxforge/codegen/c/templates.py)"]
    launch += ["# " + l for l in c_lines]
    launch += [f"def {name}({', '.join(args)}):", f"    {name}_c({call})"]
    return CEmitted("\n".join(c_lines) + "\n", "\n".join(launch) + "\n", name, args, params, 1, len(set(args)))


# op -> (why it cannot run as the template, or None; the emitter)
TEMPLATES = {
    aten.native_layer_norm_backward.default: (layer_norm_backward_refusal, layer_norm_backward),
}


def template_of(node: fx.Node):
    return TEMPLATES.get(node.target) if node.op == "call_function" else None
