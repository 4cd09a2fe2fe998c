"""Building a wrapper's C kernels: one shared object per wrapper, compiled once, cached on disk.

The kernels of one wrapper (``CUnit``, filled by ``backend.compile_group``) are compiled together
by one C compiler run (``$CC``, else ``cc``) when the wrapper is finished (``link``), and each is
bound to the wrapper global ``<kernel>_c``, called with the wrapper's tensors and sizes:

* as a function of a CPython extension module built with the kernels (``bindings``: where this
  interpreter's ``Python.h`` is installed): it reads each tensor's data pointer through torch's
  C entry point (``torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr``; a tensor
  of another type than ``torch.Tensor``/``nn.Parameter`` through its ``data_ptr()`` method, so
  that a tensor without storage raises a Python error), converts the sizes, and runs the kernel
  with the GIL released: about 0.05 µs a call against 0.6 µs through ``ctypes``;
* otherwise (no ``Python.h``, or the module fails to build: logged once) through ``ctypes``, a
  Python adapter passing each tensor's ``data_ptr()``.

The shared object is named by a hash of the source (with the bindings, the interpreter's extension
suffix), the compiler's version, the flags and this machine's CPU flags, in
``$FXFORGE_CACHE_DIR/c`` (the same checked private directory as the Triton kernels' cache,
``triton/cache.py``): a later process with the same kernels loads it without compiling.

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

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch

from ..triton.cache import atomic_write, cache_dir
from .kernel import CEmitted
from .prelude import PRELUDE

log = logging.getLogger(__name__)

FLAGS = ("-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic", "-march=native", "-fopenmp-simd", "-fwrapv",
         "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-std=c11", "-shared", "-fPIC") + (
    ("-mprefer-vector-width=512",) if platform.machine().lower() in ("x86_64", "amd64") else ())
_CTYPES = {"int64_t": ctypes.c_int64, "bool": ctypes.c_bool, "float": ctypes.c_float}


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


@functools.lru_cache(maxsize=None)
def refusal(cc: str) -> str | None:
    """Why ``cc`` cannot build fxforge's kernels (a flag it rejects...), from building a one-line
    kernel once per process, in a temporary directory; None: it can."""
    source = PRELUDE + "\nvoid fx_probe(float* out, const float* in) { out[0] = fx_expf(in[0]); }\n"
    with tempfile.TemporaryDirectory(prefix="fxforge-c-probe-") as d:
        with open(os.path.join(d, "probe.c"), "w") as f:
            f.write(source)
        try:
            run = _compile(cc, os.path.join(d, "probe.c"), os.path.join(d, "probe.so"))
        except (OSError, subprocess.SubprocessError) as e:
            return f"the C compiler {cc} cannot run: {e}"
    if run.returncode != 0:
        return f"the C compiler {cc} cannot build fxforge's kernels ({run.returncode}): {run.stderr.strip()[:500]}"
    return None


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


def shared_object(source: str, include: str | None = None) -> str:
    """The path of the shared object built from ``source`` (compiled unless cached), with
    ``include`` (``Python.h``'s directory) on the include path."""
    cc = compiler()
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


def link(unit: CUnit) -> dict[str, Any]:
    """Compile (or find) the unit's kernels and bind each to ``<name>_c``, a callable taking the
    launch function's tensors and scalars: the extension module's function (``bindings``), else
    a ``ctypes`` adapter."""
    if not unit.kernels:
        return {}
    include, data_ptr = python_include(), _data_ptr_entry()
    if include is not None and data_ptr is not None:
        try:
            module = _load_extension(shared_object(bindings(unit), include))
        except (CompileError, ImportError, OSError) as e:
            _warn_once("fxforge: the C kernels' Python bindings failed to build or load; calling the kernels "
                       "through ctypes (about 0.5 µs more a call)")
            log.debug("fxforge: the C kernels' Python bindings: %s", e)
        else:
            module._bind(data_ptr, torch.Tensor, torch.nn.Parameter)
            return {f"{k.name}_c": getattr(module, k.name) for k in unit.kernels}
    lib = ctypes.CDLL(shared_object(unit.source()))
    out = {}
    for k in unit.kernels:
        fn = getattr(lib, k.name)
        fn.argtypes = [ctypes.c_void_p if t.startswith("*") else _CTYPES[t] for t in k.c_types]
        fn.restype = None
        out[f"{k.name}_c"] = _ctypes_adapter(fn, [t.startswith("*") for t in k.c_types])
    return out


def _ctypes_adapter(fn: Any, pointers: list[bool]):
    def call(*args: Any) -> None:
        fn(*(a.data_ptr() if p else a for a, p in zip(args, pointers, strict=True)))

    return call


# ---------------------------------------------------------------- the Python bindings

BINDINGS_MODULE = "fxforge_ckernels"  # every unit's module has this name (its own file)

_BINDINGS_HEAD = """\
/* Python bindings: each kernel is a function of the module BINDINGS_MODULE, called with the
   wrapper's tensors (their data pointers read here) and sizes; the kernel runs without the GIL. */
static void* (*fx_tensor_data_ptr)(PyObject*);  /* torch's, bound by _bind */
static PyTypeObject* fx_tensor_types[2];       /* torch.Tensor, nn.Parameter: read by it directly */

static int fx_data_ptr(PyObject* obj, void** out)
{
    if (Py_IS_TYPE(obj, fx_tensor_types[0]) || Py_IS_TYPE(obj, fx_tensor_types[1])) {
        *out = fx_tensor_data_ptr(obj);
        return 0;
    }
    PyObject* ptr = PyObject_CallMethod(obj, "data_ptr", NULL);  /* raises for what has no storage */
    if (ptr == NULL)
        return -1;
    *out = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject* fx_bind(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[1]) || !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "_bind(data_ptr_entry, torch.Tensor, torch.nn.Parameter)");
        return NULL;
    }
    fx_tensor_data_ptr = (void* (*)(PyObject*))PyLong_AsVoidPtr(args[0]);
    if (PyErr_Occurred())
        return NULL;
    for (int i = 0; i < 2; i++) {
        Py_INCREF(args[i + 1]);
        fx_tensor_types[i] = (PyTypeObject*)args[i + 1];
    }
    Py_RETURN_NONE;
}
""".replace("BINDINGS_MODULE", BINDINGS_MODULE)

_SCALAR_FROM_PY = {  # C type -> its conversion from a Python object (an error: PyErr_Occurred)
    "int64_t": "(int64_t)PyLong_AsLongLong({})",
    "bool": "(bool)PyObject_IsTrue({})",
    "float": "(float)PyFloat_AsDouble({})",
}


def bindings(unit: CUnit) -> str:
    """The unit's kernels and a CPython extension module ``BINDINGS_MODULE`` exposing each of
    them as a function of the launch function's arguments (tensors, then sizes)."""
    py = sysconfig.get_config_var("EXT_SUFFIX") or ""
    lines = [f"/* {py} */", "#define PY_SSIZE_T_CLEAN", "#include <Python.h>", unit.source(), _BINDINGS_HEAD]
    methods = ['    {"_bind", (PyCFunction)(void (*)(void))fx_bind, METH_FASTCALL, NULL},']
    for k in unit.kernels:
        n = len(k.c_types)
        body = [f"if (nargs != {n}) {{",
                f'    PyErr_Format(PyExc_TypeError, "{k.name} takes {n} arguments (%zd given)", nargs);',
                "    return NULL;", "}"]
        args = []
        for i, t in enumerate(k.c_types):
            if t.startswith("*"):
                body += [f"void* a{i};", f"if (fx_data_ptr(args[{i}], &a{i}) < 0)", "    return NULL;"]
            else:
                body += [f"const {t} a{i} = {_SCALAR_FROM_PY[t].format(f'args[{i}]')};",
                         "if (PyErr_Occurred())", "    return NULL;"]
            args.append(f"a{i}")
        body += ["Py_BEGIN_ALLOW_THREADS", f"{k.name}({', '.join(args)});", "Py_END_ALLOW_THREADS", "Py_RETURN_NONE;"]
        lines += [f"static PyObject* fx_py_{k.name}(PyObject* self, PyObject* const* args, Py_ssize_t nargs)", "{"]
        lines += ["    " + l for l in body] + ["}", ""]
        methods.append(f'    {{"{k.name}", (PyCFunction)(void (*)(void))fx_py_{k.name}, METH_FASTCALL, NULL}},')
    lines += ["static PyMethodDef fx_methods[] = {", *methods, "    {NULL, NULL, 0, NULL}", "};", "",
              f'static struct PyModuleDef fx_module = {{PyModuleDef_HEAD_INIT, "{BINDINGS_MODULE}", NULL, -1, fx_methods}};',
              "", f"PyMODINIT_FUNC PyInit_{BINDINGS_MODULE}(void) {{ return PyModule_Create(&fx_module); }}", ""]
    return "\n".join(lines)


@functools.lru_cache(maxsize=None)
def python_include() -> str | None:
    """The directory of this interpreter's ``Python.h``, or None: the kernels are then called
    through ``ctypes``."""
    include = sysconfig.get_paths().get("include")
    return include if include and os.path.isfile(os.path.join(include, "Python.h")) else None


def _data_ptr_entry() -> int | None:
    """The address of torch's C function giving a tensor object's data pointer, or None."""
    entry = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    entry = getattr(entry, "_torchinductor_pyobject_tensor_data_ptr", None)
    return entry if isinstance(entry, int) and entry else None


def _load_extension(path: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(BINDINGS_MODULE, path)
    spec = importlib.util.spec_from_file_location(BINDINGS_MODULE, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    log.warning(message)
