"""Fusion decisions from the members' facts (fxforge/codegen/ir/facts.py): for any group the facts
answer, they say what the emitter says (refused or not, and the kernel's cost), and the fusion
pass asks the emitter nothing for the groups they answer."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from hypothesis import given, settings
from torch.fx.experimental.proxy_tensor import make_fx

import fxforge
from fxforge.codegen.c import backend as c_backend, build
from fxforge.codegen.c.kernel import CEmitter
from fxforge.codegen.c.schedule import frame_refusal
from fxforge.codegen.ir.lowering import Unsupported
from fxforge.codegen.ir.facts import GroupFacts, group_cost
from fxforge.codegen.triton import backend as triton_backend
from fxforge.codegen.triton.kernel import TritonEmitter
from fxforge.spine import compile_graph
from fxforge.core.graph import node_kind
from fxforge.core.iteration import kind_of
from fxforge.core.plan import group_outputs
from fxforge.testing import graphs, profile

needs_cc = pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine")
LANGUAGES = {"c": (CEmitter, frame_refusal, c_backend), "triton": (TritonEmitter, None, triton_backend)}


def _emitted(language: str, nodes: list[fx.Node], outputs) -> tuple[int, int] | str:
    """What the language's emitter says of the group: (launch arguments, io buffers), or why not."""
    emitter = LANGUAGES[language][0]
    try:
        k = emitter("probe", lambda n: n.name, lambda n, i: f"{n.name}_{i}", nodes, outputs).emit()
    except (Unsupported, NotImplementedError) as e:
        return str(e)
    return len(k.params), k.unique_io_buffers


def _facts(language: str, nodes: list[fx.Node], outputs) -> tuple[int, int] | str | None:
    cost = group_cost(nodes, outputs, LANGUAGES[language][1])
    return cost if cost is None or isinstance(cost, str) else (cost.num_args, cost.unique_io_buffers)


def _windows(gm: fx.GraphModule, language: str, cfg) -> list[list[fx.Node]]:
    """Candidate groups: every run of 2 to 5 consecutive nodes, each a view or a fusible node the
    backend accepts alone, with at least two of the latter."""
    backend = LANGUAGES[language][2]
    run, out = [], []
    for n in gm.graph.nodes:
        view = n.op == "call_function" and node_kind(n) == "view"
        ok = view or (n.op == "call_function" and node_kind(n) == "compute"
                      and kind_of(n) in ("pointwise", "reduction") and backend.accepts(n, cfg) is None)
        run = run + [n] if ok else []
        out += [run[-k:] for k in range(2, 6) if len(run) >= k and sum(node_kind(m) == "compute" for m in run[-k:]) >= 2]
    return out


def _agree(gm: fx.GraphModule, language: str) -> int:
    """Check every candidate group of ``gm``; the number the facts answered."""
    cfg = fxforge.Config(codegen=language)
    answered = 0
    outs = {n for n in gm.graph.nodes if n.op == "output" for n in n.all_input_nodes}
    for nodes in _windows(gm, language, cfg):
        for outputs in (None, group_outputs(nodes, outs)):
            facts = _facts(language, nodes, outputs)
            if facts is None:
                continue
            answered += 1
            want = _emitted(language, nodes, outputs)
            names = [n.name for n in nodes]
            assert isinstance(facts, str) == isinstance(want, str), (names, facts, want)
            if not isinstance(want, str):
                assert facts == want, (names, facts, want)
    return answered


@needs_cc
@settings(profile(), max_examples=40, deadline=None)
@given(graphs(ops=("unary", "binary", "reduction", "var_mean", "convert", "view"),
              exclude=("remainder", "sign"), dtypes=(torch.float32, torch.int64), max_ops=8, max_dim=4))
def test_facts_say_what_the_c_emitter_says(example):
    _agree(example[0], "c")


@settings(profile(), max_examples=25, deadline=None)
@given(graphs(ops=("unary", "binary", "reduction", "var_mean", "convert", "view"),
              exclude=("remainder", "sign"), dtypes=(torch.float32,), max_ops=8, max_dim=4))
