"""Heavy compute never loses the run, and every history replays whatever the replaying machine's speed.

A stretch of a program's compute past its in-workflow budget is recorded in the history (a marker and the
compute activity): finished in workflow code, its outcome is recorded; still computing at the live backstop
(1.2 s), it goes on in the activity. Each test checks the run's value, that every tool call is still one activity
with its usual id, and that the history replays: as recorded, with its recorded limits rewritten to 1 ms and to
60 s (a replay that timed anything would take another path), and while the CPUs are busy.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from durable_codemode import CodeModeRunWorkflow, LocalPayloadStore, RunResult, SnippetLimits, connect, start_run
from durable_codemode.debugging import register_agents
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker
from durable_codemode.worker._pool import POOL
from durable_codemode.worker._worker import workflow_runner

from ._agents import Effects, items_agent
from ._ledger_worker import AGENT, Ledger, LedgerTask, ledger_agent
from ._workers import worker_fleet

TIGHT = SnippetLimits(max_turn_seconds=0.02, max_feed_seconds=0.05)
"""An in-workflow budget any real compute goes past (the default is 0.4 s a stretch, 1 s a workflow task)."""

SORT_200K = """
rows = [{"id": i, "key": (i * 7919) % 200_003} for i in range(200_000)]
rows.sort(key=lambda r: r["key"])
first = rows[0]["id"]
"""
FIRST = min(range(200_000), key=lambda i: ((i * 7919) % 200_003, i))
"""What `first` comes to in `SORT_200K`."""

LOOP_3S = "n = 0\nfor i in range(15_000_000):\n    n = (n + i * i) % 1_000_003\nn"
"""About 3 s of pure compute in Monty on these machines: past the live backstop, so it goes on in the activity."""


@pytest.fixture
async def store_client(env: WorkflowEnvironment, tmp_path: Path) -> Client:
    """A client (and so workers) with a payload store: a program holding 200k rows is a 17 MB dump."""
    return await connect(env.client.service_client.config.target_host,
                         payload_store=LocalPayloadStore(tmp_path / "payloads"))


@asynccontextmanager
async def busy_cpus(n: int = 2) -> AsyncIterator[None]:
    """`n` processes spinning on the CPU while the block runs: a replay under load."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _with_limits(history: WorkflowHistory, in_workflow: float, in_activity: float) -> WorkflowHistory:
    """The history with its recorded compute limits (`describe_agent`'s result) rewritten.

    The in-workflow budgets become `in_workflow`, the compute activity's `in_activity`.
    """
    data = json.loads(history.to_json())
    changed = 0
    for event in data["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if not marker or "result" not in marker.get("details", {}):
            continue
        payload = marker["details"]["result"]["payloads"][0]
        body = json.loads(base64.b64decode(payload["data"]))
        if isinstance(body, dict) and "limits" in body:
            body["limits"].update(max_turn_seconds=in_workflow, max_feed_seconds=in_workflow,
                                  max_compute_seconds=in_activity)
            payload["data"] = base64.b64encode(json.dumps(body).encode()).decode()
            changed += 1
    assert changed == 1, "the recorded spec was not found"
    return WorkflowHistory.from_json(history.workflow_id, data)


async def replays_whatever_the_speed(client: Client, handle: WorkflowHandle[Any, Any]) -> None:
    """Replay `handle`'s history as recorded, with rewritten limits, and under load.

    The limits become the least and the most they may be: 1 ms, and 1.5 s in workflow code with 60 s in the
    activity.
    """
    await replay(handle)
    history = await handle.fetch_history()
    replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=client.data_converter,
                        workflow_runner=workflow_runner(), debug_mode=True)
    for in_workflow, in_activity in ((0.001, 0.001), (1.5, 60.0)):
        await replayer.replay_workflow(_with_limits(history, in_workflow, in_activity))
    async with busy_cpus():
        await replay(handle)


