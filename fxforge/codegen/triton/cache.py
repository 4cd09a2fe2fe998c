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
* **The directory is private.**  ``cache_dir`` is ``$FXFORGE_CACHE_DIR/triton`` (default
  ``~/.cache/fxforge/triton``); both it and the base directory are created mode ``0700`` when
  missing.  Both are opened without following symbolic links and must be directories owned by
  the current user.  Group/other access is removed from ``triton`` (``fchmod`` on the opened
  directory, never through a path); the base directory is never chmodded (it may be a shared
  directory such as ``/tmp``) and must not be writable by group/others unless it has the
  sticky bit.  A directory that is a symbolic link, not a directory, owned by someone else, or
  writable by group/others and cannot be made private is refused: one WARNING on the
  ``fxforge`` logger names it, the problem and the fix, and the process uses a private
  temporary directory instead (``mkdtemp``, mode ``0700``, one per process, removed at exit).
  The autotuner's ``tune_*.json`` files live in the same directory (``autotune.py``), so they
  get the same checks.

The files on disk are a record, not an input: they let you read the generated kernels, and
reuse across processes comes from Triton's own binary cache (keyed by the source text).  The
functions are wrapped by the loader (``triton.jit``, which is the interpreter under
``TRITON_INTERPRET=1``, or a plain ``JITFunction`` for ahead-of-time compiles), so one module
text serves both.
"""

from __future__ import annotations

import atexit
import hashlib
import linecache
import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
from types import ModuleType
from typing import Callable

log = logging.getLogger("fxforge")

_lock = threading.Lock()  # module files: read-compare-rewrite
_dir_lock = threading.Lock()  # the fallback directory and the warnings already given
_fallback: tuple[int, str, tuple[int, int]] | None = None  # (pid, dir, (st_dev, st_ino)) once one was refused
_warned: set[str] = set()  # refused directories already warned about (one WARNING each)

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def triton_version() -> str:
    import triton

    return triton.__version__


# --------------------------------------------------------------------------- the directory


def _base_dir() -> str:
    return os.environ.get("FXFORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fxforge"
    )


def _check_dir(path: str, strip: int) -> tuple[str, str] | None:
    """Create ``path`` (mode ``0700``) if missing and check it: ``None`` if usable, else
    ``(problem, fix)``.  The directory is opened with ``O_NOFOLLOW`` and checked and chmodded
    through that descriptor, so a symbolic link (or a swap for one) is never followed.
    ``strip``: mode bits removed if present (``0`` for a directory we must not chmod).  Group or
    other write access that stays refuses it, unless the sticky bit is set (as on ``/tmp``: then
    nobody else can rename or delete what we create in it)."""
    try:
        os.mkdir(path, 0o700)  # never follows a link at ``path`` (EEXIST)
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot be created ({e.strerror})", "point FXFORGE_CACHE_DIR at a writable directory you own"
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW)
    except OSError as e:
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            return "is a symbolic link", (
                "point FXFORGE_CACHE_DIR at the real directory, or replace the link with a directory you own"
            )
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return "is not a directory", "remove it, or point FXFORGE_CACHE_DIR at a directory you own"
        return f"cannot be opened ({e.strerror})", "point FXFORGE_CACHE_DIR at a directory you own"
    try:
        st = os.fstat(fd)
        uid = os.geteuid()
        if st.st_uid != uid:
            return f"is owned by uid {st.st_uid}, not by the current user (uid {uid})", (
                "point FXFORGE_CACHE_DIR at a directory you own, or have its owner remove it "
                "(fxforge recreates it, mode 0700)"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & strip:
            try:
                os.fchmod(fd, mode & ~strip)
                mode = stat.S_IMODE(os.fstat(fd).st_mode)
            except OSError:
                pass
            if not mode & strip:
                log.info("fxforge: removed group/other access (mode %o now) from cache directory %s", mode, path)
        if mode & 0o022 and not mode & stat.S_ISVTX:
            problem = f"is writable by group/others (mode {mode:o})"
            return problem + (" and cannot be made private" if strip else ""), (
                f"run `chmod go-w {path}` as its owner, or point FXFORGE_CACHE_DIR at a private directory"
            )
        return None
    finally:
        os.close(fd)


def _remove_fallback(pid: int, path: str) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the atexit hook
        shutil.rmtree(path, ignore_errors=True)


def _fallback_dir() -> str:
    """This process's private temp directory (``mkdtemp``: new, mode ``0700``), made on first use
    and again if it disappeared or was replaced."""
    global _fallback
    pid = os.getpid()
    if _fallback is not None and _fallback[0] == pid:
        try:
            st = os.lstat(_fallback[1])
            if stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == _fallback[2]:
                return _fallback[1]
        except OSError:
            pass
    path = tempfile.mkdtemp(prefix="fxforge-triton-")
    st = os.lstat(path)
    _fallback = (pid, path, (st.st_dev, st.st_ino))
    atexit.register(_remove_fallback, pid, path)
    return path


def _refuse(path: str, problem: str, fix: str) -> str:
    with _dir_lock:
        tmp = _fallback_dir()
        if path not in _warned:
            _warned.add(path)
            log.warning(
                "fxforge: not using the kernel cache directory %s: it %s. This process uses "
                "the private temporary directory %s instead (removed at exit: what is cached there, "
                "autotune choices included, is not kept for other processes). Fix: %s.",
                path, problem, tmp, fix,
            )
        return tmp


def cache_dir(kind: str = "triton") -> str:
    """``$FXFORGE_CACHE_DIR/<kind>`` or ``~/.cache/fxforge/<kind>`` (created ``0700``), checked
    (module docstring); a private per-process temp directory, with one WARNING, if refused.
    ``kind``: ``triton`` (kernel modules), ``c`` (the C backend's shared objects)."""
    base = _base_dir()
    parent = os.path.dirname(os.path.abspath(base))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError:
        pass  # _check_dir reports what fails
    bad = _check_dir(base, strip=0)  # the user's directory: checked, never chmodded
    if bad:
        return _refuse(base, *bad)
    path = os.path.join(base, kind)
    bad = _check_dir(path, strip=0o077)
    if bad:
        return _refuse(path, *bad)
    return path


# --------------------------------------------------------------------------- the files


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
