"""Building a wrapper's C kernels: one shared object per wrapper, compiled once, cached on disk.

The kernels of one wrapper (``CUnit``, filled by ``backend.compile_group``) are compiled together
by one C compiler run (``$CC``, else ``cc``) when the wrapper is finished (``launcher.link``,
which also binds each kernel to the wrapper global ``<kernel>_c``).  The source is the prelude
and the kernels: no ``Python.h``.

A shared object is named by a hash of the source, the compiler's version, the flags and this
machine's CPU flags, in ``$FXFORGE_CACHE_DIR/c`` (the same checked private directory as the
Triton kernels' cache, ``triton/cache.py``): a later process with the same kernels loads it
without compiling.

Flags: ``-O2 -ftree-vectorize -fvect-cost-model=dynamic -march=native`` (vector code for this CPU:
the kernels run as fast as at ``-O3``, which took 4.7x as long to compile a 128-kernel wrapper,
2.3 s against 0.5 s), ``-ffp-contract=off`` (no fused multiply-add: eager rounds ``a * b`` and
``+ c`` separately), ``-fno-math-errno`` (``sqrtf`` is an instruction), ``-mprefer-vector-width=512``
on x86 (AVX-512 where this CPU has it: the ``fx_expf`` loops run 1.5x faster than at gcc's
default 256 bits), ``-fopenmp-simd`` (the ``omp simd`` reductions of row folds: their sums may be
taken in vector lanes, as eager's reductions are; no OpenMP runtime); nothing else reorders
floating-point arithmetic.  ``-fwrapv``: integer arithmetic wraps as eager's does (``abs`` of the
most negative int64 is itself; without it the compiler may assume it is not negative).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

from ..triton.cache import atomic_write, cache_dir
from .kernel import CEmitted
from .prelude import PRELUDE

FLAGS = ("-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic", "-march=native", "-fopenmp-simd", "-fwrapv",
         "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-std=c11", "-shared", "-fPIC") + (
    ("-mprefer-vector-width=512",) if platform.machine().lower() in ("x86_64", "amd64") else ())


class CompileError(RuntimeError):
    """The C compiler rejected a wrapper's kernels (a bug in the emitter: please report it)."""


def compiler() -> str | None:
    """The C compiler's path (``$CC``, else ``cc``), or None.  Asked for every node the backend
    is offered (``backend.accepts``): the PATH search is made once per ``$CC`` and ``$PATH``."""
    return _which(os.environ.get("CC") or "cc", os.environ.get("PATH"))


@functools.lru_cache(maxsize=None)
def _which(cc: str, path: str | None) -> str | None:
    return shutil.which(cc, path=path)


@functools.lru_cache(maxsize=None)
def _identity(cc: str) -> str:
    """What a cached shared object depends on besides its source: the compiler and this CPU."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l for l in f if l.startswith("flags")), "")
    except OSError:
        pass
    return "\0".join([cc, version, " ".join(FLAGS), cpu])


def _compile(cc: str, src: str, out: str, include: str | None = None) -> subprocess.CompletedProcess:
    # an extension module leaves the interpreter's symbols to be found when it is loaded: the
    # default on Linux, asked for on macOS
    inc = [f"-I{include}"] + (["-undefined", "dynamic_lookup"] if platform.system() == "Darwin" else []) \
        if include else []
    return subprocess.run([cc, *FLAGS, *inc, src, "-o", out, "-lm"], capture_output=True, text=True, timeout=600)


@dataclass
class CUnit:
    """The C kernels of one wrapper, compiled together by ``link``."""

    kernels: list[CEmitted] = field(default_factory=list)

    def source(self) -> str:
        return PRELUDE + "\n" + "\n".join(k.c_source for k in self.kernels)


def shared_object(source: str, include: str | None = None, cc: str | None = None) -> str:
    """The path of the shared object built from ``source`` (compiled unless cached) by ``cc``
    (default: ``compiler()``), with ``include`` (``Python.h``'s directory) on the include path."""
    cc = cc or compiler()
    if cc is None:
        raise CompileError("no C compiler: install gcc or clang, or set CC")
    key = hashlib.sha256((_identity(cc) + "\0" + source).encode()).hexdigest()[:40]
    directory = cache_dir("c")
    path = os.path.join(directory, f"k{key}.so")
    if os.path.isfile(path) and not os.path.islink(path):
        return path
    fd, src = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".c")
    out = src[:-2] + ".so"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        run = _compile(cc, src, out, include)
        if run.returncode != 0:
            kept = os.path.join(directory, f"failed-k{key}.c")
            shutil.copyfile(src, kept)
            raise CompileError(f"{cc} failed ({run.returncode}) on {kept}:\n{run.stderr[-4000:]}")
        os.replace(out, path)
        atomic_write(os.path.join(directory, f"k{key}.c"), source)  # for people reading the kernels
    finally:
        for p in (src, out):
            try:
                os.unlink(p)
            except OSError:
                pass
    return path
