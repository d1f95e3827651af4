"""A worker whose Monty pool is smaller than its runs in flight queues them; none fails, all replay.

A run holds a sandbox process only while its program computes inside one workflow task: while the program waits
on tools or timers it is a dump in workflow memory (`_sandbox`), and a worker runs at most one workflow task per
process (`PoolSettings`). Before, a program held its process across every wait, so runs past the pool's size
failed their workflow tasks with `SandboxUnavailableError` (and waited seconds for Temporal's retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import Agent
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from durable_codemode import CodeModeAgent, CodeModeUserError, PoolSettings, start_run
from durable_codemode.testing import (
    RunCode,
    child_processes,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)
from durable_codemode.worker import _pool
from durable_codemode.worker._worker import create_worker
from tests._agents import Effects, items_agent

POOL = 2
RUNS = 10

# Sequential calls, a gather, a durable sleep, then more calls: the program waits on Temporal many times.
CODE = """import asyncio, time, random
total = 0
for k in range(8):
    total += await get(i=k)
pair = await asyncio.gather(*(get(i=k) for k in range(4)))
time.sleep(0.05)
await asyncio.sleep(0.05)
seen = await store(key=f'k{tag}', value=total + sum(pair))
[total, sum(pair), seen[f'k{tag}'], 0 <= random.random() < 1]
"""


@pytest.fixture
async def small_pool() -> AsyncIterator[int]:
    assert _pool.POOL.live_sessions() == 0
    _pool.shutdown_pool()
    _pool.POOL.configure(PoolSettings(max_processes=POOL))
    yield POOL
    _pool.shutdown_pool()
    _pool.POOL.configure(PoolSettings())


class PeakSessions:
    """The most sandbox sessions checked out at once, sampled every few milliseconds."""

    def __init__(self) -> None:
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, _pool.POOL.live_sessions())
            await asyncio.sleep(0.002)

    async def __aenter__(self) -> PeakSessions:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def failed_tasks(handle: WorkflowHandle[Any, Any]) -> list[str]:
    history = await handle.fetch_history()
    return [e.workflow_task_failed_event_attributes.failure.message for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]


@pytest.mark.slow
@pytest.mark.xdist_group("cpu-heavy")  # one at a time (tests/conftest.py)
@pytest.mark.timeout(240)
async def test_more_runs_than_sandbox_processes_queue_and_all_complete(client: Client, small_pool: int) -> None:
    effects = Effects()
    agents = [items_agent(f"queued{i}", RunCode(f"tag = {i}\n" + CODE), lambda m: repr(last_result(m)["result"]),
                          effects=effects) for i in range(RUNS)]
    tq = new_task_queue()
    async with running_worker(client, agents, task_queue=tq, pool=PoolSettings(max_processes=small_pool)) as worker:
        assert worker.config()["max_concurrent_workflow_tasks"] == small_pool  # the rule, set by create_worker
        async with PeakSessions() as sessions:
            handles = await asyncio.gather(*(start_run(client, f"queued{i}", "go", task_queue=tq)
                                             for i in range(RUNS)))
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 180)
    total, pair = sum(range(8)) * 10, sum(range(4)) * 10
    assert [eval(r.output) for r in results] == [[total, pair, total + pair, True]] * RUNS
    assert all(len(r.nested_calls) == 13 for r in results)
    assert effects.duplicates == 0
    # One per workflow task slot, plus the programs keeping their process over a wait on tool calls (at most
    # the hold budget, in processes of their own: no workflow task waits for them).
    assert sessions.peak <= small_pool + _pool.hold_budget(PoolSettings(max_processes=small_pool))
    assert _pool.POOL.live_sessions() == 0
    for handle in handles:
        assert await failed_tasks(handle) == []  # no SandboxUnavailableError, no deadlock
        await replay(handle)


async def test_a_worker_may_not_have_more_workflow_task_slots_than_sandbox_processes(client: Client) -> None:
    # A pool already running keeps its size (the message says so): start from none, whatever ran before here.
    assert _pool.POOL.live_sessions() == 0
    _pool.shutdown_pool()
    agent = items_agent("slots", "done")
    try:
        with pytest.raises(CodeModeUserError, match="max_concurrent_workflow_tasks=9 is more than the 4 processes"):
            create_worker(client, [agent], pool=PoolSettings(max_processes=4), max_concurrent_workflow_tasks=9)
        worker = create_worker(client, [agent], pool=PoolSettings(max_processes=4), max_concurrent_workflow_tasks=3)
        assert worker.config()["max_concurrent_workflow_tasks"] == 3
    finally:  # the tests after this one in this process get the default pool again
        _pool.shutdown_pool()
        _pool.POOL.configure(PoolSettings())
    with pytest.raises(CodeModeUserError, match="at least 2"):
        PoolSettings(max_processes=1)


@pytest.fixture
async def idle_shutdown_pool() -> AsyncIterator[PoolSettings]:
    assert _pool.POOL.live_sessions() == 0
    _pool.shutdown_pool()
    settings = PoolSettings(max_processes=POOL, idle_shutdown_seconds=0.5)
    _pool.POOL.configure(settings)
    yield settings
    _pool.shutdown_pool()
    _pool.POOL.configure(PoolSettings())


async def _retired(caplog: pytest.LogCaptureFixture, times: int) -> None:
    """Until the worker has stopped the idle pool `times` times (its log says so) and no process is left."""
    deadline = asyncio.get_running_loop().time() + 30
    while sum("processes were stopped" in r.getMessage() for r in caplog.records) < times or child_processes():
        assert asyncio.get_running_loop().time() < deadline, f"still running: {child_processes()}"
        await asyncio.sleep(0.05)


async def test_an_idle_pool_stops_its_processes_and_starts_them_again_for_the_next_run(
        client: Client, idle_shutdown_pool: PoolSettings, caplog: pytest.LogCaptureFixture) -> None:
    # A worker whose runs all wait (here: none left) must not keep its `monty` processes, ~27 MB of RSS each.
    caplog.set_level(logging.INFO, logger="durable_codemode.worker._worker")
    agent = items_agent("idle-pool", RunCode("[await get(i=1), await get(i=2)]"), lambda m: str(last_result(m)))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, pool=idle_shutdown_pool):
        first = await start_run(client, "idle-pool", "go", task_queue=tq)
        await first.result()
        await _retired(caplog, 1)  # 0.5 s after the run's last use of the pool (which was started for it)
        assert not _pool.POOL.running_pools()
        second = await start_run(client, "idle-pool", "go", task_queue=tq)
        assert (await second.result()).output == (await first.result()).output
        await _retired(caplog, 2)  # started again, lazily, by the second run's first snippet, and stopped again
    await replay(first)
    await replay(second)


async def test_a_program_waiting_on_a_tool_keeps_the_pool_warm(
        client: Client, idle_shutdown_pool: PoolSettings, caplog: pytest.LogCaptureFixture) -> None:
    # Runs that are active keep the processes: a program waiting on a tool call holds its session, so the pool is
    # not idle however long the tool takes; once the run is done, the pool stops.
    caplog.set_level(logging.INFO, logger="durable_codemode.worker._worker")
    started, gate = asyncio.Event(), asyncio.Event()
    agent = Agent(scripted_model(RunCode("[await slow(), await slow()]"), "done"), name="warm-pool")

    @agent.tool_plain
    async def slow() -> str:
        """Answer once the test opens its gate."""
        started.set()
        await gate.wait()
        return "slow"

    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent)], task_queue=tq, pool=idle_shutdown_pool):
        handle = await start_run(client, "warm-pool", "go", task_queue=tq)
        await started.wait()
        assert _pool.POOL.idle_for() is None and _pool.POOL.held_sessions() == 1, "the waiting program holds it"
        gate.set()
        assert (await handle.result()).output == "done"
        await _retired(caplog, 1)
    await replay(handle)


def test_idle_shutdown_must_be_positive() -> None:
    with pytest.raises(CodeModeUserError, match="idle_shutdown_seconds must be positive or None"):
        PoolSettings(idle_shutdown_seconds=0)
