"""fxforge.partition: per-rank graphs with explicit collectives (docs/partition.md).

Two kinds of tests:

* real ranks (gloo, CPU, spawned by tests/partition_ranks.py, each bounded in time): numerics
  against single-device eager on 2 ranks (1-D mesh) and 4 ranks (2 x 2 mesh, and a 3-rank mesh
  for uneven shards); what each rank checks is in tests/partition_cases.py;
* in this process, over a fake process group (``torch.testing._internal.distributed.fake_pg``:
  collectives are traced and compiled but never run): every validation error, by its message,
  and the collectives and bytes of larger meshes.
"""

from __future__ import annotations

import re
import os
import sys

import pytest
import torch

import fxforge
from fxforge.core.dtensor import export_local_map, local_shape, redistribute_bytes, transform_bytes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import partition_cases as cases  # noqa: E402
from partition_ranks import run_documented_torchrun, run_ranks  # noqa: E402

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402


# --------------------------------------------------------------------------- real ranks


def test_two_ranks_mlp_training_local_map_and_readme():
    """2 gloo ranks, 1-D mesh: the TP MLP block forward; all-gather, all-to-all, reduce-scatter,
    an intentionally Partial output; a training step (loss, every parameter's local gradient =
    the slice of the single-process gradient, one SGD step); the attention body under local_map
    (HOP, inlined and eager DTensor agree); user passes on the per-rank graph; the README example."""
    r0, r1 = run_ranks(cases.two_ranks, 2)
    for r in (r0, r1):
        assert r["mlp"]["collectives"] == [("all_reduce", 384)]  # 2 (n-1)/n x [2, 3, 16] fp32
        assert r["user_passes"] == {
            "gelu_to_tanh": {"rewritten": 1},
            "count_collectives": {"collectives_seen": ["_c10d_functional.all_reduce.default",
                                                       "_c10d_functional.wait_tensor.default"]},
        }
        assert r["training"]["collectives"] == [("all_reduce", 768), ("all_reduce", 128)]  # (two gradients in one bucket)
        assert r["local_map"]["collectives"] == [("all_reduce", 640)]
        assert [c for c, _ in r["lookups"]["collectives"]].count("all_to_all") == 0
    assert r0 == r1  # SPMD: the same collectives and bytes on both ranks


def test_four_ranks_2x2_mesh_and_uneven_shards():
    """4 gloo ranks: a 2 x 2 mesh (data parallel x tensor parallel) forward and training step,
    and a 3-rank mesh with dims that do not divide (DTensor's local shapes, padded gathers)."""
    results = run_ranks(cases.four_ranks, 4)
    for rank, r in enumerate(results):
        assert r["mlp_2x2"]["collectives"] == [("all_reduce", 384)]
        assert r["training_2x2"]["collective_bytes"] > 0
        assert ("uneven" in r) == (rank < 3)
    assert results[0]["uneven"]["collectives"] == results[1]["uneven"]["collectives"]


def test_a_failing_rank_fails_the_test_with_its_traceback_in_bounded_time():
    """The launcher kills ranks stuck waiting for a failed one and reports its traceback."""
    import time

    start = time.monotonic()
    with pytest.raises(AssertionError) as e:
        run_ranks(cases.one_rank_fails, 2, grace=2.0)
    msg = str(e.value)
    assert "2 of 2 ranks failed" in msg and "RuntimeError: rank 1 fails on purpose" in msg
    assert "--- rank 0 ---" in msg  # killed, or failed itself when its peer went away
    assert time.monotonic() - start < 60


def test_readme_example_with_torchrun(tmp_path):
    """The README's partition example, run as written with torchrun (2 processes); about 15 s,
    bounded at 120 s."""
    stdout = run_documented_torchrun(cases.README, cases.README_MARKER, tmp_path)
    assert stdout.count("torch.Size([32, 16])") == 2, stdout


