"""Emitting one Triton kernel (module source + launch function) for a group of ATen nodes.

Shapes of the kernels (the loop nest is ``ir.lowering``'s):

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

import torch

from ...core.graph import VAL
from ...core.iteration import shape_of
from ..ir import aten as ir_aten, values as ir
from ..ir.aten import Reduction
from ..ir.lowering import INT32_MAX, RINDEX, XINDEX, Emitter, Param, Unsupported, node_refusal  # noqa: F401 (the backend's names)
from ..ir.stmts import Line, Loop, Nest, without_dead_indices
from ..ir.values import Const, Domain, Var
from ..pyexpr import PyExprPrinter
from . import launch
from .launch import Emitted
from .dtypes import COMBINE_FN, SIG_DTYPE, TL_DTYPE
from .prelude import available_helpers
from .printer import TritonPrinter, TritonStatements, values


class TritonEmitter(Emitter):
    """``ir.lowering.Emitter`` writing Triton: blocks of rows, masked loads and stores."""

    SIG_DTYPE = SIG_DTYPE

    def __init__(self, *args, autotune: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.values = values(available_helpers())  # what this process's kernel modules define
        self.autotune = autotune  # the launch asks ``<name>_tuner`` for its configuration

    def printer(self) -> TritonStatements:
        return TritonStatements(self.values, self.frame.reduction, self.deps_of)

    def open_persistent(self) -> None:
        self.body.append(Line("rindex = tl.arange(0, RBLOCK)[None, :]"))
        self.body.append(Line(f"rmask = rindex < {TritonPrinter()(self.frame.rnumel)}"))

    # ---------------------------------------------------------------- kernels

    def persistent(self) -> bool:
        """A reduction whose rows fit one block (no loop over them)."""
        return launch.is_persistent(self.frame.reduction, self.frame.rnumel)

    def loop(self, body, independent: bool = False) -> None:
        """Emit ``body()`` inside ``for roffset in range(0, rnumel, RBLOCK)``, in its own scope
        (each iteration is a block of lanes already, ``independent`` or not)."""
        rn = self.frame.rnumel
        nest = Nest([Loop("roffset", rn, 0, "RBLOCK")], [Line("rindex = roffset + tl.arange(0, RBLOCK)[None, :]"),
                                                         Line(f"rmask = rindex < {TritonPrinter()(rn)}")])
        outer, self.body = self.body, nest.body
        self.scopes.append({})
        body()
        self.scopes.pop()
        self.body = outer
        self.body.append(nest)

    def fold(self, r, low: Reduction, acc_dt: torch.dtype, persistent: bool) -> dict[str, Var]:
        """Emit the fold of each row (one block, or a loop over blocks): the accumulators it
        leaves, ``[XBLOCK, 1]`` each (see ``ir.aten.result``)."""
        combine = COMBINE_FN[low.combine]
        identity, tacc = self.values(ir_aten.identity(low, acc_dt)), TL_DTYPE[acc_dt]
        inp_shape = shape_of(r.inp.meta[VAL])

        def block() -> str:
            """The [XBLOCK, RBLOCK] block of the input, as the accumulator's type, masked to the identity."""
            x = self.operand(r.inp, inp_shape, Domain.ELEMENT)
            x = Var(self.printer().block(x, Domain.ELEMENT), x.dtype) if isinstance(x, Const) else x
            name = self.fresh("rv")
            self.put(f"{name} = tl.where(rmask & xmask, {self.values(ir_aten.element(low, x, acc_dt))}, {identity})")
            return name

        def ridx() -> str:
            self.put("ridx = tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)")
            return "ridx"

        def mean_of(total: str) -> str:
            return self.values(ir.truediv(Var(total, acc_dt), ir_aten.count(self.frame.rnumel, acc_dt)))

        if low.strategy == "combine":
            acc = self.fresh("acc")
            if persistent:
                self.put(f"{acc} = tl.reduce({block()}, 1, {combine})[:, None]")
            else:
                self.put(f"{acc} = tl.full([XBLOCK, RBLOCK], {identity}, {tacc})")
                self.loop(lambda: self.put(f"{acc} = {combine}({acc}, {block()})"))
                self.put(f"{acc} = tl.reduce({acc}, 1, {combine})[:, None]")
            return {"acc": Var(acc, acc_dt)}
        if low.strategy == "arg":
            v, i = self.fresh("accv"), self.fresh("acci")
            if persistent:
                self.put(f"{v}, {i} = tl.reduce(({block()}, {ridx()}), 1, {combine})")
            else:
                self.put(f"{v} = tl.full([XBLOCK, RBLOCK], {identity}, {tacc})")
                self.put(f"{i} = tl.full([XBLOCK, RBLOCK], {INT32_MAX}, tl.int64)")
                self.loop(lambda: self.put(f"{v}, {i} = {combine}({v}, {i}, {block()}, {ridx()})"))
                self.put(f"{v}, {i} = tl.reduce(({v}, {i}), 1, {combine})")
            self.put(f"{v} = {v}[:, None]")
            self.put(f"{i} = {i}[:, None]")
            return {"value": Var(v, acc_dt), "index": Var(i, torch.int64)}
        # moments: the mean, then the squared deviations from it
        mean, m2 = self.fresh("mean"), self.fresh("m2")

        def deviation2(v: str) -> str:
            d = self.fresh("d")
            self.put(f"{d} = tl.where(rmask & xmask, {v} - {mean}, 0.0)")
            return f"{d} * {d}"

        if persistent:  # two passes over the block in registers
            v = block()
            self.put(f"{mean} = {mean_of(f'tl.reduce({v}, 1, {combine})')}[:, None]")
            self.put(f"{m2} = tl.reduce({deviation2(v)}, 1, {combine})[:, None]")
        else:
            acc = self.fresh("acc")
            self.put(f"{acc} = tl.full([XBLOCK, RBLOCK], 0, {tacc})")
            self.loop(lambda: self.put(f"{acc} = {acc} + {block()}"))
            self.put(f"{mean} = {mean_of(f'tl.reduce({acc}, 1, {combine})')}[:, None]")
            self.put(f"{m2} = tl.full([XBLOCK, RBLOCK], 0, {tacc})")
            self.loop(lambda: self.put(f"{m2} = {m2} + {deviation2(block())}"))
            self.put(f"{m2} = tl.reduce({m2}, 1, {combine})[:, None]")
        return {"mean": Var(mean, acc_dt), "m2": Var(m2, acc_dt)}

    def put(self, line: str) -> None:
        """A line of the fold in Triton's own words (``tl.reduce``...) into the open scope."""
        self.body.append(Line(line))

    def launch(self) -> Emitted:
        """The kernel module and its launch function (``launch.assemble``)."""
        fr = self.frame
        py = PyExprPrinter({s: s.name for s in self.all_symbols()})
        prologue = self.launch_lines + [f"xnumel = {py(fr.xnumel)}", "if xnumel <= 0:", "    return"] + self.launch_checks
        kind, cfgs = launch.configs(fr.reduction, fr.xnumel, fr.rnumel)
        body = without_dead_indices(self.body, self.defs)
        lines = launch.head(fr.reduction, TritonPrinter()(fr.xnumel), self.int64) + self.printer().lines(body)
        return launch.assemble(self.name, self.params, self.args, prologue, lines, cfgs, kind, self.autotune,
                               len(self.nodes), len(self.storages))
