"""A third kernel language on fxforge's kernel IR, as a plugin would write it: NumPy source.

The group walk (``ir.lowering.Emitter``), the op semantics (``ir.aten``) and the values are
fxforge's; this module only prints them: every index is a NumPy array (``xindex`` the rows as a
column, ``rindex`` a row's elements as a row: broadcasting makes the ``[rows, elements]`` block),
each tensor a flat view of its memory, every reduction folded in one ``np.sum``/``np.max`` call.
"""

from __future__ import annotations

import numpy as np
import torch

from fxforge.codegen.api import CodegenBackend, GroupCost, Kernel
from fxforge.codegen.ir import aten as ir_aten, stmts as stmts_ir, values as ir
from fxforge.codegen.ir.lowering import Emitter, Unsupported, node_refusal
from fxforge.codegen.ir.facts import checked_cost, pointwise_facts
from fxforge.codegen.ir.printer import IndexPrinter, StatementPrinter, ValuePrinter
from fxforge.core.iteration import shape_of

NP = {torch.float32: "np.float32", torch.float64: "np.float64", torch.int64: "np.int64", torch.int32: "np.int32",
      torch.int16: "np.int16", torch.int8: "np.int8", torch.uint8: "np.uint8", torch.bool: "np.bool_"}
_BINARY = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "and": "&", "or": "|",
           "xor": "^", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_CALLS = {"where": "np.where", "max_nan": "np.maximum", "min_nan": "np.minimum", "neg": "np.negative",
          "abs": "np.abs", "invert": "np.invert", "not": "np.logical_not", "pow": "np.power", "atan2": "np.arctan2",
          "fmod": "np.fmod", "nearbyint": "np.rint", "asin": "np.arcsin", "acos": "np.arccos", "atan": "np.arctan",
          "asinh": "np.arcsinh", "acosh": "np.arccosh", "atanh": "np.arctanh"}
_FOLD = {"add": "np.sum", "mul": "np.prod", "max_nan": "np.max", "min_nan": "np.min"}


class NumpyIndex(IndexPrinter):
    MAX, MIN = "np.maximum", "np.minimum"

    def div(self, a, b) -> str:  # NumPy's // and % are Python's (floor)
        return self._print(a) if b == 1 else f"({self._operand(a)} // {self._operand(b)})"

    def mod(self, a, b) -> str:
        return "0" if b == 1 else f"({self._operand(a)} % {self._operand(b)})"


def _call(fn: str):
    return lambda p, x, a: f"{fn}({', '.join(a)})"


class NumpyValues(ValuePrinter):
    language = "NumPy"
    OPS = {**{name: f"({{0}} {sym} {{1}})" for name, sym in _BINARY.items()},
           **{name: _call(f"np.{name}") for name in ir.FLOAT_UNARY if hasattr(np, name)},  # (erf, lgamma...: none)
           **{name: _call(fn) for name, fn in _CALLS.items()},
           "cast": lambda p, x, a: f"np.asarray({a[0]}).astype({NP[x.dtype]})"}

    def __init__(self):
        super().__init__(NumpyIndex())

    def value_Const(self, c: ir.Const) -> str:
        value = f"float('{c.value!r}')" if isinstance(c.value, float) else repr(c.value)  # inf, nan
        return f"{NP[c.dtype]}({value})"

    def value_Lanes(self, x: ir.Lanes) -> str:
        return "np.arange(rnumel)[None, :]"


class NumpyStatements(StatementPrinter):
    """The walk's statements (``ir/stmts.py``) as NumPy lines: every index an array already, each
    row's fold one call over the ``[rows, elements]`` block (no loops: each row is one array)."""

    def __init__(self, values: NumpyValues):
        self.values = values

    def stmt_Index(self, s: stmts_ir.Index) -> str:
        return f"{s.name} = {self.values.index(s.expr)}"

    def stmt_Load(self, s: stmts_ir.Load) -> str:
        return f"{s.name} = {s.ptr}[{self.values.index(s.offset)}]"

    def stmt_Let(self, s: stmts_ir.Let) -> str:
        return f"{s.name} = {self.values(s.value)}"

    def stmt_Store(self, s: stmts_ir.Store) -> str:
        return f"{s.ptr}[{self.values.index(s.offset)}] = {self.values(s.value)}"

    def stmt_Reduce(self, s: stmts_ir.Reduce) -> str:
        (target,), (x,) = s.targets, s.args
        block = f"np.broadcast_to({self.values(x)}, (xnumel, rnumel))"
        return f"{target} = {_FOLD[s.combine]}({block}, axis=1, keepdims=True).astype({NP[x.dtype]})"


