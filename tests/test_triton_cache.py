"""The on-disk Triton kernel cache (``fxforge/codegen/triton/cache.py``).

* ``load`` runs the text it holds, never what it reads back: a file rewritten or deleted by
  someone else between the check and the run (deterministic races, and a multi-process stress
  run with a deleter and a hostile writer) is never executed and never makes a load fail, and
  ``inspect`` (so ``triton.jit`` and the interpreter, which reads the source at the first
  launch) sees the verified text whatever happens to the file afterwards;
* ``cache_dir`` refuses a symlinked, foreign-owned, non-directory or group/other-writable
  directory with one WARNING and falls back to one private temp directory per process;
* kept behaviour: ``0700`` directory, atomic writes, a corrupted file is rewritten.

Module-level imports stay light (no torch): the stress test's spawned workers import this
module, and load ``cache.py`` by path (it imports nothing from fxforge), so they start in well
under a second instead of the ~4 s an ``import fxforge`` (torch) costs each on a 2-core box.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import linecache
import logging
import multiprocessing
import os
import queue
import stat
import sys
import time

import pytest

# Triton decorates its own library functions at import: the interpreter must be chosen first.
os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

SRC = """\
def helper(x):
    return x * 7 + 1


def f(x):
    return helper(x) + 0
"""
EXPECTED_SOURCES = ["def helper(x):\n    return x * 7 + 1\n", "def f(x):\n    return helper(x) + 0\n"]


def _hostile(marker: str) -> str:
    """Content a hostile writer puts in the cache file: if ever executed, it appends to
    ``marker`` and defines functions returning -1."""
    return (
        f"open({marker!r}, 'a').write('executed\\n')\n\n"
        "def helper(x):\n    return -1\n\n\ndef f(x):\n    return -1\n"
    )


def _recorder(seen: list):
    """A ``wrap`` that, like ``triton.jit``, reads each function's source with ``inspect``."""

    def wrap(fn):
        seen.append(inspect.getsource(fn))
        return fn

    return wrap


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """The cache module, with its cache under ``tmp_path/cache`` and no warnings given yet."""
    from fxforge.codegen import diskcache
    from fxforge.codegen.triton import cache

    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(diskcache, "_warned", set())
    monkeypatch.setattr(diskcache, "_fallback", None)
    return cache


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fxforge" and r.levelno == logging.WARNING]


# --------------------------------------------------------------------------- kept behaviour


def test_cache_private_atomic_and_corrupted_file_recompiled(cache):
    import torch

    from fxforge.codegen.triton import prelude
    from triton_helpers import GENERATED, run_compiled

    d = cache.cache_dir()
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    x = torch.randn(5, 3)

    def f(a):
        return a * 3.25 - 1.0

    run_compiled(f, x)
    em = GENERATED[-1]
    path = cache.module_path(prelude.module_text(em.kernel_source, "interp"))
    assert os.path.dirname(path) == d
    assert not stat.S_IMODE(os.stat(path).st_mode) & 0o077
    with open(path, "w") as fh:
        fh.write("def kernel(:\n  garbage\x00")  # corrupted: not even Python
    b, out = run_compiled(f, x)
    torch.testing.assert_close(out, f(x))
    with open(path) as fh:
        assert "garbage" not in fh.read()  # rewritten from the source we hold
    assert not [p for p in os.listdir(d) if p.startswith(".tmp-")]


