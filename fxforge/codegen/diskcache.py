"""fxforge's private on-disk cache directories, and writes readers never see half done.

``cache_dir(kind)`` is ``$FXFORGE_CACHE_DIR/<kind>`` (default ``~/.cache/fxforge/<kind>``:
``triton`` for the Triton kernel modules and autotune choices, ``c`` for the C kernels' shared
objects); both it and the base directory are created mode ``0700`` when missing.  Both are
opened without following symbolic links and must be directories owned by the current user.
Group/other access is removed from ``<kind>`` (``fchmod`` on the opened directory, never through
a path); the base directory is never chmodded (it may be a shared directory such as ``/tmp``)
and must not be writable by group/others unless it has the sticky bit.  A directory that is a
symbolic link, not a directory, owned by someone else, or writable by group/others and cannot be
made private is refused: one WARNING on the ``fxforge`` logger names it, the problem and the
fix, and the process uses a private temporary directory instead (``mkdtemp``, mode ``0700``, one
per process, removed at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
from typing import IO, Iterator

log = logging.getLogger("fxforge")

_dir_lock = threading.Lock()  # the fallback directory and the warnings already given
_fallback: tuple[int, str, tuple[int, int]] | None = None  # (pid, dir, (st_dev, st_ino)) once one was refused
_warned: set[str] = set()  # refused directories already warned about (one WARNING each)

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


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
    path = tempfile.mkdtemp(prefix="fxforge-cache-")
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


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w") -> Iterator[IO]:
    """A file object to write ``path`` with (``mode``: "w" text, utf-8, or "wb"), through a temp
    file in the same directory moved in place with ``os.replace`` when the block ends without an
    exception (removed otherwise): readers see the old content or the new, never a partial file."""
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-", suffix=suffix)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write(path: str, data: str | bytes) -> None:
    """Write ``data`` (text, or bytes) to ``path`` (``atomic_file``)."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
