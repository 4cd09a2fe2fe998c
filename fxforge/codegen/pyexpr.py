"""Printing sympy size expressions and FX node arguments as Python source for the wrapper."""

from __future__ import annotations

import math
from typing import Any, Callable

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import (
    CeilDiv,
    CleanDiv,
    FloorDiv,
    IntTrueDiv,
    ModularIndexing,
    PythonMod,
)


class PyExprPrinter:
    """sympy -> Python integer arithmetic (floor semantics, exactly what Python ints do)."""

    def __init__(self, names: dict[sympy.Symbol, str] | None = None):
        self.names = names if names is not None else {}

    def __call__(self, e: Any) -> str:
        return self.p(sympy.sympify(e))

    def p(self, e: sympy.Basic) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            if e not in self.names:
                raise KeyError(f"symbol {e} is not bound in the generated code")
            return self.names[e]
        if e.is_Rational:
            return f"({e.p} / {e.q})"
        if e.is_Float:
            return repr(float(e))
        if e.is_Add:
            terms = sorted(e.args, key=lambda t: (t.is_number, sympy.default_sort_key(t)))
            out = self.p(terms[0])
            for t in terms[1:]:
                c, rest = t.as_coeff_Mul()
                if c.is_number and c < 0:
                    out += f" - {self.p(-t)}"
                else:
                    out += f" + {self.p(t)}"
            return f"({out})"
        if e.is_Mul:
            c, rest = e.as_coeff_Mul()
            if c == -1:
                return f"(-{self.p(rest)})"
            return "(" + " * ".join(self.p(a) for a in e.args) + ")"
        if e.is_Pow:
            base, exp = e.args
            if exp.is_Integer and exp > 0:
                return "(" + " * ".join([self.p(base)] * int(exp)) + ")"
            return f"({self.p(base)} ** {self.p(exp)})"
        if isinstance(e, FloorDiv):
            return f"({self.p(e.args[0])} // {self.p(e.args[1])})"
        if isinstance(e, CeilDiv):
            return f"(-((-{self.p(e.args[0])}) // {self.p(e.args[1])}))"
        if isinstance(e, (CleanDiv,)):
            return f"({self.p(e.args[0])} // {self.p(e.args[1])})"
        if isinstance(e, IntTrueDiv):
            return f"({self.p(e.args[0])} / {self.p(e.args[1])})"
        if isinstance(e, ModularIndexing):
            x, d, m = (self.p(a) for a in e.args)
            return f"(({x} // {d}) % {m})"
        if isinstance(e, (PythonMod, sympy.Mod)):
            return f"({self.p(e.args[0])} % {self.p(e.args[1])})"
        if isinstance(e, sympy.floor):
            return f"math.floor({self.p(e.args[0])})"
        if isinstance(e, sympy.ceiling):
            return f"math.ceil({self.p(e.args[0])})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            fn = "max" if isinstance(e, sympy.Max) else "min"
            return f"{fn}({', '.join(self.p(a) for a in e.args)})"
        name = type(e).__name__
        if name in ("Max", "Min"):  # torch's own Max/Min classes
            return f"{name.lower()}({', '.join(self.p(a) for a in e.args)})"
        raise NotImplementedError(f"cannot print size expression {e} ({name}) as Python")


def op_path(op: torch._ops.OpOverload) -> str:
    """``torch.ops.<ns>.<name>.<overload>`` for an OpOverload."""
    ns, rest = op.name().split("::", 1)
    name, _, overload = rest.partition(".")
    return f"torch.ops.{ns}.{name}.{overload or 'default'}"


def op_display(op: Any) -> str:
    if isinstance(op, torch._ops.OpOverload):
        return op_path(op)[len("torch.ops."):]
    return getattr(op, "__qualname__", None) or getattr(op, "__name__", None) or repr(op)


_SIMPLE_CONSTS = (torch.dtype, torch.layout, torch.memory_format)


def literal(v: Any) -> str | None:
    """Python source for a constant argument, or None when it needs to be a global."""
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    if isinstance(v, _SIMPLE_CONSTS):
        return str(v)  # "torch.float32", "torch.strided", "torch.contiguous_format"
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    return None


def format_arg(a: Any, ref: Callable[[fx.Node], str], const: Callable[[Any], str]) -> str:
    """Source for an FX argument: nodes through ``ref``, odd constants through ``const``."""
    if isinstance(a, fx.Node):
        return ref(a)
    if isinstance(a, tuple):
        inner = ", ".join(format_arg(x, ref, const) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(format_arg(x, ref, const) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {format_arg(v, ref, const)}" for k, v in a.items()) + "}"
    s = literal(a)
    return s if s is not None else const(a)


def format_call(fn: str, args, kwargs, ref, const) -> str:
    parts = [format_arg(a, ref, const) for a in args]
    parts += [f"{k}={format_arg(v, ref, const)}" for k, v in kwargs.items()]
    return f"{fn}({', '.join(parts)})"
