"""What this machine is, as the caches and packages key on it: ``/proc/cpuinfo``'s fields and the
architecture name."""

from __future__ import annotations

import functools
import platform


@functools.lru_cache(maxsize=None)
def cpu_field(name: str) -> str:
    """The value of ``/proc/cpuinfo``'s first ``name`` line (``flags``, ``model name``): "" where
    there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def arch() -> str:
    """This machine's architecture, by the names compilers use: ``x86_64``, ``aarch64``..."""
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)
