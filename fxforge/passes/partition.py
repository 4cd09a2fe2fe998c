"""``fxforge.partition``: a single-device exported program plus placements -> this rank's graph.

Every rank calls ``partition(ep, mesh, in_placements)`` with the same program (SPMD).  The program
is run once, symbolically (fake tensors), under DTensor: each input becomes a DTensor with its
declared placements, each node runs as DTensor runs it, and make_fx records what this rank
executes: the ops on local shards plus the functional collectives (``_c10d_functional.*`` and
``wait_tensor``) DTensor issues where an op's strategy needs another placement of an input.  So:

* placements propagate by DTensor's own sharding propagation (its op strategies); among an op's
  strategies the one whose input redistributions send the fewest bytes is chosen
  (``fxforge.core.dtensor.select_by_bytes``; DTensor's default minimises its latency/bandwidth model
  instead), and Shard(i) -> Shard(j) is one all-to-all;
* each redistribution happens once: a pure op repeated on the same inputs is computed once, a
  value is redistributed at most once per placement, and a reduced Partial value is what later
  readers read (``_Tracer``);
* view ops get their local shape arguments, uneven shards DTensor's own padding and local shapes;
* a ``local_map`` region (``torch.ops.higher_order.local_map_hop``) keeps its body as written, on
  local shapes: its inputs are redistributed to its declared in placements, its outputs take its
  declared out placements;
* outputs are redistributed to ``out_placements`` (default Replicate: every rank returns the full
  value; gradients of a training program default to their parameter's placements).

The per-rank graph then goes through fxforge's pipeline like any other (fusion, memory plan,
codegen): ``Partitioned.compiled`` is an ordinary ``Compiled``, whose ``stats`` add
``collective_bytes`` (bytes this rank sends per call) and ``collectives`` (one entry per
collective).  See docs/partition.md.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ..core import dtensor as dth
from ..core.config import Config
from ..core.graph import VAL
from ..core.signature import InputError, user_input_paths
from ..lowering.decompose import export_table


STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
RETURNED = (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)
GRADIENTS = (OutputKind.GRADIENT_TO_PARAMETER, OutputKind.GRADIENT_TO_USER_INPUT)


@dataclass
class RankInput:
    """One placeholder of the program: who it is, where it lives, how it is split."""

    node: str  # placeholder name in the program's graph
    kind: InputKind
    name: str  # FQN (parameters, buffers, constants) or argument name (user inputs)
    where: str  # how errors name it: "'fc1.weight' (parameter)", "'x' (args[0])"
    val: Any  # the full (global) fake value
    placements: tuple = ()
    compute: tuple | None = None  # where its readers read it (compute_placements); None: as stored


@dataclass
class RankOutput:
    """One output of the program and the placements it is returned with (None: as propagated)."""

    index: int  # position among the program's outputs
    kind: OutputKind
    target: str | None  # FQN / input name for gradients and mutations
    where: str
    placements: tuple | None
    position: int | None = None  # among the returned values (None: gradients, mutations)


# --------------------------------------------------------------------------- validation


def local_map_hop():
    from torch._higher_order_ops.local_map import local_map_hop

    return local_map_hop


def rank_inputs(ep: ExportedProgram, mesh, in_placements: Mapping[str, Any],
                compute_placements: Mapping[str, Any] | None = None) -> list[RankInput]:
    """Every placeholder of ``ep`` with its placements (and those it is read with); unknown names
    and malformed placements raise ``ValueError``."""
    dt = dth._dt()
    vals = {n.name: n.meta.get(VAL) for n in ep.graph.nodes if n.op == "placeholder"}
    specs = ep.graph_signature.input_specs
    users = [s.arg.name for s in specs if s.kind == InputKind.USER_INPUT]
    paths = dict(zip(users, user_input_paths(ep.call_spec.in_spec, users)))
    ins: list[RankInput] = []
    for s in specs:
        if s.kind == InputKind.TOKEN:
            raise ValueError("partition does not support programs with effect tokens (side-effecting custom ops)")
        if s.kind == InputKind.USER_INPUT:
            name, where = s.arg.name, f"{s.arg.name!r} ({paths[s.arg.name]})"
        else:
            name, where = s.target, f"{s.target!r} ({s.kind.name.lower().replace('_tensor', '')})"
        ins.append(RankInput(s.arg.name, s.kind, name, where, vals.get(s.arg.name)))
    known = {i.name: i for i in ins}
    in_placements, compute_placements = dict(in_placements or {}), dict(compute_placements or {})
    for what, given in (("in_placements", in_placements), ("compute_placements", compute_placements)):
        unknown = [k for k in given if k not in known]
        if unknown:
            state = [i.name for i in ins if i.kind != InputKind.USER_INPUT]
            user = [i.name for i in ins if i.kind == InputKind.USER_INPUT]
            close = {k: [n for n in known if n.split(".")[-1] == str(k).split(".")[-1]] for k in unknown}
            hint = "; ".join(f"did you mean {', '.join(map(repr, c))} for {k!r}?" for k, c in close.items() if c)
            raise ValueError(
                f"{what} names {', '.join(map(repr, unknown))}, which {'is' if len(unknown) == 1 else 'are'} not a "
                f"parameter, buffer or user input of the program. Parameters and buffers are named by FQN, as in "
                f"model.state_dict(): {', '.join(state) or '(none)'}; user inputs by argument name: "
                f"{', '.join(user) or '(none)'}." + (f" {hint}" if hint else "")
            )
    for i in ins:
        shape = tuple(i.val.shape) if isinstance(i.val, torch.Tensor) else None
        if isinstance(i.val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in i.val.shape):
            raise ValueError(
                f"input {i.where} has symbolic sizes {list(i.val.shape)}; partition compiles static shapes: "
                "export without dynamic_shapes"
            )
        if i.name in in_placements:
            i.placements = dth.check_placements(in_placements[i.name], mesh, f"in_placements[{i.name!r}]", shape)
        else:
            i.placements = tuple(dt.Replicate() for _ in range(mesh.ndim))
        if i.name in compute_placements:
            i.compute = dth.check_placements(compute_placements[i.name], mesh, f"compute_placements[{i.name!r}]", shape)
    return ins


def rank_outputs(ep: ExportedProgram, mesh, out_placements: Any, ins: list[RankInput]) -> list[RankOutput]:
    """Every output of ``ep`` with the placements it is returned with."""
    dt = dth._dt()
    by_name = {i.name: i for i in ins}
    by_node = {i.node: i for i in ins}
    outs: list[RankOutput] = []
    returned = 0
    for k, s in enumerate(ep.graph_signature.output_specs):
        if s.kind in RETURNED:
            outs.append(RankOutput(k, s.kind, None, f"output {returned} ({s.arg.name!r})",
                             tuple(dt.Replicate() for _ in range(mesh.ndim)), returned))
            returned += 1
        elif s.kind in GRADIENTS or s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION,
                                                OutputKind.USER_INPUT_MUTATION):
            src = by_name.get(s.target) or by_node.get(s.target)
            what = {OutputKind.GRADIENT_TO_PARAMETER: "gradient of", OutputKind.GRADIENT_TO_USER_INPUT: "gradient of"}
            outs.append(RankOutput(k, s.kind, s.target, f"{what.get(s.kind, 'new value of')} {s.target!r}",
                             src.placements if src is not None else tuple(dt.Replicate() for _ in range(mesh.ndim))))
        else:
            raise ValueError(f"partition does not support program outputs of kind {s.kind.name}")
    user = [o for o in outs if o.kind in RETURNED]
    if out_placements is None:
        return outs
    if isinstance(out_placements, Mapping):
        items = dict(out_placements)
        bad = [k for k in items if not isinstance(k, int) or not 0 <= k < len(user)]
        if bad:
            raise ValueError(
                f"out_placements names output {', '.join(map(repr, bad))}, but the program returns {len(user)} "
                f"value{'s' if len(user) != 1 else ''} (keys are output positions 0..{len(user) - 1})"
            )
    else:
        if isinstance(out_placements, dt.Placement) or not isinstance(out_placements, (list, tuple)):
            raise ValueError(
                f"out_placements is {out_placements!r}; expected one entry per returned value (a list of "
                f"{mesh.ndim} placements, or None to keep the placement propagation gives), or a dict "
                "{output position: placements}"
            )
        if len(out_placements) != len(user):
            raise ValueError(
                f"out_placements has {len(out_placements)} entries but the program returns {len(user)} "
                f"value{'s' if len(user) != 1 else ''}; give one per returned value (flattened, in order): "
                f"a list of {mesh.ndim} placements, or None to keep what propagation gives"
            )
        items = dict(enumerate(out_placements))
    for k, v in items.items():
        o = user[k]
        if v is None:
            o.placements = None
            continue
        val = ep.graph.find_nodes(op="output")[0].args[0][o.index].meta.get(VAL)
        shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
        o.placements = dth.check_placements(v, mesh, f"out_placements[{k}]", shape)
    return outs


def _same_mesh(a, b) -> bool:
    try:
        return a is b or (a.device_type == b.device_type and a.mesh.tolist() == b.mesh.tolist())
    except Exception:
        return False


def check_regions(ep: ExportedProgram, mesh) -> None:
    """local_map regions: placement counts match the body's inputs/outputs, one placement per mesh
    dim, the partition's mesh."""
    hop = local_map_hop()
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target is not hop:
            continue
        kw = dth.local_map_kwargs(n)
        body = getattr(ep.graph_module, n.args[0].target)
        region = f"local_map region {n.name!r} (body {n.args[0].target!r})"
        if kw is None:
            raise ValueError(f"{region} carries no local_map_kwargs (in/out placements, mesh); trace it with "
                             "fxforge.core.dtensor.export_local_map")
        ins = [a for a in body.graph.nodes if a.op == "placeholder"]
        outs = body.graph.find_nodes(op="output")[0].args[0]
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        in_pl, out_pl = tuple(kw.get("in_placements") or ()), _region_outs(kw.get("out_placements"))
        args = [a.name if isinstance(a, fx.Node) else repr(a) for a in n.args[1:]]
        if len(in_pl) != len(ins):
            raise ValueError(
                f"{region} declares {len(in_pl)} in_placements for {len(ins)} inputs ({', '.join(args)}); "
                f"give one placement list per input of the region's function (None for a non-tensor input)"
            )
        if len(out_pl) != len(outs):
            raise ValueError(
                f"{region} declares {len(out_pl)} out_placements for {len(outs)} outputs; give one placement list "
                "per (flattened) output of the region's function"
            )
        if kw.get("device_mesh") is not None and not _same_mesh(kw["device_mesh"], mesh):
            raise ValueError(
                f"{region} runs on mesh {kw['device_mesh']}, not on the partition's mesh {mesh}; use one mesh"
            )
        for j, (pl, a) in enumerate(zip(in_pl, n.args[1:])):
            if pl is not None:
                v = a.meta.get(VAL) if isinstance(a, fx.Node) else None
                dth.check_placements(pl, mesh, f"{region} in_placements[{j}] ({args[j]})",
                                     tuple(v.shape) if isinstance(v, torch.Tensor) else None)
        vals = n.meta.get(VAL)
        for j, pl in enumerate(out_pl):
            if pl is not None:
                v = vals[j] if isinstance(vals, (list, tuple)) and j < len(vals) else None
                dth.check_placements(pl, mesh, f"{region} out_placements[{j}]",
                                     tuple(v.shape) if isinstance(v, torch.Tensor) else None)


