"""Building a wrapper's C kernels: translation units compiled in parallel, each cached on disk.

The kernels of one wrapper (``CUnit``, filled by ``backend.compile_group``) are split into
translation units as they are emitted: each distinct kernel once (a kernel's C function is
named after its text, ``abi.c_function``: the same kernel twice in a wrapper is one
function), in the order they come, a unit ending after a kernel chosen by its name's hash with a
chance of its source's size over ``UNIT_BYTES`` (so about that much source a unit, and where a
unit ends depends on its own kernels alone: a wrapper that gained, lost or changed a kernel
rebuilds the unit it lands in).  A unit is compiled as soon as it ends, while the wrapper's
other kernels are still being emitted, by concurrent C compiler runs (``$CC``, else ``cc``), one
per available core, and the last units as soon as the last kernel is emitted (``CUnit.seal``:
a region's body builds while its caller's passes run); the wrapper, once finished, waits for
them (``launcher.link``, which also binds each kernel to the wrapper global ``<kernel>_c``).
A unit's source is the prelude and its kernels: no ``Python.h``.

A shared object is named by a hash of the source, the compiler's version, the flags and this
machine's CPU flags, in ``$FXFORGE_CACHE_DIR/c`` (the same checked private directory as the
Triton kernels' cache, ``codegen/diskcache.py``): a later process with the same kernels loads it
without compiling.

``FXFORGE_C_SANITIZE=1`` in the environment adds ``-fsanitize=address,undefined`` (and frame
pointers) to every build, kernels and launcher alike (a cache entry of its own): the process
must then have the sanitizer runtime preloaded (``make test-sanitize`` does that).

Flags: ``-O2 -ftree-vectorize -fvect-cost-model=dynamic -march=native`` (vector code for this CPU:
the kernels run as fast as at ``-O3``, which took 4.7x as long to compile a 128-kernel wrapper,
2.3 s against 0.5 s), ``-ffp-contract=off`` (no fused multiply-add: eager rounds ``a * b`` and
``+ c`` separately), ``-fno-math-errno`` (``sqrtf`` is an instruction), ``-mprefer-vector-width=512``
on x86 (AVX-512 where this CPU has it: the ``fx_expf`` loops run 1.5x faster than at gcc's
default 256 bits), ``-fopenmp-simd`` (the ``omp simd`` reductions of row folds: their sums may be
taken in vector lanes, as eager's reductions are), or ``-fopenmp`` where kernels run on torch's
OpenMP threads too (``openmp``); nothing else reorders floating-point arithmetic.  ``-fwrapv``:
integer arithmetic wraps as eager's does (``abs`` of the most negative int64 is itself; without
it the compiler may assume it is not negative).  Kernels too short for -O2 to pay
(``schedule.QUICK_BUILD_MAX_WORK``) are built at ``-O1`` (the rest the same), in units of their own.

Tiered builds (``CUnit.tiered``, ``Config.tiered_builds``): a unit whose shared object is not
cached is first built at ``-Og`` (the other flags the same), a third of the compiler's time at
``-O1``, its kernels up to about four times slower; the wrapper runs with those kernels while the unit is
built again with the flags above in the background (``CUnit.upgrade``), and each kernel is bound
anew once its unit is (``Wrapper.load``).  The two builds compute the same values, rounded the same
except where a reduction is summed in vector lanes or a vector math function is called (-Og
vectorizes neither): within a few ulp, as eager's reductions differ between thread counts.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import sympy
import torch

from ..diskcache import atomic_write, cache_dir
from ..ir.lowering import Param
from .abi import CEmitted
from .prelude import PRELUDE

FLAGS = ("-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic", "-march=native", "-fopenmp-simd", "-fwrapv",
         "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-std=c11", "-shared", "-fPIC") + (
    ("-mprefer-vector-width=512",) if platform.machine().lower() in ("x86_64", "amd64") else ())
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined", "-g1")
# About this much kernel source a translation unit (``CUnit``): enough that a compiler run's own
# cost (the prelude's headers) is small next to its kernels', little enough that a large
# wrapper's units keep every core busy and a change rebuilds little.
UNIT_BYTES = 64 * 1024
# The name of the threads running a tiered unit's full builds (``CUnit.upgrade``).
UPGRADE_THREADS = "fxforge-cc-upgrade"


def flags(parallel: bool = False, quick: bool = False, march: str | None = None, first: bool = False) -> tuple[str, ...]:
    """The compiler flags of every build (``FLAGS``; with ``SANITIZE_FLAGS`` under
    ``FXFORGE_C_SANITIZE=1``); ``parallel``: ``-fopenmp`` for ``-fopenmp-simd`` (``openmp``);
    ``quick``: ``-O1`` for ``-O2`` (the vectorizer kept: kernels whose run time is too short for
    more to pay, ``schedule.QUICK_BUILD_MAX_WORK``); ``march``: the CPU to build for instead of
    this one (``x86-64-v3``: a package's builds, ``fxforge.package``); ``first``: ``-Og``, a
    tiered unit's first build (module docstring)."""
    sanitize = os.environ.get("FXFORGE_C_SANITIZE", "").strip().lower() in ("1", "true", "yes", "on")
    out = FLAGS + SANITIZE_FLAGS if sanitize else FLAGS
    swap = {"-fopenmp-simd": "-fopenmp" if parallel else None, "-O2": "-Og" if first else "-O1" if quick else None,
            "-march=native": f"-march={march}" if march else None}
    return tuple(swap.get(f) or f for f in out)


def jobs() -> int:
    """Concurrent compiler runs: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


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
def _identity(cc: str, flags: tuple[str, ...]) -> str:
    """What a cached shared object depends on besides its source: the compiler, its flags and this CPU."""
    from ...infra.host import cpu_field

    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    return "\0".join([cc, version, " ".join(flags), cpu_field("flags")])


# Float functions a C library may compute on vectors (glibc's libmvec: ``_ZGVeN16v_sinf``...), each
# for float32 (``sinf``) and float64 (``sin``).  Where the library has them, kernels call them by
# their C names, declared ``simd`` (``vector_math_declarations``): the compiler vectorizes loops
# calling them, within 4 ulp of eager's (sinh and cosh are left out: near float32's overflow they
# return finite values where eager's are infinite).  The first set needs glibc 2.35; the second,
# 2.22.
VECTOR_MATH = (("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
                "asinh", "acosh", "atanh", "tanh", "erf", "erfc"),
               ("exp", "log", "sin", "cos"))
VECTOR_MATH_LIBS = ("-lmvec",)


def vector_math_declarations(names) -> str:
    """C declarations of the float functions ``names`` (``VECTOR_MATH``) with their vector variants."""
    return "".join(f'__attribute__((simd("notinbranch"))) float {n}f(float);\n'
                   f'__attribute__((simd("notinbranch"))) double {n}(double);\n' for n in sorted(names))


def vector_math() -> frozenset[str]:
    """The ``VECTOR_MATH`` functions this machine's C compiler and library compute on vectors
    (empty: none, or no compiler): found by building a kernel calling them, linked with every
    symbol resolved; cached like kernels, so a later process with the same compiler builds
    nothing."""
    cc = compiler()
    return _vector_math(cc, flags()) if cc is not None else frozenset()


@functools.lru_cache(maxsize=None)
def _vector_math(cc: str, flags: tuple[str, ...]) -> frozenset[str]:
    for names in VECTOR_MATH:
        loops = "".join(f"    for (int64_t i = 0; i < n; i++) {{ y[i] += {f}f(x[i]); z[i] += {f}(w[i]); }}\n"
                        for f in names)
        source = (PRELUDE + vector_math_declarations(names) + "void fx_vector_math_probe(float* restrict y, const float* "
                  "restrict x, double* restrict z, const double* restrict w, int64_t n)\n{\n" + loops + "}\n")
        try:
            shared_object(source, cc=cc, libs=VECTOR_MATH_LIBS + ("-Wl,-z,defs",))
            return frozenset(names)
        except (CompileError, OSError, subprocess.SubprocessError):
            continue
    return frozenset()


def openmp() -> bool:
    """Whether kernels are built with ``-fopenmp``: their ``omp parallel`` loops then run on the
    OpenMP runtime torch itself runs on (GNU libgomp, loaded with torch: one thread pool, the
    thread count ``torch.set_num_threads`` sets, nested calls serial), found by building and
    running a parallel loop once per compiler (cached like kernels).  Otherwise, or under
    ``FXFORGE_C_THREADS=1``, the kernels run on the calling thread."""
    cc = compiler()
    if cc is None or os.environ.get("FXFORGE_C_THREADS", "").strip() == "1":
        return False
    return _openmp(cc, flags())


_OPENMP_PROBE = """#include <stdint.h>
int64_t fx_openmp_probe(int64_t n)
{
    int64_t s = 0;
    #pragma omp parallel for reduction(+:s)
    for (int64_t i = 0; i < n; i++) s += i;
    return s;
}
"""


@functools.lru_cache(maxsize=None)
def _openmp(cc: str, flags: tuple[str, ...]) -> bool:
    import ctypes

    import torch

    if not torch._C.has_openmp or "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return False  # torch runs its own thread pool: a second one would oversubscribe the cores
    try:
        with open("/proc/self/maps") as f:
            if "libgomp" not in f.read():
                return False  # (not Linux, or torch on another OpenMP runtime)
        path = shared_object(_OPENMP_PROBE, cc=cc, parallel=True)
        with open(path, "rb") as f:
            if b"libgomp.so.1\0" not in f.read():
                return False  # the compiler's runtime is not torch's (clang's libomp...)
        probe = ctypes.CDLL(path).fx_openmp_probe
        probe.restype, probe.argtypes = ctypes.c_int64, [ctypes.c_int64]
        return probe(1000) == 499500
    except (CompileError, OSError, subprocess.SubprocessError):
        return False


def _compile(cc: str, src: str, out: str, include: str | None = None, libs: tuple[str, ...] = (),
             parallel: bool = False, quick: bool = False, march: str | None = None,
             first: bool = False) -> subprocess.CompletedProcess:
    # an extension module leaves the interpreter's symbols to be found when it is loaded: the
    # default on Linux, asked for on macOS
    inc = [f"-I{include}"] + (["-undefined", "dynamic_lookup"] if platform.system() == "Darwin" else []) \
        if include else []
    # the compiler is not to run under a sanitizer runtime this process preloads (make test-sanitize)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    return subprocess.run(
        [cc, *flags(parallel, quick, march, first), *inc, src, "-o", out, *libs, "-lm"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def ends_unit(k: CEmitted) -> bool:
    """Whether a translation unit ends after kernel ``k``: by its name's hash, with a chance of
    its source's size over ``UNIT_BYTES``."""
    return int(hashlib.sha256(k.symbol.encode()).hexdigest()[:8], 16) / 2**32 < len(k.c_source) / UNIT_BYTES


@dataclass
class CUnit:
    """The C kernels of one wrapper (``add``), split into translation units as they come and
    compiled in the background once a unit ends (module docstring); ``built`` waits for them.
    Quick kernels (``CEmitted.quick``: built at -O1) and the others go to units of their own.
    ``tiered``: a unit not cached is built at -Og first, and again in full by ``upgrade``."""

    kernels: list[CEmitted] = field(default_factory=list)
    debug: bool = False  # each kernel checks its tensors' layouts before it runs (``launcher.layout_check``)
    background: bool = False  # compile each unit as soon as it ends (``add``)
    emitted: Any = None  # the emitter's kernels by group structure (``reuse.Emitted``), while it adds them
    tiered: bool = False

    def __post_init__(self):
        self._seen: set[str] = set()
        self._split = 0  # kernels placed in units
        self._closed: list[tuple[bool, list[CEmitted]]] = []  # (quick, kernels)
        self._open: dict[bool, list[CEmitted]] = {False: [], True: []}
        self._builds: list[Future] = []  # of the closed units, in order: (path, built first at -Og)
        self._pool: ThreadPoolExecutor | None = None
        self._first: list[tuple[str, list[str], bool]] = []  # the units built at -Og (``built``), for ``upgrade``
        self.upgraded: Future | None = None  # the full builds' bindings (``launcher.link``)

    def add(self, k: CEmitted) -> None:
        self.kernels.append(k)
        self._place()
        self._submit()

    def ahead(self, k: CEmitted) -> None:
        """``k``'s C function built with the unit's kernels, no launch bound to it: a kernel
        emitted before the wrapper's plan (``backend.kernels_ahead``).  The kernel ``add``ed later
        with the same function (its symbol) finds it in a unit already."""
        self._put(k)
        self._submit()

    def seal(self) -> None:
        """Every kernel is emitted: the units still open end here and, where units build in the
        background, start building now rather than when ``built`` asks for them (a region's
        body is linked with its caller, whose passes and kernels run meanwhile)."""
        self.emitted = None
        self._place()
        for quick, ks in self._open.items():
            if ks:
                self._closed.append((quick, ks))
                self._open[quick] = []
        self._submit()

    def _submit(self) -> None:
        """The units closed since the last call, submitted to build in the background."""
        if self.background:
            while len(self._builds) < len(self._closed):
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(jobs(), thread_name_prefix="fxforge-cc")
                quick, kernels = self._closed[len(self._builds)]
                self._builds.append(self._pool.submit(self._build, self._source(kernels), quick))

    def _place(self) -> None:
        for k in self.kernels[self._split:]:
            self._put(k)
        self._split = len(self.kernels)

    def _put(self, k: CEmitted) -> None:
        """``k``'s function in the open unit of its kind, unless a unit has it; the unit closed
        where it ends there (``ends_unit``)."""
        if k.symbol not in self._seen:
            self._seen.add(k.symbol)
            self._open[k.quick].append(k)
            if ends_unit(k):
                self._closed.append((k.quick, self._open[k.quick]))
                self._open[k.quick] = []

    @staticmethod
    def _source(kernels: list[CEmitted]) -> str:
        return PRELUDE + vector_math_declarations(vector_math()) + "\n" + "\n".join(k.c_source for k in kernels)

    def _build(self, source: str, quick: bool) -> tuple[str, bool]:
        """A unit's shared object for now, and whether it is a first (-Og) build: the full build
        where it is cached or the unit is not tiered."""
        first = self.tiered and cached_object(source, self.libs(), openmp(), quick) is None
        return shared_object(source, libs=self.libs(), parallel=openmp(), quick=quick, first=first), first

    def units(self) -> list[tuple[str, list[str], bool]]:
        """The translation units (module docstring): each one's source, the symbols it defines
        and whether it is built quick (``flags``).  Each unit declares the vector math functions
        (``vector_math``), and is linked with their library (``libs``)."""
        self._place()
        units = self._closed + [(quick, ks) for quick, ks in self._open.items() if ks]
        return [(self._source(ks), [k.symbol for k in ks], quick) for quick, ks in units]

    def built(self) -> list[tuple[str, list[str]]]:
        """Each unit's shared object (compiled unless cached; at -Og first where ``tiered``) and
        the symbols it defines: the units compiling in the background waited for, the rest
        compiled side by side."""
        self.seal()  # (every kernel is emitted by now; a wrapper has sealed its unit already)
        units = self.units()
        try:
            done = [f.result() for f in self._builds]
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
        done += side_by_side(lambda u: self._build(u[0], u[2]), units[len(done):])
        self._first = [u for u, (_, first) in zip(units, done) if first]
        return [(path, symbols) for (path, _), (_, symbols, _) in zip(done, units)]

    def upgrade(self, then: Callable[[list[tuple[str, list[str]]]], Any]) -> Future | None:
        """``then`` of the full builds of the units ``built`` made at -Og (each one's shared
        object and symbols), computed in the background: a thread of its own running the builds
        side by side, which the process waits for before it exits, so that the next one finds
        every unit cached in full.  None where every unit was built in full."""
        if not self._first:
            return None
        todo = self._first
        directory = cache_dir("c")  # (the one the first builds went to, whatever the environment says later)

        def full(u: tuple[str, list[str], bool]) -> tuple[str, list[str]]:
            return shared_object(u[0], libs=self.libs(), parallel=openmp(), quick=u[2], directory=directory), u[1]

        pool = ThreadPoolExecutor(1, thread_name_prefix=UPGRADE_THREADS)
        try:
            return pool.submit(lambda: then(side_by_side(full, todo, UPGRADE_THREADS)))
        finally:
            pool.shutdown(wait=False)

    @property
    def unused(self) -> int:
        """Functions in the units that no kernel launches: built ahead of the plan
        (``ahead``) for a group the plan then gave another layout."""
        return len(self._seen - {k.symbol for k in self.kernels})

    @property
    def first_built(self) -> int:
        """The kernels (distinct C functions) ``built`` made at -Og."""
        return sum(len(symbols) for _, symbols, _ in self._first)

    @staticmethod
    def libs() -> tuple[str, ...]:
        """Linker arguments of every unit."""
        return VECTOR_MATH_LIBS if vector_math() else ()


def shared_objects(sources: list[tuple[str, bool]], libs: tuple[str, ...] = (), parallel: bool = False,
                   march: str | None = None) -> list[str]:
    """``shared_object`` of each (source, quick), linked with ``libs``, for ``march`` (default:
    this CPU), the compiler runs side by side (``jobs``)."""
    return side_by_side(lambda unit: shared_object(unit[0], libs=libs, parallel=parallel, quick=unit[1], march=march),
                        sources)


def side_by_side(fn, items: list, threads: str = "") -> list:
    """``[fn(x) for x in items]``, up to ``jobs()`` at once (each runs a compiler process), on
    threads named ``threads``."""
    if len(items) <= 1 or jobs() == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(jobs(), len(items)), thread_name_prefix=threads) as pool:
        return list(pool.map(fn, items))