@pytest.mark.slow
def test_figures_mlp_2_and_4_ranks(capsys):
    """The figures of docs/partition.md: collectives, bytes per rank and arena bytes per rank of
    a larger MLP block on 2 and 4 ranks against the single-device arena."""
    rows = []
    for world in (2, 4):
        results = run_ranks(cases.figures, world)
        assert all(r == results[0] for r in results)
        rows.append((world, results[0]))
    with capsys.disabled():
        for world, r in rows:
            print(f"\n{world} ranks: {r}")
    # the table of docs/partition.md §Figures says what was measured: bytes as printed above
    import re

    doc = open(os.path.join(os.path.dirname(cases.README), "docs", "partition.md"), encoding="utf-8").read()
    table = {}
    for line in doc[doc.index("## Figures"):].splitlines():
        m = re.match(r"\| (forward|training step) \| (\d) \| .* \| ([\d,]+) \| ([\d,]+) \(([\d.]+)x\) \| ([\d,]+) \|$", line)
        if m:
            kind, world = ("forward" if m[1] == "forward" else "training"), int(m[2])
            table[kind, world] = tuple(int(v.replace(",", "")) for v in (m[3], m[4], m[6])) + (m[5],)
    measured = {(kind, world): (r[kind]["collective_bytes"], r[kind]["arena_bytes"], r[kind]["single_arena_bytes"],
                                f"{r[kind]['arena_bytes'] / r[kind]['single_arena_bytes']:.2f}")
                for world, r in rows for kind in ("forward", "training")}
    assert table == measured, f"docs/partition.md §Figures is out of date: it says {table}, measured {measured}"


# --------------------------------------------------------------------------- one process, fake group


