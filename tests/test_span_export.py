"""Each span made in workflow code is exported once per run, however the run moves between worker processes.

Two ledger worker processes (`tests._workers`) trace their runs and write every span they export to a file of their
own, as it is exported (`tests._ledger_worker --spans`), so what a test counts is what a collector got, also from a
worker killed with SIGKILL. Before, a task run live twice (a refused completion, a worker without a workflow
cache, a worker replaced or killed mid-run) exported its spans twice: 59 extra copies in 12 runs without a cache
(`bench/span_export.py`). Now a span is exported only by the worker whose task completion the server recorded
(`durable_codemode.worker._span_exports`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_codemode import CodeModeRunWorkflow, RunResult, start_run
from durable_codemode.shared._names import MODEL_REQUEST_ACTIVITY
from durable_codemode.testing import new_task_queue, replay

from ._ledger_worker import AGENT, Ledger, LedgerTask
from ._workers import WorkerFleet, WorkerProcess, worker_fleet, workflow_task_workers

WORKFLOW_SPANS = ("codemode.run ", "codemode.model_request ", "codemode.run_code ", "codemode.call ")
"""The spans made in workflow code (an attempt's span is made once per attempt, by the activity)."""

TASKS = [LedgerTask(account=f"se-{i}", gathers=2, width=4, sequential=8, pause_ms=20) for i in range(4)]
"""Runs of 17 nested calls each: a span for the run, 2 model requests, 1 snippet and 17 calls (the cache-less
scenario runs all four: its duplicates came from workflow tasks timing out beside queries, some runs in every
repetition of four; the others run two)."""


def read_spans(directory: Path) -> list[dict[str, Any]]:
    """Every span the scenario's workers exported, each with the pid of the worker that exported it."""
    return [json.loads(line) for path in sorted(directory.glob("spans-*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def step_of(span: dict[str, Any]) -> tuple[str, str, str]:
    """The step of its run a span stands for: trace, name, call id.

    A copy re-created by a replay may have another span id, but stands for the same step.
    """
    return span["trace_id"], span["name"], str(span["attributes"].get("codemode.call_id"))


def run_spans(spans: list[dict[str, Any]], workflow_id: str) -> list[dict[str, Any]]:
    """The workflow-side spans of run `workflow_id`'s trace."""
    (trace_id,) = {s["trace_id"] for s in spans if s["name"].startswith("codemode.run ")
                   and s["attributes"].get("temporalWorkflowID") == workflow_id}
    return [s for s in spans if s["trace_id"] == trace_id and s["name"].startswith(WORKFLOW_SPANS)]


def expected_steps(task: LedgerTask) -> set[tuple[str, str]]:
    """(name, call id) of every workflow-side span a run of `task` makes."""
    calls = {(f"codemode.call {'balance' if i == task.calls() - 1 else 'deposit'}", f"call_0.{i}")
             for i in range(task.calls())}
    return {(f"codemode.run {AGENT}", "None"), ("codemode.model_request turn 0", "None"),
            ("codemode.model_request turn 1", "None"), ("codemode.run_code call_0", "call_0"), *calls}


async def query_every(handle: WorkflowHandle[Any, Any], done: asyncio.Event) -> None:
    """Query the run every 50 ms until `done`, as a dashboard would (failures ignored: its worker may be moving)."""
    while not done.is_set():
        with contextlib.suppress(Exception):  # the queries are the load, not what is checked
            await handle.query(CodeModeRunWorkflow.pending_approvals, rpc_timeout=timedelta(seconds=2))
        await asyncio.sleep(0.05)


async def busiest(fleet: WorkerFleet, handles: list[WorkflowHandle[Any, Any]]) -> WorkerProcess:
    """The worker that completed more of the runs' latest workflow tasks."""
    last = [tasks[-1][1] for tasks in await asyncio.gather(*(
        workflow_task_workers(fleet.client, h.id, completed=True) for h in handles)) if tasks]
    return max(fleet.by_identity().values(), key=lambda w: last.count(w.identity))


async def run_scenario(env: WorkflowEnvironment, tmp_path: Path, tasks: list[LedgerTask], *, cache: int | None,
                       queries: bool, disrupt: str | None
                       ) -> tuple[list[dict[str, Any]], list[WorkflowHandle[Any, RunResult]], WorkerProcess | None]:
    """Run `tasks` on two traced worker processes; `disrupt` ("stop", "kill") the busier one a third of the way."""
    spans = tmp_path / "spans"
    spans.mkdir()
    client = env.client
    task_queue = new_task_queue("span-export")
    extra = ("--spans", str(spans), *(("--cache", str(cache)) if cache is not None else ()))
    async with worker_fleet(client, client.service_client.config.target_host, task_queue, tmp_path,
                            max_processes=8, tool_timeout=3.0, extra_args=extra) as fleet:
        ledger = Ledger(fleet.ledger)
        await asyncio.gather(fleet.start(), fleet.start())
        handles = [await start_run(client, AGENT, t.prompt(), task_queue=task_queue, run_id=f"{task_queue}-{t.account}")
                   for t in tasks]
        done = asyncio.Event()
        polls = [asyncio.create_task(query_every(h, done)) for h in handles] if queries else []
        victim = None
        if disrupt is not None:
            deadline = time.monotonic() + 120
            while ledger.execution_count() < sum(t.mutations() for t in tasks) // 3:
                assert time.monotonic() < deadline, f"only {ledger.execution_count()} side effects ran"
                await asyncio.sleep(0.02)
            victim = await busiest(fleet, handles)
            if disrupt == "kill":
                victim.kill()
            else:
                victim.stop()  # gracefully, as a deploy replaces a worker
                await fleet.start()
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 180)
        done.set()
        await asyncio.gather(*polls)
        assert [r.output for r in results] == [str(t.expected(approved=True)) for t in tasks]
        for worker in fleet.started:
            if worker.alive():
                worker.stop()  # a stopping worker exports what it still holds
    for handle in handles:
        await replay(handle)
    return read_spans(spans), handles, victim


def assert_each_once(spans: list[dict[str, Any]], handles: list[WorkflowHandle[Any, Any]]) -> None:
    for handle, task in zip(handles, TASKS, strict=False):
        mine = run_spans(spans, handle.id)
        copies = Counter(step_of(s) for s in mine)
        twice = sorted(f"{name} {call}" for (_, name, call), n in copies.items() if n > 1)
        assert not twice, f"run {handle.id}: exported more than once: {twice}"
        assert {(name, call) for _, name, call in copies} == expected_steps(task)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_worker_replaced_mid_run_while_a_client_queries_exports_each_span_once(
        env: WorkflowEnvironment, tmp_path: Path) -> None:
    spans, handles, _ = await run_scenario(env, tmp_path, TASKS[:2], cache=None, queries=True, disrupt="stop")
    assert_each_once(spans, handles)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_workers_without_a_workflow_cache_export_each_span_once(env: WorkflowEnvironment, tmp_path: Path
                                                                       ) -> None:
    # Every workflow task replays the run so far, on either worker, while a client queries every 50 ms: before,
    # 59 extra copies in 12 runs, root spans among them.
    spans, handles, _ = await run_scenario(env, tmp_path, TASKS, cache=0, queries=True, disrupt=None)
    assert_each_once(spans, handles)


async def _taken_by(handle: WorkflowHandle[Any, Any]) -> dict[str, str]:
    """Who took each step's result: for each call id (and `turn N`, the run's model requests), a worker's identity.

    The worker whose workflow task took a step's result ended its span: the first workflow task started after the
    step's activity completed.
    """
    events = list((await handle.fetch_history()).events)
    scheduled = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    turns = [e.event_id for e in scheduled
             if e.activity_task_scheduled_event_attributes.activity_type.name == MODEL_REQUEST_ACTIVITY]
    call_of = {e.event_id: e.activity_task_scheduled_event_attributes.activity_id.rsplit("-", 1)[0]
               for e in scheduled}
    call_of.update({event_id: f"turn {n}" for n, event_id in enumerate(turns)})
    taken: dict[str, str] = {}
    for i, e in enumerate(events):
        if e.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            continue
        call = call_of[e.activity_task_completed_event_attributes.scheduled_event_id]
        started = next(x for x in events[i:] if x.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED)
        taken[call] = started.workflow_task_started_event_attributes.identity
    return taken


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_killed_worker_never_makes_a_span_exported_twice(env: WorkflowEnvironment, tmp_path: Path) -> None:
    spans, handles, victim = await run_scenario(env, tmp_path, TASKS[:2], cache=None, queries=False, disrupt="kill")
    assert victim is not None
    for handle, task in zip(handles, TASKS, strict=False):
        mine = run_spans(spans, handle.id)
        copies = Counter(step_of(s) for s in mine)
        twice = sorted(f"{name} {call}" for (_, name, call), n in copies.items() if n > 1)
        assert not twice, f"run {handle.id}: exported more than once: {twice}"
        missing = expected_steps(task) - {(name, call) for _, name, call in copies}
        # What the killed worker held when it died (the spans its last tasks ended, not yet known recorded: a
        # call's, a model request's) is lost with it, as its span processor's buffer would be; everything the
        # survivor ended is there.
        taken = await _taken_by(handle)

        lost = [(name, call) for name, call in missing
                if taken.get(name.removeprefix("codemode.model_request ") if name.startswith(
                    "codemode.model_request turn ") else call if name.startswith("codemode.call ") else "") !=
                victim.identity]
        assert not lost, (lost, taken, victim.identity)
