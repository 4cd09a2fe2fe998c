"""Checking a call's inputs against what a graph was compiled for.

``torch.compile`` guards every input (a new shape, dtype or layout recompiles), so graphs it
hands fxforge are always called with inputs like the traced ones.  A compiled exported program
is called directly: ``check_inputs`` checks what ``ep.module()`` checks (count, tensor-ness,
rank, every size against the program's static sizes, symbols and range constraints) plus dtype
and device, and raises ``InputError`` naming the input.  An input whose layout differs from the
compiled one (a transposed or step-sliced view: generated kernels index with the compiled
strides) is copied into the compiled layout; ``InputCheck.copied_bytes`` says how much.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import sympy
import torch

from ..codegen.runtime import as_traced
from ..core.signature import InputError


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor input must be: its sizes and strides (ints, or sympy expressions of the
    program's size symbols), dtype and device."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device

    def dim(self) -> int:
        return len(self.shape)


def _expr(v: Any) -> Any:
    """An int, or a SymInt as its sympy expression (an int where it is one)."""
    if isinstance(v, torch.SymInt):
        e = v.node.expr
        return int(e) if e.is_Integer else e
    return v


def spec_of(val: Any) -> Any:
    """A graph placeholder's value as ``check_inputs`` reads it: a ``TensorSpec`` for a tensor, a
    sympy expression for a SymInt, the value itself for a constant."""
    if isinstance(val, torch.Tensor):
        return TensorSpec(tuple(map(_expr, val.shape)), tuple(map(_expr, val.stride())), val.dtype, val.device)
    return _expr(val)


@dataclass(frozen=True)
class Expected:
    """What one input must be: ``val`` is a ``TensorSpec``, a sympy expression (an int input of
    symbolic value) or a constant (``spec_of``: ``Expected.of`` takes the placeholder's value);
    ``name`` says where the caller passed it (``x (args[0])``)."""

    name: str
    val: Any

    @staticmethod
    def of(name: str, val: Any) -> "Expected":
        return Expected(name, spec_of(val))


@dataclass
class InputCheck:
    args: list  # the inputs to run with (restrided copies where the layout differed)
    copied_bytes: int = 0  # bytes of those copies


def ranges_of(range_constraints: dict | None) -> dict:
    """An ExportedProgram's ``range_constraints`` as symbol -> (lower, upper), each an int or None
    (unbounded)."""
    def bound(b: Any) -> int | None:
        # torch's ``int_oo`` says ``is_finite`` yet has no int value
        return int(b) if isinstance(b, (int, sympy.Integer)) else None

    return {s: (bound(r.lower), bound(r.upper)) for s, r in (range_constraints or {}).items()}


def check_inputs(expected: Sequence[Expected], args: Sequence[Any], ranges: dict | None = None) -> InputCheck:
    """Check ``args`` against ``expected``; raise ``InputError`` on the first mismatch.

    ``ranges``: symbol -> (lower, upper) (``ranges_of`` an ExportedProgram's ``range_constraints``)."""
    if len(args) != len(expected):
        raise InputError(f"expected {len(expected)} inputs ({', '.join(e.name for e in expected)}), got {len(args)}")
    env: dict[sympy.Symbol, int] = {}
    derived: list[tuple[sympy.Expr, int, str]] = []  # sizes that are expressions of symbols

    def size(e: Expected, what: str, want: Any, got: int) -> None:
        if not isinstance(want, sympy.Expr):
            if int(want) != got:
                raise InputError(f"input {e.name}: {what} is {got}, expected {int(want)} (the program was exported "
                                 "with this size static; export it with a Dim to accept others)")
            return
        if isinstance(want, sympy.Symbol):
            if want in env:
                if env[want] != got:
                    raise InputError(f"input {e.name}: {what} is {got}, expected {env[want]} "
                                     f"(the same size {want} as an earlier input)")
                return
            lo, hi = (ranges or {}).get(want, (None, None))
            if (lo is not None and got < lo) or (hi is not None and got > hi):
                raise InputError(f"input {e.name}: {what} is {got}, outside the range {lo}..{'int_oo' if hi is None else hi} "
                                 f"the program was exported for ({want})")
            env[want] = got
        else:
            derived.append((want, got, f"input {e.name}: {what}"))

    for e, a in zip(expected, args):
        v = e.val
        if isinstance(v, TensorSpec):
            if not isinstance(a, torch.Tensor):
                raise InputError(f"input {e.name}: expected a tensor, got {type(a).__name__}")
            if a.dim() != v.dim():
                raise InputError(f"input {e.name}: expected {v.dim()} dimensions {_shape(v.shape)}, got {a.dim()} "
                                 f"{tuple(a.shape)}")
            if a.dtype != v.dtype:
                raise InputError(f"input {e.name}: dtype is {a.dtype}, expected {v.dtype} (convert it with .to({v.dtype}))")
            if a.device.type != v.device.type or (v.device.index is not None and a.device.index != v.device.index):
                raise InputError(f"input {e.name}: is on {a.device}, expected {v.device} (move it with .to('{v.device}'))")
            for d, (want, got) in enumerate(zip(v.shape, a.shape)):
                size(e, f"size({d})", want, int(got))
        elif isinstance(v, sympy.Expr):
            if not isinstance(a, int) or isinstance(a, bool):
                raise InputError(f"input {e.name}: expected an int, got {type(a).__name__}")
            size(e, "its value", v, a)
        elif isinstance(v, (bool, int, float, str)) and (type(a) is not type(v) or a != v):
            raise InputError(f"input {e.name}: expected {v!r} (a constant of the program), got {a!r}")
    for expr, got, what in derived:
        want = sympy.sympify(expr.xreplace(env))
        if not want.free_symbols and int(want) != got:
            raise InputError(f"{what} is {got}, expected {int(want)} ({expr})")

    out = InputCheck(list(args))
    for i, (e, a) in enumerate(zip(expected, args)):
        if isinstance(e.val, TensorSpec):
            stride = _stride(e.val, env)
            if stride is not None:
                out.args[i] = as_traced(a, stride)
                if out.args[i] is not a:
                    out.copied_bytes += a.numel() * a.element_size()
    return out


def _shape(dims: tuple) -> str:
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def _stride(v: TensorSpec, env: dict) -> tuple[int, ...] | None:
    """The compiled stride of ``v``'s input at the sizes ``env`` binds (None: a stride the sizes do
    not determine, nothing to compare with)."""
    want = []
    for st in v.stride:
        if isinstance(st, sympy.Expr):
            e = sympy.sympify(st.xreplace(env))  # a bare symbol becomes its int
            if e.free_symbols:
                return None  # a stride the sizes do not determine: nothing to compare with
            st = int(e)
        want.append(int(st))
    return tuple(want)
