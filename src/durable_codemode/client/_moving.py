"""Whether a run may take a workflow task any moment now, asked of the server (no worker answers it).

A query that reaches a run while its worker evicts it can cost the run its next workflow task. On a worker that
caches no run (`max_cached_workflows=0`, or a full cache), Temporal's core SDK (temporalio 1.35) evicts a run after
each workflow task; a query arriving during that eviction is buffered, and a workflow task arriving in the same few
milliseconds (an activity just completed) is buffered behind it. When the eviction ends, core applies the query and
drops the task with the warning "There were leftover buffered tasks when evicting run". The server holds the
dropped task as started until its timeout (10 s): the run stalls, and every query meanwhile waits and fails.
Measured here: ten clients polling one such run ten times a second lost a task in 3 of 3 tries of eight runs
(`tests/test_evicted_queries.py`), and the approvals benchmark's smoke test failed about one run in ten.

So a client that asks a run again and again (`wait_for_approvals`, the benchmark) asks the server first
(`describe`: the run's pending workflow task and activities, from the server's own state) and queries the run while
nothing is about to move it. A person's single query lands in that window rarely; a poller's, every few runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from .._visibility import STATUS_KEY
from ..shared._names import STATUS_MEMO, STATUS_WAITING

__all__ = ["RunMotion", "run_motion"]


@dataclass(frozen=True)
class RunMotion:
    """What the server says of a run: whether something is about to move it, and whether it waits for a person."""

    moving: bool
    """A workflow task or an activity is in flight (a query now could cost the run a workflow task)."""
    waiting: bool
    """Its status (`CodemodeStatus`, or the memo's) says a call of its own waits for a person."""


async def run_motion(client: Client, run_id: str, *, timeout: timedelta = timedelta(seconds=10)) -> RunMotion:
    """Whether run `run_id` is moving and whether it waits for a person, from the server's own state (`describe`).

    Neither, for a closed run and when the server cannot say (the query that follows says what is wrong). Timers
    and child runs do not count as moving: they rarely end within a query's few milliseconds, and a parent waits on
    its children for as long as they wait for a person.
    """
    try:
        description = await client.get_workflow_handle(run_id).describe(rpc_timeout=timeout)
    except RPCError:
        return RunMotion(moving=False, waiting=False)
    if description.status != WorkflowExecutionStatus.RUNNING:
        return RunMotion(moving=False, waiting=False)
    raw = description.raw_description
    status = description.typed_search_attributes.get(STATUS_KEY)
    if status is None:
        try:
            status = await description.memo_value(STATUS_MEMO, None, type_hint=str)
        except (KeyError, TypeError, ValueError):
            status = None
    return RunMotion(moving=raw.HasField("pending_workflow_task") or len(raw.pending_activities) > 0,
                     waiting=status == STATUS_WAITING)
