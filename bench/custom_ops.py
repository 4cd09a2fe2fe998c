"""Custom-op tuning against the opaque op and against Inductor's own tuning, per call.

A LLaMA block's second half written with two custom ops as users write them (each an opaque op
of several ATen calls): RMSNorm over a residual add, then a SwiGLU MLP whose ``silu(gate) * up``
is the second op (``block``); and the two ops alone around a residual (``ops``), where they are
the work rather than the block's three matmuls.  Each op has two decompositions registered with both compilers (the same
functions): a direct one and a slower-shaped one (RMSNorm in row chunks; SwiGLU through
``sigmoid``).  Contenders, inference, calls interleaved in one process (medians):

* ``eager``: the module as written;
* ``fxforge opaque``: ``Config(custom_op_tuning="off")``, the ops called as they are;
* ``fxforge tuned``: ``fxforge.register_custom_op_autotuning``, the default Config;
* ``inductor opaque``: ``torch.compile`` with no registration;
* ``inductor tuned``: ``torch._inductor.kernel.custom_op.register_custom_op_autotuning`` with the same
  decompositions.

    python bench/custom_ops.py [--cases block ops] [--tokens 2048] [--d 512] [--hidden 1408] [--threads 1 0] [--tag custom-ops]

writes ``bench/results/<tag>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402


@torch.library.custom_op("fxbench::rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(var + eps)).to(x.dtype) * w


rmsnorm.register_fake(lambda x, w, eps=1e-6: torch.empty_like(x))


@torch.library.custom_op("fxbench::silu_mul", mutates_args=())
def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


silu_mul.register_fake(lambda gate, up: torch.empty_like(gate))


def rms_direct(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rms_chunked(x, w, eps=1e-6, chunks=4):
    return torch.cat([c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps) for c in x.chunk(chunks, 0)]) * w


def silu_mul_direct(gate, up):
    return gate * torch.sigmoid(gate) * up


def silu_mul_exp(gate, up):
    return gate / (1 + torch.exp(-gate)) * up


class Ops(torch.nn.Module):
    """The two ops alone, around a residual: where they are the work, not the matmuls."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x, r):
        h = rmsnorm(x + r, self.w)
        return silu_mul(r, h) + x


class Block(torch.nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(d))
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x, r):
        h = rmsnorm(x + r, self.w)
        return h + self.down(silu_mul(self.gate(h), self.up(h)))


CASES = {"block": Block, "ops": Ops}


def run(case: str, tokens: int, d: int, hidden: int, threads: int, calls: int, budget: float) -> dict:
    import fxforge
    from torch._inductor.kernel import custom_op as ind

    from measure import clear_inductor_memory_caches, interleaved_medians

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = CASES[case](d, hidden).eval()
    x, r = torch.randn(tokens, d), torch.randn(tokens, d)
    fx_configs = {rmsnorm: [fxforge.CustomOpConfig(rms_direct), fxforge.CustomOpConfig(rms_chunked, chunks=4)],
                  silu_mul: [fxforge.CustomOpConfig(silu_mul_direct), fxforge.CustomOpConfig(silu_mul_exp)]}
    for op, cfgs in fx_configs.items():
        fxforge.register_custom_op_autotuning(op, cfgs)
    fns = {"eager": lambda: m(x, r)}
    b_off = fxforge.backend(fxforge.Config(custom_op_tuning="off"))
    b_on = fxforge.backend()
    fns["fxforge opaque"] = (lambda f: lambda: f(x, r))(torch.compile(m, backend=b_off))
    fns["fxforge tuned"] = (lambda f: lambda: f(x, r))(torch.compile(m, backend=b_on))
    with torch.no_grad():
        for f in ("fxforge opaque", "fxforge tuned"):
            fns[f]()
        torch._dynamo.reset()
        clear_inductor_memory_caches()
        ind_opaque = torch.compile(m)
        ind_opaque(x, r)
        torch._dynamo.reset()
        clear_inductor_memory_caches()
        ind.register_custom_op_autotuning(rmsnorm, configs=[ind.CustomOpConfig(rms_direct),
                                                            ind.CustomOpConfig(rms_chunked, chunks=4)])
        ind.register_custom_op_autotuning(silu_mul, configs=[ind.CustomOpConfig(silu_mul_direct),
                                                             ind.CustomOpConfig(silu_mul_exp)])
        ind_tuned = torch.compile(m)
        ind_tuned(x, r)
        fns["inductor opaque"] = lambda: ind_opaque(x, r)
        fns["inductor tuned"] = lambda: ind_tuned(x, r)
        want = m(x, r)
        errs = {n: (f() - want).abs().max().item() for n, f in fns.items()}
        times = interleaved_medians(fns, calls=calls, budget_s=budget)
    tuned = b_on.compiled[0].stats
    torch._dynamo.reset()
    return {"case": case, "tokens": tokens, "d": d, "hidden": hidden, "threads": threads,
            "median_s": {n: v["median_s"] for n, v in times.items()}, "max_abs_err": errs,
            "choices": [{k: s.get(k) for k in ("op", "winner", "candidates", "rejected", "context")}
                        for s in tuned["custom_ops"]],
            "kernels": {"fxforge opaque": b_off.compiled[0].stats["kernels"] + b_off.compiled[0].stats["fallback_nodes"],
                        "fxforge tuned": tuned["kernels"] + tuned["fallback_nodes"]}}


