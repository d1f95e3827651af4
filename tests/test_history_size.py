"""What a nested call costs in history (issue 16), and what users still get from it.

A tool activity's input is its arguments alone (the tool and call id are in the activity's type and id), its
summary leaves out the call id, and its `CallRecord` in the run's result is a compact list. The tool still sees
its name and call id (`current_call()`), the result still reads as `CallRecord`s, and inputs and records written
before all this are still read.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import Agent
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.testing import ActivityEnvironment

from durable_codemode import CallRecord, CodeModeAgent, RunResult, ToolOptions, current_call, start_run
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode.debugging import trace_run
from durable_codemode.shared._activity_io import ToolCallInput
from durable_codemode.shared._records import NAMED_RECORDS
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
        assert json.loads(event.user_metadata.summary.data) == f'look(i={i})'
    # The run's result holds each call as a compact list, not an object with the field names.
    done = history.events[-1].workflow_execution_completed_event_attributes.result.payloads[0].data
    calls = json.loads(done)["turns"][0]["snippets"][0]["calls"]
    assert calls[0][:5] == ["call_0.0", "look", '{"i": 1}', "ok", "10"] and isinstance(calls[0][6], int)

    await replay(handle)
    trace = await trace_run(client, handle.id)
    assert [(c.call_id, c.tool, c.args) for c in trace.nested_calls] == [
        ("call_0.0", "look", {"i": 1}), ("call_0.1", "look", {"i": 2}), ("call_0.2", "near", {"i": 3})]


async def test_a_tool_call_is_named_by_its_activity_id_and_type_whatever_its_input_carries() -> None:
    # A call's tool and id are in its activity's type and id; an input written by 0.1.0 (a call it scheduled that
    # reaches a worker of this release) also carried them, and is served the same.
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


def test_call_records_are_compact_and_records_written_before_still_read() -> None:
    start = datetime(2026, 12, 4, 13, 0, 0, 152202, tzinfo=UTC)
    record = CallRecord(call_id="call_0.0", tool="get", args='{"i": 0}', status="ok", result="0",
                        started_at=start, finished_at=start + timedelta(microseconds=224934))
    payload = DATA_CONVERTER.payload_converter.to_payload(record)
    assert payload is not None
    assert payload.data == b'["call_0.0","get","{\\"i\\": 0}","ok","0","2026-12-04T13:00:00.152202Z",224934]'
    assert DATA_CONVERTER.payload_converter.from_payload(payload, CallRecord) == record
    # Written by releases before the compact form (and still what `codemode run --json` prints).
    named = TypeAdapter(CallRecord).dump_json(record, context=NAMED_RECORDS)
    assert json.loads(named) == {"call_id": "call_0.0", "tool": "get", "args": '{"i": 0}', "status": "ok",
                                 "result": "0", "started_at": "2026-12-04T13:00:00.152202Z",
                                 "finished_at": "2026-12-04T13:00:00.377136Z"}
    assert TypeAdapter(CallRecord).validate_json(named) == record
    old_result = {"output": "x", "usage": {}, "continued_as_new": 0, "turns": [
        {"index": 0, "text": "", "direct_calls": [json.loads(named)],
         "snippets": [{"call_id": "call_0", "code": "", "outcome": "ok", "result": "", "calls": [json.loads(named)]}]}]}
    result = TypeAdapter(RunResult[Any]).validate_json(json.dumps(old_result))
    assert result.nested_calls == result.direct_calls == [record]
    # A naive timestamp (a record built by hand) round-trips too.
    naive = dataclasses.replace(record, started_at=start.replace(tzinfo=None),
                                finished_at=record.finished_at.replace(tzinfo=None))
    assert TypeAdapter(CallRecord).validate_json(TypeAdapter(CallRecord).dump_json(naive)) == naive
