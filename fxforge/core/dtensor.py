"""DTensor helpers behind ``fxforge.partition`` (spmd.py, passes/partition.py).

* **Placements**: ``check_placements`` turns what a user wrote (``[Shard(0)]``, one placement per
  mesh dim) into a tuple, or raises a ``ValueError`` naming the input, what was expected and the fix.
* **Local shards**: ``local_shard`` gives this rank's piece of a full tensor as DTensor computes it
  (``compute_local_shape_and_global_offset``: uneven dims put the smaller chunks last), without any
  communication: every rank holds the full value, so Replicate -> Shard / Partial is local.
* **Bytes**: ``redistribute_bytes`` is what one rank sends to move a tensor from one placement to
  another, per DTensor's own transform plan (``fxforge.core.collectives.collective_bytes`` reads the
  same off a functional collective node of a per-rank graph).  Both count bandwidth-optimal
  (ring) algorithms:

  ====================== ==================== =================================
  redistribution          collective           bytes one rank sends (n ranks)
  ====================== ==================== =================================
  Shard -> Replicate      all-gather           (n - 1) x its shard
  Partial -> Replicate    all-reduce           2 (n - 1) / n x the tensor
  Partial -> Shard        reduce-scatter       (n - 1) / n x the tensor
  Shard(i) -> Shard(j)    all-to-all           (n - 1) / n x its shard
  Replicate -> Shard      (local slice)        0
  Replicate -> Partial    (local)              0
  ====================== ==================== =================================

* **Strategy choice**: ``choose_by_bytes()`` is a context in which DTensor's sharding propagation
  (its own op strategies) picks, among the strategies of an op, the one whose input
  redistributions send the fewest bytes, in which Shard(i) -> Shard(j) runs as one all-to-all
  (``_c10d_functional.all_to_all_single``) instead of DTensor's CPU fallback (all-gather, then
  a local chunk), and in which a _StridedShard's offsets are computed eagerly (DTensor reads
  them off tensor values, which fake tensors lack).
* **local_map export**: ``export_local_map`` exports a program keeping its ``local_map`` regions
  as ``torch.ops.higher_order.local_map_hop`` nodes (torch 2.13 cannot: see the function).
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Iterator, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

__all__ = [
    "check_placements",
    "choose_by_bytes",
    "export_local_map",
    "local_shape",
    "local_shard",
    "redistribute_bytes",
]


def _dt():
    """torch.distributed.tensor, imported on first use (import fxforge loads no distributed module)."""
    import torch.distributed.tensor as dt

    return dt


# --------------------------------------------------------------------------- placements


def describe(placements: Sequence[Any]) -> str:
    """``[Shard(0), Replicate()]``: placements as a user writes them."""
    names = []
    for p in placements:
        dt = _dt()
        if isinstance(p, dt.Shard):
            names.append(f"Shard({p.dim})")
        elif isinstance(p, dt.Replicate):
            names.append("Replicate()")
        elif isinstance(p, dt.Partial):
            names.append("Partial()" if p.reduce_op == "sum" else f"Partial({p.reduce_op!r})")
        else:
            names.append(repr(p))
    return "[" + ", ".join(names) + "]"


def check_placements(value: Any, mesh, what: str, shape: Sequence[int] | None) -> tuple:
    """``value`` as a tuple of one Placement per mesh dim, shard dims made non-negative.

    ``what`` names the input in errors (``in_placements['fc1.weight']``); ``shape`` is the full
    tensor's shape (None: not a tensor, only Replicate makes sense)."""
    dt = _dt()
    example = "[" + ", ".join(["Replicate()"] * max(mesh.ndim - 1, 0) + ["Shard(0)"]) + "]"
    if isinstance(value, dt.Placement):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, dt.Placement) for p in value):
        raise ValueError(
            f"{what} is {value!r}; expected a list of {mesh.ndim} placements (Shard(d), Replicate(), Partial()), "
            f"one per mesh dim, e.g. {example}"
        )
    if len(value) != mesh.ndim:
        raise ValueError(
            f"{what} has {len(value)} placement{'s' if len(value) != 1 else ''} {describe(value)} for a "
            f"{mesh.ndim}-D mesh of shape {tuple(mesh.shape)}; expected {mesh.ndim}, one per mesh dim "
            f"(e.g. {example}; use Replicate() for a mesh dim the tensor is not split over)"
        )
    out = []
    for mesh_dim, p in enumerate(value):
        if isinstance(p, dt.Shard):
            ndim = len(shape) if shape is not None else 0
            if not -ndim <= p.dim < ndim:
                what_shape = f"has {ndim} dims (shape {list(shape)})" if shape is not None else "is not a tensor"
                fix = f"use Shard(d) with {-ndim} <= d < {ndim}" if ndim else "use Replicate()"
                raise ValueError(
                    f"{what}: Shard({p.dim}) on mesh dim {mesh_dim} is out of range: the input {what_shape}; {fix}"
                )
            p = dt.Shard(p.dim % ndim)
        out.append(p)
    return tuple(out)