def test_facts_say_what_the_triton_emitter_says(example):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")  # (CPU tensors: the backend accepts them under the interpreter)
        _agree(example[0], "triton")


def _traced(fn, *args) -> fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


@needs_cc
@pytest.mark.parametrize("case, refused", [
    # rows: a softmax's max, exp and sum, and the division by the sum
    ("softmax", None),
    # columns (the last dim kept): a sum over the batch, and a value per element after it
    ("column_sum_then_scale", None),
    ("column_centered", "read before its reduction ran"),
    # rows of different shapes
    ("rows_and_columns", "reductions over different rows"),
])
def test_reduction_groups_answered_alike(case, refused):
    x = torch.randn(64, 48)
    fns = {
        "softmax": lambda a: (a - a.amax(1, keepdim=True)).exp() / (a - a.amax(1, keepdim=True)).exp().sum(1, keepdim=True),
        "column_sum_then_scale": lambda a: a.sum(0) * 0.5,
        "column_centered": lambda a: a - a.sum(0),
        "rows_and_columns": lambda a: a.sum(0).sum() + a.sum(1).sum(),
    }
    gm = _traced(fns[case], x)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and kind_of(n) in ("pointwise", "reduction")]
    outs = {n for n in gm.graph.nodes if n.op == "output" for n in n.all_input_nodes}
    outputs = group_outputs(nodes, outs)
    facts, want = _facts("c", nodes, outputs), _emitted("c", nodes, outputs)
    assert facts is not None
    if refused is None:
        assert facts == want and not isinstance(facts, str)
    else:
        assert isinstance(facts, str) and refused in facts and isinstance(want, str), (facts, want)


@needs_cc
def test_fusion_runs_no_emitter_for_the_groups_facts_answer(monkeypatch):
    """Layer norms and softmaxes (two row reductions) in a chain of blocks: every merge is answered by the facts
    (``fusion_cost`` is never asked, groups of reductions included); the emitter runs for the nodes alone (memoized
    by structure) and for the kernels, not per merge."""
    def f(x, w):
        for _ in range(6):
            h = torch.nn.functional.layer_norm(x, (64,), w, None)
            e = (h - h.amax(-1, keepdim=True)).exp()
            x = x + e / e.sum(-1, keepdim=True) * 2.0
        return x

    x, w = torch.randn(32, 64), torch.randn(64)
    gm = _traced(f, x, w)
    runs = []
    real = CEmitter.emit
    monkeypatch.setattr(CEmitter, "emit", lambda self: runs.append((self.name, len(self.nodes))) or real(self))
    asked, merged = [], []
    real_checked, real_merge = c_backend.checked_cost, GroupFacts.merge

    def spy(nodes, outputs, config, language, refusal, probe):
        asked.append(len(nodes))
        return real_checked(nodes, outputs, config, language, refusal, probe)

    def spy_merge(self, other, members, nodes, outputs):
        facts = real_merge(self, other, members, nodes, outputs)
        if isinstance(facts, GroupFacts):
            merged.append(len(facts.group.reductions))
        return facts

    monkeypatch.setattr(c_backend, "checked_cost", spy)
    monkeypatch.setattr(GroupFacts, "merge", spy_merge)
    c = compile_graph(gm, fxforge.Config(codegen="c", debug=False))
    torch.testing.assert_close(c(x, w), f(x, w), rtol=1e-4, atol=1e-4)
    assert merged and max(merged) >= 2, merged  # groups with reductions were merged, by their facts
    assert not asked, asked
    # the emitter ran on nodes alone (accepts) and on the kernels, never on a candidate merge
    merged_probes = [size for name, size in runs if name == "probe" and size > 1]
    assert not merged_probes, merged_probes


