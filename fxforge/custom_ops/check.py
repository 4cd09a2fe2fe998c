"""Checking candidates before any is timed: inputs generated for a call site, each candidate run
eagerly and compared with the op, values and gradients (``_check``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from .register import CustomOpConfig, Tuning


# --------------------------------------------------------------------------- one call site


def _hint(s: Any) -> int:
    from ..testing.equivalence import hint

    return hint(s)


def _site_inputs(t: Tuning, args: tuple, kwargs: dict, seed: int = 0) -> tuple[tuple, dict]:
    """Real inputs for a call site whose fake (or example) values are ``args``/``kwargs``."""
    from ..testing.equivalence import random_tensor

    gen = torch.Generator().manual_seed(seed)
    bound = t.op._schema.arguments
    names = {i: a.name for i, a in enumerate(bound)}

    def make(v: Any, name: str | None) -> Any:
        if isinstance(v, (torch.Tensor, _Like)):
            if name in t.input_gen_fns:  # given a fake (here: meta) tensor of the site's shape
                like = torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, _Like) else v
                return t.input_gen_fns[name](like)
            x = random_tensor([_hint(s) for s in v.shape], v.dtype, gen, [_hint(s) for s in v.stride()])
            return x.to(v.device) if v.device.type != "cpu" else x
        if isinstance(v, torch.SymInt):
            return _hint(v)
        return v

    real_args = tuple(pytree.tree_map(lambda v, n=names.get(i): make(v, n), a) for i, a in enumerate(args))
    real_kwargs = {k: pytree.tree_map(lambda v, n=k: make(v, n), a) for k, a in kwargs.items()}
    return real_args, real_kwargs


def _describe_inputs(args: tuple, kwargs: dict) -> str:
    def one(v: Any) -> str:
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}" if isinstance(v, torch.Tensor) else repr(v)

    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


def _has_gradient(op: torch._ops.OpOverload) -> bool:
    """The op has a gradient formula of its own (``torch.library.register_autograd``)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:  # (another torch: no gradient check)
        return False
    d = OPDEFS.get(op._name)
    return d is not None and getattr(d, "_backward_fn", None) is not None


def _largest_error(a: Any, b: Any) -> float:
    errs = [(x.double() - y.double()).abs().max().item() for x, y in zip(pytree.tree_leaves(a), pytree.tree_leaves(b))
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.numel()]
    return max(errs, default=float("nan"))


def _disagreement(got: Any, want: Any) -> str | None:
    from ..testing.equivalence import mismatch

    a, b = pytree.tree_leaves(got), pytree.tree_leaves(want)
    if len(a) != len(b):
        return f"returns {len(a)} values, the op {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                what = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                return f"output {i} is {what}, the op's {y.dtype} {list(y.shape)}"
            if mismatch(x, y) is not None:
                return f"output {i} differs"
    return None


def _gradients(f: Callable, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
    """The gradients of ``f``'s outputs, for fixed random output gradients, with respect to each
    floating-point tensor among ``args``/``kwargs`` (zeros where none flows); None where there is
    no such input."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    diff = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor) and v.dtype.is_floating_point]
    if not diff:
        return None
    xs = list(leaves)
    for i in diff:
        xs[i] = leaves[i].detach().clone().requires_grad_(True)
    a, k = pytree.tree_unflatten(xs, spec)
    with torch.enable_grad():
        out = [o for o in pytree.tree_leaves(f(*a, **k)) if isinstance(o, torch.Tensor) and o.requires_grad]
        gen = torch.Generator().manual_seed(1)
        seeds = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in out]
        grads = torch.autograd.grad(out, [xs[i] for i in diff], seeds, allow_unused=True)
    return [torch.zeros_like(leaves[i]) if g is None else g for i, g in zip(diff, grads)]


@dataclass
class _Reference:
    """What the op computes on one set of inputs: its outputs, and its gradients where it has
    its own (``_gradients``), found once for every candidate checked against them."""

    args: tuple
    kwargs: dict
    outputs: Any
    gradients: list[torch.Tensor] | None

    @staticmethod
    def of(t: Tuning, args: tuple, kwargs: dict) -> "_Reference":
        with torch.no_grad():
            outputs = t.op(*args, **kwargs)
        return _Reference(args, kwargs, outputs, _gradients(t.op, args, kwargs) if _has_gradient(t.op) else None)


def _check(t: Tuning, cfg: CustomOpConfig, ref: _Reference) -> str | None:
    """Why ``cfg`` does not compute what the op computes on ``ref``'s inputs (values, and
    gradients where the op has its own), or None."""
    fn = cfg.bind(t.op)
    with torch.no_grad():
        try:
            got = fn(*ref.args, **ref.kwargs)
        except Exception as e:
            return f"raised {type(e).__name__}: {e}"
    why = _disagreement(got, ref.outputs)
    if why is not None:
        return f"{why} (largest error {_largest_error(got, ref.outputs):.3g})"
    if ref.gradients is None:
        return None
    try:
        got_g = _gradients(fn, ref.args, ref.kwargs)
    except Exception as e:
        return f"its gradient raised {type(e).__name__}: {e}"
    want_g = ref.gradients
    why = _disagreement(got_g, want_g)
    if why is not None:
        return f"its gradient {why.replace('output', 'of input')} (largest error {_largest_error(got_g, want_g):.3g})"
    return None


@dataclass(frozen=True)
class _Like:
    """A tensor's shape, dtype and device (contiguous), for inputs at a size no fake value has."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device

    def stride(self) -> tuple:
        out, step = [], 1
        for n in reversed(self.shape):
            out.append(step)
            step *= max(n, 1)
        return tuple(reversed(out))


def _shape_key(args: tuple, kwargs: dict) -> str:
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (str(v.dtype), tuple(_hint(s) for s in v.shape))
        return _hint(v) if isinstance(v, torch.SymInt) else repr(v)

    return repr(pytree.tree_map(one, (list(args), kwargs)))
