"""A tracing worker's side of exporting each workflow-side span once (`_span_exports` says why and how).

- `SpanRecordingRunner` wraps the worker's workflow runner: around each activation of each workflow instance it
  tells the instance's `RunSpans` what core says (a live activation of a later task, an eviction and its reason)
  and makes it the thread's current run, so a span the activation ends is held by this worker.
- `settle_spans` runs beside the worker: about twice a second it reads, for each run that went quiet or was evicted
  with spans held, whether the server recorded their tasks as completed by this worker (the run's history, read
  from its end), and exports or drops them; once more, for everything held, when the worker stops.
"""

from __future__ import annotations

import asyncio
import logging

import temporalio.bridge.proto.workflow_activation as activation_pb
import temporalio.bridge.proto.workflow_completion as completion_pb
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from ._runner_wrapping import ForwardingInstance, ForwardingRunner
from ._span_exports import RunSpans, WorkerSpans, current_run, drain_exports

__all__ = ["SETTLE_EVERY_SECONDS", "SETTLE_QUIET_SECONDS", "SpanRecordingRunner", "settle_spans"]

_logger = logging.getLogger("durable_codemode")

SETTLE_EVERY_SECONDS = 0.5
"""How often a tracing worker looks for held spans to settle."""

SETTLE_QUIET_SECONDS = 1.0
"""How long a cached run must have been quiet (no activation) before its history is read for its held spans: a
run that goes on gets its next activation sooner, which settles them for free."""

_PAGE = 50
"""Events per page of a history read from its end."""

_CLOSED = frozenset({
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
})

_ENDING = activation_pb.RemoveFromCache.EvictionReason.WORKFLOW_EXECUTION_ENDING


class _RecordingInstance(ForwardingInstance):
    """A workflow instance whose activations tell its `RunSpans` what core says about its tasks."""

    def __init__(self, inner: WorkflowInstance, spans: RunSpans) -> None:
        super().__init__(inner)
        self._spans = spans

    def activate(self, act: activation_pb.WorkflowActivation) -> completion_pb.WorkflowActivationCompletion:
        eviction = next((job.remove_from_cache for job in act.jobs if job.HasField("remove_from_cache")), None)
        if eviction is not None:
            self._spans.evicted_now(execution_ending=eviction.reason == _ENDING)
            return self._inner.activate(act)
        self._spans.activation_started(history_length=act.history_length, replaying=act.is_replaying)
        try:
            with current_run(self._spans):
                return self._inner.activate(act)
        finally:
            self._spans.activation_ended()


class SpanRecordingRunner(ForwardingRunner):
    """The worker's workflow runner, each instance's activations reported to the worker's `WorkerSpans`.

    It changes nothing an activation does or returns: it only watches the activations go by.
    """

    def __init__(self, inner: WorkflowRunner, spans: WorkerSpans) -> None:
        super().__init__(inner)
        self.spans = spans

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _RecordingInstance(self._inner.create_instance(det),
                                  self.spans.instance(det.info.workflow_id, det.info.run_id))


async def recorded_by(client: Client, workflow_id: str, run_id: str, tasks: set[int], identity: str
                      ) -> dict[int, bool]:
    """Which of the run's `tasks` (their `WorkflowTaskStarted` event ids) were recorded as completed by `identity`.

    A task's outcome is the event right after its start: `WorkflowTaskCompleted` (with the identity of the worker
    whose completion the server took), or a failure, a timeout, the run's end. A task whose outcome is not in the
    history yet is left out of the answer (unless the run has closed: then it never will be, and it is `False`).
    """
    wanted = {task + 1 for task in tasks}
    lowest = min(wanted)
    found: dict[int, tuple[int, str]] = {}
    last: int | None = None
    closed = False
    token = b""
    while True:
        response = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace, execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
                maximum_page_size=_PAGE, next_page_token=token))
        events = list(response.history.events)
        for event in events:
            if last is None:
                last, closed = event.event_id, event.event_type in _CLOSED
            if event.event_id in wanted:
                found[event.event_id] = (event.event_type, event.workflow_task_completed_event_attributes.identity)
        token = response.next_page_token
        if not token or not events or events[-1].event_id <= lowest:
            break
    answer: dict[int, bool] = {}
    for task in tasks:
        outcome = found.get(task + 1)
        if outcome is not None:
            answer[task] = outcome == (EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, identity)
        elif closed or (last is not None and last > task + 1):
            answer[task] = False
    return answer


async def settle_once(client: Client, spans: WorkerSpans, *, quiet: float = SETTLE_QUIET_SECONDS,
                      everything: bool = False) -> None:
    """Read the histories of the runs with spans due (`WorkerSpans.due`), and export or drop those spans."""
    for (workflow_id, run_id), tasks in spans.due(quiet=quiet, everything=everything).items():
        try:
            recorded = await recorded_by(client, workflow_id, run_id, tasks, spans.identity)
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:  # the run is gone (deleted, past retention): so are its tasks
                spans.settle(workflow_id, run_id, dict.fromkeys(tasks, False))
            else:  # the server is busy or away: next time
                _logger.debug("could not read the history of run %s for its spans: %s", run_id, e)
                spans.postpone(workflow_id, run_id)
            continue
        spans.settle(workflow_id, run_id, recorded)
        if len(recorded) < len(tasks):
            spans.postpone(workflow_id, run_id)


async def settle_spans(client: Client, spans: WorkerSpans, *, every: float = SETTLE_EVERY_SECONDS) -> None:
    """While a tracing worker runs: settle its held spans (`settle_once`) every `every` seconds.

    Cancelled when the worker has stopped; the worker then settles everything it still holds (`settle_all`).
    """
    while True:
        await asyncio.sleep(every)
        try:
            await settle_once(client, spans)
        except Exception:  # a bug here must not stop the exports that follow
            _logger.exception("settling held spans failed")


async def settle_all(client: Client, spans: WorkerSpans, *, timeout: float = 10.0) -> None:
    """The worker has stopped: settle everything it holds, and wait until those exported have reached the exporter.

    Its tasks' completions were all sent before it stopped, so each is in its run's history by now, or soon.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while spans.held() and loop.time() < deadline:
        try:
            await settle_once(client, spans, everything=True)
        except Exception:
            _logger.exception("settling held spans failed")
        if spans.held():
            await asyncio.sleep(0.1)
    if spans.held():
        _logger.warning("a stopping worker dropped %d spans whose workflow tasks its runs' histories did not show as "
                        "recorded within %g s", spans.held(), timeout)
    await asyncio.to_thread(drain_exports, max(0.0, deadline - loop.time()) + 5.0)
