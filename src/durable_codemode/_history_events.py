"""One run's history, decoded event by event: what `read_run` (traces, replay reports) and `watch` both read.

A history is a list of Temporal events; what a run did is in their payloads: the model requests and tool calls are
activities (a local activity is a `core_local_activity` marker, recorded once it has finished), a `child_run_tool`
call is a child workflow, decisions are updates and signals, and the run's end is its closing event. `RunReader`
turns each event into that: the `RecordedActivity` it opened or closed, a failed workflow task, the run's end, all
kept in one `RecordedRun`. `read_run` reads a whole history at once; `client/_watch` reads one as the server
records it, and prints each change.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic_ai.messages import ModelResponse
from pydantic_ai.usage import RunUsage
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from ._converter import DATA_CONVERTER
from .shared._activity_io import ModelRequestInput
from .shared._approvals import (
    APPROVE_SIGNAL,
    DECIDE_ALL_UPDATE,
    DECIDE_UPDATE,
    DENY_SIGNAL,
    ApprovalDecision,
    ApprovalRecord,
)
from .shared._errors import CodeModeUserError
from .shared._names import (
    DESCRIBE_AGENT_ACTIVITY,
    MODEL_REQUEST_ACTIVITY,
    call_id_of_activity,
    tool_activity_type,
    tool_of_activity_type,
)
from .shared._records import RunResult
from .shared._tool_usage import split_usage
from .shared._types import AgentSpec, RunInput

__all__ = [
    "EventRead",
    "RecordedActivity",
    "RecordedRun",
    "RunReader",
    "RunStatus",
    "TraceRun",
    "decode",
    "failure_text",
    "read_run",
    "summary_of",
]

RunStatus = Literal["running", "completed", "failed", "continued_as_new", "terminated", "cancelled", "timed_out"]
"""How a workflow run of a chain stands or ended."""


@dataclass(kw_only=True)
class TraceRun:
    """One workflow run of a continue-as-new chain."""

    run_id: str
    status: RunStatus
    started_at: datetime | None = None
    closed_at: datetime | None = None
    events: int = 0
    continued_as: str | None = None
    """The next run's id, when this one continued as new."""
    continue_reason: str | None = None
    """`compute_limit` or `sandbox_crashed` (a snippet ended the run), else `None` (the snippet cap, or Temporal
    suggested it)."""
    failure: str | None = None
    task_failures: list[str] = field(default_factory=list)
    """Workflow task failures (a wedged run retries its task: nondeterminism, a deadlock, a bug)."""

_LOCAL_ACTIVITY_MARKER = "core_local_activity"
"""The marker name under which Temporal's core records a local activity's result (its input is not recorded)."""


# -- payloads and failures -----------------------------------------------------------------------------------------


def decode(payloads: Payloads | Sequence[Payload], kind: Any = None) -> Any:
    """The first payload as `kind`; a payload of another shape raw (its JSON, or its text)."""
    items = list(payloads.payloads) if isinstance(payloads, Payloads) else list(payloads)
    if not items:
        return None
    try:
        return DATA_CONVERTER.payload_converter.from_payload(items[0], kind)
    except Exception:  # a payload of another shape (an older version, a hand-edited file): show it raw
        try:
            return json.loads(items[0].data)
        except ValueError:
            return items[0].data.decode(errors="replace")


def _cause_text(cause: WorkflowTaskFailedCause.ValueType) -> str:
    """What a workflow task failure the worker did not write (no failure attached) was, from its cause."""
    if cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND:
        # The server's own: over 100 events (or 2 MiB) arrived while the task ran, e.g. a gather's results.
        return ("closed by the server: more events arrived while the task ran than it buffers (Temporal's "
                "history.maximumBufferedEventsBatch, 100); the task ran again with them, nothing was lost")
    return f"failed ({WorkflowTaskFailedCause.Name(cause)})" if cause else "failed"


def _time(event: HistoryEvent) -> datetime:
    return event.event_time.ToDatetime(tzinfo=UTC)


def failure_text(failure: Failure) -> str:
    """`Type: message` of a failure, with its causes' messages when they say more (outermost first)."""
    told: list[str] = []
    current: Failure | None = failure
    while current is not None and current.ByteSize():
        kind = current.application_failure_info.type if current.HasField("application_failure_info") else ""
        if current.HasField("timeout_failure_info"):
            kind = "timed out"
        message = current.message.strip()
        text = f"{kind}: {message}" if kind and not message.startswith(kind) else message
        if text and not any(text in t for t in told):
            told.append(text)
        current = current.cause if current.HasField("cause") else None
    return ": ".join(told) or "failed"