def test_group_writable_triton_dir_is_made_private(cache, tmp_path, caplog):
    d = tmp_path / "cache" / "triton"
    d.mkdir(parents=True)
    d.chmod(0o777)
    assert cache.cache_dir() == str(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert not _warnings(caplog)


def test_truncated_or_replaced_file_is_rewritten(cache, tmp_path):
    path = cache.module_path(SRC)
    good = open(path).read()
    with open(path, "w") as fh:
        fh.write(good[:-5])  # truncated
    assert cache.module_path(SRC) == path and open(path).read() == good
    os.unlink(path)
    os.symlink(str(tmp_path / "elsewhere.py"), path)  # a link is not a cache file
    assert cache.module_path(SRC) == path and not os.path.islink(path) and open(path).read() == good
    assert not (tmp_path / "elsewhere.py").exists()


# --------------------------------------------------------------------------- load runs what it verified


@pytest.mark.parametrize("race", ["overwritten", "deleted"])
def test_file_changed_after_verification_is_never_executed(cache, monkeypatch, tmp_path, race):
    """Another process rewrites or deletes the file right after ``load`` (re)wrote and checked
    it: the module still runs the text ``load`` holds, and ``inspect`` sees that text."""
    marker = str(tmp_path / "marker")
    real_write = cache.atomic_write

    def racing_write(path, text):
        real_write(path, text)
        if path.endswith(".py"):
            if race == "deleted":
                os.unlink(path)
            else:
                real_write(path, _hostile(marker))

    monkeypatch.setattr(cache, "atomic_write", racing_write)
    seen = []
    mod = cache.load(SRC, ["helper", "f"], wrap=_recorder(seen))
    assert not os.path.exists(marker), "the hostile file was executed"
    assert mod.f(5) == 36
    assert seen == EXPECTED_SOURCES
    linecache.checkcache()
    linecache.clearcache()  # inspect must not fall back to the file on disk
    assert inspect.getsource(mod.f) == EXPECTED_SOURCES[1]
    monkeypatch.setattr(cache, "atomic_write", real_write)
    mod = cache.load(SRC, ["helper", "f"], wrap=_recorder([]))  # and the file is repaired
    assert mod.f(5) == 36 and not os.path.exists(marker)
    with open(cache.module_path(SRC)) as fh:
        assert fh.read().endswith(SRC)


def test_unwritable_cache_file_is_not_an_error(cache, monkeypatch):
    def failing_write(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "atomic_write", failing_write)
    assert cache.load(SRC, ["helper", "f"], wrap=_recorder([])).f(1) == 8


KERNEL_SRC = """\
import triton
import triton.language as tl


def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)
"""


@pytest.mark.parametrize("change", ["rewritten", "rewritten+linecache_cleared", "deleted+linecache_cleared"])
def test_interpreter_reads_the_verified_source_at_first_launch(cache, change):
    """Under TRITON_INTERPRET=1 the kernel's source is read (``inspect``) at its first launch,
    not at ``load``: a file changed in between must not change what runs."""
    import torch

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only")
    mod = cache.load(KERNEL_SRC, ["kernel"])
    path = cache.module_path(KERNEL_SRC)
    if change.startswith("rewritten"):
        with open(path) as fh:
            text = fh.read()
        with open(path, "w") as fh:  # same layout, different arithmetic
            fh.write(text.replace("* 2.0", "* 3.0"))
    else:
        os.unlink(path)
    linecache.checkcache()
    if change.endswith("cleared"):
        linecache.clearcache()
    assert "* 2.0" in inspect.getsource(mod.kernel.fn)  # neither "* 3.0" nor "source not found"
    x = torch.arange(6, dtype=torch.float32)
    out = torch.empty_like(x)
    mod.kernel[(1,)](x, out, x.numel(), BLOCK=8)
    torch.testing.assert_close(out, x * 2)


# --------------------------------------------------------------------------- stress: several processes

STRESS_LOADERS = 3
STRESS_SECONDS = 6.0


def _import_cache(cache_py: str):
    """``codegen/triton/cache.py`` (and the ``codegen/diskcache.py`` it imports) without importing
    fxforge and torch: the codegen directory stands as a package of its own."""
    import types

    triton_dir = os.path.dirname(cache_py)
    for name, path in (("fxforge_codegen_under_test", os.path.dirname(triton_dir)),
                       ("fxforge_codegen_under_test.triton", triton_dir)):
        pkg = types.ModuleType(name)
        pkg.__path__ = [path]
        sys.modules.setdefault(name, pkg)
    return importlib.import_module("fxforge_codegen_under_test.triton.cache")


def _stress_loader(cache_py, base, ready, go, stop, out):
    os.environ["FXFORGE_CACHE_DIR"] = base
    cache = _import_cache(cache_py)
    cache.load(SRC, ["helper", "f"], wrap=_recorder([]))  # warm: triton imported, dir made
    ready.put(os.getpid())
    go.wait(60)
    loads = raised = wrong = 0
    errors: dict[str, int] = {}
    end = time.monotonic() + STRESS_SECONDS
    while time.monotonic() < end and not stop.is_set():
        loads += 1
        seen: list = []
        try:
            mod = cache.load(SRC, ["helper", "f"], wrap=_recorder(seen))
            if mod.f(5) != 36 or seen != EXPECTED_SOURCES:
                wrong += 1
        except Exception as e:  # noqa: BLE001 - counted and reported
            raised += 1
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
    with open(out, "w") as fh:
        json.dump({"loads": loads, "raised": raised, "wrong": wrong, "errors": errors}, fh)


def _stress_deleter(path, ready, go, stop):
    ready.put(os.getpid())
    go.wait(60)
    while not stop.is_set():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _stress_overwriter(path, marker, ready, go, stop):
    hostile = _hostile(marker)
    tmp = os.path.join(os.path.dirname(path), "hostile.partial")
    ready.put(os.getpid())
    go.wait(60)
    i = 0
    while not stop.is_set():
        i += 1
        try:
            if i % 2:  # complete hostile file, atomically
                with open(tmp, "w") as fh:
                    fh.write(hostile)
                os.replace(tmp, path)
            else:  # in place: readers can also see it empty or half-written
                with open(path, "w") as fh:
                    fh.write(hostile)
        except OSError:
            pass


def test_stress_concurrent_delete_and_hostile_overwrite(cache, tmp_path):
    """3 processes load the same kernel for 6 s while one deletes its cache file in a loop and
    one overwrites it with hostile content (which would leave a marker file if executed)."""
    ctx = multiprocessing.get_context("spawn")
    base = str(tmp_path / "cache")
    path = cache.module_path(SRC)
    marker = str(tmp_path / "marker")
    ready, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    outs = [str(tmp_path / f"loader{i}.json") for i in range(STRESS_LOADERS)]
    procs = [ctx.Process(target=_stress_loader, args=(cache.__file__, base, ready, go, stop, o)) for o in outs]
    procs.append(ctx.Process(target=_stress_deleter, args=(path, ready, go, stop)))
    procs.append(ctx.Process(target=_stress_overwriter, args=(path, marker, ready, go, stop)))
    # bounded: 15 s to start, 6 s of loads (+4 s to finish), 3 s to stop; then stragglers are killed
    try:
        for p in procs:
            p.start()
        started = time.monotonic() + 15
        for _ in procs:
            try:
                ready.get(timeout=max(0.1, started - time.monotonic()))
            except queue.Empty:
                pytest.fail("the stress workers did not start within 15 s")
        go.set()
        finish = time.monotonic() + STRESS_SECONDS + 4
        for p in procs[:STRESS_LOADERS]:
            p.join(max(0.1, finish - time.monotonic()))
    finally:
        stop.set()
        stopped = time.monotonic() + 3
        for p in procs:
            p.join(max(0.1, stopped - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(1)
    results = []
    for o in outs:
        assert os.path.exists(o), "a loader process died or hung (no result)"
        with open(o) as fh:
            results.append(json.load(fh))
    loads = sum(r["loads"] for r in results)
    raised = sum(r["raised"] for r in results)
    wrong = sum(r["wrong"] for r in results)
    executed = open(marker).read().count("executed") if os.path.exists(marker) else 0
    errors = [r["errors"] for r in results]
    print(f"stress: {loads} loads, {raised} raised {errors}, {wrong} wrong results, {executed} hostile executions")
    assert loads >= 10 * STRESS_LOADERS, results
    assert (raised, wrong, executed) == (0, 0, 0), (
        f"{loads} loads: {raised} raised {errors}, {wrong} wrong results or sources, "
        f"{executed} executions of the hostile file"
    )


# --------------------------------------------------------------------------- unsafe directories


def _assert_fell_back(cache, caplog, refused: str, problem: str) -> str:
    d = cache.cache_dir()
    assert d != refused and not d.startswith(refused + os.sep)
    st = os.lstat(d)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    (msg,) = _warnings(caplog)
    assert refused in msg and problem in msg and "FXFORGE_CACHE_DIR" in msg and d in msg
    assert cache.cache_dir() == d and len(_warnings(caplog)) == 1  # one process, one dir, one warning
    mod = cache.load(SRC, ["helper", "f"], wrap=_recorder([]))  # the cache works from there
    assert mod.f(1) == 8 and os.path.exists(os.path.join(d, f"fxk_{cache.source_key(SRC)}.py"))
    return d


def test_symlinked_triton_dir_is_refused_not_followed(cache, tmp_path, caplog):
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o777)
    (tmp_path / "cache").mkdir(mode=0o700)
    os.symlink(str(target), str(tmp_path / "cache" / "triton"))
    _assert_fell_back(cache, caplog, str(tmp_path / "cache" / "triton"), "symbolic link")
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 and not list(target.iterdir())  # untouched


def test_symlinked_base_dir_is_refused_not_followed(cache, monkeypatch, tmp_path, caplog):
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    os.symlink(str(target), str(link))
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(link))
    _assert_fell_back(cache, caplog, str(link), "symbolic link")
    assert not list(target.iterdir())  # nothing created through the link


def test_dangling_symlink_base_dir_is_refused_nothing_created(cache, monkeypatch, tmp_path, caplog):
    link = tmp_path / "link"
    os.symlink(str(tmp_path / "nowhere"), str(link))
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(link))
    _assert_fell_back(cache, caplog, str(link), "symbolic link")
    assert not (tmp_path / "nowhere").exists()