@pytest.fixture(scope="module")
def fake_world():
    """A fake 4-rank process group in this process (this process is rank 0)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def mesh2(fake_world):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", [0, 1])


@pytest.fixture
def mesh2x2(fake_world):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2, 2))


@pytest.fixture
def mlp_ep():
    torch.manual_seed(0)
    return torch.export.export(cases.MLP(), (torch.randn(2, 3, 16),))


def test_unknown_name(mesh2, mlp_ep):
    with pytest.raises(ValueError) as e:
        fxforge.partition(mlp_ep, mesh2, {"fc3.weight": [Shard(0)]})
    msg = str(e.value)
    assert "in_placements names 'fc3.weight', which is not a parameter, buffer or user input" in msg
    assert "fc1.weight, fc1.bias, fc2.weight, fc2.bias" in msg and "by argument name: x" in msg
    assert "did you mean 'norm.weight', 'fc1.weight', 'fc2.weight'" in msg


def test_shard_dim_out_of_range(mesh2, mlp_ep):
    with pytest.raises(ValueError) as e:
        fxforge.partition(mlp_ep, mesh2, {"fc1.weight": [Shard(2)]})
    assert str(e.value) == (
        "in_placements['fc1.weight']: Shard(2) on mesh dim 0 is out of range: the input has 2 dims "
        "(shape [32, 16]); use Shard(d) with -2 <= d < 2"
    )
    with pytest.raises(ValueError, match=r"out_placements\[0\]: Shard\(3\) on mesh dim 0 is out of range: "
                                         r"the input has 3 dims \(shape \[2, 3, 16\]\)"):
        fxforge.partition(mlp_ep, mesh2, out_placements=[[Shard(3)]])


def test_wrong_number_of_placements(mesh2x2, mlp_ep):
    with pytest.raises(ValueError) as e:
        fxforge.partition(mlp_ep, mesh2x2, {"fc1.weight": [Shard(0)]})
    assert str(e.value) == (
        "in_placements['fc1.weight'] has 1 placement [Shard(0)] for a 2-D mesh of shape (2, 2); expected 2, one per "
        "mesh dim (e.g. [Replicate(), Shard(0)]; use Replicate() for a mesh dim the tensor is not split over)"
    )
    with pytest.raises(ValueError, match=r"out_placements has 2 entries but the program returns 1 value; give one "
                                         r"per returned value"):
        fxforge.partition(mlp_ep, mesh2x2, out_placements=[[Replicate(), Replicate()]] * 2)
    with pytest.raises(ValueError, match=r"in_placements\['x'\] is 'Shard\(0\)'; expected a list of 2 placements"):
        fxforge.partition(mlp_ep, mesh2x2, {"x": "Shard(0)"})


def _attention_hop_ep(mesh):
    torch.manual_seed(2)
    return export_local_map(cases.Attention(mesh), (torch.randn(2, 5, 16),))


def _region_kwargs(ep):
    from torch._higher_order_ops.local_map import local_map_hop

    (node,) = [n for n in ep.graph.nodes if n.target is local_map_hop]
    body = getattr(ep.graph_module, node.args[0].target)
    return body.meta["local_map_kwargs"]


def test_local_map_region_placement_counts(mesh2):
    ep = _attention_hop_ep(mesh2)
    kw = _region_kwargs(ep)
    good_in, good_out = kw["in_placements"], kw["out_placements"]
    kw["in_placements"] = good_in[:2]
    with pytest.raises(ValueError) as e:
        fxforge.partition(ep, mesh2, cases.attention_placements())
    assert str(e.value).startswith(
        "local_map region 'local_map_hop' (body 'local_map_body_0') declares 2 in_placements for 3 inputs "
        "(transpose, transpose_1, transpose_2); give one placement list per input of the region's function")
    kw["in_placements"], kw["out_placements"] = good_in, (*good_out, (Shard(0),))
    with pytest.raises(ValueError, match=r"local_map region 'local_map_hop' \(body 'local_map_body_0'\) declares 2 "
                                         r"out_placements for 1 outputs"):
        fxforge.partition(ep, mesh2, cases.attention_placements())
    kw["out_placements"] = good_out
    p = fxforge.partition(ep, mesh2, cases.attention_placements())  # restored: fine
    assert [c["collective"] for c in p.stats["collectives"]] == ["all_reduce"]


def test_partial_output_never_reduced(mesh2, mlp_ep):
    with pytest.raises(ValueError) as e:
        fxforge.partition(mlp_ep, mesh2, cases.tp(), out_placements=[None])
    msg = str(e.value)
    # the output's node name depends on how the backend decomposes the graph ('add', 'add_2')
    assert re.match(
        r"output 0 \('add(_\d+)?'\) is \[Partial\(\)\] after propagation \(a sum not yet reduced over mesh "
        r"dim 0\) and out_placements\[0\] is None \(keep as propagated\), so it would be returned unreduced\.",
        msg,
    ), msg
    assert "Declare out_placements[0] = [Replicate()] (all-reduce), a Shard(d) placement (reduce-scatter), or " \
           "[Partial()] to return the partial values on purpose." in msg


def test_reshape_of_sharded_dim(mesh2):
    class Split(torch.nn.Module):
        def forward(self, x):
            return (x * 2).view(4, 3, 2)

    ep = torch.export.export(Split(), (torch.randn(4, 6),))
    with pytest.raises(ValueError) as e:
        fxforge.partition(ep, mesh2, {"x": [Shard(1)]})
    msg = str(e.value)
    assert msg.startswith("node 'view' (aten.view.default) reshapes 'mul' [4, 6] [Shard(1)] -> [4, 3, 2], which splits "
                          "or merges a sharded dim in a way no sharding strategy of aten.view.default supports "
                          "(DTensor: Cannot unflatten unevenly sharded tensor"), msg
    assert "The sharded dim comes from in_placements['x'] = [Shard(1)] ('x' (args[0]))" in msg
    assert "Fix: shard a dim the program does not reshape" in msg
    p = fxforge.partition(ep, mesh2, {"x": [Shard(0)]})  # the leading dim is not reshaped: no communication
    assert p.stats["collectives"][0]["collective"] == "all_gather"  # only for the Replicate output
    with pytest.raises(fxforge.InputError, match=r"'x' \(args\[0\]\) local shard: size\(0\) is 4, expected 2"):
        p(torch.randn(4, 6))  # the full tensor where this rank's shard is expected


def test_collectives_and_bytes_on_larger_meshes(fake_world, mesh2x2):
    """Structure only (fake group): the MLP on a 4-rank 1-D mesh sends 2 (n-1)/n of the output
    in one all-reduce, on the 2 x 2 mesh only over the tensor-parallel dim; arenas shrink per rank."""
    from torch.distributed.device_mesh import DeviceMesh

    torch.manual_seed(0)
    model = cases.MLP(64, 256)
    x = torch.randn(4, 8, 64)
    ep = torch.export.export(model, (x,))
    single = fxforge.compile_exported(ep).stats["arena_bytes"]
    p4 = fxforge.partition(ep, DeviceMesh("cpu", [0, 1, 2, 3]), cases.tp())
    out_bytes = x.numel() * 4
    assert [(c["collective"], c["bytes"]) for c in p4.stats["collectives"]] == [("all_reduce", 2 * 3 * out_bytes // 4)]
    assert p4.stats["collective_bytes"] == 2 * 3 * out_bytes // 4
    assert p4.stats["arena_bytes"] < single
    assert tuple(p4.state["fc1.weight"].shape) == (64, 64)
    p22 = fxforge.partition(ep, mesh2x2, {**cases.tp(dims=2, at=1), "x": [Shard(0), Replicate()]},
                            [[Shard(0), Replicate()]])
    # only the tensor-parallel dim reduces, over this rank's half of the batch: 2 (n-1)/n = 1 x it
    assert [(c["collective"], c["bytes"]) for c in p22.stats["collectives"]] == [("all_reduce", out_bytes // 2)]
    assert p22.input_placements["fc1.weight"] == (Replicate(), Shard(0))
    assert p22.placements["addmm_1"] == (Shard(0), Partial())  # the row-parallel matmul, before its reduction


@pytest.mark.parametrize("vocab, rows, accumulated", [(12, 64, True), (4096, 2, False)])
def test_lookup_gradients_accumulate_locally_where_that_sends_less(mesh2, vocab, rows, accumulated):
    """A row lookup's gradient (``index_put`` into zeros, accumulating) under FSDP: each rank
    accumulates its own rows and the sum is reduce-scattered where that sends fewer bytes than
    DTensor's strategy (ids gathered, rows all-to-all'd); with a table far larger than the rows
    looked up, DTensor's strategy stays.  (Values on real ranks: test_two_ranks_...'s lookups.)"""
    from torch.export.experimental import _export_forward_backward

    torch.manual_seed(0)
    model = cases.Lookups(vocab)
    ids, target = torch.randint(0, vocab, (2, rows)), torch.randn(2, rows, 16)
    joint = _export_forward_backward(torch.export.export(model, (ids, target)))
    names = [n for n, _ in model.named_parameters()]
    p = fxforge.partition(joint, mesh2, {**{n: [Shard(0)] for n in names}, "ids": [Shard(0)], "target": [Shard(0)]},
                          compute_placements={n: [Replicate()] for n in names}, config=fxforge.Config(bucket_bytes=0))
    kinds = [c["collective"] for c in p.stats["collectives"]]
    assert ("all_to_all" not in kinds) == accumulated, kinds
    # the two lookups' gradients reduce-scattered with the positions' and the projection's two, or
    # moved as DTensor moves them; the loss alone is all-reduced (the positions' gradient stays Partial)
    assert kinds.count("reduce_scatter") == (5 if accumulated else 3), kinds
    assert kinds.count("all_reduce") == 1, kinds


def test_redistribute_bytes_table(mesh2x2):
    """The byte counts of docs/partition.md, on DTensor's own transform plans."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    meta = TensorMeta(torch.Size([8, 6]), (6, 1), torch.float32)

    def spec(*p):
        return DTensorSpec(mesh2x2, p, tensor_meta=meta)

    full = 8 * 6 * 4
    R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()
    assert redistribute_bytes(spec(S0, R), spec(R, R)) == full // 2  # all-gather over dim 0: (n-1) x shard
    assert redistribute_bytes(spec(P, R), spec(R, R)) == full  # all-reduce: 2 (n-1)/n x tensor
    assert redistribute_bytes(spec(P, R), spec(S0, R)) == full // 2  # reduce-scatter: (n-1)/n x tensor
    assert redistribute_bytes(spec(S0, R), spec(S1, R)) == full // 2 // 2  # all-to-all: (n-1)/n x shard
    assert redistribute_bytes(spec(R, R), spec(S0, S1)) == 0  # local slices
    assert redistribute_bytes(spec(R, S0), spec(R, R)) == full // 2  # over mesh dim 1: the same table
    assert transform_bytes("all_gather", [7, 6], torch.float32, 2, 0) == 4 * 6 * 4  # uneven: the padded chunk
    assert local_shape((10, 6), mesh2x2, [Shard(0), Replicate()]) == (5, 6)