def summary_of(event: HistoryEvent) -> str | None:
    """The summary the workflow gave the event's command (`call_0.3 get(i=3)`), if any."""
    if not event.HasField("user_metadata") or not event.user_metadata.HasField("summary"):
        return None
    value = decode([event.user_metadata.summary])
    return value if isinstance(value, str) else None


# -- parsing one run -----------------------------------------------------------------------------------------


@dataclass
class RecordedActivity:
    """A model request or tool call as the history recorded it (a local activity: from its marker)."""

    activity_type: str
    activity_id: str
    scheduled_at: datetime
    input: Any
    summary: str | None
    local: bool = False
    attempts: int = 0
    last_failure: str | None = None
    closed: str | None = None
    """`completed`, `failed`, `timed_out`, `cancelled`; `None` while open."""
    finished_at: datetime | None = None
    result: Any = None
    failure: str | None = None
    cancel_requested: bool = False
    event_id: int = 0
    """The event that scheduled it (or its marker)."""
    usage: RunUsage | None = None
    """A tool call's own model use (a sub-agent it ran), counted in the run's usage (`_tool_usage`)."""
    child_run_id: str | None = None
    """A `child_run_tool` call: the child run it started (a workflow, not an activity)."""

    def tool_call(self) -> tuple[str, str, dict[str, Any] | None]:
        """A tool call's id, tool and arguments (`None`: unreadable), read as the worker reads them.

        The input holds the arguments; the call id is the activity id's start and the tool the activity type's end
        (`ToolCallInput`). An input that names them (a batch's call, a child run's, a run recorded by 0.1.0) wins.
        """
        payload = self.input if isinstance(self.input, dict) else {}
        call_id = str(payload.get("call_id") or call_id_of_activity(self.activity_id))
        tool = str(payload.get("tool") or tool_of_activity_type(self.activity_type))
        args = payload.get("args")
        return call_id, tool, args if isinstance(args, dict) else None


@dataclass
class RecordedRun:
    """One history, read: the raw material `parse_histories` assembles into the trace."""

    run: TraceRun
    input: RunInput
    spec: AgentSpec | None = None
    activities: list[RecordedActivity] = field(default_factory=list)
    records: list[ApprovalRecord] = field(default_factory=list)
    signals: list[tuple[str, ApprovalDecision]] = field(default_factory=list)
    result: RunResult[Any] | None = None
    next_input: RunInput | None = None


def _read_marker(event: HistoryEvent) -> RecordedActivity | None:
    attrs = event.marker_recorded_event_attributes
    if attrs.marker_name != _LOCAL_ACTIVITY_MARKER or "data" not in attrs.details:
        return None
    data = decode(attrs.details["data"])
    if not isinstance(data, dict):
        return None
    activity = RecordedActivity(
        activity_type=str(data.get("activity_type", "")), activity_id=str(data.get("activity_id", "")),
        scheduled_at=_time(event), input=None, summary=None, local=True, attempts=int(data.get("attempt") or 1),
        closed="completed", finished_at=_time(event), event_id=event.event_id)
    scheduled = data.get("original_schedule_time")
    if isinstance(scheduled, dict) and "seconds" in scheduled:
        activity.scheduled_at = datetime.fromtimestamp(scheduled["seconds"] + scheduled.get("nanos", 0) / 1e9, UTC)
    if attrs.HasField("failure"):
        activity.closed, activity.failure = "failed", failure_text(attrs.failure)
    elif "result" in attrs.details:
        kind = AgentSpec if activity.activity_type == DESCRIBE_AGENT_ACTIVITY else None
        activity.result, activity.usage = split_usage(decode(attrs.details["result"], kind))
    return activity


_CHILD_CLOSED = {
    "child_workflow_execution_started_event_attributes": None,
    "child_workflow_execution_completed_event_attributes": "completed",
    "child_workflow_execution_failed_event_attributes": "failed",
    "child_workflow_execution_timed_out_event_attributes": "timed_out",
    "child_workflow_execution_canceled_event_attributes": "cancelled",
    "child_workflow_execution_terminated_event_attributes": "failed",
}
"""What a child run's events say about the `child_run_tool` call that started it (`None`: it started)."""


def _child_call(parent_id: str, event: HistoryEvent, spec: AgentSpec | None) -> RecordedActivity:
    """A `child_run_tool` call, as the history records it: the child run its call started, read like an activity."""
    attrs = event.start_child_workflow_execution_initiated_event_attributes
    child_input = decode(attrs.input, RunInput)
    agent = child_input.agent if isinstance(child_input, RunInput) else "?"
    prompt = child_input.prompt if isinstance(child_input, RunInput) else None
    call_id = attrs.workflow_id.removeprefix(parent_id + "/")
    tool = next((t.name for t in spec.tools if t.child_run == agent), agent) if spec is not None else agent
    return RecordedActivity(activity_type=tool_activity_type(spec.agent if spec else "?", tool),
                            activity_id=f"{call_id}-child", scheduled_at=_time(event), summary=summary_of(event),
                            input={"call_id": call_id, "tool": tool, "args": {"prompt": prompt}},
                            event_id=event.event_id, child_run_id=attrs.workflow_id)