def test_base_dir_that_is_a_file_is_refused(cache, monkeypatch, tmp_path, caplog):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path / "file"))
    _assert_fell_back(cache, caplog, str(tmp_path / "file"), "not a directory")


def test_foreign_owned_base_dir_is_refused(cache, monkeypatch, tmp_path, caplog):
    (tmp_path / "cache").mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path / "cache").st_uid + 4242)
    monkeypatch.setattr(os, "getuid", os.geteuid)
    _assert_fell_back(cache, caplog, str(tmp_path / "cache"), "owned by uid")


def _fake_owner(monkeypatch, path, uid):
    """``os.fstat`` and ``os.stat`` report ``uid`` as the owner of ``path`` (we cannot chown as a
    normal user)."""
    target = os.stat(path)

    def fake(real):
        def stat_(*a, **k):
            st = real(*a, **k)
            if (st.st_dev, st.st_ino) != (target.st_dev, target.st_ino):
                return st
            fields = list(st[:10])
            fields[4] = uid
            return os.stat_result(fields)

        return stat_

    monkeypatch.setattr(os, "fstat", fake(os.fstat))
    monkeypatch.setattr(os, "stat", fake(os.stat))


@pytest.mark.parametrize("how", ["chown", "fake_stat"])
def test_foreign_owned_triton_dir_is_refused(cache, monkeypatch, tmp_path, caplog, how):
    d = tmp_path / "cache" / "triton"
    d.mkdir(parents=True, mode=0o700)
    if how == "chown":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(d, 4242, 4242)  # really someone else's
    else:
        _fake_owner(monkeypatch, d, os.geteuid() + 4242)
    _assert_fell_back(cache, caplog, str(d), "owned by uid")


