"""The worker process's pool of Monty sandbox processes.

One pool per worker process, created on first use: creating it at import would spawn a `monty` process in every
process that imports the workflow module (clients, the replay command). This module is passed through
Temporal's workflow sandbox, so every workflow run in the process shares this one pool.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass, field

import pydantic_monty

from ._errors import CodeModeUserError

__all__ = [
    "PoolSettings", "configure_pool", "default_max_processes", "get_pool", "live_sessions", "reserve_task_slots",
    "shutdown_pool",
]


@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    """Sizing of the Monty pool, one per worker process, shared by every code-mode worker in it.

    The rule: **a worker process runs at most `max_processes` workflow tasks at once** (the sum of its code-mode
    workers' `max_concurrent_workflow_tasks`; `create_worker` sets it to `max_processes` unless told otherwise).
    Then a workflow task never waits for a sandbox process:

    - a run holds a process only while its program computes, inside one workflow task: while the program waits
      on tool calls, timers or a person, and between snippets, it is a dump in workflow memory (0.2-0.5 ms a
      dump and load for small state, a few ms per MB);
    - so the pool bounds the workflow tasks computing at once, never the runs in flight: 50 runs with live
      programs on a 4-process pool all complete; they queue for workflow task slots, which Temporal hands out.

    The default is 4 per usable CPU, from 4 to 32: a workflow task slot is also held while its completion
    travels to the server, so a few per core keep the CPUs busy. Measured on 2 CPUs (`bench/throughput.py`, 50
    runs x 100 nested calls, sequential and gathered, a machine at load 7-12), 4, 8 and 16 processes all ran at
    0.75-1.33x the calls/s of bare activities, with no size ahead in both modes; what grows with the size is
    memory: the pool starts processes only as they are needed and keeps them, ~30 MB of RSS each once used.
    """

    max_processes: int = field(default_factory=lambda: default_max_processes())
    """Sandbox processes at most, and so the most workflow tasks the process's code-mode workers run at once.
    At least 2 (Temporal needs two workflow task slots for a worker with a workflow cache). Default:
    `default_max_processes()`."""

    checkout_timeout: float = 1.0
    """Seconds a workflow task waits for a free sandbox process. Under the rule above it never waits for
    another run, only for a process being started; past the timeout the workflow task fails and Temporal retries
    it (`SandboxUnavailableError`), instead of the worker's workflow thread wedging. Kept well under Temporal's
    2 s deadlock limit."""

    def __post_init__(self) -> None:
        if self.max_processes < 2:
            raise CodeModeUserError(
                f"PoolSettings.max_processes must be at least 2, got {self.max_processes}: it also bounds the "
                "worker's workflow task slots, and Temporal needs two for a worker with a workflow cache"
            )
        if not 0 < self.checkout_timeout <= 1.5:
            raise CodeModeUserError(
                f"PoolSettings.checkout_timeout must be in (0, 1.5] seconds, got {self.checkout_timeout}: a "
                "checkout blocks the workflow thread, which Temporal fails after 2 s"
            )


def default_max_processes() -> int:
    """4 per CPU this process may use, at least 4 and at most 32."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(32, max(4, 4 * cpus))


_lock = threading.Lock()  # determinism: ok (guards the process-wide pool; decides no workflow step)
_settings = PoolSettings()
_pool: pydantic_monty.Monty | None = None
_running: PoolSettings | None = None
"""The settings the running pool was started with."""
_live = 0
_task_slots = 0
"""Workflow task slots of the code-mode workers running in this process (see `PoolSettings`)."""


def configure_pool(settings: PoolSettings) -> PoolSettings:
    """Set the pool's size before its first use; returns the settings in force.

    A pool already running keeps its settings until shut down: then those are returned.
    """
    global _settings
    with _lock:
        _settings = settings
        return _running or settings


def reserve_task_slots(slots: int) -> int:
    """Count a code-mode worker's workflow task slots while it runs (`-slots` when it stops); the process's sum."""
    global _task_slots
    with _lock:
        _task_slots += slots
        return _task_slots


def get_pool() -> pydantic_monty.Monty:
    """The process's pool, started on first call."""
    global _pool, _running
    with _lock:
        if _pool is None:
            pool = pydantic_monty.Monty(
                min_processes=1,
                max_processes=_settings.max_processes,
                checkout_timeout=_settings.checkout_timeout,
            )
            pool.__enter__()
            _pool, _running = pool, _settings
        return _pool


def live_sessions() -> int:
    """Sessions currently checked out of the pool (a run's live REPL each): for tests and metrics."""
    return _live


def note_checkout(delta: int) -> None:
    """Count a session checked out (+1) or returned (-1)."""
    global _live
    with _lock:
        _live += delta


def shutdown_pool() -> None:
    """Stop every sandbox process; the next `get_pool()` starts a new pool."""
    global _pool, _running
    with _lock:
        pool, _pool, _running = _pool, None, None
    if pool is not None:
        pool.__exit__(None, None, None)


atexit.register(shutdown_pool)
