"""OpenTelemetry spans for agent runs: run → model request / `run_code` snippet → nested call → tool attempt.

Code mode compresses the model's trace to "model → run_code → model"; these spans open the snippet up again:

```
codemode.run cart                              the workflow run (one per run of a continue-as-new chain)
├─ codemode.model_request turn 0               around the model-request activity
│  └─ codemode.attempt durable-codemode.model_request   the activity itself, on the worker that ran it
├─ codemode.run_code call_0                    code, line count, result size, outcome
│  ├─ codemode.call get  call_0.0              tool, call id, argument and result sizes, approval wait
│  │  └─ codemode.attempt cart.get             one per attempt (codemode.attempt), in the activity, with its
│  │                                             outcome: ok, failed, cut_off, timed_out, cancelled (`_attempt_outcome`)
│  └─ ...
└─ codemode.model_request turn 1
```

How the workflow-side spans get real durations and are exported once per run:
- They are created with the process's global tracer provider, which must be Temporal's replay-safe one
  (`temporalio.contrib.opentelemetry.create_tracer_provider()`): span and trace ids come from a random generator
  seeded by the workflow, so a replay re-creates every span with the same id; a span started during a replay gets
  the replayed event's time as its start, so a child exported before an eviction keeps pointing at the right
  parent.
- A span's end made while history replays is dropped (`_end`); one made live is handed to the worker that runs the
  task (`_span_exports`), which exports it once the server has recorded that task as completed by this worker, and
  drops it if not (the task then ran live again, where it ended again): one export per run across any number of
  workers, replays and refused or timed-out tasks.
- A span that ends by an exception that fails the workflow *task* (a bug, no sandbox process free) is not ended:
  the task is retried and re-creates it. A coroutine closed by garbage collection (a worker that shut down with
  the run cached) ends nothing either.
- The context of the current span crosses into activities through Temporal's `OpenTelemetryInterceptor` (the
  header of each activity), so the activity-side `codemode.attempt` span, and any span a tool or pydantic-ai's
  own instrumentation makes, hangs under its call or model-request span.
- Continue-as-new carries the run span's *parent* context, not the run span, so the runs of a chain are siblings
  under the client's span (when the client started the run inside one) instead of an ever deeper nesting.

Off (the default), nothing here runs: the workflow's hooks hand their awaitables back unchanged, and neither
`opentelemetry-sdk` nor `temporalio.contrib.opentelemetry` is imported. On, the library still uses only the
OpenTelemetry API; the user brings the SDK and the exporter.

The spans are one observer of a run (`RunTelemetry`), attached by the tracing interceptor; the history tools'
replays attach another (`history/_capture`), through the same interface (`observe_run`): what a run does is
observed there, never through the workflow's own methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import Token
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import temporalio.worker
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.exceptions import ApplicationError, CancelledError

from ._errors import CodeModeUserError
from ._names import (
    AFTER_RUN_ACTIVITY,
    DESCRIBE_AGENT_ACTIVITY,
    MODEL_REQUEST_ACTIVITY,
    OUTPUT_ACTIVITY,
    RUN_ERROR_ACTIVITY,
)
from ._span_exports import span_ended

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart

    from ._approvals import ApprovalRecord, PendingApproval
    from ._types import CallRecord, RunResult
    from .workflow._approval_state import Approvals
    from .workflow._sandbox import Settled, SnippetOutcome

__all__ = [
    "NO_TELEMETRY",
    "TRACER_NAME",
    "ApprovalState",
    "RunTelemetry",
    "client_interceptors",
    "has_tracing_interceptor",
    "observe_run",
    "run_telemetry",
    "worker_interceptors",
]

T = TypeVar("T")

TRACER_NAME = "durable_codemode"
"""The instrumentation scope of every span this library makes."""

_OBSERVERS_ATTR = "_durable_codemode_observers"
"""The observers attached to a workflow run (`observe_run`), on its workflow instance."""

_MAX_CODE_CHARS = 8192
"""A snippet's code is an attribute of its span up to this many characters (the line count is always whole)."""

_SDK_MISSING = ("tracing needs the OpenTelemetry SDK and Temporal's OpenTelemetry support: "
                "`pip install opentelemetry-sdk` (and an exporter), then set the tracer provider as shown in "
                "docs/observability.md")


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _size(value: Any) -> int:
    """Bytes of `value` as JSON: what a result costs the history and the model, for the span's attributes."""
    try:
        return len(json.dumps(value, default=str, separators=(",", ":")).encode())
    except (TypeError, ValueError):  # a cycle or an odd key: an estimate is enough here
        return len(repr(value).encode())


