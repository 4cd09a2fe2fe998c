"""``fxforge`` command line (also ``python -m fxforge``): ``fxforge demo | report | bench | package | run``.

    fxforge demo [--json PATH] [--report PATH]
                                    compile a small GPT, check it against eager, print the table,
                                    write the HTML report of its graphs (exit 1 on a mismatch)
    fxforge report MODEL.pt2 [-o OUT.html] [--codegen NAME] [--inputs FILE]
                                    compile a program saved with torch.export.save, write its
                                    HTML report; with sample inputs, check it against the program
    fxforge report MODEL.fxpkg [-o OUT.html]
                                    print a package's members and memory plan, write its report
    fxforge package MODEL.pt2 -o MODEL.fxpkg [--cpu-isa LEVEL ...] [--codegen NAME] [--no-weights]
                                    compile a program into one deployable file (fxforge.package)
    fxforge run MODEL.fxpkg --inputs FILE [--calls N]
                                    load a package (no compiler needed), run it on the inputs,
                                    print the output shapes and the load and call times
    fxforge bench [--gpu] [--suite PATH]
                                    run the benchmark suite (bench/run.py of the checkout)

Compiles print one line per graph with its time on stderr (``demo``: on a terminal only).  A
missing, corrupt or wrong-kind file is one line on stderr and exit status 2, no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import warnings
from typing import Any, Callable


class CliError(Exception):
    """A one-line message for stderr, and the exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _progress(enabled: bool) -> Callable[[Any], None]:
    def show(c: Any) -> None:
        if enabled:
            s = c.stats
            print(f"fxforge: compiled {s.get('graph', 'graph')} graph: {s.get('nodes_in', 0)} nodes -> "
                  f"{s.get('kernels', 0)} kernels, {s.get('fallback_nodes', 0)} fallbacks, "
                  f"{s.get('compile_seconds', 0.0):.2f} s", file=sys.stderr, flush=True)
    return show


def _size(path: str) -> str:
    from ..report.memory import fmt_bytes

    return fmt_bytes(os.path.getsize(path))


# --------------------------------------------------------------------------- demo


def _demo(args: argparse.Namespace) -> int:
    import json

    from . import demo
    from ..report.hooks import watch

    compiled: list[Any] = []
    show = _progress(sys.stderr.isatty())

    def seen(c: Any) -> None:
        compiled.append(c)
        show(c)

    with watch(seen):
        r = demo.run_demo(demo.GPTConfig(attention=args.attention), batch=args.batch, calls=args.calls, budget_s=args.budget)
    print(demo.format_table(r), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=1)
    if compiled and args.report:
        from ..report.html import write_report

        kinds = ", ".join(str(c.stats.get("graph")) for c in compiled)
        write_report(compiled, args.report, title="fxforge demo: " + kinds + " graphs of the demo GPT")
        print(f"report: {os.path.abspath(args.report)} ({kinds} graphs, {_size(args.report)}; open it in a browser)")
    return 0 if r["ok"] else 1


# --------------------------------------------------------------------------- report


def _why_not_a_program(path: str, cause: str) -> str:
    import zipfile

    if not zipfile.is_zipfile(path):
        return "not a zip archive: corrupt or truncated?"
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names) and not any("archive_format" in n for n in names):
        return "it holds a torch.save checkpoint; save programs with torch.export.save"
    return cause.split(". ")[0].rstrip(".")


def load_program(path: str):
    """The ExportedProgram saved at ``path``, or CliError with why not (one line)."""
    if not os.path.exists(path):
        raise CliError(f"no such file: {path}")
    if os.path.isdir(path):
        raise CliError(f"{path} is a directory, not a program saved with torch.export.save")
    import torch
    from torch.export import ExportedProgram

    # torch.export.load logs a traceback (WARNING) before raising a generic error: keep the
    # cause for the message, print neither
    caught: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record)

    lg = logging.getLogger("torch.export")
    saved = (lg.handlers[:], lg.propagate)
    lg.handlers[:] = [Keep()]
    lg.propagate = False
    try:
        ep = torch.export.load(path)
    except Exception as e:
        causes = [r.exc_info[1] for r in caught if r.exc_info and r.exc_info[1] is not None]
        why = _why_not_a_program(path, _first_line(causes[-1] if causes else e))
        raise CliError(f"{path} is not a program saved with torch.export.save ({why})") from None
    finally:
        lg.handlers[:], lg.propagate = saved
    if not isinstance(ep, ExportedProgram):
        raise CliError(f"{path} holds a {type(ep).__name__}, not an ExportedProgram")
    return ep


