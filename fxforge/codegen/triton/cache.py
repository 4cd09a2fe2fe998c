"""On-disk cache of generated Triton kernel modules.

Each kernel module is a plain Python file (``import triton`` + undecorated functions) named by
a hash of its source and the Triton version.  What the cache guarantees:

* **Only the text we hold is executed.**  ``load`` compiles and runs the module text it holds
  in memory (the header + the source it was given), never bytes read back from disk: a file
  another process rewrites, truncates or deletes at any moment cannot change what runs, and a
  missing or unwritable file is not an error (the file is rewritten when it can be; the module
  runs from memory either way).  Nothing is pickled.
* **Triton sees the same text.**  ``triton.jit`` (and the interpreter, which reads the source
  lazily, at the first launch) finds a function's source with ``inspect``.  The functions' code
  is compiled under a file name that is not a file (``<cache file> [in memory]``) whose
  ``linecache`` entry is the verified text, and the module's ``__loader__`` hands the same text
  back if ``linecache`` is cleared, so what ``inspect`` returns never depends on the disk.
* **Files are complete and self-checking.**  Writes go through a temp file in the same directory
  and ``os.replace`` (readers see the old file or the new, never a partial one).  A file whose
  content is not the expected text (truncated, edited, corrupted, replaced by a link or a
  non-file) is rewritten from the source we hold.
* **The directory is private**: ``diskcache.cache_dir`` (``$FXFORGE_CACHE_DIR/triton``).
  The autotuner's ``tune_*.json`` files live in the same directory (``autotune.py``).

The files on disk are a record, not an input: they let you read the generated kernels, and
reuse across processes comes from Triton's own binary cache (keyed by the source text).  The
functions are wrapped by the loader (``triton.jit``, which is the interpreter under
``TRITON_INTERPRET=1``, or a plain ``JITFunction`` for ahead-of-time compiles), so one module
text serves both.
"""

from __future__ import annotations

import hashlib
import linecache
import logging
import os
import stat
import sys
import threading
from types import ModuleType
from typing import Callable

from ..diskcache import atomic_write, cache_dir  # noqa: F401 (the cache's directory, for its users)

log = logging.getLogger("fxforge")

_lock = threading.Lock()  # module files: read-compare-rewrite
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def triton_version() -> str:
    import triton

    return triton.__version__


# --------------------------------------------------------------------------- the files


def source_key(source: str) -> str:
    h = hashlib.sha256()
    h.update(triton_version().encode())
    h.update(b"\0")
    h.update(source.encode())
    return h.hexdigest()[:40]


def _header(key: str) -> str:
    return f"# fxforge triton kernel {key}\n"


def _holds(path: str, data: bytes) -> bool:
    """Whether ``path`` is a regular file (not a link, FIFO, ...) holding exactly ``data``."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _store(path: str, text: str) -> None:
    """Make ``path`` hold ``text`` (rewritten if missing or different); raises ``OSError`` if it
    cannot be written."""
    with _lock:
        if not _holds(path, text.encode("utf-8")):
            atomic_write(path, text)


def _module_text(source: str) -> tuple[str, str]:
    """``(key, text)``: the cache key of ``source`` and the module text stored and run for it."""
    key = source_key(source)
    return key, _header(key) + source


def module_path(source: str) -> str:
    """The cache file holding ``source`` (written or repaired if missing or corrupt).  The file
    is a copy for people and other processes: ``load`` never executes what it reads back."""
    key, text = _module_text(source)
    path = os.path.join(cache_dir(), f"fxk_{key}.py")
    _store(path, text)
    return path


class _VerifiedSource:
    """A kernel module's ``__loader__``: hands ``linecache`` (so ``inspect``) the text that was
    executed if its ``linecache`` entry is dropped (``linecache.clearcache()``)."""

    def __init__(self, text: str):
        self._text = text

    def get_source(self, name: str) -> str:
        return self._text


def load(source: str, jit_names: list[str], wrap: Callable | None = None, *, tag: str = "") -> ModuleType:
    """Run the module text of ``source`` (from memory, never from the file) as a fresh module and
    wrap each of ``jit_names`` with ``wrap`` (default ``triton.jit``), in order: helpers first,
    kernels last.  The cache file is written or repaired on the way (best effort: a file that
    cannot be written, or is deleted or replaced meanwhile, changes nothing here)."""
    if wrap is None:
        import triton

        wrap = triton.jit
    key, text = _module_text(source)
    path = os.path.join(cache_dir(), f"fxk_{key}.py")
    try:
        _store(path, text)
    except OSError as e:
        log.debug("fxforge: could not write kernel cache file %s (%s); running from memory", path, e)
    # Not a file name (so nothing on disk can stand in for it): inspect finds the text in
    # linecache (an entry with no mtime, which checkcache keeps) or, failing that, through
    # __loader__.  The text for a key never changes, so a shared entry is always right.
    filename = f"{path} [in memory]"
    name = f"fxk_{key}{tag}"
    mod = ModuleType(name)
    mod.__file__ = filename
    mod.__loader__ = _VerifiedSource(text)
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    sys.modules[name] = mod  # inspect finds the module (and its __loader__) through sys.modules
    exec(compile(text, filename, "exec"), mod.__dict__)
    for n in jit_names:
        setattr(mod, n, wrap(getattr(mod, n)))
    return mod
