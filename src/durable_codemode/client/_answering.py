"""Why no worker answered for a run: none polls its task queue, none has lately, or one does but was busy.

A query or a decision needs a worker that serves the run's task queue, and one that has a workflow task slot free
to take it. "No worker answered within 10 s" meant both "start a worker" and "the worker is busy": measured, while
one worker started 1,000 runs with its 4 workflow task slots, `pending_approvals` raised it 34 times, telling the
person to start a worker that was running. The server knows which it is: the task queue's pollers, each with the
time it last polled (a worker polls whenever it has a slot free, and keeps polling while it idles). So the error
says which, from `DescribeTaskQueue`:

- no poller: no worker serves the queue (`WorkerUnavailableError`): start one;
- a poller within `RECENT_POLL_SECONDS`: a worker serves it and did not answer in time (`WorkerBusyError`): it
  is busy (or it stopped moments ago, which the server cannot tell yet);
- only older pollers: the workers that served it stopped polling that long ago (`WorkerUnavailableError`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError

from ..shared._errors import WorkerBusyError, WorkerUnavailableError
from ..shared._results import printable

__all__ = ["RECENT_POLL_SECONDS", "no_answer"]

RECENT_POLL_SECONDS = 75.0
"""A worker that polled its task queue this recently serves it still, as far as the server can tell: an idle worker
polls again at least every minute (a long poll lasts up to 60 s), a busy one whenever a slot frees."""

_ASK_TIMEOUT = timedelta(seconds=5)


async def no_answer(client: Client, run_id: str, timeout: timedelta, *, what: str, todo: str
                    ) -> WorkerUnavailableError:
    """The error for "no worker `what` for run `run_id` within `timeout`", saying why from the queue's pollers.

    `what`: "answered", "took the decision"; `todo`: the caller's next step once a worker answers ("send the
    decision again"). Never raises: when the server cannot say, the error says what it knows.
    """
    waited = f"within {timeout.total_seconds():g} s"
    shown = printable(run_id)
    try:
        described = await client.get_workflow_handle(run_id).describe(rpc_timeout=_ASK_TIMEOUT)
        task_queue = described.task_queue
        response = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW), timeout=_ASK_TIMEOUT)
    except RPCError:
        return WorkerUnavailableError(
            f"no worker {what} for run {shown!r} {waited}: start a worker that serves the run's agent on its task "
            f"queue (`codemode worker`), or if one runs, it is busy: {todo}")
    now = datetime.now(UTC)
    ages = sorted(((now - p.last_access_time.ToDatetime(tzinfo=UTC)).total_seconds(), p.identity)
                  for p in response.pollers)
    pollers = tuple(identity for _, identity in ages)
    queue = printable(task_queue)
    if not ages:
        return WorkerUnavailableError(
            f"no worker polls task queue {queue!r}, where run {shown!r} is served, so none {what} {waited}: start a "
            f"worker that serves the run's agent on that task queue (`codemode worker --task-queue {queue}`), then "
            f"{todo}", task_queue=task_queue, pollers=pollers)
    named = ", ".join(printable(p) for p in pollers[:3]) + (f" and {len(pollers) - 3} more" if len(pollers) > 3
                                                             else "")
    latest = ages[0][0]
    if latest <= RECENT_POLL_SECONDS:
        return WorkerBusyError(
            f"no worker {what} for run {shown!r} {waited}, though {_polling(len(pollers))} its task queue {queue!r} "
            f"({named}, the last {latest:.0f} s ago): busy, every workflow task slot taken (runs starting or "
            f"replaying), or stopped just now. {todo[0].upper() + todo[1:]} in a moment, allow longer (timeout=), or "
            "give the workers more workflow task slots (create_worker(max_concurrent_workflow_tasks=...), with "
            "PoolSettings(max_processes=...) at least as many)", task_queue=task_queue, pollers=pollers)
    return WorkerUnavailableError(
        f"no worker {what} for run {shown!r} {waited}: none has polled its task queue {queue!r} for {latest:.0f} s "
        f"(last: {named}), so they stopped (or hang): start a worker that serves the run's agent on that task "
        f"queue, then {todo}", task_queue=task_queue, pollers=pollers)


def _polling(count: int) -> str:
    return "1 worker polls" if count == 1 else f"{count} workers poll"
