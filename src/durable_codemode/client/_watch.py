"""Live progress of a run: `codemode watch RUN_ID` and `codemode run --follow`.

The run's history is followed with Temporal's long poll (`GetWorkflowExecutionHistory` with `wait_new_event`),
so a line appears as soon as the server records the event, and nothing runs in the workflow for it:
- model turns from the model-request activities (their results say which snippet or answer came next);
- nested calls from the tool activities' scheduled and closed events and their summaries
  (`call_0.3 get(i=3)`); a local activity has no scheduled event, so it shows when it completes;
- a snippet that makes more than a few calls (a long gather) prints its first calls, then a progress line
  (`call_3: 120/200 done`) at most every `progress_every` seconds and when the last one finishes; errors always;
- continue-as-new is followed into the next run.

The events are decoded by `_history_events.RunReader`, the one reader `codemode trace` and the replay reports use.

It stops when the run closes, or when it can go no further without a person: a pending approval (asked of the
run by the `pending_approvals` query after the history has been quiet for a moment) and no call in flight. Then
it prints what waits and the commands that decide it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TextIO

from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from .._history_events import RecordedActivity, RecordedRun, RunReader
from .._history_payloads import decode_events, for_run
from ..shared._approvals import PendingApproval
from ..shared._errors import RunNotFoundError
from ..shared._names import (
    DESCRIBE_AGENT_ACTIVITY,
    MODEL_REQUEST_ACTIVITY,
    RUN_CODE_TOOL,
)
from ..shared._records import RunResult
from ..shared._results import call_arguments, code_lines, preview, printable
from ..workflow._run import CodeModeRunWorkflow
from ._deciding import children_waiting

__all__ = ["WatchOutcome", "WatchState", "watch_run"]

_FEW = 8
"""A snippet's first calls are printed one by one; past this many, progress lines instead."""

_QUIET = timedelta(seconds=1)
"""History silent this long while the run is open: ask whether it waits for a person."""


WatchState = Literal["completed", "failed", "waiting", "terminated", "cancelled", "timed-out"]
"""How a watched run stood when watching stopped."""


@dataclass
class WatchOutcome:
    """How a watched run stood when watching stopped."""

    state: WatchState
    result: RunResult[Any] | None = None
    failure: str | None = None
    pending: list[PendingApproval] = field(default_factory=list)


def _label(call_id: str, tool: str, arguments: dict[str, Any]) -> str:
    return f"{call_id} {tool}({call_arguments(arguments, 80)})"


@dataclass
class _Call:
    label: str
    snippet: str
    scheduled_ns: int
    shown: bool = False


@dataclass
class _Snippet:
    started: int = 0
    done: int = 0
    errors: int = 0
    last_progress: float = 0.0
    progress_shown: int = 0


