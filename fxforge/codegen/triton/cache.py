"""On-disk cache of generated Triton kernel modules.

Each kernel module is a plain Python file (``import triton`` + undecorated functions) named by
a hash of its source and the Triton version, written atomically (temp file + ``os.replace``)
into a private directory (mode ``0700``).  Nothing is pickled: a module is only ever source we
generated.  A file whose content does not hash to its name (truncated, edited, corrupted) is
rewritten from the source we hold, never imported as is.

Triton needs a real file: ``triton.jit`` reads the function's source with ``inspect``.  The
functions are wrapped by the loader (``triton.jit``, which is the interpreter under
``TRITON_INTERPRET=1``, or a plain ``JITFunction`` for ahead-of-time compiles), so one file
serves both.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
from types import ModuleType
from typing import Callable

_lock = threading.Lock()


def triton_version() -> str:
    import triton

    return triton.__version__


def cache_dir() -> str:
    """``$FXFORGE_CACHE_DIR/triton`` or ``~/.cache/fxforge/triton`` (created ``0700``)."""
    base = os.environ.get("FXFORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fxforge"
    )
    path = os.path.join(base, "triton")
    os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        if os.stat(path).st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError:
        pass
    return path


def source_key(source: str) -> str:
    h = hashlib.sha256()
    h.update(triton_version().encode())
    h.update(b"\0")
    h.update(source.encode())
    return h.hexdigest()[:40]


def _header(key: str) -> str:
    return f"# fxforge triton kernel {key}\n"


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same directory and ``os.replace``:
    readers see the old content or the new, never a partial file."""
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def module_path(source: str) -> str:
    """The cache file holding ``source`` (written or repaired if missing or corrupt)."""
    key = source_key(source)
    path = os.path.join(cache_dir(), f"fxk_{key}.py")
    text = _header(key) + source
    with _lock:
        try:
            with open(path, encoding="utf-8") as f:
                ok = f.read() == text
        except (OSError, UnicodeDecodeError):
            ok = False
        if not ok:
            atomic_write(path, text)
            # a stale import of the old content must not be reused
            for mod in [m for m in sys.modules if m.startswith(f"fxk_{key}")]:
                sys.modules.pop(mod, None)
    return path


def load(source: str, jit_names: list[str], wrap: Callable | None = None, *, tag: str = "") -> ModuleType:
    """Import the module holding ``source`` and wrap each of ``jit_names`` with ``wrap``
    (default ``triton.jit``), in order: helpers first, kernels last."""
    if wrap is None:
        import triton

        wrap = triton.jit
    path = module_path(source)
    name = f"fxk_{source_key(source)}{tag}"
    # exec'd from the text (no .pyc next to it: a repaired file must never meet a stale one)
    mod = ModuleType(name)
    mod.__file__ = path
    with open(path, encoding="utf-8") as f:
        text = f.read()
    import linecache

    linecache.cache[path] = (len(text), None, text.splitlines(True), path)
    sys.modules[name] = mod  # inspect.getsource finds the file through the module
    exec(compile(text, path, "exec"), mod.__dict__)
    for n in jit_names:
        setattr(mod, n, wrap(getattr(mod, n)))
    return mod
