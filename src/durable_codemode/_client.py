"""Starting runs from a Temporal client."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from pydantic_ai.messages import ModelMessage
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from ._approvals import ApprovalDecision, ApprovalRecord, BatchDecision, PendingApproval
from ._types import RunInput, RunResult
from ._visibility import lacks_search_attributes, start_options
from ._worker import DEFAULT_TASK_QUEUE
from ._workflow import CodeModeRunWorkflow

__all__ = ["decide", "decide_all", "pending_approvals", "run_agent", "start_run"]


async def start_run(
    client: Client,
    agent: str,
    prompt: str,
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    model: str | None = None,
    message_history: Sequence[ModelMessage] = (),
    run_id: str | None = None,
) -> WorkflowHandle[CodeModeRunWorkflow, RunResult]:
    """Start an agent run and return its handle; `await handle.result()` gives the `RunResult`.

    Args:
        client: from `durable_codemode.connect()`.
        agent: the agent's name, as served by a worker on `task_queue`.
        prompt: the user's prompt.
        task_queue: the workers' task queue.
        model: a pydantic-ai model string overriding the agent's model for this run.
        message_history: earlier messages to continue a conversation.
        run_id: the workflow id; defaults to `<agent>-<random>`. Reusing the id of a running run is an error.

    """
    if not agent:
        raise ValueError("agent must be a non-empty agent name")
    run_input = RunInput(agent=agent, prompt=prompt, model=model, message_history=list(message_history))
    workflow_id = run_id or f"{agent}-{uuid.uuid4().hex[:12]}"
    try:
        return await client.start_workflow(CodeModeRunWorkflow.run, run_input, id=workflow_id,
                                           task_queue=task_queue, **start_options(client, agent))
    except RPCError as e:
        if not lacks_search_attributes(client, e):  # then the memo carries agent and status (_visibility)
            raise
        return await client.start_workflow(CodeModeRunWorkflow.run, run_input, id=workflow_id,
                                           task_queue=task_queue, **start_options(client, agent))


async def run_agent(
    client: Client,
    agent: str,
    prompt: str,
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    model: str | None = None,
    message_history: Sequence[ModelMessage] = (),
    run_id: str | None = None,
) -> RunResult:
    """Start an agent run and wait for its result (see `start_run` for the arguments)."""
    handle = await start_run(client, agent, prompt, task_queue=task_queue, model=model,
                             message_history=message_history, run_id=run_id)
    return await handle.result()


def _handle(client: Client, run_id: str) -> WorkflowHandle[CodeModeRunWorkflow, RunResult]:
    return client.get_workflow_handle_for(CodeModeRunWorkflow.run, run_id)


async def pending_approvals(client: Client, run_id: str) -> list[PendingApproval]:
    """The calls of run `run_id` waiting for a decision (a query: answers in milliseconds, records nothing)."""
    return await _handle(client, run_id).query(CodeModeRunWorkflow.pending_approvals)


async def decide(
    client: Client, run_id: str, call_id: str, *, approved: bool, note: str | None = None,
    approver: str | None = None,
) -> ApprovalRecord:
    """Approve or deny one waiting call; returns its audit record once the run has recorded it.

    The call id is the update id, so sending a decision twice is harmless: the second gets the first's record
    back (check `record.approved`: a later, different decision about the same call is not applied).

    Raises:
        temporalio.client.WorkflowUpdateFailedError: the call id is unknown, already decided or expired (the
            message says which); the run is unaffected.

    """
    return await _handle(client, run_id).execute_update(
        CodeModeRunWorkflow.decide,
        ApprovalDecision(call_id=call_id, approved=approved, note=note, approver=approver),
        id=call_id,
    )


async def decide_all(
    client: Client, run_id: str, *, approved: bool, note: str | None = None, approver: str | None = None
) -> list[ApprovalRecord]:
    """Approve or deny every call of run `run_id` waiting for a decision."""
    return await _handle(client, run_id).execute_update(
        CodeModeRunWorkflow.decide_all, BatchDecision(approved=approved, note=note, approver=approver))
