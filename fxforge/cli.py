"""``fxforge`` command line: ``fxforge demo | report | bench``.

    fxforge demo [--json PATH]      compile a small GPT, check it against eager, print the table
                                    (exit 1 when outputs or gradients do not match eager)
    fxforge report OUT.html         compile a small model, write the HTML report of each graph
    fxforge bench [--gpu] [--suite PATH]
                                    run the benchmark suite (bench/run.py of the checkout)
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    return demo.main(attention=args.attention, batch=args.batch, calls=args.calls, budget_s=args.budget, json_path=args.json)


def _report(args: argparse.Namespace) -> int:
    """Compile the demo GPT (inference + one training step) and write one report per graph."""
    import torch

    import fxforge
    from .demo import GPT, GPTConfig

    cfg = GPTConfig(attention=args.attention)
    torch.manual_seed(0)
    model = GPT(cfg)
    b = fxforge.backend(fxforge.Config())
    compiled = torch.compile(model, backend=b, fullgraph=True)
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    with torch.no_grad():
        compiled(idx)
    compiled(idx, torch.randint(0, cfg.vocab, (2, cfg.seq))).backward()
    root, ext = os.path.splitext(args.path)
    ext = ext or ".html"
    seen: dict[str, int] = {}
    for c in b.compiled:
        kind = str(c.stats.get("graph", "graph"))
        seen[kind] = seen.get(kind, 0) + 1
        path = f"{root}-{kind}{ext}" if seen[kind] == 1 else f"{root}-{kind}{seen[kind]}{ext}"
        c.write_report(path)
        print(f"wrote {path}  ({c!r})")
    for kind, reason in b.failures:
        print(f"{kind} graph not compiled: {reason}", file=sys.stderr)
    return 0 if b.compiled and not b.failures else 1


def find_bench(start: str) -> str | None:
    """``bench/run.py`` of the checkout: next to the package, else under ``start``."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in (pkg_root, start):
        path = os.path.join(root, "bench", "run.py")
        if os.path.isfile(path):
            return path
    return None


def _bench(args: argparse.Namespace) -> int:
    path = args.suite or find_bench(os.getcwd())
    if path is None or not os.path.isfile(path):
        print(
            "fxforge bench: the benchmark suite is bench/run.py of an fxforge checkout; "
            f"{'there is no file ' + path if path else 'none was found next to the package or under the working directory'} "
            "(pass --suite PATH). Nothing was run.",
            file=sys.stderr,
        )
        return 2
    rest = list(args.rest)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    argv = [path] + (["--gpu"] if args.gpu else []) + rest
    print(f"fxforge bench: running {' '.join(argv)}", flush=True)
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fxforge", description="FX-based compiler passes for PyTorch.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{demo,report,bench}")

    d = sub.add_parser("demo", help="compile a small GPT, check it against eager, print stats and timings")
    d.add_argument("--attention", choices=("matmul", "sdpa"), default="matmul",
                   help="attention written as matmul/softmax (default) or F.scaled_dot_product_attention")
    d.add_argument("--batch", type=int, default=4, help="batch size (default 4)")
    d.add_argument("--calls", type=int, default=30, help="most timed calls per measurement (default 30)")
    d.add_argument("--budget", type=float, default=6.0,
                   help="seconds one timing measurement may take before it stops early (default 6)")
    d.add_argument("--json", metavar="PATH", help="also write every figure (run_demo's dict) to PATH as JSON")
    d.set_defaults(func=_demo)

    r = sub.add_parser("report", help="write the HTML report of every graph of the demo GPT")
    r.add_argument("path", help="output file; one file per graph: PATH-inference.html, PATH-forward.html, ...")
    r.add_argument("--attention", choices=("matmul", "sdpa"), default="matmul")
    r.set_defaults(func=_report)

    b = sub.add_parser("bench", help="run the benchmark suite (bench/run.py)")
    b.add_argument("--gpu", action="store_true", help="run the GPU benchmarks (on a machine with CUDA)")
    b.add_argument("--suite", metavar="PATH", help="the suite's run.py (default: bench/run.py of the checkout)")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="further arguments passed to bench/run.py")
    b.set_defaults(func=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
