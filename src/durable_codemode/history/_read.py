"""A run's history read as a trace: model turns, snippets, nested calls and approvals (fetching is `_history_fetch`).

Everything a trace shows is in the history because every model request, tool call and clock read crosses the
workflow boundary through Temporal: the model turns are the `model_request` activities (their
inputs hold the conversation, their results the responses with the `run_code` code), a nested call is an
activity whose id is `<call id>-<digest>` and whose input is `ToolCallInput`, decisions are updates and signals,
and the spec recorded by the `describe_agent` marker gives the limits. Three things are not in the history:
a pending approval (the call has not reached Temporal yet), a local activity's arguments and the source line of
a call; `trace_histories` gets them by replaying the history offline, and says so when that replay fails.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from temporalio.client import Client, WorkflowHistory
from temporalio.runtime import Runtime
from temporalio.service import RPCError

from .._history_events import RecordedActivity, RecordedRun, failure_text, read_run
from .._history_fetch import fetch_chain, resolve_stored
from ..shared._activity_io import ModelRequestInput, carried_messages
from ..shared._approvals import (
    APPROVE_SIGNAL,
    ApprovalRecord,
    PendingApproval,
)
from ..shared._errors import CodeModeUserError, RunNotFoundError
from ..shared._names import (
    AFTER_RUN_ACTIVITY,
    BATCH_ACTIVITY,
    COMPUTE_ACTIVITY,
    MODEL_REQUEST_ACTIVITY,
    OUTPUT_ACTIVITY,
    OUTPUT_CHECK_SUMMARY,
    RUN_CODE_TOOL,
    RUN_ERROR_ACTIVITY,
    WORKFLOW_TYPE,
)
from ..shared._records import TurnRecord
from ..shared._results import preview
from ..shared._types import Continuation
from ..workflow._approval_state import RULE_UNKNOWN
from ._capture import ReplayCapture, failure_message, replay_history
from ._trace import (
    CallStatus,
    RunTrace,
    TraceApproval,
    TraceCall,
    TraceSnippet,
    TraceTurn,
    call_order,
    seconds_between,
    trace_call_of,
    trace_turns_of,
)

__all__ = ["parse_histories", "trace_histories", "trace_run"]

_PREVIEW = 200
"""Characters of a result, error or argument preview."""

_RULE_UNKNOWN = RULE_UNKNOWN
"""From `approval_rule`'s error: a replay needs the agent's approval rules (`--worker MODULE`)."""


def _output_check(activity: RecordedActivity) -> str:
    """What the output check of a turn found, in a line: accepted, rejected (and why), or failed."""
    if activity.closed in ("failed", "timed_out"):
        return f"failed: {activity.failure or 'the check did not finish'}"
    if activity.closed is None:
        return "being checked"
    retry = activity.result.get("retry") if isinstance(activity.result, dict) else None
    if not retry:
        return "accepted"
    said = [p.get("content") for p in retry.get("parts", []) if isinstance(p, dict)]
    return "rejected, the model was asked again: " + "; ".join(
        c if isinstance(c, str) else json.dumps(c, default=str) for c in said if c)


# -- assembling the trace ------------------------------------------------------------------------------------


def _call_of(activity: RecordedActivity, open_run: bool) -> TraceCall:
    call_id, tool, args = activity.tool_call()
    call = TraceCall(call_id=call_id, tool=tool, args=args, status="running", activity_type=activity.activity_type,
                     activity_id=activity.activity_id, local=activity.local, scheduled_at=activity.scheduled_at,
                     finished_at=activity.finished_at, attempts=activity.attempts, last_failure=activity.last_failure,
                     duration_s=seconds_between(activity.scheduled_at, activity.finished_at),
                     child_run_id=activity.child_run_id)
    if activity.closed == "completed":
        call.status, call.result = "ok", preview(activity.result, _PREVIEW)
    elif activity.closed in ("failed", "timed_out"):
        call.status, call.error = "error", preview(activity.failure or "failed", _PREVIEW)
    elif activity.closed == "cancelled" or activity.cancel_requested:
        call.status, call.error = "cancelled", "cancelled: the program ended before this call finished"
    elif not open_run:
        call.status, call.error = "cancelled", "the run ended before this call finished; the tool may have run"
        call.duration_s = None
    return call


def _batch_calls_of(activity: RecordedActivity, open_run: bool) -> list[TraceCall]:
    """The calls of one batch activity, one trace line each, as if each had been its own activity.

    Each keeps its call id, tool, arguments and outcome (from the batch's result, by call id); they share the
    batch's activity id, times and attempts. A batch that failed as a whole gives each call its failure.
    """
    payload = activity.input if isinstance(activity.input, dict) else {}
    tool = str(payload.get("tool") or "?")
    outcomes: dict[str, dict[str, Any]] = {}
    if activity.closed == "completed" and isinstance(activity.result, dict):
        outcomes = {str(o.get("call_id")): o for o in activity.result.get("outcomes") or [] if isinstance(o, dict)}
    calls = []
    for item in payload.get("calls") or []:
        if not isinstance(item, dict):
            continue
        single = replace(activity, input={"call_id": item.get("call_id"), "tool": tool, "args": item.get("args")},
                         closed=activity.closed if activity.closed != "completed" else None)
        call = _call_of(single, open_run)
        outcome = outcomes.get(call.call_id)
        if outcome is not None:
            call.status, call.error, call.result = "ok", None, None
            call.duration_s = seconds_between(activity.scheduled_at, activity.finished_at)
            if outcome.get("kind") == "ok":
                call.result = preview(outcome.get("value"), _PREVIEW)
            elif outcome.get("kind") == "error":
                call.status = "error"
                call.error = preview(f"{outcome.get('error_type')}: {outcome.get('message')}", _PREVIEW)
            else:  # deferred: its own activity (same call id) follows and gives the line its outcome
                continue
        calls.append(call)
    return calls


def _returns(messages: Sequence[ModelMessage]) -> dict[str, ToolReturnPart]:
    """The tool returns of the last request of a conversation, by tool call id."""
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            return {p.tool_call_id: p for p in message.parts if isinstance(p, ToolReturnPart)}
    return {}


def _outcome_from_return(part: ToolReturnPart) -> Any:
    if part.outcome == "retried":
        return "rejected"
    if isinstance(part.content, dict) and "error" in part.content:
        return "error"
    return "ok"


class _Assembler:
    """Builds the trace's turns from the runs read, in order; later runs' summaries fill in what ended a run."""

    def __init__(self, runs: list[RecordedRun], capture: dict[str, ReplayCapture]) -> None:
        self.runs = runs
        self.capture = capture
        self.turns: list[TraceTurn] = []

    def summary_of(self, run_index: int) -> list[TurnRecord]:
        """The turn records the run at `run_index` ended with (its result, or the next run's continuation)."""
        parsed = self.runs[run_index]
        if parsed.result is not None:
            return parsed.result.turns
        if parsed.next_input is not None and parsed.next_input.continuation is not None:
            return parsed.next_input.continuation.turns
        return []

    def build(self) -> list[TraceTurn]:
        first = self.runs[0].input.continuation
        if first is not None:
            self.turns += trace_turns_of(first.turns, run=-1)
        for i, parsed in enumerate(self.runs):
            self.run_turns(i, parsed)
        return self.turns

    def run_turns(self, run_index: int, parsed: RecordedRun) -> None:
        open_run = parsed.run.status == "running"
        capture = self.capture.get(parsed.run.run_id)
        recorded = {t.index: t for t in self.summary_of(run_index)}
        requests = [a for a in parsed.activities if a.activity_type == MODEL_REQUEST_ACTIVITY]
        tools = [a for a in parsed.activities
                 if a.activity_type not in (MODEL_REQUEST_ACTIVITY, OUTPUT_ACTIVITY, AFTER_RUN_ACTIVITY,
                                            RUN_ERROR_ACTIVITY)]
        checks = {a.summary.removeprefix(OUTPUT_CHECK_SUMMARY): a for a in parsed.activities
                  if a.activity_type == OUTPUT_ACTIVITY and a.summary and a.summary.startswith(OUTPUT_CHECK_SUMMARY)}
        output_tools = parsed.spec.output.tool_names if parsed.spec and parsed.spec.output else frozenset()
        calls = [c for a in tools if a.activity_type != COMPUTE_ACTIVITY for c in (
            _batch_calls_of(a, open_run) if a.activity_type == BATCH_ACTIVITY else [_call_of(a, open_run)])]
        computes = [(a.activity_id, a.result if isinstance(a.result, dict) else {})
                    for a in tools if a.activity_type == COMPUTE_ACTIVITY]
        base = len(parsed.input.continuation.turns) if parsed.input.continuation else 0
        for k, request in enumerate(requests):
            index = base + k
            if request.summary and request.summary.startswith("model turn "):
                tail = request.summary.removeprefix("model turn ")
                index = int(tail) if tail.isdigit() else index
            turn = TraceTurn(index=index, run=run_index, status="running", requested_at=request.scheduled_at,
                             responded_at=request.finished_at, attempts=request.attempts,
                             duration_s=seconds_between(request.scheduled_at, request.finished_at))
            self.turns.append(turn)
            if request.closed in ("failed", "timed_out"):
                turn.status, turn.error = "error", request.failure
                continue
            response = request.result
            if not isinstance(response, ModelResponse):
                if not open_run:
                    turn.status, turn.error = "error", "the run ended before the model answered"
                continue
            turn.status = "ok"
            turn.model_name = response.model_name
            turn.input_tokens, turn.output_tokens = response.usage.input_tokens, response.usage.output_tokens
            turn.text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
            nxt = requests[k + 1].input if k + 1 < len(requests) else None
            if isinstance(nxt, ModelRequestInput):
                returns = _returns(carried_messages(nxt))
            elif parsed.next_input is not None:
                returns = _returns(parsed.next_input.message_history)
            else:
                returns = {}
            summary = recorded.get(index)
            if str(index) in checks:
                turn.output = _output_check(checks[str(index)])
            for part in response.parts:
                if not isinstance(part, ToolCallPart) or part.tool_name in output_tools:
                    continue
                if part.tool_name == RUN_CODE_TOOL:
                    turn.snippets.append(self.snippet(part, calls, computes, returns, summary, open_run, capture))
                else:
                    turn.direct_calls.append(self.direct(part, calls, returns))

    def snippet(self, part: ToolCallPart, calls: list[TraceCall], computes: list[tuple[str, dict[str, Any]]],
                returns: dict[str, ToolReturnPart],
                summary: TurnRecord | None, open_run: bool, capture: ReplayCapture | None) -> TraceSnippet:
        try:
            args = part.args_as_dict()
        except ValueError:
            args = {}
        snippet = TraceSnippet(call_id=part.tool_call_id, code=str(args.get("code", "")),
                               restart=bool(args.get("restart", False)), outcome="unknown")
        prefix = part.tool_call_id + "."
        snippet.calls = sorted((c for c in calls if c.call_id.startswith(prefix)
                                and c.call_id[len(prefix):].isdigit()), key=call_order)
        mine = [r for activity_id, r in computes if activity_id.startswith(prefix + "compute.")]
        snippet.recorded_stretches = len(mine)
        computed = sum(float(r.get("seconds") or 0) for r in mine if r.get("where", "activity") == "activity")
        snippet.computed_s = round(computed, 3) if computed else None
        returned = returns.get(part.tool_call_id)
        record = next((s for s in summary.snippets if s.call_id == part.tool_call_id), None) if summary else None
        replayed = next((s for s in reversed(capture.snippets) if s.call_id == part.tool_call_id), None) \
            if capture else None
        if record is not None:
            snippet.outcome, snippet.result = record.outcome, record.result
            snippet.files, snippet.files_omitted = record.files, record.files_omitted
            # Denied and cancelled calls that never reached Temporal are only in the run's own summary.
            known = {c.call_id: c for c in snippet.calls}
            for summarized in record.calls:
                call = known.get(summarized.call_id)
                if call is not None and call.args is None:  # a local activity: its marker has no input
                    call.args = trace_call_of(summarized).args
            snippet.calls += [trace_call_of(c) for c in record.calls if c.call_id not in known]
            snippet.calls.sort(key=call_order)
        elif returned is not None:
            snippet.outcome, snippet.result = _outcome_from_return(returned), preview(returned.content, _PREVIEW)
        elif replayed is not None and replayed.outcome is not None:
            snippet.outcome, snippet.result = replayed.outcome, preview(replayed.content, _PREVIEW)  # type: ignore[assignment]
        elif open_run:
            snippet.outcome = "running"
        return snippet

    @staticmethod
    def direct(part: ToolCallPart, calls: list[TraceCall], returns: dict[str, ToolReturnPart]) -> TraceCall:
        found = next((c for c in calls if c.call_id == part.tool_call_id), None)
        if found is not None:
            return found
        try:
            args: dict[str, Any] | None = part.args_as_dict()
        except ValueError:
            args = None
        returned = returns.get(part.tool_call_id)
        return TraceCall(call_id=part.tool_call_id, tool=part.tool_name, args=args, status="error",
                         error=preview(returned.content, _PREVIEW) if returned else "the tool was not called")


def _approval_of(record: ApprovalRecord) -> TraceApproval:
    return TraceApproval(call_id=record.call_id, tool=record.tool, args=record.args,
                         state="approved" if record.approved else "denied", via=record.via, approver=record.approver,
                         note=record.note, requested_at=record.requested_at, decided_at=record.decided_at)


def _pending_of(pending: PendingApproval) -> TraceApproval:
    return TraceApproval(call_id=pending.call_id, tool=pending.tool, args=pending.args, state="pending",
                         requested_at=pending.requested_at, expires_at=pending.expires_at, line=pending.line)


def _audit(runs: list[RecordedRun], capture: dict[str, ReplayCapture]) -> list[ApprovalRecord]:
    """Every decision of the chain, in order, from the most complete source the histories hold.

    A closed run's result (or the continuation it handed on) carries the whole trail; for an open run, what a
    replay rebuilt, else the trail the run started with and the outcomes of its `decide` updates.
    """
    last = runs[-1]
    if last.result is not None:
        return list(last.result.approvals)
    if last.next_input is not None and last.next_input.continuation is not None:
        return list(last.next_input.continuation.approvals)
    replayed = capture.get(last.run.run_id)
    if replayed and replayed.watched:
        return list(replayed.audit)
    start = last.input.continuation.approvals if last.input.continuation else []
    seen = {(r.call_id, r.approver, r.decided_at) for r in start}
    return [*start, *(r for r in last.records if (r.call_id, r.approver, r.decided_at) not in seen)]


def _approvals(runs: list[RecordedRun], capture: dict[str, ReplayCapture],
               pending: Sequence[PendingApproval] | None) -> list[TraceApproval]:
    """The decisions of the chain, then what the last run waits for.

    Records come from the most complete source: the result's audit trail, the next run's continuation, what a
    replay rebuilt, the `decide` updates' outcomes; a signal's decision is used only when nothing recorded it.
    """
    records: dict[str, ApprovalRecord] = {}
    last = runs[-1]
    replayed = capture.get(last.run.run_id)
    for source in (
        *(r.records for r in runs),
        replayed.audit if replayed and replayed.watched else [],
        last.next_input.continuation.approvals if last.next_input and last.next_input.continuation else [],
        last.result.approvals if last.result else [],
    ):
        for record in source:
            records[record.call_id] = record
    approvals = [_approval_of(r) for r in records.values()]
    if not (replayed and replayed.watched) and last.result is None:
        for name, decision in (s for r in runs for s in r.signals):
            if decision.call_id not in records:
                approvals.append(TraceApproval(call_id=decision.call_id, tool="?", args=None,
                                               state="approved" if name == APPROVE_SIGNAL else "denied",
                                               via="signal", approver=decision.approver, note=decision.note))
    if last.run.status == "running":
        waiting = pending if pending is not None else (replayed.pending if replayed and replayed.watched else [])
        approvals += [_pending_of(p) for p in waiting if p.call_id not in records]
    return approvals


def _attach(trace: RunTrace, capture: dict[str, ReplayCapture]) -> None:
    """Put lines, local calls' arguments and approvals on the calls; add denied and pending calls to snippets."""
    sites = {cid: c for cap in capture.values() for cid, c in cap.calls.items()}
    snippets = {s.call_id: s for s in trace.snippets}
    for made in [*trace.nested_calls, *trace.direct_calls]:
        site = sites.get(made.call_id)
        if site is not None:
            made.line = made.line or (site.line or None)
            if made.args is None:
                made.args = site.args
    for approval in trace.approvals:
        call = trace.call(approval.call_id)
        site = sites.get(approval.call_id)
        if approval.line is None and site is not None and site.line:
            approval.line = site.line
        if call is None:
            parent = snippets.get(approval.call_id.rsplit(".", 1)[0])
            if parent is None or approval.state == "approved":
                continue
            status: CallStatus = "pending" if approval.state == "pending" else "denied"
            call = TraceCall(call_id=approval.call_id, tool=approval.tool, args=approval.args, status=status,
                             line=approval.line, scheduled_at=approval.requested_at)
            parent.calls.append(call)
            parent.calls.sort(key=call_order)
        elif approval.state == "denied":
            call.status = "denied"
        call.approval = approval
        if call.line is None:
            call.line = approval.line


def parse_histories(
    histories: Sequence[WorkflowHistory],
    *,
    captures: Sequence[ReplayCapture] = (),
    pending: Sequence[PendingApproval] | None = None,
) -> RunTrace:
    """The trace of a run from its histories (one run, or a chain first to last), without replaying them.

    Args:
        histories: The runs' histories, first to last.
        captures: What replays of those histories saw (`replay_history`), for lines, pending approvals and
            local calls' arguments; without them, those are missing from the trace.
        pending: The pending approvals as a live query answered them, preferred over a replay's.

    Raises:
        CodeModeUserError: no history, or one that is not of a durable-codemode run.

    """
    if not histories:
        raise CodeModeUserError("no history to read")
    runs = []
    for history in histories:
        kind = history.events[0].workflow_execution_started_event_attributes.workflow_type.name
        if kind != WORKFLOW_TYPE:
            raise CodeModeUserError(f"run {history.workflow_id!r} is a {kind!r} workflow, not a durable-codemode run")
        runs.append(read_run(history))
    by_run = {c.run_id: c for c in captures if c.run_id}
    turns = _Assembler(runs, by_run).build()
    last = runs[-1]
    spec = next((r.spec for r in runs if r.spec is not None), None)
    cont: Continuation | None = last.input.continuation
    trace = RunTrace(
        workflow_id=histories[0].workflow_id,
        agent=spec.agent if spec else (cont.spec.agent if cont else last.input.agent),
        status=last.run.status,
        runs=[r.run for r in runs],
        turns=turns,
        approvals=_approvals(runs, by_run, pending),
        audit=_audit(runs, by_run),
        output=last.result.output if last.result else None,
        failure=last.run.failure,
        limits=spec.limits if spec else None,
    )
    _attach(trace, by_run)
    return trace


async def trace_histories(
    histories: Sequence[WorkflowHistory],
    *,
    replay: bool = True,
    pending: Sequence[PendingApproval] | None = None,
    runtime: Runtime | None = None,
) -> RunTrace:
    """The trace of a run from its histories, completed by an offline replay of each (see the module docstring).

    A replay that fails leaves the trace as the history alone tells it, with a note saying what is missing.
    """
    captures: list[ReplayCapture] = []
    notes: list[str] = []
    histories = await resolve_stored(histories)  # e.g. exported with references
    if replay:
        for history in histories:
            capture = await replay_history(history, runtime=runtime)
            captures.append(capture)
            if capture.failure is not None:
                why = failure_message(capture.failure)
                why = ("it needs the agents' approval rules: pass --worker MODULE" if _RULE_UNKNOWN in why
                       else f"`codemode replay` explains: {preview(why, 160)}")
                notes.append(f"run {history.run_id} does not replay ({why}), so call lines, local calls' "
                             "arguments and pending approvals may be missing")
    trace = parse_histories(histories, captures=captures, pending=pending)
    trace.notes += notes
    return trace


async def _live_pending(client: Client, workflow_id: str) -> list[PendingApproval] | None:
    from ..workflow._run import CodeModeRunWorkflow

    handle = client.get_workflow_handle_for(CodeModeRunWorkflow.run, workflow_id)
    try:
        return await handle.query(CodeModeRunWorkflow.pending_approvals, rpc_timeout=timedelta(seconds=3))
    except Exception:  # no worker answering: the trace says the approvals are unknown instead
        return None


async def _attempts_in_flight(client: Client, workflow_id: str, trace: RunTrace) -> None:
    """Running calls' attempt counts and last failures: the server knows them before the history does."""
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return
    by_id = {c.activity_id: c for c in [*trace.nested_calls, *trace.direct_calls] if c.activity_id}
    for pending in description.raw_description.pending_activities:
        call = by_id.get(pending.activity_id)
        if call is not None and call.status == "running":
            call.attempts = pending.attempt
            if pending.HasField("last_failure"):
                call.last_failure = failure_text(pending.last_failure)


async def _with_children(client: Client, trace: RunTrace, *, replay: bool, runtime: Runtime | None) -> None:
    """Give each `child_run_tool` call of `trace` the trace of the child run it started (drawn as its subtree)."""
    for call in [*trace.nested_calls, *(c for t in trace.turns for c in t.direct_calls)]:
        if call.child_run_id is None:
            continue
        try:
            call.child = await trace_run(client, call.child_run_id, replay=replay, runtime=runtime)
        except RunNotFoundError:
            trace.notes.append(f"the child run {call.child_run_id} of call {call.call_id} is gone from the server")


async def trace_run(client: Client, workflow_id: str, *, replay: bool = True,
                    runtime: Runtime | None = None) -> RunTrace:
    """The trace of run `workflow_id` (its whole chain) from the server.

    A running run's in-flight calls get their attempts from the server; its pending approvals come from the
    offline replay, or, when that cannot run (an approval rule this process does not know), from the run's
    `pending_approvals` query.

    Raises:
        RunNotFoundError: no such run.

    """
    histories = await fetch_chain(client, workflow_id)
    trace = await trace_histories(histories, replay=replay, runtime=runtime)
    await _with_children(client, trace, replay=replay, runtime=runtime)
    if trace.status == "running":
        await _attempts_in_flight(client, workflow_id, trace)
        if trace.notes or not replay:
            live = await _live_pending(client, workflow_id)
            if live is not None:
                trace = parse_histories(histories, pending=live)
                await _attempts_in_flight(client, workflow_id, trace)
                trace.notes.append("pending approvals from the run's pending_approvals query")
    return trace