def test_async_collectives_keep_their_input_alive_until_their_wait(mesh2):
    """An all-gather or all-to-all reads its input until its wait_tensor: the memory plan keeps
    the input's buffer live until the wait (graph.liveness), so no kernel the schedule puts in
    between can reuse its bytes."""

    class Scale(torch.nn.Module):
        def forward(self, x):
            y = (x * 2 + 1) * 3  # a planned buffer feeds both collectives
            return y, y

    ep = torch.export.export(Scale(), (torch.randn(5, 6),))
    p = fxforge.partition(ep, mesh2, {"x": [Shard(0)]}, [[Replicate()], [Shard(1)]])
    from fxforge.core.graph import storage_root

    f = torch.ops._c10d_functional
    plan = p.compiled.plan
    pos = {n: i for i, n in enumerate(plan.schedule)}
    checked = 0
    for n in plan.schedule:
        if n.target in (f.all_gather_into_tensor.default, f.all_to_all_single.default):
            buf = plan.memory.buffers.get(storage_root(n.args[0]).name)
            waits = [u for u in n.users if u.target is f.wait_tensor.default]
            assert waits, p.source
            if buf is not None:  # a planned buffer (others are allocated by their kernel)
                assert buf.end >= max(pos[w] for w in waits) > pos[n], (buf, [w.name for w in waits])
                checked += 1
    assert checked >= 1, p.source
    assert p.stats["collective_bytes"] == sum(c["bytes"] for c in p.stats["collectives"]) > 0


