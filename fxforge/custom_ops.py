"""Custom-op tuning: each candidate implementation of a custom op proven against the op, the
ones that agree timed, the fastest inlined.

``register_custom_op_autotuning(op, configs=[CustomOpConfig(impl, **params), ...])`` names
decompositions of ``op``: Python functions of ATen ops computing what the op computes.  When a
graph calling ``op`` compiles (``torch.compile``, ``compile_exported``) with
``Config(custom_op_tuning="on")`` (the default), each call site is tuned at its input shapes:

1. **Correctness first.**  Inputs are generated for the call site (``input_gen_fns``, else
   ``fxforge.testing.random_tensor`` at the site's shapes and dtypes).  Each candidate runs
   eagerly on them and is compared with the op itself (``fxforge.testing.mismatch``:
   dtype-aware tolerances).  Where the op has a gradient (``torch.library.register_autograd``),
   the candidate's gradients are compared with the op's too.  A candidate that raises or
   disagrees is rejected: a WARNING names it, the input and the largest error, and
   ``stats["custom_ops"]`` records it.
2. **Then speed.**  The op itself (``CustomOpConfig()``: the fallback, called opaquely) and each
   accepted candidate are compiled by fxforge with the compile's Config, each at the site
   among the neighbours the backend fuses with it (``context_of``), and timed (calls
   interleaved, the least time over rounds; ``fxforge.timing``).  A candidate is chosen when
   it is ``min_speedup`` times as fast as the op or more; the fastest such one wins.
3. **Inlined.**  The winner replaces the op's node before the graph is lowered (for
   ``torch.compile``, in the graph handed to AOTAutograd, so a training step differentiates the
   decomposition itself; for an exported program, through ``run_decompositions``): its ATen
   ops are ordinary nodes that the normal passes fuse with the op's producers and consumers.

With ``dispatch_on`` and ``split_points``, a site whose size is symbolic is checked and timed
per range of that size; where the ranges' winners differ, the op's node stays and the generated
wrapper dispatches on the size (``Dispatch``).

Choices are cached on disk (``$FXFORGE_CACHE_DIR/custom_ops``), keyed by the op, the candidates'
source code and parameters, the site's input shapes and dtypes and its neighbours, the device,
this CPU and the thread count: a second process reuses them without checking or timing again.
Details: docs/custom-ops.md.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import platform
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .timing import Budget, Timing, quiet, time_candidates

log = logging.getLogger("fxforge")

# Rounds of timed calls per site (each round calls every implementation once), at most, and the
# seconds a site's timing may take once a few rounds ran.
TIMING = Budget(rounds=30, min_rounds=5, seconds=1.0)


class CustomOpConfig:
    """One implementation of a custom op: ``impl(*args, **kwargs, **params)``, a Python function
    of ATen ops; ``CustomOpConfig()`` (no ``impl``) is the op itself, called opaquely."""

    def __init__(self, impl: Callable | None = None, **params: Any):
        if impl is not None and not callable(impl):
            raise TypeError(f"CustomOpConfig: impl must be a function (or None for the op itself), got "
                            f"{type(impl).__name__}")
        self.impl = impl
        self.params = dict(params)

    @property
    def name(self) -> str:
        if self.impl is None:
            return "fallback"
        base = getattr(self.impl, "__name__", type(self.impl).__name__)
        return base + (f"({', '.join(f'{k}={v!r}' for k, v in sorted(self.params.items()))})" if self.params else "")

    def bind(self, op: torch._ops.OpOverload) -> Callable[..., Any]:
        """A function computing the op this way, called with the op's arguments."""
        if self.impl is None:
            return op
        impl, params = self.impl, self.params

        def run(*args: Any, **kwargs: Any) -> Any:
            return impl(*args, **kwargs, **params)

        run.__name__ = self.name
        return run

    def source(self) -> str:
        """What the cache key holds of this implementation: its code and parameters."""
        if self.impl is None:
            return "fallback"
        try:
            code = inspect.getsource(self.impl)
        except (OSError, TypeError):
            code = getattr(self.impl, "__qualname__", repr(self.impl))
        return code + repr(sorted(self.params.items()))

    def __repr__(self) -> str:
        return f"CustomOpConfig({self.name})"


@dataclass(frozen=True)
class Tuning:
    op: torch._ops.OpOverload
    configs: tuple[CustomOpConfig, ...]  # the fallback first
    dispatch_on: Mapping[str, Any] | None = None
    split_points: tuple[int, ...] = ()
    min_speedup: float = 1.0
    input_gen_fns: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)


