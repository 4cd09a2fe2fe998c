"""Test-session set-up shared by every test module."""

import os
import sys

import pytest

# No GPU on dev/CI machines: Triton kernels run under its interpreter.  Must be set before
# anything imports triton (it decorates its own library functions at import time).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Every test compiles afresh: nothing a test checks depends on what an earlier run left in the
# compiled-graph cache (tests/test_graph_cache.py turns it on where it tests it).
# PYTEST_GRAPH_CACHE=1 runs the suite with the cache on instead.
if os.environ.get("PYTEST_GRAPH_CACHE") != "1":
    os.environ["FXFORGE_GRAPH_CACHE"] = "0"
# A compile returns with its C kernels built in full: a test's first call runs the kernels its
# later calls do (tests/test_tiered_builds.py turns tiered builds on where it tests them).
os.environ.setdefault("FXFORGE_TIERED_BUILDS", "0")


@pytest.fixture
def fxforge_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m fxforge.entry.cli``."""
    script = os.path.join(os.path.dirname(sys.executable), "fxforge")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "fxforge.entry.cli"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test starts with dynamo's caches empty: a module compiled by an earlier test in the
    same worker (``nn.Sequential.forward``'s code is shared by all instances) would otherwise
    make dynamo mark this test's sizes dynamic, depending on how xdist ordered the tests."""
    import torch

    torch._dynamo.reset()
    yield


@pytest.fixture
def kernel_cache(monkeypatch, tmp_path_factory):
    """Compiled kernels (C shared objects, Triton's) cached in one directory per test session,
    ``$FXFORGE_TEST_CACHE``, shared by the modules that compile kernels."""
    if "FXFORGE_TEST_CACHE" not in os.environ:
        os.environ["FXFORGE_TEST_CACHE"] = str(tmp_path_factory.mktemp("fxforge-cache"))
    monkeypatch.setenv("FXFORGE_CACHE_DIR", os.environ["FXFORGE_TEST_CACHE"])


@pytest.fixture
def fresh_launcher():
    """The C kernel launcher (``launcher.launcher()``, cached per process) found again in the
    test, and after it."""
    from fxforge.codegen.c import launcher

    launcher.launcher.cache_clear()
    yield launcher
    launcher.launcher.cache_clear()


@pytest.fixture(params=["launcher", "ctypes"])
def kernels_through(request, monkeypatch, fresh_launcher):
    """C kernels called by the launcher, or (no ``Python.h``) through ``ctypes`` adapters."""
    if request.param == "ctypes":
        monkeypatch.setattr(fresh_launcher, "python_include", lambda: None)
    elif fresh_launcher.launcher() is None:
        pytest.skip("no launcher here (no Python.h or no data-pointer entry): kernels go through ctypes")
    return request.param
