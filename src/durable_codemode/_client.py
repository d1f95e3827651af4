"""Starting runs from a Temporal client."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from pydantic_ai.messages import ModelMessage
from temporalio.client import Client, WorkflowHandle

from ._types import RunInput, RunResult
from ._worker import DEFAULT_TASK_QUEUE
from ._workflow import CodeModeRunWorkflow

__all__ = ["run_agent", "start_run"]


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
    return await client.start_workflow(
        CodeModeRunWorkflow.run,
        RunInput(agent=agent, prompt=prompt, model=model, message_history=list(message_history)),
        id=run_id or f"{agent}-{uuid.uuid4().hex[:12]}",
        task_queue=task_queue,
        memo={"agent": agent},
    )


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
