"""The worker process's pool of Monty sandbox processes.

One pool per worker process, created on first use: creating it at import would spawn a `monty` process in every
process that imports the workflow module (clients, the replay command). This module is passed through
Temporal's workflow sandbox, so every workflow run in the process shares this one pool.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass

import pydantic_monty

from ._errors import CodeModeUserError

__all__ = ["PoolSettings", "configure_pool", "get_pool", "live_sessions", "shutdown_pool"]


@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    """Sizing of the Monty pool."""

    max_processes: int = 4
    """Sandbox processes at most. A run holds one only while one of its snippets runs (waiting on tools included);
    between snippets and while a program waits for approval its REPL is a dump in workflow memory."""

    checkout_timeout: float = 1.0
    """Seconds a run waits for a free sandbox process. Kept well under Temporal's 2 s deadlock limit: past it
    the workflow task fails and Temporal retries it, instead of the worker's workflow thread wedging."""

    def __post_init__(self) -> None:
        if self.max_processes < 1:
            raise CodeModeUserError(f"PoolSettings.max_processes must be at least 1, got {self.max_processes}")
        if not 0 < self.checkout_timeout <= 1.5:
            raise CodeModeUserError(
                f"PoolSettings.checkout_timeout must be in (0, 1.5] seconds, got {self.checkout_timeout}: a "
                "checkout blocks the workflow thread, which Temporal fails after 2 s"
            )


_lock = threading.Lock()
_settings = PoolSettings()
_pool: pydantic_monty.Monty | None = None
_live = 0


def configure_pool(settings: PoolSettings) -> None:
    """Set the pool's size before its first use; a pool already running keeps its settings until shut down."""
    global _settings
    with _lock:
        _settings = settings


def get_pool() -> pydantic_monty.Monty:
    """The process's pool, started on first call."""
    global _pool
    with _lock:
        if _pool is None:
            pool = pydantic_monty.Monty(
                min_processes=1,
                max_processes=_settings.max_processes,
                checkout_timeout=_settings.checkout_timeout,
            )
            pool.__enter__()
            _pool = pool
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
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.__exit__(None, None, None)


atexit.register(shutdown_pool)
