"""Collectives: which ops they are, how many bytes a rank sends in each, which keep reading their
input after the call returns, and which read arguments from symmetric memory.

Functional collectives (``torch.ops._c10d_functional``) and symmetric-memory collectives
(``torch.ops.symm_mem``, and custom ops registering symmetric-memory arguments: passes/symmetric.py).

``stats["collective_bytes"]`` (what this rank sends per call) and ``stats["collectives"]`` (one
entry per collective) are computed with these for every compiled graph; the liveness of a
collective's input extends to its ``wait_tensor`` where the collective reads it asynchronously
(graph.liveness).  Byte counts follow ring algorithms: all-gather (n-1) x shard, all-reduce
2(n-1)/n x tensor, reduce-scatter (n-1)/n x tensor, all-to-all (n-1)/n x input.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx


def _funcol():
    return torch.ops._c10d_functional


def process_group(name: Any):
    """The process group a collective's ``group_name`` argument names."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def group_rank(pg) -> int:
    """This process's rank within process group ``pg``."""
    import torch.distributed as dist

    return dist.get_group_rank(pg, dist.get_rank())


def _group_size(name: Any) -> int:
    return process_group(name).size()


def _group_rank(name: Any) -> int:
    return group_rank(process_group(name))


def _val_bytes(node: Any) -> int:
    v = node.meta.get("val") if isinstance(node, fx.Node) else node
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (list, tuple)):
        return sum(_val_bytes(x) for x in v)
    return 0


