"""The child runs a run waits on, as a client finds them: listed by the run, each confirmed by the server.

A parent's calls to a `child_run_tool` start child runs, and a person decides a child's calls on the child. A
client lists them from a source no outsider can write: the parent's own list of the children it started (the
`CHILD_RUNS_QUERY`, answered from its workflow state), each checked with the server (`describe`: the child's
parent is that run, which only the server records), and then each child's calls from the child itself. A signal
saying what a child waits on could come from anyone, so none is read (`_names.CHILD_APPROVALS_SIGNAL`).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError

from ..shared._approvals import ChildRun
from ..shared._names import CHILD_RUNS_QUERY

__all__ = ["MAX_CHILD_DEPTH", "children_of"]

MAX_CHILD_DEPTH = 8
"""How many levels of child runs a listing follows (a child run's own child runs are one level more)."""


async def _is_child(client: Client, child: ChildRun, parent_id: str, timeout: timedelta) -> bool:
    """Whether the server says `child` runs, as a child of `parent_id` (not a run someone else started by that id)."""
    try:
        description = await client.get_workflow_handle(child.run_id).describe(rpc_timeout=timeout)
    except RPCError:
        return False  # ended and gone, or never started: nothing waits there
    parent = description.raw_description.workflow_execution_info.parent_execution
    return description.status == WorkflowExecutionStatus.RUNNING and parent.workflow_id == parent_id


async def children_of(client: Client, run_id: str, *, timeout: timedelta) -> list[ChildRun]:
    """The child runs run `run_id` started and still waits on, each confirmed by the server to be its child.

    `[]` from a worker of a release before the query (it knows no `CHILD_RUNS_QUERY`).

    Raises:
        temporalio.service.RPCError: as a query of the run raises it (no such run, no worker answered).

    """
    try:
        listed: list[ChildRun] = await client.get_workflow_handle(run_id).query(
            CHILD_RUNS_QUERY, result_type=list[ChildRun], rpc_timeout=timeout)
    except WorkflowQueryFailedError:
        return []
    confirmed = await asyncio.gather(*(_is_child(client, child, run_id, timeout) for child in listed))
    return [child for child, ok in zip(listed, confirmed, strict=True) if ok]
