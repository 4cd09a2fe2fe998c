"""What each rank checks in tests/test_symmetric.py (run on real gloo ranks by partition_ranks).

Every function takes (rank, world), compiles programs with symmetric-memory collectives through
``torch.compile(backend=fxforge.backend(...))``, checks the results against an unsharded reference
computed on every rank, and returns what the parent test compares across ranks (plans, ids).
On CPU the symmetric arenas are fxforge's emulation: shared-memory files every rank maps, the
collectives reading the peers' arenas directly (fxforge/codegen/symmetric_runtime.py).
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported in a rank's process

import torch
import torch.distributed as dist

import fxforge
from fxforge.codegen import symmetric_runtime as runtime


def _group() -> str:
    return dist.group.WORLD.group_name


def _inputs(step: int, world: int, shape=(4, 16)) -> list[torch.Tensor]:
    """Every rank's input of one step (each rank can compute all of them: the reference)."""
    return [torch.randn(*shape, generator=torch.Generator().manual_seed(1000 * step + r)) for r in range(world)]


def _close(got, want, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"{what}: {m}")


def _plan(c) -> dict:
    """What every rank must agree on: the symmetric arenas and their buffers' places."""
    mem = c.plan.memory
    return {
        "arenas": [(a.name, a.symmetric, a.alloc_id, mem.hint(a.nbytes), a.start_barrier) for a in mem.arenas
                   if a.symmetric is not None],
        "buffers": sorted((b.name, b.arena, mem.hint(b.offset), mem.hint(b.nbytes)) for b in mem.buffers.values()
                          if b.arena is not None and b.arena.startswith("symm")),
        "barriers": list(mem.barriers),
    }


def tp_block(rank: int, world: int) -> dict:
    """A tensor-parallel MLP block (column-parallel fc1 + relu, row-parallel fc2, all-reduce of
    the partial sums), its all-reduce lowered onto symmetric memory: fc2's out= call writes the
    all-reduce input straight into the symmetric arena (no copy-in), results equal the unsharded
    block, on both codegen backends (Triton under the interpreter: its bias-add kernel writes the
    arena)."""
    torch.manual_seed(0)
    d, f = 16, 8 * world
    w1, w2, b2 = torch.randn(d, f), torch.randn(f, d), torch.randn(d)
    cols = slice(rank * f // world, (rank + 1) * f // world)
    w1s, w2s = w1[:, cols].contiguous(), w2[cols].contiguous()
    g = _group()
    funcol = torch.ops._c10d_functional

    def block(x):
        partial = torch.relu(x @ w1s) @ w2s
        return funcol.wait_tensor(funcol.all_reduce(partial, "sum", g))

    def block_bias(x):  # the all-reduce input is a fused elementwise group's output
        partial = (torch.relu(x @ w1s) @ w2s + b2 / world) * 0.5
        return funcol.wait_tensor(funcol.all_reduce(partial, "sum", g))

    out = {}
    for codegen, fn, ref in (("torch", block, lambda x: torch.relu(x @ w1) @ w2),
                             ("triton", block_bias, lambda x: (torch.relu(x @ w1) @ w2 + b2) * 0.5)):
        torch._dynamo.reset()
        b = fxforge.backend(fxforge.Config(codegen=codegen, debug=True, symmetric_all_reduce_bytes=1 << 20))
        cf = torch.compile(fn, backend=b, fullgraph=True)
        for step in range(3):
            x = _inputs(step, world, (4, d))[0]  # replicated input: the same on every rank
            _close(cf(x), ref(x), f"TP block ({codegen}), step {step}")
        (c,) = b.compiled
        emulated = "_one_shot_all_reduce(symm0_h, "
        assert emulated in c.source and "_c10d_functional.all_reduce" not in c.source, c.source
        assert c.stats["symmetric_copy_ins"] == {}, c.stats["symmetric_copy_ins"]
        buffers = [x for x in _plan(c)["buffers"]]
        assert len(buffers) == 1, buffers  # the all-reduce input, written by its producer
        if codegen == "triton":
            producer = c.plan.memory.buffers[buffers[0][0]].producer
            assert any(k.backend == "triton" for k in c.kernels) and producer.meta["fxforge_backend"] == "triton"
        out[codegen] = {"plan": _plan(c), "symmetric_arena_bytes": c.stats["symmetric_arena_bytes"],
                        "collective_bytes": c.stats["collective_bytes"], "copy_bytes": c.stats["copy_bytes"],
                        "comm_buffer_bytes": sum(x[3] for x in buffers)}
    return out


def _chain(g: str):
    """Two one-shot all-reduces of equal size in a row: the second's input is written after the
    first returned, while a slower peer may still be reading the first's input."""
    torch.manual_seed(1)
    w1, w2 = torch.randn(16, 16), torch.randn(16, 16)

    def f(x):
        h = x @ w1
        y = torch.ops.symm_mem.one_shot_all_reduce(h, "sum", g)
        h2 = y @ w2
        return torch.ops.symm_mem.one_shot_all_reduce(h2, "sum", g) * 2

    def ref(xs):
        y = sum(x @ w1 for x in xs)
        return (y @ w2) * len(xs) * 2

    return f, ref


def _slow_reads(rank: int, slow_rank: int, seconds: float):
    """Make ``slow_rank``'s reads of its peers' arenas late, as a slow GPU's would be."""
    original = runtime.peer_view

    def late(h, r, t):
        if h.rank == slow_rank and r != h.rank:
            time.sleep(seconds)
        return original(h, r, t)

    return late


def chained_all_reduces(rank: int, world: int) -> dict:
    """The chain shares one slot of the symmetric arena, safely: the plan puts a barrier after
    the first all-reduce, so a rank writes the second input only once every peer has read the
    first, even with one rank reading late.  The same plan without the barrier (fences claimed
    where there are none) lets the fast rank overwrite the slot under the slow reader: rank 1's
    result is then wrong, which shows the hazard the rule guards against is real."""
    import fxforge.passes.symmetric as planning

    g = _group()
    f, ref = _chain(g)
    runtime.peer_view = _slow_reads(rank, slow_rank=1, seconds=0.3)
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(debug=True))
    cf = torch.compile(f, backend=b, fullgraph=True)
    for step in range(2):
        xs = _inputs(step, world, (4, 16))
        _close(cf(xs[rank]), ref(xs), f"chained all-reduces, step {step}")
    (c,) = b.compiled
    plan = _plan(c)
    assert "symm0_h.barrier()" in c.source, c.source

    # unsafe: pretend a fence follows every collective, so no barrier is planned
    real_fences = planning.fence_points

    def claimed(gm, pos):
        out = real_fences(gm, pos)
        for n, p in pos.items():
            if planning.symmetric_args(n):
                out.setdefault(planning.group_name_of(n), []).append(p + 0.25)
        return {k: sorted(v) for k, v in out.items()}

    planning.fence_points = claimed
    try:
        torch._dynamo.reset()
        b2 = fxforge.backend(fxforge.Config(debug=True))
        cf2 = torch.compile(f, backend=b2, fullgraph=True)
        xs = _inputs(7, world, (4, 16))
        got = cf2(xs[rank])
    finally:
        planning.fence_points = real_fences
    (c2,) = b2.compiled
    assert "barrier()" not in c2.source.split("def call", 1)[1].replace("_h.acquire", "")
    corrupted = not torch.allclose(got, ref(xs), rtol=1e-4, atol=1e-4)
    dist.barrier()
    return {"plan": plan, "symmetric_arena_bytes": c.stats["symmetric_arena_bytes"],
            "buffer_bytes": plan["buffers"][0][3], "corrupted_without_barrier": corrupted}


