"""After every compile: tell watchers (the CLI's progress lines, demo's report) and, when
``TORCH_TRACE`` is set, emit the plan and the report as tlparse artifacts.

``watch(callback)`` is a context manager: every ``Compiled`` made while it is open is passed to
``callback`` (on any thread: AOTAutograd compiles a backward graph where autograd runs it).
``on_compiled`` is what ``compile_graph`` calls; it never raises (a report that cannot be made
is logged, the compiled graph is kept).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Iterator

log = logging.getLogger("fxforge")

_watchers: list[Callable[[Any], None]] = []
_lock = threading.Lock()


@contextlib.contextmanager
def watch(callback: Callable[[Any], None]) -> Iterator[None]:
    with _lock:
        _watchers.append(callback)
    try:
        yield
    finally:
        with _lock:
            _watchers.remove(callback)


def on_compiled(compiled: Any) -> None:
    with _lock:
        watchers = list(_watchers)
    for cb in watchers:
        try:
            cb(compiled)
        except Exception as e:  # a watcher's failure is its own; the compile stands
            log.warning("fxforge: a compile watcher failed (%s: %s)", type(e).__name__, e)
    if tracing():
        emit_trace_artifacts(compiled)


def tracing() -> bool:
    """Structured tracing (``TORCH_TRACE``, or ``TORCH_COMPILE_DEBUG=1``) writes somewhere.

    torch keeps a lazy handler on its trace log even when tracing is off (it removes itself on
    the first record), so asking ``trace_structured`` would build the payload for nothing."""
    try:
        from torch._logging._internal import trace_log
    except ImportError:  # pragma: no cover - torch without structured tracing
        return False
    return any(getattr(h, "root_dir", None) for h in trace_log.handlers)


def emit_trace_artifacts(compiled: Any) -> None:
    """``fxforge_plan_<kind>`` (the memory plan, text) and ``fxforge_report_<kind>`` (the HTML)."""
    try:
        from torch._logging import trace_structured
    except ImportError:  # pragma: no cover
        return
    kind = compiled.stats.get("graph", "graph")
    try:
        from .html import render

        plan = compiled.plan.memory.dump() if compiled.plan is not None else ""
        report = render(compiled)
        for name, payload in ((f"fxforge_plan_{kind}", plan), (f"fxforge_report_{kind}", report)):
            trace_structured(
                "artifact",
                metadata_fn=lambda name=name: {"name": name, "encoding": "string"},
                payload_fn=lambda payload=payload: payload,
                expect_trace_id=False,
            )
    except Exception as e:
        log.warning("fxforge: could not emit the trace artifacts of the %s graph (%s: %s)", kind, type(e).__name__, e)
