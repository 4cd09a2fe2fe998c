"""OpInfo pointwise and reduction ops through ``Config(codegen="triton")`` under TRITON_INTERPRET=1.

Each op either runs as Triton kernels and matches eager ("lowered": every node of the graph
in Triton; "partial": some nodes fell back), or falls back cleanly (eager calls, still matching
eager).  Samples torch.compile itself cannot run
(``backend="aot_eager"`` fails or differs) are skipped.  Every Triton kernel generated is also
compiled ahead of time for sm_80 and sm_90.

* ``test_triton_op``: the default subset (``DEFAULT_OPS``, 1 sample each), must be lowered.
* ``test_triton_op_sweep`` (``-m slow``): every float32 entry of ``op_db``, each variant on its
  own (``nn.functional.interpolate.bilinear``...: a miscompile of bilinear upsampling once hid in
  a variant), minus what the OpInfo sweep never runs (``not_applicable``); ``SWEEP_SAMPLES``
  (4) samples each, 7-10 minutes with ``-n 2`` on 2 shared cores.  With ``--junitxml`` each case
  records its kind and per-sample counts; ``python tests/test_triton_opinfo.py [names]`` prints
  the kinds and the entry / op / variant / sample counts.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton import (see test_triton_codegen)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")

import collections  # noqa: E402
import functools  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402


pytest.importorskip("triton")
cmi = pytest.importorskip("torch.testing._internal.common_methods_invocations", reason="OpInfo needs expecttest")

sys.path.insert(0, os.path.dirname(__file__))
from test_opinfo import Unsupported, build_fn, clone_inputs, flat_tensors, not_applicable, op_id, samples  # noqa: E402
from triton_helpers import run_compiled, triton_kernels  # noqa: E402


@functools.lru_cache(maxsize=None)
def sweep_ops() -> dict[str, object]:
    """Every float32 entry of ``op_db``, each variant on its own (``op_id``: ``name.variant``),
    minus those the OpInfo sweep never runs (``not_applicable``)."""
    out = {}
    for op in cmi.op_db:
        if torch.float32 in op.supported_dtypes("cpu") and not_applicable(op) is None:
            out[op_id(op)] = op
    return out


# Samples per entry in the sweep (-m slow); FXFORGE_SWEEP_SAMPLES overrides it.
SWEEP_SAMPLES = int(os.environ.get("FXFORGE_SWEEP_SAMPLES", "4"))


def _close(got, exp) -> None:
    g, e = flat_tensors(got), flat_tensors(exp)
    assert len(g) == len(e)
    for a, b in zip(g, e):
        if isinstance(b, torch.Tensor):
            tol = {} if b.dtype in (torch.float16, torch.bfloat16) else dict(atol=2e-5, rtol=2e-5)
            torch.testing.assert_close(a, b, equal_nan=True, check_stride=False, **tol)
        else:
            assert a == b or (a != a and b != b)


KINDS = ("lowered", "partial", "fallback")  # best first


def reference(fn, tensors):
    """Eager's result of ``fn``, once torch.compile itself is shown to run it (``aot_eager``
    matches eager); ``Unsupported`` otherwise."""
    try:
        exp = fn(*clone_inputs(tensors))
        torch._dynamo.reset()
        ref = torch.compile(fn, backend="aot_eager", fullgraph=True)(*clone_inputs(tensors))
        _close(ref, exp)
    except Exception as e:
        raise Unsupported(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    return exp


def describe(sample) -> str:
    """A sample's arguments in one line: tensors as dtype[shape], the rest as written."""

    def one(v) -> str:
        if isinstance(v, torch.Tensor):
            s = f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
            return s if v.is_contiguous() else s + f"(strides {list(v.stride())})"
        if isinstance(v, (list, tuple)):
            inner = ", ".join(one(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner})"
        return repr(v)

    args = [one(sample.input)] + [one(a) for a in sample.args] + [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(args)


def classify_with(run, op, n: int, dtype=torch.float32, tally: dict | None = None) -> str:
    """The best kind (``KINDS``) ``run(op, sample)`` gave any of the first ``n`` samples
    ("skipped": none could run); ``tally`` (a Counter), if given, counts every sample's kind.
    A mismatch raises, naming the sample."""
    kinds, skipped = [], 0
    for i, s in enumerate(samples(op, n, dtype)):
        try:
            kinds.append(run(op, s))
        except Unsupported:
            skipped += 1
        except Exception as e:
            raise AssertionError(f"{op.name} sample {i} ({describe(s)}): {type(e).__name__}: {e}") from e
    if tally is not None:
        tally.update(kinds + ["skipped"] * skipped)
    return next((k for k in KINDS if k in kinds), "skipped")


def sweep_case(classify, name: str, record_property) -> None:
    """One sweep entry (``-m slow``): its kind and per-sample counts recorded (in --junitxml: the
    counts of a sweep run with -n 2); skipped where torch.compile cannot run its samples."""
    tally = collections.Counter()
    kind = classify(sweep_ops()[name], SWEEP_SAMPLES, tally=tally)
    record_property("kind", kind)
    for k, v in tally.items():
        record_property(f"samples_{k}", v)
    if kind == "skipped":
        pytest.skip("torch.compile cannot run its samples")


def sweep_main(classify, names: list[str], known_failures: dict | None = None) -> None:
    """Classify ``names`` (default: the whole sweep) and print per-entry kinds, the counts and the
    failures (``xfail`` for those in ``known_failures``)."""
    import time

    known = known_failures or {}
    counts, tally, failed = collections.Counter(), collections.Counter(), {}
    t0 = time.time()
    names = names or sorted(sweep_ops())
    for name in names:
        try:
            k = classify(sweep_ops()[name], SWEEP_SAMPLES, tally=tally)
        except Exception as e:  # a mismatch or a crash: a bug to report (unless already known)
            k = "xfail" if name in known else "FAILED"
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
        counts[k] += 1
        print(f"{k:9s} {name}", flush=True)
    ops = {sweep_ops()[n].name for n in names}
    variants = sum(1 for n in names if sweep_ops()[n].variant_test_name)
    print(f"{len(names)} entries ({len(ops)} ops, {variants} variants); entries: {dict(counts)}; "
          f"samples: {dict(tally)}; {time.time() - t0:.0f}s")
    for name, why in failed.items():
        print("xfail" if name in known else "FAILED", name, why)


def run_triton(op, sample) -> str:
    """'lowered' (Triton kernels ran), 'partial' or 'fallback'; raises on a mismatch,
    ``Unsupported`` when torch.compile itself cannot run the sample."""
    fn, tensors = build_fn(op.op, sample)
    exp = reference(fn, tensors)
    b, got = run_compiled(fn, *clone_inputs(tensors))
    _close(got, exp)
    if not triton_kernels(b):
        return "fallback"
    return "partial" if any(c.stats["fallback_nodes"] for c in b.compiled) else "lowered"


def classify(op, n: int, dtype=torch.float32, tally: dict | None = None) -> str:
    return classify_with(run_triton, op, n, dtype, tally)


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


# Sweep entries that fail for a reason outside the Triton backend (strict: a fix shows up as XPASS).
KNOWN_FAILURES = {
    "take": "compile error, not a wrong value: torch's `take` decomposition (in the core table every "
            "decompose='core' backend uses) indexes with a 0-d index tensor, which fake tracing turns into "
            "a data-dependent int (GuardOnDataDependentSymNode); samples 3-4 (`take(x0d, i0d)`). "
            "Config(codegen='torch', decompose='core') fails the same way",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(SWEEP_SAMPLES >= 3, strict=True, reason=KNOWN_FAILURES[n]))
    if n in KNOWN_FAILURES else n
    for n in sorted(sweep_ops())])
def test_triton_op_sweep(name, record_property):
    sweep_case(classify, name, record_property)


if __name__ == "__main__":
    sweep_main(classify, sys.argv[1:], KNOWN_FAILURES)
