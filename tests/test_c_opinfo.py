"""OpInfo ops through ``Config(codegen="c")``: every float32 entry of ``op_db`` matches eager.

The C backend's counterpart of ``test_triton_opinfo.py``, whose entry list (``sweep_ops``: each
variant on its own, minus what the OpInfo sweep never runs), sample count (``SWEEP_SAMPLES``) and
comparison (``_close``) it reuses, with ``test_opinfo.py``'s sample helpers.  Each sample runs as
its own small function, compiled with ``fullgraph=True`` and ``debug=True``; samples that
torch.compile itself cannot run (``backend="aot_eager"`` fails or differs from eager) are skipped.
Each entry is classified by the best any of its samples reached:

* ``lowered``: every kernel of the graph is a C kernel;
* ``partial``: C kernels and the ``torch`` backend's extern calls (ATen out= calls for what C
  does not lower: matmuls, arg reductions, ``log``, ATen's composite kernels...) or eager
  fallbacks;
* ``fallback``: no C kernel (torch-extern calls only, or nothing to compute);
* ``skipped``: torch.compile cannot run any of its samples.

A value that differs from eager fails the entry, naming the sample.

``test_c_op_sweep`` runs with ``-m slow`` (the default suite deselects it, pyproject's ``addopts``);
with ``--junitxml`` each case records its kind and per-sample counts.
``python tests/test_c_opinfo.py [names]`` prints the kinds and the counts.
"""

from __future__ import annotations

import collections
import os
import sys

import pytest
import torch

import fxforge
from fxforge.codegen.c import build

cmi = pytest.importorskip("torch.testing._internal.common_methods_invocations", reason="OpInfo needs expecttest")

sys.path.insert(0, os.path.dirname(__file__))
from test_opinfo import Unsupported, build_fn, clone_inputs, flat_tensors, samples  # noqa: E402
from test_triton_opinfo import SWEEP_SAMPLES, _close, sweep_ops  # noqa: E402

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine")

KINDS = ("lowered", "partial", "fallback")  # best first


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


def run_c(op, sample) -> str:
    """The sample's kind (``KINDS``); raises on a mismatch, ``Unsupported`` when torch.compile
    itself cannot run the sample."""
    fn, tensors = build_fn(op.op, sample)
    try:
        exp = fn(*clone_inputs(tensors))
        torch._dynamo.reset()
        ref = torch.compile(fn, backend="aot_eager", fullgraph=True)(*clone_inputs(tensors))
        _close(ref, exp)
    except Exception as e:
        raise Unsupported(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    got = torch.compile(fn, backend=b, fullgraph=True)(*clone_inputs(tensors))
    _close(got, exp)
    assert len(flat_tensors(got)) == len(flat_tensors(exp))
    ran = {k.backend for c in b.compiled for k in c.kernels}
    if "c" not in ran:
        return "fallback"
    return "partial" if ran - {"c"} or any(c.stats["fallback_nodes"] for c in b.compiled) else "lowered"


def classify(op, n: int, tally: dict | None = None) -> str:
    """The best kind any of the first ``n`` float32 samples reached ("skipped": none could run);
    ``tally`` (a Counter), if given, counts every sample's kind.  A mismatch raises, naming the
    sample."""
    kinds, skipped = [], 0
    for i, s in enumerate(samples(op, n)):
        try:
            kinds.append(run_c(op, s))
        except Unsupported:
            skipped += 1
        except Exception as e:
            raise AssertionError(f"{op.name} sample {i} ({describe(s)}): {type(e).__name__}: {e}") from e
    if tally is not None:
        tally.update(kinds + ["skipped"] * skipped)
    return next((k for k in KINDS if k in kinds), "skipped")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(sweep_ops()))
def test_c_op_sweep(name, record_property):
    tally = collections.Counter()
    kind = classify(sweep_ops()[name], SWEEP_SAMPLES, tally=tally)
    record_property("kind", kind)  # in --junitxml: the counts of a sweep run with -n 2
    for k, v in tally.items():
        record_property(f"samples_{k}", v)
    if kind == "skipped":
        pytest.skip("torch.compile cannot run its samples")


def main(names: list[str]) -> None:
    """Classify ``names`` (default: the whole sweep); print per-entry kinds, the counts and the
    mismatches."""
    import time

    counts, tally, failed = collections.Counter(), collections.Counter(), {}
    t0 = time.time()
    names = names or sorted(sweep_ops())
    for name in names:
        try:
            k = classify(sweep_ops()[name], SWEEP_SAMPLES, tally=tally)
        except Exception as e:  # a mismatch or a crash: a bug to report
            k, failed[name] = "FAILED", str(e).splitlines()[0][:400]
        counts[k] += 1
        print(f"{k:9s} {name}", flush=True)
    ops = {sweep_ops()[n].name for n in names}
    variants = sum(1 for n in names if sweep_ops()[n].variant_test_name)
    print(f"{len(names)} entries ({len(ops)} ops, {variants} variants); entries: {dict(counts)}; "
          f"samples: {dict(tally)}; {time.time() - t0:.0f}s")
    for name, why in failed.items():
        print("FAILED", name, why)


if __name__ == "__main__":
    main(sys.argv[1:])
