"""Zero-copy cat and pad: bytes moved per call, fxforge vs the ideal vs Inductor.

    python bench/padcat.py [--models] [--out bench/results/padcat.md]

Micro cases (64x48 float32 operands, computed in the graph, codegen torch):

* ``moved``: bytes fxforge's compiled call writes by data movement, measured by
  ``fxforge.testing.CopyCounter`` around the call (equal to ``stats["copy_bytes"]``), with
  zero-copy on and, for comparison, off (``Config(zero_copy=False)``);
* ``ideal moved``: only the pad borders, filled once (each input is written once, by its producer,
  into its place);
* Inductor: ``torch._inductor.metrics.num_bytes_accessed`` of its generated kernels (reads and
  writes), next to the ideal for that figure: the graph's inputs read once and its outputs
  (borders included) written once, plus what a separate extern kernel (mm) must read.  Where
  Inductor is above that, it moves bytes a zero-copy plan would not.

``--models`` adds the corpus models (demo GPT, 2-layer GPT-2 / LLaMA / BERT, inference): bytes
moved per call with zero-copy on and off, and why inputs stayed copies (``refused_zero_copy``),
e.g. LLaMA's rotary ``cat((-x2, x1))`` whose ``x1`` is a slice of the query.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import measure  # noqa: E402

import fxforge  # noqa: E402
from fxforge.testing import CopyCounter  # noqa: E402

F32 = 4
R, C = 64, 48


def mm_bytes(m: int, k: int, n: int) -> int:
    """What an mm reads and writes: (m, k) @ (k, n) -> (m, n)."""
    return (m * k + k * n + m * n) * F32


def cases():
    """name -> (fn, args, ideal moved bytes, ideal bytes accessed).  Ideal accessed counts as
    Inductor does (every kernel, extern ones included, reads each input and writes each output
    once): the graph's inputs read once, each result written once into its place (borders
    included), each mm's own reads and write."""
    a, b, w = torch.randn(R, C), torch.randn(R, C), torch.randn(2 * C, 32)
    ab = 2 * R * C * F32  # reading a and b
    return {
        "cat input also feeds an mm": (lambda a, b, w: (torch.cat([a * 2, b + 1], 1) @ w, (a * 2) @ w[:C]),
                                       (a, b, w), 0, ab + 2 * R * C * F32 + mm_bytes(R, 2 * C, 32) + mm_bytes(R, C, 32)),
        "pad of a cat": (lambda a, b: F.pad(torch.cat([a * 2, b + 1], 1), (1, 2, 3, 0)),
                         (a, b), ((R + 3) * (2 * C + 3) - R * 2 * C) * F32, ab + (R + 3) * (2 * C + 3) * F32),
        "cat of two 2-D pads": (lambda a, b: torch.cat([F.pad(a * 2, (1, 1)), F.pad(b + 1, (0, 2, 1, 0))], 0),
                                (a, b), (R * 2 + (R + 1) * (C + 2) - R * C) * F32,
                                ab + (R * (C + 2) + (R + 1) * (C + 2)) * F32),
        "left pad with an mm consumer": (lambda a, w: F.pad(torch.sin(a), (4, 0)) @ w[:C + 4], (a, w),
                                         R * 4 * F32, R * C * F32 + R * (C + 4) * F32 + mm_bytes(R, C + 4, 32)),
    }


def moved(fn, args, **config) -> tuple[int, dict]:
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="torch", **config))
    g = torch.compile(fn, backend=b, fullgraph=True)
    with torch.no_grad():
        g(*args)
        total, refused = 0, {}
        for c in b.compiled:
            with CopyCounter() as counter:
                c(*args)
            assert counter.bytes == c.stats["copy_bytes"], (counter.calls, c.stats["copy_bytes"])
            total += counter.bytes
            for k, v in c.stats["refused_zero_copy"].items():
                refused[k] = refused.get(k, 0) + v
    return total, refused


def inductor_bytes(fn, args) -> int | None:
    try:
        from torch._inductor import metrics
    except ImportError:
        return None
    torch._dynamo.reset()
    metrics.reset()
    torch._logging.set_logs(inductor_metrics=True)  # Inductor counts bytes only with this log on
    try:
        with torch.no_grad(), measure.fresh_inductor():  # a cached compile would count nothing
            torch.compile(fn, backend="inductor", fullgraph=True)(*args)
    finally:
        torch._logging.set_logs()
    return int(metrics.num_bytes_accessed)


def model_rows() -> list[str]:
    import corpus

    rows = []
    models = corpus.all_models()
    for name in ("demo", "gpt2-2l", "llama-2l", "bert-2l"):
        m = models[name]
        model = m.build().eval()
        kwargs = m.inputs("cpu", False)
        figures = {}
        for zc in (True, False):
            torch._dynamo.reset()
            b = fxforge.backend(fxforge.Config(codegen="torch", zero_copy=zc))
            with torch.no_grad():
                torch.compile(model, backend=b)(**kwargs)
            figures[zc] = (sum(c.stats["copy_bytes"] for c in b.compiled),
                           {k: v for c in b.compiled for k, v in c.stats["refused_zero_copy"].items()})
        on, off = figures[True], figures[False]
        rows.append(f"| {name} | {on[0]:,} | {off[0]:,} | {', '.join(f'{k}: {v}' for k, v in sorted(on[1].items())) or '—'} |")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", action="store_true", help="also the corpus models (needs transformers)")
    p.add_argument("--out", help="write the Markdown there")
    args = p.parse_args(argv)
    lines = ["| case | fxforge moved | zero-copy off | ideal moved | Inductor bytes accessed | ideal accessed | refused |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, (fn, a, ideal, ideal_accessed) in cases().items():
        on, refused = moved(fn, a)
        off, _ = moved(fn, a, zero_copy=False)
        ind = inductor_bytes(fn, a)
        lines.append(f"| {name} | {on:,} | {off:,} | {ideal:,} | {ind:,} | {ideal_accessed:,} | "
                     f"{', '.join(f'{k}: {v}' for k, v in refused.items()) or '—'} |")
    if args.models:
        lines += ["", "| model (inference) | fxforge moved | zero-copy off | inputs left as copies |", "|---|---:|---:|---|"]
        lines += model_rows()
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"<!-- python bench/padcat.py {'--models ' if args.models else ''}--out {args.out}; "
                    "2 shared cores, no GPU, torch 2.13 CPU -->\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