def local_shape(shape: Sequence[int], mesh, placements: Sequence[Any]) -> tuple[int, ...]:
    """This rank's shard shape of a tensor of ``shape`` (DTensor's own computation; uneven dims
    give the remainder to the first chunks)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return tuple(compute_local_shape_and_global_offset(tuple(shape), mesh, list(placements))[0])


def local_shard(tensor: torch.Tensor, mesh, placements: Sequence[Any]) -> torch.Tensor:
    """This rank's piece of the full ``tensor`` (held by every rank), as a new contiguous tensor.

    Shard(d): the rank's chunk of dim d (``local_shape``); Partial(): the rank's share of a sum
    (DTensor's Replicate -> Partial: the value divided by the mesh dim's size); no
    communication happens."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    dt = _dt()
    placements = tuple(placements)
    t = tensor.detach()
    meta = TensorMeta(t.shape, t.stride(), t.dtype)
    src = DTensorSpec(mesh, tuple(dt.Replicate() for _ in placements), tensor_meta=meta)
    dst = DTensorSpec(mesh, placements, tensor_meta=meta)
    return redistribute_local_tensor(t, src, dst).contiguous().clone()


def redistribute(v, placements: Sequence[Any]):
    """DTensor ``v`` moved to ``placements`` with DTensor's own redistribution (collectives as
    functional collectives when traced).  Unlike ``DTensor.redistribute`` it also makes Partial
    targets (Replicate -> Partial, a local step strategies ask for, e.g. a bias added to a
    partial sum)."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    dt = _dt()
    spec = v._spec
    target = DTensorSpec(spec.mesh, tuple(placements), tensor_meta=spec.tensor_meta)
    local = redistribute_local_tensor(v._local_tensor, spec, target)
    return dt.DTensor(local, target, requires_grad=False)


# --------------------------------------------------------------------------- bytes


def _element_size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def transform_bytes(kind: str | None, logical_shape: Sequence[int], dtype: torch.dtype, n: int,
                    src_dim: int | None = None) -> int:
    """Bytes one rank sends for one redistribution step over a mesh dim of ``n`` ranks, of a
    tensor whose shape on that mesh dim is ``logical_shape`` (before it is split there)."""
    if kind is None or n <= 1:
        return 0
    full = math.prod(int(s) for s in logical_shape) * _element_size(dtype)
    if kind in ("all_gather", "all_to_all"):
        d = src_dim if src_dim is not None else 0
        size = int(logical_shape[d]) if logical_shape else 1
        shard = (full // size) * -(-size // n) if size else 0  # the padded chunk DTensor sends
        return (n - 1) * shard if kind == "all_gather" else (n - 1) * shard // n
    if kind == "all_reduce":
        return 2 * (n - 1) * full // n
    if kind == "reduce_scatter":
        return (n - 1) * full // n
    return 0


_BYTES_MEMO: dict = {}  # (mesh, placements, shape, dtype) -> bytes; emptied by choose_by_bytes


def redistribute_bytes(src_spec, dst_spec) -> int:
    """Bytes this rank sends to move a tensor from ``src_spec`` to ``dst_spec`` (DTensorSpecs
    with tensor_meta), following DTensor's own transform plan (one step per mesh dim)."""
    if tuple(src_spec.placements) == tuple(dst_spec.placements):
        return 0
    meta = src_spec.tensor_meta
    try:
        key = (id(src_spec.mesh), tuple(src_spec.placements), tuple(dst_spec.placements), tuple(meta.shape), meta.dtype)
        hash(key)
    except TypeError:  # symbolic sizes
        return _redistribute_bytes(src_spec, dst_spec)
    if key not in _BYTES_MEMO:
        _BYTES_MEMO[key] = _redistribute_bytes(src_spec, dst_spec)
    return _BYTES_MEMO[key]


