"""The C kernels' calling convention: what build.py, launcher.py, fxforge.packages and both kernel
sources (kernel.py, templates.py) agree on.

* One signature for every kernel (``c_head``): the tensors' data pointers, the int64 sizes and
  bools, the floats, each read from its array by the parameter's kind (``param_kind``).
* Its return: 0, or one of ``KERNEL_ERRORS`` with a value in ``*fx_err`` (``fail``).
* Its symbol, named after its text (``c_function``), with heap scratch space where its local
  arrays do not fit the stack (``Scratch``).
* The Python launch function calling it (``launch_source``), and ``CEmitted``, the record of one
  generated kernel that the build and the launcher read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..ir.lowering import Param
from ..ir.stmts import Array
from ..ir.values import Role

# The local arrays of one kernel (row caches, tiles, column accumulators, a template's staged
# rows) take at most this much C stack in all; the arrays past it live in heap scratch space the
# kernel allocates once a call (``Scratch``): a kernel may run on a thread with a small stack.
STACK_MAX_BYTES = 128 << 10
_SCALAR_CTYPE = {"i64": "int64_t", "i1": "bool", "fp32": "float"}


# What a kernel's nonzero return means (``*fx_err`` holds the value the message names): the
# exception the launcher raises, with eager's message for the same error.
TARGET_OUT_OF_BOUNDS = 1  # a class target outside [0, classes)
INDEX_OUT_OF_RANGE = 2  # an embedding index outside the table
SCRATCH_ERROR = 3  # the kernel's heap scratch (``Scratch``) could not be allocated; *fx_err: its bytes
KERNEL_ERRORS = {TARGET_OUT_OF_BOUNDS: (IndexError, "Target {} is out of bounds."),
                 INDEX_OUT_OF_RANGE: (IndexError, "index out of range in self"),
                 SCRATCH_ERROR: (MemoryError, "an fxforge C kernel could not allocate its scratch space ({} bytes)")}


def fail(code: int, value: str) -> str:
    """The C statement that ends a kernel with error ``code`` of ``KERNEL_ERRORS``, leaving
    ``value`` (a C expression) in ``*fx_err`` for the message."""
    return f"{{ *fx_err = {value}; return {code}; }}"


def kernel_error(rc: int, err: int) -> Exception:
    """The exception for a kernel's nonzero return ``rc`` (``ctypes`` path: the launcher raises it in C)."""
    exc, msg = KERNEL_ERRORS.get(rc, (RuntimeError, f"an fxforge C kernel failed ({rc})"))
    return exc(msg.format(err))


@dataclass
class CEmitted:
    """A generated C kernel: the C function (named ``symbol``, ``c_function``), the Python launch
    function calling it through ``<name>_c`` (bound when the wrapper's C functions are built,
    ``launcher.link``) and its parameters."""

    symbol: str
    c_source: str
    launch_source: str
    name: str
    args: list[str]
    params: list[Param]
    node_count: int
    unique_io_buffers: int
    # tensor parameter -> (dtype, sizes, strides) the kernel was compiled for (``launcher.layout_check``)
    specs: dict[str, tuple] = field(default_factory=dict)
    quick: bool = False  # built at -O1 (``QUICK_BUILD_MAX_WORK``)

    @property
    def kinds(self) -> str:
        """Each parameter's kind, as the launcher reads its argument: ``p`` a tensor (its data
        pointer), ``i`` an int64, ``b`` a bool, ``f`` a float."""
        return "".join(param_kind(p) for p in self.params)


_KIND = {"i64": "i", "i1": "b", "fp32": "f"}
_ENTRY_ARRAY = {"p": "fx_ptrs", "i": "fx_ints", "b": "fx_ints", "f": "fx_floats"}  # where each kind is passed


def param_kind(p: Param) -> str:
    return "p" if p.sig.startswith("*") else _KIND[p.sig]


