"""A tool that runs another agent, as pydantic-ai's flight_booking does: `await other.run(..., usage=ctx.usage)`.

The sub-agent runs inside the tool's activity. What it used (requests, tokens, tool calls) comes back with the
call's result and counts in the durable run's usage and against its `UsageLimits`, as under `agent.run()`; its
model errors are retried like the run's own model requests, within the tool's retry policy. Each durable run is
compared with `agent.run()` on the same scripted `FunctionModel`s.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import Hooks
from pydantic_ai.exceptions import ModelHTTPError, UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RunUsage, UsageLimits
from pydantic_core import to_jsonable_python
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import RetryPolicy

from durable_codemode import CodeModeAgent, RunResult, ToolOptions, current_call, start_run
from durable_codemode.debugging import trace_run
from durable_codemode.shared._tool_usage import USAGE_KEY
from durable_codemode.testing import (
    CallTool,
    FinalOutput,
    RunCode,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


class Flight(BaseModel):
    number: str
    price: int


@dataclass
class Deps:
    web_page_text: str


PAGE = "AK123 $350; AK456 $370; NY101 $250"


def extraction_agent() -> Agent[None, list[Flight]]:
    """The sub-agent: one request that reads the page (and, with `lookups`, a tool call per flight first)."""

    def extract(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        flights = [{"number": w.split()[0], "price": int(w.split()[1][1:])} for w in PAGE.split("; ")]
        name = info.output_tools[0].name
        return ModelResponse(parts=[ToolCallPart(name, {"response": flights})], model_name="extractor")

    return Agent(FunctionModel(extract, model_name="extractor"), output_type=list[Flight])


def search_agent(name: str, *steps: Any, extractor: Agent[Any, Any] | None = None,
                 hooked: bool = False) -> Agent[Deps, Flight]:
    sub = extractor or extraction_agent()
    agent = Agent(scripted_model(*steps), name=name, deps_type=Deps, output_type=Flight,
                  capabilities=[Hooks()] if hooked else [])

    @agent.tool
    async def extract_flights(ctx: RunContext[Deps]) -> list[Flight]:
        """Every flight on the page."""
        result = await sub.run(ctx.deps.web_page_text, usage=ctx.usage)  # pydantic-ai's delegation convention
        return result.output

    @agent.tool_plain
    def cheapest(prices: list[int]) -> int:
        """The lowest price (no model involved)."""
        return min(prices)

    return agent


def _offer(messages: list[ModelMessage]) -> FinalOutput:
    flights = to_jsonable_python(last_result(messages))  # agent.run() keeps the tool's objects in its messages
    flights = flights["result"] if isinstance(flights, dict) else flights
    best = min(flights, key=lambda f: f["price"])
    return FinalOutput(best)


async def _durable(client: Client, agent: CodeModeAgent, **options: Any) -> tuple[RunResult[Any] | None,
                                                                                   WorkflowHandle[Any, Any]]:
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "Find the cheapest flight", task_queue=tq, deps=Deps(PAGE),
                                 **options)
        try:
            result: RunResult[Any] | None = await handle.result()
        except WorkflowFailureError:
            result = None
    await replay(handle)
    return result, handle


def _tool_results(history: Any, tool: str) -> list[Any]:
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
    return [json.loads(e.activity_task_completed_event_attributes.result.payloads[0].data) for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and scheduled[e.activity_task_completed_event_attributes.scheduled_event_id].endswith(f".{tool}")]


async def test_a_sub_agents_usage_counts_in_the_run_as_under_agent_run(client: Client) -> None:
    name = f"deleg{os.urandom(3).hex()}"
    steps = (CallTool("extract_flights"), _offer)
    plain = await search_agent(name, *steps).run("Find the cheapest flight", deps=Deps(PAGE))
    assert plain.usage.requests == 3  # two of the search agent's, one of the extraction agent's

    result, handle = await _durable(client, CodeModeAgent(search_agent(name, *steps), code_mode=False))
    assert result is not None and result.output == {"number": "NY101", "price": 250}
    assert result.usage == plain.usage, f"durable {result.usage} vs agent.run() {plain.usage}"
    # The call's recorded result carries what the sub-agent used; the model still got the flights alone.
    (recorded,) = _tool_results(await handle.fetch_history(), "extract_flights")
    assert recorded[USAGE_KEY]["requests"] == 1 and len(recorded["value"]) == 3

    # In code mode, the same counts: the program's call to the tool brings the sub-agent's request with it.
    durable, handle = await _durable(client, CodeModeAgent(search_agent(
        name, RunCode("await extract_flights()"), _offer)))
    assert durable is not None and (durable.usage.requests, durable.usage.tool_calls) == (3, 1)
    (call,) = (await trace_run(client, handle.id)).nested_calls  # the trace shows the tool's value
    assert call.result is not None and USAGE_KEY not in call.result and "NY101" in call.result


async def test_a_sub_agents_requests_count_against_the_runs_request_limit(client: Client) -> None:
    name = f"deleglim{os.urandom(3).hex()}"
    limits = UsageLimits(request_limit=2)
    steps = (CallTool("extract_flights"), _offer)
    with pytest.raises(UsageLimitExceeded, match="request_limit of 2"):
        await search_agent(name, *steps).run("Find the cheapest flight", deps=Deps(PAGE), usage_limits=limits)
    result, handle = await _durable(client, CodeModeAgent(search_agent(name, *steps), code_mode=False),
                                    usage_limits=limits)
    assert result is None
    history = await handle.fetch_history()
    failure = history.events[-1].workflow_execution_failed_event_attributes.failure
    assert "request_limit of 2" in failure.message and failure.application_failure_info.type == "UsageLimitExceeded"

    # A program that delegates in a loop stops at the first call past the limit, not at its next model request.
    loop = "[len(await extract_flights()) for _ in range(5)]"
    result, handle = await _durable(client, CodeModeAgent(search_agent(name, RunCode(loop), "done")),
                                    usage_limits=UsageLimits(request_limit=3))
    assert result is None
    history = await handle.fetch_history()
    assert "Exceeded the request_limit of 3 (requests=4)" in (
        history.events[-1].workflow_execution_failed_event_attributes.failure.message)
    assert len(_tool_results(history, "extract_flights")) == 3  # requests 1+1, +1, +1: the fourth call never starts


async def test_calls_that_use_no_model_record_their_bare_result_even_through_tool_hooks(client: Client) -> None:
    """pydantic-ai's `ToolManager` (tool hooks) counts the call itself in `ctx.usage`: the run counted it already."""
    name = f"deleghook{os.urandom(3).hex()}"
    code = "flights = await extract_flights()\nawait cheapest(prices=[f['price'] for f in flights])"

    def tool_calling_extractor() -> Agent[None, list[Flight]]:
        sub = Agent(scripted_model(CallTool("count"), FinalOutput([{"number": "X1", "price": 1}])),
                    output_type=list[Flight])

        @sub.tool_plain
        def count() -> int:
            """A tool of the sub-agent."""
            return 1

        return sub

    steps = (RunCode(code), lambda m: FinalOutput({"number": "X1", "price": last_result(m)["result"]}))
    result, handle = await _durable(client, CodeModeAgent(search_agent(name, *steps, extractor=tool_calling_extractor(),
                                                                       hooked=True)))
    assert result is not None and result.output == {"number": "X1", "price": 1}
    # The run's 2 requests and 2 calls, plus the sub-agent's 2 requests and its 1 tool call.
    assert (result.usage.requests, result.usage.tool_calls) == (4, 3)
    history = await handle.fetch_history()
    assert _tool_results(history, "cheapest") == [1]  # bare: nothing added
    (extracted,) = _tool_results(history, "extract_flights")
    assert extracted[USAGE_KEY]["tool_calls"] == 1 and extracted[USAGE_KEY]["requests"] == 2