def _redistribute_bytes(src_spec, dst_spec) -> int:
    from torch.distributed.tensor._redistribute import _gen_transform_infos_non_cached

    meta = src_spec.tensor_meta
    total = 0
    for info in _gen_transform_infos_non_cached(src_spec, dst_spec):
        src, dst = info.src_dst_placements
        if dst.is_partial() and not src.is_replicate():
            # DTensor cannot do Shard -> Partial or change a Partial's reduce op
            raise ValueError(f"no redistribution from {src} to {dst}")
        kind = info._comm_type_key()
        n = src_spec.mesh.size(info.mesh_dim)
        total += transform_bytes(kind, info.logical_shape, meta.dtype, n, getattr(src, "dim", None))
    return total


# --------------------------------------------------------------------------- strategy choice


_INFEASIBLE = 1 << 62


def spec_cost(current, desired) -> tuple[int, int]:
    """(bytes sent, 1 if anything changes) to move one input from ``current`` to ``desired``."""
    if tuple(current.placements) == tuple(desired.placements):
        return 0, 0
    if current.tensor_meta is not None and desired.tensor_meta is None:
        desired = desired.shallow_copy_with_tensor_meta(current.tensor_meta)
    try:
        sent = redistribute_bytes(current, desired)
    except Exception:  # a plan DTensor cannot make: never cheaper than one it can
        sent = _INFEASIBLE
    return sent, 1


def select_by_bytes(strategy, op_schema=None, _dtensor_select=None):
    """The OpSpec of ``strategy`` whose input redistributions send the fewest bytes.

    Strategies DTensor cannot carry out (an infinite cost of its own: Shard -> Partial...) are
    skipped.  Ties: no redistribution at all first, then the fewest inputs changed (a local slice is
    free in bytes but makes a sharded output others may have to gather), then DTensor's own
    cost model (latency + bandwidth: fewer collectives), then DTensor's order.  Without an
    ``op_schema`` (children of tuple strategies, for which DTensor passes none) DTensor's own
    choice stands."""
    if op_schema is None or len(strategy.strategies) == 1:
        return _dtensor_select(strategy, op_schema)
    current = op_schema.args_spec
    best, best_key = None, None
    for i, spec in enumerate(strategy.strategies):
        dtensor_cost = spec.redistribute_cost
        try:
            own = float(sum(sum(c) for c in dtensor_cost)) if dtensor_cost is not None else 0.0
        except TypeError:  # symbolic costs
            own = 0.0
        if own == math.inf:
            continue  # a redistribution DTensor cannot make (Shard -> Partial, another mesh...)
        sent = changed = 0
        for j, cur in enumerate(current):
            desired = spec.output_spec if spec.input_specs is None else spec.input_specs[j]
            s, c = spec_cost(cur, desired)
            sent += s
            changed += c
        key = (sent, changed, own, i)
        if best_key is None or key < best_key:
            best, best_key = spec, key
    if best is None or best_key[0] >= _INFEASIBLE:
        return _dtensor_select(strategy, op_schema)
    return best


