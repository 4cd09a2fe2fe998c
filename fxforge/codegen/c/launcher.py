"""Calling a wrapper's C kernels from Python.

Every C kernel has one signature, ``int k(void* const* fx_ptrs, const int64_t* fx_ints, const
double* fx_floats, int64_t* fx_err)`` (``abi.c_head``), so one small CPython extension module, the launcher,
calls them all: ``link`` binds each kernel of a compiled unit to the wrapper global ``<kernel>_c``,
a launcher object holding the kernel's address and its parameters' kinds (``CEmitted.kinds``).
Called with the wrapper's tensors and sizes, it reads each tensor's data pointer through torch's
C entry point (``torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr``; a tensor of
another type than ``torch.Tensor``/``nn.Parameter`` through its ``data_ptr()`` method, so that a
tensor without storage raises a Python error), converts the sizes, and runs the kernel with the
GIL released: about a tenth of a call through ``ctypes``.  A kernel returning nonzero
raises the Python error ``KERNEL_ERRORS`` names (a class target out of bounds: eager's
``IndexError``).

The kernels' own shared objects need no ``Python.h`` (the CPython headers would add about 0.08 s
to each compiler run, and per-kernel binding functions about 5 ms a kernel more).  The launcher
is built once per compiler, CPU and interpreter and cached with the kernels
(``build.shared_object``); it carries a one-line kernel, so that building it is also the check
that the compiler builds fxforge's kernels (``refusal``).  Where ``Python.h`` is missing, torch
lacks the data-pointer entry, or the launcher fails to build or load (logged once per process),
the kernels are called through ``ctypes`` adapters passing each tensor's ``data_ptr()``.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import logging
import operator
import os
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ...core.graph import expr
from .abi import KERNEL_ERRORS, kernel_error
from .build import CompileError, CUnit, shared_object, vector_math
from .prelude import PRELUDE

log = logging.getLogger(__name__)

LAUNCHER_MODULE = "fxforge_c_launcher"

# a kernel using the prelude's helpers: built with fxforge's flags, it shows the compiler takes them
_PROBE = PRELUDE + "\nvoid fx_probe(float* out, const float* in) { out[0] = fx_expf(in[0]); }\n"

_LAUNCHER = r"""
/* fxforge's C kernel launcher: a Kernel object calls one kernel of a compiled unit with the
   wrapper's tensors (their data pointers read here) and sizes, without the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#ifndef Py_TPFLAGS_HAVE_VECTORCALL
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL
#endif

typedef int (*fx_entry)(void* const*, const int64_t*, const double*, int64_t*);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    fx_entry entry;
    PyObject* name;        /* str: the kernel's name, for errors and repr */
    char* kinds;           /* per argument: 'p' tensor, 'i' int64, 'b' bool, 'f' float */
    Py_ssize_t nargs, nptrs, nints, nfloats;
    PyObject* check;       /* NULL, or called with the arguments first (FXFORGE_DEBUG: their layouts) */
} FxKernel;

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

/* FX_ERRORS */

static PyObject* fx_kernel_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames)
{
    FxKernel* k = (FxKernel*)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n != k->nargs || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_Format(PyExc_TypeError, "%U takes %zd positional arguments (%zd given)", k->name, k->nargs,
                     n + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0));
        return NULL;
    }
    if (k->check != NULL) {
        PyObject* ok = PyObject_Vectorcall(k->check, args, n, NULL);
        if (ok == NULL)
            return NULL;
        Py_DECREF(ok);
    }
    void* ptrs[k->nptrs + 1];
    int64_t ints[k->nints + 1];
    double floats[k->nfloats + 1];
    Py_ssize_t np = 0, ni = 0, nf = 0;
    for (Py_ssize_t a = 0; a < n; a++) {
        switch (k->kinds[a]) {
        case 'p':
            if (fx_data_ptr(args[a], &ptrs[np++]) < 0)
                return NULL;
            break;
        case 'i':
            ints[ni] = PyLong_AsLongLong(args[a]);
            if (ints[ni++] == -1 && PyErr_Occurred())
                return NULL;
            break;
        case 'b': {
            int t = PyObject_IsTrue(args[a]);
            if (t < 0)
                return NULL;
            ints[ni++] = t;
            break;
        }
        default:
            floats[nf] = PyFloat_AsDouble(args[a]);
            if (floats[nf++] == -1.0 && PyErr_Occurred())
                return NULL;
        }
    }
    int64_t err = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = k->entry(ptrs, ints, floats, &err);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return fx_error(rc, err);
    Py_RETURN_NONE;
}