def _detach(token: Token[Context]) -> None:
    # The finally of an abandoned coroutine can run in another contextvars.Context (garbage collection after an
    # eviction), where the token is not valid; OpenTelemetry's detach would log an error for nothing.
    with suppress(ValueError, RuntimeError):
        token.var.reset(token)


@contextmanager
def _current(span: Span) -> Iterator[None]:
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        _detach(token)


def _end(span: Span) -> None:
    """End a workflow-side span: live, hand it to the worker that runs this task (`_span_exports.span_ended`).

    Ended while history replays, it is dropped: the worker that recorded its end exports it. Outside workflow code
    (a coroutine finalised by the garbage collector) nothing ends: there a replay cannot be told from a live run.
    """
    if not workflow.in_workflow() or workflow.unsafe.is_replaying_history_events():
        return
    span_ended(span)


def _close(span: Span, error: BaseException) -> None:
    """End `span` for an exception leaving it, when that exception is the span's real end."""
    if isinstance(error, GeneratorExit):
        return
    if isinstance(error, workflow.ContinueAsNewError):
        span.set_attribute("codemode.outcome", "continued_as_new")
        _end(span)
    elif isinstance(error, BaseException) and type(error).__name__ == "CancelledError":
        span.set_attribute("codemode.outcome", "cancelled")
        _end(span)
    elif workflow.in_workflow() and isinstance(error, Exception) and workflow.is_failure_exception(error):
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.set_attribute("codemode.outcome", "failed")
        _end(span)
    # Anything else fails the workflow task; its retry re-creates the span with the same id.


@dataclass(frozen=True)
class ApprovalState:
    """What a run waits for and what was decided, as it stands (`RunTelemetry.approvals`)."""

    pending: list[PendingApproval]
    """The calls waiting for a person, its child runs' included, as the `pending_approvals` query lists them."""
    audit: list[ApprovalRecord]
    """Every decision so far, in order, those the run started with included."""


class RunTelemetry:
    """An observer of one workflow run: the hooks the run workflow calls at each of its steps.

    Two kinds of hook: the wrapping ones (`run`, `model_request`, `snippet`, `call`) get the step's awaitable
    and return one that awaits it (a span around it); the notices (`approvals`, `call_made`, `run_code_refused`,
    `printed`, the approval and child-run notices, ...) return nothing. An observer must not change what the
    workflow does: it issues no command, and a wrapped awaitable's result (or exception) is handed on as it is.

    Observers are attached to a run before it starts, by a workflow interceptor (`observe_run`): the spans of a
    tracing worker, and the history tools' replays (`history/_capture`); and by the run itself, its live event
    stream when it streams (`workflow/_event_stream`). This base is the "off" case: every hook
    returns its awaitable unchanged and ignores its notices.
    """

    def run(self, coro: Coroutine[Any, Any, RunResult[Any]], *, agent: str, run_index: int
            ) -> Coroutine[Any, Any, RunResult[Any]]:
        """The run span around the run's loop."""
        return coro

    def approvals(self, state: Callable[[], ApprovalState]) -> None:
        """As the run starts, before it awaits anything: `state()` reads the run's approvals at any later moment."""

    def model_request(self, coro: Coroutine[Any, Any, ModelResponse], *, turn: int, model: str | None
                      ) -> Coroutine[Any, Any, ModelResponse]:
        """A model-request span around the activity."""
        return coro

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        """A `run_code` span around the snippet; the calls it makes become its children."""
        return coro

    def run_code_refused(self, *, call_id: str, args: dict[str, Any]) -> None:
        """A `run_code` call with arguments it does not take: no snippet runs, the model is asked again.

        `args` as the model sent them (`{}` if they were not JSON).
        """

    def call_made(self, *, tool: str, call_id: str, args: dict[str, Any], code: str, line: int) -> None:
        """The program makes a tool call at `line` (1-based) of its `code`, or the model does (`line` 0, no code).

        The first thing the workflow does with the call, before it counts it against the usage limits or asks
        its approval rule: either may stop the workflow task, and an observer then still knows which call did.
        """

    def call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], *, tool: str, call_id: str,
             args: dict[str, Any], approvals: Approvals) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        """A nested- (or direct-) call span around one tool call, its approval wait included."""
        return coro

    def tool_calls(self, calls: Sequence[ToolCallPart]) -> None:
        """The model's function tool calls of one response are about to run (`run_code` and direct tools)."""

    def tool_returned(self, part: ToolReturnPart) -> None:
        """One of them is answered: `part` goes back to the model (a retry request when `part.outcome` says so)."""

    def printed(self, *, call_id: str, text: str) -> None:
        """The program of `run_code` call `call_id` printed `text` since its last notice.

        Given whenever the program next waits on Temporal, and at its end: at points a replay reaches with the same
        text, so an observer that numbers what it is told numbers it the same on replay.
        """

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None:
        """The program of `run_code` call `call_id` computed past its in-workflow budget.

        The compute activity goes on from its last dump (`stretch` 0: from its start).
        """

    def approval_waiting(self, pending: PendingApproval, *, policy: str | None) -> None:
        """A call starts waiting for a person (`policy`: who may decide, in words; `None`: anyone accepted)."""

    def approval_decided(self, record: ApprovalRecord) -> None:
        """A waiting call was decided (by a person, or its timeout).

        `record.settled` is false for one approval of several the policy requires.
        """

    def child_run_started(self, *, call_id: str, run_id: str, agent: str) -> None:
        """Call `call_id` starts a child run `run_id` of `agent` (`child_run_tool`)."""

    def child_run_ended(self, *, call_id: str, run_id: str, error: str | None) -> None:
        """The child run of call `call_id` ended: completed (`error` is `None`) or failed."""

    def continuing(self, *, run_index: int) -> None:
        """The run continues as new workflow run number `run_index`.

        In this workflow task: nothing is awaited between this notice and the continue-as-new.
        """

    @contextmanager
    def run_parent(self) -> Iterator[None]:
        """Make the run span's parent context current (for continue-as-new)."""
        yield