# --------------------------------------------------------------------------- the per-rank trace

_VIEW_ERRORS = ("reshape sharded", "flatten unevenly", "unflatten unevenly", "remove or reshape")


def _all_dims(op: Any, args: tuple) -> tuple:
    """``sum``/``mean`` over ``dim=[]`` with the dims spelled out: ATen reduces every dim for an
    empty list, but DTensor's strategy reads it as no dim reduced and leaves a 0-d result
    ``Shard`` (cross-entropy's count of targets that are not ``ignore_index`` is such a sum)."""
    if op in (torch.ops.aten.sum.dim_IntList, torch.ops.aten.mean.dim) and len(args) > 1 and args[1] is not None \
            and len(args[1]) == 0 and hasattr(args[0], "ndim"):
        return (args[0], list(range(args[0].ndim)), *args[2:])
    return args


_ZERO_FILLS = {torch.ops.aten.full.default: 1, torch.ops.aten.full_like.default: 1, torch.ops.aten.new_full.default: 2,
               torch.ops.aten.zeros.default: None, torch.ops.aten.zeros_like.default: None,
               torch.ops.aten.new_zeros.default: None}  # (the fill value's argument, None: zeros)


def _zero_fill(base: Any) -> bool:
    """``base`` is a node filling a new tensor with zeros."""
    if not isinstance(base, fx.Node) or base.target not in _ZERO_FILLS:
        return False
    at = _ZERO_FILLS[base.target]
    return at is None or (len(base.args) > at and isinstance(base.args[at], (int, float)) and base.args[at] == 0)


