"""PassManager: runs passes in order, verifies the graph between them, records what each did.

A pass is any callable taking a GraphModule and returning one of
* ``fxforge.PassResult(graph_module, modified, stats, recompile)`` (``stats`` optional, a dict of
  ints; ``recompile=False``: the pass changed only metadata, or recompiled the module itself, so
  the manager need not regenerate its code),
* torch.fx's ``PassResult(graph_module, modified)``,
* a GraphModule (modified),
* a bool (modified, graph changed in place) or None (in place, assumed modified).

Regenerating a module's Python code (``GraphModule.recompile``) costs about as much as a pass on
a large graph, and fxforge's own passes never read it: while the manager runs, recompiles are
deferred (``_DeferredRecompile``) and made before a pass from outside fxforge (yours may run the
module); the module handed back regenerates its code when it is first run, or its code read,
printed or pickled (torch's lazy GraphModule): a compile that never runs it never pays for it.

In debug mode (``Config(debug=True)``, ``FXFORGE_DEBUG=1``) every pass is followed by
``verify_graph``: ``graph.lint()``, ``meta["val"]`` on every node, and fake values re-propagated
through the graph agree with the stored ones.  A failure names the pass that broke the graph.
"""

from __future__ import annotations

import contextlib

import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import sympy
import torch
import torch.fx as fx

from ..core.graph import PROBES, VAL, count_compute_nodes, fake_mode_of, has_val, size_hints


class PassResult(NamedTuple):
    graph_module: fx.GraphModule
    modified: bool
    stats: dict | None = None
    recompile: bool | None = None  # the module's code must be regenerated (None: if modified)


class PassError(RuntimeError):
    """A pass raised, or left the graph broken (debug mode)."""

    def __init__(self, pass_name: str, message: str):
        super().__init__(f"after pass {pass_name!r}: {message}")
        self.pass_name = pass_name


@dataclass
class PassRecord:
    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    modified: bool
    stats: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "seconds": self.seconds,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "modified": self.modified,
            **({"stats": self.stats} if self.stats else {}),
        }


def pass_name(p: Callable) -> str:
    return getattr(p, "name", None) or getattr(p, "__name__", None) or type(p).__name__


def run_one(p: Callable, gm: fx.GraphModule) -> PassResult:
    """Call a pass and normalise whatever it returned to a PassResult."""
    return normalize_result(p, gm, p(gm))


def normalize_result(p: Callable, gm: fx.GraphModule, r: Any) -> PassResult:
    """What pass ``p`` returned when called on ``gm``, as a PassResult (the accepted forms are
    in this module's docstring); a TypeError names the pass and what it returned otherwise."""
    if r is None:
        return PassResult(gm, True)
    if isinstance(r, bool):
        return PassResult(gm, r)
    if isinstance(r, fx.GraphModule):
        return PassResult(r, True)
    if isinstance(r, PassResult):
        return r
    if isinstance(r, tuple) and len(r) >= 2 and isinstance(r[0], fx.GraphModule):
        stats = r[2] if len(r) > 2 else getattr(r, "stats", None)
        return PassResult(r[0], bool(r[1]), stats)
    raise TypeError(
        f"pass {pass_name(p)!r} returned {type(r).__name__}; expected PassResult, bool, GraphModule or None"
    )