NO_TELEMETRY = RunTelemetry()
"""No observer."""


class _Observers(RunTelemetry):
    """Several observers of one run as one: each notice goes to all, each awaitable is wrapped by all.

    The first attached wraps outermost.
    """

    def __init__(self, observers: Sequence[RunTelemetry]) -> None:
        self._all = list(observers)

    def run(self, coro: Coroutine[Any, Any, RunResult[Any]], *, agent: str, run_index: int
            ) -> Coroutine[Any, Any, RunResult[Any]]:
        for observer in reversed(self._all):
            coro = observer.run(coro, agent=agent, run_index=run_index)
        return coro

    def approvals(self, state: Callable[[], ApprovalState]) -> None:
        for observer in self._all:
            observer.approvals(state)

    def model_request(self, coro: Coroutine[Any, Any, ModelResponse], *, turn: int, model: str | None
                      ) -> Coroutine[Any, Any, ModelResponse]:
        for observer in reversed(self._all):
            coro = observer.model_request(coro, turn=turn, model=model)
        return coro

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        for observer in reversed(self._all):
            coro = observer.snippet(coro, call_id=call_id, code=code)
        return coro

    def run_code_refused(self, *, call_id: str, args: dict[str, Any]) -> None:
        for observer in self._all:
            observer.run_code_refused(call_id=call_id, args=args)

    def call_made(self, *, tool: str, call_id: str, args: dict[str, Any], code: str, line: int) -> None:
        for observer in self._all:
            observer.call_made(tool=tool, call_id=call_id, args=args, code=code, line=line)

    def call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], *, tool: str, call_id: str,
             args: dict[str, Any], approvals: Approvals) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        for observer in reversed(self._all):
            coro = observer.call(coro, tool=tool, call_id=call_id, args=args, approvals=approvals)
        return coro

    def tool_calls(self, calls: Sequence[ToolCallPart]) -> None:
        for observer in self._all:
            observer.tool_calls(calls)

    def tool_returned(self, part: ToolReturnPart) -> None:
        for observer in self._all:
            observer.tool_returned(part)

    def printed(self, *, call_id: str, text: str) -> None:
        for observer in self._all:
            observer.printed(call_id=call_id, text=text)

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None:
        for observer in self._all:
            observer.compute_escalated(call_id=call_id, stretch=stretch, reason=reason)

    def approval_waiting(self, pending: PendingApproval, *, policy: str | None) -> None:
        for observer in self._all:
            observer.approval_waiting(pending, policy=policy)

    def approval_decided(self, record: ApprovalRecord) -> None:
        for observer in self._all:
            observer.approval_decided(record)

    def child_run_started(self, *, call_id: str, run_id: str, agent: str) -> None:
        for observer in self._all:
            observer.child_run_started(call_id=call_id, run_id=run_id, agent=agent)

    def child_run_ended(self, *, call_id: str, run_id: str, error: str | None) -> None:
        for observer in self._all:
            observer.child_run_ended(call_id=call_id, run_id=run_id, error=error)

    def continuing(self, *, run_index: int) -> None:
        for observer in self._all:
            observer.continuing(run_index=run_index)

    @contextmanager
    def run_parent(self) -> Iterator[None]:
        with contextlib.ExitStack() as parents:
            for observer in self._all:
                parents.enter_context(observer.run_parent())
            yield


