"""A run paused across a deploy that changes its agent: it goes on with what it recorded, or stops naming the change.

Each test starts a run on a worker of the old code, lets it pause for a person, stops that worker and starts one
of the new code (the same agent name, changed), decides the call, and watches what the run does on the new worker.
The new worker holds no cached run, so it rebuilds the run from its history first, as after any deploy.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio.client import Client, WorkflowFailureError

from durable_codemode import (
    CodeModeAgent,
    SnippetLimits,
    ToolOptions,
    decide,
    start_run,
    wait_for_approvals,
)
from durable_codemode._names import MODEL_REQUEST_ACTIVITY
from durable_codemode.testing import RunCode, new_task_queue, replay, running_worker


class City(BaseModel):
    city: str


class Town(BaseModel):
    town: str


class CityAndCountry(BaseModel):
    city: str
    country: str | None = None


Seen = list[AgentInfo]


def model(seen: Seen) -> FunctionModel:
    """Turn 0: a program whose refund waits for a person. Turn 1: the answer, in the shape the request offers.

    As a real model would: with an output tool offered it calls the first one (`{"city": "Paris"}`), else it answers
    in text. Every request's `AgentInfo` is kept in `seen`, to check what the run offered.
    """
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        if sum(isinstance(m, ModelResponse) for m in messages) == 0:
            return ModelResponse(parts=[ToolCallPart("run_code", {"code": "await refund(order='A', cents=5)"},
                                                     tool_call_id="call_0")])
        if info.output_tools:
            return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"city": "Paris"},
                                                     tool_call_id=f"out_{len(messages)}")])
        return ModelResponse(parts=[TextPart("Paris")])

    return FunctionModel(respond)


def agent(name: str, seen: Seen, output_type: Any = str) -> CodeModeAgent:
    inner: Agent[None, Any] = Agent(model(seen), name=name, output_type=output_type)

    @inner.tool_plain
    def refund(order: str, cents: int) -> str:
        """Refund `cents` on `order`."""
        return f"refunded {cents} on {order}"

    return CodeModeAgent(inner, tool_options={"refund": ToolOptions(requires_approval=True)},
                         limits=SnippetLimits(max_model_requests=8))


async def across_a_deploy(client: Client, old: CodeModeAgent, new: CodeModeAgent) -> Any:
    """Start a run on `old`'s worker; once it waits for a person, serve `new` instead and approve the call.

    The run's handle, for its result.
    """
    tq = new_task_queue("deploy")
    async with running_worker(client, [old], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, old.name, "Where?", task_queue=tq)
        (pending,) = await wait_for_approvals(client, handle.id)
    async with running_worker(client, [new], task_queue=tq, unsigned_approvals=True):
        await decide(client, handle.id, pending.call_id, approved=True, approver="ana")
        try:
            await handle.result()
        except WorkflowFailureError:
            pass
    return handle


async def model_requests(handle: Any) -> int:
    history = await handle.fetch_history()
    return sum(1 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
               and e.activity_task_scheduled_event_attributes.activity_type.name == MODEL_REQUEST_ACTIVITY)


def output_tools(info: AgentInfo) -> list[tuple[str, list[str]]]:
    return [(t.name, sorted(t.parameters_json_schema.get("properties", {}))) for t in info.output_tools]


async def test_a_run_that_recorded_text_output_is_offered_no_output_tool_of_the_new_agent(client: Client) -> None:
    # The leak: an agent whose output changed from `str` to a model. The old run must be offered text only (it
    # recorded no output tool), and it ends with its text answer; the new agent's `final_result` used to be offered,
    # the model called it, the run answered "Unknown tool 'final_result'" every turn and failed at its request limit.
    name = f"leak-{os.urandom(3).hex()}"
    old_seen: Seen = []
    new_seen: Seen = []
    handle = await across_a_deploy(client, agent(name, old_seen), agent(name, new_seen, output_type=City))
    result = await handle.result()
    assert result.output == "Paris"
    assert [output_tools(i) for i in new_seen] == [[]] and new_seen[-1].allow_text_output
    assert await model_requests(handle) == 2
    await replay(handle)


async def test_a_changed_output_that_rejects_the_answer_fails_the_run_naming_the_change(client: Client) -> None:
    # A renamed field: the run offers the model the output it recorded (`city`), and the new agent's (`town`) rejects
    # the answer. Asking the model again cannot help, so the run fails at once, saying what changed.
    name = f"renamed-{os.urandom(3).hex()}"
    old_seen: Seen = []
    new_seen: Seen = []
    handle = await across_a_deploy(client, agent(name, old_seen, output_type=City),
                                   agent(name, new_seen, output_type=Town))
    assert [output_tools(i) for i in new_seen] == [[("final_result", ["city"])]]  # the recorded schema, not `town`
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    message = getattr(cause, "message", str(cause))
    assert getattr(cause, "type", None) == "OutputChangedError", cause
    assert f"the output of agent {name!r} changed since this run started" in message
    assert "output tool final_result {city: string}" in message and "output tool final_result {town: string}" in message
    assert "town: Field required" in message, message
    assert await model_requests(handle) == 2  # once: not retried until the output retries or request limit ran out
    await replay(handle)


async def test_a_compatible_output_change_accepts_the_answer(client: Client) -> None:
    # An optional field added: the new output still takes the answer made for the recorded one.
    name = f"compatible-{os.urandom(3).hex()}"
    seen: Seen = []
    handle = await across_a_deploy(client, agent(name, [], output_type=City),
                                   agent(name, seen, output_type=CityAndCountry))
    result = await handle.result()
    assert result.output == {"city": "Paris", "country": None}
    assert [output_tools(i) for i in seen] == [[("final_result", ["city"])]]
    await replay(handle)

