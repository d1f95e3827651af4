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

import json
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from contextvars import Token
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode
from temporalio import workflow

from ._observers import RunTelemetry

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelResponse

    from ..shared._records import CallRecord, RunResult
    from ._approval_state import Approvals
    from ._sandbox_types import Settled, SnippetOutcome

__all__ = ["TRACER_NAME", "SpanEnded", "TracedRun", "current_span"]

T = TypeVar("T")

TRACER_NAME = "durable_codemode"
"""The instrumentation scope of every span this library makes."""

SpanEnded = Callable[[Span], None]
"""What a tracing worker does with a workflow-side span that ended live (`worker/_span_exports.span_ended`)."""

_MAX_CODE_CHARS = 8192
"""A snippet's code is an attribute of its span up to this many characters (the line count is always whole)."""


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
def current_span(span: Span) -> Iterator[None]:
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        _detach(token)


class TracedRun(RunTelemetry):
    """A run's spans: the observer a tracing worker attaches (`worker/_tracing`)."""

    def __init__(self, span_ended: SpanEnded) -> None:
        self._span_ended = span_ended
        """Where a span that ended live goes: the worker that runs the task (`worker/_span_exports`)."""
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
        with current_span(span):
            try:
                result = await coro
            except BaseException as e:
                self._close(span, e)
                raise
        span.set_attributes({"codemode.outcome": "completed", "codemode.model_requests": result.usage.requests,
                             "codemode.output.bytes": len(result.output.encode())})
        self._end(span)
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
        with current_span(span):
            try:
                response = await coro
            except BaseException as e:
                self._close(span, e)
                raise
        calls = [getattr(p, "tool_name", "") for p in response.parts if p.part_kind == "tool-call"]
        span.set_attributes({
            "gen_ai.response.model": response.model_name or "",
            "gen_ai.usage.input_tokens": response.usage.input_tokens,
            "gen_ai.usage.output_tokens": response.usage.output_tokens,
            "codemode.tool_calls": calls,
        })
        self._end(span)
        return response

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        return self._snippet(coro, call_id, code)

    async def _snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], call_id: str, code: str) -> SnippetOutcome:
        span = self._tracer.start_span(f"codemode.run_code {call_id}", attributes={
            "codemode.call_id": call_id, "codemode.code": code[:_MAX_CODE_CHARS],
            "codemode.code.lines": code.count("\n") + 1})
        with current_span(span):
            try:
                outcome = await coro
            except BaseException as e:
                self._close(span, e)
                raise
        span.set_attributes({"codemode.outcome": outcome.kind, "codemode.result.bytes": _size(outcome.content),
                             "codemode.calls": len(outcome.calls)})
        if outcome.kind != "ok":
            content = outcome.content
            message = content.get("error") if isinstance(content, dict) else content
            span.set_status(Status(StatusCode.ERROR, str(message)[:1000]))
        self._end(span)
        return outcome

    def call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], *, tool: str, call_id: str,
             args: dict[str, Any], approvals: Approvals) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        return self._call(coro, tool, call_id, args, approvals)

    async def _call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], tool: str, call_id: str,
                    args: dict[str, Any], approvals: Approvals) -> tuple[Settled, CallRecord]:
        span = self._tracer.start_span(f"codemode.call {tool}", attributes={
            "codemode.tool": tool, "codemode.call_id": call_id, "codemode.args.bytes": _size(args),
            "codemode.approval.required": call_id in approvals.pending})
        with current_span(span):
            try:
                settled, record = await coro
            except BaseException as e:
                self._close(span, e)
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
        self._end(span)
        return settled, record

    def _end(self, span: Span) -> None:
        """End a workflow-side span: live, hand it to the worker that runs this task (`_span_exports.span_ended`).

        Ended while history replays, it is dropped: the worker that recorded its end exports it. Outside workflow code
        (a coroutine finalised by the garbage collector) nothing ends: there a replay cannot be told from a live run.
        """
        if not workflow.in_workflow() or workflow.unsafe.is_replaying_history_events():
            return
        self._span_ended(span)

    def _close(self, span: Span, error: BaseException) -> None:
        """End `span` for an exception leaving it, when that exception is the span's real end."""
        if isinstance(error, GeneratorExit):
            return
        if isinstance(error, workflow.ContinueAsNewError):
            span.set_attribute("codemode.outcome", "continued_as_new")
            self._end(span)
        elif isinstance(error, BaseException) and type(error).__name__ == "CancelledError":
            span.set_attribute("codemode.outcome", "cancelled")
            self._end(span)
        elif workflow.in_workflow() and isinstance(error, Exception) and workflow.is_failure_exception(error):
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.set_attribute("codemode.outcome", "failed")
            self._end(span)
        # Anything else fails the workflow task; its retry re-creates the span with the same id.