def _shard_dim_alltoall(input: torch.Tensor, gather_dim: int, shard_dim: int, mesh, mesh_dim: int) -> torch.Tensor:
    """Shard(gather_dim) -> Shard(shard_dim) over ``mesh_dim`` as one all-to-all.

    ``input`` (this rank's shard, padded by DTensor so ``shard_dim`` splits evenly) is cut in n
    chunks along ``shard_dim``; chunk j goes to rank j; the n pieces received are joined along
    ``gather_dim`` in rank order."""
    import torch.distributed._functional_collectives as funcol

    n = mesh.size(mesh_dim)
    send = torch.stack(torch.chunk(input, n, dim=shard_dim)).contiguous()
    got = funcol.all_to_all_single(send, None, None, (mesh, mesh_dim))
    if isinstance(got, funcol.AsyncCollectiveTensor):
        got = got.wait()
    return torch.cat(got.unbind(0), dim=gather_dim).contiguous()


_choice_lock = threading.RLock()


@contextlib.contextmanager
def choose_by_bytes() -> Iterator[None]:
    """DTensor sharding propagation choosing strategies by bytes sent (``select_by_bytes``),
    Shard(i) -> Shard(j) as one all-to-all, and _StridedShard offsets computed eagerly (so a
    _StridedShard can be redistributed under fake tensors), inside the context.

    DTensor's sharding caches (Python and C++) are cleared on entry and exit, so no choice made
    outside leaks in and none made inside leaks out.  The context swaps three attributes of
    torch.distributed.tensor modules, so other threads using DTensor meanwhile see them too."""
    from torch.distributed.tensor import _sharding_prop, placement_types

    dt = _dt()
    with _choice_lock:
        original_select = _sharding_prop._select_min_cost_strategy
        original_a2a = placement_types.shard_dim_alltoall

        def select(strategy, op_schema=None):
            return select_by_bytes(strategy, op_schema, _dtensor_select=original_select)

        strided = placement_types._StridedShard
        original_offsets = strided.__dict__["local_shard_size_and_offset"]

        def offsets(self, *args, **kwargs):  # sizes in, sizes out: computed eagerly
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

            with unset_fake_temporarily(), disable_proxy_modes_tracing():
                return original_offsets(self, *args, **kwargs)

        _clear_sharding_caches(dt)
        _BYTES_MEMO.clear()
        _sharding_prop._select_min_cost_strategy = select
        placement_types.shard_dim_alltoall = _shard_dim_alltoall
        strided.local_shard_size_and_offset = offsets
        try:
            yield
        finally:
            _sharding_prop._select_min_cost_strategy = original_select
            placement_types.shard_dim_alltoall = original_a2a
            strided.local_shard_size_and_offset = original_offsets
            _clear_sharding_caches(dt)
            _BYTES_MEMO.clear()


def _clear_sharding_caches(dt) -> None:
    prop = dt.DTensor._op_dispatcher.sharding_propagator
    cache = getattr(prop.propagate_op_sharding, "cache_clear", None)
    if cache is not None:
        cache()
    clear_cpp = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_cpp is not None:
        clear_cpp()
    from torch.distributed.tensor import _redistribute

    gen = getattr(_redistribute._gen_transform_infos, "cache_clear", None)
    if gen is not None:
        gen()


# --------------------------------------------------------------------------- local_map export


def local_map_kwargs(node_or_gm: Any) -> dict | None:
    """The ``local_map`` arguments (in/out placements, mesh) of a ``local_map_hop`` node or of
    its body GraphModule, else None."""
    from torch._higher_order_ops.local_map import local_map_hop

    gm = node_or_gm
    if isinstance(node_or_gm, fx.Node):
        if node_or_gm.op != "call_function" or node_or_gm.target is not local_map_hop:
            return None
        body = node_or_gm.args[0]
        gm = getattr(node_or_gm.graph.owning_module, body.target) if isinstance(body, fx.Node) else body
    meta = getattr(gm, "meta", None) or {}
    return meta.get("local_map_kwargs")