class NumpyEmitter(Emitter):
    values = NumpyValues()
    SIG_DTYPE = NP

    def persistent(self):
        return True  # the whole row in one array

    def open_persistent(self):
        self.body.append(stmts_ir.Let("rindex", ir.Lanes()))

    def fold(self, r, low, acc_dt, persistent):
        if low.strategy == "arg":
            raise Unsupported("arg reductions")
        x = self.bind(self.fresh("rv"), ir_aten.element(low, self.operand(r.inp, shape_of(r.inp.meta["val"]), ir.Domain.ELEMENT),
                                                         acc_dt))
        name = self.fresh("acc")
        if low.strategy == "combine":
            self.body.append(stmts_ir.Reduce((name,), (x,), low.combine, across=True))
            return {"acc": ir.Var(name, acc_dt)}
        total, mean = ir.Var(f"{name}_sum", acc_dt), ir.Var(name, acc_dt)  # moments: the mean, then the squared deviations
        d = ir.sub(x, mean)
        self.body += [stmts_ir.Reduce((total.name,), (x,), "add", across=True),
                      stmts_ir.Let(name, ir.truediv(total, ir_aten.count(self.frame.rnumel, acc_dt))),
                      stmts_ir.Reduce((f"{name}_m2",), (ir.mul(d, d),), "add", across=True)]
        return {"mean": mean, "m2": ir.Var(f"{name}_m2", acc_dt)}

    def launch(self) -> Kernel:
        fr, p = self.frame, self.values.index
        lines = [f"def {self.name}({', '.join(self.args)}):"] + ["    " + l for l in self.prologue()]
        for q in self.params:
            lines.append(f"    {q.name} = _flat({q.launch})" if q.sig.startswith("*") else f"    {q.name} = {q.launch}")
        lines += [f"    xnumel, rnumel = {p(fr.xnumel)}, {p(fr.rnumel)}",
                  f"    xindex = np.arange(xnumel){'[:, None]' if fr.reduction else ''}",
                  "    with np.errstate(all='ignore'):  # eager's IEEE results, without NumPy's warnings"]
        lines += NumpyStatements(self.values).lines(self.body, "        ")
        return Kernel(self.name, "\n".join(lines) + "\n", list(self.args), {"np": np, "_flat": _flat},
                      node_count=len(self.nodes), unique_io_buffers=len(self.storages), launch_args=len(self.params))


def _flat(t: torch.Tensor) -> np.ndarray:
    """The memory ``t`` spans, as a flat NumPy array from its first element (strides in elements)."""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    return t.detach().as_strided((span,), (1,)).numpy()


def _emit(nodes, outputs=None, name="probe", ref=lambda n: n.name, buffer=lambda n, i: f"{n.name}_{i}", layout=None):
    return NumpyEmitter(name, ref, buffer, nodes, outputs, layout=layout).emit()


def accepts(node, config):
    why = node_refusal(node, NP, "NumPy")
    if why is None:
        try:
            _emit([node])
        except (Unsupported, NotImplementedError) as e:
            why = f"numpy: {e}"
    return why


def fusion_cost(nodes, outputs, config):
    def probe():
        k = _emit(nodes, outputs)
        return GroupCost(num_args=k.num_args, unique_io_buffers=k.unique_io_buffers)
    return checked_cost(nodes, outputs, config, "numpy", None, probe)  # (no rules of its own)


def compile_group(group, ctx):
    return _emit(group.nodes, group.outputs or None, ctx.name, ctx.ref, ctx.buffer, ctx.layout)


BACKEND = CodegenBackend("numpy", ("cpu",), accepts, compile_group, fuses=True, fusion_cost=fusion_cost,
                         fusion_facts=pointwise_facts, decompose="core", reads_planned=True, extern="torch",
                         description="NumPy source printed from fxforge's kernel IR (a test backend)")