def test_compute_placements_are_checked(mesh2, mlp_ep):
    """``compute_placements`` names inputs as ``in_placements`` does, with its own name in the
    error; an input the program mutates cannot be read in other placements than it is stored."""
    from torch.distributed.tensor import Replicate

    with pytest.raises(ValueError, match="compute_placements names 'fc3.weight', which is not a parameter"):
        fxforge.partition(mlp_ep, mesh2, {"fc1.weight": [Shard(0)]}, compute_placements={"fc3.weight": [Replicate()]})
    with pytest.raises(ValueError, match=r"compute_placements\['fc1.weight'\]"):
        fxforge.partition(mlp_ep, mesh2, {"fc1.weight": [Shard(0)]},
                          compute_placements={"fc1.weight": [Replicate(), Replicate()]})
    with pytest.raises(ValueError, match="compute_placements is list"):
        fxforge.partition(mlp_ep, mesh2, {"fc1.weight": [Shard(0)]}, compute_placements=[Replicate()])

    class Running(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(4))

        def forward(self, x):
            self.seen.add_(x.sum(0))
            return x * 2

    ep = torch.export.export(Running(), (torch.randn(8, 4),))
    with pytest.raises(ValueError, match="'seen', which the program mutates"):
        fxforge.partition(ep, mesh2, {"seen": [Shard(0)]}, compute_placements={"seen": [Replicate()]})
