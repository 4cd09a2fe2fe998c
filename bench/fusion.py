"""Fusion figures: kernels, bytes moved and refused fusions per limit, default vs tight limits.

    python bench/fusion.py                 # demo + GPT-2 (2 layers), torch and triton codegen
    python bench/fusion.py --models demo   # a subset

Graphs come from ``torch.export`` (inference) and are compiled with ``fxforge.compile_exported``;
nothing runs, so Triton kernels are emitted and loaded under TRITON_INTERPRET=1 on a CPU-only
machine.  *Bytes moved* counts what each kernel group reads and writes once: every distinct
tensor it reads from outside, plus every value it writes (a fused Triton group writes only its
outputs; the torch backend writes every node's result).  Written to bench/results/fusion.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import fxforge  # noqa: E402
from fxforge.core.graph import FALLBACK_BACKEND, VAL, hint, node_kind  # noqa: E402

HERE = Path(__file__).resolve().parent

LIMITS = {
    "default": {},
    "no fusion": {"max_fusion_size": 1},
    "max_kernel_args=8": {"max_kernel_args": 8},
    "tight": {"max_kernel_args": 5, "max_fusion_unique_io_buffers": 4, "max_fusion_size": 3},
}


def _bytes(v, env) -> int:
    if not isinstance(v, torch.Tensor):
        return 0
    return hint(v.numel(), env) * v.element_size() if hasattr(v.numel(), "node") else v.numel() * v.element_size()


def bytes_moved(compiled) -> int:
    env = compiled.plan.memory.shape_env
    total = 0
    for g in compiled.plan.groups:
        if g.backend == FALLBACK_BACKEND:
            continue
        reads = {a for a in g.inputs if isinstance(a.meta.get(VAL), torch.Tensor)}
        written = g.outputs if g.fused else [n for n in g.nodes if node_kind(n) == "compute"]
        total += sum(_bytes(a.meta[VAL], env) for a in reads)
        for n in written:
            v = n.meta[VAL]
            total += sum(_bytes(t, env) for t in (v if isinstance(v, (list, tuple)) else [v]))
    return total


def models(names):
    from fxforge.entry.demo import GPT, GPTConfig

    if "demo" in names:
        torch.manual_seed(0)
        yield "demo", GPT(GPTConfig()).eval(), (torch.randint(0, 512, (2, 64)),)
    if "gpt2-2l" in names:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, attn_implementation="eager", use_cache=False)
        torch.manual_seed(0)
        yield "gpt2-2l", GPT2LMHeadModel(cfg).eval(), (torch.randint(0, cfg.vocab_size, (2, 128)),)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["demo", "gpt2-2l"])
    p.add_argument("--codegen", nargs="+", default=["torch", "triton"])
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    rows = []
    for name, model, inputs in models(args.models):
        with torch.no_grad():
            ep = torch.export.export(model, inputs)
        for codegen in args.codegen:
            for label, limits in LIMITS.items():
                cfg = fxforge.Config(codegen=codegen, **limits)
                t0 = time.perf_counter()
                c = fxforge.compile_exported(ep, cfg)
                s = c.stats
                rows.append({
                    "model": name, "codegen": codegen, "limits": label, "config": limits,
                    "kernels": s["kernels"], "fused_nodes": s["fused_nodes"],
                    "largest_group": max((k.node_count for k in c.kernels), default=0),
                    "max_num_args": max((k.num_args for k in c.kernels if k.node_count > 1), default=0),
                    "bytes_moved": bytes_moved(c), "fallback_nodes": s["fallback_nodes"],
                    "refused_fusions": s["refused_fusions"], "compile_seconds": time.perf_counter() - t0,
                })
                print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fusion.json").write_text(json.dumps({"command": "python " + " ".join(sys.argv), "rows": rows}, indent=1))
    lines = [
        "# Fusion: kernels and bytes moved, default vs tight limits",
        "",
        f"command: `python bench/fusion.py {' '.join(argv or sys.argv[1:])}`; torch {torch.__version__}; "
        "graphs from torch.export (inference), compiled with fxforge.compile_exported, not run.",
        f"limits: `{LIMITS}`; bytes moved: each group reads its inputs and writes its outputs once (eager fallbacks are not counted: compare rows of one codegen).",  # noqa: E501
        "",
        "| model | codegen | limits | kernels | fused nodes | largest group | max args (fused) | bytes moved (MiB) | fallbacks | refused fusions |",  # noqa: E501
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(r["refused_fusions"].items())) or "-"
        lines.append(f"| {r['model']} | {r['codegen']} | {r['limits']} | {r['kernels']} | {r['fused_nodes']} | "
                     f"{r['largest_group']} | {r['max_num_args']} | {r['bytes_moved'] / 2**20:.2f} | "
                     f"{r['fallback_nodes']} | {refused} |")
    (out / "fusion.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