def _object_path(source: str, cc: str, libs: tuple[str, ...], flag_set: tuple[str, ...],
                 directory: str | None = None) -> str:
    key = hashlib.sha256("\0".join([_identity(cc, flag_set), *libs, source]).encode()).hexdigest()[:40]
    return os.path.join(directory or cache_dir("c"), f"k{key}.so")


def cached_object(source: str, libs: tuple[str, ...] = (), parallel: bool = False, quick: bool = False) -> str | None:
    """The cached shared object ``shared_object`` would return for these arguments without
    compiling, or None."""
    cc = compiler()
    if cc is None:
        return None
    path = _object_path(source, cc, libs, flags(parallel, quick))
    return path if os.path.isfile(path) and not os.path.islink(path) else None


def shared_object(source: str, include: str | None = None, cc: str | None = None, libs: tuple[str, ...] = (),
                  parallel: bool = False, quick: bool = False, march: str | None = None, first: bool = False,
                  directory: str | None = None) -> str:
    """The path of the shared object built from ``source`` (compiled unless cached) by ``cc``
    (default: ``compiler()``), with ``include`` (``Python.h``'s directory) on the include path,
    linked with ``libs`` (linker arguments); ``parallel``: with ``-fopenmp`` (``openmp``);
    ``quick``: at ``-O1``; ``march``: for that CPU instead of this one; ``first``: at ``-Og``
    (``flags``); ``directory``: the cache's (default: ``cache_dir("c")`` now)."""
    cc = cc or compiler()
    if cc is None:
        raise CompileError("no C compiler: install gcc or clang, or set CC")
    path = _object_path(source, cc, libs, flags(parallel, quick, march, first), directory)
    directory = os.path.dirname(path)
    if os.path.isfile(path) and not os.path.islink(path):
        return path
    fd, src = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".c")
    out = src[:-2] + ".so"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        run = _compile(cc, src, out, include, libs, parallel, quick, march, first)
        if run.returncode != 0:
            kept = os.path.join(directory, "failed-" + os.path.basename(path)[:-3] + ".c")
            shutil.copyfile(src, kept)
            raise CompileError(f"{cc} failed ({run.returncode}) on {kept}:\n{run.stderr[-4000:]}")
        os.replace(out, path)
        atomic_write(path[:-3] + ".c", source)  # for people reading the kernels
    finally:
        for p in (src, out):
            try:
                os.unlink(p)
            except OSError:
                pass
    return path


