"""What the REPL, its snippet driver and the run workflow hand each other: a snippet's outcome, a call's site.

This module runs in workflow code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pydantic_monty
from temporalio import workflow

from ..shared._records import CallRecord
from ..shared._results import preview

if TYPE_CHECKING:
    from ..shared._types import AgentSpec
    from ._catalog import CatalogIndex
    from ._files import RunFilesystem
    from ._sandbox_sessions import SandboxSessions

__all__ = [
    "AwaitingPerson",
    "CallSite",
    "DrivenRepl",
    "SandboxNotices",
    "SandboxUnavailableError",
    "Settled",
    "SnippetOutcome",
    "StartTool",
    "is_replaying",
]

Settled = dict[str, Any]
"""A settled Monty answer: `{'return_value': v}` or `{'exc_type': 'ValueError', 'message': m}`."""

@dataclass(frozen=True)
class CallSite:
    """Where in a program a tool call is."""

    code: str
    line: int


StartTool = Callable[[str, dict[str, Any], str, CallSite], Awaitable[tuple[Settled, CallRecord]]]
"""Starts one tool call `(tool, kwargs, call_id, site)` and returns what settles it; supplied by the workflow.

It is called synchronously when the program makes the call, so anything it registers (a pending approval) is
visible before the program next waits."""

AwaitingPerson = Callable[[str], bool]
"""Whether the call with this id is waiting for a human decision (so the sandbox may be released meanwhile)."""


class SandboxNotices(Protocol):
    """What a program does that the run's observers hear of (`RunProgress`): what it prints, compute it hands on."""

    def printed(self, *, call_id: str, text: str) -> None: ...

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None: ...


class SandboxUnavailableError(RuntimeError):
    """No sandbox process was free in time (a worker breaking the rule of `PoolSettings`, under load).

    Raised in workflow code, it fails the workflow task (not the workflow), so Temporal retries the task once a
    process is free.
    """


@dataclass(kw_only=True)
class SnippetOutcome:
    """What one `run_code` call came to."""

    kind: Literal["ok", "error", "rejected", "compute_limit", "sandbox_crashed"]
    content: Any
    """For the model: the bounded result object (`ok`, `error`) or the message to retry with (`rejected`)."""
    calls: list[CallRecord] = field(default_factory=list)
    restart_repl: bool = False
    """The program was stopped mid-way (deterministically, unlike a compute limit): its REPL is discarded."""
    computed_seconds: float | None = None
    """Compute the program did in compute activities, past its in-workflow budget (`None`: none)."""
    files: dict[str, int] | None = None
    """The run's files after the snippet (path -> bytes, at most `FILE_LISTING_LIMIT`), if it changed them."""
    files_omitted: int = 0

    @property
    def ends_run(self) -> bool:
        """Whether the workflow run must continue as new now, in this workflow task."""
        return self.kind in ("compute_limit", "sandbox_crashed")

    @property
    def summary(self) -> str:
        """A preview for the run's summary."""
        return preview(self.content)


def is_replaying() -> bool:
    """Whether this activation replays history: what the live run decided is then read, never decided again."""
    return workflow.unsafe.is_replaying()


class DrivenRepl(Protocol):
    """What the snippet driver (`_snippet_driver`) uses of the REPL it drives (`_sandbox.Repl` is the one).

    A protocol, so the driver's module does not import the REPL's, which imports it to drive each snippet.
    """

    spec: AgentSpec
    start_tool: StartTool
    sessions: SandboxSessions
    notices: SandboxNotices
    files: RunFilesystem | None
    awaiting_person: AwaitingPerson
    lenient_names: bool

    @property
    def catalog(self) -> CatalogIndex | None: ...

    @property
    def idle_dump(self) -> bytes | None: ...

    @property
    def session(self) -> pydantic_monty.MontySession | None: ...

    def take_reserved_seed(self) -> tuple[int, str] | None: ...

    def park(self, snapshot: pydantic_monty.FutureSnapshot | pydantic_monty.FunctionSnapshot) -> bytes: ...

    def unpark(self, state: bytes, streams: pydantic_monty.CollectStreams) -> Any: ...

    def close(self) -> None: ...

    def adopt(self, state: bytes | None) -> None: ...

    def open_session(self, seed: int, warm_key: str | None = None
                     ) -> tuple[pydantic_monty.MontySession, str | None]: ...
