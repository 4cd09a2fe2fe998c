"""One progress line on stderr for a compile that takes a while.

A ``torch.compile`` user waiting on a long compile sees, once it has run for
``PROGRESS_AFTER_S`` seconds, one line naming the graph, its node count and the stage running,
rewritten in place as the stage changes and finished with the compile's time.  Only where stderr
is a terminal, and with ``Config.progress`` (``FXFORGE_PROGRESS=0`` turns it off).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

# Seconds a compile runs before its progress line shows.
PROGRESS_AFTER_S = 2.0


class Progress:
    """The progress line of one compile of graph ``graph`` (``nodes`` compute nodes): ``stage``
    as it moves, ``close`` at the end.  Shows nothing unless ``enabled`` and ``stream`` (stderr
    by default) is a terminal; nothing at all for a compile shorter than ``after`` seconds."""

    def __init__(self, graph: str, nodes: int, enabled: bool = True, stream: TextIO | None = None,
                 after: float | None = None):
        self.graph, self.nodes = graph, nodes
        self.stream = stream if stream is not None else sys.stderr
        self.current = "passes"
        self.t0 = time.perf_counter()
        self.lock = threading.Lock()
        self.shown = self.closed = False
        self.timer = None
        if enabled and _is_terminal(self.stream):
            self.timer = threading.Timer(PROGRESS_AFTER_S if after is None else after, self._show)
            self.timer.daemon = True
            self.timer.start()

    def _line(self, text: str) -> None:
        self.stream.write(f"\r\x1b[Kfxforge: {text}")
        self.stream.flush()

    def _status(self) -> str:
        return (f"compiling the {self.graph} graph ({self.nodes} nodes): {self.current}, "
                f"{time.perf_counter() - self.t0:.0f} s")

    def _show(self) -> None:
        with self.lock:
            if not self.closed:
                self.shown = True
                self._line(self._status())

    def stage(self, name: str) -> None:
        """The compile moved on to ``name`` (a pass, "schedule", "codegen"...)."""
        with self.lock:
            self.current = name
            if self.shown and not self.closed:
                self._line(self._status())

    def close(self) -> None:
        """The compile ended: the line, if shown, says how long it took."""
        if self.timer is not None:
            self.timer.cancel()
        with self.lock:
            self.closed = True
            if self.shown:
                self._line(f"compiled the {self.graph} graph ({self.nodes} nodes) in "
                           f"{time.perf_counter() - self.t0:.1f} s\n")


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a file
        return False
