"""Durable delegation: a tool that runs another `CodeModeAgent` as a child run (`child_run_tool`).

The child is a run of its own (its history replays on its own), started by the parent's call; its output answers
the call, its usage counts in the parent's, its calls waiting for a person are listed by the parent's
`pending_approvals`, and its failure is an exception the parent's program may catch. The same tool under plain
`agent.run()` delegates as pydantic-ai does, with the same requests counted.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_core import to_jsonable_python
from temporalio.client import Client, WorkflowUpdateFailedError

from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    ToolOptions,
    child_run_tool,
    decide,
    pending_approvals,
    start_run,
)
from durable_codemode._names import child_run_id
from durable_codemode.debugging import render_trace, trace_run
from durable_codemode.testing import (
    CallTool,
    FinalOutput,
    RunCode,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
    user_prompt,
)


class Flight(BaseModel):
    number: str
    price: int


def extraction(name: str, *, approval: bool = False) -> CodeModeAgent:
    """The sub-agent: reads flights out of its prompt (with `approval`, after a call that waits for a person)."""

    def read(messages: Any) -> Any:
        words = user_prompt(messages).split()
        if not all(":" in w for w in words):  # a model error no retry can help: the child run fails at once
            raise ModelHTTPError(400, "extractor", "the prompt holds no flights")
        return FinalOutput([{"number": w.split(":")[0], "price": int(w.split(":")[1])} for w in words])

    steps: list[Any] = [RunCode("await log_request(what='extract')"), read] if approval else [read]
    agent = Agent(scripted_model(*steps), name=name, output_type=list[Flight])

    @agent.tool_plain
    def log_request(what: str) -> str:
        """Record the request (needs a person's approval)."""
        return f"logged {what}"

    return CodeModeAgent(agent, tool_options={"log_request": ToolOptions(requires_approval=approval)})


def search(name: str, child: CodeModeAgent, code: str) -> Agent[None, str]:
    agent = Agent(scripted_model(RunCode(code), lambda m: f"cheapest: {last_result(m).get('result')}"), name=name,
                  tools=[child_run_tool(child, description="Extract every flight from a page of text.")])
    return agent


def plain_search(name: str, child: CodeModeAgent) -> Agent[None, str]:
    """The same parent for `agent.run()`, whose model calls the tool directly (there is no run_code there)."""

    def cheapest(messages: Any) -> str:
        flights = to_jsonable_python(last_result(messages))
        return f"cheapest: {min(flights, key=lambda f: f['price'])['number']}"

    call = CallTool(f"ask_{child.name}", {"prompt": "AK123:350 LA101:250 AK456:370"})
    return Agent(scripted_model(call, cheapest), name=name, tools=[child_run_tool(child)])


PROGRAM = ("flights = await ask_{child}(prompt='AK123:350 LA101:250 AK456:370')\n"
           "min(flights, key=lambda f: f['price'])['number']")


async def test_a_child_run_answers_the_call_and_its_usage_counts(client: Client) -> None:
    suffix = os.urandom(3).hex()
    child = extraction(f"extract{suffix}")
    parent = CodeModeAgent(search(f"search{suffix}", child, PROGRAM.format(child=f"extract{suffix}")))
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq):
        handle = await start_run(client, parent, "Find the cheapest flight", task_queue=tq)
        result = await handle.result()
    assert result.output == "cheapest: LA101"
    assert (result.usage.requests, result.usage.tool_calls) == (2 + 1, 1)  # the parent's two, the child's one
    (call,) = result.nested_calls
    assert call.status == "ok" and "LA101" in call.result
    # The child is a run of its own, under an id made of the parent's and the call's; both histories replay.
    child_handle = client.get_workflow_handle_for(CodeModeRunWorkflow.run, child_run_id(handle.id, call.call_id))
    child_result = await child_handle.result()
    assert [f["number"] for f in child_result.output] == ["AK123", "LA101", "AK456"]
    await replay(handle)
    await replay(child_handle)
    trace = await trace_run(client, handle.id)
    (traced,) = trace.nested_calls
    assert traced.status == "ok" and traced.child_run_id == child_handle.id and "LA101" in (traced.result or "")
    # `codemode trace` draws the child run under the call that started it.
    drawing = render_trace(trace)
    assert f"child run {child_handle.id} (agent extract{suffix}): completed" in drawing, drawing
    assert drawing.index("ask_extract") < drawing.index(f"child run {child_handle.id}")

    # `codemode watch` shows the call that started the child run, and its answer.
    from .test_debugging import address, codemode

    rc, out, err = await codemode("watch", handle.id, address=address(client))
    assert rc == 0, (out, err)
    assert f'  ▸ {call.call_id} ask_extract{suffix}(prompt="AK123:350 LA101:250 AK456:370")' in out.splitlines()
    assert any(line.startswith(f"  ✓ {call.call_id} ask_extract{suffix}(") and "LA101" in line
               for line in out.splitlines()), out

    # The same parent under agent.run(): pydantic-ai's delegation, the same requests and tool calls counted.
    plain = await plain_search(f"search{suffix}", child).run("Find the cheapest flight")
    assert plain.output == result.output
    assert (plain.usage.requests, plain.usage.tool_calls) == (result.usage.requests, result.usage.tool_calls)


async def test_a_child_runs_approvals_are_listed_by_its_parent(client: Client) -> None:
    suffix = os.urandom(3).hex()
    child = extraction(f"extractok{suffix}", approval=True)
    parent = CodeModeAgent(search(f"searchok{suffix}", child, PROGRAM.format(child=f"extractok{suffix}")))
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, parent, "Find the cheapest flight", task_queue=tq)
        async with asyncio.timeout(30):
            while not (waiting := await pending_approvals(client, handle.id)):
                await asyncio.sleep(0.05)
        (call,) = waiting
        assert call.tool == "log_request" and call.run_id == child_run_id(handle.id, "call_0.0")
        # Deciding it on the parent says where it waits; deciding it there lets both runs go on.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await decide(client, handle.id, call.call_id, approved=True, approver="ana")
        assert f"waits in child run {call.run_id!r}" in str(refused.value.cause)
        await decide(client, call.run_id, call.call_id, approved=True, approver="ana")
        result = await handle.result()
        assert await pending_approvals(client, handle.id) == []
    assert result.output == "cheapest: LA101"
    await replay(handle)
    await replay(client.get_workflow_handle(call.run_id))


async def test_a_failed_child_run_is_an_exception_in_the_program(client: Client) -> None:
    suffix = os.urandom(3).hex()
    child = extraction(f"extractbad{suffix}")
    code = ("try:\n    await ask_extractbad{s}(prompt='not a flight')\nexcept Exception as e:\n    r = str(e)\nr"
            ).replace("{s}", suffix)
    parent = CodeModeAgent(search(f"searchbad{suffix}", child, code))
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq):
        handle = await start_run(client, parent, "Find the cheapest flight", task_queue=tq)
        result = await handle.result()
    assert f"the extractbad{suffix} run" in result.output and "the prompt holds no flights" in result.output
    await replay(handle)
