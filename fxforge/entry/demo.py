"""``fxforge demo``: a small GPT compiled by fxforge, checked against eager, timed against eager.

The model is plain torch (no downloads): token + position embeddings, causal self-attention
blocks, LayerNorm, GELU MLP, LM head.  It is compiled with ``fxforge.backend(Config())`` twice
over, for inference (under ``no_grad``) and for one training step (forward + backward of the
cross-entropy loss), on the same weights as an eager copy and fresh random tokens.  Outputs,
loss and every parameter gradient are compared with eager; the table shows what each compiled
graph looks like and how long a call takes next to eager.

``run_demo()`` returns the figures as a dict; ``main()`` prints them and exits 1 on a mismatch.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import fxforge


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 512
    seq: int = 64
    d: int = 128
    heads: int = 4
    layers: int = 2
    # "matmul": q @ k^T, causal mask, softmax, @ v (one node each); "sdpa": F.scaled_dot_product_attention.
    attention: str = "matmul"
    # Each block a ``torch.compiler.nested_compile_region``: traced and compiled once for all layers.
    regions: bool = False


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads, self.attention = cfg.heads, cfg.attention
        self.scale = 1.0 / math.sqrt(cfg.d // cfg.heads)
        self.qkv = nn.Linear(cfg.d, 3 * cfg.d)
        self.proj = nn.Linear(cfg.d, cfg.d)
        self.register_buffer("mask", torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * self.scale
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = att.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d), nn.LayerNorm(cfg.d)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.d, 4 * cfg.d), nn.GELU(), nn.Linear(4 * cfg.d, cfg.d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class RegionBlock(Block):
    """A block that dynamo traces once for every layer, and fxforge compiles once."""

    @torch.compiler.nested_compile_region
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d)
        self.pos = nn.Embedding(cfg.seq, cfg.d)
        self.blocks = nn.ModuleList((RegionBlock if cfg.regions else Block)(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# float32 through different kernels/orders: a few ulps per op, accumulated over ~100 ops.
RTOL = ATOL = 1e-4


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=RTOL, atol=ATOL)


def _time_interleaved(fns: list[Callable[[], Any]], calls: int, budget_s: float) -> tuple[list[float], int]:
    """Median seconds per call of each of ``fns``, calls interleaved (a, b, c, a, b, c, ...).

    Interleaving exposes all to the same machine load, so the ratios stay meaningful on a busy
    2-core box.  Stops after ``calls`` rounds or once ``budget_s`` is spent (at least 3 rounds).
    """
    for fn in fns:
        fn()  # warm (allocator, caches, kept arenas)
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < calls and (len(times[0]) < 3 or time.perf_counter() - start < budget_s):
        for fn, out in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times], len(times[0])


def _graph_row(c: fxforge.Compiled) -> dict:
    s = c.stats
    return {
        "graph": s.get("graph"),
        "nodes": s["nodes_in"],
        "kernels": s["kernels"],
        "fallbacks": s["fallback_nodes"],
        "arena_bytes": s["arena_bytes"],
        "lower_bound_bytes": s["lower_bound_bytes"],
        "eager_live_peak_bytes": s["eager_live_peak_bytes"],
        "compile_seconds": s["compile_seconds"],
        "fallback_reasons": dict(s.get("fallbacks", {})),
    }


def run_demo(
    cfg: GPTConfig | None = None,
    *,
    batch: int = 4,
    calls: int = 30,
    budget_s: float = 6.0,
    seed: int = 0,
    config: fxforge.Config | None = None,
    registry: Any = None,
) -> dict:
    """Compile, check and time the demo GPT.  Returns every figure the table shows.

    Keys: ``ok`` (all checks passed), ``checks`` (name -> {ok, max_abs_err}), ``graphs`` (one row
    per Compiled: graph, nodes, kernels, fallbacks, arena/lower-bound/eager-peak bytes,
    compile_seconds), ``timing`` ({inference, train_step} -> {fxforge_s, eager_s, aot_eager_s (dynamo
    and AOTAutograd alone, what every backend pays), ratio}),
    ``failures`` (graphs the backend could not compile and ran eagerly), ``model``, ``batch``.
    ``config`` and ``registry`` go to ``fxforge.backend``.
    """
    cfg = cfg or GPTConfig()
    torch.manual_seed(seed)
    eager = GPT(cfg)
    model = copy.deepcopy(eager)
    backend = fxforge.backend(config or fxforge.Config(), registry=registry)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    # dynamo + AOTAutograd with no backend behind them: what every backend's calls pay
    floor = torch.compile(copy.deepcopy(eager), backend="aot_eager", fullgraph=True)

    gen = torch.Generator().manual_seed(seed + 1)
    idx = torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=gen)
    targets = torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=gen)
    checks, first_inference_s, first_train_s = _checks(cfg, eager, model, compiled, idx, targets, gen)
    timing = _timings(compiled, eager, floor, idx, targets, calls, budget_s)
    timing["inference"]["first_call_s"] = first_inference_s
    timing["train_step"]["first_call_s"] = first_train_s
    failures = _failures(backend)
    return {
        "ok": all(c["ok"] for c in checks.values()) and not failures,
        "checks": checks,
        "graphs": [_graph_row(c) for c in backend.compiled],
        "failures": failures,
        "timing": timing,
        "model": asdict(cfg),
        "batch": batch,
        "calls": calls,
        "params": sum(p.numel() for p in eager.parameters()),
        "threads": torch.get_num_threads(),
    }


def _checks(cfg: GPTConfig, eager, model, compiled, idx, targets, gen) -> tuple[dict[str, dict], float, float]:
    """Inference, a training step, an SGD step and inference again, each against eager; with the
    first inference's and the first training step's seconds (their compiles included)."""
    checks: dict[str, dict] = {}

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        checks[name] = {"ok": _close(got, want), "max_abs_err": _max_err(got, want) if got.shape == want.shape else math.inf}

    # Inference: under no_grad, AOTAutograd hands the backend one inference graph.
    with torch.no_grad():
        t0 = time.perf_counter()
        got = compiled(idx)
        first_inference_s = time.perf_counter() - t0
        check("inference logits", got, eager(idx))
        idx2 = torch.randint(0, cfg.vocab, tuple(idx.shape), generator=gen)  # a second call, new tokens
        check("inference logits (2nd call)", compiled(idx2), eager(idx2))

    # One training step: forward + backward graphs; loss and every gradient against eager.
    t0 = time.perf_counter()
    loss = compiled(idx, targets)
    loss.backward()
    first_train_s = time.perf_counter() - t0
    eager_loss = eager(idx, targets)
    eager_loss.backward()
    check("train loss", loss, eager_loss)
    eager_params = dict(eager.named_parameters())
    grads_ok, grads_err, missing = True, 0.0, []
    for name, p in model.named_parameters():
        q = eager_params[name]
        if p.grad is None or q.grad is None:
            missing.append(name)
            grads_ok = False
            continue
        grads_ok &= _close(p.grad, q.grad)
        grads_err = max(grads_err, _max_err(p.grad, q.grad))
    checks[f"grads ({len(eager_params)} params)"] = {"ok": grads_ok, "max_abs_err": grads_err, "missing": missing}

    # An SGD step on both copies, then one more forward: the updated weights still agree.
    with torch.no_grad():
        for m in (model, eager):
            for p in m.parameters():
                p -= 0.1 * p.grad
                p.grad = None
        check("inference after SGD step", compiled(idx2), eager(idx2))
    return checks, first_inference_s, first_train_s


def _timings(compiled, eager, floor, idx, targets, calls: int, budget_s: float) -> dict:
    """Median per call, same inputs, after the compiles: inference and a training step, fxforge
    against eager and aot_eager (interleaved)."""
    def infer(m):
        def run():
            with torch.no_grad():
                m(idx)
        return run

    def train(m):
        def run():
            for p in m.parameters():
                p.grad = None
            m(idx, targets).backward()
        return run

    timing = {}
    for what, make in (("inference", infer), ("train_step", train)):
        (fx_s, eager_s, floor_s), n = _time_interleaved([make(compiled), make(eager), make(floor)], calls, budget_s)
        timing[what] = {"fxforge_s": fx_s, "eager_s": eager_s, "aot_eager_s": floor_s, "ratio": fx_s / eager_s,
                        "calls": n}
    return timing


def _failures(backend) -> list[dict]:
    """Graphs the backend could not compile, and Compiled graphs whose generated code raised (they
    switch to eager for good: a failure here), and a missing or extra graph kind."""
    failures = [{"graph": k, "reason": r} for k, r in backend.failures]
    failures += [{"graph": c.stats.get("graph"), "reason": f"generated code failed: {reason}"}
                 for c in backend.compiled for reason in c.failures]
    kinds = sorted(str(c.stats.get("graph")) for c in backend.compiled)
    if kinds != ["backward", "forward", "inference"]:
        failures.append({"graph": "-", "reason": f"expected one inference, forward and backward graph; got {kinds}"})
    return failures


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f} KiB"


def format_table(r: dict) -> str:
    m = r["model"]
    lines = [
        f"fxforge demo: GPT vocab {m['vocab']}, d {m['d']}, {m['heads']} heads, {m['layers']} blocks, "
        f"seq {m['seq']}, batch {r['batch']}, {m['attention']} attention, {r['params']:,} params, "
        f"{r['threads']} threads",
        "",
        f"{'graph':<10} {'nodes':>6} {'kernels':>8} {'fallbacks':>10} {'arena':>12} {'lower bound':>12} "
        f"{'eager peak':>12} {'compile':>9}",
    ]
    for g in r["graphs"]:
        lines.append(
            f"{g['graph']:<10} {g['nodes']:>6} {g['kernels']:>8} {g['fallbacks']:>10} {_kib(g['arena_bytes']):>12} "
            f"{_kib(g['lower_bound_bytes']):>12} {_kib(g['eager_live_peak_bytes']):>12} {g['compile_seconds']:>8.2f}s"
        )
    for f in r["failures"]:
        lines.append(f"{f['graph']:<10} FAILURE: {f['reason']}")
    reasons = {reason for g in r["graphs"] for reason in g["fallback_reasons"].values()}
    for reason in sorted(reasons):
        lines.append(f"  fallback: {reason}")
    lines += ["", f"{'time per call':<14} {'fxforge':>10} {'eager':>10} {'ratio':>7} {'aot_eager':>10} {'ratio':>7}   "
                  "(median, calls interleaved; aot_eager: dynamo + AOTAutograd alone, what every backend pays)"]
    for what, t in r["timing"].items():
        lines.append(f"{what:<14} {t['fxforge_s'] * 1e3:>8.2f}ms {t['eager_s'] * 1e3:>8.2f}ms {t['ratio']:>6.2f}x "
                     f"{t['aot_eager_s'] * 1e3:>8.2f}ms {t['fxforge_s'] / t['aot_eager_s']:>6.2f}x   {t['calls']} calls each")
    lines.append(
        "first call (dynamo + AOTAutograd + fxforge compile): inference %.2fs, train step %.2fs"
        % (r["timing"]["inference"]["first_call_s"], r["timing"]["train_step"]["first_call_s"])
    )
    lines += ["", "checks against eager (rtol = atol = %g):" % RTOL]
    for name, c in r["checks"].items():
        lines.append(f"  {'ok  ' if c['ok'] else 'FAIL'} {name}: max abs err {c['max_abs_err']:.2e}"
                     + (f", missing grads: {', '.join(c['missing'])}" if c.get("missing") else ""))
    lines.append("PASS" if r["ok"] else "FAIL: fxforge does not match eager")
    return "\n".join(lines)


def main(
    *, attention: str = "matmul", batch: int = 4, calls: int = 30, budget_s: float = 6.0, json_path: str | None = None
) -> int:
    """Run the demo, print the table (and write the figures as JSON); 0 when fxforge matches eager, else 1."""
    r = run_demo(GPTConfig(attention=attention), batch=batch, calls=calls, budget_s=budget_s)
    print(format_table(r), flush=True)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=1)
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
