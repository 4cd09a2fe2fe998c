"""Running a bench function on N gloo ranks, on this machine's loopback or on a slow link.

``on_ranks(fn, world)`` runs ``fn(rank, world)`` in ``world`` spawned processes (the tests'
launcher, ``tests/partition_ranks.run_ranks``: a ``FileStore`` rendezvous, one thread each,
bounded in time) and returns their results by rank.

``limited_link(rate)`` is the bandwidth-limited link: when the bench is not already inside one, it
runs the bench's own command line again inside a fresh network namespace (``unshare -rn``: no
privileges needed) whose loopback is rate-limited with a token bucket
(``tc qdisc add dev lo root tbf rate <rate> burst 32kbit latency 400ms``), its packets Ethernet's
1500 bytes (loopback's own 64 KiB would never fit the 4 KB bucket: every packet dropped), so
gloo's traffic between the ranks crosses a link as slow as one between machines.  It returns the exit status of
that run (the caller exits with it), or None inside the namespace (the caller goes on).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from partition_ranks import run_ranks  # noqa: E402

_INSIDE = "FXFORGE_BENCH_LINK"


def link_name() -> str:
    """The link this process's ranks talk over: ``loopback`` or ``loopback-<rate>``."""
    rate = os.environ.get(_INSIDE)
    return f"loopback-{rate}" if rate else "loopback"


def limited_link(rate: str) -> int | None:
    """Rerun ``sys.argv`` inside a namespace whose loopback runs at ``rate`` (``1gbit``...)."""
    if os.environ.get(_INSIDE) == rate:
        return None
    for tool in ("unshare", "tc", "ip"):
        if shutil.which(tool) is None:
            raise SystemExit(f"a rate-limited link needs `{tool}` (util-linux / iproute2); run without --link")
    script = (f"ip link set lo mtu 1500 && ip link set lo up && "
              f"tc qdisc add dev lo root tbf rate {rate} burst 32kbit latency 400ms && exec \"$@\"")
    env = {**os.environ, _INSIDE: rate, "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.call(["unshare", "-rn", "sh", "-c", script, "sh", sys.executable, *sys.argv], env=env)


def on_ranks(fn, world: int, timeout: float = 1800.0) -> list:
    """``fn(rank, world)`` on ``world`` gloo ranks (a module-level function of an importable module)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if fn.__module__ == "__main__":  # (a bench script's own function: spawned ranks import it by its file's name)
        main = os.path.splitext(os.path.basename(sys.modules["__main__"].__file__))[0]
        fn = getattr(importlib.import_module(main), fn.__name__)
    return run_ranks(fn, world, timeout=timeout, collective_timeout=min(timeout, 600.0))