def _child_closed(event: HistoryEvent, kind: str, by_event: dict[int, RecordedActivity]) -> RecordedActivity | None:
    """The `child_run_tool` call a child run's event closed; `None` if it did not close one (its start, say)."""
    attrs = getattr(event, kind)
    child = by_event.get(attrs.initiated_event_id)
    if child is None:
        return None
    closed = _CHILD_CLOSED[kind]
    if closed is None:
        child.attempts = 1
        return None
    child.closed, child.finished_at = closed, _time(event)
    if closed == "completed":
        result = decode(attrs.result, RunResult[Any])
        child.result = result.output if isinstance(result, RunResult) else result
    elif kind != "child_workflow_execution_canceled_event_attributes":
        child.failure = failure_text(attrs.failure) if attrs.HasField("failure") else closed
    return child


@dataclass(frozen=True)
class EventRead:
    """What one event changed in the run read so far (`RunReader.read`)."""

    activity: RecordedActivity | None = None
    """The model request, tool call or child run the event opened or closed (a local activity: both at once)."""
    opened: bool = False
    """`activity` was scheduled by this event (or, local, recorded whole)."""
    task_failure: str | None = None
    """A workflow task failed (Temporal retries it): why."""
    closed: bool = False
    """The run closed (`RecordedRun.run.status` says how; `continued_as` names the next run)."""


_NOTHING = EventRead()


