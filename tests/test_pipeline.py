"""PassManager: verification between passes names the pass that broke the graph."""

import gc

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxforge
from fxforge.core.graph import VAL
from fxforge.infra.pass_manager import PassError, PassManager, PassResult, verify_graph


def traced(symbolic=False):
    def f(x, y):
        return (torch.relu(x @ y) + 1).sum(-1), x.t()

    return make_fx(f, tracing_mode="symbolic" if symbolic else "fake")(torch.randn(4, 8), torch.randn(8, 3))


def identity(gm):
    return PassResult(gm, False)


def corrupt_shape(gm):
    """Writes a wrong shape into the metadata of the relu node."""
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten.relu.default:
            n.meta[VAL] = n.meta[VAL].new_empty((7, 7))
    return PassResult(gm, True)


def drop_meta(gm):
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten.add.Tensor:
            del n.meta[VAL]
    return True


def wrong_dtype_rewrite(gm):
    """Retargets add to a dtype-changing op but leaves the old metadata in place."""
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten.add.Tensor:
            n.target = torch.ops.aten.gt.Scalar
    return True


def dangling_use(gm):
    """Moves a node ahead of its input: graph.lint() must refuse it."""
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    first.prepend(relu)
    return True


@pytest.mark.parametrize("symbolic", [False, True])
@pytest.mark.parametrize(
    "bad, expect",
    [(corrupt_shape, "shape"), (drop_meta, "no meta"), (wrong_dtype_rewrite, "dtype"), (dangling_use, "lint")],
)
def test_broken_pass_is_reported_with_its_name(bad, expect, symbolic):
    gm = traced(symbolic)
    pm = PassManager([identity, bad, identity], debug=True)
    with pytest.raises(PassError, match=expect) as info:
        pm(gm)
    assert info.value.pass_name == bad.__name__
    assert bad.__name__ in str(info.value)


def test_healthy_graph_verifies_and_records_every_pass():
    gm = traced(symbolic=True)
    assert verify_graph(gm) == []
    gm, records = PassManager([identity, identity], debug=True)(gm)
    assert [r.name for r in records] == ["identity", "identity"]
    assert all(r.seconds >= 0 and r.nodes_before == r.nodes_after for r in records)


def test_without_debug_a_broken_pass_is_not_verified():
    gm = traced()
    gm, records = PassManager([corrupt_shape], debug=False)(gm)  # no verification, no error
    assert [r.name for r in records] == ["corrupt_shape"] and records[0].modified
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    assert tuple(relu.meta[VAL].shape) == (7, 7)  # the broken metadata went through unverified
    assert verify_graph(gm), "verify_graph would have found it"


def test_pass_exceptions_name_the_pass():
    def explode(gm):
        raise ValueError("boom")

    with pytest.raises(PassError, match="explode.*boom"):
        PassManager([explode])(traced())


def test_pass_results_of_every_accepted_shape():
    from torch.fx.passes.infra.pass_base import PassResult as TorchPassResult

    gm = traced()
    passes = [lambda g: None, lambda g: False, lambda g: TorchPassResult(g, False), lambda g: PassResult(g, True, {"n": 1})]
    gm, records = PassManager(passes, debug=True)(gm)
    assert [r.modified for r in records] == [True, False, False, True]
    assert records[-1].stats == {"n": 1}
    with pytest.raises(PassError, match="returned int"):
        PassManager([lambda g: 3])(gm)


def test_compile_stats_carry_pass_records():
    gm = traced()
    c = fxforge.spine.compile_graph(gm, fxforge.Config(debug=True))
    names = [p["name"] for p in c.stats["passes"]]
    assert "assign_backends" in names
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    out = c(x, y)
    torch.testing.assert_close(out[0], (torch.relu(x @ y) + 1).sum(-1))
    torch.testing.assert_close(out[1], x.t())