# Registrations, by op: process-wide, as torch.library registrations are.
_TUNINGS: dict[torch._ops.OpOverload, Tuning] = {}


def _overload(op: Any) -> torch._ops.OpOverload:
    op = getattr(op, "_opoverload", op)  # a @torch.library.custom_op function
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(f"register_custom_op_autotuning: op must be a custom op (a @torch.library.custom_op "
                        f"function or a torch.ops OpOverload), got {type(op).__name__}")
    return op


def register_custom_op_autotuning(op: Any, configs: Sequence[CustomOpConfig], *,
                                  dispatch_on: Mapping[str, Any] | None = None,
                                  split_points: Sequence[int] | None = None, min_speedup: float = 1.0,
                                  input_gen_fns: Mapping[str, Callable] | None = None) -> None:
    """Let fxforge choose among ``configs`` for ``op`` (module docstring).  The op itself is
    always a candidate (listed or not); registering again replaces the earlier configs."""
    op = _overload(op)
    if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        raise ValueError(f"register_custom_op_autotuning: {op.name()} writes to its arguments; only functional ops "
                         "(mutates_args=()) can be tuned")
    configs = [c if isinstance(c, CustomOpConfig) or not callable(c) else CustomOpConfig(c) for c in configs]
    if not configs or not all(isinstance(c, CustomOpConfig) for c in configs):
        raise TypeError("register_custom_op_autotuning: configs must be a non-empty list of fxforge.CustomOpConfig "
                        "(or of functions: CustomOpConfig(function))")
    if isinstance(min_speedup, bool) or not isinstance(min_speedup, (int, float)) or not min_speedup > 0:
        raise ValueError(f"register_custom_op_autotuning: min_speedup={min_speedup!r}: expected a number > 0")
    names = [a.name for a in op._schema.arguments]
    if dispatch_on is not None:
        keys = set(dispatch_on)
        if not {"tensor_name", "dim"} <= keys <= {"tensor_name", "dim", "unbounded_size"} \
                or dispatch_on["tensor_name"] not in names or not isinstance(dispatch_on["dim"], int):
            raise ValueError(f"register_custom_op_autotuning: dispatch_on={dict(dispatch_on)!r}: expected "
                             f"{{'tensor_name': one of {names}, 'dim': int}} (and optionally 'unbounded_size': "
                             "the size the last range is timed at)")
    points = tuple(split_points or ())
    if any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in points) or list(points) != sorted(set(points)):
        raise ValueError(f"register_custom_op_autotuning: split_points={split_points!r}: expected increasing ints >= 1")
    gens = dict(input_gen_fns or {})
    unknown = sorted(set(gens) - set(names))
    if unknown:
        raise ValueError(f"register_custom_op_autotuning: input_gen_fns names {unknown}, which are not arguments "
                         f"of {op.name()} ({names})")
    fallback = [c for c in configs if c.impl is None][:1] or [CustomOpConfig()]
    _TUNINGS[op] = Tuning(op, tuple(fallback + [c for c in configs if c.impl is not None]), dispatch_on, points,
                          float(min_speedup), gens)


def registered(op: Any) -> Tuning | None:
    return _TUNINGS.get(op) if isinstance(op, torch._ops.OpOverload) else None


# --------------------------------------------------------------------------- one call site


def _hint(s: Any) -> int:
    from .testing.equivalence import hint

    return hint(s)


def _site_inputs(t: Tuning, args: tuple, kwargs: dict, seed: int = 0) -> tuple[tuple, dict]:
    """Real inputs for a call site whose fake (or example) values are ``args``/``kwargs``."""
    from .testing.equivalence import random_tensor

    gen = torch.Generator().manual_seed(seed)
    bound = t.op._schema.arguments
    names = {i: a.name for i, a in enumerate(bound)}

    def make(v: Any, name: str | None) -> Any:
        if isinstance(v, (torch.Tensor, _Like)):
            if name in t.input_gen_fns:  # given a fake (here: meta) tensor of the site's shape
                like = torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, _Like) else v
                return t.input_gen_fns[name](like)
            x = random_tensor([_hint(s) for s in v.shape], v.dtype, gen, [_hint(s) for s in v.stride()])
            return x.to(v.device) if v.device.type != "cpu" else x
        if isinstance(v, torch.SymInt):
            return _hint(v)
        return v

    real_args = tuple(pytree.tree_map(lambda v, n=names.get(i): make(v, n), a) for i, a in enumerate(args))
    real_kwargs = {k: pytree.tree_map(lambda v, n=k: make(v, n), a) for k, a in kwargs.items()}
    return real_args, real_kwargs