def observe_run(observer: RunTelemetry) -> None:
    """Attach `observer` to the current workflow run: from a workflow inbound interceptor's `execute_workflow`.

    The run workflow asks for its observers as its run starts (`run_telemetry`); one attached later sees nothing.
    """
    instance = workflow.instance()
    observers: list[RunTelemetry] | None = getattr(instance, _OBSERVERS_ATTR, None)
    if observers is None:
        observers = []
        setattr(instance, _OBSERVERS_ATTR, observers)
    observers.append(observer)


def run_telemetry() -> RunTelemetry:
    """The observers attached to the current workflow run (`observe_run`), as one; `NO_TELEMETRY` if none."""
    observers: list[RunTelemetry] = getattr(workflow.instance(), _OBSERVERS_ATTR, [])
    if not observers:
        return NO_TELEMETRY
    return observers[0] if len(observers) == 1 else _Observers(observers)


class _TracedRun(RunTelemetry):
    def __init__(self) -> None:
        self._tracer = trace.get_tracer(TRACER_NAME)
        self._parent: Context | None = None

    def run(self, coro: Coroutine[Any, Any, RunResult[Any]], *, agent: str, run_index: int
            ) -> Coroutine[Any, Any, RunResult[Any]]:
        return self._run(coro, agent, run_index)

    async def _run(self, coro: Coroutine[Any, Any, RunResult[Any]], agent: str, run_index: int) -> RunResult[Any]:
        info = workflow.info()
        self._parent = otel_context.get_current()
        span = self._tracer.start_span(
            f"codemode.run {agent}", start_time=_ns(info.start_time),
            attributes={"codemode.agent": agent, "codemode.run_index": run_index,
                        "temporalWorkflowID": info.workflow_id, "temporalRunID": info.run_id})
        with _current(span):
            try:
                result = await coro
            except BaseException as e:
                _close(span, e)
                raise
        span.set_attributes({"codemode.outcome": "completed", "codemode.model_requests": result.usage.requests,
                             "codemode.output.bytes": len(result.output.encode())})
        _end(span)
        return result

    @contextmanager
    def run_parent(self) -> Iterator[None]:
        if self._parent is None:
            yield
            return
        token = otel_context.attach(self._parent)
        try:
            yield
        finally:
            _detach(token)

    def model_request(self, coro: Coroutine[Any, Any, ModelResponse], *, turn: int, model: str | None
                      ) -> Coroutine[Any, Any, ModelResponse]:
        return self._model_request(coro, turn, model)

    async def _model_request(self, coro: Coroutine[Any, Any, ModelResponse], turn: int, model: str | None
                             ) -> ModelResponse:
        attributes: dict[str, Any] = {"codemode.turn": turn}
        if model:
            attributes["gen_ai.request.model"] = model
        span = self._tracer.start_span(f"codemode.model_request turn {turn}", attributes=attributes)
        with _current(span):
            try:
                response = await coro
            except BaseException as e:
                _close(span, e)
                raise
        calls = [getattr(p, "tool_name", "") for p in response.parts if p.part_kind == "tool-call"]
        span.set_attributes({
            "gen_ai.response.model": response.model_name or "",
            "gen_ai.usage.input_tokens": response.usage.input_tokens,
            "gen_ai.usage.output_tokens": response.usage.output_tokens,
            "codemode.tool_calls": calls,
        })
        _end(span)
        return response

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        return self._snippet(coro, call_id, code)

    async def _snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], call_id: str, code: str) -> SnippetOutcome:
        span = self._tracer.start_span(f"codemode.run_code {call_id}", attributes={
            "codemode.call_id": call_id, "codemode.code": code[:_MAX_CODE_CHARS],
            "codemode.code.lines": code.count("\n") + 1})
        with _current(span):
            try:
                outcome = await coro
            except BaseException as e:
                _close(span, e)
                raise
        span.set_attributes({"codemode.outcome": outcome.kind, "codemode.result.bytes": _size(outcome.content),
                             "codemode.calls": len(outcome.calls)})
        if outcome.kind != "ok":
            content = outcome.content
            message = content.get("error") if isinstance(content, dict) else content
            span.set_status(Status(StatusCode.ERROR, str(message)[:1000]))
        _end(span)
        return outcome

    def call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], *, tool: str, call_id: str,
             args: dict[str, Any], approvals: Approvals) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        return self._call(coro, tool, call_id, args, approvals)

    async def _call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], tool: str, call_id: str,
                    args: dict[str, Any], approvals: Approvals) -> tuple[Settled, CallRecord]:
        span = self._tracer.start_span(f"codemode.call {tool}", attributes={
            "codemode.tool": tool, "codemode.call_id": call_id, "codemode.args.bytes": _size(args),
            "codemode.approval.required": call_id in approvals.pending})
        with _current(span):
            try:
                settled, record = await coro
            except BaseException as e:
                _close(span, e)
                raise
        decision = approvals.decided.get(call_id)
        if decision is not None:
            span.set_attributes({
                "codemode.approval.wait_s": (decision.decided_at - decision.requested_at).total_seconds(),
                "codemode.approval.approved": decision.approved,
                "codemode.approval.approver": decision.approver or "",
                "codemode.approval.via": decision.via,
            })
            span.add_event("approval decided", {"approved": decision.approved}, timestamp=_ns(decision.decided_at))
        span.set_attribute("codemode.outcome", record.status)
        if "return_value" in settled:
            span.set_attribute("codemode.result.bytes", _size(settled["return_value"]))
        else:
            span.set_status(Status(StatusCode.ERROR, f"{settled['exc_type']}: {settled.get('message', '')}"[:1000]))
        _end(span)
        return settled, record


