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

import os
import sys

import pytest
import torch

import fxforge
from fxforge.codegen.c import build

cmi = pytest.importorskip("torch.testing._internal.common_methods_invocations", reason="OpInfo needs expecttest")

sys.path.insert(0, os.path.dirname(__file__))
from test_opinfo import build_fn, clone_inputs, flat_tensors  # noqa: E402
from test_triton_opinfo import _close, classify_with, reference, sweep_case, sweep_main, sweep_ops  # noqa: E402

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine")


def run_c(op, sample) -> str:
    """The sample's kind (``KINDS``); raises on a mismatch, ``Unsupported`` when torch.compile
    itself cannot run the sample."""
    fn, tensors = build_fn(op.op, sample)
    exp = reference(fn, tensors)
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
    return classify_with(run_c, op, n, tally=tally)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(sweep_ops()))
def test_c_op_sweep(name, record_property):
    sweep_case(classify, name, record_property)


if __name__ == "__main__":
    sweep_main(classify, sys.argv[1:])