def bucketed_all_reduces(rank: int, world: int) -> dict:
    """Three small functional all-reduces bucketed into one, lowered to a one-shot all-reduce:
    each member's producer writes its run of the bucket's flat buffer in the symmetric arena (no
    copy-in), and the results are the unsharded sums, call after call."""
    from torch.distributed import _functional_collectives as funcol

    g = _group()
    torch.manual_seed(2)
    w = torch.randn(16, 16)

    def f(x):
        reduced = [funcol.all_reduce(((x * (i + 1)) @ w).tanh(), "sum", g) for i in range(3)]
        return [r * 2 for r in reduced]  # (read once all three are issued: one bucket)

    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(debug=True, symmetric_all_reduce_bytes=4096))
    cf = torch.compile(f, backend=b, fullgraph=True)
    for step in range(3):
        xs = _inputs(20 + step, world, (4, 16))
        for i, got in enumerate(cf(xs[rank])):
            _close(got, sum(((x * (i + 1)) @ w).tanh() for x in xs) * 2, f"bucketed all-reduce {i}, step {step}")
    (c,) = b.compiled
    passes = {p["name"]: p.get("stats") for p in c.stats["passes"]}
    return {"plan": _plan(c), "copy_bytes": c.stats["copy_bytes"], "copy_ins": c.stats["symmetric_copy_ins"],
            "buckets": passes["bucket_collectives"], "zero_copy": passes["zero_copy_cat_pad"]["zero_copy_inputs"],
            "one_shots": c.source.count("_one_shot_all_reduce(")}