async def test_a_sub_agents_model_errors_are_retried_like_the_runs_own(client: Client) -> None:
    name = f"delegerr{os.urandom(3).hex()}"
    statuses: list[int] = []

    def flaky(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        attempt = current_call().attempt
        if attempt == 1:
            statuses.append(503)
            raise ModelHTTPError(503, "extractor", "overloaded")
        # The prompt itself, not the message's repr: its timestamp and ids hold "401" by chance now and then.
        (request,) = [m for m in messages if isinstance(m, ModelRequest)]
        if any(isinstance(p, UserPromptPart) and p.content == "401" for p in request.parts):
            raise ModelHTTPError(401, "extractor", "bad key")
        statuses.append(200)
        return ModelResponse(parts=[TextPart("[]")], model_name="extractor")

    sub = Agent(FunctionModel(flaky, model_name="extractor"), output_type=str)

    agent = Agent(scripted_model(RunCode("await ask(text='page')"), RunCode("await ask(text='401')"),
                                 lambda m: f"error: {last_result(m).get('error')}"), name=name)

    @agent.tool
    async def ask(ctx: RunContext[None], text: str) -> str:
        """Ask the sub-agent."""
        return (await sub.run(text, usage=ctx.usage)).output

    durable = CodeModeAgent(agent, default_tool_options=ToolOptions(
        retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=50), maximum_attempts=3)))
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):
        handle = await start_run(client, name, "go", task_queue=tq)
        result = await handle.result()
    await replay(handle)
    assert statuses == [503, 200, 503]  # the 503 was retried and passed; the 401 was final at its second try
    assert "ModelHTTPError" in result.output and "bad key" in result.output
    assert result.usage.requests == 3 + 1  # the run's 3, and the one sub-agent request that answered
    assert result.nested_calls[0].status == "ok" and result.nested_calls[1].status == "error"


async def test_a_batched_delegating_tool_counts_each_calls_usage(client: Client) -> None:
    name = f"delegbatch{os.urandom(3).hex()}"
    code = "import asyncio\nlen(await asyncio.gather(*(extract_flights() for _ in range(4))))"
    agent = search_agent(name, RunCode(code), FinalOutput({"number": "X", "price": 4}))
    result, _ = await _durable(client, CodeModeAgent(agent, tool_options={
        "extract_flights": ToolOptions(batch=True, timeout=timedelta(seconds=10))}))
    assert result is not None
    assert (result.usage.requests, result.usage.tool_calls) == (2 + 4, 4)


def test_the_usage_envelope_round_trips_and_leaves_other_results_alone() -> None:
    from durable_codemode.shared._tool_usage import split_usage, with_usage

    assert with_usage({"a": 1}, RunUsage()) == {"a": 1}
    wrapped = with_usage([1], RunUsage(requests=2, input_tokens=5))
    assert wrapped == {USAGE_KEY: {"requests": 2, "input_tokens": 5}, "value": [1]}
    assert split_usage(wrapped) == ([1], RunUsage(requests=2, input_tokens=5))
    assert split_usage({"value": 1, "other": 2}) == ({"value": 1, "other": 2}, None)
