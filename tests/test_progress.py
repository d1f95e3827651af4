"""A run's status is written only by its own workflow instance, never by a dropped one's leftovers.

A worker that shuts down drops its cached runs without finishing their coroutines; the garbage collector runs
their `finally` blocks later, at whatever moment it collects them, which can be inside another run's workflow
task. There a dropped run waiting for approval used to write its status (an upsert) into the other run: a
command the other run's code never made, so its history did not replay (TMPRL1100, "UpsertWorkflowSearch-
AttributesMachine does not handle ..."), seen in the full suite under load. This test makes the collection
happen at a known moment: an interceptor collects garbage each time a workflow schedules an activity.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle

from durable_codemode import pending_approvals, start_run
from durable_codemode.testing import RunCode, new_task_queue, replay, running_worker
from durable_codemode.workflow._approval_state import Approvals
from durable_codemode.workflow._progress import RunProgress

from ._agents import items_agent


class _CollectingOutbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> ActivityHandle[Any]:
        gc.collect()  # finalise whatever dropped workflow instances are garbage, inside this workflow task
        return super().start_activity(input)

    def start_local_activity(self, input: StartLocalActivityInput) -> ActivityHandle[Any]:
        gc.collect()
        return super().start_local_activity(input)


class _CollectingInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_CollectingOutbound(outbound))


class _CollectGarbage(Interceptor):
    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _CollectingInbound


async def test_a_dropped_runs_leftovers_write_nothing_into_another_run(client: Client) -> None:
    # A run left waiting for approval on a worker that then shuts down: its instance is dropped, not finished.
    waiting = items_agent("progress-waiting", RunCode("await store(key='a', value=1)"), "done",
                          requires_approval=True)
    tq = new_task_queue()
    async with running_worker(client, [waiting], task_queue=tq, unsigned_approvals=True):
        parked = await start_run(client, "progress-waiting", "go", task_queue=tq)
        while not await pending_approvals(client, parked.id):
            await asyncio.sleep(0.05)

    # Another run, on a worker that collects garbage inside its workflow tasks. A full collection of this test
    # process's heap took past Temporal's 2 s deadlock limit under load, failing each task again: the limit is off
    # (`debug_mode`), what is tested is what the collector finalises, not how fast.
    other = items_agent("progress-other", RunCode("[await get(i=1), await get(i=2)]"), "done")
    tq2 = new_task_queue()
    async with running_worker(client, [other], task_queue=tq2, interceptors=[_CollectGarbage()],
                              unsigned_approvals=True, debug_mode=True):
        handle = await start_run(client, "progress-other", "go", task_queue=tq2)
        assert (await handle.result()).output == "done"
    history = await handle.fetch_history()
    upserts = [e for e in history.events if e.event_type in (
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES, EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED)]
    # Only its own end ("completed", in its last task): a run that never waited for approval wrote no "waiting".
    assert [e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields[
        "CodemodeStatus"].data for e in upserts] == [b'"completed"'], "a dropped run wrote a status into this one"
    await replay(handle)
    await parked.terminate("test over")


def test_a_dropped_runs_progress_outside_workflow_code_publishes_nothing() -> None:
    """A dropped run's leftovers, finished by the garbage collector outside any workflow, touch nothing.

    The collector may also finish a dropped run's coroutines on a worker's own thread, outside any workflow's event
    loop: there the run's progress must do nothing, and raise nothing (it asks `instance()`, which raises outside
    workflow code).
    """
    progress = RunProgress(Approvals)
    progress._owner = object()  # the dropped run had started (`RunProgress.run`)
    progress.show()
    progress._publish_details()
    assert not progress._details_due  # nothing was scheduled: there is no workflow loop to schedule on