@needs_cc
def test_a_value_per_element_nothing_needs_is_the_emitters_to_answer():
    """A column sum grouped with a chain whose only reader is a view of it the kernel does not
    store: whether the chain is computed (and its input read) is the language's choice."""
    def f(a):
        return a.to(torch.bool).to(torch.int64).sum(0), a.to(torch.int32).to(torch.int64).permute(0, 1)

    gm = _traced(f, torch.randint(-9, 9, (2, 2)))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"][2:]  # sum, the chain, the permute
    assert [n.target for n in nodes][-1] == torch.ops.aten.permute.default
    assert _facts("c", nodes, nodes[:1]) is None  # only the sum stored: the chain is dead in the kernel
    assert _facts("c", nodes, None) == _emitted("c", nodes, None)  # every member stored: the facts answer


def test_a_fill_reads_only_its_operands_shape():
    """``full_like(v)`` reads nothing of ``v``: a group whose only output is a fill computes none
    of its other members, and the facts must say so as the emitter does (debug mode checks that
    they agree: they did not, on a reduction feeding the fill)."""
    def f(x, w):
        s = (~x).sum(-1, keepdim=True) - 1
        m = w * s
        return torch.full_like(m.masked_fill(m < 0, 0), 0.5), (w * 2).sum()

    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    x, w = torch.rand(3, 2, 1, 2) > 0.5, torch.randn(2)
    got = torch.compile(f, backend=b, fullgraph=True)(x, w)
    for a, e in zip(got, f(x, w)):
        torch.testing.assert_close(a, e)


def test_per_node_answers_are_read_again_after_a_rewrite():
    """A node's kept answers (``graph.per_node``: node_kind, aliased_input, schema_bind,
    reduction_of, read_nodes) are read again once a pass changes its arguments or target, and a
    copy of the node answers for itself."""
    from fxforge.codegen.ir.aten import read_nodes
    from fxforge.core.graph import aliased_input
    from fxforge.core.iteration import reduction_of, schema_bind

    def f(x, y):
        return (x + y).sum(0), x.t()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 4), torch.randn(4, 4))
    x, y = [n for n in gm.graph.nodes if n.op == "placeholder"]
    add, s, t = [next(n for n in gm.graph.nodes if n.target is op) for op in
                 (torch.ops.aten.add.Tensor, torch.ops.aten.sum.dim_IntList, torch.ops.aten.t.default)]
    assert node_kind(t) == "view" and aliased_input(t) is x
    assert reduction_of(s).dims == [0] and read_nodes(add) == [x, y] and schema_bind(add)["other"] is y
    t.args = (y,)
    assert aliased_input(t) is y
    s.args = (add, [1])
    assert reduction_of(s).dims == [1]
    add.args = (y, x)
    assert read_nodes(add) == [y, x] and schema_bind(add)["other"] is x
    t.target = torch.ops.aten.clone.default
    assert aliased_input(t) is None and node_kind(t) == "compute"
    g = fx.Graph()
    z = g.placeholder("z")
    z.meta["val"] = x.meta["val"]
    s2 = g.node_copy(s, lambda a: z)
    assert reduction_of(s2).inp is z and reduction_of(s).inp is add


@needs_cc
def test_merged_facts_are_the_whole_groups(monkeypatch):
    """Every merge of groups of reductions answered from their boundary (``facts._merged``) says
    what ``group_cost`` says of the whole merged group; held on blocks of norms, softmaxes,
    column sums and a value read by two reductions, with views between them."""
    from fxforge.codegen.ir import facts

    def f(x, w):
        for _ in range(3):
            h = torch.nn.functional.layer_norm(x, (64,), w, None)
            e = (h - h.amax(-1, keepdim=True)).exp()
            s = e / e.sum(-1, keepdim=True)
            x = x + s * 2.0 + h.sum(0, keepdim=True).tanh() + (s * h).mean(-1, keepdim=True).t().reshape(1, 32).t()
        return x

    x, w = torch.randn(32, 64), torch.randn(64)
    gm = _traced(f, x, w)
    seen = []
    real = facts._merged

    def spy(g, og, members, nodes, outputs, refusal):
        got = real(g, og, members, nodes, outputs, refusal)
        if got is not None:
            want = group_cost(nodes, outputs, refusal)
            assert got.cost == want, ([n.name for n in nodes], got.cost, want)
            seen.append(len(got.reductions))
        return got

    monkeypatch.setattr(facts, "_merged", spy)
    c = compile_graph(gm, fxforge.Config(codegen="c", debug=False))
    torch.testing.assert_close(c(x, w), f(x, w), rtol=1e-4, atol=1e-4)
    assert seen and max(seen) >= 2, seen


