"""Batched read-only calls (`ToolOptions(batch=True)`): one activity per wait, every call still its own.

Real Temporal dev server, real Monty; every completed run's history is replayed with Temporal's `Replayer`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy

from durable_codemode import CodeModeAgent, CodeModeUserError, SnippetLimits, ToolOptions, start_run
from durable_codemode.debugging import render_trace, trace_run
from durable_codemode.shared._names import BATCH_ACTIVITY
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.worker._describe import describe_run

from . import _batch_worker
from ._agents import Effects, items_agent
from ._forked import start_module
from ._workers import ROOT, WorkerProcess

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
    assert sorted(a for t, a in effects.calls if t == "get") == [1, 2]  # concurrent: in either order
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


def _start_worker(client: Client, task_queue: str, folder: Path, n: int) -> WorkerProcess:
    log = folder / f"worker-{n}.log"
    proc = start_module("tests._batch_worker", ["--address", client.service_client.config.target_host,
                                                "--task-queue", task_queue, "--dir", str(folder)], log=log, cwd=ROOT)
    return WorkerProcess(proc, f"batch-{n}", log)


async def _until(check: Callable[[], Awaitable[bool]], worker: WorkerProcess, what: str) -> None:
    deadline = time.monotonic() + 60
    while not await check():
        assert worker.alive(), f"the worker died by itself:\n{worker.tail()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{worker.tail()}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(180)
async def test_killed_worker_mid_batch_the_retry_runs_only_the_calls_not_done(client: Client,
                                                                              tmp_path: Path) -> None:
    task_queue = new_task_queue("batch-kill")
    attempts = tmp_path / "attempts.log"
    first = _start_worker(client, task_queue, tmp_path, 1)
    second: WorkerProcess | None = None
    try:
        handle = await start_run(client, _batch_worker.AGENT, "go", task_queue=task_queue)

        async def heartbeated_quick_calls() -> bool:
            # The server holds the batch's last heartbeat: wait until it reports the three quick calls done.
            description = await handle.describe()
            for pending in description.raw_description.pending_activities:
                if pending.activity_type.name == BATCH_ACTIVITY and pending.heartbeat_details.payloads:
                    details = json.loads(pending.heartbeat_details.payloads[0].data)
                    return sum(1 for o in details if o["kind"] == "ok") == _batch_worker.HELD_FROM
            return False

        await _until(heartbeated_quick_calls, first, "the quick calls' heartbeat")
        first.kill()  # the held calls are still running in it
        (tmp_path / "gate").touch()
        second = _start_worker(client, task_queue, tmp_path, 2)
        result = await handle.result()
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.kill()
    assert json.loads(result.output) == [f"K{i}" for i in range(_batch_worker.CALLS)]
    runs = Counter(line.split()[0].split(":", 1)[1] for line in attempts.read_text().splitlines())
    ids = [c.call_id for c in result.nested_calls]
    # The calls done before the kill ran once; only the ones it interrupted ran again, on the second worker.
    assert [runs[i] for i in ids] == [1] * _batch_worker.HELD_FROM + [2] * (_batch_worker.CALLS
                                                                           - _batch_worker.HELD_FROM)
    assert tools_of(await scheduled(handle)) == ["batch"]
    await replay(handle)


@pytest.mark.parametrize("recorded", [False, True], ids=["recorded-unbatched", "recorded-batched"])
async def test_batching_is_read_from_the_run_not_from_the_worker_that_continues_it(client: Client,
                                                                                   recorded: bool) -> None:
    # A run started on a worker with one setting is continued (from its history) by a worker with the other: the
    # run keeps the setting it recorded, before and after, so an old run replays and goes on as it ran.
    code = """
