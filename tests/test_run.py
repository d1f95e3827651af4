"""The durable code-mode run end to end: snippets in workflow code, nested calls as activities."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic_ai import Agent
from temporalio.client import Client

from durable_codemode import CodeModeAgent, start_run
from durable_codemode.testing import (
    RunCode,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


@dataclass
class Calls:
    log: list[tuple[str, int]] = field(default_factory=list)


def make_agent(name: str, *steps: object, calls: Calls | None = None) -> CodeModeAgent:
    log = calls if calls is not None else Calls()
    agent = Agent(scripted_model(*steps), name=name, instructions="Use run_code.")  # type: ignore[arg-type]

    @agent.tool_plain
    def get(i: int) -> int:
        """Get the value of item i."""
        log.log.append(("get", i))
        if i < 0:
            raise KeyError(f"no item {i}")
        return i * 10

    return CodeModeAgent(agent)


async def test_sequential_calls_and_result(client: Client) -> None:
    calls = Calls()
    code = "total = 0\nfor i in range(5):\n    total += await get(i=i)\nprint('done')\ntotal"
    agent = make_agent("seq", RunCode(code), lambda m: f"total={last_result(m)['result']}", calls=calls)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "seq", "sum them", task_queue=tq)
        result = await handle.result()
    assert result.output == "total=100"
    assert [c.tool for c in result.nested_calls] == ["get"] * 5
    assert [c.call_id for c in result.nested_calls] == [f"call_0.{n}" for n in range(5)]
    assert calls.log == [("get", i) for i in range(5)]
    await replay(handle)


async def test_gather(client: Client) -> None:
    code = "import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range(50)))\nsum(r)"
    agent = make_agent("gather", RunCode(code), lambda m: str(last_result(m)["result"]))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "gather", "go", task_queue=tq)
        result = await handle.result()
    assert result.output == str(sum(i * 10 for i in range(50)))
    assert len(result.nested_calls) == 50
    await replay(handle)