def seal(unit: CUnit) -> None:
    """The C backend's ``seal``: the unit's last translation units start building (``CUnit.seal``)."""
    unit.seal()


def save_unit(unit: CUnit) -> dict:
    """The unit as JSON-able data (``load_unit`` gives it back): each kernel's fields, the layouts
    its debug check compares as ints (None where symbolic)."""
    def ints(dims: tuple) -> list:
        return [int(e) if e.is_Integer else None for e in map(sympy.sympify, dims)]

    def kernel(k: CEmitted) -> dict:
        d = {f.name: getattr(k, f.name) for f in fields(k)}
        d["params"] = [[p.name, p.sig, p.launch] for p in k.params]
        d["specs"] = {p: [str(dtype).removeprefix("torch."), ints(shape), ints(stride)]
                      for p, (dtype, shape, stride) in k.specs.items()}
        return d
    return {"debug": unit.debug, "kernels": [kernel(k) for k in unit.kernels]}


def load_unit(data: dict) -> CUnit:
    """A unit saved by ``save_unit``: its shared objects are found in the cache (or built again,
    in full: a loaded unit is not tiered) when ``launcher.link`` binds it."""
    kernels = []
    for d in data["kernels"]:
        d = dict(d)
        d["params"] = [Param(*p) for p in d["params"]]
        d["specs"] = {p: (getattr(torch, dtype), tuple(shape), tuple(stride)) for p, (dtype, shape, stride) in d["specs"].items()}
        kernels.append(CEmitted(**d))
    return CUnit(kernels=kernels, debug=data["debug"])