async def run(client: Client, *steps: Any, limits: SnippetLimits = TIGHT, effects: Effects | None = None,
              ) -> tuple[RunResult, WorkflowHandle[Any, RunResult]]:
    name = f"compute{os.urandom(3).hex()}"
    agent = items_agent(name, *steps, effects=effects, limits=limits)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, name, "go", task_queue=tq)
        result = await handle.result()
    assert POOL.live_sessions() == 0
    await replays_whatever_the_speed(client, handle)
    history = await handle.fetch_history()
    failed = [e.workflow_task_failed_event_attributes.failure.message for e in history.events
              if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    # The one failure a loaded machine may cause: a multi-MB REPL loaded back from the compute activity past the
    # live backstop; the task is retried and the run goes on unchanged (docs/limits.md). Anything else is a bug.
    assert all(SLOW_LOAD in m for m in failed), failed
    assert result.continued_as_new == 0
    return result, handle


SLOW_LOAD = "back from its compute activity took past the live sandbox's"
"""What a workflow task failed by a slow load of a big REPL says (`_snippet_driver._load_outcome`)."""


def _compute_activities(history: WorkflowHistory) -> list[str]:
    return [e.activity_task_scheduled_event_attributes.activity_id for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == "durable-codemode.compute"]


def echo(messages: Any) -> str:
    return json.dumps(last_result(messages))


async def test_a_sort_past_the_budget_then_a_tool_call_using_its_result(store_client: Client) -> None:
    effects = Effects()
    result, handle = await run(store_client, RunCode(SORT_200K + "await get(i=first)"), echo, effects=effects)
    assert json.loads(result.output) == {"result": FIRST * 10}
    assert effects.calls == [("get", FIRST)]
    (snippet,) = [s for t in result.turns for s in t.snippets]
    assert snippet.outcome == "ok" and [c.call_id for c in snippet.calls] == ["call_0.0"]
    # The first stretch (building and sorting the rows) went past the 20 ms budget: recorded at stretch 0.
    assert _compute_activities(await handle.fetch_history())[0] == "call_0.compute.0"


async def test_a_three_second_loop_goes_on_in_the_compute_activity(client: Client) -> None:
    result, handle = await run(client, RunCode(LOOP_3S), echo, limits=SnippetLimits())  # the default budgets
    n = 0
    for i in range(15_000_000):
        n = (n + i * i) % 1_000_003
    assert json.loads(result.output) == {"result": n}
    (snippet,) = [s for t in result.turns for s in t.snippets]
    assert snippet.outcome == "ok" and snippet.computed_seconds is not None and snippet.computed_seconds > 1
    assert _compute_activities(await handle.fetch_history()) == ["call_0.compute.0"]


async def test_compute_then_a_gather_of_50_then_compute_keeps_the_repl(client: Client) -> None:
    code = """import asyncio
spin = 0
for i in range(300_000):
    spin = (spin + i) % 7919
values = await asyncio.gather(*(get(i=i) for i in range(50)))
total = 0
for v in values:
    for k in range(20_000):
        total = (total + v * k + spin) % 1_000_003
[spin, total]
"""
    effects = Effects()
    result, handle = await run(client, RunCode(code), RunCode("[spin, len(values)]"), echo, effects=effects)
    spin = sum(range(300_000)) % 7919
    total = 0
    for v in (i * 10 for i in range(50)):
        for k in range(20_000):
            total = (total + v * k + spin) % 1_000_003
    first, _ = [s for t in result.turns for s in t.snippets]
    assert json.loads(first.result) == {"result": [spin, total]}
    assert json.loads(result.output) == {"result": [spin, 50]}  # the REPL kept the first snippet's variables
    assert [c.call_id for c in first.calls] == [f"call_0.{n}" for n in range(50)]
    assert sorted(arg for _, arg in effects.calls) == list(range(50))  # each call ran once
    computed = _compute_activities(await handle.fetch_history())
    assert computed[0] == "call_0.compute.0" and len(computed) >= 2  # before the gather, and after it


@pytest.mark.timeout(120)
async def test_a_runaway_fails_its_snippet_and_the_repl_is_as_before(client: Client) -> None:
    limits = SnippetLimits(max_compute_seconds=2)
    result, _ = await run(
        client,
        RunCode("kept = 41"),
        RunCode("lost = await get(i=1)\nwhile True:\n    lost += 1"),
        lambda m: RunCode(f"seen = {last_result(m)['error']!r}\nkept + 1"),
        RunCode("lost"),
        echo, limits=limits,
    )
    snippets = [s for t in result.turns for s in t.snippets]
    assert [s.outcome for s in snippets] == ["ok", "error", "ok", "error"]
    told = snippets[2].code  # what the model was told, as it wrote it back
    assert "more than 2 s" in told and "as it was before this run_code call" in told and "runaway" in told
    assert [c.call_id for c in snippets[1].calls] == ["call_1.0"]  # the call it made did happen
    assert json.loads(snippets[2].result) == {"result": 42}  # what the REPL had before the runaway is kept
    assert "NameError" in snippets[3].result  # what the runaway assigned is not


@pytest.mark.timeout(120)
async def test_a_runaway_inside_one_builtin_is_the_runaway_at_its_limit(client: Client) -> None:
    """Monty cannot check its clock inside `10 ** (10 ** 8)`: its process is killed at the limit (plus its grace).

    That is the runaway, told as one, not a failed sandbox process tried again on a fresh one (which computed the
    same power all over, for twice the limit, and then told the model its process failed).
    """
    limits = SnippetLimits(max_compute_seconds=2)
    result, handle = await run(client, RunCode("x = 10 ** (10 ** 8)\nx % 7"),
                               lambda m: RunCode(f"seen = {last_result(m)['error']!r}\n0"), echo, limits=limits)
    snippets = [s for t in result.turns for s in t.snippets]
    assert [s.outcome for s in snippets] == ["error", "ok"]
    told = snippets[1].code
    assert "more than 2 s" in told and "runaway" in told, told
    assert "process failed" not in told, told
    computed = _compute_activities(await handle.fetch_history())
    assert computed == ["call_0.compute.0"], computed  # one compute activity: it ended the snippet


@pytest.mark.slow
async def test_a_killed_worker_mid_compute_is_retried_on_another(env: WorkflowEnvironment, tmp_path: Path) -> None:
    client = env.client
    task_queue = new_task_queue("compute-kill")
    task = LedgerTask(account="acc-compute", compute_loops=20_000_000, sequential=3)
    async with worker_fleet(client, env.client.service_client.config.target_host, task_queue, tmp_path) as fleet:
        ledger = Ledger(fleet.ledger)
        first = await fleet.start()
        handle = await start_run(client, AGENT, task.prompt(), task_queue=task_queue, run_id=f"{task_queue}-run")
        await _compute_attempt_started(handle)
        first.kill()
        await fleet.start()
        result = await asyncio.wait_for(handle.result(), 120)
    assert fleet.leftovers() == []
    assert result.output == str(task.expected(approved=True))
    assert ledger.balance(task.account) == task.expected(approved=True)[2]
    assert ledger.duplicate_effects() == 0
    history = await handle.fetch_history()
    computes = {e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and e.activity_task_scheduled_event_attributes.activity_type.name == "durable-codemode.compute"}
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
                and e.activity_task_started_event_attributes.scheduled_event_id in computes]
    assert attempts and max(attempts) >= 2, "the compute attempt on the killed worker was retried elsewhere"
    register_agents([ledger_agent(ledger)])
    await replays_whatever_the_speed(client, handle)