def load_inputs(path: str) -> tuple[tuple, dict]:
    """Sample inputs saved with ``torch.save``: a tuple/list of positional arguments, a dict of
    keyword arguments, an ``(args, kwargs)`` pair, or one tensor (``weights_only`` load)."""
    if not os.path.isfile(path):
        raise CliError(f"no such inputs file: {path}")
    import torch

    try:
        obj = torch.load(path, weights_only=True)
    except Exception as e:
        raise CliError(f"{path} is not an inputs file written by torch.save ({_first_line(e)})") from None
    if isinstance(obj, (tuple, list)) and len(obj) == 2 and isinstance(obj[0], (tuple, list)) and isinstance(obj[1], dict):
        return tuple(obj[0]), dict(obj[1])
    if isinstance(obj, dict):
        return (), obj
    if isinstance(obj, (tuple, list)):
        return tuple(obj), {}
    return (obj,), {}


def _max_abs_err(got: Any, want: Any) -> float | None:
    """Largest absolute difference over the tensors of two outputs (None: structures differ)."""
    import torch
    import torch.utils._pytree as pytree

    a, b = pytree.tree_leaves(got), pytree.tree_leaves(want)
    if len(a) != len(b):
        return None
    err = 0.0
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape:
                return None
            if x.numel():
                err = max(err, (x.double() - y.double()).abs().nan_to_num(nan=float("inf")).max().item())
    return err


def _check(c: Any, ep: Any, inputs: tuple[tuple, dict]) -> tuple[bool, str]:
    """Run the compiled program and ``ep.module()`` on the sample inputs; (ok, what happened)."""
    import torch

    args, kwargs = inputs
    try:
        got = c(*args, **kwargs)
        want = ep.module()(*args, **kwargs)
    except Exception as e:
        return False, f"running on the sample inputs failed: {_first_line(e)}"
    err = _max_abs_err(got, want)
    if err is None:
        return False, "outputs differ in structure from ep.module()'s"
    tol = 1e-3 if any(isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16)
                      for t in torch.utils._pytree.tree_leaves(want)) else 1e-4
    ok = err <= tol * 10
    return ok, f"outputs {'match' if ok else 'DO NOT match'} ep.module() on the sample inputs (max abs err {err:.2e})"


def _config(args: argparse.Namespace):
    import fxforge

    try:
        return fxforge.Config(codegen=args.codegen)
    except ValueError as e:
        raise CliError(str(e).splitlines()[0]) from None


def _output(args: argparse.Namespace, suffix: str) -> str:
    """``-o``, else the model's file name with ``suffix``, in the working directory."""
    return args.output or os.path.splitext(os.path.basename(args.model))[0] + suffix


def _is_package(path: str) -> bool:
    import zipfile

    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return "manifest.json" in z.namelist()


def _report(args: argparse.Namespace) -> int:
    import fxforge
    from ..report.hooks import watch
    from ..report.html import write_report

    if os.path.isfile(args.model) and _is_package(args.model):
        return _package_report(args)
    ep = load_program(args.model)
    if args.inputs:
        inputs: tuple[tuple, dict] | None = load_inputs(args.inputs)
        source = f"inputs from {args.inputs}"
    else:
        ex = getattr(ep, "example_inputs", None)
        inputs = (tuple(ex[0]), dict(ex[1])) if ex is not None else None
        source = "the program's example inputs"
    config = _config(args)
    out = _output(args, ".html")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        with watch(_progress(True)):
            try:
                c = fxforge.compile_exported(ep, config)
            except Exception as e:
                raise CliError(f"could not compile {args.model}: {_first_line(e)}", 1) from None
        ok, note = True, "no sample inputs (the program has no example inputs; pass --inputs FILE): not run"
        if inputs is not None:
            ok, note = _check(c, ep, inputs)
            note = f"{note} ({source})"
    notes = [f"program: {os.path.abspath(args.model)}; codegen {args.codegen}", note]
    try:
        write_report(c, out, title=f"fxforge report: {os.path.basename(args.model)}", notes=notes)
    except OSError as e:
        raise CliError(f"could not write {out}: {_first_line(e)}", 1) from None
    print(note, file=sys.stderr if not ok else sys.stdout)
    print(f"wrote {out} ({_size(out)}; open it in a browser)")
    return 0 if ok else 1


