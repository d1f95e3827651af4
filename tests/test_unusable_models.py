"""A model that cannot work fails fast, with one error saying what to set, never an activity retried with back-off.

An unknown model is refused by `start_run` (nothing starts); a missing API key stops the worker from starting (the
agent's own model) or fails the run at its first step (the run's model), before any model request; and a key gone
by the time of a model request fails that request once, not five times.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
import uuid
from typing import Any

import pydantic_ai.capabilities as _capabilities
import pytest

if not hasattr(_capabilities, "ModelFallback"):
    pytest.skip("these tests use pydantic-ai's ModelFallback, which need pydantic-ai 2.68 or newer "
                "(this release has no ModelFallback capability; the runtime checks for it by feature)",
                allow_module_level=True)
from pydantic_ai import Agent
from pydantic_ai.usage import RunUsage
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from durable_codemode import CodeModeAgent, CodeModeUserError, InvalidRunInputError, RunResult, create_worker, start_run
from durable_codemode._visibility import start_options
from durable_codemode.shared._types import Continuation, RunInput
from durable_codemode.testing import new_task_queue, replay, running_worker, scripted_model
from durable_codemode.worker._describe import describe_run
from durable_codemode.workflow._run import CodeModeRunWorkflow

from .test_bad_input import never_started

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)

NO_GROQ = importlib.util.find_spec("groq") is None


def answering_agent(name: str) -> CodeModeAgent:
    return CodeModeAgent(Agent(scripted_model("hello"), name=name))


async def failure_of(handle: WorkflowHandle[Any, RunResult]) -> tuple[str, float, History]:
    """How the run failed (its failure's message), how long it took, and its history; the failure is checked final."""
    started = time.monotonic()
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 60)
    took = time.monotonic() - started
    history = await handle.fetch_history()
    failed = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED]
    assert failed, "the run did not fail"
    failure = failed[0].workflow_execution_failed_event_attributes.failure  # the first step's, as it raised it
    assert failure.application_failure_info.type == "CodeModeUserError"
    assert failure.application_failure_info.non_retryable
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in [e.event_type for e in history.events]
    return failure.message, took, history


@pytest.mark.parametrize("model", ["nosuchprovider:x", "gpt-4o", ""])
async def test_an_unknown_model_is_refused_before_anything_starts(client: Client, model: str) -> None:
    run_id = f"unknown-model-{uuid.uuid4().hex[:6]}"
    with pytest.raises(InvalidRunInputError, match=f"the run's model {model!r}: pydantic-ai does not know it "
                       r"\(Unknown model: .*\): give a 'provider:model' string such as 'openai:gpt-5'"):
        await start_run(client, "anyone", "hi", task_queue=new_task_queue(), model=model, run_id=run_id)
    assert await never_started(client, run_id)


async def test_a_model_object_per_run_is_refused(client: Client) -> None:
    with pytest.raises(InvalidRunInputError, match=r"model must be a pydantic-ai model string .* got FunctionModel"):
        await start_run(client, "anyone", "hi", task_queue=new_task_queue(),
                        model=scripted_model("hi"))  # type: ignore[arg-type]


async def test_start_run_needs_no_key_and_no_provider_package(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    # The key (and the provider's package) are the workers' business: the client only checks the provider's name.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for model in ["openai:gpt-4o", "anthropic:claude-sonnet-4-5", "groq:llama-3.3-70b-versatile"]:
        handle = await start_run(client, "nobody-serves-this", "hi", task_queue=new_task_queue(), model=model)
        await handle.terminate("test cleanup")


@pytest.mark.parametrize(("model", "unset", "says"), [
    ("openai:gpt-4o", "OPENAI_API_KEY",
     "OPENAI_API_KEY is not set in this worker's environment. Set OPENAI_API_KEY where the worker runs"),
    ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY is not set in this worker's environment"),
    pytest.param("groq:llama-3.3-70b-versatile", None,
                 "its provider's package is not installed on this worker (Please install the `groq` package",
                 marks=pytest.mark.skipif(not NO_GROQ, reason="groq is installed here")),
])
async def test_a_run_model_the_worker_cannot_use_fails_the_run_at_its_first_step(
        client: Client, monkeypatch: pytest.MonkeyPatch, model: str, unset: str | None, says: str) -> None:
    if unset:
        monkeypatch.delenv(unset, raising=False)
    name = f"nokey{os.urandom(3).hex()}"
    tq = new_task_queue()
    async with running_worker(client, [answering_agent(name)], task_queue=tq):
        handle = await start_run(client, name, "hi", task_queue=tq, model=model)
        message, took, history = await failure_of(handle)
    assert message.startswith(f"agent {name!r} cannot use the run's model {model!r}: {says}")
    assert message.endswith("or start the run with another model (start_run(model=...), codemode run --model)")
    assert took < 10  # not retried: a model request's back-off alone would take 15 s
    # The first step (describing the agent, a local activity) failed: no model request was ever scheduled.
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in [e.event_type for e in history.events]
    await replay(handle)


async def test_an_agent_whose_model_cannot_work_stops_its_worker_from_starting(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # pydantic-ai builds a model string when the agent is built, unless told not to: then the worker checks it.
    deferred = CodeModeAgent(Agent("openai:gpt-4o", name="deferred", defer_model_check=True))
    with pytest.raises(CodeModeUserError, match=r"^agent 'deferred' cannot use its model 'openai:gpt-4o': "
                       "OPENAI_API_KEY is not set in this worker's environment"):
        create_worker(client, [answering_agent("fine"), deferred], task_queue=new_task_queue())
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-a-real-key")  # a key is all the check needs: nothing is sent
    create_worker(client, [deferred], task_queue=new_task_queue())


async def test_a_key_gone_by_the_model_request_fails_that_request_once(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run that continued as new on a worker without the key: its next run starts from the recorded spec (no
    # first step to check the model), so the check is the model request's own, final on its first attempt.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    name = f"gonekey{os.urandom(3).hex()}"
    agent = answering_agent(name)
    continued = Continuation(spec=await describe_run(agent), usage=RunUsage(), turns=[], runs=1)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await client.start_workflow(
            CodeModeRunWorkflow.run, RunInput(agent=name, prompt="hi", model="openai:gpt-4o", continuation=continued),
            id=f"{name}-{uuid.uuid4().hex[:6]}", task_queue=tq, **start_options(client, name))
        started = time.monotonic()
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 60)
        took = time.monotonic() - started
    cause = failure.value.cause.cause  # ActivityError, then the activity's ApplicationError
    assert cause is not None and "OPENAI_API_KEY is not set in this worker's environment" in str(cause)
    assert took < 10
    history = await handle.fetch_history()
    started_events = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert [e.activity_task_started_event_attributes.attempt for e in started_events] == [1]
    failed = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert failed[0].activity_task_failed_event_attributes.failure.application_failure_info.non_retryable
    await replay(handle)


async def test_a_fallback_model_that_cannot_work_stops_its_worker_from_starting(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_ai.capabilities import ModelFallback

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    # It would be needed only once the agent's own model fails: found then, the run would fail at the worst time.
    agent = CodeModeAgent(Agent(scripted_model("ok"), name="falls-back",
                                capabilities=[ModelFallback("anthropic:claude-sonnet-4-5")]))
    with pytest.raises(CodeModeUserError, match=r"^agent 'falls-back' cannot use a fallback model "
                       "'anthropic:claude-sonnet-4-5': ANTHROPIC_API_KEY is not set in this worker's environment"):
        create_worker(client, [agent], task_queue=new_task_queue())
