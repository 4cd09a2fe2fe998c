"""Registering a custom op's candidates: ``CustomOpConfig`` (one implementation), ``Tuning`` (an
op's registration) and ``register_custom_op_autotuning``."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch







class CustomOpConfig:
    """One implementation of a custom op: ``impl(*args, **kwargs, **params)``, a Python function
    of ATen ops; ``CustomOpConfig()`` (no ``impl``) is the op itself, called opaquely."""

    def __init__(self, impl: Callable | None = None, **params: Any):
        if impl is not None and not callable(impl):
            raise TypeError(f"CustomOpConfig: impl must be a function (or None for the op itself), got "
                            f"{type(impl).__name__}")
        self.impl = impl
        self.params = dict(params)

    @property
    def name(self) -> str:
        if self.impl is None:
            return "fallback"
        base = getattr(self.impl, "__name__", type(self.impl).__name__)
        return base + (f"({', '.join(f'{k}={v!r}' for k, v in sorted(self.params.items()))})" if self.params else "")

    def bind(self, op: torch._ops.OpOverload) -> Callable[..., Any]:
        """A function computing the op this way, called with the op's arguments."""
        if self.impl is None:
            return op
        impl, params = self.impl, self.params

        def run(*args: Any, **kwargs: Any) -> Any:
            return impl(*args, **kwargs, **params)

        run.__name__ = self.name
        return run

    def source(self) -> str:
        """What the cache key holds of this implementation: its code and parameters."""
        if self.impl is None:
            return "fallback"
        try:
            code = inspect.getsource(self.impl)
        except (OSError, TypeError):
            code = getattr(self.impl, "__qualname__", repr(self.impl))
        return code + repr(sorted(self.params.items()))

    def __repr__(self) -> str:
        return f"CustomOpConfig({self.name})"


@dataclass(frozen=True)
class Tuning:
    op: torch._ops.OpOverload
    configs: tuple[CustomOpConfig, ...]  # the fallback first
    dispatch_on: Mapping[str, Any] | None = None
    split_points: tuple[int, ...] = ()
    min_speedup: float = 1.0
    input_gen_fns: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)


# Registrations, by op: process-wide, as torch.library registrations are.
_TUNINGS: dict[torch._ops.OpOverload, Tuning] = {}


def _overload(op: Any) -> torch._ops.OpOverload:
    op = getattr(op, "_opoverload", op)  # a @torch.library.custom_op function
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(f"register_custom_op_autotuning: op must be a custom op (a @torch.library.custom_op "
                        f"function or a torch.ops OpOverload), got {type(op).__name__}")
    return op


def register_custom_op_autotuning(op: Any, configs: Sequence[CustomOpConfig], *,
                                  dispatch_on: Mapping[str, Any] | None = None,
                                  split_points: Sequence[int] | None = None, min_speedup: float = 1.0,
                                  input_gen_fns: Mapping[str, Callable] | None = None) -> None:
    """Let fxforge choose among ``configs`` for ``op`` (module docstring).  The op itself is
    always a candidate (listed or not); registering again replaces the earlier configs."""
    op = _overload(op)
    if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        raise ValueError(f"register_custom_op_autotuning: {op.name()} writes to its arguments; only functional ops "
                         "(mutates_args=()) can be tuned")
    configs = [c if isinstance(c, CustomOpConfig) or not callable(c) else CustomOpConfig(c) for c in configs]
    if not configs or not all(isinstance(c, CustomOpConfig) for c in configs):
        raise TypeError("register_custom_op_autotuning: configs must be a non-empty list of fxforge.CustomOpConfig "
                        "(or of functions: CustomOpConfig(function))")
    if isinstance(min_speedup, bool) or not isinstance(min_speedup, (int, float)) or not min_speedup > 0:
        raise ValueError(f"register_custom_op_autotuning: min_speedup={min_speedup!r}: expected a number > 0")
    names = [a.name for a in op._schema.arguments]
    if dispatch_on is not None:
        keys = set(dispatch_on)
        if not {"tensor_name", "dim"} <= keys <= {"tensor_name", "dim", "unbounded_size"} \
                or dispatch_on["tensor_name"] not in names or not isinstance(dispatch_on["dim"], int):
            raise ValueError(f"register_custom_op_autotuning: dispatch_on={dict(dispatch_on)!r}: expected "
                             f"{{'tensor_name': one of {names}, 'dim': int}} (and optionally 'unbounded_size': "
                             "the size the last range is timed at)")
    points = tuple(split_points or ())
    if any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in points) or list(points) != sorted(set(points)):
        raise ValueError(f"register_custom_op_autotuning: split_points={split_points!r}: expected increasing ints >= 1")
    gens = dict(input_gen_fns or {})
    unknown = sorted(set(gens) - set(names))
    if unknown:
        raise ValueError(f"register_custom_op_autotuning: input_gen_fns names {unknown}, which are not arguments "
                         f"of {op.name()} ({names})")
    fallback = [c for c in configs if c.impl is None][:1] or [CustomOpConfig()]
    _TUNINGS[op] = Tuning(op, tuple(fallback + [c for c in configs if c.impl is not None]), dispatch_on, points,
                          float(min_speedup), gens)


def registered(op: Any) -> Tuning | None:
    return _TUNINGS.get(op) if isinstance(op, torch._ops.OpOverload) else None
