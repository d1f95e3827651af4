"""Running a bundled benchmark task the way a user does, and the checks every task's run must pass."""

from __future__ import annotations

from temporalio.client import Client

from durable_codemode import RunResult, start_run
from durable_codemode.apps.workflows.tasks import Instance, Mode
from durable_codemode.testing import new_task_queue, replay, running_worker


async def run_graded(client: Client, instance: Instance, mode: Mode) -> RunResult:
    """Run `instance` on a fresh worker in `mode`, replay its chain, and check what every task's run must hold.

    The oracle finds the exact end state and the reply's numbers, no side effect ran twice, and the calls were
    nested in code mode and direct without it. Returns the result for a task's own checks.
    """
    agent = instance.agent(mode)
    task_queue = new_task_queue()
    async with running_worker(client, [agent], task_queue=task_queue):
        handle = await start_run(client, agent.name, instance.prompt, task_queue=task_queue)
        result = await handle.result()
        await replay(handle)
    assert instance.check(result.output) == []
    assert instance.duplicate_effects() == 0
    if mode == "on":
        assert len(result.nested_calls) > 0 and not result.direct_calls
    else:
        assert len(result.direct_calls) > 0 and not result.nested_calls
    return result
