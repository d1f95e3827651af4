"""What a run is doing, for people: the Temporal UI's current details, and its status for `codemode runs`.

- **Current details** (`workflow.set_current_details`) say the run's phase: `model turn 3`, `model turn 3:
  snippet call_3 running: 120 calls in flight, 80 done`, or, first, `waiting for approval of 2 call(s): ...`
  (then `snippet call_3 waiting: 0 calls in flight, 2 waiting for approval, 5 done`: a call waiting for a person
  has not started, so it is not in flight). The model's call ids in them are escaped (`_results.printable`).
  They live in workflow memory and reach the UI (and `current_details()`) through Temporal's built-in metadata
  query; they are not written to history, so updating them on every call start and finish of a 200-call gather
  costs no event and no byte (measured: the same event count and history size with and without). Nothing reads
  them before the activation ends (a query is an activation of its own), so a change only marks them due, and
  they are published once, by a callback at the end of the activation's ready queue: a gather of 200 calls
  wrote them 400 times in one activation before.
- **Status** (`running` / `waiting`, for "waiting for approval", then `completed` / `failed` / `cancelled` as
  the run's code ends it) is written where visibility can filter on it: the `CodemodeStatus` search attribute
  when the run was started with it (the server has it registered), else the `status` memo key when the run was
  started with that. Each change is one history event, and it changes only when the first approval of a run
  starts waiting or the last one is decided, and once at the end (runs of behaviour version 2 on). A run started
  with neither (by an older client) writes nothing, so its history replays exactly as it was recorded.

This module also hands the workflow's steps to the run's observers (`_observers.RunTelemetry`: spans, the history
tools' replays), so the workflow has one hook per step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import TemporalError, is_cancelled_exception

from ..shared._names import (
    STATUS_CANCELLED,
    STATUS_COMPLETED,
    STATUS_FAILED,
    STATUS_MEMO,
    STATUS_RUNNING,
    STATUS_SEARCH_ATTRIBUTE,
    STATUS_WAITING,
)
from ..shared._results import clip, printable
from ._observers import NO_TELEMETRY, ApprovalState, RunTelemetry, observe_run, run_telemetry

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart

    from ..shared._approvals import ApprovalRecord, PendingApproval
    from ..shared._records import CallRecord, RunResult
    from ._approval_state import Approvals
    from ._sandbox_types import Settled, SnippetOutcome

__all__ = ["RunProgress"]

_STATUS_KEY = SearchAttributeKey.for_keyword(STATUS_SEARCH_ATTRIBUTE)


def _calls(n: int) -> str:
    return f"{n} call" if n == 1 else f"{n} calls"


class RunProgress:
    """The phase of one workflow run, shown as its current details; the hooks the workflow calls per step."""

    def __init__(self, approvals: Callable[[], Approvals]) -> None:
        self.telemetry: RunTelemetry = NO_TELEMETRY
        self._approvals = approvals
        self._turn: int | None = None
        self._snippet_shown: str | None = None
        """The running snippet's `run_code` call id (the model's: untrusted) as the details show it, escaped once."""
        self._open: set[str] = set()
        """The calls made and not yet settled (their approval wait included): in flight, or waiting for a person."""
        self._done = 0
        self._status: str | None = None
        self._status_via: str | None = None
        """Where the status is written: "search attribute", "memo", or None (the run was not started with it)."""
        self._owner: object | None = None
        """The workflow instance this progress belongs to, from the moment its run starts (see `show`)."""
        self._details_due = False
        """Whether a publication of the details is scheduled in this activation (see `show`)."""
        self._ended_as: str | None = None
        """The status the run's code ended it with (`_ended`): final."""

    def details(self) -> str:
        """The current details text: what waits for a person first, then where the run is."""
        lines = []
        waiting = self._approvals().details()
        if waiting:
            lines.append(waiting)
        if self._turn is not None:
            where = f"model turn {self._turn}"
            # A call waiting for a person has not started: it is not "in flight".
            pending = self._approvals().pending
            gated = sum(1 for call_id in self._open if call_id in pending)
            calls = f"{_calls(len(self._open) - gated)} in flight, " + (
                f"{gated} waiting for approval, " if gated else "") + f"{self._done} done"
            if self._snippet_shown is not None:
                verb = "waiting" if waiting else "running"
                where += f": snippet {self._snippet_shown} {verb}: {calls}"
            elif self._open or self._done:
                where += f": {calls}"
            lines.append(where)
        return "\n".join(lines)

    def show(self) -> None:
        """Publish the details, and the status when it changed.

        Only for this progress's own workflow instance. A worker that shuts down (or evicts a run) drops its
        workflow instances without finishing their coroutines; the garbage collector later runs their `finally`
        blocks, which call this, at whatever moment it collects them: outside workflow code, or inside the
        activation of another run, even a replay of the same run. Such a call once wrote a dropped run's
        "waiting" status into another run, an upsert the live run never made (TMPRL1100 on replay).
        """
        if not self._in_own_workflow():
            return
        if not self._details_due:  # published once, after everything this activation does (module docstring)
            self._details_due = True
            asyncio.get_running_loop().call_soon(self._publish_details)
        status = STATUS_WAITING if self._approvals().pending else STATUS_RUNNING
        if status != self._status and not self._ended_as:  # a history event: written at once, where it changed
            self._write_status(status)

    def _in_own_workflow(self) -> bool:
        # One lookup of the running workflow, not two (`in_workflow()`, then `instance()`): this runs four times a
        # tool call. Outside workflow code `instance()` raises, which only the garbage collector's calls meet.
        if self._owner is None:
            return False
        try:
            return workflow.instance() is self._owner
        except TemporalError:  # not in a workflow's event loop (`tests/test_progress.py`)
            return False

    def _publish_details(self) -> None:
        self._details_due = False
        if self._in_own_workflow():
            workflow.set_current_details(self.details())

    def _write_status(self, status: str) -> None:
        if self._status is None:  # first call: where this run keeps its status, and what it says now
            info = workflow.info()
            if info.typed_search_attributes.get(_STATUS_KEY) is not None:
                self._status_via, self._status = "search attribute", info.typed_search_attributes.get(_STATUS_KEY)
            elif STATUS_MEMO in info.raw_memo:
                self._status_via, self._status = "memo", workflow.memo_value(STATUS_MEMO, type_hint=str)
            else:
                self._status_via, self._status = None, status
            if status == self._status:
                return
        self._status = status
        if self._status_via == "search attribute":
            workflow.upsert_search_attributes([_STATUS_KEY.value_set(status)])
        elif self._status_via == "memo":
            workflow.upsert_memo({STATUS_MEMO: status})

    # -- hooks ---------------------------------------------------------------------------------------------------

    def start(self, approvals: Callable[[], ApprovalState]) -> None:
        """First thing as the run starts: take its observers (`_observers.observe_run`), and show them its approvals."""
        self.telemetry = run_telemetry()
        self.telemetry.approvals(approvals)

    def observe(self, observer: RunTelemetry) -> None:
        """Add the run's own `observer` (its event stream, once the run knows it streams), before its loop starts."""
        observe_run(observer)
        self.telemetry = run_telemetry()

    def run(self, coro: Coroutine[Any, Any, RunResult[Any]], *, agent: str, run_index: int, records_end: bool
            ) -> Coroutine[Any, Any, RunResult[Any]]:
        """Around the run's loop; `records_end`: the run writes how its code ended it into its status (`_ending`).

        `records_end` is the run's recorded behaviour (`AgentSpec.behavior_version` 2 on): runs of version 1 wrote
        no such status, and replay as they ran.
        """
        self._owner = workflow.instance()
        traced = self.telemetry.run(coro, agent=agent, run_index=run_index)
        return self._ending(traced) if records_end else traced

    async def _ending(self, coro: Coroutine[Any, Any, RunResult[Any]]) -> RunResult[Any]:
        try:
            result = await coro
        except BaseException as e:
            self._ended(e)
            raise
        self._ended(None)
        return result

    def _ended(self, error: BaseException | None) -> None:
        """The run's code ends the run (`error`: how, `None`: completed): its status says so, in this workflow task.

        Without this a run's status stayed what it was last (`waiting`, for a run failed or cancelled while a call
        waited for a person), so a filter on the status alone listed runs long gone. Continue-as-new is no end (the
        next run carries the status on), nor is an exception that fails the workflow task (the task is retried).
        Temporal ends some runs without their code running (terminate, an execution timeout): those keep the
        status they had, and visibility's `ExecutionStatus` tells them apart.
        """
        if not self._in_own_workflow():
            return
        if error is None:
            status = STATUS_COMPLETED
        elif isinstance(error, asyncio.CancelledError) or (
                isinstance(error, Exception) and is_cancelled_exception(error)):
            status = STATUS_CANCELLED  # the run was asked to cancel: nothing else cancels its main coroutine
        elif isinstance(error, Exception) and workflow.is_failure_exception(error):
            status = STATUS_FAILED
        else:
            return
        self._ended_as = status  # what the calls still settling as the run ends show no longer changes it
        if status != self._status:
            self._write_status(status)

    def model_request(self, coro: Coroutine[Any, Any, ModelResponse], *, turn: int, model: str | None
                      ) -> Coroutine[Any, Any, ModelResponse]:
        """Around a model request: the run is now at model turn `turn`."""
        self._turn, self._done = turn, 0
        self._set_snippet(None)
        self._open.clear()
        self.show()
        return self.telemetry.model_request(coro, turn=turn, model=model)

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        """Around one `run_code` snippet."""
        return self._snippet_running(self.telemetry.snippet(coro, call_id=call_id, code=code), call_id)

    async def _snippet_running(self, coro: Coroutine[Any, Any, SnippetOutcome], call_id: str) -> SnippetOutcome:
        self._done = 0
        self._set_snippet(call_id)
        self._open.clear()
        self.show()
        try:
            return await coro
        finally:
            self._done = 0
            self._set_snippet(None)
            self._open.clear()
            self.show()

    def _set_snippet(self, call_id: str | None) -> None:
        self._snippet_shown = None if call_id is None else printable(clip(call_id, 80))

    def run_code_refused(self, *, call_id: str, args: dict[str, Any]) -> None:
        """A `run_code` call with arguments it does not take: no snippet runs."""
        self.telemetry.run_code_refused(call_id=call_id, args=args)

    def tool_calls(self, calls: Sequence[ToolCallPart]) -> None:
        """The model's function tool calls of one response are about to run (`RunTelemetry.tool_calls`)."""
        self.telemetry.tool_calls(calls)

    def tool_returned(self, part: ToolReturnPart) -> None:
        """One of them is answered (`RunTelemetry.tool_returned`)."""
        self.telemetry.tool_returned(part)

    def printed(self, *, call_id: str, text: str) -> None:
        """A program printed `text` since it last waited (`RunTelemetry.printed`)."""
        self.telemetry.printed(call_id=call_id, text=text)

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None:
        """A program went past its in-workflow compute budget (`RunTelemetry.compute_escalated`)."""
        self.telemetry.compute_escalated(call_id=call_id, stretch=stretch, reason=reason)

    def approval_waiting(self, pending: PendingApproval, *, policy: str | None) -> None:
        """A call starts waiting for a person (`RunTelemetry.approval_waiting`); the details show it."""
        self.telemetry.approval_waiting(pending, policy=policy)
        self.show()

    def approval_decided(self, record: ApprovalRecord) -> None:
        """A waiting call was decided (`RunTelemetry.approval_decided`)."""
        self.telemetry.approval_decided(record)

    def child_run_started(self, *, call_id: str, run_id: str, agent: str) -> None:
        self.telemetry.child_run_started(call_id=call_id, run_id=run_id, agent=agent)

    def child_run_ended(self, *, call_id: str, run_id: str, error: str | None) -> None:
        self.telemetry.child_run_ended(call_id=call_id, run_id=run_id, error=error)

    def continuing(self, *, run_index: int) -> None:
        """The run continues as new (`RunTelemetry.continuing`)."""
        self.telemetry.continuing(run_index=run_index)

    def call_made(self, *, tool: str, call_id: str, args: dict[str, Any], code: str, line: int) -> None:
        """A tool call is made, before anything is asked of it (`RunTelemetry.call_made`)."""
        self.telemetry.call_made(tool=tool, call_id=call_id, args=args, code=code, line=line)

    def call(self, start: Callable[[], Coroutine[Any, Any, tuple[Settled, CallRecord]]], *, tool: str,
             call_id: str, args: dict[str, Any]) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        """Around one tool call (its approval wait included), from the moment the program makes it.

        `start` makes the call's coroutine only once this one runs: the task running it may be cancelled before
        its first step (an eviction cancels every task), and a coroutine made but never started would be
        reported as "never awaited".
        """
        self._open.add(call_id)
        self.show()
        return self._counted(start, tool, call_id, args, self._approvals())

    async def _counted(self, start: Callable[[], Coroutine[Any, Any, tuple[Settled, CallRecord]]], tool: str,
                       call_id: str, args: dict[str, Any], approvals: Approvals) -> tuple[Settled, CallRecord]:
        try:
            return await self.telemetry.call(start(), tool=tool, call_id=call_id, args=args, approvals=approvals)
        finally:
            if call_id in self._open:  # else counted already, or in a snippet or turn that ended before it
                self._open.discard(call_id)
                self._done += 1
            self.show()
