"""Custom-op tuning on a graph: every tuned call site found and tuned, the winners inlined
(``inline_winners``, ``decomposition_table``), and sites chosen per range dispatched by the
wrapper (``Dispatch``, ``Dispatches``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .check import _shape_key
from .context import Setting, _val
from .register import Tuning, _TUNINGS, registered
from .tune import tune_site


@dataclass(frozen=True)
class Dispatch:
    """A call site chosen per range of one size: the generated wrapper's ``if`` chain
    (``codegen/wrapper/``) calls ``branches[i]`` where the size is at most ``bounds[i]`` (the
    last bound None: every larger size)."""

    op: torch._ops.OpOverload
    tensor: str  # the argument whose size decides
    dim: int
    bounds: tuple[int | None, ...]
    branches: tuple[Callable[..., Any], ...]  # each range's winner, bound to the op's arguments

    @staticmethod
    def of(t: Tuning, record: dict) -> "Dispatch":
        by_name = {c.name: c for c in t.configs}
        return Dispatch(t.op, t.dispatch_on["tensor_name"], t.dispatch_on["dim"],
                        tuple(r["sizes"][1] for r in record["ranges"]),
                        tuple(by_name[r["winner"]].bind(t.op) for r in record["ranges"]))

    def size_arg(self, node: fx.Node) -> Any:
        """The argument of ``node`` (a call of the op) whose size decides."""
        names = [a.name for a in self.op._schema.arguments]
        i = names.index(self.tensor)
        return node.args[i] if i < len(node.args) else node.kwargs[self.tensor]


# --------------------------------------------------------------------------- graphs


def _site_values(n: fx.Node) -> tuple[tuple, dict]:
    """A call's arguments with each node as its (fake or example) value."""
    def val(a: Any) -> Any:
        return _val(a) if isinstance(a, fx.Node) else a

    return pytree.tree_map(val, tuple(n.args)), pytree.tree_map(val, dict(n.kwargs))


def tuned_sites(gm: fx.GraphModule, setting: Setting) -> list[tuple[fx.Node, Tuning, dict]]:
    """Every call of a registered op in ``gm`` with its record (``tune_site``); nothing when
    the Config's ``custom_op_tuning`` is "off"."""
    if setting.config.custom_op_tuning == "off" or not _TUNINGS:
        return []
    out = []
    for n in gm.graph.nodes:
        t = registered(n.target) if n.op == "call_function" else None
        if t is None:
            continue
        args, kwargs = _site_values(n)
        # tuning runs real calls and compiles of its own: outside the caller's fake mode and its
        # tracing context (Dynamo's, whose shape environment must not see them)
        with torch._subclasses.fake_tensor.unset_fake_temporarily(), torch._guards.tracing(None):
            out.append((n, t, tune_site(t, args, kwargs, setting, n)))
    return out


def _choices(gm: fx.GraphModule, config: Any, registry: Any) -> tuple[list, list[dict], "Dispatches"]:
    """Tune every call of a registered op in ``gm``: the sites whose winner is a decomposition,
    as (node, the winner bound to the op's arguments), the sites' records, and the sites chosen
    per range (they keep the op's node and dispatch at run time)."""
    inline, records, dispatches = [], [], Dispatches()
    for n, t, record in tuned_sites(gm, Setting(config, registry)):
        if record["winner"] is None:
            dispatches[(t.op, _shape_key(*_site_values(n)))] = Dispatch.of(t, record)
        elif record["winner"] != "fallback":
            inline.append((n, next(c for c in t.configs if c.name == record["winner"]).bind(t.op)))
        records.append(record)
    return inline, records, dispatches


def inline_winners(gm: fx.GraphModule, config: Any, registry: Any) -> tuple[list[dict], "Dispatches"]:
    """For a graph above autograd (Dynamo's): tune its sites and point each node whose winner is
    a decomposition at it (the graph's tracer then records the decomposition's ATen ops, and
    their gradient).  Returns the sites' records and the per-range choices."""
    inline, records, dispatches = _choices(gm, config, registry)
    for n, fn in inline:
        n.target = fn
    if inline:
        gm.recompile()
    return records, dispatches


def decomposition_table(gm: fx.GraphModule, config: Any, registry: Any) -> tuple[dict, list[dict], "Dispatches"]:
    """For an exported program's graph: decompositions (op -> function choosing, by its
    arguments' shapes, the winner of the site with those shapes; the op itself where the op
    won or the choice is per range), the sites' records and the per-range choices."""
    inline, records, dispatches = _choices(gm, config, registry)
    by_op: dict[torch._ops.OpOverload, dict[str, Callable]] = {}
    for n, fn in inline:
        by_op.setdefault(n.target, {})[_shape_key(*_site_values(n))] = fn
    table = {}
    for op, choices in by_op.items():
        def decompose(*args: Any, _choices=choices, **kwargs: Any) -> Any:
            fn = _choices.get(_shape_key(args, kwargs))
            return NotImplemented if fn is None else fn(*args, **kwargs)

        table[op] = decompose
    return table, records, dispatches


class Dispatches(dict):
    """(op, shape key) -> ``Dispatch``: a compile's call sites chosen per range."""

    def of(self, node: fx.Node) -> Dispatch | None:
        """The per-range choice for ``node`` (a call of a tuned op), if its site has one."""
        if not self or not isinstance(node.target, torch._ops.OpOverload):
            return None
        return self.get((node.target, _shape_key(*_site_values(node))))