def rank_dependent_shapes(rank: int, world: int) -> str:
    """Ranks whose graphs differ (a row count per rank) cannot share a symmetric arena: every
    rank fails with an error naming the first buffer that differs."""
    g = _group()
    w = torch.randn(16, 16)

    def f(x):
        return torch.ops.symm_mem.one_shot_all_reduce(x @ w, "sum", g)

    torch._dynamo.reset()
    cf = torch.compile(f, backend=fxforge.backend(fxforge.Config(debug=True)), fullgraph=True)
    try:
        cf(torch.randn(4 + rank, 16))
    except runtime.SymmetricPlanError as e:
        return str(e)
    raise AssertionError("ranks with different plans shared a symmetric arena")


class _AllReduceGrad(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward (and the g of the
    row-parallel output: all-reduce forward), so both graphs of a training step communicate."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        f = torch.ops._c10d_functional
        return f.wait_tensor(f.all_reduce(x, "sum", g))

    @staticmethod
    def backward(ctx, grad):
        f = torch.ops._c10d_functional
        return f.wait_tensor(f.all_reduce(grad.contiguous(), "sum", ctx.g)), None


def training_alloc_ids(rank: int, world: int) -> dict:
    """A training step whose forward and backward all-reduces are lowered onto symmetric memory:
    the two graphs' arenas get distinct allocation ids, the same after recompiling (no process
    state in them), and gradients equal the unsharded computation's."""
    g = _group()
    torch.manual_seed(2)
    w = torch.randn(16, 16)

    def step(x, w):
        y = _AllReduceGrad.apply(torch.tanh(x @ w), g)
        return (y * y).sum()

    ids = []
    for attempt in range(2):
        torch._dynamo.reset()
        b = fxforge.backend(fxforge.Config(debug=True, symmetric_all_reduce_bytes=1 << 20))
        cf = torch.compile(step, backend=b)
        xs = _inputs(3, world, (4, 16))
        wl = w.clone().requires_grad_()
        loss = cf(xs[rank], wl)
        loss.backward()
        # reference: y = sum over ranks of tanh(x_r @ w); loss = sum(y^2) on every rank;
        # d loss / d w on rank r = x_r^T (dtanh * all_reduce(2y)) = x_r^T (dtanh * world * 2y)
        wr = w.clone().requires_grad_()
        y = sum(torch.tanh(x @ wr) for x in xs)
        h = torch.tanh(xs[rank] @ wr)
        (grad_r,) = torch.autograd.grad((h * (2 * y * world).detach()).sum(), wr)
        _close(loss, (y * y).sum(), "loss")
        _close(wl.grad, grad_r, "weight gradient")
        kinds = {c.stats["graph"]: [a.alloc_id for a in c.plan.memory.arenas if a.symmetric is not None]
                 for c in b.compiled}
        assert set(kinds) == {"forward", "backward"} and all(len(v) == 1 for v in kinds.values()), kinds
        ids.append(kinds)
    assert ids[0] == ids[1], ids  # recompiled: the same ids
    assert ids[0]["forward"] != ids[0]["backward"]
    return ids[0]


def registered_symm_args(rank: int, world: int) -> dict:
    """A custom operator declaring its symmetric-memory argument (``register_symm_mem_args``)
    gets it planned like symm_mem's own: its producer writes it into the symmetric arena."""
    lib = torch.library.Library("fxsymtest", "DEF")
    lib.define("sum_ranks(Tensor input, str group_name) -> Tensor")

    def sum_ranks(x, group_name):
        out = x.clone()
        dist.all_reduce(out)
        return out

    lib.impl("sum_ranks", sum_ranks, "CPU")
    lib.impl("sum_ranks", lambda x, group_name: torch.empty_like(x), "Meta")
    if not hasattr(lib, "register_symm_mem_args"):
        return {"skipped": "this torch has no Library.register_symm_mem_args"}
    lib.register_symm_mem_args("sum_ranks", ["input"])
    g = _group()
    torch.manual_seed(3)
    w = torch.randn(16, 16)
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(debug=True))
    cf = torch.compile(lambda x: torch.ops.fxsymtest.sum_ranks(x @ w, g) + 1, backend=b, fullgraph=True)
    xs = _inputs(5, world, (4, 16))
    _close(cf(xs[rank]), sum(x @ w for x in xs) + 1, "registered symmetric argument")
    (c,) = b.compiled
    return {"plan": _plan(c), "copy_ins": c.stats["symmetric_copy_ins"]}


def all_cases(rank: int, world: int) -> dict:
    return {
        "tp_block": tp_block(rank, world),
        "chain": chained_all_reduces(rank, world),
        "training": training_alloc_ids(rank, world),
        "registered": registered_symm_args(rank, world),
        "bucketed": bucketed_all_reduces(rank, world),
        "mismatch": rank_dependent_shapes(rank, world),  # last: it leaves a failed arena behind
    }
