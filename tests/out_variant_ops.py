"""Custom operators with out variants, as a third party would define them (tests/test_out_variant.py).

Python implementations, registered as CompositeExplicitAutograd, except ``rms_rows`` and its out
form: registered for the CPU dispatch key only, as a C++ extension's kernels would be.

``CALLS`` counts how often each implementation ran: the compiled code must call the out forms.
"""

from __future__ import annotations

from collections import Counter

import torch

CALLS: Counter = Counter()

lib = torch.library.Library("fxov", "DEF")  # noqa: TOR901 (a test library, alive for the process)
other = torch.library.Library("fxov_other", "DEF")  # noqa: TOR901

# single output: x * a + y
lib.define("scale_add(Tensor x, Tensor y, float a) -> Tensor")
lib.define("scale_add.out(Tensor x, Tensor y, float a, *, Tensor(a!) out) -> Tensor(a!)")
# two outputs: (x @ w) * a and its row sums
lib.define("mm_split(Tensor x, Tensor w, float a) -> (Tensor, Tensor)")
lib.define("mm_split.out(Tensor x, Tensor w, float a, *, Tensor(a!) out0, Tensor(b!) out1) -> (Tensor(a!), Tensor(b!))")
# elementwise 2x + 1, whose out may be its input (declared by the shared alias set)
lib.define("twice(Tensor x) -> Tensor")
lib.define("twice.out(Tensor(a) x, *, Tensor(a!) out) -> Tensor(a!)")
# an op whose out form lives in another namespace (registered with fxforge.register_out_variant)
lib.define("soft(Tensor x) -> Tensor")
other.define("soft_into(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
# an op whose out form is broken: it raises at run time
lib.define("fragile(Tensor x) -> Tensor")
lib.define("fragile.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
# two outputs, implemented for the CPU dispatch key only (a kernel, not a composite): each row of x
# divided by its root mean square, and those root mean squares
lib.define("rms_rows(Tensor x, float eps) -> (Tensor, Tensor)")
lib.define("rms_rows.out(Tensor x, float eps, *, Tensor(a!) normed, Tensor(b!) rms) -> (Tensor(a!), Tensor(b!))")


def _impl(name, fn):
    def run(*args, **kwargs):
        CALLS[name] += 1
        return fn(*args, **kwargs)
    return run


def _scale_add(x, y, a):
    return x * a + y


def _scale_add_out(x, y, a, *, out):
    torch.mul(x, a, out=out)
    return out.add_(y)


def _mm_split(x, w, a):
    p = (x @ w) * a
    return p, p.sum(-1)


def _mm_split_out(x, w, a, *, out0, out1):
    torch.matmul(x, w, out=out0)
    out0.mul_(a)
    torch.sum(out0, -1, out=out1)
    return out0, out1


def _twice_out(x, *, out):
    # elementwise, element i read before element i is written: out may be x itself
    return torch.add(x, x, out=out).add_(1)


def _soft_into(x, *, out):
    return out.copy_(torch.nn.functional.softplus(x))


def _rms_rows(x, eps):
    rms = (x * x).mean(-1).add(eps).sqrt()
    return x / rms.unsqueeze(-1), rms


def _rms_rows_out(x, eps, *, normed, rms):
    torch.mean(x * x, -1, out=rms)
    rms.add_(eps).sqrt_()
    torch.div(x, rms.unsqueeze(-1), out=normed)
    return normed, rms


def _fragile_out(x, *, out):
    raise RuntimeError("fragile.out is broken")


for name, fn in [("scale_add", _scale_add), ("mm_split", _mm_split), ("twice", lambda x: x * 2 + 1),
                 ("soft", torch.nn.functional.softplus), ("fragile", lambda x: x - 1)]:
    lib.impl(name, _impl(name, fn), "CompositeExplicitAutograd")
for name, fn in [("scale_add.out", _scale_add_out), ("mm_split.out", _mm_split_out), ("twice.out", _twice_out),
                 ("fragile.out", _fragile_out)]:
    lib.impl(name, _impl(name, fn), "CompositeExplicitAutograd")
lib.impl("rms_rows", _impl("rms_rows", _rms_rows), "CPU")
lib.impl("rms_rows.out", _impl("rms_rows.out", _rms_rows_out), "CPU")
other.impl("soft_into", _impl("soft_into", _soft_into), "CompositeExplicitAutograd")


@torch.library.register_fake("fxov::scale_add")
def _(x, y, a):
    return torch.empty_like(x)


@torch.library.register_fake("fxov::mm_split")
def _(x, w, a):
    return x.new_empty(x.shape[:-1] + w.shape[-1:]), x.new_empty(x.shape[:-1])


@torch.library.register_fake("fxov::rms_rows")
def _(x, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1])


for _name in ("twice", "soft", "fragile"):
    torch.library.register_fake(f"fxov::{_name}")(lambda x: torch.empty_like(x))


def _scale_add_backward(ctx, grad):
    return grad * ctx.a, grad, None


def _scale_add_setup(ctx, inputs, output):
    ctx.a = inputs[2]


torch.library.register_autograd("fxov::scale_add", _scale_add_backward, setup_context=_scale_add_setup)