def test_sizes_compare_equal_where_recomputation_specialised_a_symbol():
    """A meta kernel that guards on a size, its guard suppressed while verifying, computes with
    that symbol's hint: ``s0*s1`` stored, ``5*s0`` recomputed (s1's hint 5) is the same stride;
    ``4*s0``, or another symbol in its place, is not."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from fxforge.infra.pass_manager import _dims_equal

    env = ShapeEnv()
    s0, s1 = (env.create_symintnode(env.create_symbol(h, ConstantSource(n)), hint=h) for n, h in (("a", 3), ("b", 5)))
    assert _dims_equal(s0 * s1, s0 * 5) and _dims_equal(s0 * 5, s0 * s1) and _dims_equal(s1, 5)
    assert not _dims_equal(s0 * s1, s0 * 4)
    assert not _dims_equal(s0 * s1, s0 * s0)
    assert not _dims_equal(s0 + 1, s0)


def _negate_first_output(g):
    """A pass changing the graph: the first output negated."""
    out = g.graph.output_node()
    with g.graph.inserting_before(out):
        first = out.args[0][0]
        neg = g.graph.call_function(torch.ops.aten.neg.default, (first,))
        neg.meta[VAL] = first.meta[VAL].neg()
    out.args = ((neg, *out.args[0][1:]),)
    return PassResult(g, True)


def test_recompiles_are_deferred_past_fxforges_passes_but_not_past_yours():
    """fxforge's passes never read a module's code: the manager regenerates it before a pass of
    yours (which may run the module), and once at the end; ``recompile`` is the module's own again."""
    from fxforge.lowering.cleanup import EliminateDeadCode

    gm = traced()
    real = type(gm).recompile
    calls = []

    def counting(self):
        calls.append(1)
        return real(self)

    type(gm).recompile = counting
    try:
        add_neg = _negate_first_output  # a pass of yours that changes the graph (recompiled after it: deferred too)
        seen = []

        def reads_code(g):  # sees the graph as the passes before it left it
            seen.append("neg" in g.code)
            return PassResult(g, False)

        ours = EliminateDeadCode()
        gm2, _ = PassManager([add_neg, ours, ours, reads_code, ours])(gm)
    finally:
        type(gm).recompile = real
    assert seen == [True] and "neg" in gm2.code
    assert "recompile" not in gm2.__dict__
    assert len(calls) == 1  # one regeneration, before reads_code; none after it (nothing changed)
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    torch.testing.assert_close(gm2(x, y)[0], -(torch.relu(x @ y) + 1).sum(-1))


def test_code_left_stale_by_the_last_passes_is_regenerated_when_the_module_is_used():
    """The manager does not regenerate the code at its end (a compile never runs the module): the
    module handed back makes it when first run, or its code read, copied or pickled."""
    import copy
    import pickle

    from torch.fx._lazy_graph_module import _LazyGraphModule

    def add_neg(g):  # as fxforge's passes (its recompile deferred): the module's code left stale
        return _negate_first_output(g)

    add_neg.__module__ = "fxforge.tests"  # (counted as one of fxforge's: not regenerated before it)
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    want = -(torch.relu(x @ y) + 1).sum(-1)
    for use in ("run", "code", "deepcopy", "pickle"):
        gm, _ = PassManager([add_neg])(traced())
        assert isinstance(gm, _LazyGraphModule) and gm._needs_recompile()  # nothing regenerated yet
        if use == "code":
            assert "neg" in gm.code
        elif use == "deepcopy":
            gm = copy.deepcopy(gm)
        elif use == "pickle":
            gm = pickle.loads(pickle.dumps(gm))
        torch.testing.assert_close(gm(x, y)[0], want)
        assert "neg" in gm.code


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_paused_while_a_graph_compiles_and_left_as_the_caller_had_it(enabled):
    seen = []

    def look(gm):  # a user pass: runs inside the compile
        seen.append(gc.isenabled())
        return PassResult(gm, False)

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        c = fxforge.spine.compile_graph(traced(), fxforge.Config(passes={"after_fusion": [look]}), cache=False)
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False] and after is enabled
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    torch.testing.assert_close(c(x, y)[0], (torch.relu(x @ y) + 1).sum(-1))


def test_what_a_compile_keeps_is_not_walked_by_the_first_collection_after_it_and_frozen_objects_stay_frozen():
    gm = traced()
    gc.collect()
    young = []

    def count(phase, info):  # the objects each collection of the youngest generation looks at
        if phase == "start" and info["generation"] == 0:
            young.append(len(gc.get_objects(generation=0)))

    gc.callbacks.append(count)
    try:
        c = fxforge.spine.compile_graph(gm, fxforge.Config(), cache=False)
        gc.collect(0)
    finally:
        gc.callbacks.remove(count)
    assert young and young[0] < 100, young  # (what a compile of this graph keeps: hundreds to thousands of objects)
    assert not gc.get_freeze_count()
    # a process that froze objects of its own (a server before it forks) keeps them frozen
    kept = [object()]
    gc.freeze()
    try:
        fxforge.spine.compile_graph(traced(), fxforge.Config(), cache=False)
        assert gc.get_freeze_count() and not any(o is kept for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    torch.testing.assert_close(c(x, y)[0], (torch.relu(x @ y) + 1).sum(-1))


def test_a_compiled_graph_keeps_no_per_node_answers():
    """The answers ``per_node`` keeps while a compile asks them again and again are dropped when it
    ends (half the objects a compiled graph kept alive); asked after, they are made anew."""
    from fxforge.core.graph import MEMO, node_kind

    gm = traced()
    c = fxforge.spine.compile_graph(gm, fxforge.Config(), cache=False)
    graphs = [gm, c.graph]
    assert not [n.name for g in graphs for n in g.graph.nodes if MEMO in n.meta]
    compute = [n for n in c.graph.graph.nodes if node_kind(n) == "compute"]
    assert compute and all(MEMO in n.meta for n in compute)  # (node_kind asked again: kept again)
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    torch.testing.assert_close(c(x, y)[0], (torch.relu(x @ y) + 1).sum(-1))