def _zero(a: Any) -> bool:
    """``a`` is the number 0, a node making a 0-d zero (``scalar_tensor(0)``) or a zero fill."""
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return a == 0
    return _zero_fill(a) or (isinstance(a, fx.Node) and a.target is torch.ops.aten.scalar_tensor.default
                             and isinstance(a.args[0], (int, float)) and a.args[0] == 0)


def _scatter_as_pad(node: fx.Node, args: tuple) -> tuple | None:
    """A ``slice_scatter`` of ``src`` into a zero-filled tensor (autograd's slice backward) as
    ``(constant_pad_nd, (src, pad, 0))``: the same values.  DTensor's strategy for
    ``slice_scatter`` follows the placements of the tensor written into, and one the graph fills
    is Replicate: every rank gathered ``src`` whole (a LLaMA's rotary backward gathered four
    activations a layer under FSDP); a pad keeps ``src``'s sharding on every dim it does not pad.
    None where the rule does not hold (a step, a fill not zero, sizes not static, kwargs)."""
    if node.target is not torch.ops.aten.slice_scatter.default or node.kwargs:
        return None
    base, out = node.args[0], node.meta.get(VAL)
    if not _zero_fill(base) or not isinstance(out, torch.Tensor):
        return None
    dim, start, end, step = (list(node.args[2:]) + [0, None, None, 1][len(node.args) - 2:])[:4]
    size = out.shape[dim] if isinstance(dim, int) and -out.ndim <= dim < out.ndim else None
    src = node.args[1].meta.get(VAL) if isinstance(node.args[1], fx.Node) else None
    if step != 1 or not isinstance(size, int) or not isinstance(src, torch.Tensor) or src.dtype != out.dtype \
            or not all(isinstance(x, (int, type(None))) for x in (start, end)):
        return None
    dim %= out.ndim
    start, end, _ = slice(start, end).indices(size)
    if src.shape[dim] != max(0, end - start):
        return None
    return torch.ops.aten.constant_pad_nd.default, (args[1], [0, 0] * (out.ndim - 1 - dim) + [start, size - end], 0)


