"""A routine restart repeats no effect: a worker told to stop lets its in-flight tool calls finish first.

A deploy stops the old worker with SIGTERM and starts the new one on the same task queue. Temporal's worker, by
default, cancels the activities still running when it shuts down, and another worker runs them again: a tool
without an idempotency key then applied its effect twice. `create_worker` gives running activities
`graceful_shutdown_timeout` (30 s) to finish. The worker here is a real process (`tests._ledger_worker`) whose
tools count every attempt in a SQLite ledger, with the worker's pid: each call must have started exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_codemode import start_run
from durable_codemode.testing import new_task_queue, replay

from ._ledger_worker import AGENT, Ledger, LedgerTask
from ._workers import worker_fleet

TASK = LedgerTask(account="sigterm", gathers=0, width=0, sequential=2, pause_ms=2_500)
"""Two deposits of 2.5 s each, one after the other, then a balance read: the first is cut by the SIGTERM."""


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_sigterm_lets_the_running_tool_call_finish_and_it_runs_once(env: WorkflowEnvironment,
                                                                            tmp_path: Path) -> None:
    client = env.client
    task_queue = new_task_queue("sigterm")
    async with worker_fleet(client, client.service_client.config.target_host, task_queue, tmp_path) as fleet:
        ledger = Ledger(fleet.ledger)
        old = await fleet.start(spare=True)
        handle = await start_run(client, AGENT, TASK.prompt(), task_queue=task_queue)
        deadline = time.monotonic() + 60
        while not ledger.attempts():  # the first deposit has started on the old worker
            assert time.monotonic() < deadline, old.tail()
            await asyncio.sleep(0.02)
        told = time.monotonic()
        old.terminate()  # the deploy: stop the old worker...
        new = await fleet.start()  # ...and start the new one on the same task queue
        code = await asyncio.to_thread(old.proc.wait, 60)
        stopped_after = time.monotonic() - told
        result = await asyncio.wait_for(handle.result(), 60)
    assert json.loads(result.output) == TASK.expected(approved=False)
    attempts = ledger.attempts()
    per_call = Counter(a["idempotency_key"] for a in attempts)
    assert len(per_call) == TASK.calls() and set(per_call.values()) == {1}, attempts  # no call started twice
    assert set(ledger.executions_per_key().values()) == {1}
    first = attempts[0]
    assert first["pid"] == old.pid and first["finished"] is not None  # it finished on the worker told to stop
    assert [a["pid"] for a in attempts[1:]] == [new.pid, new.pid]
    assert code == 0 and stopped_after < 30, (code, stopped_after, old.tail())  # it left once the call was done
    await replay(handle)