class _Follower:
    def __init__(self, out: TextIO, progress_every: float) -> None:
        self._out = out
        self._progress_every = progress_every
        self._calls: dict[int, _Call] = {}
        """Open tool activities by scheduled event id."""
        self._models: dict[int, str] = {}
        self._snippets: dict[str, _Snippet] = {}

    def say(self, text: str) -> None:
        # One line each: whatever a run's text holds (ESC, CR, a newline) is shown escaped.
        print(printable(text), file=self._out, flush=True)

    @property
    def in_flight(self) -> int:
        return len(self._calls) + len(self._models)

    def snippet_of(self, call_id: str) -> tuple[str, _Snippet]:
        """The snippet a nested call `call_id` belongs to: its name (the `run_code` call id) and its counts."""
        name = call_id.rsplit(".", 1)[0] if "." in call_id else call_id
        return name, self._snippets.setdefault(name, _Snippet())

    def event(self, reader: RunReader, event: HistoryEvent) -> WatchOutcome | str | None:
        """Print what `event` says; a closing event gives the outcome (or the next run id, for continue-as-new)."""
        read = reader.read(event)
        act = read.activity
        if read.task_failure is not None:
            self.say(f"! a workflow task failed (Temporal retries it): {read.task_failure[:300]}")
        elif read.closed:
            return self._closed(reader.run)
        elif act is None or act.activity_type == DESCRIBE_AGENT_ACTIVITY:
            pass
        elif act.local:  # recorded once finished: opened and closed at once
            if act.activity_type != MODEL_REQUEST_ACTIVITY:
                label = act.activity_id.rsplit("-", 1)[0] + f" {act.activity_type.rsplit('.', 1)[-1]}() (local)"
                self._started(-act.event_id, label, act.activity_id, event.event_time.ToNanoseconds(), quiet=True)
                self._closed_call(-act.event_id, act, "")
        elif read.opened:
            summary = act.summary or act.activity_id
            if act.activity_type == MODEL_REQUEST_ACTIVITY:
                self._models[act.event_id] = summary
                self.say(f"{summary} …")
            else:
                self._started(act.event_id, self._call_label(act, summary), act.activity_id,
                              event.event_time.ToNanoseconds())
        elif act.event_id in self._models:
            turn = self._models.pop(act.event_id)
            if act.closed == "completed":
                self._model_answered(turn, act.result)
            else:
                self.say(f"{turn}: the model request failed: {self._failure(act)}")
        elif act.event_id in self._calls:
            elapsed = (event.event_time.ToNanoseconds() - self._calls[act.event_id].scheduled_ns) / 1e6
            self._closed_call(act.event_id, act, f" {elapsed:.0f} ms")
        return None

    @staticmethod
    def _call_label(act: RecordedActivity, summary: str) -> str:
        call_id, tool, args = act.tool_call()
        return summary if args is None else _label(call_id, tool, args)

    def _closed_call(self, event_id: int, act: RecordedActivity, elapsed: str) -> None:
        call = self._calls.pop(event_id)
        if act.closed == "completed":
            self._finished(call, f"ok{elapsed} → {preview(act.result, 60)}", False)
        else:
            self._finished(call, self._failure(act), True)

    @staticmethod
    def _failure(act: RecordedActivity) -> str:
        if act.closed == "failed":
            return act.failure or "failed"
        if act.closed == "timed_out":
            return f"timed out: {act.failure}"
        return "cancelled"

    @staticmethod
    def _closed(run: RecordedRun) -> WatchOutcome | str:
        """How the run closed; the next run's id when it continued as new."""
        status, failure = run.run.status, run.run.failure
        if status == "continued_as_new" and run.run.continued_as:
            return run.run.continued_as
        if status == "completed":
            return WatchOutcome("completed", result=run.result)
        if status == "failed":
            return WatchOutcome("failed", failure=failure)
        if status == "terminated":
            return WatchOutcome("terminated", failure=failure)
        if status == "cancelled":
            return WatchOutcome("cancelled")
        return WatchOutcome("timed-out")

    def _model_answered(self, turn: str, response: object) -> None:
        if not isinstance(response, ModelResponse):
            self.say(f"{turn}: answered")
            return
        for part in response.parts:
            if isinstance(part, ToolCallPart) and part.tool_name == RUN_CODE_TOOL:
                code = part.args_as_dict().get("code", "")
                lines = code_lines(str(code).rstrip("\r\n"))
                self.say(f"{turn} → run_code {part.tool_call_id} ({len(lines)} lines)")
                for line in lines[:6]:
                    self.say(f"   │ {line}")
                if len(lines) > 6:
                    self.say("   │ …")
            elif isinstance(part, ToolCallPart):
                self.say(f"{turn} → {part.tool_name}({call_arguments(part.args_as_dict(), 80)})")
            elif isinstance(part, TextPart) and part.content.strip():
                self.say(f"{turn} → answer: {preview(part.content, 200)}")

    def _started(self, event_id: int, label: str, activity_id: str, at_ns: int, *, quiet: bool = False) -> None:
        call_id = label.split(" ", 1)[0] if " " in label else activity_id.rsplit("-", 1)[0]
        name, snippet = self.snippet_of(call_id)
        call = self._calls[event_id] = _Call(label=label, snippet=name, scheduled_ns=at_ns)
        snippet.started += 1
        if not quiet and snippet.started <= _FEW:
            self.say(f"  ▸ {label}")
            call.shown = True
        elif not quiet and snippet.started == _FEW + 1:
            self.say(f"  ▸ … more calls from {name}; progress below")

    def _finished(self, call: _Call, text: str, error: bool) -> None:
        snippet = self._snippets[call.snippet]
        snippet.done += 1
        snippet.errors += error
        if error or call.shown or snippet.started <= _FEW:
            self.say(f"  {'✗' if error else '✓'} {call.label}  {text}")

    def progress(self, *, final: bool = False) -> None:
        """A progress line for each long snippet that moved since its last one (at most every few seconds)."""
        now = time.monotonic()
        for name, snippet in self._snippets.items():
            if snippet.started <= _FEW or snippet.done == snippet.progress_shown:
                continue
            finished = snippet.done >= snippet.started
            if finished or final or now - snippet.last_progress >= self._progress_every:
                errors = f" ({snippet.errors} errors)" if snippet.errors else ""
                self.say(f"  {name}: {snippet.done}/{snippet.started} done{errors}")
                snippet.last_progress, snippet.progress_shown = now, snippet.done


