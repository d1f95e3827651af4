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

from durable_codemode import (
    CodeModeAgent,
    RunFailedError,
    RunWorkflowFailedError,
    SnippetLimits,
    run_agent,
    run_result,
    start_run,
)
from durable_codemode.testing import FinalOutput, RunCode, new_task_queue, replay, running_worker, scripted_model

from .test_debugging import address, codemode

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


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
    # Still temporalio's type with its cause, but its own message says why (not "Workflow execution failed").
    assert isinstance(failed.value, RunWorkflowFailedError) and isinstance(failed.value, RunFailedError)
    assert str(failed.value).startswith(f"run {handle.id!r} failed: ") and "max_model_requests" in str(failed.value)
    assert failed.value.run_id == handle.id
    await replay(handle)


async def test_a_workers_configuration_error_reaches_whoever_started_the_run(client: Client) -> None:
    """A worker without approver keys refuses a run with gated calls: its starter reads why, and what to do.

    Both `run_agent`'s caller and `codemode run`'s, rather than temporalio's "Workflow execution failed".
    """
    agent = Agent(scripted_model(RunCode("await refund(order='A')"), "done"), name=f"nokeys{os.urandom(3).hex()}")

    @agent.tool_plain(requires_approval=True)
    def refund(order: str) -> str:
        return order

    durable = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):  # no approver keys, no unsigned_approvals
        with pytest.raises(RunWorkflowFailedError) as failed:
            await run_agent(client, durable, "go", task_queue=tq)
        rc, _, err = await codemode("run", agent.name or "", "go", "--task-queue", tq, address=address(client))
    message = str(failed.value)
    assert "holds no approver keys" in message and "unsigned_approvals=True" in message, message
    assert failed.value.error_type == "CodeModeUserError"
    assert "Workflow execution failed" not in message
    assert rc == 1 and "holds no approver keys" in err and "unsigned_approvals=True" in err, err
    await replay(client.get_workflow_handle(failed.value.run_id or ""))


async def test_a_scripted_models_own_exception_is_not_retried_and_names_the_function(client: Client) -> None:
    """A `FunctionModel` function with a bug (`KeyError`) fails the run at its first attempt, naming it.

    The message names the model, where it raised and the exception; a scripted `ModelHTTPError` 503 (an outage
    played on purpose) is still retried.
    """

    def answer(messages: list[ModelMessage]) -> Any:
        return {}["result"]  # the bug: a key the scripted answer never had

    outages: list[int] = []

    def flaky(messages: list[ModelMessage]) -> Any:
        outages.append(1)
        if len(outages) == 1:
            raise ModelHTTPError(503, "scripted", {"error": "overloaded"})
        return "recovered"

    buggy = CodeModeAgent(Agent(scripted_model(RunCode("1"), answer), name=f"buggy{os.urandom(3).hex()}"))
    outage = CodeModeAgent(Agent(scripted_model(flaky), name=f"outage{os.urandom(3).hex()}"))
    tq = new_task_queue()
    async with running_worker(client, [buggy, outage], task_queue=tq):
        with pytest.raises(RunWorkflowFailedError) as failed:
            await run_agent(client, buggy, "go", task_queue=tq)
        assert (await run_agent(client, outage, "go", task_queue=tq)).output == "recovered"
    message = str(failed.value)
    assert "the model function of FunctionModel 'scripted'" in message and "raised KeyError: 'result'" in message
    assert "in answer() at " in message and "test_run_errors.py" in message, message
    handle = client.get_workflow_handle(failed.value.run_id or "")
    attempts = [e.activity_task_started_event_attributes.attempt async for e in handle.fetch_history_events()
                if e.HasField("activity_task_started_event_attributes")]
    assert attempts[-1] == 1, f"the buggy model request was retried: attempts {attempts}"
    assert len(outages) == 2
    await replay(handle)
