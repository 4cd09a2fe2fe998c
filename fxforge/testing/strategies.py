"""Hypothesis strategies that draw ATen-level FX graphs together with example inputs.

A graph is grown one op at a time by a `GraphBuilder`. Each op draws its operands from values
already built (so values end up with several consumers) or from fresh placeholders, and every
node's `meta["val"]` is computed on the spot under one FakeTensorMode, so each later op is drawn
against the real, possibly symbolic, shapes of what exists. A graph is a fixed number of op
slots, each a self-contained group of draws that can shrink to "skip", so hypothesis shrinks a
failing graph op by op, towards few, simple ops on few inputs.

Compose your own: `shapes()`, `dtypes()`, the `Op` table (`OPS`, `unary`, `binary`), and
`op_nodes(builder, ops, dtype)` which appends drawn ops to a builder inside your `@st.composite`.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
import torch._refs
import torch.fx as fx
from torch.utils import _pytree as pytree
from hypothesis import assume, note, strategies as st
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from .equivalence import _Recorder, hint, random_inputs

__all__ = [
    "ALL_DTYPES", "FAMILIES", "FLOATS", "INTS", "OPS", "GraphBuilder", "Op", "binary", "dtypes",
    "graphs", "op_nodes", "select_ops", "shapes", "unary",
]

aten = torch.ops.aten
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int64,)
ALL_DTYPES = FLOATS + INTS
_TO_END = 2**63 - 1  # slice end meaning "to the end", as dynamo writes x[k:]


def shapes(*, min_rank: int = 1, max_rank: int = 3, max_dim: int = 6) -> st.SearchStrategy:
    """Tensor shapes as tuples; sizes shrink towards 1, ranks towards `min_rank`."""
    return st.lists(st.integers(1, max_dim), min_size=min_rank, max_size=max_rank).map(tuple)


def dtypes(allowed: Sequence[torch.dtype] = ALL_DTYPES) -> st.SearchStrategy:
    """One of `allowed`, shrinking towards the first (float32 by default)."""
    return st.sampled_from(tuple(allowed))


def _broadcastable(a: tuple, b: tuple) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def _symbolic_pad(x: torch.Tensor, pad: Sequence[int], value=0) -> torch.Tensor:
    """`constant_pad_nd`'s result with symbolic sizes kept, strided as eager strides it: with no
    pad above zero eager crops and clones (the input's dim order kept), where the reference
    implementation allocates a fresh dense tensor."""
    if any(p > 0 for p in pad):
        return torch._refs.constant_pad_nd(x, list(pad), value)
    for i, (lo, hi) in enumerate(zip(pad[0::2], pad[1::2])):
        d = x.dim() - 1 - i
        x = x.narrow(d, -lo, x.shape[d] + lo + hi)
    return x.clone()


class GraphBuilder:
    """Grows an ATen FX graph, keeping `node.meta["val"]` (a FakeTensor) on every node.

    With `dynamic=True` every input dim of size >= 2 is a duck-sized symbol (equal sizes share a
    symbol, sizes 0/1 stay static, as in dynamo), and size arguments of views are `sym_size`
    nodes wherever the size is symbolic, so the graph stays generic in those sizes.
    """

    def __init__(self, *, dynamic: bool = False, max_rank: int = 3, max_dim: int = 6):
        self.graph = fx.Graph()
        self.dynamic, self.max_rank, self.max_dim = dynamic, max_rank, max_dim
        self.fake_mode = FakeTensorMode(shape_env=ShapeEnv() if dynamic else None)
        self.values: list[fx.Node] = []  # tensor-valued nodes, oldest first: operand candidates
        self.placeholders: list[fx.Node] = []

    # -- nodes -----------------------------------------------------------------------------
    def input(self, shape: Sequence[int], dtype: torch.dtype) -> fx.Node:
        name = f"arg{len(self.placeholders)}_1"
        # placeholders stay ahead of all compute, as in dynamo/AOT graphs
        where = self.placeholders[-1].next if self.placeholders else next(iter(self.graph.nodes), None)
        with self.graph.inserting_before(where):
            node = self.graph.placeholder(name)
        example = torch.empty(tuple(shape), dtype=dtype)
        if self.dynamic:
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DUCK] * example.dim())
            val = self.fake_mode.from_tensor(example, source=ConstantSource(name), symbolic_context=ctx)
        else:
            val = self.fake_mode.from_tensor(example)
        node.meta["val"] = val
        self.placeholders.append(node)
        self.values.append(node)
        return node

    def call(self, target, *args, **kwargs) -> fx.Node:
        """Append `target(*args, **kwargs)` with its meta["val"]; tensor results become operands."""
        fargs, fkwargs = fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        # The C++ constant_pad_nd reads concrete sizes and would specialize every symbol.
        fn = _symbolic_pad if self.dynamic and target is aten.constant_pad_nd.default else target
        with self.fake_mode:
            val = fn(*fargs, **fkwargs)
        node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = val
        if isinstance(val, torch.Tensor):
            self.values.append(node)
        return node

    def getitems(self, node: fx.Node, indices: Iterable[int]) -> list[fx.Node]:
        """`operator.getitem` nodes for the chosen outputs of a multi-output node."""
        return [self.call(operator.getitem, node, i) for i in indices]

    def size_arg(self, node: fx.Node, dim: int):
        """A size argument for dim `dim` of `node`: an int if static, else a `sym_size` node."""
        size = node.meta["val"].shape[dim]
        return size if isinstance(size, int) else self.call(aten.sym_size.int, node, dim)

    def is_static(self, node: fx.Node, dim: int) -> bool:
        return isinstance(node.meta["val"].shape[dim], int)

    def shape(self, node: fx.Node) -> tuple[int, ...]:
        """Concrete (hinted) shape of a tensor value."""
        return tuple(hint(s) for s in node.meta["val"].shape)

    def is_contiguous(self, node: fx.Node) -> bool:
        """Contiguity judged on hints, so asking adds no guards to the shape env."""
        val, expected = node.meta["val"], 1
        for size, stride in reversed(list(zip(self.shape(node), map(hint, val.stride())))):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    # -- drawing ---------------------------------------------------------------------------
    def operand(self, draw, dtype: torch.dtype, fits: Callable[[tuple], bool] | None = None,
                fresh: st.SearchStrategy | None = None) -> fx.Node:
        """An existing value of `dtype` whose shape `fits`, or a new input of a `fresh` shape.

        How is drawn first, simplest first: the newest value (ops chain), a value that already
        has a consumer (the second consumer is what rewrites and liveness get wrong), any value,
        or a new input. `fresh` must only produce shapes that fit.
        """
        fits = fits or (lambda s: True)
        cands = [v for v in reversed(self.values) if v.meta["val"].dtype == dtype and fits(self.shape(v))]
        how = draw(st.integers(0, 3)) if cands else 3
        shared = [v for v in cands if v.users]
        if how == 0 or (how == 1 and not shared):
            return cands[0]
        if how in (1, 2):
            pool = shared if how == 1 else cands
            return pool[draw(st.integers(0, len(pool) - 1))]
        shape = draw(fresh if fresh is not None else self.shapes())
        assert fits(shape), f"fresh shape {shape} does not fit its own constraint"
        return self.input(shape, dtype)

    def shapes(self, **kw) -> st.SearchStrategy:
        return shapes(max_rank=kw.pop("max_rank", self.max_rank), max_dim=kw.pop("max_dim", self.max_dim), **kw)

    def dim(self, draw, rank: int) -> int:
        """A dim index, sometimes written negatively: passes must normalize both spellings."""
        d = draw(st.integers(0, rank - 1))
        return d - rank if draw(st.booleans()) else d

    # -- finishing -------------------------------------------------------------------------
    def sinks(self) -> list[fx.Node]:
        return [v for v in self.values if not v.users]

    def finish(self, outputs: Sequence[fx.Node], seed: int = 0):
        """Close the graph returning `outputs`; gives (GraphModule, example inputs)."""
        out = self.graph.output(tuple(outputs))
        out.meta["val"] = tuple(o.meta["val"] for o in outputs)  # as FakeTensorProp leaves it
        self.graph.lint()
        gm = fx.GraphModule(torch.nn.Module(), self.graph)
        return gm, random_inputs(gm, seed)


# -- the op table -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """A drawable op. `build(draw, builder, dtype)` appends it and returns its main node, or None
    when it does not apply to what was drawn (e.g. split of a symbolic dim too small to split)."""

    name: str
    family: str
    dtypes: tuple
    build: Callable


def _name(target) -> str:
    return getattr(getattr(target, "overloadpacket", None), "__name__", None) or target.__name__


def unary(target, dtypes: Sequence[torch.dtype] = FLOATS, *, name: str | None = None,
          family: str = "unary") -> Op:
    """An elementwise op of one tensor that keeps its dtype (also for user-supplied ops)."""
    return Op(name or _name(target), family, tuple(dtypes),
              lambda draw, b, dt: b.call(target, b.operand(draw, dt)))


def _broadcast_partner(shape: tuple) -> st.SearchStrategy:
    """Shapes that broadcast with `shape`: drop some leading dims, set some others to 1."""
    return st.integers(0, len(shape)).flatmap(
        lambda k: st.tuples(*[st.sampled_from((d, 1)) for d in shape[k:]]))


def binary(target, dtypes: Sequence[torch.dtype] = ALL_DTYPES, *, name: str | None = None,
           family: str = "binary", scalars: Sequence = (2, -1, 0.5)) -> Op:
    """An elementwise op of two tensors with broadcasting; sometimes the second is a Python scalar."""

    def build(draw, b, dt):
        x = b.operand(draw, dt)
        sx = b.shape(x)
        if scalars and draw(st.integers(0, 3)) == 3:
            c = draw(st.sampled_from(tuple(scalars)))
            return b.call(target, x, c if dt.is_floating_point else int(c) or 1)
        y = b.operand(draw, dt, lambda s: _broadcastable(s, sx), _broadcast_partner(sx))
        return b.call(target, *((y, x) if draw(st.booleans()) else (x, y)))

    return Op(name or _name(target), family, tuple(dtypes), build)


def _remainder(draw, b, dt):
    # floor modulo: the sign follows the divisor, unlike C's fmod; negative divisors included
    c = draw(st.sampled_from((2, 3, -2, -3, 0.75)))
    c = float(c) if dt.is_floating_point else int(c) or 1
    return b.call(aten.remainder.Scalar, b.operand(draw, dt), c)


def _rank_at_least(n):
    return lambda s: len(s) >= n


def _reduction(target, dtypes):
    def build(draw, b, dt):
        x = b.operand(draw, dt, _rank_at_least(1))
        r = len(b.shape(x))
        dims = draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
        dims = [d - r if draw(st.booleans()) else d for d in dims]
        return b.call(target, x, dims, draw(st.booleans()))

    return Op(_name(target), "reduction", tuple(dtypes), build)


def _view(draw, b, dt):
    """view/reshape by one of: merge adjacent dims, split a static dim, insert a 1."""
    x = b.operand(draw, dt)
    s = b.shape(x)
    r = len(s)
    splittable = [d for d in range(r) if b.is_static(x, d) and s[d] >= 4]
    kinds = [k for k, ok in (("insert1", r < b.max_rank), ("merge", r >= 2), ("split", r < b.max_rank and splittable))
             if ok]
    if not kinds:
        return None
    kind = draw(st.sampled_from(kinds))
    sizes = [b.size_arg(x, d) for d in range(r)] if kind != "merge" else None
    if kind == "insert1":
        sizes.insert(draw(st.integers(0, r)), 1)
    elif kind == "merge":
        i = draw(st.integers(0, r - 2))
        j = draw(st.integers(i + 2, r))
        static = all(b.is_static(x, d) for d in range(i, j))
        merged = 1
        for d in range(i, j):
            merged *= s[d]
        # at most one merge per view, so -1 is unambiguous for a symbolic product
        sizes = [b.size_arg(x, d) for d in range(i)] + [merged if static else -1]
        sizes += [b.size_arg(x, d) for d in range(j, r)]
    else:
        d = draw(st.sampled_from(splittable))
        f = draw(st.sampled_from([f for f in range(2, s[d]) if s[d] % f == 0] or [1]))
        sizes[d:d + 1] = [f, s[d] // f]
    use_reshape = not b.is_contiguous(x) or draw(st.booleans())
    return b.call(aten.reshape.default if use_reshape else aten.view.default, x, sizes)


def _permute(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(2), b.shapes(min_rank=2))
    return b.call(aten.permute.default, x, draw(st.permutations(range(len(b.shape(x))))))


def _transpose(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(2), b.shapes(min_rank=2))
    r = len(b.shape(x))
    return b.call(aten.transpose.int, x, b.dim(draw, r), b.dim(draw, r))


def _slice(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(1))
    s = b.shape(x)
    d = draw(st.integers(0, len(s) - 1))
    if not b.is_static(x, d):
        # on a symbolic dim only x[k:], which stays symbolic (s0 - k >= 2) with a >= guard
        return b.call(aten.slice.Tensor, x, d, draw(st.integers(0, max(0, min(2, s[d] - 2)))), _TO_END)
    start = draw(st.integers(0, s[d] - 1))
    end = draw(st.sampled_from([_TO_END, *range(start + 1, s[d] + 1)]))
    return b.call(aten.slice.Tensor, x, d, start, end, draw(st.sampled_from((1, 2))))


def _expand(draw, b, dt):
    x = b.operand(draw, dt)
    s = b.shape(x)
    # with symbolic shapes, expand to a size the graph already has (as expand_as does): a fresh
    # static size would later meet an equal symbolic one and pin that symbol
    syms = [(v, d) for v in b.values for d in range(v.meta["val"].dim()) if not b.is_static(v, d)]

    def size():
        if not b.dynamic or not syms or draw(st.booleans()):
            return draw(st.integers(1, b.max_dim)) if not b.dynamic else 1
        return b.size_arg(*draw(st.sampled_from(syms)))

    lead = draw(st.integers(0, max(0, b.max_rank - len(s))))
    sizes = [size() for _ in range(lead)] + [size() if n == 1 else -1 for n in s]
    return b.call(aten.expand.default, x, sizes)


def _unsqueeze(draw, b, dt):
    x = b.operand(draw, dt, lambda s: len(s) < b.max_rank,
                  b.shapes(min_rank=min(1, b.max_rank - 1), max_rank=b.max_rank - 1))
    r = len(b.shape(x)) + 1
    return b.call(aten.unsqueeze.default, x, b.dim(draw, r))


def _squeeze(draw, b, dt):
    with_one = st.tuples(b.shapes(min_rank=0, max_rank=b.max_rank - 1), st.integers(0, b.max_rank - 1)).map(
        lambda t: t[0][:t[1]] + (1,) + t[0][t[1]:])
    x = b.operand(draw, dt, lambda s: 1 in s, with_one)
    return b.call(aten.squeeze.dim, x, draw(st.sampled_from([d for d, n in enumerate(b.shape(x)) if n == 1])))


def _cat(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(1))
    s = b.shape(x)
    r = len(s)
    d = draw(st.integers(0, r - 1))
    same = lambda t: len(t) == r and all(t[i] == s[i] for i in range(r) if i != d)
    fresh = st.integers(1, b.max_dim).map(lambda n: s[:d] + (n,) + s[d + 1:])
    # x itself is a candidate too: cat([x, x]) and x feeding other ops are the cases that matter
    parts = [x] + [b.operand(draw, dt, same, fresh) for _ in range(draw(st.integers(1, 2)))]
    return b.call(aten.cat.default, parts, d - r if draw(st.booleans()) else d)


def _pad(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(1))
    s = b.shape(x)
    k = draw(st.integers(1, len(s)))
    pad = []
    for d in reversed(range(len(s) - k, len(s))):  # the pad list starts at the LAST dim
        lo, hi = (draw(st.sampled_from((1, 0, 2, -1))) for _ in "lh")  # not 0 first: all-zero pads are no-ops
        # negative pads crop: keep one element, or two on a symbolic dim (a size of 1 would
        # specialize the symbol)
        if s[d] + lo + hi < (1 if b.is_static(x, d) else 2):
            lo, hi = max(lo, 0), max(hi, 0)
        pad += [lo, hi]
    value = draw(st.sampled_from((0, 1, -2)))
    return b.call(aten.constant_pad_nd.default, x, pad, float(value) if dt.is_floating_point else value)


def _outputs(draw, b, node, n):
    """getitems for a drawn non-empty subset of the n outputs (shrinks to output 0 only)."""
    which = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    return b.getitems(node, sorted(which))[0]


def _var_mean(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(1))
    s = b.shape(x)
    dims = draw(st.lists(st.integers(0, len(s) - 1), min_size=1, max_size=len(s), unique=True))
    n = 1
    for d in dims:
        n *= s[d]
    correction = draw(st.integers(0, 1)) if n > 1 else 0  # n - 1 == 0 would divide by zero
    node = b.call(aten.var_mean.correction, x, dims, correction=correction, keepdim=draw(st.booleans()))
    return _outputs(draw, b, node, 2)


def _topk(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(1))
    s = b.shape(x)
    d = draw(st.integers(0, len(s) - 1))
    node = b.call(aten.topk.default, x, draw(st.integers(1, s[d])), d, draw(st.booleans()), True)
    # values only: indices of tied values are implementation-defined and would differ spuriously
    return b.getitems(node, [0])[0]


def _split(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(1))
    s = b.shape(x)
    d = draw(st.integers(0, len(s) - 1))
    if b.is_static(x, d) and s[d] >= 2 and draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(1, s[d] - 1), min_size=1, max_size=2, unique=True)))
        sizes = [hi - lo for lo, hi in zip([0, *cuts], [*cuts, s[d]])]
        node = b.call(aten.split_with_sizes.default, x, sizes, d)
        return _outputs(draw, b, node, len(sizes))
    # On a symbolic dim the chunk count guards the size's range; a chunk of 1, or one chunk
    # that fits exactly, would pin the symbol to its hint, so those stay on static dims.
    size = draw(st.integers(1, s[d]) if b.is_static(x, d) else st.integers(2, max(2, s[d] // 2)))
    if not b.is_static(x, d) and s[d] < 4:
        return None
    node = b.call(aten.split.Tensor, x, size, d)
    return _outputs(draw, b, node, -(-s[d] // size))


def _layer_norm(draw, b, dt):
    x = b.operand(draw, dt, _rank_at_least(1))
    s = b.shape(x)
    k = draw(st.integers(1, len(s)))
    normalized = [b.size_arg(x, d) for d in range(len(s) - k, len(s))]
    inner = s[len(s) - k:]
    affine = lambda: b.operand(draw, dt, lambda t: t == inner, st.just(inner)) if draw(st.booleans()) else None
    node = b.call(aten.native_layer_norm.default, x, normalized, affine(), affine(), 1e-5)
    return _outputs(draw, b, node, 3)


def _mm(draw, b, dt):
    x = b.operand(draw, dt, lambda s: len(s) == 2, b.shapes(min_rank=2, max_rank=2))
    k = b.shape(x)[1]
    w = b.operand(draw, dt, lambda s: len(s) == 2 and s[0] == k, st.integers(1, b.max_dim).map(lambda n: (k, n)))
    return b.call(aten.mm.default, x, w)


def _bmm(draw, b, dt):
    x = b.operand(draw, dt, lambda s: len(s) == 3, b.shapes(min_rank=3, max_rank=3))
    bs, _, k = b.shape(x)
    w = b.operand(draw, dt, lambda s: len(s) == 3 and s[:2] == (bs, k),
                  st.integers(1, b.max_dim).map(lambda n: (bs, k, n)))
    return b.call(aten.bmm.default, x, w)


def _addmm(draw, b, dt):
    x = b.operand(draw, dt, lambda s: len(s) == 2, b.shapes(min_rank=2, max_rank=2))
    m, k = b.shape(x)
    w = b.operand(draw, dt, lambda s: len(s) == 2 and s[0] == k, st.integers(1, b.max_dim).map(lambda n: (k, n)))
    n = b.shape(w)[1]
    # addmm's bias must expand to (m, n); mutual broadcasting is not enough
    bias = b.operand(draw, dt, lambda s: len(s) <= 2 and all(a in (1, c) for a, c in zip(s[::-1], (n, m))),
                     st.sampled_from([(n,), (m, n), (1, n), (m, 1)]))
    return b.call(aten.addmm.default, bias, x, w)


# -- conversions and indexing with indices computed in the graph ----------------------------
def _aux(b, dt, target, *args, **kwargs) -> fx.Node:
    """A helper node of an op: an operand candidate for later ops only when it has the graph's
    dtype (a graph stays of one dtype: its inputs and outputs)."""
    node = b.call(target, *args, **kwargs)
    if isinstance(node.meta["val"], torch.Tensor) and node.meta["val"].dtype != dt:
        b.values.remove(node)
    return node


def _convert_targets(dt):
    if dt.is_floating_point:
        # float -> int truncates (clamped first: an out-of-range conversion is undefined), -> bool
        # tests != 0, -> bf16/fp32/fp64 round
        return (torch.int64, torch.int32, torch.bool, torch.bfloat16 if dt == torch.float32 else torch.float32,
                torch.float64)
    # int64 -> narrower ints wraps (the inputs hold +-2**31 and the extremes), -> bool tests != 0
    return (torch.int32, torch.uint8, torch.bool, torch.int8, torch.int16)


def _convert(draw, b, dt):
    """A round trip through another dtype, `_to_copy(_to_copy(x, other), dt)`, sometimes with an
    op in the other dtype between: the value must really change (truncate, wrap, round) where
    the graph goes on computing with it, not only where it is stored."""
    x = b.operand(draw, dt)
    other = draw(st.sampled_from(_convert_targets(dt)))
    if dt.is_floating_point and not other.is_floating_point and other != torch.bool:
        x = _aux(b, dt, aten.clamp.default, x, -3e4, 3e4)  # fits fp16 and int32
    y = _aux(b, dt, aten._to_copy.default, x, dtype=other)
    if other != torch.bool and draw(st.booleans()):
        y = _aux(b, dt, aten.add.Tensor, y, draw(st.sampled_from((1, 3))) if not other.is_floating_point else 0.5)
    return b.call(aten._to_copy.default, y, dtype=dt)


def _source_coords(draw, b, dt, size, out, linear: bool):
    """Where each of `out` outputs samples a dim of `size` elements (`size`, `out`: an int or a
    sym_size node), computed in the graph as upsampling does: ``src = (arange(out) + 0.5) *
    scale - 0.5`` (the half-pixel shifts and the scale are drawn), ``i0 = int64(src)``
    (truncation, or floor first) clamped to ``[0, size - 1]``; with `linear` also the neighbour
    ``i1 = clamp(int64(src) + 1, 0, size - 1)`` and, in float graphs, the weight ``lam =
    clamp(src - int64(src), 0, 1)`` (float32; the unclamped conversion, as upsampling has it).
    Gives (i0, i1, lam), None for what is not computed.  Every draw shrinks towards fewer
    nodes: the simplest is ``clamp(int64(arange(out)), 0, size - 1)``."""
    f32 = torch.float32
    cpu = dict(layout=torch.strided, device=torch.device("cpu"), pin_memory=False)
    if draw(st.booleans()):  # int64 positions converted to float
        src = _aux(b, dt, aten._to_copy.default, _aux(b, dt, aten.arange.start_step, 0, out, 1, **cpu), dtype=f32)
    else:
        src = _aux(b, dt, aten.arange.start_step, 0, out, 1, dtype=f32, **cpu)
    half_pixel = draw(st.booleans())  # align_corners=False
    scale = draw(st.sampled_from((1.0, 0.75, 1.5, 0.6, 2.0, 1 / 3)))
    if half_pixel:
        src = _aux(b, dt, aten.add.Tensor, src, 0.5)
    if scale != 1.0:
        src = _aux(b, dt, aten.mul.Tensor, src, scale)
    if half_pixel:
        src = _aux(b, dt, aten.sub.Tensor, src, 0.5)
        if draw(st.booleans()):
            src = _aux(b, dt, aten.clamp_min.default, src, 0.0)
    last = size - 1 if isinstance(size, int) else _aux(b, dt, operator.sub, size, 1)
    floor = draw(st.booleans())
    raw = _aux(b, dt, aten._to_copy.default, _aux(b, dt, aten.floor.default, src) if floor else src, dtype=torch.int64)
    # the weight from the converted position itself, as upsampling computes it (float - int64)
    lam = None
    if linear and dt.is_floating_point:  # integer graphs blend without weights
        lam = _aux(b, dt, aten.clamp.default, _aux(b, dt, aten.sub.Tensor, src, raw), 0.0, 1.0)
    # src may be negative (floor: -1) or past the end: clamp both neighbours into range
    i1 = _aux(b, dt, aten.clamp.default, _aux(b, dt, aten.add.Tensor, raw, 1), 0, last) if linear else None
    return _aux(b, dt, aten.clamp.default, raw, 0, last), i1, lam


def _out_size(draw, b, x, d):
    """How many samples along dim d of x: a static count, or (symbolic graphs) a size the graph
    already has, as ``expand`` does, so no fresh static size meets an equal symbolic one."""
    if not b.dynamic:
        return draw(st.integers(1, b.max_dim))
    syms = [(v, k) for v in b.values for k in range(v.meta["val"].dim()) if not b.is_static(v, k)]
    if not syms or draw(st.integers(0, 3)) == 0:
        return 1
    return b.size_arg(*draw(st.sampled_from(syms)))


def _blend(draw, b, dt, a, c, lam, shape_after):
    """``a + (c - a) * lam`` (floats; lam viewed to broadcast over the dims after its own), or
    for integers ``a + c`` or ``a - c``."""
    if not dt.is_floating_point:
        return _aux(b, dt, aten.add.Tensor if draw(st.booleans()) else aten.sub.Tensor, a, c)
    if lam.meta["val"].dtype != dt:
        lam = _aux(b, dt, aten._to_copy.default, lam, dtype=dt)
    for _ in range(shape_after):
        lam = _aux(b, dt, aten.unsqueeze.default, lam, -1)
    return _aux(b, dt, aten.add.Tensor, a, _aux(b, dt, aten.mul.Tensor, _aux(b, dt, aten.sub.Tensor, c, a), lam))


def _resample(draw, b, dt):
    """Nearest or linear/bilinear resampling of one dim or two adjacent dims, as upsample
    decomposes: indices (and weights) computed in the graph (`_source_coords`), a gather per
    corner (`_unsafe_index` or `index.Tensor`; two dims: index tensors of shapes (out_h, 1) and
    (out_w,) broadcast against each other, four of them for bilinear's four corners), blended
    with the weights."""
    x = b.operand(draw, dt, _rank_at_least(1))
    r = len(b.shape(x))
    n = draw(st.integers(1, min(2, r)))
    d0 = draw(st.integers(0, r - n))
    target = draw(st.sampled_from((aten._unsafe_index.Tensor, aten.index.Tensor)))
    linear = draw(st.integers(0, 3)) > 0  # mostly linear; shrinks to nearest (one gather)
    per_dim, outs = [], []
    for k, d in enumerate(range(d0, d0 + n)):
        outs.append(_out_size(draw, b, x, d))
        coords = _source_coords(draw, b, dt, b.size_arg(x, d), outs[-1], linear)
        if k < n - 1:  # the first of two dims: (out, 1), broadcast against the second's (out,)
            coords = tuple(None if t is None else _aux(b, dt, aten.unsqueeze.default, t, -1) for t in coords)
        per_dim.append(coords)
    after = r - d0 - n

    def gather(*picks):
        if b.dynamic and n == 2:  # the index meta cannot broadcast symbolic index shapes itself
            picks = [_aux(b, dt, aten.expand.default, i, outs) for i in picks]
        return _aux(b, dt, target, x, [None] * d0 + list(picks))

    if not linear:  # nearest
        return gather(*(i0 for i0, _, _ in per_dim))
    if n == 1:
        ((i0, i1, lam),) = per_dim
        return _blend(draw, b, dt, gather(i0), gather(i1), lam, after)
    (h0, h1, lh), (w0, w1, lw) = per_dim
    top = _blend(draw, b, dt, gather(h0, w0), gather(h0, w1), lw, after)
    bottom = _blend(draw, b, dt, gather(h1, w0), gather(h1, w1), lw, after)
    return _blend(draw, b, dt, top, bottom, lh, after)


def _gather(draw, b, dt):
    """`gather` along a dim with an index tensor computed in the graph: sample positions as in
    `_resample`, viewed and expanded to the index shape (rank > 1), one gather (nearest) or the
    two neighbours gathered and blended; or, in int64 graphs, one gather at an int64 value taken
    modulo the dim's size (negative and extreme values included)."""
    x = b.operand(draw, dt, _rank_at_least(1))
    r = len(b.shape(x))
    d = draw(st.integers(0, r - 1))
    size = b.size_arg(x, d)
    if not dt.is_floating_point and draw(st.booleans()):
        y = b.operand(draw, dt, lambda t: len(t) == 1, st.integers(1, b.max_dim).map(lambda m: (m,)))
        i0, i1, lam = _aux(b, dt, aten.remainder.Scalar, y, size), None, None
        # the index's length: needed (as a size argument) only to expand it over other dims
        out = b.size_arg(y, 0) if r > 1 else None
    else:
        out = _out_size(draw, b, x, d)
        i0, i1, lam = _source_coords(draw, b, dt, size, out, draw(st.integers(0, 3)) > 0)
    sizes = [b.size_arg(x, k) if k != d else out for k in range(r)]
    shape = [1] * r
    shape[d] = out

    def gather(i):
        if r > 1:
            i = _aux(b, dt, aten.expand.default, _aux(b, dt, aten.view.default, i, shape), sizes)
        return _aux(b, dt, aten.gather.default, x, d, i)

    if i1 is None:
        return gather(i0)
    return _blend(draw, b, dt, gather(i0), gather(i1), lam, r - d - 1)


# Order matters for shrinking: families and ops shrink towards the front of their list.
OPS: tuple[Op, ...] = (
    unary(aten.neg.default, ALL_DTYPES), unary(aten.relu.default, ALL_DTYPES), unary(aten.abs.default, ALL_DTYPES),
    unary(aten.sin.default), unary(aten.cos.default), unary(aten.tanh.default), unary(aten.sigmoid.default),
    unary(aten.sign.default, ALL_DTYPES), unary(aten.bitwise_not.default, INTS),
    binary(aten.add.Tensor), binary(aten.mul.Tensor), binary(aten.sub.Tensor),
    binary(aten.maximum.default, scalars=()), binary(aten.minimum.default, scalars=()),
    Op("remainder", "binary", ALL_DTYPES, _remainder),
    binary(aten.bitwise_and.Tensor, INTS, scalars=()), binary(aten.bitwise_xor.Tensor, INTS, scalars=()),
    _reduction(aten.sum.dim_IntList, ALL_DTYPES), _reduction(aten.amax.default, ALL_DTYPES),
    _reduction(aten.amin.default, ALL_DTYPES), _reduction(aten.mean.dim, FLOATS),
    Op("view", "view", ALL_DTYPES, _view), Op("permute", "view", ALL_DTYPES, _permute),
    Op("transpose", "view", ALL_DTYPES, _transpose), Op("slice", "view", ALL_DTYPES, _slice),
    Op("expand", "view", ALL_DTYPES, _expand), Op("unsqueeze", "view", ALL_DTYPES, _unsqueeze),
    Op("squeeze", "view", ALL_DTYPES, _squeeze),
    Op("cat", "catpad", ALL_DTYPES, _cat), Op("constant_pad_nd", "catpad", ALL_DTYPES, _pad),
    Op("split", "multi_output", ALL_DTYPES, _split), Op("var_mean", "multi_output", FLOATS, _var_mean),
    Op("topk", "multi_output", ALL_DTYPES, _topk), Op("native_layer_norm", "multi_output", FLOATS, _layer_norm),
    Op("mm", "matmul", ALL_DTYPES, _mm), Op("addmm", "matmul", ALL_DTYPES, _addmm),
    Op("bmm", "matmul", ALL_DTYPES, _bmm),
    Op("_to_copy", "convert", ALL_DTYPES, _convert),
    Op("resample", "index", ALL_DTYPES, _resample), Op("gather", "index", ALL_DTYPES, _gather),
)
FAMILIES = tuple(dict.fromkeys(op.family for op in OPS))


def select_ops(ops: Iterable[str | Op] | None = None, exclude: Iterable[str] = ()) -> list[Op]:
    """Ops by family or op name (strings pick from OPS) or given as `Op`s; minus `exclude`d names."""
    picked: list[Op] = []
    for item in OPS if ops is None else ops:
        if isinstance(item, Op):
            picked.append(item)
        else:
            found = [op for op in OPS if item in (op.name, op.family)]
            if not found:
                raise ValueError(f"unknown op or family {item!r}; families: {FAMILIES}")
            picked += found
    drop = set(exclude)
    return [op for op in dict.fromkeys(picked) if op.name not in drop and op.family not in drop]


@st.composite
def op_nodes(draw, builder: GraphBuilder, ops: Sequence[Op], dtype: torch.dtype, *,
             min_ops: int = 1, max_ops: int = 8) -> list[fx.Node]:
    """Append drawn ops of `dtype` to `builder` (at least min_ops, about 2/3 of max_ops, at most
    max_ops plus what min_ops needs); returns their nodes.

    There are max_ops slots; each is skipped or picks a family, then an op of it, so families are
    equally likely whatever their size. A slot's draws are self-contained and "skip" is its
    simplest value, so shrinking removes ops anywhere in the graph and simplifies the rest. (A
    count drawn up front shrinks badly: lowering it can only drop the last op.)
    """
    by_family: dict[str, list[Op]] = {}
    for op in ops:
        if dtype in op.dtypes:
            by_family.setdefault(op.family, []).append(op)
    if not by_family:
        raise ValueError(f"no op in {[op.name for op in ops]} supports {dtype}")
    families = list(by_family)

    @st.composite
    def one_op(draw, skippable=True):
        if skippable and draw(st.integers(0, 3)) == 0:
            return None
        op = draw(st.sampled_from(by_family[draw(st.sampled_from(families))]))
        return op.build(draw, builder, dtype)

    nodes = [n for n in (draw(one_op()) for _ in range(max_ops)) if n is not None]
    for _ in range(10 * min_ops):  # an op may not apply (returns None): retry a bounded number of times
        if len(nodes) >= min_ops:
            break
        node = draw(one_op(skippable=False))
        if node is not None:
            nodes.append(node)
    assume(len(nodes) >= min_ops)
    return nodes


@st.composite
def graphs(draw, *, ops: Iterable[str | Op] | None = None, extra_ops: Iterable[Op] = (),
           exclude: Iterable[str] = (), dtypes: Sequence[torch.dtype] = ALL_DTYPES,
           max_ops: int = 8, max_rank: int = 3, max_dim: int = 6, dynamic: bool | None = None):
    """Draw `(gm, example_inputs)`: an ATen GraphModule with meta["val"] on every node.

    ops: families (see FAMILIES) and/or op names from OPS, or `Op`s; default all of OPS.
    extra_ops: user `Op`s added to the selection (e.g. `unary(torch.ops.mylib.gelu.default)`).
    exclude: op or family names to leave out (e.g. "remainder", "sign" for passes that change
      float rounding: discontinuous ops turn ulp-level differences into large ones).
    dtypes: one is drawn per graph; only ops valid for it are used.
    max_ops: ops drawn (getitem/sym_size helper nodes come on top); max_rank, max_dim bound shapes.
    dynamic: symbolic input sizes (True), static (False), or either (None: a quarter symbolic).
    Outputs are all values nobody consumes plus sometimes a few intermediates.
    """
    # symbolic graphs cost ~4x to build; one in four keeps them common without halving the search
    dynamic = draw(st.integers(0, 3)) == 3 if dynamic is None else dynamic
    dtype = draw(st.sampled_from(tuple(dtypes)))
    b = GraphBuilder(dynamic=dynamic, max_rank=max_rank, max_dim=max_dim)
    draw(op_nodes(b, select_ops(ops, exclude) + list(extra_ops), dtype, max_ops=max_ops))
    sinks = b.sinks()
    # a value that is both consumed and returned lives to the end: liveness and reuse corner
    extra = [v for v in b.values if v.users and v.op != "placeholder" and draw(st.integers(0, 3)) == 3]
    gm, inputs = b.finish(sinks + extra, seed=draw(st.integers(0, 2**16)))
    note(gm.print_readable(print_output=False))  # hypothesis shows it for a failing example
    # Growth compounds (a product of matrix products in float16 overflows): a graph whose value
    # comes near its dtype's range depends on rounding order, not on what it computes.
    assume(not _near_overflow(gm, inputs))
    return gm, inputs


_RANGE_MARGIN = 64  # values stay below the dtype's largest finite value / this


def _near_overflow(gm: fx.GraphModule, inputs) -> bool:
    """True when a floating value of `gm`, run on `inputs`, overflows or comes within
    `_RANGE_MARGIN` of its dtype's range (other inputs of the same distribution would overflow)."""
    rec = _Recorder(gm)
    with torch.no_grad():
        rec.run(*(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs))
    for v in pytree.tree_leaves(list(rec.values.values())):
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point and v.numel():
            finite, limit = v[torch.isfinite(v)], torch.finfo(v.dtype).max / _RANGE_MARGIN
            if bool(torch.isinf(v).any()) or (finite.numel() and finite.abs().max().item() > limit):
                return True
    return False