async def _compute_attempt_started(handle: WorkflowHandle[Any, Any]) -> None:
    """Wait until the run's compute activity is running on a worker."""
    async with asyncio.timeout(60):
        while True:
            description = await handle.describe()
            pending = description.raw_description.pending_activities
            if any(a.activity_type.name == "durable-codemode.compute" and a.state == 2 for a in pending):
                return  # PENDING_ACTIVITY_STATE_STARTED
            await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_without_a_payload_store_a_state_too_big_to_record_fails_clearly(client: Client) -> None:
    # 200k rows, then 3 s of compute in the same stretch: it goes on in the activity, and where it gets to (the
    # rows, a 28 MB dump, 3.4 MB compressed) is over what an activity may return without a payload store.
    result, _ = await run(client, RunCode("kept = 1"), RunCode(SORT_200K + LOOP_3S),
                          lambda m: RunCode(f"seen = {last_result(m)['error']!r}\nkept + 1"),
                          RunCode("first"), echo, limits=SnippetLimits())
    snippets = [s for t in result.turns for s in t.snippets]
    assert [s.outcome for s in snippets] == ["ok", "error", "ok", "error"]
    told = snippets[2].code  # what the model was told, as it wrote it back
    assert "payload store" in told and "CODEMODE_PAYLOAD_STORE" in told
    assert json.loads(snippets[2].result) == {"result": 2}  # the REPL as before the snippet
    assert "NameError" in snippets[3].result
