"""What each rank runs in tests/test_overlap.py (module-level: spawned processes import it)."""

from __future__ import annotations

import torch

import fxforge
from fxforge.core.dtensor import local_shard


def fsdp_training(rank: int, world: int) -> dict:
    """An FSDP-style training step (every parameter ``Shard(0)``, the batch too) of the MLP block
    through ``fxforge.partition``, with the collectives overlapped and without: both give eager's
    loss and gradients; returns what each schedule's ``stats["comm"]`` says, and the link model
    ``costs.calibrate`` fitted."""
    from torch.distributed.tensor import Shard
    from torch.export.experimental import _export_forward_backward

    from fxforge.core.costs import calibrate
    from partition_cases import close

    mesh, model, x, target, ref = _mlp_step(world, 1)
    params = dict(model.named_parameters())
    placements = {**{n: [Shard(0)] for n in params}, "x": [Shard(0)], "target": [Shard(0)]}
    link = calibrate(sizes=(1 << 10, 1 << 16), repeats=3)  # (the buckets are cut by it: one model on every rank)
    out = {"link": (link.alpha_s, link.beta_s_per_byte)}
    for overlap in (True, False):  # (as fxforge compiles by default, on the link as measured; the graph as traced)
        joint = _export_forward_backward(torch.export.export(model, (x, target)))
        config = fxforge.Config(debug=True, comm_model=link) if overlap else \
            fxforge.Config(comm_overlap=False, bucket_bytes=0, debug=True, comm_model=link)
        p = fxforge.partition(joint, mesh, placements, config=config)
        loss, grads = p(local_shard(x, mesh, [Shard(0)]), local_shard(target, mesh, [Shard(0)]))
        close(loss, ref.detach(), f"loss (overlap {overlap})")
        for fqn, g in grads.items():
            close(g, local_shard(params[fqn].grad, mesh, [Shard(0)]), f"gradient of {fqn} (overlap {overlap})")
        comm = p.stats["comm"]
        order = [n.name for n in p.compiled.plan.schedule]
        out[overlap] = {"digest": comm["order_digest"], "count": comm["count"], "exposed_s": comm["exposed_s"],
                        "estimated_s": comm["estimated_s"], "moved": (comm.get("moved_waits"), comm.get("moved_issues")),
                        "gaps": _gaps(p.compiled.plan.schedule), "order": order}
    return out


def ddp_training(rank: int, world: int) -> dict:
    """A data-parallel training step (every parameter ``Replicate()``, the batch ``Shard(0)``) of
    the MLP block through ``fxforge.partition``, bucketed and not: both give eager's loss and
    gradients, bit for bit the same; the collectives of each, and the bytes copied (the kernels
    making the gradients write them into the bucket's flat buffer)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.export.experimental import _export_forward_backward

    from partition_cases import close

    mesh, model, x, target, ref = _mlp_step(world, 2)
    params = dict(model.named_parameters())
    placements = {**{n: [Replicate()] for n in params}, "x": [Shard(0)], "target": [Shard(0)]}
    out, results = {"params": len(params)}, {}
    for name, config in (("bucketed", fxforge.Config()), ("plain", fxforge.Config(bucket_bytes=0))):
        joint = _export_forward_backward(torch.export.export(model, (x, target)))
        p = fxforge.partition(joint, mesh, placements, config=config)
        loss, grads = p(local_shard(x, mesh, [Shard(0)]), local_shard(target, mesh, [Shard(0)]))
        close(loss, ref.detach(), f"loss ({name})")
        for fqn, g in grads.items():
            close(g, params[fqn].grad, f"gradient of {fqn} ({name})")
        results[name] = (loss, grads)
        out[name] = {"kinds": [c["collective"] for c in p.stats["collectives"]], "copy_bytes": p.compiled.stats["copy_bytes"]}
    (loss, grads), (loss0, grads0) = results["bucketed"], results["plain"]
    out["same"] = torch.equal(loss, loss0) and all(torch.equal(grads[k], grads0[k]) for k in grads0)
    return out


def _mlp_step(world: int, seed: int):
    """A 1-D mesh over the ranks, the MLP block with a loss, a batch, eager's loss (its gradients
    computed on the model)."""
    from torch.distributed.device_mesh import init_device_mesh

    from partition_cases import MLPLoss

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(seed)
    model = MLPLoss(d=32, f=64)
    x, target = torch.randn(4, 8, 32), torch.randn(4, 8, 32)
    ref = model(x, target)
    ref.backward()
    return mesh, model, x, target, ref


def _gaps(schedule) -> list[int]:
    """Per collective, how many nodes run between it and its wait."""
    from fxforge.passes.overlap import is_collective, is_wait, waited_collective

    at = {n: i for i, n in enumerate(schedule)}
    return [at[w] - at[waited_collective(w)] for w in schedule if is_wait(w) and waited_collective(w) in at
            if is_collective(waited_collective(w))]


def _small_gpt(world: int, seed: int):
    """A 1-D mesh over the ranks, a small GPT, a batch for every rank, eager's loss with its
    gradients made."""
    from torch.distributed.device_mesh import init_device_mesh

    from fxforge.entry.demo import GPT, GPTConfig

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab=64, seq=16, d=32, heads=2, layers=2))
    idx, tgt = torch.randint(0, 64, (4 * world, 16)), torch.randint(0, 64, (4 * world, 16))
    ref = model(idx, tgt)
    ref.backward()
    return mesh, model, idx, tgt, ref


def gpt_fsdp_training(rank: int, world: int) -> dict:
    """A GPT training step (cross-entropy loss: a sum over ``dim=[]`` in its decomposition) with
    every parameter and the batch ``Shard(0)``, through ``fxforge.partition``: eager's loss and
    gradients; what the schedule's ``stats["comm"]`` says."""
    from torch.distributed.tensor import Shard
    from torch.export.experimental import _export_forward_backward

    from partition_cases import close

    mesh, model, idx, tgt, ref = _small_gpt(world, seed=2)
    params = dict(model.named_parameters())
    joint = _export_forward_backward(torch.export.export(model, (idx, tgt)))
    placements = {**{n: [Shard(0)] for n in params}, "idx": [Shard(0)], "targets": [Shard(0)]}
    p = fxforge.partition(joint, mesh, placements, config=fxforge.Config(debug=True))
    loss, grads = p(local_shard(idx, mesh, [Shard(0)]), local_shard(tgt, mesh, [Shard(0)]))
    close(loss, ref.detach(), "loss")
    for fqn, g in grads.items():
        close(g, local_shard(params[fqn].grad, mesh, [Shard(0)]), f"gradient of {fqn}")
    return {"digest": p.stats["comm"]["order_digest"], "count": p.stats["comm"]["count"]}


