"""Emitting one Triton kernel (module source + launch function) for a group of ATen nodes.

Shapes of the kernels (the loop nest is ``ir.emitter``'s):

* pointwise: blocks of ``XBLOCK`` flat indices ``xindex`` over the output's elements;
* reduction: ``[XBLOCK, 1]`` rows times ``[1, RBLOCK]`` reduced elements; *persistent* (a whole
  row in one ``[XBLOCK, RBLOCK]`` block) when the row is static and small, else *looped* (``for
  roffset in range(0, rnumel, RBLOCK)`` with a block-shaped accumulator).

Sizes and strides that are symbolic become kernel arguments (``ks0``...) read off the tensors
at launch; static ones are baked in.  Indices are int64 when a tensor's span or the element
count may exceed 2**31 - 1 (always for symbolic sizes).

What it draws on lives beside it: value and index printing (``printer.py``), the helpers every
module starts with (``prelude.py``), launch configurations and the launch function
(``launch.py``).
"""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from ...graph import VAL
from ...iteration import shape_of
from ..ir import aten as ir_aten, values as ir
from ..ir.aten import Reduction
from ..ir.emitter import INT32_MAX, RINDEX, XINDEX, Emitter, Param, Unsupported, node_refusal  # noqa: F401 (the backend's names)
from ..ir.values import Const, Value, Var
from ..pyexpr import PyExprPrinter
from . import launch
from .launch import Emitted
from .ops import COMBINE_FN, SIG_DTYPE, TL_DTYPE
from .prelude import available_helpers
from .printer import TritonPrinter, values