# -- interceptors --------------------------------------------------------------------------------------------


class _WorkflowInbound(temporalio.worker.WorkflowInboundInterceptor):
    def init(self, outbound: temporalio.worker.WorkflowOutboundInterceptor) -> None:
        self._outbound = _WorkflowOutbound(outbound)
        super().init(self._outbound)

    async def execute_workflow(self, input: temporalio.worker.ExecuteWorkflowInput) -> Any:
        self._outbound.traced = _TracedRun()
        observe_run(self._outbound.traced)
        return await super().execute_workflow(input)


class _WorkflowOutbound(temporalio.worker.WorkflowOutboundInterceptor):
    traced: RunTelemetry = NO_TELEMETRY
    """The run's spans, once it runs."""

    def continue_as_new(self, input: temporalio.worker.ContinueAsNewInput) -> NoReturn:
        # Outermost of the outbound interceptors, so Temporal's (next) puts this context into the new run's header.
        with self.traced.run_parent():
            super().continue_as_new(input)


class _ActivityInbound(temporalio.worker.ActivityInboundInterceptor):
    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.activity_type == DESCRIBE_AGENT_ACTIVITY:  # bookkeeping before the run span exists: no span
            return await super().execute_activity(input)
        attributes: dict[str, Any] = {
            "codemode.attempt": info.attempt, "codemode.activity_type": info.activity_type,
            "temporalActivityID": info.activity_id, "temporalWorkflowID": info.workflow_id or ""}
        if info.activity_type not in (MODEL_REQUEST_ACTIVITY, OUTPUT_ACTIVITY, AFTER_RUN_ACTIVITY,
                                      RUN_ERROR_ACTIVITY):  # a tool call's
            attributes["codemode.call_id"] = info.activity_id.rsplit("-", 1)[0]
        tracer = trace.get_tracer(TRACER_NAME)
        span = tracer.start_span(f"codemode.attempt {info.activity_type}", attributes=attributes)
        try:
            with _current(span):
                result = await super().execute_activity(input)
        except BaseException as e:
            _attempt_failed(span, e)
            span.end()
            raise
        span.set_attribute("codemode.outcome", "ok")
        span.end()
        return result


