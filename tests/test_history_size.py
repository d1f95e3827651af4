"""What a nested call costs in history (issue 16), and what users still get from it.

A tool activity's input is its arguments alone (the tool and call id are in the activity's type and id), and its
summary leaves out the call id. The tool still sees its name and call id (`current_call()`), and inputs written
before are still served.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from pydantic_ai import Agent
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.testing import ActivityEnvironment

from durable_codemode import CodeModeAgent, ToolOptions, current_call, start_run
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode._types import ToolCallInput
from durable_codemode.debugging import trace_run
from durable_codemode.testing import RunCode, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.worker._activities import CodeModeActivities

from .test_snippets import echo


def _agent(name: str, seen: list[tuple[str, str, int]], *steps: Any) -> CodeModeAgent:
    agent = Agent(scripted_model(*steps), name=name, instructions="Use run_code.")

    @agent.tool_plain
    def look(i: int) -> int:
        """Item i."""
        call = current_call()
        seen.append((call.tool, call.call_id, i))
        return i * 10

    @agent.tool_plain
    def near(i: int) -> int:
        """Item i, from a local activity."""
        call = current_call()
        seen.append((call.tool, call.call_id, i))
        return i * 100

    return CodeModeAgent(agent, tool_options={"near": ToolOptions(local=True)})


async def test_a_tool_sees_its_name_and_call_id_though_the_input_holds_only_arguments(client: Client) -> None:
    name = f"hist{os.urandom(3).hex()}"
    seen: list[tuple[str, str, int]] = []
    code = "import asyncio\nr = await asyncio.gather(look(i=1), look(i=2))\n[*r, await near(i=3)]"
    tq = new_task_queue()
    async with running_worker(client, [_agent(name, seen, RunCode(code), echo)], task_queue=tq):
        handle = await start_run(client, name, "go", task_queue=tq)
        result = await handle.result()
    assert eval(result.output)["result"] == [10, 20, 300]
    assert sorted(seen) == [("look", "call_0.0", 1), ("look", "call_0.1", 2), ("near", "call_0.2", 3)]
    assert [(c.call_id, c.tool, c.args, c.status) for c in result.nested_calls] == [
        ("call_0.0", "look", '{"i": 1}', "ok"), ("call_0.1", "look", '{"i": 2}', "ok"),
        ("call_0.2", "near", '{"i": 3}', "ok")]
    assert all(c.finished_at >= c.started_at for c in result.nested_calls)

    history = await handle.fetch_history()
    scheduled = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name == f"{name}.look"]
    assert len(scheduled) == 2
    for event, i in zip(scheduled, (1, 2), strict=True):
        attrs = event.activity_task_scheduled_event_attributes
        assert attrs.activity_id.startswith(f"call_0.{i - 1}-")
        assert json.loads(attrs.input.payloads[0].data) == {"args": {"i": i}}
        assert json.loads(event.user_metadata.summary.data) == f'look("i": {i})'

    await replay(handle)
    trace = await trace_run(client, handle.id)
    assert [(c.call_id, c.tool, c.args) for c in trace.nested_calls] == [
        ("call_0.0", "look", {"i": 1}), ("call_0.1", "look", {"i": 2}), ("call_0.2", "near", {"i": 3})]


async def test_old_and_compact_tool_inputs_are_both_served() -> None:
    # A call scheduled by a run recorded before `AgentSpec.compact_tool_calls` (or still pending in one) carries
    # the tool and call id in its input; a compact one only in the activity's type and id. Both reach the tool.
    seen: list[tuple[str, str, int]] = []
    activities = CodeModeActivities([_agent("old", seen, "done")])
    env = ActivityEnvironment()
    env.payload_converter = DATA_CONVERTER.payload_converter
    old = {"tool": "look", "args": {"i": 4}, "call_id": "call_3.1"}
    for activity_id, payload in (("call_3.1-0123456789", old), ("call_3.2-0123456789", {"args": {"i": 5}}),
                                 ("call-x-7-abcdef0123", ToolCallInput(args={"i": 6}))):
        env.info = dataclasses.replace(env.info, activity_type="old.look", activity_id=activity_id)
        raw = DATA_CONVERTER.payload_converter.to_payload(payload)
        assert raw is not None
        assert await env.run(activities.run_tool, [RawValue(raw)]) == seen[-1][2] * 10
    assert seen == [("look", "call_3.1", 4), ("look", "call_3.2", 5), ("look", "call-x-7", 6)]
