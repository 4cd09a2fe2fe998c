"""The library's shape: import layering, lazy backends, user passes at named pipeline points,
backend selection from what backends declare, per-run pass state, and Config validation."""

from __future__ import annotations

import ast
import logging
import math
import os
import shutil
import subprocess
import sys
import threading

import networkx as nx
import pytest
import torch

import fxforge
from fxforge import CodegenBackend, Config, PassError, PassResult
from fxforge.codegen.api import deferred
from fxforge.codegen.registry import DEFAULT_REGISTRY, Registry
from fxforge.core.graph import BACKEND, GROUP, node_kind

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fxforge")


# --------------------------------------------------------------------------- layering


def _imports(type_checking: bool = False) -> tuple[nx.DiGraph, dict[str, str]]:
    """fxforge's own imports (module-level and inside functions; ``if TYPE_CHECKING:`` blocks
    only with ``type_checking``): an edge from importer to imported module."""
    mods = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                mods[rel.removesuffix(".__init__")] = path
    g = nx.DiGraph()
    for mod, path in mods.items():
        tree = ast.parse(open(path).read())
        pkg = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        skip = set() if type_checking else {
            id(x) for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
            for x in ast.walk(n)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            g.add_edges_from((mod, t) for t in targets if t in mods and t != mod)
    return g, mods


def test_no_import_cycle_in_fxforge():
    """None at run time, and none through the imports only a type checker follows either: a
    module's annotations name only what sits below it."""
    for type_checking in (False, True):
        g, _ = _imports(type_checking)
        assert list(nx.simple_cycles(g)) == [], f"type_checking={type_checking}"


# The package's groups, lowest first (docs/architecture.md): a module imports only from its own
# group's rank or below. The spine drives one graph through the layers; the entry points use it.
LAYERS = [("core",), ("infra",), ("lowering", "passes", "codegen", "report", "testing"), ("artifact",), ("spine",),
          ("entry", "custom_ops", "packages")]


def _rank(mod: str) -> int | None:
    group = (mod.split(".") + [""])[1]
    return next((i for i, names in enumerate(LAYERS) if group in names), None)


def test_the_groups_import_only_their_own_rank_or_below():
    g, mods = _imports(type_checking=True)
    assert {m.split(".")[1] for m in mods if m.count(".") >= 1} <= {n for names in LAYERS for n in names} | {"__main__"}
    up = sorted((m, t) for m, t in g.edges if _rank(m) is not None and _rank(t) is not None and _rank(t) > _rank(m))
    assert up == []


def test_the_root_holds_only_the_groups():
    """Modules sit in their role's group; the root holds the package's face and the spine."""
    assert sorted(f for f in os.listdir(ROOT) if f.endswith(".py")) == \
        ["__init__.py", "__main__.py", "spine.py"]


def test_old_import_paths_still_work():
    """A moved module is reachable at its old path, as the same module object."""
    from fxforge.infra.moved import MOVED

    code = ("import importlib, sys, fxforge\n"
            f"moved = {MOVED!r}\n"
            "bad = [o for o, n in moved.items() if importlib.import_module(o) is not importlib.import_module(n)]\n"
            "import fxforge.graph, fxforge.core.graph\n"
            "assert fxforge.graph is fxforge.core.graph and callable(fxforge.backend), 'attributes'\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]
    cli = subprocess.run([sys.executable, "-m", "fxforge.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "usage: fxforge" in cli.stdout, cli.stderr[-2000:]


def test_passes_import_only_the_backend_interface_from_codegen():
    g, mods = _imports()
    bad = {(m, t) for m in mods if m.startswith("fxforge.passes") and m in g
           for t in g.successors(m) if t.startswith("fxforge.codegen") and t != "fxforge.codegen.api"}
    assert bad == set()


def test_kernel_languages_share_only_the_ir():
    """The C and Triton printers import nothing of each other: what they share is ``codegen/ir``
    (values, op semantics, the group walk) and the neutral codegen modules."""
    g, mods = _imports()
    langs = ("fxforge.codegen.c", "fxforge.codegen.triton")
    bad = {(m, t) for m in mods if m in g for t in g.successors(m)
           for a, b in (langs, langs[::-1]) if m.startswith(a + ".") and t.startswith(b)}
    assert bad == set()
    assert not {(m, t) for m in mods if m.startswith("fxforge.codegen.ir") and m in g
                for t in g.successors(m) if t.startswith(langs)}


def _functions():
    """(module path, function node) for every function in fxforge."""
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                for node in ast.walk(ast.parse(open(path).read())):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield os.path.relpath(path, ROOT), node


def test_no_function_is_over_80_lines_but_a_c_template_that_says_why():
    """A function over 80 lines is allowed only as a C template whose docstring says why the
    kernel IR's group walk cannot express it (and why it is one function)."""
    long = [(path, fn.name, fn.end_lineno - fn.lineno + 1) for path, fn in _functions() if fn.end_lineno - fn.lineno + 1 > 80]
    for path, name, lines in long:
        fn = next(f for p, f in _functions() if p == path and f.name == name)
        doc = ast.get_docstring(fn) or ""
        assert path == os.path.join("codegen", "c", "templates.py") and "Why a template" in doc and "80 lines" in doc, \
            f"{path}: {name} is {lines} lines"


def test_kernels_are_said_in_the_ir_not_in_printed_text():
    """No module under ``codegen/`` builds a kernel statement out of source text: the IR has no
    ``Line`` statement, and no IR name (a ``Var``, an ``Elem``'s array, a ``Set`` target) holds a
    subscript or a call printed into it."""
    from fxforge.codegen.ir import stmts

    assert not hasattr(stmts, "Line")
    bad = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "codegen")):
        for f in files:
            if f.endswith(".py"):
                tree = ast.parse(open(os.path.join(dirpath, f)).read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                            "Var", "Elem", "Set", "Line", "put") and node.args:
                        first = node.args[0]
                        text = "".join(v.value for v in first.values if isinstance(v, ast.Constant)) \
                            if isinstance(first, ast.JoinedStr) else first.value if isinstance(first, ast.Constant) else ""
                        if isinstance(text, str) and any(c in text for c in "[]();=") or \
                                getattr(node.func, "id", getattr(node.func, "attr", None)) in ("Line", "put"):
                            bad.append(f"{f}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert bad == []


def test_import_fxforge_loads_no_triton_module():
    code = ("import sys, fxforge\n"
            "print(sorted(m for m in sys.modules if m.startswith('fxforge.codegen.triton') or m == 'triton'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- user passes


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


class Probe:
    """A user pass recording what it saw: which fxforge metadata the graph carried."""

    def __init__(self, name: str):
        self.name = name
        self.seen: list[dict] = []

    def __call__(self, gm):
        nodes = [n for n in gm.graph.nodes if node_kind(n) == "compute"]
        self.seen.append({"grouped": all(GROUP in n.meta for n in nodes), "backends": {n.meta.get(BACKEND) for n in nodes}})
        return PassResult(gm, False, {"calls": len(self.seen)})


def _traced():
    def f(x, w1, w2):
        return torch.relu(x @ w1 + 1) @ w2

    return torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(
        torch.randn(3, 8), torch.randn(8, 16), torch.randn(16, 4))


def relu_to_clamp(gm):
    n = 0
    for node in gm.graph.nodes:
        if node.target is torch.ops.aten.relu.default:
            node.target, node.args = torch.ops.aten.clamp_min.default, (node.args[0], 0.0)
            n += 1
    return PassResult(gm, n > 0, {"rewritten": n})


def test_user_passes_run_at_their_points_in_torch_compile_training():
    points = {p: Probe(p) for p in ("after_lowering", "after_assignment", "after_fusion")}
    cfg = Config(debug=True, passes={p: [probe] for p, probe in points.items()})
    b = fxforge.backend(cfg)
    model = _model()
    x = torch.randn(5, 8)
    out = torch.compile(model, backend=b)(x)
    out.sum().backward()
    assert {c.stats["graph"] for c in b.compiled} == {"forward", "backward"}
    for c in b.compiled:
        names = [p["name"] for p in c.stats["passes"]]
        # fxforge's own passes and the user's, in pipeline order
        assert names.index("after_lowering") < names.index("assign_backends") < names.index("after_assignment")
        assert names.index("after_assignment") < names.index("fuse_groups") < names.index("after_fusion")
    lowering, assignment = points["after_lowering"].seen, points["after_assignment"].seen
    assert len(lowering) == 2 and not any(s["grouped"] for s in lowering) and all(s["backends"] == {None} for s in lowering)
    assert len(assignment) == 2 and all(s["grouped"] and None not in s["backends"] for s in assignment)
    assert len(points["after_fusion"].seen) == 2


def test_user_pass_changes_what_runs_in_torch_compile_and_compile_exported():
    model, x = _model(), torch.randn(3, 8)
    cfg = Config(debug=True, codegen="torch", passes={"after_lowering": relu_to_clamp})  # ATen calls in the source
    b = fxforge.backend(cfg)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=b)(x), model(x))
    (rec,) = [p for p in b.compiled[0].stats["passes"] if p["name"] == "relu_to_clamp"]
    assert rec["modified"] and rec["stats"] == {"rewritten": 1}
    assert "aten.clamp_min" in b.compiled[0].source and "aten.relu" not in b.compiled[0].source

    c = fxforge.compile_exported(torch.export.export(model, (x,)), cfg)
    x2 = torch.randn(3, 8)
    torch.testing.assert_close(c(x2), model(x2))
    (rec,) = [p for p in c.stats["passes"] if p["name"] == "relu_to_clamp"]
    assert rec["stats"] == {"rewritten": 1} and "aten.clamp_min" in c.source and "aten.relu" not in c.source


def test_a_user_pass_that_breaks_the_graph_is_named_in_debug_mode():
    def break_meta(gm):
        for n in gm.graph.nodes:
            if n.target is torch.ops.aten.relu.default:
                n.meta["val"] = n.meta["val"].new_empty((1, 2, 3))
        return True

    gm = _traced()
    with pytest.raises(PassError, match="break_meta.*shape") as info:
        fxforge.spine.compile_graph(gm, Config(debug=True, passes={"after_lowering": [break_meta]}))
    assert info.value.pass_name == "break_meta"


def test_a_user_pass_after_fusion_that_breaks_the_groups_is_named_in_debug_mode():
    def one_group(gm):  # every compute node in one group: a matmul cannot fuse with its neighbours
        for n in gm.graph.nodes:
            if GROUP in n.meta:
                n.meta[GROUP] = 0
        return True

    gm = _traced()
    with pytest.raises(PassError, match="one_group"):
        fxforge.spine.compile_graph(gm, Config(debug=True, max_fusion_size=2, passes={"after_fusion": [one_group]}))


# --------------------------------------------------------------------------- per-run pass state


def test_one_fusion_pass_instance_serves_graphs_in_two_threads():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxforge.passes.assign import AssignBackends
    from fxforge.passes.fusion import FuseGroups

    torch_backend = DEFAULT_REGISTRY.get("torch")
    cfg = Config()

    def graph(k):
        def f(x, y):
            h = x
            for i in range(k):
                h = torch.sigmoid(h * y + i).sum(-1, keepdim=True) * h
            return h
        gm = make_fx(f, tracing_mode="fake")(torch.randn(8, 4), torch.randn(8, 4))
        AssignBackends(torch_backend, cfg)(gm)
        return gm

    def groups(gm):
        out = {}
        for n in gm.graph.nodes:
            if GROUP in n.meta:
                out.setdefault(n.meta[GROUP], []).append(n.name)
        return sorted(out.values())

    expected = []
    for k in (3, 6):
        gm = graph(k)
        FuseGroups(torch_backend, cfg)(gm)
        expected.append(groups(gm))
    shared = FuseGroups(torch_backend, cfg)
    todo = {i: [graph(k) for _ in range(5)] for i, k in enumerate((3, 6))}  # tracing is not thread-safe
    got: dict[int, list] = {}

    def work(i, k):
        for gm in todo[i]:
            shared(gm)
            got.setdefault(i, []).append(groups(gm))

    threads = [threading.Thread(target=work, args=(i, k)) for i, k in enumerate((3, 6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(g == expected[0] for g in got[0]) and all(g == expected[1] for g in got[1])
    assert len(expected[0]) < 10 and len(expected[1]) < 19  # fusion really merged something


# --------------------------------------------------------------------------- backend selection


def _toy(name, devices=("cpu",), priority=0, unavailable=None, decompose="core"):
    return CodegenBackend(name, devices, DEFAULT_REGISTRY.get("torch").accepts, DEFAULT_REGISTRY.get("torch").compile,
                          priority=priority, unavailable=unavailable, decompose=decompose)


def test_auto_selection_follows_what_backends_declare():
    reg = Registry()
    reg.register(_toy("base", devices=("cpu", "cuda")))
    assert reg.select(Config(), {"cpu"}).name == "base"
    reg.register(_toy("same_priority"))
    assert reg.select(Config(), {"cpu"}).name == "base"  # ties: the first registered
    reg.register(_toy("gpu_only", devices=("cuda",), priority=5))
    assert reg.select(Config(), {"cpu"}).name == "base"
    assert reg.select(Config(), {"cuda"}).name == "gpu_only"
    assert reg.select(Config(), {"cuda", "cpu"}).name == "base"  # must target every device
    reg.register(_toy("missing_dep", devices=("cuda",), priority=9, unavailable=lambda d: "pkg not installed"))
    assert reg.select(Config(), {"cuda"}).name == "gpu_only"  # auto skips the unavailable one
    with pytest.raises(ValueError, match="no registered codegen backend targets.*'xpu'"):
        reg.select(Config(), {"xpu"})


def test_default_registry_picks_c_on_cpu_and_decomposes_as_declared():
    from fxforge.lowering.decompose import level

    picked = DEFAULT_REGISTRY.select(Config(), {"cpu"})
    assert picked.name == ("c" if shutil.which(os.environ.get("CC") or "cc") else "torch")
    assert level(Config(), DEFAULT_REGISTRY.get("c")) == "none"  # ATen's composite kernels stay
    torch_b = DEFAULT_REGISTRY.get("torch")
    assert level(Config(), torch_b) == "none"
    assert level(Config(), DEFAULT_REGISTRY.get("triton")) == "core"
    assert level(Config(decompose="core"), torch_b) == "core"
    with pytest.raises(ValueError, match="decompose='some'"):
        _toy("bad", decompose="some")


def test_an_unavailable_backend_named_explicitly_warns_once_with_the_fix(caplog):
    reg = Registry()
    reg.register(_toy("needs_env", unavailable=lambda d: "set NEEDS_ENV=1 first" if "cpu" in d else None))
    with caplog.at_level(logging.WARNING, logger="fxforge"):  # (a name of this registry only)
        for _ in range(3):
            assert reg.select(Config(codegen="needs_env"), {"cpu"}).name == "needs_env"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "set NEEDS_ENV=1 first" in warnings[0].getMessage()


def test_triton_on_cpu_without_the_interpreter_warns_once(monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pytest.importorskip("triton")
    reg = Registry()
    reg.register(DEFAULT_REGISTRY.get("triton"))
    with caplog.at_level(logging.WARNING, logger="fxforge"):
        reg.select(Config(codegen="triton"), {"cpu"})
        reg.select(Config(codegen="triton"), {"cpu"})
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(msgs) == 1 and "TRITON_INTERPRET=1" in msgs[0] and "codegen='torch'" in msgs[0]


def test_deferred_imports_on_first_call():
    fn = deferred("json", "dumps")
    assert fn([1]) == "[1]" and fn.__name__ == "dumps"
    missing = deferred("fxforge_no_such_module", "f")
    with pytest.raises(ModuleNotFoundError):
        missing()


# --------------------------------------------------------------------------- Config validation


@pytest.mark.parametrize("knob, value, message", [
    ("max_fusion_peak_growth", float("nan"), "max_fusion_peak_growth=nan.*fraction"),
    ("max_fusion_peak_growth", -0.1, "max_fusion_peak_growth=-0.1"),
    ("fallback_ops", [3], "fallback_ops.*3.*not an op"),
    ("fallback_ops", ["aten.no_such_op.default"], "no operator 'aten.no_such_op.default'"),
    ("fallback_ops", ["add"], "'add' is not an op name"),
    ("debug", "false", "debug='false'.*True or False"),
    ("inplace", 1, "inplace=1.*True or False"),
    ("max_fusion_size", True, "max_fusion_size=True.*positive int"),
    ("max_fusion_size", 0, "max_fusion_size=0"),
    ("max_kernel_args", 2.5, "max_kernel_args=2.5"),
    ("codegen", None, "codegen=None"),
    ("alignment", 48, "alignment=48.*power of two"),
    ("decompose", "all", "decompose='all'"),
    ("passes", {"before_everything": [print]}, "unknown point 'before_everything'"),
    ("passes", {"after_fusion": [3]}, "3 is not callable"),
    ("report_dir", 3, "report_dir=3"),
])
def test_config_rejects_bad_knobs_at_construction(knob, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{knob: value})


def test_an_unknown_backend_name_is_refused_by_the_entry_point():
    """A backend's name is checked against the registry the entry point uses (``Registry.check``)."""
    cfg = Config(codegen="nonexistent")  # a name in the right form: some registry may hold it
    with pytest.raises(ValueError, match="codegen='nonexistent'.*torch"):
        fxforge.backend(cfg)


def test_config_accepted_forms_are_normalised():
    c = Config(fallback_ops="aten.add.Tensor")  # one op, not its characters
    assert c.fallback_ops == {"aten.add.Tensor"}
    c = Config(fallback_ops=[torch.ops.aten.relu.default, torch.ops.aten.mul, "torch.ops.aten.gelu.default"])
    assert c.fallback_ops == {"aten.relu.default", "aten.mul", "aten.gelu.default"}
    c = Config(max_fusion_size=math.inf, max_fusion_peak_growth=math.inf, max_kernel_args=math.inf)
    assert c.max_fusion_size == math.inf and c.replace() == c  # rebuilding keeps it valid
    assert Config(passes={"after_fusion": relu_to_clamp}).passes_at("after_fusion") == (relu_to_clamp,)


def test_inf_limits_compile_and_packet_fallback_ops_apply():
    """``math.inf`` means no limit (the peak guard used to overflow); a packet name in
    ``fallback_ops`` covers every overload of the op."""
    def f(x):
        return torch.relu(x * 2 + 1).sum(-1) + 3

    b = fxforge.backend(Config(debug=True, max_fusion_peak_growth=math.inf, max_fusion_size=math.inf,
                               fallback_ops=[torch.ops.aten.add]))
    x = torch.randn(4, 6)
    torch.testing.assert_close(torch.compile(f, backend=b)(x), f(x))
    fallbacks = b.compiled[0].stats["fallbacks"]
    assert fallbacks and all("fallback_ops" in r for r in fallbacks.values())
    assert len(fallbacks) == 2  # add.Tensor and add.Scalar (mul, relu, sum run on the backend)


def test_a_backend_bounds_its_kernels_arguments():
    """The C backend's kernels take at most ``C_MAX_KERNEL_ARGS`` launch arguments: a Config naming
    it with a higher limit is refused with the fix; with "auto" the lower limit applies."""
    from fxforge.codegen.api import kernel_args_limit
    from fxforge.codegen.registry import C_MAX_KERNEL_ARGS

    for limit in (math.inf, C_MAX_KERNEL_ARGS + 1):
        with pytest.raises(ValueError, match=f"max_kernel_args <= {C_MAX_KERNEL_ARGS}"):
            fxforge.backend(Config(codegen="c", max_kernel_args=limit))
    assert Config(codegen="c", max_kernel_args=C_MAX_KERNEL_ARGS).max_kernel_args == C_MAX_KERNEL_ARGS
    c = DEFAULT_REGISTRY.get("c")
    assert kernel_args_limit(c, Config(max_kernel_args=math.inf)) == C_MAX_KERNEL_ARGS
    assert kernel_args_limit(c, Config(max_kernel_args=12)) == 12
    assert kernel_args_limit(DEFAULT_REGISTRY.get("torch"), Config(max_kernel_args=math.inf)) == math.inf


def test_on_kernel_sees_every_kernel_as_it_is_built():
    seen = []
    b = fxforge.backend(Config(codegen="torch", on_kernel=seen.append))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8, requires_grad=True)
    torch.compile(model, backend=b)(x).sum().backward()
    assert [(k.name, k.backend) for k in seen] == [(k.name, k.backend) for c in b.compiled for k in c.kernels]
    assert len(b.compiled) == 2 and all(k.source for k in seen)
    with pytest.raises(ValueError, match="on_kernel=3"):
        Config(on_kernel=3)
