"""A tracing worker's interceptors: the run's spans turned on in workflow code, and a span per activity attempt.

The spans themselves are made in workflow code (`workflow/_tracing`); what ends there live is handed to this
worker (`_span_exports`), which exports each once per run across workers.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

import temporalio.worker
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError, CancelledError

from .._otel import has_tracing_interceptor, otel_interceptor_type
from ..shared._errors import CodeModeUserError
from ..shared._names import (
    AFTER_RUN_ACTIVITY,
    DESCRIBE_AGENT_ACTIVITY,
    MODEL_REQUEST_ACTIVITY,
    OUTPUT_ACTIVITY,
    RUN_ERROR_ACTIVITY,
)
from ..workflow._observers import NO_TELEMETRY, RunTelemetry, observe_run
from ..workflow._tracing import TRACER_NAME, TracedRun, current_span
from ._span_exports import span_ended

__all__ = ["worker_interceptors"]


class _WorkflowInbound(temporalio.worker.WorkflowInboundInterceptor):
    def init(self, outbound: temporalio.worker.WorkflowOutboundInterceptor) -> None:
        self._outbound = _WorkflowOutbound(outbound)
        super().init(self._outbound)

    async def execute_workflow(self, input: temporalio.worker.ExecuteWorkflowInput) -> Any:
        self._outbound.traced = TracedRun(span_ended)
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
            with current_span(span):
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


def worker_interceptors(client: Client) -> list[temporalio.worker.Interceptor]:
    """The interceptors a tracing worker adds: Temporal's (unless the client brings it) and ours, in that order.

    Raises:
        CodeModeUserError: the OpenTelemetry SDK is missing, or the global tracer provider is not replay-safe.

    """
    interceptor = otel_interceptor_type()
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