def _describe_inputs(args: tuple, kwargs: dict) -> str:
    def one(v: Any) -> str:
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}" if isinstance(v, torch.Tensor) else repr(v)

    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


def _has_gradient(op: torch._ops.OpOverload) -> bool:
    """The op has a gradient formula of its own (``torch.library.register_autograd``)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:  # (another torch: no gradient check)
        return False
    d = OPDEFS.get(op._name)
    return d is not None and getattr(d, "_backward_fn", None) is not None


def _largest_error(a: Any, b: Any) -> float:
    errs = [(x.double() - y.double()).abs().max().item() for x, y in zip(pytree.tree_leaves(a), pytree.tree_leaves(b))
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.numel()]
    return max(errs, default=float("nan"))


def _disagreement(got: Any, want: Any) -> str | None:
    from .testing.equivalence import mismatch

    a, b = pytree.tree_leaves(got), pytree.tree_leaves(want)
    if len(a) != len(b):
        return f"returns {len(a)} values, the op {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                what = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                return f"output {i} is {what}, the op's {y.dtype} {list(y.shape)}"
            if mismatch(x, y) is not None:
                return f"output {i} differs"
    return None


def _gradients(f: Callable, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
    """The gradients of ``f``'s outputs, for fixed random output gradients, with respect to each
    floating-point tensor among ``args``/``kwargs`` (zeros where none flows); None where there is
    no such input."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    diff = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor) and v.dtype.is_floating_point]
    if not diff:
        return None
    xs = list(leaves)
    for i in diff:
        xs[i] = leaves[i].detach().clone().requires_grad_(True)
    a, k = pytree.tree_unflatten(xs, spec)
    with torch.enable_grad():
        out = [o for o in pytree.tree_leaves(f(*a, **k)) if isinstance(o, torch.Tensor) and o.requires_grad]
        gen = torch.Generator().manual_seed(1)
        seeds = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in out]
        grads = torch.autograd.grad(out, [xs[i] for i in diff], seeds, allow_unused=True)
    return [torch.zeros_like(leaves[i]) if g is None else g for i, g in zip(diff, grads)]


@dataclass
class _Reference:
    """What the op computes on one set of inputs: its outputs, and its gradients where it has
    its own (``_gradients``), found once for every candidate checked against them."""

    args: tuple
    kwargs: dict
    outputs: Any
    gradients: list[torch.Tensor] | None

    @staticmethod
    def of(t: Tuning, args: tuple, kwargs: dict) -> "_Reference":
        with torch.no_grad():
            outputs = t.op(*args, **kwargs)
        return _Reference(args, kwargs, outputs, _gradients(t.op, args, kwargs) if _has_gradient(t.op) else None)


def _check(t: Tuning, cfg: CustomOpConfig, ref: _Reference) -> str | None:
    """Why ``cfg`` does not compute what the op computes on ``ref``'s inputs (values, and
    gradients where the op has its own), or None."""
    fn = cfg.bind(t.op)
    with torch.no_grad():
        try:
            got = fn(*ref.args, **ref.kwargs)
        except Exception as e:
            return f"raised {type(e).__name__}: {e}"
    why = _disagreement(got, ref.outputs)
    if why is not None:
        return f"{why} (largest error {_largest_error(got, ref.outputs):.3g})"
    if ref.gradients is None:
        return None
    try:
        got_g = _gradients(fn, ref.args, ref.kwargs)
    except Exception as e:
        return f"its gradient raised {type(e).__name__}: {e}"
    want_g = ref.gradients
    why = _disagreement(got_g, want_g)
    if why is not None:
        return f"its gradient {why.replace('output', 'of input')} (largest error {_largest_error(got_g, want_g):.3g})"
    return None


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
        from .lowering.decompose import aot_table

        return aot_table(self.config, self.backend(tensors))

    def compile(self, fn: Callable[..., Any], tensors: list[torch.Tensor]) -> Callable[[], Any]:
        """``fn`` traced to ATen on ``tensors`` with the compile's decompositions, compiled by
        fxforge (tuning off: an op called there stays opaque), as a call on ``tensors``."""
        import dataclasses

        from torch.fx.experimental.proxy_tensor import make_fx

        from .compiler import compile_graph

        config = dataclasses.replace(self.config, custom_op_tuning="off", report_dir=None)
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
        from .testing.equivalence import random_tensor

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


