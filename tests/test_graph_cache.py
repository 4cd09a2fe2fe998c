"""The compiled-graph cache (``fxforge/artifact/graph_cache.py``): a second process loads what the
first compiled (outputs bit-identical), the key changes with each of its parts, a damaged or
stale entry is compiled again (never run), and the switches that turn it off."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fxforge
from fxforge.artifact import graph_cache
from fxforge.codegen.registry import DEFAULT_REGISTRY


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """The graph cache on, in a directory of this test's own."""
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(graph_cache.ENV, "1")
    return tmp_path / "cache" / graph_cache.KIND


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.n, self.b = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.n(self.a(x)))).softmax(-1)


def _exported(shape=(4, 16), dtype=torch.float32):
    torch.manual_seed(0)
    return torch.export.export(MLP().to(dtype), (torch.randn(*shape, dtype=dtype),))


def _entries(cache) -> list:
    return sorted(cache.glob("*.json")) if cache.exists() else []


# --------------------------------------------------------------------------- hit, miss, second process

SCRIPT = textwrap.dedent("""
    import sys, torch, fxforge
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    be = fxforge.backend(fxforge.Config(debug=False))
    x = torch.randn(8, 16)
    f = torch.compile(model, backend=be)
    out = f(x)
    out.sum().backward()
    torch.save({"out": out.detach(), "grads": [p.grad for p in model.parameters()],
                "cache": [c.stats["graph_cache"] for c in be.compiled],
                "seconds": [c.stats["compile_seconds"] for c in be.compiled]}, sys.argv[1])
""")


def test_a_second_process_loads_what_the_first_compiled(cache, tmp_path):
    runs = []
    for i in range(2):
        path = tmp_path / f"run{i}.pt"
        p = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(torch.load(path))
    first, second = runs
    assert first["cache"] == ["stored", "stored"] and second["cache"] == ["hit", "hit"]
    assert torch.equal(first["out"], second["out"])  # the same kernels: bit-identical
    for a, b in zip(first["grads"], second["grads"]):
        assert torch.equal(a, b)
    assert len(_entries(cache)) == 2


def test_a_hit_runs_the_same_code_and_compiles_again_only_for_what_it_lacks(cache):
    ep = _exported()
    x = torch.randn(4, 16)
    cold = fxforge.compile_exported(ep, fxforge.Config())
    warm = fxforge.compile_exported(_exported(), fxforge.Config())
    assert cold.stats["graph_cache"] == "stored" and warm.stats["graph_cache"] == "hit"
    assert warm.source == cold.source and [k.name for k in warm.kernels] == [k.name for k in cold.kernels]
    assert torch.equal(warm(x), cold(x))
    # what only a compile makes (the graph after the passes, the plan, the report) is made on demand
    assert warm._graph is None and warm.plan is not None and warm.graph is not None
    assert "<html" in open(warm.write_report(str(cache.parent / "r.html"))).read()[:200]


def test_a_different_graph_misses(cache):
    fxforge.compile_exported(_exported(), fxforge.Config())
    other = fxforge.compile_exported(_exported(shape=(5, 16)), fxforge.Config())
    assert other.stats["graph_cache"] == "stored" and len(_entries(cache)) == 2


# --------------------------------------------------------------------------- the key


def _key(gm, config=None, kind="inference", region=""):
    return graph_cache.key(gm, config or fxforge.Config(), kind, region, DEFAULT_REGISTRY)


def test_the_key_changes_with_each_of_its_parts(monkeypatch):
    gm = _exported().graph_module
    base = _key(gm)
    assert _key(_exported().graph_module) == base  # the same program traced again: the same key
    changed = {
        "sizes": _key(_exported(shape=(6, 16)).graph_module),
        "dtype": _key(_exported(dtype=torch.float64).graph_module),
        "kind": _key(gm, kind="forward"),
        "region": _key(gm, region="block"),
        "config": _key(gm, fxforge.Config(max_fusion_size=8)),
        "codegen": _key(gm, fxforge.Config(codegen="torch")),
    }
    strided = _exported().graph_module
    x = next(n for n in strided.graph.nodes if n.op == "placeholder" and n.name == "x")
    x.meta["val"] = x.meta["val"].t().contiguous().t()  # the same sizes, other strides
    changed["strides"] = _key(strided)
    ops = _exported().graph_module
    gelu = next(n for n in ops.graph.nodes if "gelu" in str(n.target))
    gelu.target = torch.ops.aten.relu.default  # one op changed
    changed["op"] = _key(ops)
    for part, patch in {"cpu": ("cpu_field", lambda name: "other flags"), "arch": ("arch", lambda: "riscv64"),
                        "sources": ("_sources_digest", lambda: "another checkout")}.items():
        with monkeypatch.context() as m:
            m.setattr(graph_cache, *patch)
            changed[part] = _key(gm)
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "9.9.9")
        changed["torch"] = _key(gm)
    with monkeypatch.context() as m:
        m.setenv("FXFORGE_C_SANITIZE", "1")
        changed["environment"] = _key(gm)
    assert all(k != base for k in changed.values()), [p for p, k in changed.items() if k == base]
    assert len(set(changed.values())) == len(changed)


def test_symbolic_ranges_and_hints_are_in_the_key():
    torch.manual_seed(0)
    dims = {"x": {0: torch.export.Dim("b", min=2, max=64)}}
    narrow = torch.export.export(MLP(), (torch.randn(4, 16),), dynamic_shapes=dims).graph_module
    wide = torch.export.export(MLP(), (torch.randn(4, 16),),
                               dynamic_shapes={"x": {0: torch.export.Dim("b", min=2, max=128)}}).graph_module
    hinted = torch.export.export(MLP(), (torch.randn(8, 16),), dynamic_shapes=dims).graph_module
    assert len({_key(narrow), _key(wide), _key(hinted)}) == 3