def gpt_fsdp_gathered(rank: int, world: int) -> dict:
    """FSDP proper through ``fxforge.partition``: every parameter stored ``Shard(0)`` and read
    whole (``compute_placements``), the batch ``Shard(0)``: eager's loss and gradients, as traced
    and with the defaults (buckets, overlap); what the per-rank graph holds and how its schedule
    places the gradients' reduce-scatters."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.export.experimental import _export_forward_backward

    from fxforge.core.collectives import collective_bytes
    from fxforge.core.graph import storage_root
    from fxforge.passes.overlap import is_collective
    from partition_cases import close

    mesh, model, idx, tgt, ref = _small_gpt(world, seed=3)
    params = dict(model.named_parameters())
    stored = {**{n: [Shard(0)] for n in params}, "idx": [Shard(0)], "targets": [Shard(0)]}
    out = {"params": len(params)}
    for name, config in (("traced", fxforge.Config(comm_overlap=False, bucket_bytes=0)), ("default", fxforge.Config()),
                         ("unbucketed", fxforge.Config(bucket_bytes=0))):
        joint = _export_forward_backward(torch.export.export(model, (idx, tgt)))
        p = fxforge.partition(joint, mesh, stored, config=config.replace(debug=True),
                              compute_placements={n: [Replicate()] for n in params})
        loss, grads = p(local_shard(idx, mesh, [Shard(0)]), local_shard(tgt, mesh, [Shard(0)]))
        close(loss, ref.detach(), f"loss ({name})")
        for fqn, g in grads.items():
            close(g, local_shard(params[fqn].grad, mesh, [Shard(0)]), f"gradient of {fqn} ({name})")
        schedule = p.compiled.plan.schedule
        kinds = [collective_bytes(n)[0] for n in schedule if is_collective(n)]
        at = {n: i for i, n in enumerate(schedule)}
        mms = [at[n] for n in schedule if n.target in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)]
        scatters = [at[n] for n in schedule if is_collective(n) and collective_bytes(n)[0] == "reduce_scatter"]
        gathered = [storage_root(n.args[0]) for n in schedule if is_collective(n) and collective_bytes(n)[0] == "all_gather"]
        out[name] = {"kinds": kinds, "gathered_inputs": sorted(r.name for r in gathered if r.op == "placeholder"),
                     "digest": p.stats["comm"]["order_digest"], "exposed_s": p.stats["comm"]["exposed_s"],
                     "first_scatter_before_last_matmul": bool(scatters) and min(scatters) < max(mms)}
    return out