# --------------------------------------------------------------------------- packages


def _read_package(path: str):
    from ..packages import PackageError, read_package

    if not os.path.isfile(path):
        raise CliError(f"no such file: {path}")
    try:
        return read_package(path)
    except PackageError as e:
        raise CliError(str(e)) from None


def _package_report(args: argparse.Namespace) -> int:
    from ..report.memory import fmt_bytes

    pkg = _read_package(args.model)
    m = pkg.manifest
    s = m["stats"]
    print(f"{args.model}: fxforge {m['fxforge']}, torch {m['torch']}, Python {'.'.join(map(str, m['python']))}, "
          f"{m['arch']} {m['device']}")
    print(f"program: {s.get('nodes_in')} nodes -> {s.get('kernels')} kernels, {s.get('fallback_nodes')} fallbacks, "
          f"arena {fmt_bytes(int(s.get('arena_bytes', 0)))}; weights {'packaged' if m['weights'] else 'passed at load'}")
    print(f"\n{'member':<48} {'bytes':>12}  built for")
    for name, meta in m["members"].items():
        print(f"{name:<48} {meta['size']:>12}  {meta['built_for']}")
    print("\nmemory plan:")
    print(pkg.members["plan.txt"].decode().rstrip())
    out = _output(args, ".html")
    try:
        with open(out, "wb") as f:
            f.write(pkg.members["report.html"])
    except OSError as e:
        raise CliError(f"could not write {out}: {_first_line(e)}", 1) from None
    print(f"\nwrote {out} ({_size(out)}; open it in a browser)")
    return 0


def _package(args: argparse.Namespace) -> int:
    from ..packages import PackageError, package
    from ..report.hooks import watch

    ep = load_program(args.model)
    config = _config(args)
    out = _output(args, ".fxpkg")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with watch(_progress(True)):
            try:
                package(ep, out, config, cpu_isas=tuple(args.cpu_isa) if args.cpu_isa else None,
                        cuda_archs=tuple(args.cuda_arch) if args.cuda_arch else (80, 90), weights=not args.no_weights)
            except (PackageError, TypeError) as e:
                raise CliError(str(e).splitlines()[0]) from None
            except Exception as e:
                raise CliError(f"could not compile {args.model}: {_first_line(e)}", 1) from None
    print(f"wrote {out} ({_size(out)})")
    return 0


def _run(args: argparse.Namespace) -> int:
    import statistics
    import time

    import torch
    import torch.utils._pytree as pytree

    from ..artifact.inputs import InputError
    from ..packages import PackageError, load_package

    if not os.path.isfile(args.package):
        raise CliError(f"no such file: {args.package}")
    call_args, kwargs = load_inputs(args.inputs)
    t0 = time.perf_counter()
    try:
        f = load_package(args.package)
    except PackageError as e:
        raise CliError(str(e)) from None
    t1 = time.perf_counter()
    try:
        out = f(*call_args, **kwargs)
    except (InputError, TypeError) as e:
        raise CliError(f"the inputs in {args.inputs} do not fit the package: {_first_line(e)}") from None
    t2 = time.perf_counter()
    times = []
    for _ in range(args.calls):
        s = time.perf_counter()
        f(*call_args, **kwargs)
        times.append(time.perf_counter() - s)
    leaves, _ = pytree.tree_flatten_with_path(out)
    for path, leaf in leaves:
        what = f"{tuple(leaf.shape)} {str(leaf.dtype).removeprefix('torch.')}" if isinstance(leaf, torch.Tensor) else repr(leaf)
        print(f"output{pytree.keystr(path)}: {what}")
    built = ", ".join(([f"C kernels for {f.cpu_isa}"] if f.cpu_isa else []) +
                      ([f"cubins for sm_{f.cuda_arch}"] if f.cuda_arch else [])) or "ATen calls only"
    print(f"load {1e3 * (t1 - t0):.1f} ms ({built}), first call {1e3 * (t2 - t1):.2f} ms"
          + (f", median of {args.calls} calls {1e3 * statistics.median(times):.3f} ms" if times else ""))
    return 0


