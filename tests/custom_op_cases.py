"""Custom ops written as users write them (several ATen calls in an opaque op), with candidate
decompositions of which some are planted wrong: shared by tests/test_custom_ops.py and its
subprocesses (importable by name)."""

from __future__ import annotations

import torch

import fxforge


@torch.library.custom_op("fxtest::rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


@rmsnorm.register_fake
def _(x, w, eps=1e-6):
    return torch.empty_like(x)


def rms_direct(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rms_forgets_weight(x, w, eps=1e-6):  # planted wrong
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_chunked(x, w, eps=1e-6, chunks=2):
    parts = [c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps) for c in x.chunk(chunks, 0)]
    return torch.cat(parts) * w


@torch.library.custom_op("fxtest::silu_mul", mutates_args=())
def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


@silu_mul.register_fake
def _(gate, up):
    return torch.empty_like(gate)


def _silu_mul_backward(ctx, grad):
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * up * s * (1 + gate * (1 - s)), grad * gate * s


def _silu_mul_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


silu_mul.register_autograd(_silu_mul_backward, setup_context=_silu_mul_setup)


def silu_mul_direct(gate, up):
    return gate * torch.sigmoid(gate) * up


def silu_mul_sigmoid_only(gate, up):  # planted wrong: sigmoid, not silu
    return torch.sigmoid(gate) * up


def silu_mul_detached(gate, up):  # right values, wrong gradient (none flows to the gate's sigmoid)
    return gate * torch.sigmoid(gate).detach() * up


def register(min_speedup: float = 1.0) -> None:
    fxforge.register_custom_op_autotuning(rmsnorm, [fxforge.CustomOpConfig(rms_direct),
                                                    fxforge.CustomOpConfig(rms_forgets_weight),
                                                    fxforge.CustomOpConfig(rms_chunked, chunks=2)],
                                          min_speedup=min_speedup)
    fxforge.register_custom_op_autotuning(silu_mul, [fxforge.CustomOpConfig(silu_mul_direct),
                                                     fxforge.CustomOpConfig(silu_mul_sigmoid_only),
                                                     fxforge.CustomOpConfig(silu_mul_detached)],
                                          min_speedup=min_speedup)


class Block(torch.nn.Module):
    """RMSNorm over a residual add, then a SwiGLU MLP: the ops of a LLaMA block's second half."""

    def __init__(self, d: int = 128, hidden: int = 256, ops: bool = True):
        super().__init__()
        # ops=False: the same block through plain ATen calls (an eager reference for gradients:
        # rmsnorm has no gradient formula of its own)
        self.rms, self.swiglu = (rmsnorm, silu_mul) if ops else (rms_direct, silu_mul_direct)
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(d))
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x, r):
        h = self.rms(x + r, self.w)
        return h + self.down(self.swiglu(self.gate(h), self.up(h)))


@torch.library.custom_op("fxtest::slow_norm", mutates_args=())
def slow_norm(x: torch.Tensor) -> torch.Tensor:
    """A row norm whose own implementation wastes time at every size (50 copies)."""
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    for _ in range(50):
        out = out.clone()
    return out


@slow_norm.register_fake
def _(x):
    return torch.empty_like(x)


def norm_fast_then_slow(x):
    """Right at every size; fast up to 16 rows, far slower than the op above (2,000 copies)."""
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    if x.shape[0] > 16:
        for _ in range(2000):
            out = out.clone()
    return out


@torch.library.custom_op("fxtest::relu2", mutates_args=())
def relu2(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(min=0) * 2


@relu2.register_fake
def _(x):
    return torch.empty_like(x)


def twice(x):  # relu2 where x >= 0 only: right on the inputs input_gen_fns makes, wrong on others
    return x * 2
