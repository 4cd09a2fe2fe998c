"""What each rank runs in tests/test_partition.py (module-level functions: spawned processes import
them by name).  Each ``*_ranks(rank, world)`` function checks its results against single-device
eager on the spot (an assertion error carries the rank's traceback back) and returns figures."""

from __future__ import annotations

import math
import os
import re

import torch
import torch.nn.functional as F

import fxforge
from fxforge.core.dtensor import export_local_map, local_shape, local_shard

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
README_MARKER = "<!-- runs with torchrun --nproc-per-node 2 in tests/test_partition.py -->"


def _dt():
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Shard, Replicate, Partial


class MLP(torch.nn.Module):
    """A transformer MLP block: x + fc2(gelu(fc1(norm(x)))); fc1 column-, fc2 row-parallel."""

    def __init__(self, d: int = 16, f: int = 32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, f)
        self.fc2 = torch.nn.Linear(f, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class MLPLoss(torch.nn.Module):
    def __init__(self, d: int = 16, f: int = 32):
        super().__init__()
        self.block = MLP(d, f)

    def forward(self, x, target):
        return F.mse_loss(self.block(x), target)


def tp(prefix: str = "", dims: int = 1, at: int = 0) -> dict:
    """Megatron placements: fc1 column-parallel, fc2 row-parallel, on mesh dim ``at``."""
    Shard, Replicate, _ = _dt()

    def on(p):
        return [p if d == at else Replicate() for d in range(dims)]

    return {f"{prefix}fc1.weight": on(Shard(0)), f"{prefix}fc1.bias": on(Shard(0)), f"{prefix}fc2.weight": on(Shard(1))}


def close(a, b, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def collectives(p) -> list[tuple[str, int]]:
    return [(c["collective"], c["bytes"]) for c in p.stats["collectives"]]


# --------------------------------------------------------------------------- checks


def check_mlp(mesh, d: int = 16, f: int = 32, batch: int = 2, seq: int = 3, figures: bool = False) -> dict:
    """Forward of the tensor-parallel MLP block: outputs equal eager; one all-reduce of the output."""
    torch.manual_seed(0)
    model = MLP(d, f)
    x = torch.randn(batch, seq, d)
    ep = torch.export.export(model, (x,))
    p = fxforge.partition(ep, mesh, tp(dims=mesh.ndim, at=mesh.ndim - 1))
    with torch.no_grad():
        expected = model(x)
    close(p(x), expected, "TP MLP forward")
    close(p(x), expected, "TP MLP forward, second call")
    n = mesh.size(mesh.ndim - 1)
    assert collectives(p) == [("all_reduce", 2 * (n - 1) * expected.numel() * 4 // n)], collectives(p)
    assert "_c10d_functional.all_reduce.default(" in p.source
    assert "_c10d_functional.wait_tensor.default(" in p.source
    for fqn in ("fc1.weight", "fc1.bias", "fc2.weight"):
        assert tuple(p.state[fqn].shape) == local_shape(ep.state_dict[fqn].shape, mesh, p.input_placements[fqn])
    out = {"collectives": collectives(p), "collective_bytes": p.stats["collective_bytes"],
           "arena_bytes": p.stats["arena_bytes"]}
    if figures:
        out["single_arena_bytes"] = fxforge.compile_exported(ep).stats["arena_bytes"]
    return out


def check_user_pass(mesh) -> dict:
    """User passes (README 'Your own passes') run on the per-rank graph: an ``after_lowering``
    pass that switches gelu to its tanh approximation (the partitioned outputs then equal eager
    with tanh gelu, not exact gelu) and an ``after_fusion`` pass that counts the collectives it
    sees; each runs once per compile and is recorded in ``stats["passes"]`` with its stats."""
    calls = {"gelu_to_tanh": 0, "count_collectives": 0}

    def gelu_to_tanh(gm):
        calls["gelu_to_tanh"] += 1
        rewritten = 0
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.gelu.default and node.kwargs.get("approximate", "none") != "tanh":
                node.kwargs = {**node.kwargs, "approximate": "tanh"}
                rewritten += 1
        gm.recompile()
        return fxforge.PassResult(gm, rewritten > 0, {"rewritten": rewritten})

    def count_collectives(gm):
        calls["count_collectives"] += 1
        seen = sorted(str(n.target) for n in gm.graph.nodes
                      if n.op == "call_function" and "_c10d_functional" in str(n.target))
        return fxforge.PassResult(gm, False, {"collectives_seen": seen})

    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(2, 3, 16)
    ep = torch.export.export(model, (x,))
    config = fxforge.Config(passes={"after_lowering": [gelu_to_tanh], "after_fusion": [count_collectives]})
    p = fxforge.partition(ep, mesh, tp(dims=mesh.ndim, at=mesh.ndim - 1), config=config)
    got = p(x)
    with torch.no_grad():
        exact = model(x)
        tanh = x + model.fc2(F.gelu(model.fc1(model.norm(x)), approximate="tanh"))
    close(got, tanh, "TP MLP forward with the user pass gelu -> tanh gelu")
    assert (got - exact).abs().max() > 1e-5, "the user pass had no effect on the partitioned outputs"
    assert calls == {"gelu_to_tanh": 1, "count_collectives": 1}, calls
    records = {r["name"]: r for r in p.stats["passes"] if r["name"] in calls}
    assert set(records) == set(calls), [r["name"] for r in p.stats["passes"]]
    assert records["gelu_to_tanh"]["modified"] and records["gelu_to_tanh"]["stats"] == {"rewritten": 1}, records
    # the tanh form in the generated code: an ATen call's argument, or the C kernel's tanh (the
    # prelude's, or the C library's vector tanh)
    assert any(t in p.source for t in ("approximate = 'tanh'", "approximate='tanh'", "fx_tanhf(", " tanhf(")), p.source
    return {name: records[name]["stats"] for name in calls}


def check_collectives(mesh) -> dict:
    """Each redistribution as its collective, with the bytes the table in fxforge/core/dtensor.py gives."""
    Shard, Replicate, Partial = _dt()
    n = mesh.size()

    class Scale(torch.nn.Module):
        def forward(self, x):
            y = x * 2 + 1
            return y, y, y

    x = torch.randn(4, 6)
    ep = torch.export.export(Scale(), (x,))
    local = local_shard(x, mesh, [Shard(0)])
    shard_bytes = local.numel() * 4
    # out 0: Shard -> Replicate (all-gather); out 1: Shard(0) -> Shard(1) (all-to-all); out 2: as propagated
    p = fxforge.partition(ep, mesh, {"x": [Shard(0)]}, [[Replicate()], [Shard(1)], None])
    full, swapped, kept = p(local)
    y = x * 2 + 1
    close(full, y, "all-gather output")
    close(swapped, local_shard(y, mesh, [Shard(1)]), "all-to-all output")
    close(kept, local_shard(y, mesh, [Shard(0)]), "output kept as propagated")
    assert sorted(collectives(p)) == [("all_gather", (n - 1) * shard_bytes), ("all_to_all", (n - 1) * shard_bytes // n)], \
        collectives(p)
    assert "all_gather_into_tensor.default(" in p.source and "all_to_all_single.default(" in p.source

    class Flatten(torch.nn.Module):
        def forward(self, x):
            return (x * 2).reshape(-1)

    # flattening a sharded dim that is not the first: a _StridedShard, gathered in rank order
    f = fxforge.partition(torch.export.export(Flatten(), (x,)), mesh, {"x": [Shard(1)]})
    close(f(local_shard(x, mesh, [Shard(1)])), (x * 2).reshape(-1), "_StridedShard all-gather")
    assert [c for c, _ in collectives(f)] == ["all_gather"]

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = MLP()

        def forward(self, x):
            y = self.block(x)
            return y, y

    torch.manual_seed(0)
    model = Twice()
    xm = torch.randn(4, 3, 16)
    epm = torch.export.export(model, (xm,))
    with torch.no_grad():
        expected = model(xm)[0]
    # out 0: Partial -> Shard(0) (reduce-scatter); out 1: returned unreduced, on purpose
    q = fxforge.partition(epm, mesh, tp("block."), [[Shard(0)], [Partial()]])
    scattered, partial = q(xm)
    close(scattered, local_shard(expected, mesh, [Shard(0)]), "reduce-scatter output")
    assert collectives(q) == [("reduce_scatter", (n - 1) * expected.numel() * 4 // n)], collectives(q)
    assert "reduce_scatter_tensor.default(" in q.source
    sums = [torch.empty_like(partial) for _ in range(n)]
    torch.distributed.all_gather(sums, partial)
    close(sum(sums), expected, "partial sums")
    return {"scale": collectives(p), "mlp": collectives(q)}


def check_training(mesh, placements: dict, data: list | None = None, batch: int = 4) -> dict:
    """A training step of the MLP block: the joint forward+backward program
    (torch.export + _export_forward_backward) partitioned; the loss equals eager's, every
    parameter's local gradient equals the matching slice of the single-process gradient, and an
    SGD step on the local shards gives the next loss eager gives."""
    from torch.export.experimental import _export_forward_backward

    Shard, Replicate, _ = _dt()
    torch.manual_seed(1)
    model = MLPLoss()
    x, target = torch.randn(batch, 3, 16), torch.randn(batch, 3, 16)
    joint = _export_forward_backward(torch.export.export(model, (x, target)))
    data = data or [Replicate()] * mesh.ndim
    p = fxforge.partition(joint, mesh, {**placements, "x": data, "target": data})
    xl, tl = local_shard(x, mesh, data), local_shard(target, mesh, data)
    loss, grads = p(xl, tl)
    ref = model(x, target)
    ref.backward()
    close(loss, ref.detach(), "loss")
    params = dict(model.named_parameters())
    assert set(grads) == set(params), sorted(grads)
    for fqn, g in grads.items():
        want = local_shard(params[fqn].grad, mesh, p.input_placements[fqn])
        close(g, want, f"gradient of {fqn} (placements {p.input_placements[fqn]})")
    lr = 0.1
    with torch.no_grad():
        for fqn, g in grads.items():
            p.state[fqn] -= lr * g
            params[fqn] -= lr * params[fqn].grad
    loss2, _ = p(xl, tl)
    close(loss2, model(x, target).detach(), "loss after one SGD step")
    return {"collectives": collectives(p), "collective_bytes": p.stats["collective_bytes"]}


class Halves(torch.nn.Module):
    """A projection whose halves are swapped and one negated (as rotary positions do): its
    backward scatters each half's gradient into zeros (``slice_scatter``)."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x, target):
        h = self.proj(x)
        a, b = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2:]
        return F.mse_loss(h * 0.5 + torch.cat([-b, a], dim=-1), target)


def check_sliced_backward(mesh, batch: int = 4) -> dict:
    """FSDP (parameters stored ``Shard(0)``, read whole; the batch ``Shard(0)``) of ``Halves``: the
    loss and gradients equal eager's, and the only collectives are the parameters' gathers, the
    gradients' reduce-scatters and the loss's all-reduce: no activation is gathered (the
    backward's scatters into zeros are pads, which keep the batch sharded)."""
    torch.manual_seed(3)
    model = Halves()
    p = fsdp_step(mesh, model, {"x": torch.randn(batch, 3, 16), "target": torch.randn(batch, 3, 16)})
    kinds = sorted(c for c, _ in collectives(p))
    assert kinds == ["all_gather", "all_gather", "all_reduce", "reduce_scatter", "reduce_scatter"], kinds
    return {"collectives": collectives(p)}


def fsdp_step(mesh, model, inputs: dict):
    """``model``'s training step (``inputs`` by argument name) partitioned FSDP-style (parameters
    stored ``Shard(0)``, read whole; the batch ``Shard(0)``), unbucketed, run on this rank's
    shards: the loss and every gradient equal eager's.  The ``Partitioned``."""
    from torch.export.experimental import _export_forward_backward

    Shard, Replicate, _ = _dt()
    joint = _export_forward_backward(torch.export.export(model, tuple(inputs.values())))
    names = [n for n, _ in model.named_parameters()]
    p = fxforge.partition(joint, mesh, {**{n: [Shard(0)] for n in names}, **{k: [Shard(0)] for k in inputs}},
                          compute_placements={n: [Replicate()] for n in names}, config=fxforge.Config(bucket_bytes=0))
    loss, grads = p(*(local_shard(v, mesh, [Shard(0)]) for v in inputs.values()))
    ref = model(*inputs.values())
    ref.backward()
    close(loss, ref.detach(), "loss")
    for fqn, g in grads.items():
        close(g, local_shard(dict(model.named_parameters())[fqn].grad, mesh, [Shard(0)]), f"gradient of {fqn}")
    return p


class Lookups(torch.nn.Module):
    """Row lookups: token embeddings, a table indexed by ``x[idx]`` and positions (ids the same
    on every rank).  Their backward accumulates the rows' gradients into zeros
    (``index_put(..., accumulate=True)``); the positions' gradient, summed over the batch, is
    masked by the ids in range first (``where(mask, 0, g)``)."""

    def __init__(self, vocab: int = 12, d: int = 16, seq: int = 64):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.table = torch.nn.Parameter(torch.randn(vocab, d))
        self.pos = torch.nn.Embedding(seq, d)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, ids, target):
        h = self.tok(ids) + self.table[ids] + self.pos(torch.arange(ids.shape[1]))
        return F.mse_loss(self.proj(h), target)


def check_lookup_backward(mesh, batch: int = 4, vocab: int = 12) -> dict:
    """FSDP of ``Lookups`` (repeated ids: rows accumulate): loss and gradients equal eager's,
    and the only collectives are the parameters' gathers, the gradients' reduce-scatters and the
    loss's all-reduce: the ids are not gathered, the rows' gradients not all-to-all'd (each rank
    accumulates its own rows; the sum is reduce-scattered with the other gradients), the
    positions' gradient not all-reduced before it is masked."""
    torch.manual_seed(5)
    model = Lookups(vocab)
    ids = torch.randint(0, vocab // 2, (batch, 6))  # (half the table: every row read is read again)
    p = fsdp_step(mesh, model, {"ids": ids, "target": torch.randn(batch, 6, 16)})
    kinds = sorted(c for c, _ in collectives(p))
    assert kinds == ["all_gather"] * 5 + ["all_reduce"] + ["reduce_scatter"] * 5, kinds
    return {"collectives": collectives(p)}


def _attention_body(q, k, v):
    """Attention over the heads this rank holds: written on local shapes."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


class Attention(torch.nn.Module):
    """Heads split over ranks: q/k/v column-parallel, the attention body in a local_map region
    (heads dim sharded), the output projection row-parallel."""

    def __init__(self, mesh, d: int = 16, heads: int = 4):
        super().__init__()
        from torch.distributed.tensor.experimental import local_map

        Shard, _, _ = _dt()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        # one placement tuple per output and per input (the form Dynamo's local_map_hop takes)
        self.body = local_map(_attention_body, out_placements=((Shard(1),),), in_placements=((Shard(1),),) * 3,
                              device_mesh=mesh, redistribute_inputs=True)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (f(x).view(b, s, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = self.body(q, k, v)
        return self.o(y.transpose(1, 2).reshape(b, s, d))


def attention_placements() -> dict:
    Shard, _, _ = _dt()
    return {"q.weight": [Shard(0)], "k.weight": [Shard(0)], "v.weight": [Shard(0)], "o.weight": [Shard(1)]}


def check_local_map(mesh) -> dict:
    """The attention-like body under local_map: the program exported with the region as a
    local_map_hop node, the same program exported without it (the body inlined, on global
    shapes), and eager DTensor (local_map inlined under DTensor) give the same per-rank results,
    equal to single-device eager."""
    from torch._higher_order_ops.local_map import local_map_hop
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    torch.manual_seed(2)
    model = Attention(mesh)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = model(x)
    placements = attention_placements()

    hop_ep = export_local_map(model, (x,))
    regions = [n for n in hop_ep.graph.nodes if n.target is local_map_hop]
    assert len(regions) == 1, hop_ep.graph
    inlined_ep = torch.export.export(model, (x,))
    assert not any(n.target is local_map_hop for n in inlined_ep.graph.nodes)

    with_hop = fxforge.partition(hop_ep, mesh, placements)
    inlined = fxforge.partition(inlined_ep, mesh, placements)
    got_hop, got_inlined = with_hop(x), inlined(x)

    # eager DTensor: parameters distributed, local_map applied to DTensors
    dmodel = Attention(mesh)
    dmodel.load_state_dict(model.state_dict())
    for name, param in list(dmodel.named_parameters()):
        mod, attr = name.rsplit(".", 1)
        setattr(getattr(dmodel, mod), attr,
                torch.nn.Parameter(distribute_tensor(param.detach(), mesh, placements.get(name, [Replicate()]))))
    with torch.no_grad():
        y = dmodel(distribute_tensor(x, mesh, [Replicate()]))
    assert isinstance(y, DTensor)
    got_dtensor = y.redistribute(mesh, [Replicate()]).to_local()

    close(got_hop, got_inlined, "local_map region vs inlined")
    close(got_hop, got_dtensor, "local_map region vs eager DTensor")
    close(got_hop, expected, "local_map region vs single device")
    # the region's body runs as written on local shapes: scores over the rank's heads only
    heads = 4 // mesh.size()
    bmm = [n for n in with_hop.graph.graph.nodes if n.target is torch.ops.aten.bmm.default]
    assert bmm and all(n.meta["val"].shape[0] == 2 * heads for n in bmm), [n.meta["val"].shape for n in bmm]
    assert collectives(with_hop) == collectives(inlined) == [("all_reduce", 2 * (mesh.size() - 1) * x.numel() * 4 // mesh.size())]
    return {"collectives": collectives(with_hop)}


def check_uneven(mesh) -> dict:
    """3 ranks, dims that do not divide: DTensor's local shapes (chunks of ceil(n / 3), the last
    smaller), outputs equal eager, uneven all-gathers padded."""
    Shard, Replicate, _ = _dt()
    torch.manual_seed(3)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 10)
            self.fc2 = torch.nn.Linear(10, 7)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    model = Net()
    x = torch.randn(5, 6)
    ep = torch.export.export(model, (x,))
    placements = {"fc1.weight": [Shard(0)], "fc1.bias": [Shard(0)], "fc2.weight": [Shard(1)], "x": [Shard(0)]}
    p = fxforge.partition(ep, mesh, placements, [[Shard(1)]])
    rank = mesh.get_local_rank()
    sizes = {"fc1.weight": [(4, 6), (4, 6), (2, 6)][rank], "fc2.weight": [(7, 4), (7, 4), (7, 2)][rank]}
    for fqn, shape in sizes.items():
        assert tuple(p.state[fqn].shape) == shape == local_shape(ep.state_dict[fqn].shape, mesh, placements[fqn])
    xl = local_shard(x, mesh, [Shard(0)])
    assert xl.shape[0] == [2, 2, 1][rank]
    with torch.no_grad():
        expected = model(x)
    got = p(xl)
    assert got.shape == (5, [3, 3, 1][rank]), got.shape
    close(got, local_shard(expected, mesh, [Shard(1)]), "uneven output")
    return {"collectives": collectives(p)}


def run_readme_example() -> None:
    text = open(README, encoding="utf-8").read()
    (code,) = re.findall(re.escape(README_MARKER) + r"\n```python\n(.*?)```", text, flags=re.S)
    exec(compile(code, "README.md (partition example)", "exec"), {"__name__": "__main__"})


# --------------------------------------------------------------------------- per world size


def two_ranks(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    figures = {
        "mlp": check_mlp(mesh),
        "user_passes": check_user_pass(mesh),
        "collectives": check_collectives(mesh),
        "training": check_training(mesh, tp("block.")),
        "local_map": check_local_map(mesh),
        "sliced": check_sliced_backward(mesh),
        "lookups": check_lookup_backward(mesh),
    }
    run_readme_example()  # last: it ends the process group, as a script does
    return figures


def four_ranks(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    Shard, Replicate, _ = _dt()
    figures = {}
    # 2 x 2: data parallel over mesh dim 0 (batch sharded), tensor parallel over mesh dim 1
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    figures["mlp_2x2"] = check_mlp(mesh2)
    figures["training_2x2"] = check_training(mesh2, tp("block.", dims=2, at=1), data=[Shard(0), Replicate()])
    three = DeviceMesh("cpu", [0, 1, 2])  # every rank takes part in creating it
    if rank < 3:
        figures["uneven"] = check_uneven(three)
    return figures


def figures(rank: int, world: int) -> dict:
    """docs/partition.md's table: the TP MLP block (d=256, f=1024, x [4, 64, 256] fp32) on a
    1-D mesh of ``world`` ranks, forward and training step, against one device."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.export.experimental import _export_forward_backward

    mesh = init_device_mesh("cpu", (world,))
    out = {"forward": check_mlp(mesh, d=256, f=1024, batch=4, seq=64, figures=True)}
    torch.manual_seed(1)
    model = MLPLoss(256, 1024)
    x, target = torch.randn(4, 64, 256), torch.randn(4, 64, 256)
    ep = torch.export.export(model, (x, target))
    joint = _export_forward_backward(ep)
    p = fxforge.partition(joint, mesh, tp("block."))
    loss, grads = p(x, target)
    ref = model(x, target)
    close(loss, ref.detach(), "loss")
    single = fxforge.compile_exported(_export_forward_backward(torch.export.export(model, (x, target))))
    out["training"] = {
        "collectives": collectives(p),
        "collective_bytes": p.stats["collective_bytes"],
        "arena_bytes": p.stats["arena_bytes"],
        "single_arena_bytes": single.stats["arena_bytes"],
    }
    return out


def one_rank_fails(rank: int, world: int) -> None:
    """Rank 1 raises; rank 0 waits for it in a collective that never completes."""
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    torch.distributed.barrier()
