"""Per-run model settings and usage limits, as in `Agent.run(model_settings=..., usage_limits=...)`."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from durable_codemode import CodeModeAgent, InvalidRunInputError, RunResult, SnippetLimits, start_run
from durable_codemode.testing import RunCode, new_task_queue, replay, running_worker

from ._agents import items_agent

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)

GATHER_3 = "import asyncio\nawait asyncio.gather(*(get(i=i) for i in range(3)))"


async def _run(client: Client, agent: CodeModeAgent, **options: Any) -> WorkflowHandle[Any, RunResult]:
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, repl_key="usage-test-key"):
        handle = await start_run(client, agent.name, "go", task_queue=tq, **options)
        with contextlib.suppress(WorkflowFailureError):  # the limit cases fail: `_failure` reads how
            await handle.result()
    await replay(handle)
    return handle


async def _failure(handle: WorkflowHandle[Any, RunResult]) -> str:
    history = await handle.fetch_history()
    failed = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED]
    assert failed, "the run did not fail"
    failure = failed[0].workflow_execution_failed_event_attributes.failure
    assert failure.application_failure_info.type == "UsageLimitExceeded"
    assert failure.application_failure_info.non_retryable
    return failure.message


@pytest.mark.parametrize(("limits", "expected", "calls_made"), [
    (UsageLimits(request_limit=1), "would exceed the request_limit of 1", 3),
    (UsageLimits(tool_calls_limit=2), "tool_calls_limit of 2", 0),
    (UsageLimits(total_tokens_limit=1), "total_tokens_limit of 1", 0),
])
async def test_a_run_past_a_usage_limit_fails_with_pydantic_ais_message(
        client: Client, limits: UsageLimits, expected: str, calls_made: int) -> None:
    name = f"usage{os.urandom(3).hex()}"
    handle = await _run(client, items_agent(name, RunCode(GATHER_3), "done"), usage_limits=limits)
    assert expected in await _failure(handle)
    history = await handle.fetch_history()
    tools = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name.endswith(".get")]
    assert len(tools) == calls_made  # a tool call past the limit never starts


async def test_usage_counts_tool_calls_across_continue_as_new(client: Client) -> None:
    name = f"usage{os.urandom(3).hex()}"
    agent = items_agent(name, RunCode(GATHER_3), RunCode("await get(i=9)"), "done",
                        limits=SnippetLimits(max_snippets_per_run=1))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, name, "go", task_queue=tq, usage_limits=UsageLimits(tool_calls_limit=4))
        result = await handle.result()
        # The limits go with the chain: 3 calls in the first run, and the 4th (in the next run) is one too many.
        over = await start_run(client, name, "go", task_queue=tq, usage_limits=UsageLimits(tool_calls_limit=3))
        with pytest.raises(WorkflowFailureError):
            await over.result()
    assert result.continued_as_new >= 1
    assert (result.usage.requests, result.usage.tool_calls) == (3, 4)
    assert "tool_calls_limit of 3" in await _failure(over)
    await replay(handle)
    await replay(over)


async def test_limits_a_durable_run_cannot_check_are_refused_by_name(client: Client) -> None:
    from decimal import Decimal

    with pytest.raises(InvalidRunInputError, match=r"UsageLimits\(cost_limit=...\) is not checked"):
        await start_run(client, "anyone", "go", task_queue=new_task_queue(),
                        usage_limits=UsageLimits(cost_limit=Decimal("0.10")))
    with pytest.raises(InvalidRunInputError, match="count_tokens_before_request"):
        await start_run(client, "anyone", "go", task_queue=new_task_queue(),
                        usage_limits=UsageLimits(count_tokens_before_request=True))


async def test_a_runs_model_settings_go_over_the_agents(client: Client) -> None:
    seen: list[dict[str, Any]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(dict(info.model_settings or {}))
        return ModelResponse(parts=[TextPart("ok")])

    agent = CodeModeAgent(Agent(FunctionModel(model), name="settings", model_settings={"temperature": 0.5}))
    await _run(client, agent)
    await _run(client, agent, model_settings={"max_tokens": 7})
    await _run(client, agent, model_settings={"temperature": 0.1})
    assert seen == [{"temperature": 0.5}, {"temperature": 0.5, "max_tokens": 7}, {"temperature": 0.1}]