static void fx_kernel_dealloc(PyObject* self)
{
    FxKernel* k = (FxKernel*)self;
    Py_XDECREF(k->name);
    Py_XDECREF(k->check);
    PyMem_Free(k->kinds);
    PyObject_Free(self);
}

static PyObject* fx_kernel_repr(PyObject* self)
{
    return PyUnicode_FromFormat("<fxforge C kernel %U>", ((FxKernel*)self)->name);
}

static PyTypeObject FxKernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fxforge_c_launcher.Kernel",
    .tp_basicsize = sizeof(FxKernel),
    .tp_dealloc = fx_kernel_dealloc,
    .tp_vectorcall_offset = offsetof(FxKernel, vectorcall),
    .tp_repr = fx_kernel_repr,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "One C kernel, called with the wrapper's tensors and sizes.",
};

/* kernel(address, kinds, name[, check]): the kernel at address, taking arguments of these kinds
   (check: None, or a callable run with the arguments before each call) */
static PyObject* fx_kernel(PyObject* module, PyObject* const* args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 4 || !PyLong_Check(args[0]) || !PyBytes_Check(args[1]) || !PyUnicode_Check(args[2])
        || (nargs == 4 && args[3] != Py_None && !PyCallable_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError, "kernel(address: int, kinds: bytes, name: str, check=None)");
        return NULL;
    }
    void* entry = PyLong_AsVoidPtr(args[0]);
    if (entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "kernel(): a null address");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[1]);
    const char* kinds = PyBytes_AS_STRING(args[1]);
    Py_ssize_t nptrs = 0, nints = 0, nfloats = 0;
    for (Py_ssize_t a = 0; a < n; a++) {
        switch (kinds[a]) {
        case 'p': nptrs++; break;
        case 'i': case 'b': nints++; break;
        case 'f': nfloats++; break;
        default:
            PyErr_Format(PyExc_ValueError, "kernel(): the kinds %R hold one that is none of p, i, b, f", args[1]);
            return NULL;
        }
    }
    FxKernel* k = PyObject_New(FxKernel, &FxKernelType);
    if (k == NULL)
        return NULL;
    k->check = NULL;
    k->kinds = PyMem_Malloc(n + 1);
    if (k->kinds == NULL) {
        k->name = NULL;
        Py_DECREF(k);
        return PyErr_NoMemory();
    }
    memcpy(k->kinds, kinds, n + 1);
    k->vectorcall = fx_kernel_call;
    k->entry = (fx_entry)entry;
    Py_INCREF(args[2]);
    k->name = args[2];
    if (nargs == 4 && args[3] != Py_None) {
        Py_INCREF(args[3]);
        k->check = args[3];
    }
    k->nargs = n;
    k->nptrs = nptrs;
    k->nints = nints;
    k->nfloats = nfloats;
    return (PyObject*)k;
}

static PyObject* fx_bind(PyObject* module, PyObject* const* args, Py_ssize_t nargs)
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

