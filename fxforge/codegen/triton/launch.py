"""The launch side of a Triton kernel: block-size configurations, the kernel's head (which rows a
program runs), and the launch function the generated wrapper calls.

Plain functions over what the emitter (``kernel.py``) decided: the loop nest's sizes, the
kernel's parameters and body.  ``assemble`` returns the ``Emitted`` kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir.lowering import Param

KERNEL_NAME = "kernel"
# Rows of at most this many elements (static) reduce in one block; longer or symbolic rows loop.
PERSISTENT_RBLOCK_MAX = 1024
LOOP_RBLOCK = 1024
POINTWISE_XBLOCK = 1024


@dataclass
class Emitted:
    """A generated kernel: the module source, its launch function and what AOT checks need."""

    kernel_source: str  # the kernel function; prelude.module_text() adds the helpers
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


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def is_persistent(reduction: bool, rnumel: sympy.Expr) -> bool:
    """A reduction whose rows (static, at most PERSISTENT_RBLOCK_MAX) fit one block."""
    return reduction and rnumel.is_Integer and int(rnumel) <= PERSISTENT_RBLOCK_MAX


def configs(reduction: bool, xnumel: sympy.Expr, rnumel: sympy.Expr) -> tuple[str, list[dict]]:
    """The kernel's kind and its launch configurations: the default first, then alternatives an
    autotuner may time (block sizes and warps).  No block is larger than the rows need."""
    xmax = _next_pow2(int(xnumel)) if xnumel.is_Integer else None
    if not reduction:
        xmax = max(16, xmax) if xmax is not None else None
        pairs = [(min(POINTWISE_XBLOCK, xmax or POINTWISE_XBLOCK), None), (256, 2), (512, 4), (1024, 4), (2048, 8)]
        out = [{"XBLOCK": x, "num_warps": w or (4 if x >= 512 else 1)} for x, w in pairs if xmax is None or x <= xmax]
        kind = "pointwise"
    else:
        if is_persistent(reduction, rnumel):
            rblock = _next_pow2(int(rnumel))
            xs = [max(1, min(64, PERSISTENT_RBLOCK_MAX // rblock))] + [
                x for x in (1, 2, 4, 8, 16, 32) if x * rblock <= 8 * PERSISTENT_RBLOCK_MAX]
            pairs = [(x, rblock) for x in xs]
            kind = "persistent_reduction"
        else:
            pairs = [(1, LOOP_RBLOCK), (1, 2 * LOOP_RBLOCK), (2, LOOP_RBLOCK // 2), (4, LOOP_RBLOCK // 4),
                     (8, LOOP_RBLOCK // 8)]
            kind = "looped_reduction"
        out = [{"XBLOCK": max(1, min(x, xmax or x)), "RBLOCK": r, "num_warps": 8 if r >= 1024 else 4 if r >= 128 else 2}
               for x, r in pairs if r >= 1]
    unique = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return kind, unique


def head(reduction: bool, xnumel: str, int64: bool) -> list[str]:
    """The kernel's first lines: this program's rows ``xindex`` (a column for reductions) and their mask."""
    i64 = ".to(tl.int64)" if int64 else ""
    rows = "tl.arange(0, XBLOCK)[:, None]" if reduction else "tl.arange(0, XBLOCK)"
    return [f"xoffset = tl.program_id(0){i64} * XBLOCK", f"xindex = xoffset + {rows}", f"xmask = xindex < {xnumel}"]


def assemble(name: str, params: list[Param], args: list[str], prologue: list[str], lines: list[str],
             configs: list[dict], kind: str, autotune: bool, node_count: int, unique_io_buffers: int) -> Emitted:
    """The kernel module (``lines``: its head and body) and its launch function ``name(*args)``:
    ``prologue`` (size reads, the early return, launch checks), then the launch over
    ``cdiv(xnumel, XBLOCK)`` programs, with ``<name>_tuner`` picking the configuration when
    ``autotune``."""
    default = configs[0]
    constexprs = {k: v for k, v in default.items() if k != "num_warps"}
    sig = [p.name for p in params] + [f"{k}: tl.constexpr" for k in constexprs]
    kernel = [f"def {KERNEL_NAME}({', '.join(sig)}):"] + ["    " + l for l in lines]
    jit = f"{name}_triton"
    body = list(prologue)
    call_args = ", ".join(p.launch for p in params)
    # no FMA contraction: eager rounds a*b and + c separately (separate ops / kernels)
    if autotune:
        key = ", ".join(["xnumel"] + [p.name for p in params if p.name.startswith("ks")])
        body.append(f"{name}_tuner(({key},), lambda c, a: {jit}[((xnumel + c['XBLOCK'] - 1) // c['XBLOCK'],)]"
                    f"(*a, **c, enable_fp_fusion=False), ({call_args},))")
    else:
        x = default["XBLOCK"]
        cfg = ", ".join(f"{k}={v}" for k, v in default.items())
        body.append(f"{jit}[((xnumel + {x - 1}) // {x},)]({call_args}, {cfg}, enable_fp_fusion=False)")
    commented = "\n".join("# " + l for l in kernel)
    src = f"# Triton kernel {jit} ({kind}; helpers: fxforge/codegen/triton/prelude.py)\n{commented}\n"
    src += "\n".join([f"def {name}({', '.join(args)}):"] + ["    " + l for l in body]) + "\n"
    return Emitted(
        kernel_source="\n".join(kernel) + "\n",
        launch_source=src,
        name=name,
        args=args,
        params=params,
        constexprs=constexprs,
        num_warps=default["num_warps"],
        kind=kind,
        node_count=node_count,
        unique_io_buffers=unique_io_buffers,
        configs=configs,
        n_out=sum(1 for p in params if p.name.startswith("out_ptr")),
    )