def _collective_table() -> dict:
    """op -> (name, bytes one rank sends given the node): the functional collectives."""
    f = _funcol()

    def all_gather(n):  # (input, group_size, group_name)
        return (int(n.args[1]) - 1) * _val_bytes(n.args[0])

    def all_gather_coalesced(n):  # (inputs, group_size, group_name)
        return (int(n.args[1]) - 1) * sum(_val_bytes(a) for a in n.args[0])

    def all_reduce(n):  # (input, op, group_name)
        g = _group_size(n.args[2])
        return 2 * (g - 1) * _val_bytes(n.args[0]) // g

    def all_reduce_coalesced(n):  # (inputs, op, group_name)
        g = _group_size(n.args[2])
        return sum(2 * (g - 1) * _val_bytes(a) // g for a in n.args[0])

    def reduce_scatter(n):  # (input, op, group_size, group_name)
        g = int(n.args[2])
        return (g - 1) * _val_bytes(n.args[0]) // g

    def reduce_scatter_coalesced(n):  # (inputs, op, group_size, group_name)
        g = int(n.args[2])
        return sum((g - 1) * _val_bytes(a) // g for a in n.args[0])

    def all_to_all(n):  # (input, output_split_sizes, input_split_sizes, group_name)
        total = _val_bytes(n.args[0])
        splits = n.args[2]
        g = _group_size(n.args[3])
        if splits:
            rows = sum(int(s) for s in splits)
            own = int(splits[_group_rank(n.args[3])])
            return total - (total // rows) * own if rows else 0
        return (g - 1) * total // g

    def broadcast(n):  # (input, src, group_name)
        g = _group_size(n.args[2])
        return (g - 1) * _val_bytes(n.args[0]) if _group_rank(n.args[2]) == int(n.args[1]) else 0

    table = {
        f.all_gather_into_tensor.default: ("all_gather", all_gather),
        f.all_gather_into_tensor_coalesced.default: ("all_gather", all_gather_coalesced),
        f.all_reduce.default: ("all_reduce", all_reduce),
        f.all_reduce_coalesced.default: ("all_reduce", all_reduce_coalesced),
        f.reduce_scatter_tensor.default: ("reduce_scatter", reduce_scatter),
        f.reduce_scatter_tensor_coalesced.default: ("reduce_scatter", reduce_scatter_coalesced),
        f.all_to_all_single.default: ("all_to_all", all_to_all),
        f.broadcast.default: ("broadcast", broadcast),
    }
    return table


class _Ops:
    """The functional collective OpOverloads, resolved on first use."""

    _table: dict | None = None

    def table(self) -> dict:
        if self._table is None:
            type(self)._table = _collective_table()
        return self._table

    def __contains__(self, op: Any) -> bool:
        try:
            return op in self.table()
        except TypeError:  # unhashable call target
            return False


COLLECTIVE_OPS = _Ops()


def collective_bytes(node: fx.Node) -> tuple[str, int] | None:
    """(collective name, bytes this rank sends) for a collective node, else None.  In a
    symmetric-memory collective peers read a rank's input: a one-shot all-reduce (g-1) x input,
    a two-shot one 2(g-1)/g x input, fused all-gather-matmul (g-1) x its operand."""
    if is_symmetric_collective(node):
        return _symmetric_bytes(node)
    if node.op != "call_function" or node.target not in COLLECTIVE_OPS:
        return None
    name, count = COLLECTIVE_OPS.table()[node.target]
    return name, int(count(node))


# Collectives that keep reading their input after the call returns (until ``wait_tensor``):
# all_reduce copies its input first, these do not.
def async_input_ops() -> set:
    f = _funcol()
    return {
        f.all_gather_into_tensor.default,
        f.all_gather_into_tensor_coalesced.default,
        f.reduce_scatter_tensor.default,
        f.reduce_scatter_tensor_coalesced.default,
        f.all_to_all_single.default,
        f.broadcast.default,
    }


def wait_op():
    return _funcol().wait_tensor.default


def collective_stats(gm: fx.GraphModule) -> list[dict]:
    """One entry per collective of ``gm``: node, collective, bytes this rank sends, input shape."""
    out = []
    for n in gm.graph.nodes:
        c = collective_bytes(n)
        if c is not None:
            v = n.args[0].meta.get("val") if isinstance(n.args[0], fx.Node) else None
            out.append({"node": n.name, "collective": c[0], "bytes": c[1],
                        "shape": list(v.shape) if isinstance(v, torch.Tensor) else None})
    return out


# --------------------------------------------------------------------------- symmetric memory

# symm_mem collectives and the arguments they read from every rank's symmetric memory.
SYMM_MEM_ARGS = {
    "one_shot_all_reduce": ("input",),
    "one_shot_all_reduce_out": ("input",),
    "one_shot_all_reduce_copy": ("symm_buffer",),
    "one_shot_all_reduce_copy_out": ("symm_buffer",),
    "two_shot_all_reduce_": ("input",),
    "two_shot_all_reduce_out": ("input",),
    "multimem_all_reduce_": ("input",),
    "multimem_one_shot_all_reduce": ("input",),
    "multimem_one_shot_all_reduce_out": ("input",),
    "reduce_scatter_out": ("input",),
}
# symm_mem collectives that manage their own symmetric workspace: fences, no planned buffer.
SYMM_MEM_COLLECTIVES = {"fused_all_gather_matmul", "fused_matmul_reduce_scatter"}


def _packet(op) -> str:
    return op.name().split("::", 1)[1].split(".", 1)[0]


def _schema_arg(node: fx.Node, name: str) -> Any:
    """The value of the argument ``name`` of an op node (by its schema), else None."""
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
        return None
    for i, a in enumerate(op._schema.arguments):
        if a.name == name:
            return node.kwargs.get(name, node.args[i] if i < len(node.args) else None)
    return None


def group_name_of(node: fx.Node) -> str | None:
    """The process group a collective node runs on (its ``group_name`` argument), else None."""
    v = _schema_arg(node, "group_name")
    return str(v) if v is not None else None


def group_size_of(node: fx.Node) -> int:
    """The ranks of a collective's process group: its ``group_size`` argument where it has one,
    else the size of the group it names (1: no such group in this process)."""
    size = _schema_arg(node, "group_size")
    if isinstance(size, int):
        return size
    name = group_name_of(node)
    try:
        return process_group(name).size() if name is not None else 1
    except Exception:  # (no such process group in this process)
        return 1


def is_collective(n: fx.Node) -> bool:
    """A functional collective (its result waited for by ``wait_tensor``)."""
    return n.op == "call_function" and n.target in COLLECTIVE_OPS


def is_wait(n: fx.Node) -> bool:
    return n.op == "call_function" and n.target is wait_op()


def waited_collective(w: fx.Node) -> fx.Node | None:
    """The collective a ``wait_tensor`` waits for (through a getitem of a coalesced one)."""
    a = w.args[0] if w.args else None
    if isinstance(a, fx.Node) and a.target is operator.getitem:
        a = a.args[0]
    return a if isinstance(a, fx.Node) and is_collective(a) else None


def symmetric_args(node: fx.Node) -> tuple[str, ...]:
    """Names of the arguments of ``node`` that must live in symmetric memory (empty: none)."""
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
        return ()
    if op.namespace == "symm_mem" and _packet(op) in SYMM_MEM_ARGS:
        return SYMM_MEM_ARGS[_packet(op)]
    return _registered_args(op)


def _registered_args(op) -> tuple[str, ...]:
    """Arguments a custom op registered with ``Library.register_symm_mem_args`` (torch >= 2.12).
    Read with the registry's ``get``: asking about an op must not add an entry for it."""
    try:
        from torch._library.simple_registry import singleton

        entry = singleton.get(op._schema.name)
    except (ImportError, AttributeError):
        return ()
    holder = getattr(entry, "symm_mem_args", None)
    names = holder.get() if holder is not None else None
    return tuple(names) if names else ()


def is_symmetric_collective(node: fx.Node) -> bool:
    """A collective reading symmetric memory, or a symm_mem collective with its own workspace."""
    op = node.target
    return bool(symmetric_args(node)) or (
        isinstance(op, torch._ops.OpOverload) and op.namespace == "symm_mem" and _packet(op) in SYMM_MEM_COLLECTIVES)


def symmetric_arg_nodes(node: fx.Node) -> list[tuple[int, fx.Node]]:
    """(positional index, node) of the arguments of ``node`` that must live in symmetric memory."""
    names = symmetric_args(node)
    if not names:
        return []
    out = []
    for i, a in enumerate(node.target._schema.arguments):
        if a.name in names:
            v = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
            if isinstance(v, fx.Node):
                out.append((i, v))
    return out


def _symmetric_bytes(node: fx.Node) -> tuple[str, int]:
    name = _packet(node.target)
    g = _group_size(group_name_of(node))
    data = _val_bytes(node.args[0])
    if name in ("two_shot_all_reduce_", "two_shot_all_reduce_out", "multimem_all_reduce_", "reduce_scatter_out"):
        return name, 2 * (g - 1) * data // g
    if name == "fused_matmul_reduce_scatter":
        return name, (g - 1) * _val_bytes(node)
    return name, (g - 1) * data
