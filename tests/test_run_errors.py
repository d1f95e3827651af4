"""`run_agent` raises what `agent.run()` raises: pydantic-ai's own exception, the same message, the run's id.

Each case runs one agent twice, under `agent.run()` and durably, and compares the exceptions: a usage limit, a
model's final HTTP error, output retries run out. Code written for `agent.run()` (`except UsageLimitExceeded`)
keeps catching them; each is also a `RunFailedError` naming the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import ModelHTTPError, UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.messages import ModelMessage
from pydantic_ai.usage import UsageLimits
from temporalio.client import Client, WorkflowFailureError

from durable_codemode import CodeModeAgent, RunFailedError, SnippetLimits, run_agent, run_result, start_run
from durable_codemode.testing import FinalOutput, RunCode, new_task_queue, replay, running_worker, scripted_model


def _limited(name: str) -> tuple[Agent[None, str], dict[str, Any]]:
    agent = Agent(scripted_model(RunCode("1 + 1"), "done"), name=name, instructions="Use run_code.")
    return agent, {"usage_limits": UsageLimits(request_limit=1)}


def _refused(name: str) -> tuple[Agent[None, str], dict[str, Any]]:
    def refuse(messages: list[ModelMessage]) -> Any:
        raise ModelHTTPError(401, "scripted", {"error": {"message": "Incorrect API key provided"}})

    return Agent(scripted_model(refuse), name=name), {}


def _never_valid(name: str) -> tuple[Agent[None, int], dict[str, Any]]:
    agent = Agent(scripted_model(*[FinalOutput(5)] * 4), name=name, output_type=int, retries=1)

    @agent.output_validator
    def odd_numbers_only(value: int) -> int:
        raise ModelRetry(f"{value} will not do")

    return agent, {}


Case = Callable[[str], tuple[Agent[Any, Any], dict[str, Any]]]


@pytest.mark.parametrize(("make", "kind"), [
    (_limited, UsageLimitExceeded), (_refused, ModelHTTPError), (_never_valid, UnexpectedModelBehavior),
], ids=["usage limit", "model HTTP error", "output retries"])
async def test_run_agent_raises_what_agent_run_raises_with_the_run_id(client: Client, make: Case,
                                                                      kind: type[Exception]) -> None:
    name = f"errors{os.urandom(3).hex()}"
    agent, options = make(name)
    with pytest.raises(kind) as plain:
        await agent.run("go", **options)
    durable = CodeModeAgent(agent)
    tq = new_task_queue()
    run_id = f"{name}-run"
    async with running_worker(client, [durable], task_queue=tq):
        with pytest.raises(kind) as raised:
            await run_agent(client, durable, "go", task_queue=tq, run_id=run_id, **options)
        # The handle's result, read again, raises the same (`run_result`).
        with pytest.raises(kind):
            await run_result(client.get_workflow_handle(run_id))
    error = raised.value
    assert type(error).__name__ == type(plain.value).__name__ == kind.__name__
    assert str(error) == str(plain.value)
    assert isinstance(error, RunFailedError) and error.run_id == run_id and error.error_type == kind.__name__
    if isinstance(error, ModelHTTPError):
        assert isinstance(plain.value, ModelHTTPError)
        assert (error.status_code, error.model_name) == (plain.value.status_code, plain.value.model_name) == (
            401, "scripted")
    await replay(client.get_workflow_handle(run_id))


async def test_a_failure_pydantic_ai_has_no_type_for_stays_temporals(client: Client) -> None:
    agent = Agent(scripted_model(*[RunCode("1")] * 3), name=f"errors{os.urandom(3).hex()}")
    durable = CodeModeAgent(agent, limits=SnippetLimits(max_model_requests=2))
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):
        handle = await start_run(client, durable, "go", task_queue=tq)
        with pytest.raises(WorkflowFailureError) as failed:
            await run_result(handle)
    assert "max_model_requests" in str(failed.value.cause)
    await replay(handle)
