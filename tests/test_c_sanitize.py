"""The C builds under ``FXFORGE_C_SANITIZE=1`` (``make test-sanitize``, docs/c.md "Sanitizers").

These tests check the sanitizer run itself, so that a green ``make test-sanitize`` means the C
kernels and the launcher really ran instrumented:

* every shared object fxforge builds for a compiled function (its kernels, the launcher
  extension, the probe kernel) references AddressSanitizer's and UBSan's runtimes;
* the launcher is built and loaded in that mode (a launcher that fails to load falls back to
  ``ctypes`` with a warning, which would leave its C code untested);
* an out-of-bounds write and a too-large shift in hand-written kernels, built by
  ``build.shared_object`` and called through ``ctypes`` in a child process, end that process
  with the sanitizer's report, after an in-bounds call of the same kernels ran clean.

Outside ``FXFORGE_C_SANITIZE=1`` (the default suite) every test skips, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import fxforge
from fxforge.codegen.c import build, launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [
    pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sanitizer checks read ELF symbols (Linux)"),
    pytest.mark.skipif("-fsanitize=address,undefined" not in build.flags(),
                       reason="FXFORGE_C_SANITIZE is not set: these tests check sanitized C builds; "
                              "run them with `make test-sanitize`"),
]


def _asan_runtime_loaded() -> bool:
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


@pytest.fixture(autouse=True)
def _runtime_preloaded():
    """A sanitized shared object cannot load into an uninstrumented Python without the runtime
    preloaded: say how, rather than fail in each test with the loader's message."""
    assert _asan_runtime_loaded(), (
        "FXFORGE_C_SANITIZE=1 but the ASan runtime is not loaded in this process: preload it, e.g. "
        "LD_PRELOAD=\"$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)\" "
        "ASAN_OPTIONS=detect_leaks=0 (or run `make test-sanitize`)")


def _dynamic_symbols(path: str) -> str:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to read the shared objects' symbols")
    return subprocess.run([nm, "-D", path], capture_output=True, text=True, check=True, timeout=60).stdout


def test_kernels_and_launcher_are_built_with_the_sanitizers(monkeypatch, tmp_path, fresh_launcher):
    monkeypatch.setenv("FXFORGE_CACHE_DIR", str(tmp_path))  # a fresh cache: every object built here

    def f(x, w):
        return torch.nn.functional.gelu(x * w + 1).sum(-1)

    x, w = torch.randn(6, 40), torch.randn(40)
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    torch.testing.assert_close(torch.compile(f, backend=b, fullgraph=True)(x, w), f(x, w))
    assert "c" in {k.backend for c in b.compiled for k in c.kernels}
    if launcher.python_include() is not None and launcher._data_ptr_entry() is not None:
        assert fresh_launcher.launcher() is not None, "the launcher failed to build or load under the sanitizers"
    objects = sorted(p for p in os.listdir(tmp_path / "c") if p.endswith(".so"))
    sources = [(tmp_path / "c" / p).with_suffix(".c").read_text() for p in objects]
    assert any("fx_probe(" not in s for s in sources), objects  # at least one kernel unit, not just the probe
    for name in objects:
        symbols = _dynamic_symbols(str(tmp_path / "c" / name))
        assert "__asan_" in symbols and "__ubsan_" in symbols, f"{name} is not instrumented"


# Kernels with a bug each, called in range first: ``fill`` writes ``out[0..n]`` (n + 1 floats),
# ``shift`` shifts an int64 by ``s`` (undefined from 64 on).
_BAD_KERNELS = textwrap.dedent("""
    import ctypes, sys
    import torch
    from fxforge.codegen.c import build

    lib = ctypes.CDLL(build.shared_object('''
    #include <stdint.h>
    void fill(float* out, int64_t n) { for (int64_t i = 0; i <= n; i++) out[i] = (float)i; }
    int64_t shift(int64_t x, int64_t s) { return x << s; }
    '''))
    lib.fill.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.shift.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.shift.restype = ctypes.c_int64
    out = torch.empty(37)
    lib.fill(out.data_ptr(), 36)
    print("IN RANGE", lib.shift(1, 3), flush=True)
    if sys.argv[1] == "address":
        lib.fill(out.data_ptr(), 37)  # one float past the tensor's storage
    else:
        lib.shift(1, 70)
    print("NOT CAUGHT", flush=True)
""")


@pytest.mark.usefixtures("kernel_cache")
@pytest.mark.parametrize("bug, report", [
    ("address", ["ERROR: AddressSanitizer: heap-buffer-overflow", "WRITE of size"]),
    ("undefined", ["runtime error: shift exponent 70 is too large"]),
])
def test_a_bad_kernel_is_caught(bug, report):
    p = subprocess.run([sys.executable, "-c", _BAD_KERNELS, bug], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=dict(os.environ))
    assert "IN RANGE 8" in p.stdout, p.stdout + p.stderr[-3000:]
    assert p.returncode != 0 and "NOT CAUGHT" not in p.stdout, p.stdout + p.stderr[-3000:]
    for line in report:
        assert line in p.stderr, p.stderr[-3000:]
