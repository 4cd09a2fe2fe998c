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
from hypothesis import assume, note, strategies as st
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from .equivalence import hint, random_inputs

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
        fn = torch._refs.constant_pad_nd if self.dynamic and target is aten.constant_pad_nd.default else target
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
    return gm, inputs