class _Tracer:
    """Runs the program's graph on DTensors (under make_fx) and records placements.

    Beyond DTensor's per-op dispatch, six rules keep communication down, each
    semantics-preserving: a pure op repeated on the same inputs (autograd recomputes forward
    values in the backward) is computed once; a value is redistributed at most once to each
    placement (the redistributed copy is reused by later readers); once a Partial value has been
    reduced, later readers read the reduced copy (a Replicate value becomes any placement
    without communication, a Partial one needs a reduction every time); a slice's gradient
    scattered into zeros is a pad (``_scatter_as_pad``); a row lookup's gradient is accumulated
    on the rows each rank holds (``_accumulated_locally``); a Partial value masked by zeros stays
    Partial (``_masked_partial``)."""

    def __init__(self, ep: ExportedProgram, mesh, ins: list[RankInput], outs: list[RankOutput]):
        self.ep, self.mesh, self.ins, self.outs = ep, mesh, ins, outs
        self.placements: dict[str, tuple] = {}  # program node -> placements of its value
        self._copies: dict[tuple[int, tuple], Any] = {}  # (id(value), placements) -> redistributed value
        self._reduced: dict[int, Any] = {}  # id(Partial value) -> its reduced copy
        self._keep: list[Any] = []  # values whose ids key the dicts above stay alive
        self._made: dict[int, Any] = {}  # output index -> its local value, redistributed where it was made

    # -- helpers
    def _dtensor(self, t: torch.Tensor, placements=None, like=None):
        dt = dth._dt()
        placements = placements or tuple(dt.Replicate() for _ in range(self.mesh.ndim))
        if like is not None:
            return dt.DTensor.from_local(t, self.mesh, placements, run_check=False, shape=like.shape,
                                         stride=like.stride())
        return dt.DTensor.from_local(t, self.mesh, placements, run_check=False)

    def _wrap(self, v: Any) -> Any:
        """Plain tensors a node produced (factory ops, constants) are the same on every rank: Replicate."""
        dt = dth._dt()
        if isinstance(v, torch.Tensor) and not isinstance(v, dt.DTensor):
            return self._dtensor(v)
        if isinstance(v, (list, tuple)):
            return type(v)(self._wrap(x) for x in v)
        return v

    def _redistribute(self, v: Any, placements: tuple, what: str | None = None) -> Any:
        """``v`` redistributed to ``placements``, each (value, placements) pair once."""
        dt = dth._dt()
        placements = tuple(placements)
        if tuple(v.placements) == placements:
            return v
        key = (id(v), placements)
        if key not in self._copies:
            try:
                out = dth.redistribute(v, placements)
            except Exception as e:
                raise ValueError(
                    f"cannot redistribute {what or 'a value'} {list(v.shape)} from {dth.describe(v.placements)} to "
                    f"{dth.describe(placements)} while tracing ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                    "change the in_placements leading to it (Replicate() always works)"
                ) from e
            self._copies[key] = out
            self._keep.append(v)
            # the Partial dims reduced to Replicate, the others unchanged: at least as useful
            # to every later reader (Replicate becomes any placement locally)
            if any(isinstance(p, dt.Partial) for p in v.placements) and all(
                    isinstance(q, dt.Replicate) if isinstance(p, dt.Partial) else q == p
                    for p, q in zip(v.placements, placements)):
                self._reduced[id(v)] = out
        return self._copies[key]

    def _readable(self, v: Any) -> Any:
        """The copy of ``v`` later readers should read: its reduced copy if it was Partial and
        has been reduced."""
        dt = dth._dt()
        if isinstance(v, dt.DTensor):
            return self._reduced.get(id(v), v)
        return v

    def _prepare(self, op: Any, args: tuple, kwargs: dict) -> tuple:
        """Redistribute the DTensor arguments of ``op`` to the placements the chosen strategy wants
        (through ``_redistribute``, so each copy is made once); DTensor's dispatch then finds them
        in place.  Ops DTensor cannot propagate here (custom handlers, decompositions) are left
        to its dispatch."""
        dt = dth._dt()
        wanted = self._wanted(op, args, kwargs)
        if wanted is None:
            return args, kwargs
        if any(type(p).__name__ == "_MaskPartial" for w in wanted for p in w.placements):
            # a masked lookup (a row-sharded embedding): the mask made while redistributing the
            # indices lives in the placement, and only DTensor's own dispatch hands the same one
            # to the output's reduction (a copy made here would be re-planned, and the masked
            # indices summed across ranks)
            return args, kwargs
        leaves, spec = pytree.tree_flatten(args)
        it = iter(wanted)
        leaves = [self._redistribute(x, next(it).placements) if isinstance(x, dt.DTensor) else x for x in leaves]
        return pytree.tree_unflatten(leaves, spec), kwargs

    @staticmethod
    def _wanted(op: Any, args: tuple, kwargs: dict) -> list | None:
        """The specs the strategy DTensor picks for ``op`` wants its DTensor arguments in (in
        ``pytree`` order: their own where nothing moves); None: DTensor's own dispatch decides
        (and raises, if it must)."""
        dt = dth._dt()
        if not isinstance(op, torch._ops.OpOverload):
            return None
        leaves = pytree.tree_leaves(args)
        if not any(isinstance(x, dt.DTensor) for x in leaves):
            return None
        dispatcher = dt.DTensor._op_dispatcher
        try:
            info = dispatcher.unwrap_to_op_info(op, args, kwargs)
            sharding = dispatcher.sharding_propagator.propagate_op_sharding_non_cached(info.schema)
        except Exception:
            return None
        if not getattr(sharding, "needs_redistribute", False):
            return [x._spec for x in leaves if isinstance(x, dt.DTensor)]
        schema = getattr(sharding, "redistribute_schema", None)
        if schema is None:
            return None
        wanted = list(schema.args_spec)
        return wanted if len(wanted) == sum(isinstance(x, dt.DTensor) for x in leaves) else None

    def _masked_partial(self, node: fx.Node, args: tuple) -> Any:
        """``where(cond, x, 0)`` / ``where(cond, 0, x)`` / ``masked_fill(x, mask, 0)`` of a
        Partial (sum) ``x`` by a whole mask: the mask applied to each rank's term, the result
        Partial (``where(c, a + b, 0) = where(c, a, 0) + where(c, b, 0)``).  DTensor's pointwise
        strategies reduce ``x`` first (an embedding's gradient summed over a batch split across
        ranks was all-reduced before its rows were masked); kept Partial, it is reduced where it
        is needed, at most once, and often as a reduce-scatter.  None where the rule does not
        hold (a mesh dim where ``x`` or the mask is split, a mask broadcasting ``x`` larger)."""
        dt = dth._dt()
        op = node.target
        if op is torch.ops.aten.where.self and len(args) == 3:
            zero_at = 1 if _zero(node.args[1]) else 2 if _zero(node.args[2]) else None
            if zero_at is None:
                return None
            x = args[3 - zero_at]
        elif op is torch.ops.aten.masked_fill.Scalar and len(args) == 3 and _zero(node.args[2]):
            x = args[0]
        else:
            return None
        out = node.meta.get(VAL)
        if node.kwargs or not isinstance(x, dt.DTensor) or not isinstance(out, torch.Tensor) \
                or tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
            return None
        sum_ = dt.Partial()
        if sum_ not in x.placements or any(not (p == sum_ or isinstance(p, dt.Replicate)) for p in x.placements):
            return None
        whole = [a for a in args if isinstance(a, dt.DTensor) and a is not x]
        if any(not all(isinstance(p, dt.Replicate) for p in a.placements) for a in whole):
            return None
        local = [a.to_local() if isinstance(a, dt.DTensor) else a for a in args]
        return self._dtensor(op(*local), tuple(x.placements), like=out)

    def _accumulated_locally(self, node: fx.Node, args: tuple) -> Any:
        """``index_put(zeros, [idx], values, accumulate=True)`` (the gradient of a row lookup:
        an embedding's, ``x[idx]``'s) with ``idx`` and ``values`` split alike over their rows:
        each rank adds its own rows into its zeros, and the sum over ranks is the result
        (Partial).  DTensor's strategies for ``index_put`` read the indices whole on every rank
        and split ``values`` on a dim it does not index (FSDP on a LLaMA: the embedding's
        gradient all-to-all'd, the token ids gathered, the result all-to-all'd back).  Taken
        where reducing the Partial result (a reduce-scatter per Partial mesh dim) sends fewer
        bytes than DTensor's choice sends to move the inputs; None where the rule does not hold.
        On a mesh dim where ``idx`` is whole, ``values`` may be whole (the result is whole) or
        Partial (so is the result)."""
        dt = dth._dt()
        if node.target is not torch.ops.aten.index_put.default or node.kwargs or len(args) != 4 or args[3] is not True \
                or not _zero_fill(node.args[0]):
            return None
        base, indices, values = args[0], args[1], args[2]
        idx = indices[0] if isinstance(indices, (list, tuple)) and len(indices) == 1 else None
        if not all(isinstance(x, dt.DTensor) for x in (base, idx, values)) or idx.dtype not in (torch.int64, torch.int32) \
                or values.dtype != base.dtype or tuple(values.shape) != tuple(idx.shape) + tuple(base.shape[1:]):
            return None
        out: list = []
        for b, i, v in zip(base.placements, idx.placements, values.placements):
            if not isinstance(b, dt.Replicate):
                return None
            if isinstance(i, dt.Shard) and i == v and i.dim < idx.ndim:
                out.append(dt.Partial())
            elif isinstance(i, dt.Replicate) and (isinstance(v, dt.Replicate) or v == dt.Partial()):
                out.append(v)
            else:
                return None
        partial = [d for d, p in enumerate(out) if isinstance(p, dt.Partial)]
        if not partial:
            return None
        reduce = sum(dth.transform_bytes("reduce_scatter", base.shape, base.dtype, self.mesh.size(d)) for d in partial)
        wanted = self._wanted(node.target, args, {})  # (None: DTensor cannot propagate it here)
        if wanted is not None:
            current = [x._spec for x in pytree.tree_leaves(args) if isinstance(x, dt.DTensor)]
            if reduce >= sum(dth.spec_cost(c, w)[0] for c, w in zip(current, wanted)):
                return None
        local = torch.ops.aten.index_put.default(base.to_local(), [idx.to_local()], values.to_local(), True)
        return self._dtensor(local, tuple(out), like=node.meta.get(VAL, base))

    @staticmethod
    def _cse_key(node: fx.Node, canon: dict) -> Any:
        """A key equal for two pure calls of one op on the same inputs, else None."""
        op = node.target
        if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable or \
                torch.Tag.nondeterministic_seeded in op.tags:
            return None

        def key(a: Any) -> Any:
            if isinstance(a, fx.Node):
                return ("node", canon.get(a, a).name)
            if isinstance(a, (list, tuple)):
                return tuple(key(x) for x in a)
            if isinstance(a, dict):
                return tuple(sorted((k, key(v)) for k, v in a.items()))
            return (type(a).__name__, a)

        try:
            k = (op, key(node.args), key(node.kwargs))
            hash(k)
            return k
        except TypeError:
            return None

    def _record(self, node: fx.Node, v: Any) -> None:
        dt = dth._dt()
        if isinstance(v, dt.DTensor):
            self.placements[node.name] = tuple(v.placements)
        elif isinstance(v, (list, tuple)) and any(isinstance(x, dt.DTensor) for x in v):
            self.placements[node.name] = tuple(tuple(x.placements) if isinstance(x, dt.DTensor) else None for x in v)

    def _sharded_sources(self, node: fx.Node) -> list[str]:
        """Program inputs with a Shard placement that ``node``'s value comes from."""
        dt = dth._dt()
        by_node = {i.node: i for i in self.ins}
        seen, stack, found = set(), [node], []
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            i = by_node.get(n.name) if n.op == "placeholder" else None
            if i is not None and any(isinstance(p, dt.Shard) for p in i.placements):
                found.append(f"in_placements[{i.name!r}] = {dth.describe(i.placements)} ({i.where})")
            stack.extend(n.all_input_nodes)
        return found

    def _failure(self, node: fx.Node, error: Exception) -> ValueError:
        msg = str(error).split("\n\nSharding propagation failed")[0].strip()
        shown = []
        for a in node.all_input_nodes:
            p = self.placements.get(a.name)
            v = a.meta.get(VAL)
            if p is not None and isinstance(v, torch.Tensor):
                shown.append(f"{a.name!r} {list(v.shape)} {dth.describe(p)}")
        out = node.meta.get(VAL)
        target = dth_display(node.target)
        sources = self._sharded_sources(node)
        src = f" The sharded dim comes from {'; '.join(sources)}." if sources else ""
        if any(k in msg for k in _VIEW_ERRORS):
            to = f" -> {list(out.shape)}" if isinstance(out, torch.Tensor) else ""
            return ValueError(
                f"node {node.name!r} ({target}) reshapes {', '.join(shown) or 'its input'}{to}, which splits or merges "
                f"a sharded dim in a way no sharding strategy of {target} supports (DTensor: {msg}).{src} Fix: shard a "
                "dim the program does not reshape (e.g. the batch dim), declare that input Replicate(), or put the "
                "reshape inside a local_map region that works on local shapes."
            )
        return ValueError(
            f"sharding propagation failed at node {node.name!r} ({target}) with inputs {', '.join(shown) or '(none)'}: "
            f"{msg}.{src} Fix: change those in_placements (Replicate() always works), or wrap the op in a local_map "
            "region that declares its placements."
        )

    # -- the program
    def run(self, *local: torch.Tensor) -> tuple:
        graph = self.ep.graph
        env: dict[fx.Node, Any] = {}
        canon: dict[fx.Node, fx.Node] = {}  # node -> the earlier node computing the same value
        seen: dict[Any, fx.Node] = {}
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        # an output an op makes is redistributed to its out placements as soon as it is made (a
        # training program's gradients: the collective comes where the gradient is ready, in the
        # order the gradients are, not all at the end in the outputs' order)
        values = graph.find_nodes(op="output")[0].args[0]
        early: dict[fx.Node, list[RankOutput]] = {}
        for o in self.outs:
            if isinstance(values[o.index], fx.Node) and values[o.index].op == "call_function":
                early.setdefault(values[o.index], []).append(o)
        for ph, i, t in zip(placeholders, self.ins, local):
            env[ph] = self._dtensor(t, i.placements, like=i.val) if isinstance(i.val, torch.Tensor) else t
            self._record(ph, env[ph])
            if i.compute is not None:  # (read as compute_placements: redistributed once, before any reader)
                env[ph] = self._redistribute(env[ph], i.compute, i.where)
        hop = local_map_hop()
        for node in graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                obj: Any = self.ep.graph_module
                for part in node.target.split("."):
                    obj = getattr(obj, part)
                env[node] = self._wrap(obj) if isinstance(obj, torch.Tensor) else obj
                continue
            if node.op == "output":
                return self.rank_outputs(node, env)
            if node.op != "call_function":
                raise ValueError(f"partition cannot run node {node.name!r} ({node.op}); export the program first")
            key = self._cse_key(node, canon)
            if key is not None and key in seen:
                canon[node] = seen[key]
                env[node] = env[seen[key]]
                self._record(node, env[node])
                self._made_outputs(early.pop(node, ()), node, env)
                continue
            if key is not None:
                seen[key] = node
            args = fx.node.map_arg(node.args, lambda a: self._readable(env[a]))
            kwargs = fx.node.map_arg(node.kwargs, lambda a: self._readable(env[a]))
            if node.target is hop:
                env[node] = self._region(node, args)
            elif node.target is operator.getitem:
                env[node] = env[node.args[0]][node.args[1]]
            elif (made := self._accumulated_locally(node, args)) is not None:
                env[node] = made
            elif (made := self._masked_partial(node, args)) is not None:
                env[node] = made
            else:
                op, args = _scatter_as_pad(node, args) or (node.target, _all_dims(node.target, args))
                try:
                    args, kwargs = self._prepare(op, args, kwargs)
                    env[node] = self._wrap(op(*args, **kwargs))
                except (RuntimeError, NotImplementedError) as e:
                    if isinstance(e, InputError):
                        raise
                    raise self._failure(node, e) from e
            self._record(node, env[node])
            self._made_outputs(early.pop(node, ()), node, env)
        raise AssertionError("graph without output node")

    def _made_outputs(self, outs: list[RankOutput], node: fx.Node, env: dict) -> None:
        for o in outs:
            self._made[o.index] = self._rank_output(o, node, env)

    def _region(self, node: fx.Node, args: tuple) -> tuple:
        """A local_map region: inputs redistributed to its in placements, body run on the local
        shards as written (traced op by op into this rank's graph), outputs wrapped with its out
        placements and the global shapes the region was exported with."""
        dt = dth._dt()
        kw = dth.local_map_kwargs(node)
        body = getattr(self.ep.graph_module, node.args[0].target)
        in_pl = kw["in_placements"]
        out_pl = _region_outs(kw["out_placements"])
        local_args = []
        for a, pl in zip(args[1:], in_pl):
            if isinstance(a, dt.DTensor) and pl is not None:
                a = self._redistribute(a, tuple(pl), f"input of local_map region {node.name!r}").to_local()
            local_args.append(a)
        outs = fx.Interpreter(body).run(*local_args)
        outs = tuple(outs) if isinstance(outs, (list, tuple)) else (outs,)
        globals_ = node.meta.get(VAL)
        globals_ = tuple(globals_) if isinstance(globals_, (list, tuple)) else (globals_,)
        wrapped = []
        for j, (o, pl) in enumerate(zip(outs, out_pl)):
            if isinstance(o, torch.Tensor) and pl is not None:
                like = globals_[j] if j < len(globals_) and isinstance(globals_[j], torch.Tensor) else None
                o = self._dtensor(o, tuple(pl), like=like)
            wrapped.append(o)
        return tuple(wrapped)

    def rank_outputs(self, node: fx.Node, env: dict) -> tuple:
        """The outputs as this rank returns them, each redistributed to its out placements: those
        made by the program's ops already were, as soon as they were made (``_made``)."""
        values = node.args[0]
        return tuple(self._made[o.index] if o.index in self._made else self._rank_output(o, values[o.index], env)
                     for o in self.outs)

    def _rank_output(self, o: RankOutput, arg: Any, env: dict) -> Any:
        dt = dth._dt()
        v = env[arg] if isinstance(arg, fx.Node) else arg
        if not isinstance(v, dt.DTensor):
            return v
        if o.placements is None:
            partial = [(d, p) for d, p in enumerate(v.placements) if isinstance(p, dt.Partial)]
            if partial:
                d, p = partial[0]
                k = o.position
                raise ValueError(
                    f"{o.where} is {dth.describe(v.placements)} after propagation (a {p.reduce_op} not yet "
                    f"reduced over mesh dim {d}) and out_placements[{k}] is None (keep as propagated), so it "
                    f"would be returned unreduced. Declare out_placements[{k}] = "
                    f"{dth.describe([dt.Replicate()] * self.mesh.ndim)} (all-reduce), a Shard(d) placement "
                    f"(reduce-scatter), or {dth.describe(v.placements)} to return the partial values on purpose."
                )
        elif tuple(v.placements) != tuple(o.placements):
            wants_partial = any(isinstance(p, dt.Partial) for p in o.placements)
            v = self._redistribute(v if wants_partial else self._readable(v), o.placements, o.where)
        return v.to_local()


