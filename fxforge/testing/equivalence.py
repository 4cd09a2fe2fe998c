"""`check_pass`: does a graph pass keep what the graph computes, and the graph's invariants?

The original graph is the oracle: both graphs run on the same fresh random inputs and must agree
within dtype-aware tolerances, and the pass's result must still be a well-formed fxforge graph
(lints, is recompiled, meta["val"] on every node and true to what the node computes, same
signature, no new aliasing of inputs or between outputs, inputs left untouched). Any violation
raises `PassCheckFailure` (an AssertionError) whose message prints both graphs, so the minimal
example hypothesis shrinks to is readable as is.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
from typing import Callable, Iterable, Sequence

import sympy
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..infra.pass_manager import normalize_result

__all__ = ["Check", "PassCheckFailure", "TOLERANCES", "check_pass", "hint", "mismatch", "random_inputs", "random_tensor"]

# (rtol, atol) per dtype. atol is scaled by the largest finite magnitude of the reference output
# (at least 1): a pass may legitimately reorder sums, and cancellation then leaves an absolute
# error proportional to the operands, not to the (possibly tiny) result.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 5e-3),
    torch.bfloat16: (5e-2, 3e-2),
}
_FLOAT_EDGES = (0.0, 1.0, -1.0, 0.5, -0.5)
_EDGE_RATE = 0.2  # share of elements replaced by edge values: zeros, signs, extremes

# A check hook: (graph before the pass, graph after it) -> None, raising on a violation.
Check = Callable[[fx.GraphModule, fx.GraphModule], None]


class PassCheckFailure(AssertionError):
    """A pass changed results or broke a graph invariant; the message shows both graphs."""


def hint(size) -> int:
    """The concrete value of a size: itself when static, else the example value of its symbol."""
    if isinstance(size, torch.SymInt):
        node = size.node
        return int(node.hint) if node.hint is not None else int(node.shape_env.size_hint(node.expr))
    return int(size)


# -- inputs -----------------------------------------------------------------------------------
def random_tensor(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator,
                  stride: Sequence[int] | None = None) -> torch.Tensor:
    """Finite random values with edge cases mixed in.

    Floats: uniform in [-3, 3) plus 0, +-1, +-0.5 (bounded, so fp16/bf16 graphs stay finite).
    Integers: small values (negatives included, which is where floor and C-style division
    differ) plus 0, +-1, +-2**31 and the dtype's extremes, which catch narrowing and overflow.
    A dense `stride` (a permuted layout) is reproduced; other strides fall back to contiguous.
    """
    n = math.prod(shape)
    pick = torch.rand(n, generator=generator) < _EDGE_RATE
    if dtype == torch.bool:
        flat = torch.randint(0, 2, (n,), generator=generator).bool()
    else:
        if dtype.is_floating_point:
            flat = torch.rand(n, generator=generator, dtype=torch.float64) * 6 - 3
            edges = torch.tensor(_FLOAT_EDGES, dtype=torch.float64)
        else:
            info = torch.iinfo(dtype)
            flat = torch.randint(max(info.min, -8), min(info.max, 8) + 1, (n,), generator=generator)
            edges = torch.tensor(sorted({v for v in (0, 1, -1, 2**31, -(2**31), info.max, info.min)
                                         if info.min <= v <= info.max}))
        flat = torch.where(pick, edges[torch.randint(len(edges), (n,), generator=generator)], flat)
    out = flat.to(dtype).reshape(tuple(shape))
    if stride is not None and _dense(shape, stride) and tuple(stride) != out.stride():
        out = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype).copy_(out)
    return out


def _dense(shape, stride) -> bool:
    """True when `stride` lays `shape` out densely in some dim order (no gaps, no overlap)."""
    expected = 1
    for size, st in sorted((p for p in zip(shape, stride) if p[0] != 1), key=lambda p: p[1]):
        if st != expected:
            return False
        expected *= size
    return True


def random_inputs(gm: fx.GraphModule, seed: int = 0, like: Sequence | None = None) -> list:
    """Fresh inputs for `gm`'s placeholders: shapes/dtypes/strides of `like` when given, else
    of meta["val"] (symbolic sizes at their hints). Non-tensor inputs are taken from `like`."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        ref = like[i] if like is not None else node.meta.get("val")
        if isinstance(ref, torch.Tensor):
            out.append(random_tensor([hint(s) for s in ref.shape], ref.dtype, gen, [hint(s) for s in ref.stride()]))
        elif like is not None:
            out.append(ref)  # sizes, flags: passed through as given
        else:
            out.append(hint(ref) if isinstance(ref, torch.SymInt) else ref)
    return out


