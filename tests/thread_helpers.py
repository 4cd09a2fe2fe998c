"""Running a test's work on several Python threads at once."""

from __future__ import annotations

import threading
from typing import Callable


def run_in_threads(work: Callable[[], None], n: int, timeout: float = 120) -> None:
    """``work()`` on ``n`` threads at once; the first exception any of them raised is raised
    here, on the test's thread (and a thread still running after ``timeout`` seconds fails it)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # reported on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), f"a thread still ran after {timeout} s"
    if errors:
        raise errors[0]