class PassManager:
    def __init__(self, passes: Sequence[Callable], *, debug: bool = False,
                 observer: Callable[[str, fx.GraphModule, bool], None] | None = None):
        self.passes = list(passes)
        self.debug = debug
        # called as observer("<input>", gm, True) before the first pass and observer(name, gm,
        # modified) after each, ``modified`` as the pass reported it (the report's recorder:
        # fxforge/report/record.py)
        self.observer = observer

    def __call__(self, gm: fx.GraphModule) -> tuple[fx.GraphModule, list[PassRecord]]:
        try:
            return self._run(gm)
        finally:  # what backends memoized while the passes ran (codegen/probes.py)
            PROBES.clear(gm)

    def _run(self, gm: fx.GraphModule) -> tuple[fx.GraphModule, list[PassRecord]]:
        records = []
        # backends' memo while the passes run (codegen/probes.py, ir/facts.py); one handed in with
        # the graph is shared with the other graphs it was handed with (a partitioner's trials)
        memo = PROBES.get(gm)
        PROBES.set(gm, {} if memo is None else memo)
        if self.debug:
            _verify_or_raise("<input>", gm)
        if self.observer is not None:
            self.observer("<input>", gm, True)
        deferred = _DeferredRecompile(gm)
        try:
            for p in self.passes:
                if not _fxforges(p):
                    deferred.flush()  # (a pass of yours may run the module: its code is current)
                name = pass_name(p)
                before = count_compute_nodes(gm)
                t0 = time.perf_counter()
                try:
                    r = run_one(p, gm)
                except PassError:
                    raise
                except Exception as e:
                    raise PassError(name, f"{type(e).__name__}: {e}") from e
                if r.graph_module is not gm:  # (a new module: its code is its own)
                    deferred.flush()
                    gm = r.graph_module
                    deferred = _DeferredRecompile(gm)
                if r.modified if r.recompile is None else r.recompile:
                    gm.recompile()
                records.append(PassRecord(name, time.perf_counter() - t0, before, count_compute_nodes(gm), r.modified,
                                          dict(r.stats or {})))
                if self.debug:
                    _verify_or_raise(name, gm)
                if self.observer is not None:
                    self.observer(name, gm, r.modified)
        finally:
            deferred.close()
        PROBES.clear(gm)
        return gm, records


def _fxforges(p: Callable) -> bool:
    """``p`` is one of fxforge's own passes (which never read a module's Python code)."""
    module = getattr(p, "__module__", None) or type(p).__module__
    return module.startswith("fxforge.")


class _DeferredRecompile:
    """While it is open, ``gm.recompile()`` only notes that the module's code is stale (an
    instance attribute shadowing the method); ``flush`` regenerates it if so; ``close`` gives the
    method back and leaves stale code to be regenerated when it is used (``_recompile_when_used``)."""

    def __init__(self, gm: fx.GraphModule):
        self.gm, self.stale = gm, False
        self.real = gm.recompile
        gm.recompile = self.mark

    def mark(self) -> None:
        self.stale = True

    def flush(self) -> None:
        if self.stale:
            self.stale = False
            self.real()

    def close(self) -> None:
        if self.gm.__dict__.get("recompile") == self.mark:
            del self.gm.recompile
        if self.stale:
            self.stale = False
            _recompile_when_used(self.gm)