# -- the check --------------------------------------------------------------------------------
def check_pass(pass_: Callable, gm: fx.GraphModule, inputs: Sequence | None = None, *,
               rtol: float | None = None, atol: float | None = None, n_inputs: int = 2, seed: int = 0,
               runner: Callable[[fx.GraphModule, list], object] | None = None,
               verify_memory_plan: Check | None = None, verify_fusion: Check | None = None,
               extra_checks: Iterable[Check] = ()) -> fx.GraphModule:
    """Apply `pass_` to a deep copy of `gm` and check it; returns the transformed GraphModule.

    pass_: GraphModule -> torch.fx's or fxforge's PassResult, a GraphModule, or None / a bool (it
      changed its argument in place). fxforge passes leave `recompile()` to their PassManager: check
      them as `lambda gm: PassManager([p])(gm)[0]`, as the compiler runs them.
    inputs: example inputs, used as the first input set; `n_inputs` fresh random sets of the same
      shapes/dtypes follow (seeded by `seed`, so a failure replays identically).
    rtol/atol: override the per-dtype TOLERANCES for floating outputs (integers compare exactly).
    runner(gm, inputs) -> outputs: how to execute the transformed graph (default: call it), e.g.
      through a code generator. The original always runs eagerly: it is the oracle.
    verify_memory_plan, verify_fusion, extra_checks: hooks `(before, after) -> None` that raise on
      a violated invariant (a memory plan that does not verify, a fusion group over its limits).
    """
    name = getattr(pass_, "__name__", type(pass_).__name__)
    original = gm
    work = copy.deepcopy(gm)

    def fail(what: str, after: fx.GraphModule | None = None, cause: BaseException | None = None):
        parts = [f"check_pass({name}): {what}", "---- original graph ----", _readable(original)]
        if after is not None:
            parts += ["---- after the pass ----", _readable(after)]
        raise PassCheckFailure("\n".join(parts)) from cause

    try:
        result = pass_(work)
    except Exception as e:
        fail(f"the pass raised {type(e).__name__}: {e}", cause=e)
    try:
        after = normalize_result(pass_, work, result).graph_module
    except TypeError as e:
        fail(str(e))

    problem = _structure(original, after)
    if problem:
        fail(problem, after)
    hooks = [("verify_memory_plan", verify_memory_plan), ("verify_fusion", verify_fusion)]
    hooks += [(getattr(c, "__name__", "extra check"), c) for c in extra_checks]
    for hook_name, check in hooks:
        if check is None:
            continue
        try:
            check(original, after)
        except Exception as e:
            fail(f"{hook_name} failed: {type(e).__name__}: {e}", after, e)

    fresh = n_inputs if inputs is not None else max(n_inputs, 1)
    sets = [list(inputs)] if inputs is not None else []
    sets += [random_inputs(original, seed + k, like=inputs) for k in range(fresh)]
    for k, args in enumerate(sets):
        problem = _compare(original, after, args, runner, rtol, atol)
        if problem:
            fail(f"input set {k} ({_describe(args)}): {problem}", after)
    problem = _meta_matches_runtime(after, sets[0])
    if problem:
        fail(problem, after)
    return after


def _readable(gm: fx.GraphModule) -> str:
    try:  # regenerated from the graph, with shapes from meta["val"]; gm.code may be stale
        return gm.print_readable(print_output=False)
    except Exception:
        return gm.code


def _describe(args) -> str:
    return ", ".join(f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}" if isinstance(a, torch.Tensor) else repr(a)
                     for a in args)


def _structure(before: fx.GraphModule, after: fx.GraphModule) -> str | None:
    try:
        after.graph.lint()
    except Exception as e:
        return f"graph.lint() failed: {e}"
    if after.code != after.graph.python_code(root_module="self").src:
        return "the pass changed the graph but did not call gm.recompile(): gm.code is stale"
    phs = [[n for n in g.graph.nodes if n.op == "placeholder"] for g in (before, after)]
    if len(phs[0]) != len(phs[1]):
        return f"the pass changed the number of inputs: {len(phs[0])} -> {len(phs[1])}"
    missing = [n.name for n in after.graph.nodes
               if n.meta.get("val") is None and n.op != "output" and not _returns_nothing(n)]
    if missing:
        return f'nodes without meta["val"]: {", ".join(missing)}'
    return None


def _returns_nothing(node) -> bool:  # e.g. aten._assert_scalar: no value to describe
    return isinstance(node.target, torch._ops.OpOverload) and not node.target._schema.returns


def _run(gm, args, runner=None):
    with torch.no_grad():
        return pytree.tree_leaves(runner(gm, args) if runner else gm(*args))


def _clone(args):
    return [a.clone(memory_format=torch.preserve_format) if isinstance(a, torch.Tensor) else a for a in args]


