"""Out-variant lowering: allocations, arena bytes and measured peak per call, fxforge vs eager vs Inductor.

    python bench/out_variant.py [--out bench/results/out_variant.md] [--after COMMIT] [--before COMMIT]

Programs (the custom operators of tests/out_variant_ops.py, Python implementations):

* ``chain4``: four single-output ``fxov::scale_add`` calls in a row on 256x256 float32, the
  result returned;
* ``mlp_split``: a two-layer MLP whose matmuls are the two-output ``fxov::mm_split`` (product
  and its row sums), 64x128 -> 256 -> 128;
* ``topk_sample``: an ATen multi-output op in a model: logits of 64 rows over a 4096 vocabulary
  (64x256 @ 256x4096), their top 50 (``aten.topk``: values and indices), a softmax of the
  values; probabilities and indices returned.

For each contender, one warm call is measured with ``torch.profiler`` (``measure.peak_bytes``):
``allocations`` is the number of allocator events that allocate (in brackets those of 1 KiB or
more: buffers, not the 0-dim tensors ops wrap Python scalars in), ``allocated`` their bytes,
``peak`` the peak of their running sum (outputs included), plus fxforge's planned ``arena_bytes``.  Each program is also
compiled with ``dynamic=True`` and called at three batch sizes: ``dynamic`` says whether the
contender compiled and matched eager, and how many graphs it compiled (fxforge and Inductor).

``--after COMMIT`` measures fxforge as it was at ``COMMIT`` rather than the working tree's
(``git archive COMMIT fxforge`` unpacked in a temporary directory, imported in a subprocess with
``PYTHONPATH`` there; the programs, their custom operators and ``measure`` stay this tree's);
``--before COMMIT`` measures fxforge at ``COMMIT`` the same way and writes its rows as a second
table.  The committed results: ``--after HEAD --before 29f04e2^`` (29f04e2^: the commit before
out-variant lowering).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

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


def topk_sample(x, w):
    v, i = torch.topk(x @ w, 50)
    return torch.softmax(v / 0.7, -1), i


def inputs(name: str, batch: int):
    g = torch.Generator().manual_seed(batch)
    if name == "chain4":
        return torch.randn(batch, 256, generator=g), torch.randn(batch, 256, generator=g)
    if name == "topk_sample":
        return torch.randn(batch, 256, generator=g), torch.randn(256, 4096, generator=g) / 16
    return (torch.randn(batch, 128, generator=g), torch.randn(128, 256, generator=g) / 16,
            torch.randn(256, 128, generator=g) / 16)


PROGRAMS = {"chain4": (chain4, 256), "mlp_split": (mlp_split, 64), "topk_sample": (topk_sample, 64)}


class Inductor:
    """Inductor as a torch.compile backend, keeping what it compiled (to count the graphs)."""

    def __init__(self):
        self.compiled: list = []

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.compiled.append(gm)
        return compile_fx(gm, example_inputs)


def contender(name: str):
    """(callable maker, backend with a ``compiled`` list, or None for eager)."""
    if name == "eager":
        return (lambda fn, dynamic: fn), None
    b = Inductor() if name == "inductor" else fxforge.backend(fxforge.Config())
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
    if b is not None and who == "fxforge":
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
        graphs = r.get("dynamic_graphs")
        dyn = r["dynamic"] + (f" ({graphs} graph{'s' * (graphs != 1)})" if graphs is not None else "")
        out.append(f"| {r['program']} | {r['contender']} | {r['allocations']} ({r['large_allocations']}) | "
                   f"{r['allocated_bytes'] / 1024:.1f} | {r['peak_bytes'] / 1024:.1f} | {arena} | "
                   f"{r['max_abs_err']:.1e} | {dyn} |")
    return "\n".join(out)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def describe_tree() -> str:
    """The commit this fxforge is at, and whether its files differ from it."""
    dirty = git("status", "--porcelain", "--", "fxforge")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes to fxforge/" if dirty else "")


def rows_at(commit: str, programs: list[str]) -> list[dict]:
    """The fxforge rows measured with fxforge as it was at ``commit``."""
    with tempfile.TemporaryDirectory(prefix="fxforge-before-") as d:
        archive = subprocess.run(["git", "archive", commit, "fxforge"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", d], input=archive, check=True)
        out = os.path.join(d, "rows.json")
        # the bench directory (sys.path[0]) holds no fxforge: PYTHONPATH's comes first
        subprocess.run([sys.executable, os.path.abspath(__file__), "--contenders", "fxforge", "--json", out,
                        "--programs", *programs], check=True, env=dict(os.environ, PYTHONPATH=d),
                       stdout=subprocess.DEVNULL)
        with open(out) as fh:
            got = json.load(fh)
        if not got["fxforge"].startswith(d):
            raise SystemExit(f"{commit}: the subprocess imported {got['fxforge']}, not the archive")
        return got["rows"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the Markdown table there")
    p.add_argument("--contenders", nargs="+", default=["eager", "fxforge", "inductor"])
    p.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=list(PROGRAMS))
    p.add_argument("--after", metavar="COMMIT", help="measure fxforge as it was at COMMIT, not the working tree's")
    p.add_argument("--before", metavar="COMMIT", help="also measure fxforge as it was at COMMIT")
    p.add_argument("--json", help="write the rows there as JSON")
    args = p.parse_args(argv)
    at = {}
    if args.after and "fxforge" in args.contenders:
        at = {r["program"]: r for r in rows_at(args.after, args.programs)}
    rows = [at[prog] if who == "fxforge" and at else measure_program(prog, who)
            for prog in args.programs for who in args.contenders]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"fxforge": fxforge.__file__, "rows": rows}, fh)
    where = git("rev-parse", "--short", args.after) if at else describe_tree()
    text = f"After (fxforge at {where}):\n\n{table(rows)}\n"
    if args.before:
        before = rows_at(args.before, args.programs)
        text += f"\nBefore (fxforge at {git('rev-parse', '--short', args.before)}):\n\n{table(before)}\n"
    print(text)
    if args.out:
        cmd = " ".join(["python bench/out_variant.py", *(argv if argv is not None else sys.argv[1:])])
        with open(args.out, "w") as fh:
            fh.write(f"<!-- {cmd} ; torch {torch.__version__}, {os.cpu_count()} CPUs -->\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
