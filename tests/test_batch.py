"""Batched read-only calls (`ToolOptions(batch=True)`): one activity per wait, every call still its own.

Real Temporal dev server, real Monty; every completed run's history is replayed with Temporal's `Replayer`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy

from durable_codemode import CodeModeUserError, ToolOptions, start_run
from durable_codemode._names import BATCH_ACTIVITY
from durable_codemode.debugging import render_trace, trace_run
from durable_codemode.testing import RunCode, last_result, replay, running_worker

from ._agents import Effects, items_agent

BATCHED = {"get": ToolOptions(batch=True), "flaky": ToolOptions(batch=True)}


async def scheduled(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, str]]:
    """(activity type, activity id) of every activity the run scheduled, in order."""
    history = await handle.fetch_history()
    return [(e.activity_task_scheduled_event_attributes.activity_type.name,
             e.activity_task_scheduled_event_attributes.activity_id)
            for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]


def tools_of(activities: list[tuple[str, str]]) -> list[str]:
    return [kind.rsplit(".", 1)[-1] if kind != BATCH_ACTIVITY else "batch" for kind, _ in activities
            if not kind.startswith("durable-codemode.") or kind == BATCH_ACTIVITY]


async def test_mixed_gather_one_batch_activity_beside_the_unbatched_call(client: Client) -> None:
    effects = Effects()
    code = """
import asyncio
r = await asyncio.gather(*(get(i=i) for i in range(5)), store(key='a', value=1), *(get(i=i) for i in range(5, 8)))
one = await get(i=9)
[r, one]
"""
    agent = items_agent("batch-mixed", RunCode(code), lambda m: repr(last_result(m)["result"]), effects=effects,
                        agent_options={"tool_options": BATCHED})
    async with running_worker(client, [agent]) as worker:
        handle = await start_run(client, "batch-mixed", "go", task_queue=worker.task_queue)
        result = await handle.result()
    assert eval(result.output) == [[0, 10, 20, 30, 40, {"a": 1}, 50, 60, 70], 90]
    # One activity for store, one batch for the eight gets of the gather; the lone get(i=9) is its own activity.
    assert tools_of(await scheduled(handle)) == ["store", "batch", "get"]
    # Every call kept its own record, id and idempotency key.
    calls = result.nested_calls
    assert [c.call_id.rsplit(".", 1)[1] for c in calls] == [str(n) for n in range(10)]
    assert [c.tool for c in calls] == ["get"] * 5 + ["store"] + ["get"] * 4
    assert all(c.status == "ok" for c in calls)
    assert len(effects.keys) == 10 and effects.duplicates == 0
    # The trace shows one line per call, batched or not.
    trace = await trace_run(client, handle.id)
    lines = [c for t in trace.turns for s in t.snippets for c in s.calls]
    assert [(c.call_id, c.status) for c in lines] == [(c.call_id, "ok") for c in calls]
    assert [c.args for c in lines][:2] == [{"i": 0}, {"i": 1}]
    assert lines[8].result == "70" and lines[8].activity_type == BATCH_ACTIVITY
    text = render_trace(trace)
    assert all(c.call_id in text for c in calls)
    await replay(handle)


async def test_one_failing_call_is_caught_as_unbatched_and_the_others_keep_their_results(client: Client) -> None:
    code = """
import asyncio
caught = None
try:
    await asyncio.gather(get(i=1), get(i=-1), get(i=2))
except KeyError as e:
    caught = str(e)
values = await asyncio.gather(get(i=3), get(i=4))
[caught, values]
"""
    outputs = []
    for name, options in (("batch-fail", {"tool_options": BATCHED}), ("batch-fail-plain", None)):
        agent = items_agent(name, RunCode(code), lambda m: repr(last_result(m)["result"]), agent_options=options)
        async with running_worker(client, [agent]) as worker:
            handle = await start_run(client, name, "go", task_queue=worker.task_queue)
            result = await handle.result()
        outputs.append(result.output)
        statuses = [(c.status, c.result) for c in result.nested_calls]
        assert statuses[1][0] == "error" and "no item -1" in statuses[1][1]
        assert [s for s, _ in statuses] == ["ok", "error", "ok", "ok", "ok"]
        await replay(handle)
        if options is not None:
            assert tools_of(await scheduled(handle)) == ["batch", "batch"]
    # The program saw the same exception, with the same message, batched or not.
    assert outputs[0] == outputs[1]
    assert eval(outputs[0]) == ["'no item -1'", [30, 40]]


async def test_transient_failure_is_retried_inside_the_batch_alone(client: Client) -> None:
    effects = Effects()
    code = "import asyncio\nawait asyncio.gather(flaky(n=3), flaky(n=1), get(i=1), get(i=2))"
    quick = RetryPolicy(initial_interval=timedelta(milliseconds=10), maximum_attempts=3)
    agent = items_agent("batch-flaky", RunCode(code), lambda m: repr(last_result(m)["result"]), effects=effects,
                        agent_options={"tool_options": {"get": ToolOptions(batch=True),
                                                        "flaky": ToolOptions(batch=True, retry_policy=quick)}})
    async with running_worker(client, [agent]) as worker:
        handle = await start_run(client, "batch-flaky", "go", task_queue=worker.task_queue)
        result = await handle.result()
    assert eval(result.output) == [3, 1, 10, 20]
    # One batch per tool; flaky(n=3) was tried three times inside its batch, each try numbered for that call, and
    # no other call ran again.
    assert tools_of(await scheduled(handle)) == ["batch", "batch"]
    assert sorted(a for t, a in effects.calls if t == "flaky") == [1, 1, 2, 3]
    assert [a for t, a in effects.calls if t == "get"] == [1, 2]
    await replay(handle)


async def test_transient_failure_past_its_tries_is_the_same_error_as_unbatched(client: Client) -> None:
    code = """
import asyncio
try:
    await asyncio.gather(flaky(n=5), flaky(n=1))
    seen = None
except RuntimeError as e:
    seen = str(e)
seen
"""
    quick = RetryPolicy(initial_interval=timedelta(milliseconds=10), maximum_attempts=2)
    outputs = []
    for name, batch in (("batch-exhausted", True), ("batch-exhausted-plain", False)):
        agent = items_agent(name, RunCode(code), lambda m: repr(last_result(m)["result"]), agent_options={
            "tool_options": {t: ToolOptions(batch=batch, retry_policy=quick) for t in ("get", "flaky")}})
        async with running_worker(client, [agent]) as worker:
            handle = await start_run(client, name, "go", task_queue=worker.task_queue)
            outputs.append((await handle.result()).output)
        await replay(handle)
        assert tools_of(await scheduled(handle)) == (["batch"] if batch else ["flaky", "flaky"])
    assert outputs[0] == outputs[1] == repr("TransientToolError: backend busy (attempt 2)")


def test_batch_refuses_what_it_cannot_honour() -> None:
    for bad, named in ((dict(local=True), "local=True"), (dict(requires_approval=True), "requires_approval"),
                       (dict(approval_rule=lambda a: True), "approval_rule"),
                       (dict(in_sandbox=False), "in_sandbox=False"),
                       (dict(heartbeat_timeout=None), "heartbeat_timeout=None")):
        with pytest.raises(CodeModeUserError, match=named) as info:
            ToolOptions(batch=True, **bad)  # type: ignore[arg-type]
        assert "drop batch=True" in str(info.value)