def _timed(calls: dict[str, Callable[[], Any]], inputs: tuple) -> Timing:
    """``calls`` timed (``timing.time_candidates``: interleaved, least time over rounds, retried
    while the machine is busy); ``inputs``: the site's (args, kwargs), whose device decides
    whether the calls' CPU time tells the load."""
    on_cuda = any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in pytree.tree_leaves(inputs))
    return time_candidates(calls, TIMING, threads=torch.get_num_threads(), host=not on_cuda)


def _cache_key(t: Tuning, args: tuple, kwargs: dict, config: Any, neighbourhood: str = "") -> str:
    def spec(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return [str(v.dtype), [_hint(s) for s in v.shape], [_hint(s) for s in v.stride()], str(v.device)]
        return repr(_hint(v) if isinstance(v, torch.SymInt) else v)

    from .host import cpu_field

    cpu = cpu_field("model name") or platform.processor() or platform.machine()
    parts = [t.op.name(), torch.__version__, cpu, str(torch.get_num_threads()), config.codegen, repr(t.min_speedup),
             repr(t.dispatch_on), repr(t.split_points),
             *[c.source() for c in t.configs], json.dumps(pytree.tree_map(spec, (list(args), kwargs))), neighbourhood]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _dispatch_symbol(t: Tuning, args: tuple, kwargs: dict) -> Any:
    """The size ``dispatch_on`` names at this site, where it is symbolic (a sympy symbol): the
    site is then tuned per range of ``split_points``; None otherwise."""
    if not t.dispatch_on or not t.split_points:
        return None
    names = [a.name for a in t.op._schema.arguments]
    i = names.index(t.dispatch_on["tensor_name"])
    v = args[i] if i < len(args) else kwargs.get(names[i])
    if not isinstance(v, torch.Tensor) or not -v.dim() <= t.dispatch_on["dim"] < v.dim():
        return None
    size = v.shape[t.dispatch_on["dim"]]
    if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
        return size.node.expr
    return None


def _ranges(points: tuple[int, ...], unbounded: int | None = None) -> list[tuple[int, int | None, int]]:
    """(lowest, highest or None, the size it is timed at) per range of ``split_points``: a
    bounded range at its highest size, the last one at ``unbounded`` (``dispatch_on``'s
    ``unbounded_size``; default twice the last split point)."""
    bounds = [0, *points]
    out = [(lo + 1, hi, hi) for lo, hi in zip(bounds, bounds[1:])]
    return out + [(points[-1] + 1, None, max(points[-1] + 1, unbounded or 2 * points[-1]))]


@dataclass(frozen=True)
class _Like:
    """A tensor's shape, dtype and device (contiguous), for inputs at a size no fake value has."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device

    def stride(self) -> tuple:
        out, step = [], 1
        for n in reversed(self.shape):
            out.append(step)
            step *= max(n, 1)
        return tuple(reversed(out))


def _at_size(args: tuple, kwargs: dict, symbol: Any, size: int) -> tuple[tuple, dict]:
    """The site's fake values with every dim of size ``symbol`` at ``size``."""
    def one(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        shape = [size if isinstance(d, torch.SymInt) and d.node.expr == symbol else _hint(d) for d in v.shape]
        return _Like(tuple(shape), v.dtype, v.device)

    return pytree.tree_map(one, args), pytree.tree_map(one, kwargs)


def _choose(t: Tuning, times: dict[str, float]) -> str:
    base = times["fallback"]
    faster = [n for n, s in times.items() if n != "fallback" and base / s >= t.min_speedup]
    return min(faster, key=times.__getitem__) if faster else "fallback"


def tune_site(t: Tuning, args: tuple, kwargs: dict, setting: Setting, node: fx.Node | None = None) -> dict:
    """Check and time every candidate at one call site (``args``/``kwargs``: its fake or example
    values); returns the site's record for ``stats["custom_ops"]``: ``op``, ``node``, ``inputs``,
    ``candidates`` (name -> least seconds per call over the rounds), ``rejected`` (name -> reason), ``winner``
    (a candidate's name, "fallback" for the op itself) and ``cached``.  A site whose
    ``dispatch_on`` size is symbolic is tuned per range of ``split_points`` instead: ``ranges``
    lists each range's sizes, the size timed, the times and the winner (adjacent ranges with the
    same winner merged), and ``winner`` is the common one, or None where they differ.  Given the
    site's ``node``, a static site is timed with its neighbours, fused as they would be
    (``context_of``; ``context`` in the record names them); without one, or where the
    candidates' inputs come from ``input_gen_fns``, on its own."""
    from .codegen.diskcache import atomic_write, cache_dir

    where = "" if node is None else node.name
    if t.input_gen_fns:
        node = None  # the inputs it names are the op's own, which neighbours would compute
    key = _cache_key(t, args, kwargs, setting.config, "" if node is None else _neighbourhood(node))
    path = os.path.join(cache_dir("custom_ops"), f"{key}.json")
    names = {c.name for c in t.configs}
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if {r["winner"] for r in record.get("ranges", [record])} <= names and \
                not (record.get("contended") and quiet(torch.get_num_threads())):
            return dict(record, node=where, cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    symbol = _dispatch_symbol(t, args, kwargs)
    sites = [(None, None, args, kwargs)] if symbol is None else \
        [(lo, hi, *_at_size(args, kwargs, symbol, at))
         for lo, hi, at in _ranges(t.split_points, t.dispatch_on.get("unbounded_size"))]
    rejected: dict[str, str] = {}
    inputs = []
    for seed, (_, _, a, k) in enumerate(sites):
        real = _site_inputs(t, a, k, seed)
        inputs.append(real)
        ref = _Reference.of(t, *real)
        for cfg in t.configs[1:]:
            why = None if cfg.name in rejected else _check(t, cfg, ref)
            if why is not None:
                rejected[cfg.name] = why
                log.warning("fxforge: custom op %s: candidate %s rejected on inputs (%s): %s", t.op.name(), cfg.name,
                            _describe_inputs(*real), why)
    accepted = [c for c in t.configs if c.name not in rejected]
    record: dict[str, Any] = {"op": t.op.name(), "inputs": _describe_inputs(*inputs[0]), "rejected": rejected}
    if symbol is None:
        calls = {}
        context = None if node is None else context_of(node, setting)
        if context is not None:
            record["context"] = context.describe()
        for cfg in accepted:
            try:
                calls[cfg.name] = context.call(cfg, t, setting) if context is not None else \
                    _compiled(t, cfg, *inputs[0], setting)
            except Exception as e:
                if cfg.impl is None:
                    raise
                rejected[cfg.name] = f"did not compile: {type(e).__name__}: {e}"
                log.warning("fxforge: custom op %s: candidate %s did not compile (%s); not chosen", t.op.name(),
                            cfg.name, e)
        timings = [_timed(calls, inputs[0])]
        record["candidates"] = timings[0].seconds
        record["winner"] = _choose(t, record["candidates"])
    else:
        # one graph serves every range: each range's winner runs as its own ATen calls, timed so
        dim = t.dispatch_on["dim"]
        record["dispatch_on"] = f"{t.dispatch_on['tensor_name']}.size({dim})"
        ranges, timings = [], []
        for (lo, hi, _, _), (ra, rk) in zip(sites, inputs):
            timings.append(_timed({c.name: (lambda f=c.bind(t.op), ra=ra, rk=rk: f(*ra, **rk)) for c in accepted},
                                  (ra, rk)))
            times = timings[-1].seconds
            winner = _choose(t, times)
            if ranges and ranges[-1]["winner"] == winner:
                ranges[-1]["sizes"][1] = hi
                ranges[-1]["times"].append(times)
            else:
                ranges.append({"sizes": [lo, hi], "at": _describe_inputs(ra, rk), "times": [times], "winner": winner})
        record["ranges"] = ranges
        record["winner"] = ranges[0]["winner"] if len(ranges) == 1 else None
    contended = [x for x in timings if x.contended]
    if contended:
        # stored marked: a later compile on a quiet machine times the site again
        record["contended"] = contended[0].describe()
        log.info("fxforge: custom op %s: timed while the machine was busy (%s); choice %s kept until a quiet "
                 "compile times it again", t.op.name(), record["contended"], record["winner"])
    try:
        atomic_write(path, json.dumps(record))
    except OSError:
        pass
    return dict(record, node=where, cached=False)


@dataclass(frozen=True)
class Dispatch:
    """A call site chosen per range of one size: the generated wrapper's ``if`` chain
    (``codegen/wrapper.py``) calls ``branches[i]`` where the size is at most ``bounds[i]`` (the
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


def _shape_key(args: tuple, kwargs: dict) -> str:
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (str(v.dtype), tuple(_hint(s) for s in v.shape))
        return _hint(v) if isinstance(v, torch.SymInt) else repr(v)

    return repr(pytree.tree_map(one, (list(args), kwargs)))
