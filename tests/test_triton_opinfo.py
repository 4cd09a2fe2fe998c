"""OpInfo pointwise and reduction ops through ``Config(codegen="triton")`` under TRITON_INTERPRET=1.

Each op either runs as Triton kernels and matches eager ("lowered": every node of the graph
in Triton; "partial": some nodes fell back), or falls back cleanly (eager calls, still matching
eager).  Samples torch.compile itself cannot run
(``backend="aot_eager"`` fails or differs) are skipped.  Every Triton kernel generated is also
compiled ahead of time for sm_80 and sm_90.

* ``test_triton_op``: the default subset (``DEFAULT_OPS``, 1 sample each), must be lowered.
* ``test_triton_op_sweep`` (``-m slow``): every float32 entry of ``unary_ufuncs``,
  ``binary_ufuncs`` and ``reduction_ops``, 2 samples; ``python tests/test_triton_opinfo.py``
  prints the lowered / fallback / skipped counts.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton import (see test_triton_codegen)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")

import functools  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402


pytest.importorskip("triton")
cmi = pytest.importorskip("torch.testing._internal.common_methods_invocations", reason="OpInfo needs expecttest")

from fxforge.codegen.triton.testing import run_compiled, triton_kernels  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from test_opinfo import Unsupported, build_fn, clone_inputs, flat_tensors, not_applicable, op_id, samples  # noqa: E402


# Pointwise and reduction-shaped entries of op_db outside the ufunc / reduction lists.
EXTRA_OPS = {
    "where", "clamp", "nn.functional.gelu", "nn.functional.silu", "nn.functional.hardtanh",
    "nn.functional.relu", "nn.functional.relu6", "nn.functional.leaky_relu", "nn.functional.mish",
    "nn.functional.softplus", "nn.functional.hardsigmoid", "nn.functional.hardswish", "nn.functional.logsigmoid",
    "softmax", "log_softmax", "nn.functional.layer_norm", "var_mean", "std_mean",
    "max.reduction_with_dim", "min.reduction_with_dim", "max.reduction_no_dim", "min.reduction_no_dim",
    "logsumexp", "addcmul", "addcdiv", "lerp", "fill", "full_like", "ones_like", "zeros_like", "clone",
}


@functools.lru_cache(maxsize=None)
def sweep_ops() -> dict[str, object]:
    out = {}
    for op in list(cmi.unary_ufuncs) + list(cmi.binary_ufuncs) + list(cmi.reduction_ops) + list(cmi.op_db):
        if op.name.startswith("_refs") or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        if op in cmi.op_db and op_id(op) not in EXTRA_OPS and not (
            op in cmi.unary_ufuncs or op in cmi.binary_ufuncs or op in cmi.reduction_ops
        ):
            continue
        if not_applicable(op) is None:
            out[op_id(op)] = op
    return out


def _close(got, exp) -> None:
    g, e = flat_tensors(got), flat_tensors(exp)
    assert len(g) == len(e)
    for a, b in zip(g, e):
        if isinstance(b, torch.Tensor):
            tol = {} if b.dtype in (torch.float16, torch.bfloat16) else dict(atol=2e-5, rtol=2e-5)
            torch.testing.assert_close(a, b, equal_nan=True, check_stride=False, **tol)
        else:
            assert a == b or (a != a and b != b)


def run_triton(op, sample) -> str:
    """'lowered' (Triton kernels ran) or 'fallback'; raises on a mismatch, ``Unsupported`` when
    torch.compile itself cannot run the sample."""
    fn, tensors = build_fn(op.op, sample)
    try:
        exp = fn(*clone_inputs(tensors))
        torch._dynamo.reset()
        ref = torch.compile(fn, backend="aot_eager", fullgraph=True)(*clone_inputs(tensors))
        _close(ref, exp)
    except Exception as e:
        raise Unsupported(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    b, got = run_compiled(fn, *clone_inputs(tensors))
    _close(got, exp)
    if not triton_kernels(b):
        return "fallback"
    return "partial" if any(c.stats["fallback_nodes"] for c in b.compiled) else "lowered"


def classify(op, n: int, dtype=torch.float32) -> str:
    kinds, skipped = [], []
    for s in samples(op, n, dtype):
        try:
            kinds.append(run_triton(op, s))
        except Unsupported as e:
            skipped.append(str(e))
    if not kinds:
        return "skipped"
    for k in ("lowered", "partial", "fallback"):  # the best any sample reached
        if k in kinds:
            return k


# float32 ops lowered to Triton and matching eager with their first sample (kept small: the
# interpreter is slow); the full list is swept with -m slow.
DEFAULT_OPS = [
    "abs", "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "div.trunc_rounding",
    "floor_divide", "remainder", "fmod", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh",
    "sigmoid", "nn.functional.relu", "nn.functional.gelu", "where", "eq", "lt", "ge", "logical_and",
    "logical_not", "maximum", "minimum", "clamp", "pow", "sign", "reciprocal", "expm1", "log1p",
    "sum", "mean", "amax", "amin", "prod", "argmax", "argmin", "var", "std", "any", "all",
]


def test_default_ops_exist():
    assert set(DEFAULT_OPS) <= set(sweep_ops()), set(DEFAULT_OPS) - set(sweep_ops())


@pytest.mark.parametrize("name", DEFAULT_OPS)
def test_triton_op(name):
    op = sweep_ops()[name]
    assert classify(op, 1) == "lowered"


# fp16/bf16: computed in fp32, rounded once like eager.
LOW_PRECISION_OPS = ["add", "mul", "div.no_rounding_mode", "exp", "sigmoid", "nn.functional.gelu", "lt", "sum", "amax", "mean"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", LOW_PRECISION_OPS)
def test_triton_op_low_precision(name, dtype):
    op = sweep_ops()[name]
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"{dtype} not supported on CPU by {name}")
    assert classify(op, 1, dtype) == "lowered"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(sweep_ops()))
def test_triton_op_sweep(name):
    if classify(sweep_ops()[name], 2) == "skipped":
        pytest.skip("torch.compile cannot run its samples")


if __name__ == "__main__":
    import collections
    import time

    counts = collections.Counter()
    failed = {}
    t0 = time.time()
    names = sorted(sweep_ops()) if len(sys.argv) < 2 else sys.argv[1:]
    for name in names:
        try:
            k = classify(sweep_ops()[name], 2)
        except Exception as e:  # a mismatch or a crash: a bug to report
            k = "FAILED"
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        counts[k] += 1
        print(f"{k:9s} {name}", flush=True)
    print(dict(counts), f"{time.time() - t0:.0f}s")
    for k, v in failed.items():
        print("FAILED", k, v)