def test_compiles_that_cannot_be_cached_say_why(cache):
    def noop(gm):
        return fxforge.PassResult(gm, False)

    c = fxforge.compile_exported(_exported(), fxforge.Config(passes={"after_fusion": [noop]}))
    assert c.stats["graph_cache"] == "not cached: the Config holds user passes or an on_kernel hook"
    assert _entries(cache) == []


def test_the_cache_is_off_with_its_environment_variable_and_torchs_switch(cache, monkeypatch):
    monkeypatch.setenv(graph_cache.ENV, "0")
    assert fxforge.compile_exported(_exported(), fxforge.Config()).stats["graph_cache"] == f"{graph_cache.ENV}=0"
    monkeypatch.setenv(graph_cache.ENV, "1")
    with torch.compiler.config.patch(force_disable_caches=True):
        c = fxforge.compile_exported(_exported(), fxforge.Config())
    assert c.stats["graph_cache"] == "torch.compiler.config.force_disable_caches" and _entries(cache) == []


# --------------------------------------------------------------------------- damaged and stale entries


def _damage(path, how: str) -> None:
    text = path.read_text()
    if how == "truncated":
        path.write_text(text[: len(text) // 2])
    elif how == "edited":  # a byte of the body changed, its hash left as it was
        outer = json.loads(text)
        outer["body"] = outer["body"].replace("torch", "torcH", 1)
        path.write_text(json.dumps(outer))
    elif how == "stale format":
        outer = json.loads(text)
        outer["format"] = -1
        path.write_text(json.dumps(outer))
    elif how == "missing op":  # consistent (hash updated) but naming an op this process lacks
        outer = json.loads(text)
        body = json.loads(outer["body"])
        body["ops"].append(["no_such_namespace", "no_such_op", "default"])
        outer["body"] = json.dumps(body)
        import hashlib

        outer["sha256"] = hashlib.sha256(outer["body"].encode()).hexdigest()
        path.write_text(json.dumps(outer))


@pytest.mark.parametrize("how", ["truncated", "edited", "stale format", "missing op"])
def test_a_damaged_or_stale_entry_is_compiled_again_never_run(cache, how, caplog):
    x = torch.randn(4, 16)
    expected = _exported().module()(x)
    fxforge.compile_exported(_exported(), fxforge.Config())
    (entry,) = _entries(cache)
    _damage(entry, how)
    with caplog.at_level("WARNING", logger="fxforge"):
        c = fxforge.compile_exported(_exported(), fxforge.Config())
    assert c.stats["graph_cache"] == "stored"  # compiled, and the entry written again
    assert "cannot be used" in caplog.text
    torch.testing.assert_close(c(x), expected)
    assert fxforge.compile_exported(_exported(), fxforge.Config()).stats["graph_cache"] == "hit"


# --------------------------------------------------------------------------- torch's cache artifacts


def test_torchs_cache_artifacts_carry_the_entries(cache, tmp_path, monkeypatch):
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()
    fxforge.compile_exported(_exported(), fxforge.Config())
    saved = torch.compiler.save_cache_artifacts()
    assert saved is not None
    data, info = saved
    assert len(getattr(info, f"{graph_cache.ARTIFACT}_artifacts")) == 1
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert fxforge.compile_exported(_exported(), fxforge.Config()).stats["graph_cache"] == "stored"
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path / "fresh"))
    torch.compiler.load_cache_artifacts(data)
    assert fxforge.compile_exported(_exported(), fxforge.Config()).stats["graph_cache"] == "hit"
    CacheArtifactManager.clear()


def test_config_fields_are_all_in_the_key():
    """Every Config field but those deciding nothing in the code changes the key: a new field
    cannot be forgotten."""
    gm = _exported().graph_module
    base = _key(gm)
    values = {"codegen": "torch", "decompose": "none", "partitioner": "default", "max_fusion_size": 3,
              "max_fusion_unique_io_buffers": 5, "max_kernel_args": 20, "max_fusion_peak_growth": 0.5, "autotune": True,
              "alignment": 128, "fallback_ops": frozenset({"aten.gelu.default"}), "inplace": False, "arena_windows": False,
              "keep_arenas": "never", "keep_training_arenas_max_bytes": 1, "recycle_outputs": "never",
              "recycle_min_bytes": 1, "conv_layout": "as_traced", "threads": 1, "zero_copy": False, "poison_arena": True,
              "symmetric_all_reduce_bytes": 1, "custom_op_tuning": "off", "debug": not fxforge.Config().debug,
              "comm_overlap": False, "prefetch_peak_growth": 0.5, "bucket_bytes": 0, "comm_model": "pcie",
              "max_collectives_in_flight": 3, "memory_budget": 0.5}
    fields = {f.name for f in dataclasses.fields(fxforge.Config)}
    assert fields - set(values) <= {"report_dir", "passes", "on_kernel", "progress", "tiered_builds"}
    for name, v in values.items():
        assert _key(gm, dataclasses.replace(fxforge.Config(), **{name: v})) != base, name
    # how the kernels are built first decides nothing in them
    assert _key(gm, dataclasses.replace(fxforge.Config(), tiered_builds=not fxforge.Config().tiered_builds)) == base


def test_the_default_test_session_runs_without_the_cache():
    """The suite compiles afresh (conftest): what a test checks never depends on what an
    earlier run left in the cache."""
    assert os.environ.get(graph_cache.ENV) == "0" or "PYTEST_GRAPH_CACHE" in os.environ
