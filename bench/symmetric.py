"""Symmetric memory: the arena a tensor-parallel model's all-reduces need, with and without reuse.

    python bench/symmetric.py [--ranks 2] [--layers 4] [--out bench/results/symmetric.md]

Spawns ``--ranks`` gloo processes (CPU: fxforge's shared-memory emulation of symmetric memory).
Each compiles a stack of tensor-parallel MLP blocks (column-parallel fc1 + GELU, row-parallel fc2,
an all-reduce of the partial sums, a residual) with ``Config(symmetric_all_reduce_bytes=...)``,
so every all-reduce becomes a one-shot all-reduce on symmetric memory, in inference and for one
training step (forward and backward graphs), and reports per graph:

* ``comm buffers``: the symmetric buffers and the sum of their bytes: what an allocator giving
  each comm buffer its own allocation (Inductor's) holds;
* ``arena``: ``stats["symmetric_arena_bytes"]``, the planned arena with slots reused;
* ``written in place`` / ``copy-ins``: inputs their producers wrote straight into the arena, and
  copies inserted (``stats["symmetric_copy_ins"]``);
* ``barriers``: barriers the plan inserted to allow reuse; ``start barrier``: whether each call
  starts with one; results checked against the unsharded model on every rank.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile

import torch
import torch.multiprocessing as mp


def _rank(rank: int, world: int, store: str, layers: int, d: int, tokens: int, queue) -> None:
    import torch.distributed as dist

    import fxforge

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    g = dist.group.WORLD.group_name
    f = torch.ops._c10d_functional
    torch.manual_seed(0)
    full = [(torch.randn(d, 4 * d) / d ** 0.5, torch.randn(4 * d, d) / (4 * d) ** 0.5) for _ in range(layers)]
    cols = slice(rank * 4 * d // world, (rank + 1) * 4 * d // world)
    shards = [(w1[:, cols].contiguous(), w2[cols].contiguous()) for w1, w2 in full]

    class AllReduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return f.wait_tensor(f.all_reduce(x, "sum", g))

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Copy(torch.autograd.Function):  # identity forward, all-reduced gradient backward
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return f.wait_tensor(f.all_reduce(grad.contiguous(), "sum", g))

    def model(x, ws):
        for w1, w2 in ws:
            x = x + AllReduce.apply(torch.nn.functional.gelu(Copy.apply(x) @ w1) @ w2)
        return x

    def reference(x):
        for w1, w2 in full:
            x = x + torch.nn.functional.gelu(x @ w1) @ w2
        return x

    rows = []
    for mode in ("inference", "training"):
        torch._dynamo.reset()
        b = fxforge.backend(fxforge.Config(symmetric_all_reduce_bytes=1 << 30))
        cm = torch.compile(model, backend=b)
        x = torch.randn(tokens, d, generator=torch.Generator().manual_seed(1))
        if mode == "inference":
            with torch.no_grad():
                torch.testing.assert_close(cm(x, shards), reference(x), rtol=1e-4, atol=1e-4)
        else:
            ws = [(a.clone().requires_grad_(), c.clone().requires_grad_()) for a, c in shards]
            out = cm(x.clone().requires_grad_(), ws)
            out.sum().backward()
            torch.testing.assert_close(out, reference(x), rtol=1e-4, atol=1e-4)
        for c in b.compiled:
            mem = c.plan.memory
            bufs = [bb for bb in mem.buffers.values() if bb.arena is not None and bb.arena.startswith("symm")]
            rows.append({
                "graph": f"{mode}: {c.stats['graph']}",
                "comm_buffers": len(bufs),
                "comm_bytes": sum(mem.hint(bb.nbytes) for bb in bufs),
                "arena": c.stats["symmetric_arena_bytes"],
                "in_place": len(bufs) - sum(c.stats["symmetric_copy_ins"].values()),
                "copy_ins": c.stats["symmetric_copy_ins"],
                "barriers": len(mem.barriers),
                "start_barrier": any(a.start_barrier for a in mem.arenas if a.symmetric),
                "alloc_ids": [hex(a.alloc_id) for a in mem.arenas if a.symmetric],
            })
    queue.put((rank, rows))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = os.path.join(tempfile.mkdtemp(prefix="fxforge-symm-bench-"), "store")
    procs = [ctx.Process(target=_rank, args=(r, args.ranks, store, args.layers, args.d, args.tokens, queue))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(30)
    rows = results[0]
    assert all(results[r] == rows for r in results), "ranks planned differently"
    lines = [
        f"Symmetric memory, {args.layers} tensor-parallel MLP blocks (d={args.d}, {args.tokens} tokens, fp32) on "
        f"{args.ranks} gloo ranks; every all-reduce a one-shot all-reduce on symmetric memory. "
        "`python bench/symmetric.py" + (f" --ranks {args.ranks}" if args.ranks != 2 else "") + "`; identical on every rank.",
        "",
        "| graph | comm buffers | their bytes (one allocation each) | planned arena | written in place | copy-ins | barriers | start barrier | alloc ids |",  # noqa: E501
        "|---|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['comm_buffers']} | {r['comm_bytes']:,} | {r['arena']:,} | {r['in_place']} | "
                     f"{r['copy_ins'] or '-'} | {r['barriers']} | {'yes' if r['start_barrier'] else 'no'} | "
                     f"{', '.join(r['alloc_ids'])} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    sys.exit(main())
