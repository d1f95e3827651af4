"""`Agent(retries=...)`'s tool budget, as in `agent.run()`: how often in a row the model may retry a direct call.

In a program a tool's error is an exception the program can catch, so the budget bounds only the calls the model
makes directly (native tools, or every tool with code mode off).
"""

from __future__ import annotations

import pytest
from pydantic_ai import Agent, ModelRetry
from temporalio.client import Client, WorkflowFailureError

from durable_codemode import CodeModeAgent, start_run
from durable_codemode.testing import CallTool, new_task_queue, replay, running_worker, scripted_model

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


def flaky_agent(name: str, *steps: object, fails: int, retries: int) -> CodeModeAgent:
    agent = Agent(scripted_model(*steps), name=name, retries=retries)  # type: ignore[arg-type]
    seen: list[int] = []

    @agent.tool_plain
    def lookup(sku: str) -> int:
        """Stock of `sku`; fails its first `fails` calls."""
        seen.append(1)
        if len(seen) <= fails:
            raise ModelRetry(f"the stock service is busy (call {len(seen)})")
        return 7

    return CodeModeAgent(agent, code_mode=False)


async def test_a_direct_call_retried_past_its_budget_fails_the_run_unretried(client: Client) -> None:
    agent = flaky_agent("retries-spent", *[CallTool("lookup", {"sku": "a"})] * 3, "never", fails=99, retries=2)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "stock?", task_queue=tq)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert "Tool 'lookup' exceeded max retries count of 2" in str(cause) and getattr(cause, "non_retryable", False)
    await replay(handle)


async def test_a_success_resets_the_count(client: Client) -> None:
    steps = [CallTool("lookup", {"sku": "a"})] * 2 + [CallTool("lookup", {"sku": "b"})] * 2 + ["done"]
    agent = flaky_agent("retries-reset", *steps, fails=1, retries=1)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "stock?", task_queue=tq)
        result = await handle.result()
    assert result.output == "done"
    assert [c.status for c in result.direct_calls] == ["error", "ok", "ok", "ok"]
    await replay(handle)