def _recompile_when_used(gm: fx.GraphModule) -> None:
    """Marks ``gm``'s Python code stale, to be regenerated when the module is first run or its
    code read, printed or pickled: a plain GraphModule becomes one of torch's lazy ones (its
    per-instance class swapped, every attribute it holds kept); a subclass of your own is
    regenerated now."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    if not isinstance(gm, _LazyGraphModule) and type(gm).__bases__ == (fx.GraphModule,):
        gm.__class__ = type("GraphModuleImpl", (_LazyGraphModule,), {})  # (as torch names a module's own class)
    gm.recompile()


def _verify_or_raise(name: str, gm: fx.GraphModule) -> None:
    problems = verify_graph(gm)
    if problems:
        raise PassError(name, "; ".join(problems[:10]) + (f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""))


def verify_graph(gm: fx.GraphModule) -> list[str]:
    """Problems with the graph (empty when healthy)."""
    try:
        gm.graph.lint()
    except Exception as e:
        return [f"graph.lint() failed: {e}"]
    missing = [n.name for n in gm.graph.nodes if not has_val(n)]
    if missing:
        return [f"node {m} has no meta['val']" for m in missing]
    return _reprop_mismatches(gm)


class _FakeReprop(fx.Interpreter):
    """Runs the graph on its own placeholder fake values without touching node.meta."""

    def __init__(self, gm, mode):
        super().__init__(gm, garbage_collect_values=False)
        self.mode = mode
        self.at: fx.Node | None = None

    def run_node(self, n: fx.Node):
        self.at = n
        return super().run_node(n)

    def placeholder(self, target, args, kwargs):
        return self.at.meta[VAL]

    def get_attr(self, target, args, kwargs):
        v = super().get_attr(target, args, kwargs)
        return self.mode.from_tensor(v, static_shapes=True) if isinstance(v, torch.Tensor) else v


def _reprop_mismatches(gm: fx.GraphModule) -> list[str]:
    mode = fake_mode_of(gm)
    if mode is None:
        return []
    interp = _FakeReprop(gm, mode)
    # Verification must not change what it verifies: no guard, no replacement (a symbol
    # specialized to its hint) in the graph's ShapeEnv, and no fallback kernel run at the hints
    # (FakeTensorMode's fallback turns symbolic sizes into ints).
    shape_env = mode.shape_env
    fallback = mode.allow_fallback_kernels
    try:
        mode.allow_fallback_kernels = False
        with mode, (shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()):
            interp.run()
    except Exception as e:  # ops without fake kernels cannot be re-propagated; nothing to compare
        return [] if _is_unsupported(e) else [f"re-propagating fake values failed at {interp.at}: {type(e).__name__}: {e}"]
    finally:
        mode.allow_fallback_kernels = fallback
    out = []
    for n, new in interp.env.items():
        if n.op in ("placeholder", "output"):
            continue
        msg = _compare(n.meta.get(VAL), new)
        if msg:
            out.append(f"node {n.name}: stored meta['val'] {msg}")
    return out


def _is_unsupported(e: Exception) -> bool:
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    if isinstance(e, (UnsupportedOperatorException, DynamicOutputShapeException, DataDependentOutputException)):
        return True
    # a fake kernel that cannot run at symbolic sizes (FakeTensorMode's fallback asks for strides)
    return isinstance(e, RuntimeError) and "with symbolic sizes/strides" in str(e)


def _dims_equal(a, b) -> bool:
    ea = a.node.expr if isinstance(a, torch.SymInt) else sympy.Integer(a)
    eb = b.node.expr if isinstance(b, torch.SymInt) else sympy.Integer(b)
    if any(s.name.startswith("u") for s in (ea.free_symbols | eb.free_symbols)):
        return True  # unbacked symbols are renamed on every propagation
    if isinstance(a, torch.SymInt) != isinstance(b, torch.SymInt):
        # an op whose meta kernel cannot handle symbolic sizes runs at the example sizes under
        # FakeTensorMode's fallback: its result is static, so compare at those sizes
        sym = a if isinstance(a, torch.SymInt) else b
        static = b if sym is a else a
        return sym.node.hint is not None and int(sym.node.hint) == int(static)
    if sympy.simplify(ea - eb) == 0:
        return True
    if not isinstance(a, torch.SymInt):
        return False
    # The same, where recomputation specialised some symbols to their hints (a meta kernel that
    # guards on a size, its guard suppressed): a symbol on one side only takes its hint on both.
    env = a.node.shape_env
    hints = size_hints(env)
    one_sided = (ea.free_symbols ^ eb.free_symbols) & set(hints)
    if not one_sided:
        return False
    hints = {s: hints[s] for s in one_sided}
    return sympy.simplify(ea.xreplace(hints) - eb.xreplace(hints)) == 0


def _compare(old: Any, new: Any) -> str | None:
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        if len(old) != len(new):
            return f"has {len(old)} outputs, the graph computes {len(new)}"
        for i, (a, b) in enumerate(zip(old, new)):
            m = _compare(a, b)
            if m:
                return f"output {i} {m}"
        return None
    if isinstance(old, torch.Tensor) != isinstance(new, torch.Tensor):
        return f"is {type(old).__name__}, the graph computes {type(new).__name__}"
    if not isinstance(old, torch.Tensor):
        return None
    if old.dtype != new.dtype:
        return f"has dtype {old.dtype}, the graph computes {new.dtype}"
    if old.device != new.device:
        return f"is on {old.device}, the graph computes {new.device}"
    if old.dim() != new.dim() or not all(_dims_equal(a, b) for a, b in zip(old.shape, new.shape)):
        return f"has shape {tuple(old.shape)}, the graph computes {tuple(new.shape)}"
    if any(isinstance(s, int) and s == 0 for s in old.shape):
        return None  # strides of empty tensors carry no meaning
    if not all(
        _dims_equal(a, b)
        for a, b, s in zip(old.stride(), new.stride(), old.shape)
        if not (isinstance(s, int) and s == 1)  # a size-1 dim's stride carries no meaning
    ):
        return f"has stride {old.stride()}, the graph computes {new.stride()}"
    return None
