"""Recent runs of a server from Temporal's visibility store, with the state a person asks about first.

Visibility knows a run's Temporal status (`ExecutionStatus`), which is the one that says whether a run has ended:
only Temporal's own status follows a run that Temporal ended without running its code (terminated, timed out).
Whether a running run waits on a person is the `CodemodeStatus` search attribute (or the `status` memo key on a
server without it, see `_visibility`), which the run keeps up to date and, from behaviour version 2 on, sets to how
its code ended it; it is read only for runs visibility lists as running. So `--status running` and `--status
waiting` are both open runs, told apart by that attribute.
So agent and "waiting" are filters of the visibility query itself when the server has the search attributes.
Runs started by an older client carry neither: they are asked by the `pending_approvals` query (answered in
milliseconds by a worker), with a short deadline and for a bounded number of runs, so a list of hundreds of runs,
or a server with no worker, never makes the command hang.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.service import RPCError

from .._deployments import VERSION_KEY, VERSION_SEARCH_ATTRIBUTE, parse_version, version_label
from .._encryption import EncryptionError
from .._visibility import AGENT_KEY, STATUS_KEY, lacks_search_attributes, uses_search_attributes
from ..shared._errors import CodeModeUserError
from ..shared._names import (
    AGENT_MEMO,
    AGENT_SEARCH_ATTRIBUTE,
    STATUS_MEMO,
    STATUS_SEARCH_ATTRIBUTE,
    STATUS_WAITING,
    WORKFLOW_TYPE,
)
from ..workflow._run import CodeModeRunWorkflow

__all__ = ["RUN_STATES", "RunSummary", "list_runs"]

RunState = Literal["running", "waiting for approval", "completed", "failed", "continued-as-new", "terminated",
                   "cancelled", "timed-out"]

RUN_STATES: tuple[str, ...] = ("open", "running", "waiting", "completed", "failed", "continued-as-new",
                               "terminated", "cancelled", "timed-out")
"""What `codemode runs --status` accepts (`waiting`: open and waiting for an approval; `running`: open and not;
`open`: either, what a worker deployment version still serves)."""

_VISIBILITY_STATUS = {
    "open": "Running", "running": "Running", "waiting": "Running", "completed": "Completed", "failed": "Failed",
    "continued-as-new": "ContinuedAsNew", "terminated": "Terminated", "cancelled": "Canceled",
    "timed-out": "TimedOut",
}

_STATE: dict[WorkflowExecutionStatus, RunState] = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued-as-new",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TIMED_OUT: "timed-out",
}

_QUERY_DEADLINE = timedelta(seconds=2)
"""How long a running run's worker gets to say what it waits for."""

_MAX_QUERIED = 50
"""Running runs asked about their approvals, at most, per listing."""


@dataclass(kw_only=True)
class RunSummary:
    """One workflow run as the list shows it."""

    workflow_id: str
    run_id: str
    agent: str | None
    state: RunState
    started_at: datetime
    closed_at: datetime | None
    pending_approvals: int | None = None
    """For running runs: calls waiting for a decision; `None` when no worker answered in time (or not asked)."""
    status_recorded: bool = False
    """The state came from the run's `CodemodeStatus` search attribute or `status` memo (so it was not asked)."""
    version: str | None = None
    """The Worker Deployment version the run is pinned to, `NAME:BUILD_ID` (`None`: an unversioned worker's run)."""


async def _memo(execution: WorkflowExecution) -> Mapping[str, Any]:
    """The run's memo, or `{}` when this client cannot read it: a run encrypted with a key it does not hold.

    One such run in the namespace must not take the whole listing down (the page's runs list answered 500 for
    every run). Its agent and status still come from the search attributes, which are not encrypted.
    """
    try:
        return await execution.memo()
    except (EncryptionError, KeyError):  # a key this client lacks; no codec at all ("Unknown payload encoding")
        return {}


async def _pending(client: Client, execution: WorkflowExecution) -> int | None:
    handle = client.get_workflow_handle_for(CodeModeRunWorkflow.run, execution.id, run_id=execution.run_id)
    try:
        pending = await handle.query(CodeModeRunWorkflow.pending_approvals, rpc_timeout=_QUERY_DEADLINE)
    except Exception:  # no worker, an old worker, a missed deadline: unknown, never fatal to the listing
        return None
    return len(pending)


