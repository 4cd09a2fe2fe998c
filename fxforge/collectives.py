"""Functional collectives (``torch.ops._c10d_functional``): which ops they are, how many bytes a
rank sends in each, and which keep reading their input after the call returns.

``stats["collective_bytes"]`` (what this rank sends per call) and ``stats["collectives"]`` (one
entry per collective) are computed with these for every compiled graph; the liveness of a
collective's input extends to its ``wait_tensor`` where the collective reads it asynchronously
(graph.liveness).  Byte counts follow ring algorithms: all-gather (n-1) x shard, all-reduce
2(n-1)/n x tensor, reduce-scatter (n-1)/n x tensor, all-to-all (n-1)/n x input.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx


def _funcol():
    return torch.ops._c10d_functional


def _group_size(name: Any) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name).size()


def _group_rank(name: Any) -> int:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    return dist.get_group_rank(_resolve_process_group(name), dist.get_rank())


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
    """(collective name, bytes this rank sends) for a functional collective node, else None."""
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