import asyncio, time
a = await asyncio.gather(get(i=1), get(i=2))
time.sleep(2)
b = await asyncio.gather(get(i=3), get(i=4))
[a, b]
"""
    def agent(batch: bool) -> Any:
        return items_agent(f"batch-recorded-{recorded}", RunCode(code), lambda m: repr(last_result(m)["result"]),
                           agent_options={"tool_options": {"get": ToolOptions(batch=batch)}})

    tq = new_task_queue()
    async with running_worker(client, [agent(recorded)], task_queue=tq):
        handle = await start_run(client, f"batch-recorded-{recorded}", "go", task_queue=tq)
        await _until_event(client, handle.id, EventType.EVENT_TYPE_TIMER_STARTED)
    async with running_worker(client, [agent(not recorded)], task_queue=tq):
        result = await handle.result()
    assert eval(result.output) == [[10, 20], [30, 40]]
    assert tools_of(await scheduled(handle)) == (["batch", "batch"] if recorded else ["get"] * 4)
    await replay(handle)


async def _until_event(client: Client, workflow_id: str, kind: EventType.ValueType) -> None:
    async def poll() -> None:
        while not any(e.event_type == kind for e in (await client.get_workflow_handle(workflow_id).fetch_history()
                                                    ).events):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), 30)


async def test_batch_is_recorded_from_options_or_metadata_and_refused_with_a_tool_that_needs_approval() -> None:
    agent = Agent("test", name="batch-describe")

    @agent.tool_plain(metadata={"codemode": {"batch": True}})
    def lookup(key: str) -> str:
        """Look `key` up."""
        return key

    @agent.tool_plain
    def plain(key: str) -> str:
        """Not batched."""
        return key

    spec = await describe_run(CodeModeAgent(agent))
    assert {t.name: t.batch for t in spec.tools} == {"lookup": True, "plain": False}

    gated = Agent("test", name="batch-gated")

    @gated.tool_plain(requires_approval=True)
    def pay(cents: int) -> int:
        """Pay."""
        return cents

    with pytest.raises(CodeModeUserError, match=r"tool 'pay' of agent 'batch-gated' has ToolOptions\(batch=True\) "
                       "but needs approval"):
        await describe_run(CodeModeAgent(gated, tool_options={"pay": ToolOptions(batch=True)}))


async def test_a_result_that_does_not_fit_the_batch_runs_again_on_its_own(client: Client) -> None:
    ran: Counter[int] = Counter()
    agent = Agent(scripted_model(RunCode("import asyncio\n[len(b) for b in await asyncio.gather("
                                         "*(blob(n=n) for n in range(3)))]"),
                                 lambda m: repr(last_result(m)["result"])), name="batch-blobs",
                  instructions="Use run_code.")

    @agent.tool_plain
    def blob(n: int) -> str:
        """1,000 characters."""
        ran[n] += 1
        return str(n) * 1000

    # Without a payload store the batch's results share one tool result's budget: two fit, the third is run again
    # as its own activity (batched tools are read-only).
    cm = CodeModeAgent(agent, tool_options={"blob": ToolOptions(batch=True)},
                       limits=SnippetLimits(max_tool_result_bytes=2_500))
    async with running_worker(client, [cm]) as worker:
        handle = await start_run(client, "batch-blobs", "go", task_queue=worker.task_queue)
        result = await handle.result()
    assert eval(result.output) == [1000, 1000, 1000]
    assert tools_of(await scheduled(handle)) == ["batch", "blob"]
    assert sorted(ran.values()) == [1, 1, 2]
    assert [c.status for c in result.nested_calls] == ["ok"] * 3
    await replay(handle)


async def test_a_batch_whose_program_stopped_waiting_is_cancelled(client: Client) -> None:
    code = """
import asyncio
try:
    await asyncio.gather(fail(kind='value'), slow(seconds=30), slow(seconds=30))
except ValueError as e:
    caught = str(e)
caught
"""
    agent = items_agent("batch-cancel", RunCode(code), lambda m: repr(last_result(m)["result"]),
                        agent_options={"tool_options": {"slow": ToolOptions(batch=True)}})
    async with running_worker(client, [agent]) as worker:
        handle = await start_run(client, "batch-cancel", "go", task_queue=worker.task_queue)
        result = await handle.result()
    assert eval(result.output) == "bad value"
    assert [c.status for c in result.nested_calls] == ["error", "cancelled", "cancelled"]
    history = await handle.fetch_history()
    assert any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED for e in history.events)
    await replay(handle)
