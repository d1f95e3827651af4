"""Running one agent to its end in a test: a worker of its own, the run, its result, and the run's replay.

Every test that completes a run replays its history (the runtime's contract: a replay takes every decision the
run took), so the replay is part of running to the end, not a step a test may forget.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowHandle

from durable_codemode import CodeModeAgent, RunResult, start_run
from durable_codemode.testing import new_task_queue, replay, running_worker


async def run_to_end(client: Client, agent: CodeModeAgent, prompt: str = "go",
                     **worker_options: Any) -> tuple[RunResult[Any], WorkflowHandle[Any, RunResult[Any]]]:
    """Run `agent` on a fresh task queue until the run ends; replay it; its result and handle.

    `worker_options` go to the worker (`create_worker`'s keyword arguments).
    """
    task_queue = new_task_queue()
    async with running_worker(client, [agent], task_queue=task_queue, **worker_options):
        handle = await start_run(client, agent.name, prompt, task_queue=task_queue)
        result = await handle.result()
    await replay(handle)  # every completed run must replay cleanly
    return result, handle
