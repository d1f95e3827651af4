"""When the live workflow task on this thread began: its activation's start, as the worker's runner saw it.

Workflow code decides by the clock only where the decision is recorded (the compute budget, `_snippet_driver`), and
what it must keep under is Temporal's 2 s deadlock limit, which counts from the activation's start: the answers to
other jobs first (a gather's results), then the program. So the budget counts from there too, not from when the
driver took the program up. Set by `worker._task_timing.TaskTimingRunner` on the thread that runs the activation;
absent (another runner, a replayer) the driver counts from its own start. This module runs in workflow code.
"""

from __future__ import annotations

import threading

__all__ = ["activation_began", "task_began"]

_local = threading.local()  # determinism: ok (a live clock reading; decides only what is recorded)


def activation_began(at: float) -> None:
    """Record that this thread's activation began at `at` (`time.monotonic()`)."""
    _local.began = at


def task_began(fallback: float) -> float:
    """When this thread's current activation began; `fallback` if no runner told (its own, later, start)."""
    began: float | None = getattr(_local, "began", None)
    return fallback if began is None or began > fallback else began
