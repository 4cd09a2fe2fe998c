"""Where a candidate is timed: compiled by fxforge at the site among the neighbours the backend
fuses with it (``context_of``, ``Context``), with the compile's ``Setting``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .check import _hint, _shape_key
from .register import CustomOpConfig, Tuning, registered


def _compiled(t: Tuning, cfg: CustomOpConfig, args: tuple, kwargs: dict, setting: "Setting") -> Callable[[], Any]:
    """``cfg`` compiled by fxforge on its own, as a call on ``args``."""
    fn = cfg.bind(t.op)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def site(*tensors: torch.Tensor) -> Any:
        xs = list(leaves)
        for i, v in zip(where, tensors):
            xs[i] = v
        a, k = pytree.tree_unflatten(xs, spec)
        return fn(*a, **k)

    return setting.compile(site, [leaves[i] for i in where])


@dataclass(frozen=True)
class Setting:
    """How a compile's call sites are tuned: its Config and registry (the backend, the
    decompositions and the compiles of candidates are theirs)."""

    config: Any
    registry: Any

    def backend(self, tensors: Sequence[Any]) -> Any:
        return self.registry.select(self.config, {v.device.type for v in tensors} or {"cpu"})

    def table(self, tensors: Sequence[Any]) -> dict:
        from ..lowering.decompose import aot_table

        return aot_table(self.config, self.backend(tensors))

    def compile(self, fn: Callable[..., Any], tensors: list[torch.Tensor]) -> Callable[[], Any]:
        """``fn`` traced to ATen on ``tensors`` with the compile's decompositions, compiled by
        fxforge (tuning off: an op called there stays opaque; no tiered builds: the call is
        timed), as a call on ``tensors``."""
        import dataclasses

        from torch.fx.experimental.proxy_tensor import make_fx

        from ..spine import compile_graph

        # (timed: its C kernels built in full before the compile returns, never at -Og first)
        config = dataclasses.replace(self.config, custom_op_tuning="off", report_dir=None, tiered_builds=False)
        with torch.no_grad():
            gm = make_fx(fn, tracing_mode="fake", decomposition_table=self.table(tensors))(*tensors)
        c = compile_graph(gm, config, kind="inference", registry=self.registry)
        return lambda: c(*tensors)


@dataclass
class Context:
    """A call site with its neighbours (``context_of``): ``graph`` runs the nodes producing the
    site's tensor arguments, the site and the nodes using its result; ``site`` is the site's node
    there; ``inputs`` the values its placeholders stand for (fake or example values)."""

    graph: fx.GraphModule
    site: fx.Node
    inputs: list[Any]

    def describe(self) -> str:
        return " ".join(_name(m) for m in self.graph.graph.nodes if m.op in ("call_function", "call_method"))

    def call(self, cfg: CustomOpConfig, t: Tuning, setting: Setting, seed: int = 0) -> Callable[[], Any]:
        """The neighbourhood with ``cfg`` at the site, compiled by fxforge, as a call on inputs
        generated for it."""
        from ..testing.equivalence import random_tensor

        self.site.target = cfg.bind(t.op)
        self.graph.recompile()
        gen = torch.Generator().manual_seed(seed)
        tensors = [random_tensor([_hint(d) for d in v.shape], v.dtype, gen, [_hint(d) for d in v.stride()])
                   for v in self.inputs]
        return setting.compile(self.graph, tensors)


def _name(m: fx.Node) -> str:
    t = m.target
    return t if isinstance(t, str) else t.name() if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))


def _val(m: fx.Node) -> Any:
    """A node's fake value (ATen graphs) or example value (Dynamo's)."""
    return m.meta.get("val", m.meta.get("example_value"))


def _fusable(m: fx.Node, setting: Setting) -> bool:
    """Whether the compile's backend fuses, and runs every ATen op ``m`` becomes as its own
    kernel code (no extern call: a matmul or convolution next to the site would add its time to
    every candidate's alike and hide their differences)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    vals = [_val(a) for a in m.all_input_nodes]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    backend = setting.backend(vals)
    if not backend.fuses:
        return False
    g = fx.Graph()
    env = {a: g.placeholder(f"in{i}") for i, a in enumerate(m.all_input_nodes)}
    g.output(g.node_copy(m, lambda a: env[a]))
    inputs = [torch.empty([_hint(d) for d in v.shape], dtype=v.dtype, device=v.device) for v in vals]
    try:
        with torch.no_grad():
            gm = make_fx(fx.GraphModule(torch.nn.Module(), g), tracing_mode="fake",
                         decomposition_table=setting.table(vals))(*inputs)
    except Exception:
        return False
    return all(backend.accepts(k, setting.config) is None for k in gm.graph.nodes if k.op == "call_function")


def _neighbours(n: fx.Node) -> tuple[list[fx.Node], list[fx.Node]]:
    """The calls next to site ``n`` that may join its timing (``context_of``): producing its
    arguments, using its result; each a call whose value is one tensor, no other tuned op."""
    def near(m: fx.Node) -> bool:
        return m.op in ("call_function", "call_method") and isinstance(_val(m), torch.Tensor) and \
            registered(m.target) is None

    return [a for a in n.all_input_nodes if near(a)], [u for u in n.users if near(u)]


def _neighbourhood(n: fx.Node) -> str:
    """What a site's cache key holds of its neighbours: each one's op and its inputs' shapes
    (what decides ``context_of``), without tracing any."""
    def spec(m: fx.Node) -> str:
        return _name(m) + repr([_shape_key((_val(a),), {}) for a in m.all_input_nodes])

    producers, consumers = _neighbours(n)
    return " ".join(map(spec, producers + consumers))


def context_of(n: fx.Node, setting: Setting) -> Context | None:
    """Site ``n`` with its neighbours (``_neighbours``) that the backend fuses (``_fusable``), the
    rest of the graph as placeholders; None where it has none, or an input is not a tensor."""
    producers, consumers = ([m for m in ms if _fusable(m, setting)] for ms in _neighbours(n))
    if not producers and not consumers:
        return None
    inside = set(producers) | {n} | set(consumers)
    order = [m for m in n.graph.nodes if m in inside]
    outside = list(dict.fromkeys(a for m in order for a in m.all_input_nodes if a not in inside))
    if not all(isinstance(_val(a), torch.Tensor) for a in outside):
        return None
    g = fx.Graph()
    env = {a: g.placeholder(f"in{i}") for i, a in enumerate(outside)}
    for m in order:
        env[m] = g.node_copy(m, lambda a: env[a])
    g.output(tuple(env[m] for m in order if m in consumers or any(u not in inside for u in m.users)))
    return Context(fx.GraphModule(torch.nn.Module(), g), env[n], [_val(a) for a in outside])
