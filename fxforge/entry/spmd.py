"""``fxforge.partition``: this rank's compiled part of a single-device exported program.

Every rank calls ``partition(ep, mesh, in_placements)`` with the same program (SPMD).  The
per-rank graph (local shards plus explicit functional collectives) comes from
``passes/partition.py``; it then goes through fxforge's pipeline like any other graph (fusion,
memory plan, codegen), so ``Partitioned.compiled`` is an ordinary ``Compiled`` whose
``stats["collective_bytes"]`` is what this rank sends per call.  See docs/partition.md.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ..core import dtensor as dth
from ..codegen.registry import DEFAULT_REGISTRY, Registry
from ..artifact.compiled import Compiled
from ..spine import compile_graph
from ..core.config import Config
from ..core.graph import VAL, is_mutating
from ..artifact.inputs import Expected, check_inputs
from ..core.signature import flatten_call
from ..passes.partition import (
    GRADIENTS,
    RETURNED,
    STATE_KINDS,
    RankInput,
    RankOutput,
    check_regions,
    decompositions,
    local_map_hop,
    rank_inputs,
    rank_outputs,
    trace_rank,
)

__all__ = ["Partitioned", "partition"]


class Partitioned:
    """This rank's part of a partitioned program: call it with this rank's local shards of the
    user inputs (same structure as ``ep.module()``'s arguments).

    Returns the outputs (local values with their ``out_placements``), and for a training program
    (``torch.export.experimental._export_forward_backward``) ``(outputs, grads)`` with ``grads``
    the local gradients by parameter FQN (laid out as ``state``'s shards).  ``state``: this rank's
    shards of parameters, buffers and constants, read on every call; buffer mutations are written
    back to it.  ``compiled``: the ``Compiled`` per-rank graph (``stats``, ``source``, ``plan``),
    with ``stats["collective_bytes"]`` and ``stats["collectives"]``.  ``placements``: the
    placement propagation gave each node of the (decomposed) program.
    """

    def __init__(self, compiled: Compiled, program: ExportedProgram, mesh, ins: list[RankInput], outs: list[RankOutput],
                 placements: dict, state: dict):
        self.compiled = compiled
        self.program = program
        self.mesh = mesh
        self.inputs = ins
        self.outputs = outs
        self.placements = placements
        self.state = state
        self.input_placements = {i.name: i.placements for i in ins}
        self.output_placements = [o.placements for o in outs if o.kind in RETURNED]
        graph_ph = [n for n in compiled.graph.graph.nodes if n.op == "placeholder"]
        self._expected = [Expected.of(f"{i.where} local shard", graph_ph[k].meta.get(VAL))
                          for k, i in enumerate(ins) if i.kind == InputKind.USER_INPUT]

    @property
    def stats(self) -> dict:
        return self.compiled.stats

    @property
    def source(self) -> str:
        return self.compiled.source

    @property
    def graph(self) -> fx.GraphModule:
        return self.compiled.graph

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ep = self.program
        flat = flatten_call(ep.call_spec.in_spec, args, kwargs, "partitioned program")
        checked = check_inputs(self._expected, flat)
        user = iter(checked.args)
        originals = iter(flat)
        graph_args, given = [], {}
        for i in self.inputs:
            if i.kind == InputKind.USER_INPUT:
                given[i.node] = next(originals)
                graph_args.append(next(user))
            else:
                graph_args.append(self.state[i.name])
        results = self.compiled.call_boxed(graph_args)
        returned, grads = [], {}
        for o, r in zip(self.outputs, results):
            if o.kind in RETURNED:
                returned.append(r)
            elif o.kind in GRADIENTS:
                grads[o.target] = r
            elif o.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
                with torch.no_grad():
                    self.state[o.target].copy_(r)
            elif o.kind == OutputKind.USER_INPUT_MUTATION:
                with torch.no_grad():
                    given[o.target].copy_(r)
        out_spec = ep.call_spec.out_spec
        out = pytree.tree_unflatten(returned, out_spec) if out_spec is not None and out_spec.num_leaves == len(returned) \
            else tuple(returned)
        return (out, grads) if any(o.kind in GRADIENTS for o in self.outputs) else out

    def __repr__(self) -> str:
        s = self.stats
        return (f"<fxforge.Partitioned rank {self.mesh.get_coordinate()} of mesh {tuple(self.mesh.shape)}: "
                f"{s.get('kernels')} kernels, {len(s.get('collectives', []))} collectives, "
                f"{s.get('collective_bytes')} B sent, arena {s.get('arena_bytes')} B>")


def _refuse_mutations(program: ExportedProgram) -> ExportedProgram:
    """A program with local_map regions is traced without functionalizing it: no in-place ops."""
    mutating = [n.name for n in program.graph.nodes if n.op == "call_function" and is_mutating(n)]
    if mutating:
        raise ValueError(
            f"this program has local_map regions and mutates tensors in place ({', '.join(mutating[:5])}); "
            "partition traces such programs as exported, without functionalizing them: write the model "
            "without in-place ops (or buffer updates) outside the regions"
        )
    return program


def _local_state(ep: ExportedProgram, mesh, ins: list[RankInput]) -> dict:
    """This rank's shards of the program's parameters, buffers and constants (no communication)."""
    state = {}
    for i in ins:
        if i.kind in STATE_KINDS:
            full = ep.state_dict[i.name] if i.name in ep.state_dict else ep.constants[i.name]
            state[i.name] = dth.local_shard(full, mesh, i.placements) if isinstance(full, torch.Tensor) else full
    return state


def partition(
    program: ExportedProgram,
    mesh,
    in_placements: Mapping[str, Any] | None = None,
    out_placements: Sequence[Any] | Mapping[int, Any] | None = None,
    config: Config | None = None,
    *,
    compute_placements: Mapping[str, Any] | None = None,
    registry: "Registry | None" = None,
) -> Partitioned:
    """This rank's compiled part of ``program`` run over ``mesh`` (call on every rank, SPMD).

    ``in_placements``: parameter/buffer FQN or user-input name -> one placement per mesh dim
    (``Shard(d)``, ``Replicate()``, ``Partial()``); anything not named is Replicate.  Parameters
    and buffers are sliced from the program's state (DTensor's local shapes, uneven dims
    included); the caller passes its local shards of the user inputs.  ``out_placements``: one
    entry per returned value (flattened) or ``{position: placements}``; default Replicate (every
    rank returns the full value); None for an entry keeps what propagation gives.  Gradients of a
    training program (``_export_forward_backward``) come back with their parameter's placements.
    ``compute_placements``: name -> the placements its readers read it with, when that is not how
    it is stored. FSDP is parameters stored ``Shard(0)`` and computed ``Replicate()``: each is
    all-gathered once before it is read (buckets and overlap then apply), and its gradient, a
    Partial sum over the data-parallel ranks, is reduce-scattered back to ``Shard(0)``; with tensor
    parallelism too, ``[Shard(0), Shard(0)]`` stored and ``[Replicate(), Shard(0)]`` computed. An
    input the program mutates cannot have them.
    ``config``: the pipeline the per-rank graph is compiled with.

    Raises ``ValueError`` naming the input and the fix for: an unknown name in ``in_placements``,
    a shard dim out of range, the wrong number of placements for the mesh, a local_map region
    whose placement counts do not match its inputs/outputs, an output left Partial (never
    reduced), an op (a reshape of a sharded dim...) no sharding strategy supports.
    """
    if not isinstance(program, ExportedProgram):
        raise TypeError(f"partition expects a torch.export.ExportedProgram, got {type(program).__name__}; "
                        "use torch.export.export(module, args) first (fxforge.core.dtensor.export_local_map to keep "
                        "local_map regions)")
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"partition expects a DeviceMesh (torch.distributed.device_mesh.init_device_mesh), got "
                        f"{type(mesh).__name__}")
    if mesh.get_coordinate() is None:
        raise ValueError(f"this rank ({torch.distributed.get_rank()}) is not part of {mesh}; call partition only on "
                         "the mesh's ranks")
    for what, given in (("in_placements", in_placements), ("compute_placements", compute_placements)):
        if given is not None and not isinstance(given, Mapping):
            raise ValueError(f"{what} is {type(given).__name__}; expected a dict: name -> placements, "
                             "e.g. {'fc1.weight': [Shard(0)]}")
    config = config or Config()
    registry = registry or DEFAULT_REGISTRY
    devices = {t.device.type for t in program.state_dict.values() if isinstance(t, torch.Tensor)} or {"cpu"}
    backend = registry.select(config, devices)
    table = decompositions(config, backend)
    hop = local_map_hop()
    has_regions = any(n.op == "call_function" and n.target is hop for n in program.graph.nodes)
    # placements are checked on the program as given (decomposing changes no name or shape): a
    # mistake costs no decomposition
    rank_outputs(program, mesh, out_placements, rank_inputs(program, mesh, in_placements, compute_placements))
    check_regions(program, mesh)
    # Decompose first, as compile_exported does; a program with local_map regions is traced as is
    # (run_decompositions would run the region bodies on global shapes), make_fx decomposes then
    ep = _refuse_mutations(program) if has_regions else program.run_decompositions(table)
    ins = rank_inputs(ep, mesh, in_placements, compute_placements)
    outs = rank_outputs(ep, mesh, out_placements, ins)
    mutated = sorted({o.target for o in outs if o.target in (compute_placements or {}) and o.kind not in GRADIENTS})
    if mutated:
        raise ValueError(f"compute_placements names {', '.join(map(repr, mutated))}, which the program mutates: a "
                         "value written in place is read and written as stored; drop it from compute_placements")
    gm, placements = trace_rank(ep, mesh, ins, outs, table)

    compiled = compile_graph(gm, config, kind="partition", registry=registry)
    state = _local_state(ep, mesh, ins)
    return Partitioned(compiled, ep, mesh, ins, outs, placements, state)
