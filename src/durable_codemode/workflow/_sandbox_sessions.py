"""What workflow code needs of the worker's Monty processes, and how the worker hands them over.

The processes, their threads and clocks belong to the worker (`worker/_pool`): nothing of them is replayed.
Workflow code only checks a session out, warms one, and asks to keep one over a short wait; it sees them through
`SandboxSessions`, which the worker's pool provides for its process when it is built (`provide_sandbox_sessions`),
so this folder imports nothing of the worker's.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

import pydantic_monty

from ..shared._errors import CodeModeError

__all__ = ["SandboxSessions", "SessionKind", "provide_sandbox_sessions", "sandbox_sessions"]

SessionKind = Literal["live", "replay", "compute"]
"""Which of the pool's process groups serves a checkout: live tasks, replayed tasks, the compute activity."""


class SandboxSessions(Protocol):
    """The Monty sessions of this process, as workflow code uses them (`worker/_pool.SandboxPool` says how)."""

    def session(self, options: dict[str, Any], *, kind: SessionKind = "live", warm_key: str | None = None
                ) -> AbstractContextManager[pydantic_monty.MontySession]:
        """A session checked out for the `with` block (raises `TimeoutError` if no process is free in time)."""
        ...

    def prewarm_session(self, key: str, options: dict[str, Any]) -> bool:
        """Start warming a session for a snippet that may come, under `key`; whether one is being warmed."""
        ...

    def discard_warm_session(self, key: str) -> None:
        """Drop the session warmed under `key`: its snippet will not come."""
        ...

    def try_hold(self) -> bool:
        """Take one place of the hold budget, to keep a session over a short wait; `False` if none is free."""
        ...

    def release_hold(self) -> None:
        """Give back the place `try_hold` took."""
        ...


_provided: SandboxSessions | None = None


def provide_sandbox_sessions(sessions: SandboxSessions) -> None:
    """The process's pool, for every run workflow this process hosts (a worker's, or a replayer's)."""
    global _provided
    _provided = sessions


def sandbox_sessions() -> SandboxSessions:
    """The process's pool, as `provide_sandbox_sessions` gave it.

    Raises:
        CodeModeError: none was given: the run workflow is hosted by something that did not import the worker's
            pool (`durable_codemode.worker`), which every worker and replayer of this package does.

    """
    if _provided is None:
        raise CodeModeError(
            "no Monty sandbox pool in this process: host the run workflow with durable_codemode's create_worker or "
            "its replay tools, or import durable_codemode (which provides the pool) before building a Worker or "
            "Replayer yourself")
    return _provided