async def _pending(client: Client, workflow_id: str, run_id: str) -> list[PendingApproval] | None:
    handle = client.get_workflow_handle_for(CodeModeRunWorkflow.run, workflow_id, run_id=run_id)
    try:
        own = await handle.query(CodeModeRunWorkflow.pending_approvals, rpc_timeout=timedelta(seconds=2))
        # Its child runs' calls, read from each child (a run lists only its own).
        return own + await children_waiting(client, workflow_id, timeout=timedelta(seconds=2))
    except Exception:  # no worker yet, a closing run: not a reason to stop watching
        return None


async def watch_run(client: Client, workflow_id: str, *, run_id: str | None = None, out: TextIO,
                    progress_every: float = 2.0) -> WatchOutcome:
    """Print a run's progress to `out` until it closes or waits for a person.

    Raises:
        RunNotFoundError: no run with that id.

    """
    follower = _Follower(out, progress_every)
    if run_id is None:
        try:
            run_id = (await client.get_workflow_handle(workflow_id).describe()).run_id
        except RPCError as e:
            if e.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                raise RunNotFoundError(workflow_id, client.service_client.config.target_host) from e
            raise
    token = b""
    reader = RunReader(workflow_id, run_id)
    codec = for_run(client.data_converter.payload_codec, client.namespace, workflow_id)
    told_waiting: set[str] = set()
    while True:
        request = GetWorkflowExecutionHistoryRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            next_page_token=token, wait_new_event=True)
        try:
            response = await client.workflow_service.get_workflow_execution_history(request, timeout=_QUIET)
        except RPCError as e:
            if e.status not in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
                raise
            response = None
        if response is not None:
            await decode_events(response.history.events, codec)  # encrypted runs
            for event in response.history.events:
                outcome = follower.event(reader, event)
                if isinstance(outcome, WatchOutcome):
                    follower.progress(final=True)
                    return outcome
                if isinstance(outcome, str):  # continued as new: follow the next run from its start
                    follower.say("… continued as new (a fresh workflow run; the conversation goes on)")
                    run_id, token = outcome, b""
                    reader = RunReader(workflow_id, run_id)
                    break
            else:
                token = response.next_page_token
            follower.progress()
            if response.history.events:
                continue
        # Quiet: is the run held up by a person?
        pending = await _pending(client, workflow_id, run_id)
        if pending:
            fresh = [p for p in pending if p.call_id not in told_waiting]
            for p in fresh:
                label = _label(p.call_id, p.tool, p.args)
                follower.say(f"  ⏸ {label} waits for approval (line {p.line})")
                told_waiting.add(p.call_id)
            if follower.in_flight == 0:
                follower.progress(final=True)
                return WatchOutcome("waiting", pending=pending)
        await asyncio.sleep(0)
