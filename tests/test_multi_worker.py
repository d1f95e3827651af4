"""Two worker processes on one server; one is SIGKILLed mid-run and the other finishes every run, exactly once.

The workers are separate OS processes (`tests._workers`), so the kill takes the worker, its workflow cache, its
in-flight activities and its `monty` sandbox processes at once, as a crash would. The survivor has none of the
killed worker's state: it rebuilds each of that worker's runs by replaying its snippet from history, and the
tool calls lost in flight are retried there. The ledger (a real SQLite file, keyed by idempotency key) shows
that every side effect ran exactly once, and every account's balance is what its run was told to do.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_codemode import (
    CodeModeRunWorkflow,
    CodeModeUserError,
    PoolSettings,
    RunResult,
    create_worker,
    start_run,
)
from durable_codemode.debugging import register_agents
from durable_codemode.testing import new_task_queue, replay
from durable_codemode.worker import _pool
from durable_codemode.worker._worker import DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS

from ._ledger_worker import AGENT, Ledger, LedgerTask, ledger_agent
from ._workers import completed_workflow_tasks, stall_after_kill, worker_fleet, workflow_task_workers

RUNS = 20

TASKS = [LedgerTask(account=f"mw-{i:02d}", gathers=3, width=6, sequential=14, pause_ms=10) for i in range(RUNS)]
"""Each run: 3 gathers of 6 deposits, 14 sequential deposits, a balance read: 33 nested calls."""


async def _wait_for_effects(ledger: Ledger, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while ledger.execution_count() < count:
        assert time.monotonic() < deadline, f"only {ledger.execution_count()} of {count} side effects ran"
        await asyncio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_killed_worker_runs_finish_on_the_other_exactly_once(env: WorkflowEnvironment, tmp_path: Path) -> None:
    client = env.client
    task_queue = new_task_queue("multi")
    async with worker_fleet(client, env.client.service_client.config.target_host, task_queue, tmp_path,
                            max_processes=RUNS + 4) as fleet:
        ledger = Ledger(fleet.ledger)
        await asyncio.gather(fleet.start(), fleet.start())
        handles: list[WorkflowHandle[CodeModeRunWorkflow, RunResult]] = [
            await start_run(client, AGENT, t.prompt(), task_queue=task_queue, run_id=f"{task_queue}-{t.account}")
            for t in TASKS]
        total = sum(t.mutations() for t in TASKS)
        await _wait_for_effects(ledger, total * 3 // 10)

        # Kill the worker that holds more runs: the one that ran each open run's latest workflow task.
        holders = [tasks[-1][1] for tasks in await asyncio.gather(*(
            workflow_task_workers(client, h.id, completed=True) for h in handles))]
        victim_id = max(fleet.by_identity(), key=holders.count)
        victim = fleet.by_identity()[victim_id]
        survivor = next(w for w in fleet.started if w is not victim)
        assert victim.sandbox_processes(), "the victim runs snippets in its own monty processes"
        victim.kill()
        assert victim.sandbox_processes() == [], "its monty processes died with it (one process group)"
        done_at_kill = ledger.execution_count()
        killed_at, dead_at = victim.killed_at, victim.dead_at
        assert killed_at is not None and dead_at is not None

        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 180)
        assert survivor.alive()

    assert fleet.leftovers() == []
    for task, result in zip(TASKS, results, strict=True):
        assert result.output == str(task.expected(approved=True)), task
        assert ledger.balance(task.account) == task.expected(approved=True)[2]
    per_key = ledger.executions_per_key()
    assert len(per_key) == total and ledger.execution_count() == total
    assert ledger.duplicate_effects() == 0, {k: n for k, n in per_key.items() if n > 1}
    assert done_at_kill < total, "the kill landed before the runs were done"

    # The runs the victim held moved to the survivor, which replayed them from history; the victim completed
    # no workflow task handed to it after its death. (Its last completion may be stamped after it died: the
    # response was already on the wire. So each completed task is judged by when it was handed over.)
    moved = []
    for handle in handles:
        tasks = await completed_workflow_tasks(client, handle.id)
        late = [t for t in tasks if t.identity == victim.identity and t.started >= dead_at]
        assert late == [], f"{handle.id}: the killed worker completed tasks handed to it after its death: {late}"
        before = {t.identity for t in tasks if t.started < killed_at}
        after = {t.identity for t in tasks if t.started >= dead_at}
        if victim.identity in before and survivor.identity in after:
            moved.append(handle.id)
    assert moved, "no run moved from the killed worker to the survivor"

    register_agents([ledger_agent(ledger)])  # the payout's approval rule is code: replays look it up
    for handle in handles:
        await replay(handle)

    stalls = [s for s in await asyncio.gather(*(stall_after_kill(client, ledger, run, survivor, killed_at)
                                                for run in moved)) if s is not None]
    retried = ledger.attempt_count() - sum(t.calls() for t in TASKS)
    print(f"multi-worker: {RUNS} runs, {sum(t.calls() for t in TASKS)} nested calls, 1 worker killed "
          f"with {total - done_at_kill} side effects to go, {len(moved)} runs moved, {retried} attempts retried, "
          "0 duplicates; moved runs resumed on the survivor after (median/max) "
          f"{statistics.median(r for r, _ in stalls):.1f}/{max(r for r, _ in stalls):.1f} s, their next call "
          f"returned after {statistics.median(c for _, c in stalls):.1f}/{max(c for _, c in stalls):.1f} s")


async def test_workers_run_few_workflow_tasks_at_once(env: WorkflowEnvironment, tmp_path: Path) -> None:
    """A fresh worker taking over many runs replays them a few at a time, each within the 2 s deadlock limit.

    With Temporal's default (100 at once) the chaos test's replacement workers failed every replay with TMPRL1101
    and its 30 runs never finished; `tests/test_chaos.py` is the proof in action, this pins the default.
    """
    agents = [ledger_agent(Ledger(tmp_path / "ledger.sqlite"))]
    worker = create_worker(env.client, agents, task_queue=new_task_queue())
    pool = _pool.POOL.configure(PoolSettings()).max_processes  # what create_worker just used: the running pool
    assert worker.config()["max_concurrent_workflow_tasks"] == min(DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS, pool)
    assert DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS == 4
    mine = create_worker(env.client, agents, task_queue=new_task_queue(), max_concurrent_workflow_tasks=2)
    assert mine.config()["max_concurrent_workflow_tasks"] == 2
    with pytest.raises(CodeModeUserError, match=r"more than the \d+ processes of this process.s Monty pool"):
        create_worker(env.client, agents, task_queue=new_task_queue(), max_concurrent_workflow_tasks=pool + 1)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_model_request_lost_with_its_worker_is_retried_after_the_heartbeat_timeout(
        env: WorkflowEnvironment, tmp_path: Path) -> None:
    """A model request heartbeats: killed with its worker, it is retried after 10 s, not after its 5 minutes."""
    client = env.client
    task_queue = new_task_queue("model-kill")
    task = LedgerTask(account="hang", gathers=1, width=2, sequential=1, model_hang=600)
    async with worker_fleet(client, client.service_client.config.target_host, task_queue, tmp_path) as fleet:
        ledger = Ledger(fleet.ledger)
        first = await fleet.start(spare=True)
        handle = await start_run(client, AGENT, task.prompt(), task_queue=task_queue)
        while ledger.model_hangs() == 0:
            await asyncio.sleep(0.05)
        first.kill()
        await fleet.start()
        result = await asyncio.wait_for(handle.result(), 90)  # the start-to-close timeout would be 300 s
    assert result.output == str(task.expected(approved=True))
    history = await handle.fetch_history()
    model_starts = [e.activity_task_started_event_attributes for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED][:1]
    assert model_starts[0].attempt == 2
    assert model_starts[0].last_failure.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT
    assert ledger.duplicate_effects() == 0 and ledger.execution_count() == task.mutations()
    await replay(handle)