def test_a_member_no_longer_stored_is_asked_again():
    """A merge takes in the only reader of a stored member, and it reads the member's shape only
    (a fill): the merged kernel would compute a value nothing needs, which is the emitter's to
    answer (``group_cost`` says None); the merge, from the boundary, must say the same."""
    from fxforge.codegen.ir import facts

    def f(a):
        return a.sum(-1, keepdim=True), torch.full_like(a * 2.0, 3.0)

    gm = _traced(f, torch.randn(4, 8))
    mul, total, fill = (next(n for n in gm.graph.nodes if n.target == t) for t in (
        torch.ops.aten.mul.Tensor, torch.ops.aten.sum.dim_IntList, torch.ops.aten.full_like.default))
    group = facts.GroupFacts(facts._evaluate([mul, total], [mul, total], frame_refusal), "c", frame_refusal)
    assert isinstance(group.group, facts._Group)  # the multiply is stored: the fill reads it from outside
    nodes = [n for n in gm.graph.nodes if n in (mul, total, fill)]
    assert facts._merged(group.group, None, set(nodes), nodes, [total, fill], frame_refusal) is None
    assert group.merge(facts.pointwise_facts(fill), set(nodes), nodes, [total, fill]) is None
    assert group_cost(nodes, [total, fill], frame_refusal) is None


@needs_cc
@pytest.mark.parametrize("shape", [(1,), (4, 8)])
@pytest.mark.parametrize("mean_used", [False, True])
def test_a_read_of_a_members_getitem_is_computed_after_the_merge(shape, mean_used):
    """A group of a multi-output reduction merges with one reading an output through its getitem
    (which stays outside the group): from either side the merged facts read nothing the kernel
    computes, as ``group_cost`` of the whole group says; in debug mode the fusion pass checks it."""
    from fxforge.codegen.ir import facts

    def f(x):
        d = x.dim() - 1
        v, m = torch.ops.aten.var_mean.correction(x, [d], correction=0, keepdim=True)
        s = torch.ops.aten.sum.dim_IntList(x * v if d else v, [d])
        return (s, m * 3.0) if mean_used else s

    x = torch.randn(shape)
    gm = _traced(f, x)
    vm = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.var_mean.correction)
    total = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.sum.dim_IntList)
    outs = {n for n in gm.graph.nodes if n.op == "output" for n in n.all_input_nodes}
    consumer = [n for n in gm.graph.nodes if n.op == "call_function" and node_kind(n) == "compute"
                and n is not vm and (n is total or total in n.users)]
    nodes = [vm, *consumer]
    outputs = group_outputs(nodes, outs)
    want = group_cost(nodes, outputs, frame_refusal)
    assert not isinstance(want, str) and want is not None, want
    one = facts._evaluate([vm], group_outputs([vm], outs), frame_refusal)
    two = facts._evaluate(consumer, group_outputs(consumer, outs), frame_refusal)
    for g, og in ((one, two), (two, one)):
        got = facts._merged(g, og, set(nodes), nodes, outputs, frame_refusal)
        assert got is not None and got.cost == want, (got, want)
        assert all(t.args[0] is not vm for t in got.reads if t.target is operator.getitem)
    c = compile_graph(gm, fxforge.Config(codegen="c", debug=True))
    for got, ref in zip(torch.utils._pytree.tree_leaves(c(x)), torch.utils._pytree.tree_leaves(f(x))):
        torch.testing.assert_close(got, ref)
