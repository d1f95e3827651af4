"""Asking a run what waits while it moves, on a worker that caches no run (`max_cached_workflows=0`).

On such a worker Temporal's core SDK (temporalio 1.35) evicts a run after every workflow task. A query that reaches
the worker during that eviction is buffered; a workflow task that arrives in the same few milliseconds is buffered
behind it, and when the eviction ends core applies the query and drops the task ("There were leftover buffered
tasks when evicting run"). The server holds the dropped task as started until its 10 s timeout: the run stalls,
and every query meanwhile waits and fails (`WorkerUnavailableError`). The approvals benchmark's smoke test failed
about one run in ten on it. `wait_for_approvals` asks the server (`describe`, which no worker answers) whether the
run is moving, and queries it when it is not.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from pydantic_ai import Agent
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from durable_codemode import CodeModeAgent, decide, start_run, wait_for_approvals
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model

CALLS = 20
"""Tool calls each run makes, one after another, before the gated one: each ends a workflow task, and each
workflow task ends with an eviction on a worker without a cache."""
WAITERS = 10
"""People watching each run for its approval at once (each with its own `wait_for_approvals`)."""
RUNS = 8

CODE = f"total = 0\nfor i in range({CALLS}):\n    total += await get(i=i)\nr = await gated(tag='x')\n[total, r]"


def _agent(name: str) -> CodeModeAgent:
    agent = Agent(scripted_model(RunCode(CODE), lambda m: repr(last_result(m)["result"])), name=name,
                  instructions="Use run_code.")

    @agent.tool_plain
    async def get(i: int) -> int:
        """Item `i`."""
        return i

    @agent.tool_plain(requires_approval=True)
    async def gated(tag: str) -> str:
        """A call a person must approve."""
        return f"done {tag}"

    return CodeModeAgent(agent)


@pytest.mark.slow
@pytest.mark.xdist_group("cpu-heavy")  # one at a time (tests/conftest.py)
async def test_waiting_for_approvals_never_stalls_a_run_on_a_worker_without_a_cache(client: Client) -> None:
    agent = _agent("evicted-queries")
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, max_cached_workflows=0, unsigned_approvals=True):
        for _ in range(RUNS):
            handle = await start_run(client, agent.name, "go", task_queue=tq)
            started = time.monotonic()
            waits = await asyncio.gather(*(wait_for_approvals(client, handle.id, timeout=timedelta(seconds=30))
                                           for _ in range(WAITERS)))
            paused_after = time.monotonic() - started
            assert all(p.call_id == f"call_0.{CALLS}" for (p,) in waits)
            await decide(client, handle.id, f"call_0.{CALLS}", approved=True)
            assert (await handle.result()).output == f"[{sum(range(CALLS))}, 'done x']"
            history = await handle.fetch_history()
            lost = [e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT]
            # The stall this test is about is a task the worker dropped, which the server times out after 10 s and
            # records: the history says whether it happened, whatever the machine's load did to the wall time.
            assert not lost, (f"run {handle.id}: a workflow task was lost and timed out (events {lost}); "
                              f"it paused after {paused_after:.1f} s")
            await replay(handle)