class TritonEmitter(Emitter):
    """``ir.emitter.Emitter`` writing Triton: blocks of rows, masked loads and stores."""

    SIG_DTYPE = SIG_DTYPE

    def __init__(self, *args, autotune: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.values = values(available_helpers())  # what this process's kernel modules define
        self.autotune = autotune  # the launch asks ``<name>_tuner`` for its configuration
        self.local_lines: dict[str, int] = {}  # index local -> the body line defining it
        self.offset_symbols: set[sympy.Symbol] = set()  # what the printed offsets read

    def indices(self, dom: str) -> tuple[str, ...]:
        return (XINDEX,) if dom == "x" else (XINDEX, RINDEX)

    def mask(self, dom: str) -> str:
        return "xmask" if dom == "x" else "rmask & xmask"

    def block_shape(self, dom: str) -> str:
        if not self.frame.reduction:
            return "[XBLOCK]"
        return "[XBLOCK, 1]" if dom == "x" else "[XBLOCK, RBLOCK]"

    def index_line(self, name: str, e: sympy.Expr) -> str:
        self.local_lines[name] = len(self.body)  # (``local`` appends the line next)
        return f"{name} = {TritonPrinter()(e)}"

    def open_persistent(self) -> None:
        self.body.append("rindex = tl.arange(0, RBLOCK)[None, :]")
        self.body.append(f"rmask = rindex < {TritonPrinter()(self.frame.rnumel)}")

    def print_offset(self, e: sympy.Expr, dom: str) -> str:
        """An element offset as source: a block varying with every index of ``dom``."""
        out = TritonPrinter()(e)
        self.offset_symbols |= e.free_symbols
        have = self.deps_of(e)
        for ix in self.indices(dom):
            if ix not in have:
                out += f" + 0 * {ix}"
        return out

    def emit_load(self, name: str, ptr: str, off: sympy.Expr, dom: str, dtype: torch.dtype) -> None:
        self.body.append(f"{name} = tl.load({ptr} + ({self.print_offset(off, dom)}), mask={self.mask(dom)}, other=0)")

    def emit_assign(self, name: str, v: Value) -> Var:
        """Bind ``v`` to the kernel local ``name``."""
        self.body.append(f"{name} = {self.values(v)}")
        return Var(name, v.dtype)

    def block(self, v: Value, dom: str) -> str:
        """``v`` as a block of the domain's shape (constants become ``tl.full``)."""
        shape = self.block_shape(dom)
        if isinstance(v, Const):
            return f"tl.full({shape}, {self.values.literal(v)}, {TL_DTYPE[v.dtype]})"
        return f"tl.broadcast_to({self.values(v)}, {shape})"

    def store(self, n: fx.Node, index: int | None, val: torch.Tensor, v: Value, dom: str) -> None:
        ptr, off = self.store_target(n, index, val, dom)
        self.body.append(f"tl.store({ptr} + ({self.print_offset(off, dom)}), {self.block(ir.cast(v, val.dtype), dom)}, mask={self.mask(dom)})")

    # ---------------------------------------------------------------- kernels

    def persistent(self) -> bool:
        """A reduction whose rows fit one block (no loop over them)."""
        return launch.is_persistent(self.frame.reduction, self.frame.rnumel)

    def loop(self, body, independent: bool = False) -> None:
        """Emit ``body()`` inside ``for roffset in range(0, rnumel, RBLOCK)``, in its own scope
        (each iteration is a block of lanes already, ``independent`` or not)."""
        rn = TritonPrinter()(self.frame.rnumel)
        self.body.append(f"for roffset in range(0, {rn}, RBLOCK):")
        start = len(self.body)
        self.body.append("rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
        self.body.append(f"rmask = rindex < {rn}")
        self.scopes.append({})
        body()
        self.scopes.pop()
        self.body[start:] = ["    " + l for l in self.body[start:]]

    def fold(self, r, low: Reduction, acc_dt: torch.dtype, persistent: bool) -> dict[str, Var]:
        """Emit the fold of each row (one block, or a loop over blocks): the accumulators it
        leaves, ``[XBLOCK, 1]`` each (see ``ir.aten.result``)."""
        body, combine = self.body, COMBINE_FN[low.combine]
        identity, tacc = self.values(ir_aten.identity(low, acc_dt)), TL_DTYPE[acc_dt]
        inp_shape = shape_of(r.inp.meta[VAL])

        def block() -> str:
            """The [XBLOCK, RBLOCK] block of the input, as the accumulator's type, masked to the identity."""
            x = self.operand(r.inp, inp_shape, "xr")
            x = Var(self.block(x, "xr"), x.dtype) if isinstance(x, Const) else x
            name = self.fresh("rv")
            body.append(f"{name} = tl.where(rmask & xmask, {self.values(ir_aten.element(low, x, acc_dt))}, {identity})")
            return name

        def ridx() -> str:
            body.append("ridx = tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)")
            return "ridx"

        def mean_of(total: str) -> str:
            return self.values(ir.truediv(Var(total, acc_dt), ir_aten.count(self.frame.rnumel, acc_dt)))

        if low.strategy == "combine":
            acc = self.fresh("acc")
            if persistent:
                body.append(f"{acc} = tl.reduce({block()}, 1, {combine})[:, None]")
            else:
                body.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {identity}, {tacc})")
                self.loop(lambda: body.append(f"{acc} = {combine}({acc}, {block()})"))
                body.append(f"{acc} = tl.reduce({acc}, 1, {combine})[:, None]")
            return {"acc": Var(acc, acc_dt)}
        if low.strategy == "arg":
            v, i = self.fresh("accv"), self.fresh("acci")
            if persistent:
                body.append(f"{v}, {i} = tl.reduce(({block()}, {ridx()}), 1, {combine})")
            else:
                body.append(f"{v} = tl.full([XBLOCK, RBLOCK], {identity}, {tacc})")
                body.append(f"{i} = tl.full([XBLOCK, RBLOCK], {INT32_MAX}, tl.int64)")
                self.loop(lambda: body.append(f"{v}, {i} = {combine}({v}, {i}, {block()}, {ridx()})"))
                body.append(f"{v}, {i} = tl.reduce(({v}, {i}), 1, {combine})")
            body += [f"{v} = {v}[:, None]", f"{i} = {i}[:, None]"]
            return {"value": Var(v, acc_dt), "index": Var(i, torch.int64)}
        # moments: the mean, then the squared deviations from it
        mean, m2 = self.fresh("mean"), self.fresh("m2")

        def deviation2(v: str) -> str:
            d = self.fresh("d")
            body.append(f"{d} = tl.where(rmask & xmask, {v} - {mean}, 0.0)")
            return f"{d} * {d}"

        if persistent:  # two passes over the block in registers
            v = block()
            body.append(f"{mean} = {mean_of(f'tl.reduce({v}, 1, {combine})')}[:, None]")
            body.append(f"{m2} = tl.reduce({deviation2(v)}, 1, {combine})[:, None]")
        else:
            acc = self.fresh("acc")
            body.append(f"{acc} = tl.full([XBLOCK, RBLOCK], 0, {tacc})")
            self.loop(lambda: body.append(f"{acc} = {acc} + {block()}"))
            body.append(f"{mean} = {mean_of(f'tl.reduce({acc}, 1, {combine})')}[:, None]")
            body.append(f"{m2} = tl.full([XBLOCK, RBLOCK], 0, {tacc})")
            self.loop(lambda: body.append(f"{m2} = {m2} + {deviation2(block())}"))
            body.append(f"{m2} = tl.reduce({m2}, 1, {combine})[:, None]")
        return {"mean": Var(mean, acc_dt), "m2": Var(m2, acc_dt)}

    def launch(self) -> Emitted:
        """The kernel module and its launch function (``launch.assemble``)."""
        fr = self.frame
        py = PyExprPrinter({s: s.name for s in self.all_symbols()})
        prologue = self.launch_lines + [f"xnumel = {py(fr.xnumel)}", "if xnumel <= 0:", "    return"] + self.launch_checks
        kind, cfgs = launch.configs(fr.reduction, fr.xnumel, fr.rnumel)
        lines = launch.head(fr.reduction, TritonPrinter()(fr.xnumel), self.int64) + self.used_body()
        return launch.assemble(self.name, self.params, self.args, prologue, lines, cfgs, kind, self.autotune,
                               len(self.nodes), len(self.storages))

    def used_body(self) -> list[str]:
        """The body without index locals nothing reads (coordinates a contiguous access skipped):
        the locals the printed offsets read, and those their definitions read, are kept."""
        live: set[sympy.Symbol] = set()
        stack = list(self.offset_symbols)
        while stack:
            s = stack.pop()
            if s not in live:
                live.add(s)
                stack.extend(self.defs.get(s, sympy.Integer(0)).free_symbols)
        dead = {self.local_lines[s.name] for s in self.defs if s not in live and s.name in self.local_lines}
        return [l for i, l in enumerate(self.body) if i not in dead]