def c_head(name: str, params: list[Param], heap: bool = False) -> list[str]:
    """The kernel's signature, its opening brace and its parameters read from it.  Every kernel
    has the same signature, ``int name(void* const* fx_ptrs, const int64_t* fx_ints, const
    double* fx_floats, int64_t* fx_err)`` (one launcher calls them all, ``launcher.py``): the
    tensors' data pointers in order (``const`` for the ``in_`` ones, which the kernel only
    reads), the sizes and bools, the floats.  It returns 0, or one of ``KERNEL_ERRORS``
    with the value that error names in ``*fx_err``; its last lines are ``C_END``.  ``heap``: the
    body of a kernel with heap scratch space (``c_function``), a static function taking the
    block as ``fx_heap``."""
    signature = "void* const* fx_ptrs, const int64_t* fx_ints, const double* fx_floats, int64_t* fx_err"
    lines = [f"static int {name}({signature}, char* fx_heap)" if heap else f"int {name}({signature})", "{"]
    count = dict.fromkeys(_ENTRY_ARRAY.values(), 0)
    for p in params:
        array = _ENTRY_ARRAY[param_kind(p)]
        i, count[array] = count[array], count[array] + 1
        if p.sig.startswith("*"):
            lines.append(f"    {'const ' if p.name.startswith(f'{Role.IN}_') else ''}{p.sig[1:]}* {p.name} = {array}[{i}];")
        else:
            ct = _SCALAR_CTYPE[p.sig]
            lines.append(f"    const {ct} {p.name} = ({ct}){array}[{i}];")
    return lines


C_END = ["    return 0;", "}"]  # a kernel's last lines (``c_head``)


class Scratch:
    """The local arrays of one kernel, on the C stack up to ``STACK_MAX_BYTES`` in all, in one
    heap block past it (``fx_heap``, allocated by ``c_function``'s entry for the call)."""

    def __init__(self):
        self.stack = 0
        self.heap = 0

    def alloc(self, ctype: str, name: str, dims: tuple[int, ...], itemsize: int) -> Array:
        """Array ``name``: ``ctype name[d0][d1]...`` on the stack, or in the heap block."""
        size = itemsize
        for d in dims:
            size *= d
        if self.stack + size <= STACK_MAX_BYTES:
            self.stack += size
            return Array(name, ctype, tuple(dims))
        at, self.heap = self.heap, self.heap + (size + 63) // 64 * 64
        return Array(name, ctype, tuple(dims), heap_at=at)


def c_function(params: list[Param], body: list[str], heap: int = 0) -> tuple[str, list[str]]:
    """The C function running ``body`` (indented lines, after its parameters are read) and its
    symbol, ``fxk_`` and a hash of its text: the same kernel has the same symbol in every wrapper
    and at every position in one (``build.units`` compiles it once, into a unit that does not
    change when other kernels do).  ``heap``: the bytes of the body's ``fx_heap`` block
    (``Scratch``): the function allocates it, runs the body (a function of its own) and frees it."""
    def lines(symbol: str) -> list[str]:
        if not heap:
            return c_head(symbol, params) + body + C_END
        return c_head(f"{symbol}_body", params, heap=True) + body + C_END + [
            c_head(symbol, [])[0], "{", f"    char* fx_heap = malloc({heap});",
            f"    if (fx_heap == NULL) {fail(SCRATCH_ERROR, str(heap))}",
            f"    const int rc = {symbol}_body(fx_ptrs, fx_ints, fx_floats, fx_err, fx_heap);",
            "    free(fx_heap);", "    return rc;", "}"]

    symbol = "fxk_" + hashlib.sha256("\n".join(lines("fxk")).encode()).hexdigest()[:20]
    return symbol, lines(symbol)


def launch_source(name: str, args: list[str], params: list[Param], prologue: list[str], head: list[str]) -> str:
    """The launch function ``name(*args)``: ``prologue`` (sizes read, checks), then ``<name>_c``
    called with each parameter's tensor or scalar (``launcher.link`` binds it).  A kernel whose
    parameters are its arguments is ``<name>_c`` itself: no Python frame per call."""
    launch = [p.launch for p in params]
    if not prologue and launch == list(args):
        return "\n".join(head + [f"{name} = {name}_c"]) + "\n"
    lines = head + [f"def {name}({', '.join(args)}):"] + ["    " + l for l in prologue]
    return "\n".join(lines + [f"    {name}_c({', '.join(launch)})"]) + "\n"