def _attempt_outcome(error: BaseException) -> tuple[str, str | None]:
    """What became of an activity attempt that raised `error`: its outcome, and its error status (`None`: no error).

    A cancellation is told apart by its cause, since an attempt cut off by its worker's shutdown or by a timeout
    raises the same `CancelledError` as one the run cancelled, and each is retried (or not) differently.
    """
    if type(error).__name__ == "_CompleteAsyncError":  # `activity.raise_complete_async()`: not an end at all
        return "completes_async", None
    if not isinstance(error, (asyncio.CancelledError, CancelledError)):
        kind = error.type if isinstance(error, ApplicationError) and error.type else type(error).__name__
        text = str(error)  # a tool's failure already reads "ValueError: ..."
        return "failed", text if text.startswith(f"{kind}:") else f"{kind}: {text}"
    details = activity.cancellation_details()
    if activity.is_worker_shutdown() or (details is not None and details.worker_shutdown):
        return "cut_off", ("cut off: the worker shut down during the attempt, so it did not finish; Temporal "
                           "retries the call (on another worker)")
    if details is not None and details.timed_out:
        return "timed_out", ("cut off: the attempt timed out (its heartbeat or start-to-close timeout) before it "
                             "finished; Temporal retries the call within its retry policy")
    if details is not None and (details.paused or details.reset):
        what = "paused" if details.paused else "reset"
        return what, f"cut off: the activity was {what} by an operator during the attempt"
    return "cancelled", "cancelled: the run cancelled the call (or the run itself was cancelled) during the attempt"


def _attempt_failed(span: Span, error: BaseException) -> None:
    """Mark an attempt's span with what became of it (`_attempt_outcome`), its status an error unless it was none."""
    outcome, problem = _attempt_outcome(error)
    span.set_attribute("codemode.outcome", outcome)
    if problem is None:
        return
    if isinstance(error, Exception):
        span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, problem[:1000]))


class _CodeModeTracingInterceptor(temporalio.worker.Interceptor):
    """Turns the run workflow's spans on and makes a span per activity attempt."""

    def workflow_interceptor_class(
        self, input: temporalio.worker.WorkflowInterceptorClassInput
    ) -> type[temporalio.worker.WorkflowInboundInterceptor]:
        return _WorkflowInbound

    def intercept_activity(
        self, next: temporalio.worker.ActivityInboundInterceptor
    ) -> temporalio.worker.ActivityInboundInterceptor:
        return _ActivityInbound(next)


def _otel_interceptor_type() -> type[Any]:
    try:
        from temporalio.contrib.opentelemetry import OpenTelemetryInterceptor
    except ImportError as e:
        raise CodeModeUserError(_SDK_MISSING) from e
    return OpenTelemetryInterceptor


def has_tracing_interceptor(interceptors: Sequence[Any]) -> bool:
    """Whether Temporal's OpenTelemetry interceptor is among `interceptors` (without importing it if it can't be)."""
    return any(type(i).__name__ == "OpenTelemetryInterceptor" for i in interceptors)


def client_interceptors() -> list[Any]:
    """The interceptors a tracing client needs: Temporal's, which puts the caller's span into the run's header."""
    return [_otel_interceptor_type()()]


def worker_interceptors(client: Client) -> list[temporalio.worker.Interceptor]:
    """The interceptors a tracing worker adds: Temporal's (unless the client brings it) and ours, in that order.

    Raises:
        CodeModeUserError: the OpenTelemetry SDK is missing, or the global tracer provider is not replay-safe.

    """
    interceptor = _otel_interceptor_type()
    from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider

    if not isinstance(trace.get_tracer_provider(), ReplaySafeTracerProvider):
        raise CodeModeUserError(
            "tracing=True needs a replay-safe global tracer provider, so spans made in workflow code are not "
            "duplicated on replay: `provider = temporalio.contrib.opentelemetry.create_tracer_provider()`, add "
            "your span processor to it, and `opentelemetry.trace.set_tracer_provider(provider)` before creating "
            "the worker")
    present = has_tracing_interceptor(client.config(active_config=True)["interceptors"])
    ours: list[temporalio.worker.Interceptor] = [] if present else [interceptor()]
    return [*ours, _CodeModeTracingInterceptor()]