def markdown(rows: list[dict], argv: list[str]) -> str:
    names = list(rows[0]["median_s"]) if rows else []
    out = ["# Custom-op tuning: per call", "",
           f"Command: `python bench/custom_ops.py {' '.join(argv)}` (inference, calls interleaved, medians).", "",
           "| case | threads | " + " | ".join(names) + " | tuned / opaque | tuned / inductor tuned |",
           "|---|---:|" + "---:|" * (len(names) + 2)]
    for r in rows:
        t = r["median_s"]
        out.append(f"| {r['case']} | {r['threads']} | " + " | ".join(f"{1e3 * t[n]:.3f} ms" for n in names)
                   + f" | {t['fxforge tuned'] / t['fxforge opaque']:.2f}x | {t['fxforge tuned'] / t['inductor tuned']:.2f}x |")
    for r in rows:
        out += [
            "",
            f"`{r['case']}`: choices at {r['threads']} thread(s), {r['tokens']} tokens x d {r['d']} (hidden {r['hidden']}); "
            f"launches (kernels + fallback calls): opaque {r['kernels']['fxforge opaque']}, "
            f"tuned {r['kernels']['fxforge tuned']}:",
            "",
        ]
        for c in r["choices"]:
            times = ", ".join(f"{n} {1e6 * s:.0f} us" for n, s in c["candidates"].items())
            out.append(f"- `{c['op']}`: winner `{c['winner']}` ({times}; timed with {c.get('context') or 'nothing'})")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES),
                   help="block: RMSNorm + SwiGLU MLP; ops: the two ops around a residual, no matmul")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1408)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 0], help="0: all of the machine's cores")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--budget", type=float, default=10.0)
    p.add_argument("--tag", default="custom-ops")
    p.add_argument("--one", nargs=2, metavar=("CASE", "THREADS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:  # one case in this process: both compilers' registrations are process-wide
        print(json.dumps(run(args.one[0], args.tokens, args.d, args.hidden, int(args.one[1]), args.calls, args.budget)))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rows = []
    for c in args.cases:
        for t in args.threads:
            env = {**os.environ, "FXFORGE_CACHE_DIR": tempfile.mkdtemp(prefix="fxforge-bench-custom-ops-")}
            argv = [sys.executable, __file__, "--one", c, str(t or cores), "--tokens", str(args.tokens), "--d",
                    str(args.d), "--hidden", str(args.hidden), "--calls", str(args.calls), "--budget", str(args.budget)]
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-3000:])
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    with open(os.path.join(HERE, "results", f"{args.tag}.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "rows": rows}, f, indent=1)
    text = markdown(rows, sys.argv[1:])
    with open(os.path.join(HERE, "results", f"{args.tag}.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