def _proxy_local_map(mode, gm: fx.GraphModule, *args: Any, **kwargs: Any):
    """``local_map_hop`` under make_fx (export's pre-dispatch trace): record the HOP itself, its
    body traced to ATen on local shapes and registered as a submodule; the value it returns
    has the global shapes its out placements give (as ``local_map_hop``'s deferred fake
    kernel computes them)."""
    from torch._higher_order_ops.local_map import local_map_hop, redistribute_fw_inputs, redistribute_fw_outputs
    from torch._higher_order_ops.utils import reenter_make_fx, unique_graph_id
    from torch._library.fake_class_registry import maybe_unwrap_fake_script_object
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, track_tensor_tree

    if kwargs:
        raise ValueError(f"local_map regions take positional arguments only, got keywords {sorted(kwargs)}")
    kw = dict(gm.meta["local_map_kwargs"])
    mesh = maybe_unwrap_fake_script_object(kw["device_mesh"])
    kw["device_mesh"] = mesh
    local_args = redistribute_fw_inputs(args, kw["in_placements"], mesh)
    body = reenter_make_fx(gm)(*local_args)
    body.meta["local_map_kwargs"] = kw
    with disable_proxy_modes_tracing():
        local_out = body(*local_args)
        local_out = tuple(local_out) if isinstance(local_out, (list, tuple)) else (local_out,)
        out = tuple(redistribute_fw_outputs(local_out, kw["out_placements"], mesh, 0))
    _, name = unique_graph_id(mode, prefix="local_map_body")
    mode.tracer.root.register_module(name, body)
    proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, (body, *args))
    proxy = mode.tracer.create_proxy("call_function", local_map_hop, proxy_args, {})
    return track_tensor_tree(out, proxy, constant=None, tracer=mode.tracer)


def export_local_map(module: torch.nn.Module, args: tuple, kwargs: dict | None = None, **export_kwargs: Any):
    """``torch.export.export(module, args, strict=True)`` keeping ``local_map`` regions as
    ``torch.ops.higher_order.local_map_hop`` nodes whose bodies run on local shapes.

    In torch 2.13 ``torch.export`` cannot do this by itself: non-strict export calls the region's
    function on the global tensors (no HOP); strict export with
    ``LocalMapWrappedHigherOrderVariable.enable()`` gets the HOP from Dynamo, but its make_fx rule
    records a local closure as the node's target, which the export verifier rejects
    ("... call_local_map ... is not an allowed operator type").  Here that one rule is replaced
    while exporting: the node's target is ``local_map_hop`` itself and its body is an ATen
    submodule carrying ``meta["local_map_kwargs"]``.  The program is meant for
    ``fxforge.partition``: ``ep.module()`` and ``ep.run_decompositions()`` would run the body on
    global shapes.
    """
    from torch._dynamo.variables.higher_order_ops import LocalMapWrappedHigherOrderVariable
    from torch._higher_order_ops.local_map import local_map_hop
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode

    export_kwargs.setdefault("strict", True)
    if not export_kwargs["strict"]:
        raise ValueError("export_local_map needs strict=True: only Dynamo emits local_map_hop")
    table = local_map_hop.python_key_table
    with _choice_lock:
        old = table.get(ProxyTorchDispatchMode)
        table[ProxyTorchDispatchMode] = _proxy_local_map
        try:
            with LocalMapWrappedHigherOrderVariable.enable():
                return torch.export.export(module, args, kwargs, **export_kwargs)
        finally:
            if old is None:
                table.pop(ProxyTorchDispatchMode, None)
            else:
                table[ProxyTorchDispatchMode] = old
