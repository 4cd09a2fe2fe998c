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

import sympy
import torch

from ...core.graph import VAL
from ...core.iteration import shape_of
from ..ir import aten as ir_aten, values as ir
from ..ir.aten import Reduction
from ..ir.lowering import INT32_MAX, R, RINDEX, XINDEX, Emitter, Param, Unsupported, node_refusal  # noqa: F401 (the backend's names)
from ..ir.stmts import Let, Loop, Nest, Reduce, Set, without_dead_indices
from ..ir.values import Const, Domain, Var
from ..pyexpr import PyExprPrinter
from . import launch
from .launch import Emitted
from .dtypes import SIG_DTYPE
from .prelude import available_helpers
from .printer import TritonPrinter, TritonStatements, values


RBLOCK = sympy.Symbol("RBLOCK", integer=True, positive=True)  # a looped reduction's block of row elements


class TritonEmitter(Emitter):
    """``ir.lowering.Emitter`` writing Triton: blocks of rows, masked loads and stores."""

    SIG_DTYPE = SIG_DTYPE

    def __init__(self, *args, autotune: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.values = values(available_helpers())  # what this process's kernel modules define
        self.autotune = autotune  # the launch asks ``<name>_tuner`` for its configuration

    def printer(self) -> TritonStatements:
        return TritonStatements(self.values, self.frame.reduction, self.deps_of)

    def lanes(self, start: ir.Value | None = None) -> list[Let]:
        """``rindex``, the row elements of a block (from ``start``: a loop's offset), and
        ``rmask``, those in the rows."""
        lanes = ir.Lanes() if start is None else ir.add(start, ir.Lanes())
        return [Let(RINDEX, lanes), Let("rmask", ir.compare("lt", Var(RINDEX, torch.int32), ir.Index(self.frame.rnumel)))]

    def open_persistent(self) -> None:
        self.body += self.lanes()

    # ---------------------------------------------------------------- kernels

    def persistent(self) -> bool:
        """A reduction whose rows fit one block (no loop over them)."""
        return launch.is_persistent(self.frame.reduction, self.frame.rnumel)

    def loop(self, body, independent: bool = False) -> None:
        """Emit ``body()`` inside ``for roffset in range(0, rnumel, RBLOCK)``, in its own scope
        (each iteration is a block of lanes already, ``independent`` or not)."""
        nest = Nest([Loop("roffset", self.frame.rnumel, 0, RBLOCK)], self.lanes(Var("roffset", torch.int32)))
        outer, self.body = self.body, nest.body
        self.scopes.append({})
        body()
        self.scopes.pop()
        self.body = outer
        self.body.append(nest)

    def fold(self, r, low: Reduction, acc_dt: torch.dtype, persistent: bool) -> dict[str, Var]:
        """The fold of each row (one block, or a loop over blocks) as statements (``Reduce``, and
        the blocks of ``values``: ``Mask``, ``Full``, ``Block``): the accumulators it leaves,
        ``[XBLOCK, 1]`` each (see ``ir.aten.result``)."""
        combine, identity = low.combine, ir_aten.identity(low, acc_dt)
        inp_shape = shape_of(r.inp.meta[VAL])
        every = Domain.ELEMENT

        def block() -> Var:
            """The [XBLOCK, RBLOCK] block of the input, as the accumulator's type, masked to the identity."""
            x = self.operand(r.inp, inp_shape, every)
            x = ir.Block(x, every) if isinstance(x, Const) else x
            return self.bind(self.fresh("rv"), ir.where(ir.Mask(every), ir_aten.element(low, x, acc_dt), identity))

        def ridx() -> Var:
            return self.bind("ridx", ir.cast(ir.Block(ir.Index(R), every, torch.int32), torch.int64))  # (rindex: int32)

        def start(name: str, value: ir.Value) -> None:
            self.body.append(Let(name, ir.Full(value, every), mutable=True))

        if low.strategy == "combine":
            acc = self.fresh("acc")
            if persistent:
                self.body.append(Reduce((acc,), (block(),), combine, across=True))
            else:
                start(acc, identity)
                self.loop(lambda: self.body.append(Reduce((acc,), (block(),), combine)))
                self.body.append(Reduce((acc,), (Var(acc, acc_dt),), combine, across=True))
            return {"acc": Var(acc, acc_dt)}
        if low.strategy == "arg":
            v, i = self.fresh("accv"), self.fresh("acci")
            if persistent:
                self.body.append(Reduce((v, i), (block(), ridx()), combine, across=True))
            else:
                start(v, identity)
                start(i, ir.Const(INT32_MAX, torch.int64))
                self.loop(lambda: self.body.append(Reduce((v, i), (block(), ridx()), combine)))
                self.body.append(Reduce((v, i), (Var(v, acc_dt), Var(i, torch.int64)), combine, across=True))
            return {"value": Var(v, acc_dt), "index": Var(i, torch.int64)}
        # moments: the mean, then the squared deviations from it
        mean, m2 = self.fresh("mean"), self.fresh("m2")
        count = ir_aten.count(self.frame.rnumel, acc_dt)

        def deviation2(x: Var) -> ir.Value:
            d = self.bind(self.fresh("d"), ir.where(ir.Mask(every), ir.sub(x, Var(mean, acc_dt)), ir.Const(0.0, acc_dt)))
            return ir.mul(d, d)

        def take_mean(total: str) -> None:
            self.body.append(Let(mean, ir.truediv(Var(total, acc_dt), count)))

        if persistent:  # two passes over the block in registers
            x, total = block(), self.fresh("sum")
            self.body.append(Reduce((total,), (x,), combine, across=True))
            take_mean(total)
            square = self.bind(self.fresh("sq"), deviation2(x))
            self.body.append(Reduce((m2,), (square,), combine, across=True))
        else:
            acc = self.fresh("acc")
            start(acc, ir.Const(0, acc_dt))
            self.loop(lambda: self.body.append(Set(acc, ir.add(Var(acc, acc_dt), block()))))
            self.body.append(Reduce((acc,), (Var(acc, acc_dt),), combine, across=True))
            take_mean(acc)
            start(m2, ir.Const(0, acc_dt))
            self.loop(lambda: self.body.append(Set(m2, ir.add(Var(m2, acc_dt), deviation2(block())))))
            self.body.append(Reduce((m2,), (Var(m2, acc_dt),), combine, across=True))
        return {"mean": Var(mean, acc_dt), "m2": Var(m2, acc_dt)}

    def launch(self) -> Emitted:
        """The kernel module and its launch function (``launch.assemble``)."""
        fr = self.frame
        py = PyExprPrinter({s: s.name for s in self.all_symbols()})
        prologue = self.prologue(f"xnumel = {py(fr.xnumel)}", "if xnumel <= 0:", "    return")
        kind, cfgs = launch.configs(fr.reduction, fr.xnumel, fr.rnumel)
        body = without_dead_indices(self.body, self.defs)
        lines = launch.head(fr.reduction, TritonPrinter()(fr.xnumel), self.int64) + self.printer().lines(body)
        return launch.assemble(self.name, self.params, self.args, prologue, lines, cfgs, kind, self.autotune,
                               len(self.nodes), len(self.storages))