class RunReader:
    """Reads one run's history event by event into a `RecordedRun`, saying what each event changed.

    Raises:
        CodeModeUserError: from `read`, when the first event is not the start of a durable-codemode run.

    """

    def __init__(self, workflow_id: str, run_id: str) -> None:
        self._workflow_id = workflow_id
        self._run_id = run_id
        self._run: RecordedRun | None = None
        self._by_event: dict[int, RecordedActivity] = {}
        self._updates: dict[str, str] = {}

    @property
    def run(self) -> RecordedRun:
        """The run as read so far."""
        if self._run is None:
            raise CodeModeUserError(f"run {self._run_id}: no event of its history has been read")
        return self._run

    def read(self, event: HistoryEvent) -> EventRead:
        """Take the next event of the history into the run; what it changed."""
        if self._run is None:
            return self._started(event)
        parsed = self._run
        parsed.run.events += 1
        kind = event.WhichOneof("attributes")
        if kind == "marker_recorded_event_attributes":
            marker = _read_marker(event)
            if marker is None:
                return _NOTHING
            if marker.activity_type == DESCRIBE_AGENT_ACTIVITY:
                if isinstance(marker.result, AgentSpec):
                    parsed.spec = marker.result
            else:
                parsed.activities.append(marker)
            return EventRead(activity=marker, opened=True)
        if kind == "activity_task_scheduled_event_attributes":
            attrs = event.activity_task_scheduled_event_attributes
            activity_type = attrs.activity_type.name
            hint: Any = ModelRequestInput if activity_type == MODEL_REQUEST_ACTIVITY else None
            activity = RecordedActivity(activity_type=activity_type, activity_id=attrs.activity_id,
                                        scheduled_at=_time(event), input=decode(attrs.input, hint),
                                        summary=summary_of(event), event_id=event.event_id)
            self._by_event[event.event_id] = activity
            parsed.activities.append(activity)
            return EventRead(activity=activity, opened=True)
        if kind == "start_child_workflow_execution_initiated_event_attributes":
            child = _child_call(self._workflow_id, event, parsed.spec)
            self._by_event[event.event_id] = child
            parsed.activities.append(child)
            return EventRead(activity=child, opened=True)
        if kind in _CHILD_CLOSED:
            child_closed = _child_closed(event, kind, self._by_event)
            return EventRead(activity=child_closed) if child_closed is not None else _NOTHING
        if kind is not None and kind.startswith("activity_task_"):
            return self._activity_event(event, kind)
        if kind == "workflow_execution_update_accepted_event_attributes":
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            self._updates[request.meta.update_id] = request.input.name
        elif kind == "workflow_execution_update_completed_event_attributes":
            completed = event.workflow_execution_update_completed_event_attributes
            name = self._updates.get(completed.meta.update_id)
            if completed.outcome.HasField("success") and name in (DECIDE_UPDATE, DECIDE_ALL_UPDATE):
                hint = ApprovalRecord if name == DECIDE_UPDATE else list[ApprovalRecord]
                value = decode(completed.outcome.success, hint)
                parsed.records += value if isinstance(value, list) else [value]
        elif kind == "workflow_execution_signaled_event_attributes":
            signal = event.workflow_execution_signaled_event_attributes
            if signal.signal_name in (APPROVE_SIGNAL, DENY_SIGNAL):
                decision = decode(signal.input, ApprovalDecision)
                if isinstance(decision, ApprovalDecision):
                    parsed.signals.append((signal.signal_name, decision))
        elif kind == "workflow_task_failed_event_attributes":
            task = event.workflow_task_failed_event_attributes
            text = failure_text(task.failure) if task.failure.message else _cause_text(task.cause)
            if text not in parsed.run.task_failures:
                parsed.run.task_failures.append(text)
            return EventRead(task_failure=text)
        elif kind is not None and kind.startswith("workflow_execution_"):
            return self._closing_event(event, kind)
        return _NOTHING

    def _started(self, event: HistoryEvent) -> EventRead:
        started = event.workflow_execution_started_event_attributes
        run_input = decode(started.input, RunInput)
        if not isinstance(run_input, RunInput):
            raise CodeModeUserError(f"run {self._run_id}: its input is not a durable-codemode RunInput")
        self._run = RecordedRun(run=TraceRun(run_id=self._run_id, status="running", started_at=_time(event),
                                             events=1), input=run_input)
        if run_input.continuation is not None:
            self._run.spec = run_input.continuation.spec
        return _NOTHING

    def _activity_event(self, event: HistoryEvent, kind: str) -> EventRead:
        """An event of a scheduled activity's life: started (an attempt), closed, or asked to cancel."""
        attrs = getattr(event, kind)
        act = self._by_event.get(attrs.scheduled_event_id)
        if act is None:
            return _NOTHING
        if kind == "activity_task_started_event_attributes":
            act.attempts = attrs.attempt
            if attrs.HasField("last_failure"):
                act.last_failure = failure_text(attrs.last_failure)
            return _NOTHING
        if kind == "activity_task_cancel_requested_event_attributes":
            act.cancel_requested, act.finished_at = True, act.finished_at or _time(event)
            return _NOTHING
        act.finished_at = _time(event)
        if kind == "activity_task_completed_event_attributes":
            hint = ModelResponse if act.activity_type == MODEL_REQUEST_ACTIVITY else None
            act.closed = "completed"
            act.result, act.usage = split_usage(decode(attrs.result, hint))  # a tool's value, and its agents' use
        elif kind == "activity_task_failed_event_attributes":
            act.closed, act.failure = "failed", failure_text(attrs.failure)
        elif kind == "activity_task_timed_out_event_attributes":
            act.closed, act.failure = "timed_out", failure_text(attrs.failure)
        elif kind == "activity_task_canceled_event_attributes":
            act.closed = "cancelled"
        else:
            return _NOTHING
        return EventRead(activity=act)

    def _closing_event(self, event: HistoryEvent, kind: str) -> EventRead:
        """The run's end, if `kind` is one (a signal, update or other run event is not)."""
        run = self.run
        if kind == "workflow_execution_completed_event_attributes":
            run.run.status = "completed"
            value = decode(event.workflow_execution_completed_event_attributes.result, RunResult[Any])
            run.result = value if isinstance(value, RunResult) else None
        elif kind == "workflow_execution_failed_event_attributes":
            run.run.status = "failed"
            run.run.failure = failure_text(event.workflow_execution_failed_event_attributes.failure)
        elif kind == "workflow_execution_continued_as_new_event_attributes":
            cont = event.workflow_execution_continued_as_new_event_attributes
            run.run.status, run.run.continued_as = "continued_as_new", cont.new_execution_run_id
            value = decode(cont.input, RunInput)
            if isinstance(value, RunInput):
                run.next_input = value
                run.run.continue_reason = value.continuation.note if value.continuation else None
        elif kind == "workflow_execution_terminated_event_attributes":
            run.run.status = "terminated"
            run.run.failure = event.workflow_execution_terminated_event_attributes.reason or "terminated"
        elif kind == "workflow_execution_canceled_event_attributes":
            run.run.status, run.run.failure = "cancelled", "cancelled"
        elif kind == "workflow_execution_timed_out_event_attributes":
            run.run.status, run.run.failure = "timed_out", "the run timed out"
        else:
            return _NOTHING
        run.run.closed_at = _time(event)
        return EventRead(closed=True)


def read_run(history: WorkflowHistory) -> RecordedRun:
    """Read one run's whole history (traces; `_replay` finds the recorded side of a divergence with it)."""
    reader = RunReader(history.workflow_id, history.run_id)
    for event in history.events:
        reader.read(event)
    return reader.run
