"""Conversations across runs, as pydantic-ai's multi-run examples write them.

`RunResult.all_messages()` / `new_messages()` are `AgentRunResult`'s (the last request answers the output tool's
call, and `output_tool_return_content=` rewrites that answer), and `start_run(usage=...)` / `run_agent(usage=...)`
continue counting a previous run's usage, against the next run's `UsageLimits` too. Each durable conversation is
compared with the same conversation under `agent.run()`, driven by the same scripted `FunctionModel`.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ToolReturnPart
from pydantic_ai.usage import RunUsage, UsageLimits
from temporalio.client import Client, WorkflowFailureError

from durable_codemode import CodeModeAgent, InvalidRunInputError, run_agent, start_run
from durable_codemode.testing import (
    CallTool,
    FinalOutput,
    RunCode,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


class Flight(BaseModel):
    number: str
    price: int


FLIGHTS = [Flight(number="AK123", price=350), Flight(number="AK456", price=370)]


def _answered(messages: list[ModelMessage]) -> int:
    """How many flights the conversation already turned down (each was answered 'Please suggest another flight')."""
    return sum(1 for m in messages if isinstance(m, ModelRequest) for p in m.parts
               if isinstance(p, ToolReturnPart) and p.content == "Please suggest another flight")


def search_agent(name: str, *, code_mode: bool) -> Agent[None, Flight]:
    """Each run looks the flights up once and offers the next one the conversation has not turned down."""

    def lookup(messages: list[ModelMessage]) -> Any:
        return RunCode("await list_flights()") if code_mode else CallTool("list_flights")

    def offer(messages: list[ModelMessage]) -> Any:
        return FinalOutput(FLIGHTS[_answered(messages)].model_dump())

    def respond(messages: list[ModelMessage]) -> Any:
        new = len(messages) - _start(messages)
        return [lookup, offer][min(new // 2, 1)](messages)

    agent = Agent(scripted_model(*([respond] * 20)), name=name, output_type=Flight)

    @agent.tool_plain
    def list_flights() -> list[dict[str, Any]]:
        """Every flight on offer."""
        return [f.model_dump() for f in FLIGHTS]

    return agent


def _start(messages: list[ModelMessage]) -> int:
    """Where the current run's messages start: after the last request answering the output tool."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, ModelRequest) and any(isinstance(p, ToolReturnPart) and p.tool_name == "final_result"
                                                for p in m.parts):
            return i + 1
    return 0


def _shape(messages: list[ModelMessage]) -> list[tuple[Any, ...]]:
    """The messages without timestamps and ids: each message's kind and its parts' kinds, tools and contents."""
    return [(m.kind, *((p.part_kind, getattr(p, "tool_name", None), str(getattr(p, "content", getattr(p, "args", ""))))
                      for p in m.parts)) for m in messages]


async def _plain_conversation(agent: Agent[None, Flight], usage: RunUsage,
                              limits: UsageLimits | None = None) -> list[Any]:
    """pydantic-ai's own loop (flight_booking's `main`): two runs, the first flight turned down."""
    first = await agent.run("Find me a flight", usage=usage, usage_limits=limits)
    history = first.all_messages(output_tool_return_content="Please suggest another flight")
    second = await agent.run("Find me a flight", message_history=history, usage=usage, usage_limits=limits)
    return [first, second]


async def test_a_conversation_continues_as_under_agent_run(client: Client) -> None:
    name = f"conv{os.urandom(3).hex()}"
    durable = CodeModeAgent(search_agent(name, code_mode=False), code_mode=False)
    tq = new_task_queue()
    usage = RunUsage()
    async with running_worker(client, [durable], task_queue=tq):
        first = await run_agent(client, durable, "Find me a flight", task_queue=tq, usage=usage)
        assert first.output == FLIGHTS[0] and first.usage is usage
        assert first.output_tool_name == "final_result"
        assert _shape(first.all_messages())[-1] == ("request", ("tool-return", "final_result",
                                                                "Final result processed."))
        history = first.all_messages(output_tool_return_content="Please suggest another flight")
        assert _shape(history)[-1] == ("request", ("tool-return", "final_result", "Please suggest another flight"))
        assert first.all_messages()[-1] is not history[-1], "the result's own messages are left as they were"
        handle = await start_run(client, durable, "Find me a flight", task_queue=tq, message_history=history,
                                 usage=usage)
        second = await handle.result()
    assert second.output == FLIGHTS[1].model_dump()
    assert second.new_messages() == second.all_messages()[len(history):]
    assert ModelMessagesTypeAdapter.validate_json(second.new_messages_json()) == second.new_messages()
    await replay(handle)

    plain_usage = RunUsage()
    plain = await _plain_conversation(search_agent(name, code_mode=False), plain_usage)
    assert _shape(second.all_messages()) == _shape(plain[1].all_messages())
    assert _shape(second.new_messages()) == _shape(plain[1].new_messages())
    # The usage a run starts from counts in its result, as `agent.run(usage=...)` counts it.
    assert (second.usage.requests, second.usage.tool_calls) == (plain_usage.requests, plain_usage.tool_calls) == (4, 2)
    assert (usage.requests, usage.tool_calls) == (2, 1), "start_run records a copy: only run_agent counts into it"


async def test_a_continued_conversation_counts_against_the_next_runs_limits(client: Client) -> None:
    name = f"convlim{os.urandom(3).hex()}"
    durable = CodeModeAgent(search_agent(name, code_mode=True))
    limits = UsageLimits(request_limit=3)
    tq = new_task_queue()
    usage = RunUsage()
    async with running_worker(client, [durable], task_queue=tq):
        first = await run_agent(client, durable, "Find me a flight", task_queue=tq, usage=usage, usage_limits=limits)
        history = first.all_messages(output_tool_return_content="Please suggest another flight")
        handle = await start_run(client, durable, "Find me a flight", task_queue=tq, message_history=history,
                                 usage=usage, usage_limits=limits)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "request_limit of 3" in str(failed.value.cause)
    await replay(handle)
    with pytest.raises(Exception, match="request_limit of 3"):  # as pydantic-ai's own loop fails
        await _plain_conversation(search_agent(name, code_mode=False), RunUsage(), limits)


async def test_text_answers_have_no_output_tool_to_rewrite(client: Client) -> None:
    agent = Agent(scripted_model("hi"), name=f"convtext{os.urandom(3).hex()}")
    durable = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):
        result = await run_agent(client, durable, "hello", task_queue=tq)
    assert [m.kind for m in result.all_messages()] == ["request", "response"]
    assert result.new_messages() == result.all_messages() and result.output_tool_name is None
    with pytest.raises(ValueError, match="not given by an output tool"):
        result.all_messages(output_tool_return_content="x")
    with pytest.raises(InvalidRunInputError, match=r"usage must be pydantic_ai\.usage\.RunUsage"):
        await start_run(client, durable, "hello", task_queue=tq, usage={"requests": 1})  # type: ignore[arg-type]
