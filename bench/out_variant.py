"""Out-variant lowering: allocations, arena bytes and measured peak per call, fxforge vs eager vs Inductor.

    python bench/out_variant.py [--out bench/results/out_variant.md]

Programs (the custom operators of tests/out_variant_ops.py, Python implementations):

* ``chain4``: four single-output ``fxov::scale_add`` calls in a row on 256x256 float32, the
  result returned;
* ``mlp_split``: a two-layer MLP whose matmuls are the two-output ``fxov::mm_split`` (product
  and its row sums), 64x128 -> 256 -> 128.

For each contender, one warm call is measured with ``torch.profiler`` (``measure.peak_bytes``):
``allocations`` is the number of allocator events that allocate (in brackets those of 1 KiB or
more: buffers, not the 0-dim tensors ops wrap Python scalars in), ``allocated`` their bytes,
``peak`` the peak of their running sum (outputs included), plus fxforge's planned ``arena_bytes``.  Each program is also
compiled with ``dynamic=True`` and called at three batch sizes: ``dynamic`` says whether the
contender compiled and matched eager, and how many graphs it compiled.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import measure  # noqa: E402
import out_variant_ops  # noqa: E402,F401  (registers fxov::*)

import fxforge  # noqa: E402

fxov = torch.ops.fxov


def chain4(x, y):
    h = x
    for a in (0.5, 1.5, -2.0, 3.0):
        h = fxov.scale_add(h, y, a)
    return h


def mlp_split(x, w1, w2):
    p, s = fxov.mm_split(x, w1, 0.5)
    h = torch.nn.functional.gelu(p) * s.unsqueeze(-1)
    p2, s2 = fxov.mm_split(h, w2, 1.0)
    return p2 + s2.unsqueeze(-1)


def inputs(name: str, batch: int):
    g = torch.Generator().manual_seed(batch)
    if name == "chain4":
        return torch.randn(batch, 256, generator=g), torch.randn(batch, 256, generator=g)
    return (torch.randn(batch, 128, generator=g), torch.randn(128, 256, generator=g) / 16,
            torch.randn(256, 128, generator=g) / 16)


PROGRAMS = {"chain4": (chain4, 256), "mlp_split": (mlp_split, 64)}


def contender(name: str):
    """(callable maker, fxforge backend or None)."""
    if name == "eager":
        return (lambda fn, dynamic: fn), None
    if name == "inductor":
        return (lambda fn, dynamic: torch.compile(fn, backend="inductor", fullgraph=True, dynamic=dynamic)), None
    b = fxforge.backend(fxforge.Config())
    return (lambda fn, dynamic: torch.compile(fn, backend=b, fullgraph=True, dynamic=dynamic)), b


def measure_program(prog: str, who: str) -> dict:
    fn, batch = PROGRAMS[prog]
    torch._dynamo.reset()
    make, b = contender(who)
    row: dict = {"program": prog, "contender": who}
    f = make(fn, False)
    args = inputs(prog, batch)
    with torch.no_grad():
        out = f(*args)
        row["max_abs_err"] = measure.max_abs_err(out, fn(*args))
        m = measure.peak_bytes(lambda: f(*args))
    row["peak_bytes"] = m["peak_bytes"]
    row["allocations"] = m["allocations"]
    row["large_allocations"] = m["large_allocations"]
    row["allocated_bytes"] = m["allocated_bytes"]
    if b is not None:
        row["arena_bytes"] = sum(c.stats["arena_bytes"] for c in b.compiled)
        row["fallback_nodes"] = sum(c.stats["fallback_nodes"] for c in b.compiled)
    # dynamic shapes: one compile for three batch sizes?
    torch._dynamo.reset()
    make, b = contender(who)
    try:
        f = make(fn, True)
        errs = []
        with torch.no_grad():
            for bs in (batch // 2 + 1, batch, batch * 2 - 3):
                a = inputs(prog, bs)
                errs.append(measure.max_abs_err(f(*a), fn(*a)))
        row["dynamic"] = "ok" if max(errs) < 1e-3 else f"mismatch {max(errs):.2g}"
        if b is not None:
            row["dynamic_graphs"] = len(b.compiled)
    except Exception as e:  # a contender that cannot compile it: the figure is that it failed
        row["dynamic"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    return row


def table(rows: list[dict]) -> str:
    head = ("| program | contender | allocations / call (>= 1 KiB) | allocated KiB / call | peak KiB (profiler) "
            "| arena KiB | max abs err | dynamic=True, 3 sizes |")
    out = [head, "|" + "---|" * 8]
    for r in rows:
        arena = f"{r['arena_bytes'] / 1024:.1f}" if "arena_bytes" in r else "—"
        dyn = r["dynamic"] + (f" ({r['dynamic_graphs']} graph)" if "dynamic_graphs" in r else "")
        out.append(f"| {r['program']} | {r['contender']} | {r['allocations']} ({r['large_allocations']}) | "
                   f"{r['allocated_bytes'] / 1024:.1f} | {r['peak_bytes'] / 1024:.1f} | {arena} | "
                   f"{r['max_abs_err']:.1e} | {dyn} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the Markdown table there")
    p.add_argument("--contenders", nargs="+", default=["eager", "fxforge", "inductor"])
    args = p.parse_args(argv)
    rows = [measure_program(prog, who) for prog in PROGRAMS for who in args.contenders]
    text = table(rows)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(f"<!-- python bench/out_variant.py --out {args.out} ; fxforge at {fxforge.__file__} -->\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