static PyMethodDef fx_methods[] = {
    {"_bind", (PyCFunction)(void (*)(void))fx_bind, METH_FASTCALL, NULL},
    {"kernel", (PyCFunction)(void (*)(void))fx_kernel, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef fx_module = {PyModuleDef_HEAD_INIT, "fxforge_c_launcher", NULL, -1, fx_methods};

PyMODINIT_FUNC PyInit_fxforge_c_launcher(void)
{
    if (PyType_Ready(&FxKernelType) < 0)
        return NULL;
    return PyModule_Create(&fx_module);
}
"""


def _errors_c() -> str:
    cases = [f'    case {rc}: PyErr_Format(PyExc_{exc.__name__}, "{msg.replace("{}", "%lld")}", (long long)err); return NULL;'
             for rc, (exc, msg) in KERNEL_ERRORS.items()]
    return "\n".join(["static PyObject* fx_error(int rc, int64_t err)", "{", "    switch (rc) {", *cases, "    }",
                      '    PyErr_Format(PyExc_RuntimeError, "an fxforge C kernel failed (%d)", rc);', "    return NULL;", "}"])


def launcher_source() -> str:
    """The launcher module's C source, for this interpreter (its extension suffix in the first
    line: the cached module is this interpreter's) and with the probe kernel (after it: ``Python.h``
    comes before the C library's headers)."""
    return (f"/* {sysconfig.get_config_var('EXT_SUFFIX') or ''} */\n" + _LAUNCHER.replace("/* FX_ERRORS */", _errors_c())
            + _PROBE)


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


@functools.lru_cache(maxsize=None)
def refusal(cc: str) -> str | None:
    """Why ``cc`` cannot build fxforge's kernels (a flag it rejects...), or None: it can.  Found
    by building the launcher (which carries a kernel), else, where that fails or cannot be
    built here, a one-line kernel alone; both are cached like kernels, so a later process with
    the same compiler builds nothing."""
    # the machine's vector math (build.vector_math, a build of its own) found meanwhile
    with ThreadPoolExecutor(1) as pool:
        pool.submit(vector_math)
        include = launcher_include()
        sources = ([(launcher_source(), include)] if include else []) + [(_PROBE, None)]
        why = None
        for source, inc in sources:
            try:
                shared_object(source, inc, cc)
                return None
            except (OSError, subprocess.SubprocessError) as e:
                return f"the C compiler {cc} cannot run: {e}"
            except CompileError as e:  # the launcher's Python.h may be what fails: try the kernel alone
                why = f"the C compiler {cc} cannot build fxforge's kernels: {str(e)[:500]}"
        return why


def launcher_include() -> str | None:
    """``Python.h``'s directory where the launcher can be built and bound here (this torch has
    the data-pointer entry it calls), else None."""
    return python_include() if _data_ptr_entry() is not None else None


@functools.lru_cache(maxsize=None)
def launcher() -> Any:
    """The launcher module (built unless cached, loaded once per process, bound to torch's
    data-pointer entry), or None: the kernels are called through ``ctypes``."""
    include = launcher_include()
    if include is None:
        return None
    try:
        return load_launcher(shared_object(launcher_source(), include))
    except (CompileError, ImportError, OSError) as e:
        log.warning("fxforge: the C kernel launcher failed to build or load; calling the kernels through "
                    "ctypes (slower calls)")
        log.debug("fxforge: the C kernel launcher: %s", e)
        return None


def _load_extension(path: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(LAUNCHER_MODULE, path)
    spec = importlib.util.spec_from_file_location(LAUNCHER_MODULE, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def link(unit: CUnit) -> dict[str, Any]:
    """Compile (or find) the unit's kernels and bind each to ``<name>_c``, a callable taking the
    launch function's tensors and scalars: a launcher object, else a ``ctypes`` adapter.  Where
    units were built at -Og first (``CUnit.tiered``), ``unit.upgraded`` is set: a future of the
    bindings of their kernels built in full (``CUnit.upgrade``), for ``Wrapper.load`` to swap in."""
    if not unit.kernels:
        return {}
    out = _bound(unit, unit.built())
    unit.upgraded = unit.upgrade(lambda built: _bound(unit, built))
    return out


def _bound(unit: CUnit, built: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """``bind`` of the unit's kernels found in ``built`` (shared objects and their symbols)."""
    lib_of = {symbol: lib for path, symbols in built for lib in [ctypes.CDLL(path)] for symbol in symbols}
    return bind([(k.name, k.symbol, k.kinds, layout_check(k) if unit.debug else None) for k in unit.kernels
                 if k.symbol in lib_of], lib_of, launcher())


def bind(kernels: list[tuple[str, str, str, Any]], lib_of: dict[str, ctypes.CDLL], module: Any) -> dict[str, Any]:
    """Each kernel (name, symbol, kinds, check: None or ``layout_check``'s function), found in
    ``lib_of[symbol]``, bound to ``<name>_c``: an object of the launcher ``module``, else (None)
    a ``ctypes`` adapter."""
    out = {}
    for name, symbol, kinds, check in kernels:
        fn = getattr(lib_of[symbol], symbol)
        if module is not None:
            out[f"{name}_c"] = module.kernel(ctypes.cast(fn, ctypes.c_void_p).value, kinds.encode(), name, check)
        else:
            fn.restype = ctypes.c_int
            out[f"{name}_c"] = _ctypes_adapter(fn, kinds, check)
    return out


def load_launcher(path: str) -> Any:
    """The launcher module built at ``path`` (here, or a package's), bound to torch's data-pointer entry;
    None where this torch lacks that entry (the kernels are then called through ``ctypes``)."""
    data_ptr = _data_ptr_entry()
    if data_ptr is None:
        return None
    module = _load_extension(path)
    module._bind(data_ptr, torch.Tensor, torch.nn.Parameter)
    return module


def layout_check(k) -> Any:
    """A function of a kernel's arguments raising a ``ValueError`` that names the first tensor
    whose device, dtype, shape or strides (where the kernel was compiled for static ones, and
    the dim has more than one element) differ from what the kernel was compiled for
    (``CEmitted.specs``)."""
    specs = [(i, p, (dtype, _static(shape), _static(stride)))
             for i, p in enumerate(k.params) if p.name in k.specs for dtype, shape, stride in [k.specs[p.name]]]

    def check(*args: Any) -> None:
        for i, p, (dtype, shape, stride) in specs:
            t = args[i]
            if not isinstance(t, torch.Tensor):
                why = f"is a {type(t).__name__}, not a tensor"
            elif t.device.type != "cpu" or t.dtype != dtype:
                why = f"is a {t.dtype} tensor on {t.device}; the kernel was compiled for {dtype} on cpu"
            elif t.dim() != len(shape) or any(s is not None and s != a for s, a in zip(shape, t.shape)):
                why = f"has shape {tuple(t.shape)}; the kernel was compiled for {_spec(shape)}"
            elif any(st is not None and n != 1 and st != a for st, n, a in zip(stride, t.shape, t.stride())):
                why = f"has strides {t.stride()}; the kernel was compiled for {_spec(stride)}"
            else:
                continue
            raise ValueError(f"fxforge C kernel {k.name}: argument {i} ({p.launch}, kernel parameter {p.name}) {why}")

    return check


def _static(dims: tuple) -> tuple:
    """Sizes or strides as ints, None where symbolic."""
    return tuple(int(e) if e.is_Integer else None for e in map(expr, dims))


def _spec(dims: tuple) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _ctypes_adapter(fn: Any, kinds: str, check: Any = None):
    """A Python function passing the launcher's arrays to ``fn`` (NULL for an empty one),
    converting each argument as the launcher does (after ``check``, where given)."""
    ptrs, ints, floats = ([i for i, c in enumerate(kinds) if c in k] for k in ("p", "ib", "f"))  # ints: bools too
    n, ptr_array = len(kinds), ctypes.c_void_p * len(ptrs)
    int_array = ctypes.c_int64 * len(ints) if ints else None
    float_array = ctypes.c_double * len(floats) if floats else None

    def call(*args: Any) -> None:
        if len(args) != n:
            raise TypeError(f"takes {n} positional arguments ({len(args)} given)")
        if check is not None:
            check(*args)
        err = ctypes.c_int64(0)
        rc = fn(ptr_array(*[args[i].data_ptr() for i in ptrs]),
                int_array and int_array(*[operator.index(args[i]) if kinds[i] == "i" else (1 if args[i] else 0) for i in ints]),
                float_array and float_array(*[float(args[i]) for i in floats]), ctypes.byref(err))
        if rc != 0:
            raise kernel_error(rc, err.value)

    return call
