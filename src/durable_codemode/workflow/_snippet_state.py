"""What the snippet driver keeps of a program between its stretches, and the budgets of its compute activity.

This module runs in workflow code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, TypeVar

from temporalio.common import RetryPolicy

from ..shared._records import CallRecord
from ..shared._results import preview
from ._sandbox_types import SnippetOutcome

T = TypeVar("T")

__all__ = [
    "COMPUTE_HEARTBEAT",
    "COMPUTE_RETRY",
    "DUMP_LIMIT_WITHOUT_STORE",
    "MAX_ANSWERS_SINCE_DUMP",
    "Base",
    "Completed",
    "InFlight",
    "Parked",
    "PendingFutures",
    "SnippetEnded",
    "too_large",
]

@dataclass
class Parked:
    """A program dumped while it waited; loaded again (`Repl.unpark`) only when its next stretch runs."""

    state: bytes


@dataclass
class Completed:
    """A snippet the compute activity finished: its value (as JSON) and the REPL after it."""

    output: Any
    state: bytes | None


@dataclass(slots=True)
class InFlight:
    """A tool call the program started and has not had the answer of; its record is made only if it never does.

    (Every call has one while it runs; a `CallRecord` and the preview of its arguments per call cost more than the
    call's own bookkeeping in a replay of a 200-call gather.)
    """

    call_id: str
    tool: str
    args: dict[str, Any]
    started_at: datetime

    def cancelled(self) -> CallRecord:
        return CallRecord(call_id=self.call_id, tool=self.tool, args=preview(self.args), status="cancelled",
                          result="the program ended before this call finished; the tool may still have run",
                          started_at=self.started_at, finished_at=self.started_at)


@dataclass
class Base:
    """Where the compute activity would start a stretch from: a dump, and the answers given since."""

    start: Literal["feed", "snapshot"]
    state: bytes | None
    printed: str
    """What the program had printed when `state` was taken (the activity prints the rest again)."""
    answers: list[Any] = field(default_factory=list)


def too_large(size: int) -> str:
    return (f"it computed past its in-workflow budget with {size:,} bytes of state (compressed), more than a "
            "compute activity can carry without a payload store (Temporal refuses payloads over 2 MiB): give the "
            "workers a payload store (CODEMODE_PAYLOAD_STORE), or keep less data in variables")


class SnippetEnded(Exception):
    """The snippet ends with `outcome` (it came back from the compute activity finished, failed or lost)."""

    def __init__(self, outcome: SnippetOutcome) -> None:
        super().__init__(outcome.kind)
        self.outcome = outcome


COMPUTE_HEARTBEAT = timedelta(seconds=5)
COMPUTE_RETRY = RetryPolicy(maximum_attempts=3)
"""Attempts of the compute activity: an attempt fails only when its worker is lost (a sandbox crash is a result)."""

MAX_ANSWERS_SINCE_DUMP = 200
"""Answers a program may be given since its last dump while it keeps its process over waits; then it is dumped
at its next wait, so the compute activity never has a long history of answers to give again."""

DUMP_LIMIT_WITHOUT_STORE = 1_800_000
"""Characters of encoded dump (`_compute_wire.encode_dump`) a compute activity may carry without a payload
store: inside Temporal's 2 MiB payload limit, with room for the rest of the payload."""


class PendingFutures(dict[int, "asyncio.Future[T]"], Generic[T]):
    """A program's tool calls and sleeps in flight, by Monty call id, and one waiter for a wait on some of them.

    `workflow.wait(futures, return_when=FIRST_COMPLETED)` adds a callback to every future it is given and removes
    them all when it returns, so a program waiting on a gather of N calls paid O(N) at each of its wakes. Here
    each future gets its callback once, when it starts (`track`). The order is `workflow.wait`'s: a finished
    future schedules its callback, which resolves the waiter, which schedules the program's wake; a future the
    program does not wait on resolves nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self._awaited: frozenset[int] = frozenset()
        """The Monty call ids the program waits on now (`first_done`); empty while it computes."""
        self._wake: asyncio.Future[None] | None = None
        """Resolved by the first of `_awaited` to finish."""

    def track(self, monty_id: int, future: asyncio.Future[T]) -> None:
        """Keep a started call's (or sleep's) future; it wakes a wait on it when it finishes."""
        self[monty_id] = future
        future.add_done_callback(lambda _: self._finished(monty_id))

    def _finished(self, monty_id: int) -> None:
        wake = self._wake
        if wake is not None and not wake.done() and monty_id in self._awaited:
            wake.set_result(None)

    async def first_done(self, ids: Iterable[int]) -> None:
        """Wait until one of `ids` (none done yet) is done."""
        self._awaited = frozenset(ids)
        self._wake = wake = asyncio.get_running_loop().create_future()
        try:
            await wake
        finally:
            self._wake = None
            self._awaited = frozenset()