def _span(t: torch.Tensor):
    """Byte range a tensor's elements can touch (strides are non-negative in ATen)."""
    if t.numel() == 0:
        return None
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _overlaps(a, b) -> bool:
    sa, sb = (_span(x) if isinstance(x, torch.Tensor) else None for x in (a, b))
    return bool(sa and sb and sa[0] < sb[1] and sb[0] < sa[1])


def _aliasing(outs, ins):
    """Which outputs overlap which inputs, and which outputs overlap each other."""
    with_inputs = {(i, j) for i, o in enumerate(outs) for j, x in enumerate(ins) if _overlaps(o, x)}
    between = {(i, k) for i, o in enumerate(outs) for k in range(i + 1, len(outs)) if _overlaps(o, outs[k])}
    return with_inputs, between


def _mutated(ins, snapshot) -> set:
    return {j for j, (x, s) in enumerate(zip(ins, snapshot)) if isinstance(x, torch.Tensor) and not torch.equal(x, s)}


def _compare(before, after, args, runner, rtol, atol) -> str | None:
    ins_b, ins_a = _clone(args), _clone(args)
    snap_b, snap_a = _clone(args), _clone(args)
    try:
        expected = _run(before, ins_b)
    except Exception as e:  # not the pass's fault: the inputs do not suit the graph
        raise RuntimeError(f"the original graph fails on the check's inputs ({_describe(args)}); "
                           f"pass `inputs=` and `n_inputs=0`") from e
    try:
        actual = _run(after, ins_a, runner)
    except Exception as e:
        return f"the transformed graph raised {type(e).__name__}: {e}"
    if len(actual) != len(expected):
        return f"{len(actual)} outputs instead of {len(expected)}"
    judge = _Judge(before, args, expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor):
            if not (type(a) is type(e) and a == e):
                return f"output {i}: {a!r} instead of {e!r}"
            continue
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {i}: {a.dtype} {list(a.shape)} instead of {e.dtype} {list(e.shape)}"
        problem = judge.mismatch(i, a, rtol, atol)
        if problem:
            return f"output {i} differs: {problem}"
    mutated = _mutated(ins_a, snap_a) - _mutated(ins_b, snap_b)
    if mutated:
        return f"the transformed graph writes to its inputs {sorted(mutated)}"
    new_in, new_between = (n - o for n, o in zip(_aliasing(actual, ins_a), _aliasing(expected, ins_b)))
    if new_in:
        return "outputs newly alias inputs (output, input): " + str(sorted(new_in))
    if new_between:
        return "outputs newly overlap each other (output, output): " + str(sorted(new_between))
    return None


def mismatch(actual: torch.Tensor, expected: torch.Tensor, rtol: float | None = None,
             atol: float | None = None, reference: torch.Tensor | None = None,
             spread: torch.Tensor | None = None) -> str | None:
    """Why ``actual`` is not ``expected`` within the dtype's ``TOLERANCES`` (absolute tolerance
    scaled by the largest finite magnitude of ``expected``), or None: it is.  Integers and bools
    must be equal.

    reference: the same output computed in float64; spread: how far ``expected`` moves when the
    inputs move by a rounding (elementwise). Where they are given, an element outside the
    tolerance still passes when ``actual`` is within the tolerance of the reference plus 4x
    the larger of eager's distance from it and the spread, or equals the reference rounded to
    the dtype (an overflow to inf that float64 confirms). Ill-conditioned outputs (a sine of a
    large value, the variance of nearly equal numbers) and values at the edge of the dtype's
    range differ between two correct roundings by more than any fixed tolerance.
    """
    if expected.dtype.is_floating_point:
        rt, at = TOLERANCES.get(expected.dtype, TOLERANCES[torch.float32])
        rt, at = rt if rtol is None else rtol, at if atol is None else atol
        finite = expected[torch.isfinite(expected)]
        at *= max(1.0, finite.abs().max().item() if finite.numel() else 1.0)
    else:
        rt = at = 0  # integers and bools are exact
    try:
        torch.testing.assert_close(actual, expected, rtol=rt, atol=at, equal_nan=True, check_stride=False)
    except AssertionError as e:
        if reference is None or not expected.dtype.is_floating_point or reference.shape != expected.shape:
            return str(e)
        wrong = int((~_judged_right(actual, expected, reference, spread, rt, at)).sum())
        if wrong:
            return f"{e}\n(judged against a float64 run: {wrong} element(s) further from it than eager's rounding explains)"
    return None