# --------------------------------------------------------------------------- bench


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
    sub = p.add_subparsers(dest="command", required=True, metavar="{demo,report,bench,package,run}")

    d = sub.add_parser("demo", help="compile a small GPT, check it against eager, print stats and timings, write its report")
    d.add_argument("--attention", choices=("matmul", "sdpa"), default="matmul",
                   help="attention written as matmul/softmax (default) or F.scaled_dot_product_attention")
    d.add_argument("--batch", type=int, default=4, help="batch size (default 4)")
    d.add_argument("--calls", type=int, default=30, help="most timed calls per measurement (default 30)")
    d.add_argument("--budget", type=float, default=6.0,
                   help="seconds one timing measurement may take before it stops early (default 6)")
    d.add_argument("--json", metavar="PATH", help="also write every figure (run_demo's dict) to PATH as JSON")
    d.add_argument("--report", metavar="PATH", default="fxforge-demo-report.html",
                   help="HTML report of the compiled graphs (default fxforge-demo-report.html; '' for none)")
    d.set_defaults(func=_demo)

    r = sub.add_parser("report", help="compile a program saved with torch.export.save and write its HTML report "
                                      "(or show a package's members and plan)")
    r.add_argument("model", metavar="MODEL.pt2", help="a file written by torch.export.save, or a package (.fxpkg)")
    r.add_argument("-o", "--output", metavar="OUT.html", help="the report (default: MODEL's name with .html, here)")
    r.add_argument("--codegen", default="auto", metavar="NAME",
                   help="codegen backend: auto (default), torch, triton or any registered name")
    r.add_argument("--inputs", metavar="FILE",
                   help="sample inputs written by torch.save: a tuple of positional arguments, a dict of keyword "
                        "arguments, an (args, kwargs) pair or one tensor; default: the program's example inputs. "
                        "The compiled program is run on them and checked against ep.module()")
    r.set_defaults(func=_report)

    b = sub.add_parser("bench", help="run the benchmark suite (bench/run.py)")
    b.add_argument("--gpu", action="store_true", help="run the GPU benchmarks (on a machine with CUDA)")
    b.add_argument("--suite", metavar="PATH", help="the suite's run.py (default: bench/run.py of the checkout)")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="further arguments passed to bench/run.py")
    b.set_defaults(func=_bench)

    k = sub.add_parser("package", help="compile a program saved with torch.export.save into one deployable file")
    k.add_argument("model", metavar="MODEL.pt2", help="a file written by torch.export.save")
    k.add_argument("-o", "--output", metavar="OUT.fxpkg", help="the package (default: MODEL's name with .fxpkg, here)")
    k.add_argument("--cpu-isa", action="append", metavar="LEVEL",
                   help="a CPU level to build the C kernels for (repeat it; default x86-64-v2, v3 and v4 on x86-64)")
    k.add_argument("--cuda-arch", action="append", type=int, metavar="N", help="a GPU architecture (80 = sm_80)")
    k.add_argument("--codegen", default="auto", metavar="NAME", help="codegen backend (default auto)")
    k.add_argument("--no-weights", action="store_true",
                   help="leave the parameters and buffers out: pass them to load_package(state_dict=...)")
    k.set_defaults(func=_package)

    u = sub.add_parser("run", help="load a package (no compiler needed) and run it on sample inputs")
    u.add_argument("package", metavar="MODEL.fxpkg", help="a file written by fxforge package")
    u.add_argument("--inputs", metavar="FILE", required=True,
                   help="inputs written by torch.save: a tuple of positional arguments, a dict of keyword arguments, "
                        "an (args, kwargs) pair or one tensor")
    u.add_argument("--calls", type=int, default=20, help="timed calls after the first (default 20)")
    u.set_defaults(func=_run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"fxforge {args.command}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"fxforge {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
