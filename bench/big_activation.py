"""A large activation at every thread count: eager, fxforge and Inductor, inference.

A layer norm over a residual add, then ``relu(h * 2 + 1) - sigmoid(y)``, on a BERT-base-sized
activation (64 x 512 x 768 float32: 96 MiB a tensor).  One process; for each thread count the
three contenders' calls are interleaved (``measure.interleaved_medians``).

    python bench/big_activation.py                 # threads 1 and all of this machine's cores
    python bench/big_activation.py --threads 1 2 4 --shape 16 512 768
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import measure  # noqa: E402


def block(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    h = F.layer_norm(x + y, (x.shape[-1],), w, b)
    return torch.relu(h * 2 + 1) - torch.sigmoid(y)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    p.add_argument("--shape", type=int, nargs=3, default=(64, 512, 768))
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--budget", type=float, default=30.0, help="seconds of timing per thread count")
    args = p.parse_args(argv)

    import fxforge

    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(*args.shape, generator=g) for _ in range(2))
    w, b = torch.randn(args.shape[-1], generator=g), torch.randn(args.shape[-1], generator=g)
    fns = {"eager": block, "fxforge": torch.compile(block, backend="fxforge"),
           "inductor": torch.compile(block, backend="inductor")}
    rows = []
    with torch.no_grad():
        want = block(x, y, w, b)
        for name in ("fxforge", "inductor"):
            torch.testing.assert_close(fns[name](x, y, w, b), want, rtol=1e-4, atol=1e-4)
        for threads in args.threads:
            torch.set_num_threads(threads)
            t = measure.interleaved_medians({k: (lambda f=f: f(x, y, w, b)) for k, f in fns.items()},
                                            calls=args.calls, budget_s=args.budget)
            ms = {k: v["median_s"] * 1e3 for k, v in t.items()}
            rows.append({"threads": threads, **ms})
            print(f"threads {threads}: eager {ms['eager']:.1f} ms, fxforge {ms['fxforge']:.1f} ms, "
                  f"Inductor {ms['inductor']:.1f} ms, fxforge/Inductor {ms['fxforge'] / ms['inductor']:.2f}, "
                  f"fxforge/eager {ms['fxforge'] / ms['eager']:.2f}", flush=True)
    return rows


if __name__ == "__main__":
    main()