def _judged_right(actual, expected, reference, spread, rt, at) -> torch.Tensor:
    """Elementwise: ``actual`` is as right as ``expected`` is, judged against ``reference``."""
    a, e, r = (t.detach().to(torch.float64) for t in (actual, expected, reference))
    close = torch.isclose(a, e, rtol=rt, atol=at, equal_nan=True)
    rounding = torch.nan_to_num((e - r).abs(), nan=0.0)  # a NaN that float64 does not give says nothing
    if spread is not None and spread.shape == rounding.shape:
        rounding = torch.maximum(rounding, torch.nan_to_num(spread.to(torch.float64), nan=0.0))
    near = (a - r).abs() <= at + rt * r.abs() + 4 * rounding  # False where actual alone is NaN or inf
    rounded = reference.to(actual.dtype).to(torch.float64)
    same = (a == rounded) | (torch.isnan(a) & torch.isnan(r))
    return close | near | same


class _Judge:
    """The original graph's outputs in float64 and their spread under a rounding of the inputs,
    computed once, where an output first misses the tolerance."""

    def __init__(self, gm: fx.GraphModule, args, expected):
        self.gm, self.args, self.expected = gm, args, expected

    @functools.cached_property
    def reference(self) -> list | None:
        wide = [a.to(torch.float64) if _floating(a) else a for a in self.args]
        try:  # None where the graph cannot run so (an op that insists on matching dtypes)
            return _run(self.gm, _clone(wide))
        except Exception:
            return None

    @functools.cached_property
    def spread(self) -> list:
        gen = torch.Generator().manual_seed(0)
        out = [None] * len(self.expected)
        for _ in range(2):
            moved = [_nudged(a, gen) if _floating(a) else a for a in self.args]
            with contextlib.suppress(Exception):
                for i, (p, e) in enumerate(zip(_run(self.gm, _clone(moved)), self.expected)):
                    if _floating(e) and _floating(p) and p.shape == e.shape:
                        d = (p.to(torch.float64) - e.to(torch.float64)).abs()
                        out[i] = d if out[i] is None else torch.maximum(out[i], d)
        return out

    def mismatch(self, i, actual, rtol, atol) -> str | None:
        problem = mismatch(actual, self.expected[i], rtol, atol)
        if problem and _floating(actual) and self.reference is not None and len(self.reference) == len(self.expected):
            problem = mismatch(actual, self.expected[i], rtol, atol, self.reference[i], self.spread[i])
        return problem


def _floating(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype.is_floating_point


def _nudged(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`t` moved by up to two units of its dtype's rounding, elementwise at random."""
    u = (torch.rand(t.shape, generator=gen, dtype=torch.float64) * 4 - 2) * torch.finfo(t.dtype).eps
    return (t.to(torch.float64) * (1 + u)).to(t.dtype)


class _Recorder(fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        self.values[n] = out = super().run_node(n)
        return out


def _meta_matches_runtime(gm: fx.GraphModule, args) -> str | None:
    """meta["val"] must describe what each node really computes: later passes plan from it."""
    rec = _Recorder(gm)
    with torch.no_grad():
        rec.run(*_clone(args))
    # bind each input's size symbols to the sizes actually passed, then evaluate every node's
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    env: dict = {}
    for node, arg in zip(placeholders, args):
        val = node.meta["val"]
        pairs = zip(val.shape, arg.shape) if isinstance(val, torch.Tensor) else [(val, arg)]
        for sym, real in pairs:
            if isinstance(sym, torch.SymInt) and isinstance(sym.node.expr, sympy.Symbol):
                env[sym.node.expr] = sympy.Integer(int(real))

    def size(s):
        if not isinstance(s, torch.SymInt):
            return int(s)
        expr = sympy.sympify(s.node.expr).xreplace(env)
        return int(expr) if expr.is_number else None  # unbound symbol: cannot tell, skip

    for node, real in rec.values.items():
        if node.op == "output":
            continue
        metas, reals = pytree.tree_leaves(node.meta["val"]), pytree.tree_leaves(real)
        if len(metas) != len(reals):
            return f'{node.name}: meta["val"] has {len(metas)} values, the node computes {len(reals)}'
        for m, r in zip(metas, reals):
            if isinstance(m, torch.Tensor):
                if not isinstance(r, torch.Tensor):
                    return f'{node.name}: meta["val"] is a tensor, the node computes {r!r}'
                shape = [size(s) for s in m.shape]
                if m.dtype != r.dtype or len(shape) != r.dim() or any(
                        s is not None and s != t for s, t in zip(shape, r.shape)):
                    return (f'{node.name}: meta["val"] says {m.dtype} {shape}, '
                            f"the node computes {r.dtype} {list(r.shape)}")
            elif isinstance(m, (int, torch.SymInt)) and not isinstance(m, bool):
                v = size(m)
                if v is not None and v != r:
                    return f'{node.name}: meta["val"] says {v}, the node computes {r!r}'
    return None