def _region_outs(out_pl: Any) -> tuple:
    """local_map's out_placements as one entry per output: a single placement list stands for
    the one output."""
    dt = dth._dt()
    if isinstance(out_pl, (list, tuple)) and out_pl and all(isinstance(p, dt.Placement) for p in out_pl):
        return (tuple(out_pl),)
    return tuple(out_pl) if isinstance(out_pl, (list, tuple)) else (out_pl,)


# export_table per decomposition level: a cache bounded by the levels ("none", "core"), built once
# per process (0.3 s each).
_TABLES: dict[str, dict] = {}


def decompositions(config: Config, backend) -> dict:
    """``export_table`` (what compile_exported decomposes), built once per level (0.3 s each)."""
    from ..lowering.decompose import level

    key = level(config, backend)
    if key not in _TABLES:
        _TABLES[key] = export_table(config, backend)
    return _TABLES[key]


def dth_display(target: Any) -> str:
    from ..core.graph import op_display

    return op_display(target)


def trace_rank(
    ep: ExportedProgram, mesh, ins: list[RankInput], outs: list[RankOutput], table: dict
) -> tuple[fx.GraphModule, dict]:
    """This rank's graph: ``ep`` traced on DTensors (fake local inputs) into plain ATen ops and
    functional collectives."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    fake = FakeTensorMode()
    local = []
    for i in ins:
        if isinstance(i.val, torch.Tensor):
            shape = dth.local_shape(i.val.shape, mesh, i.placements)
            with fake:
                local.append(torch.empty(shape, dtype=i.val.dtype, device=i.val.device))
        else:
            local.append(i.val)
    tracer = _Tracer(ep, mesh, ins, outs)
    with dth.choose_by_bytes():
        gm = make_fx(tracer.run, tracing_mode="fake", decomposition_table=table)(*local)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    taken = {n.name for n in gm.graph.nodes}
    for ph, i in zip(placeholders, ins):  # readable names in Compiled.source
        if i.node not in taken:
            taken.add(i.node)
            ph._rename(i.node)
            ph.target = i.node
    gm.graph.lint()
    gm.recompile()
    return gm, tracer.placements