def test_world_writable_triton_dir_that_cannot_be_made_private_is_refused(cache, monkeypatch, tmp_path, caplog):
    d = tmp_path / "cache" / "triton"
    d.mkdir(parents=True)
    d.chmod(0o777)

    def denied(*a, **k):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", denied)
    monkeypatch.setattr(os, "fchmod", denied)
    _assert_fell_back(cache, caplog, str(d), "writable by group/others")


def test_group_writable_base_dir_is_refused_not_chmodded(cache, monkeypatch, tmp_path, caplog):
    base = tmp_path / "shared"
    base.mkdir()
    base.chmod(0o775)
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(base))
    _assert_fell_back(cache, caplog, str(base), "writable by group/others")
    assert stat.S_IMODE(base.stat().st_mode) == 0o775  # the user's directory keeps its mode


def test_sticky_world_writable_base_dir_is_accepted(cache, monkeypatch, tmp_path, caplog):
    base = tmp_path / "tmp-like"
    base.mkdir()
    base.chmod(0o1777)  # like /tmp: nobody else can rename or delete our triton dir
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(base))
    assert cache.cache_dir() == str(base / "triton")
    assert stat.S_IMODE((base / "triton").stat().st_mode) == 0o700
    assert stat.S_IMODE(base.stat().st_mode) == 0o1777 and not _warnings(caplog)


def test_one_fallback_dir_per_process_one_warning_per_dir(cache, monkeypatch, tmp_path, caplog):
    links = []
    for name in ("a", "b"):
        os.symlink(str(tmp_path), str(tmp_path / name))
        links.append(str(tmp_path / name))
    monkeypatch.setenv("FXFORGE_CACHE_DIR", links[0])
    d = cache.cache_dir()
    monkeypatch.setenv("FXFORGE_CACHE_DIR", links[1])
    assert cache.cache_dir() == d and cache.cache_dir() == d
    msgs = _warnings(caplog)
    assert len(msgs) == 2 and links[0] in msgs[0] and links[1] in msgs[1]