async def list_runs(
    client: Client, *, agent: str | None = None, status: str | None = None, query: str | None = None,
    limit: int = 20, version: str | None = None,
) -> list[RunSummary]:
    """The most recent runs, newest first.

    Args:
        client: The server's client.
        agent: Only runs of this agent (the `agent` memo every run is started with).
        status: One of `RUN_STATES`; `None`: any.
        query: A visibility query ANDed with the rest, e.g. `"TaskQueue = 'cart'"`.
        limit: At most this many runs.
        version: Only runs pinned to this Worker Deployment version, `NAME:BUILD_ID` (or `NAME.BUILD_ID`): with
            `status="open"`, the runs that still need that version's workers before it can be retired.

    Raises:
        CodeModeUserError: an unknown status, or a version that is not `NAME:BUILD_ID`.

    """
    if status is not None and status not in _VISIBILITY_STATUS:
        raise CodeModeUserError(f"unknown status {status!r}: use one of {', '.join(RUN_STATES)}")
    if version is not None:
        pinned = f"{VERSION_SEARCH_ATTRIBUTE} = {_quoted(version_label(parse_version(version)))}"
        query = f"{pinned} AND ({query})" if query else pinned
    if uses_search_attributes(client):
        try:
            return await _list(client, agent=agent, status=status, query=query, limit=limit, indexed=True)
        except RPCError as e:
            if not lacks_search_attributes(client, e):
                raise
    return await _list(client, agent=agent, status=status, query=query, limit=limit, indexed=False)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


async def _list(client: Client, *, agent: str | None, status: str | None, query: str | None, limit: int,
                indexed: bool) -> list[RunSummary]:
    """`list_runs`; `indexed`: filter by agent and waiting in the visibility query (the search attributes)."""
    clauses = [f"WorkflowType = '{WORKFLOW_TYPE}'"]
    if status is not None:
        clauses.append(f"ExecutionStatus = '{_VISIBILITY_STATUS[status]}'")
    if indexed and agent is not None:
        clauses.append(f"{AGENT_SEARCH_ATTRIBUTE} = {_quoted(agent)}")
    if indexed and status == "waiting":
        clauses.append(f"{STATUS_SEARCH_ATTRIBUTE} = '{STATUS_WAITING}'")
    if indexed and status == "running":  # open and not waiting; runs of older clients record no status
        clauses.append(f"({STATUS_SEARCH_ATTRIBUTE} IS NULL OR {STATUS_SEARCH_ATTRIBUTE} != '{STATUS_WAITING}')")
    if query:
        clauses.append(f"({query})")
    runs: list[tuple[WorkflowExecution, RunSummary]] = []
    # Without the search attributes the agent and status are in the memo, which visibility cannot filter on: read
    # more and filter here (runs of older clients are among them too).
    # `running` excludes runs waiting for a person, which visibility lists as Running too: the query does with the
    # search attribute (so a fleet of waiting runs cannot crowd the running ones out), else read more, filter here.
    scan = limit * 10 if not indexed and (agent or status in ("waiting", "running")) else limit
    async for execution in client.list_workflows(" AND ".join(clauses), limit=scan):
        memo = await _memo(execution)
        name = execution.typed_search_attributes.get(AGENT_KEY) or memo.get(AGENT_MEMO)
        name = name if isinstance(name, str) else None
        if agent is not None and name != agent:
            continue
        state = _STATE.get(execution.status or WorkflowExecutionStatus.RUNNING, "running")
        recorded = execution.typed_search_attributes.get(STATUS_KEY) or memo.get(STATUS_MEMO)
        summary = RunSummary(workflow_id=execution.id, run_id=execution.run_id, agent=name, state=state,
                             started_at=execution.start_time, closed_at=execution.close_time,
                             status_recorded=isinstance(recorded, str),
                             version=execution.typed_search_attributes.get(VERSION_KEY) or None)
        if state == "running" and isinstance(recorded, str):
            summary.state = "waiting for approval" if recorded == STATUS_WAITING else "running"
        runs.append((execution, summary))
        if len(runs) >= (scan if status in ("waiting", "running") else limit):
            break
    # Asked by query: runs that do not record their status (older clients), and waiting runs, for how many calls
    # wait; a running run that records "running" need not be asked.
    asked = [(e, s) for e, s in runs
             if s.state == "waiting for approval" or (s.state == "running" and not s.status_recorded)][:_MAX_QUERIED]
    answers = await asyncio.gather(*(_pending(client, e) for e, _ in asked))
    for (_, summary), pending in zip(asked, answers, strict=True):
        summary.pending_approvals = pending
        if pending:
            summary.state = "waiting for approval"
    found = [s for _, s in runs]
    if status == "waiting":
        found = [s for s in found if s.state == "waiting for approval"]
    elif status == "running":
        found = [s for s in found if s.state == "running"]
    return found[:limit]
