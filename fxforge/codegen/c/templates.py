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
from .kernel import CEmitted, c_head, launch_source
from .ops import CTYPE

aten = torch.ops.aten

# Per-column accumulators live on the C stack (a double a column for each of dw and db).
LAYER_NORM_MAX_COLUMNS = 8192


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
    """What the template needs besides what every C kernel needs (``backend.accepts`` checked
    that: ATen op, strided CPU tensors of C types, outputs left out only by the mask)."""
    grad, x, shape = node.args[:3]
    every = tensors(node.meta[VAL]) + [t for a in node.all_input_nodes for t in tensors(a.meta.get(VAL))]
    if {t.dtype for t in every} not in ({torch.float32}, {torch.float64}):
        return "layer norm backward template: float32 or float64 tensors of one dtype only"
    if any(free_symbols(t) for t in every):
        return "layer norm backward template: symbolic sizes run as ATen's kernel"
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


def _offset(coords: list[str], stride: tuple[int, ...]) -> str:
    terms = [f"{st}*{c}" for c, st in zip(coords, stride) if st != 0]
    return " + ".join(terms) or "0"


def layer_norm_backward(name: str, node: fx.Node, ref, buffer, layout) -> CEmitted:
    """``native_layer_norm_backward(dy, x, shape, mean, rstd, w, b, mask)``: dx, dw, db.

    Per row (mean ``mu``, ``rs`` = rstd, g = dy * w over the row's n elements, as ATen):
    ``ds = sum(g * x)``, ``db = sum(g)``, ``b = (db * mu - ds) * rs^3 / n``, ``c = -b * mu - db * rs / n``,
    ``dx = rs * g + b * x + c``; ``dw += dy * (x - mu) * rs`` and ``dbias += dy`` per column.
    Tensors are indexed at the plan's layouts (``layout``, ``KernelContext.layout``)."""
    grad, x, shape, mean, rstd, weight = node.args[:6]
    val = node.meta[VAL]
    xv = x.meta[VAL]
    ct = CTYPE[xv.dtype]
    lead = xv.dim() - len(shape)
    n = math.prod(int(s) for s in shape)

    params: list[Param] = []
    ptr: dict[str, str] = {}  # dx, dw, db, dy, x, mean, rstd, w -> the C parameter
    layouts: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def tensor(key: str, var: str, role: str, a: fx.Node, i: int | None, t: torch.Tensor) -> None:
        ptr[key] = f"{role}_ptr{sum(1 for p in params if p.name.startswith(role))}"
        params.append(Param(ptr[key], "*" + ct, var))
        sizes, strides = layout(a, i) if layout is not None else (t.shape, t.stride())
        layouts[key] = tuple(int(s) for s in sizes), tuple(int(s) for s in strides)

    for i, key in enumerate(("dx", "dw", "db")):
        if isinstance(val[i], torch.Tensor):
            tensor(key, buffer(node, i), "out", node, i, val[i])
    ins = {"dy": grad, "x": x, "mean": mean, "rstd": rstd}
    if "dx" in ptr and isinstance(weight, fx.Node):  # only the input's gradient reads the weight
        ins["w"] = weight
    for key, a in ins.items():
        tensor(key, ref(a), "in", a, None, a.meta[VAL])

    coords = [f"i{d}" for d in range(lead)]
    row = {}  # key -> offset of the row's first element (C expression; the row tensors)
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

    def at(key: str) -> str:
        if key in staged:
            return f"row_{key}[j]"
        off = f"{col[key]}*j" if key not in row else f"{row[key]} + {col[key]}*j"
        return f"{ptr[key]}[{off}]"

    g = f"({at('dy')} * {at('w')})" if "w" in ptr else at("dy")
    accs = [(key, f"acc_{key}") for key in ("dw", "db") if key in ptr]
    lines = [f"double {acc}[{n}];" for _, acc in accs]
    if accs:
        lines.append(f"for (int64_t j = 0; j < {n}; j++) {{ {' '.join(f'{acc}[j] = 0;' for _, acc in accs)} }}")
    lines += [f"for (int64_t i{d} = 0; i{d} < {int(s)}; i{d}++)" for d, s in enumerate(xv.shape[:lead])]
    body = [f"const {ct} mu = {ptr['mean']}[{row['mean']}];", f"const {ct} rs = {ptr['rstd']}[{row['rstd']}];"]
    for key in staged:
        body += [f"{ct} row_{key}[{n}];",
                 f"for (int64_t j = 0; j < {n}; j++) row_{key}[j] = {ptr[key]}[{row[key]} + {col[key]}*j];"]
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
        body.append(f"    {at('dx')} = rs * {g} + b * {at('x')} + c;")
    if "dw" in ptr:
        body.append(f"    acc_dw[j] += (double)({at('dy')} * (({at('x')} - mu) * rs));")
    if "db" in ptr:
        body.append(f"    acc_db[j] += (double){at('dy')};")
    body.append("}")
    lines += ["{"] + ["    " + l for l in body] + ["}"]
    lines += [f"for (int64_t j = 0; j < {n}; j++) {at(key)} = ({ct}){acc}[j];" for key, acc in accs]

    c_lines = c_head(name, params) + ["    " + l for l in lines] + ["}"]
    args = list(dict.fromkeys(p.launch for p in params))  # a tensor passed twice is one argument
    head = [f"# C kernel {name}_c (template: layer norm backward, fxforge/codegen/c/templates.py)"]
    launch = launch_source(name, args, params, [], head + ["# " + l for l in c_lines])
    return CEmitted("\n".join(c_lines) + "\n", launch, name, args, params, 1, len(args))


# op -> (why it cannot run as the template, or None; the emitter)
TEMPLATES = {
    aten.native_layer_norm_backward.default: (layer_norm_backward_refusal, layer_norm_backward),
}


def template_of(node: fx.Node):
    return TEMPLATES.get(node.target) if node.op == "call_function" else None
