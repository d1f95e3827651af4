"""Crashes anywhere: 30 runs while their only worker is SIGKILLed at seeded moments and the server restarts.

Each run makes dozens of nested calls (gathered and sequential, each a side effect on the ledger, a real SQLite
file) and asks for one payout that waits for a person. Meanwhile the worker process (with its `monty` sandbox
processes) is SIGKILLed and a new one started, at moments chosen by a seeded random generator and spaced by
progress (the ledger having grown by so many side effects), and once the Temporal dev server itself is stopped
and started again on its SQLite file, on the same port, so workers and clients reconnect. Every run must end
with the right result and balance (payouts approved or denied as decided), every side effect must have run
exactly once, and every history must replay.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError

from durable_codemode import (
    RunClosedError,
    RunNotFoundError,
    RunResult,
    WorkerUnavailableError,
    connect,
    decide,
    decide_all,
    start_dev_server,
    start_run,
)
from durable_codemode.debugging import register_agents
from durable_codemode.testing import new_task_queue, replay

from ._ledger_worker import AGENT, Ledger, LedgerTask, ledger_agent
from ._workers import WorkerFleet, WorkerProcess, worker_fleet

SEED = 20261202
RUNS = 30
KILLS = 5

TASKS = [LedgerTask(account=f"chaos-{i:02d}", gathers=3, width=8, sequential=4, after=4, pause_ms=5, payout=True)
         for i in range(RUNS)]
"""Each run: 3 gathers of 8 deposits, 4 sequential deposits, a payout (approval), 4 more deposits, a balance
read: 34 nested calls."""

APPROVED = [i % 3 != 0 for i in range(RUNS)]
"""Every third payout is denied (the program catches the `PermissionError`); the others are approved."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _effects_per_run(ledger: Ledger) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, n in ledger.executions_per_key().items():
        run = key.split(":", 1)[0]
        counts[run] = counts.get(run, 0) + n
    return counts


async def _approver(client: Client, handles: list[WorkflowHandle[Any, RunResult]], ledger: Ledger) -> int:
    """Decide each run's payout once it waits (odd runs by `decide`, even by `decide_all`); returns the tries."""
    undecided = dict(enumerate(handles))
    tries = 0

    async def attempt(i: int, handle: WorkflowHandle[Any, RunResult]) -> None:
        task = TASKS[i]
        payout_call = f"call_0.{task.gathers * task.width + task.sequential}"  # the program's call ids are fixed
        try:
            if i % 2:
                await decide(client, handle.id, payout_call, approved=APPROVED[i], approver="chaos",
                             timeout=timedelta(seconds=3))
            else:
                await decide_all(client, handle.id, approved=APPROVED[i], approver="chaos",
                                 timeout=timedelta(seconds=3))
            undecided.pop(i, None)
        except (RunClosedError, RunNotFoundError):
            # The run is closed (or the update was aborted by its closing): an earlier decision of ours was recorded
            # (its answer lost to a crash) and the run has finished since. The results show what was decided.
            undecided.pop(i, None)
        except (WorkflowUpdateFailedError, WorkerUnavailableError, RPCError):
            pass  # not waiting yet, or no worker / server right now: try again later

    while undecided:
        ready = _effects_per_run(ledger)
        due = [(i, h) for i, h in undecided.items()
               if ready.get(h.id, 0) >= TASKS[i].gathers * TASKS[i].width + TASKS[i].sequential]
        tries += len(due)
        await asyncio.gather(*(attempt(i, h) for i, h in due))
        await asyncio.sleep(0.2)
    return tries


async def _result(handle: WorkflowHandle[Any, RunResult]) -> RunResult:
    while True:
        try:
            return await handle.result()
        except RPCError:  # the server was restarting
            await asyncio.sleep(0.5)


async def _wait_for_effects(ledger: Ledger, count: int, fleet: WorkerFleet, worker: WorkerProcess) -> None:
    deadline = time.monotonic() + 120
    while ledger.execution_count() < count:
        assert worker.alive(), f"the worker died by itself:\n{worker.tail()}"
        assert time.monotonic() < deadline, (
            f"stuck at {ledger.execution_count()} of {count} side effects; worker log:\n{worker.tail()}")
        await asyncio.sleep(0.02)


@pytest.mark.slow
@pytest.mark.xdist_group("cpu-heavy")  # one at a time (tests/conftest.py)
@pytest.mark.timeout(300)
async def test_runs_survive_worker_kills_and_a_server_restart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], record_property: Callable[[str, object], None]) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    port = _free_port()
    db = tmp_path / "temporal.sqlite"
    address = f"127.0.0.1:{port}"
    env = await start_dev_server(db_file=db, port=port)
    try:
        client = await connect(address)
        task_queue = new_task_queue("chaos")
        async with worker_fleet(client, address, task_queue, tmp_path, max_processes=RUNS + 4, sticky=1.0,
                                tool_timeout=3.0) as fleet:
            ledger = Ledger(fleet.ledger)
            worker = await fleet.start(spare=True)
            print(f"{time.monotonic() - started:6.1f} s  first worker polls")  # a timeline, shown on failure
            handles = await asyncio.gather(*(start_run(client, AGENT, t.prompt(), task_queue=task_queue,
                                                       run_id=f"{task_queue}-{t.account}") for t in TASKS))
            approver = asyncio.create_task(_approver(client, handles, ledger))
            total = sum(t.mutations() - (0 if ok else 1) for t, ok in zip(TASKS, APPROVED, strict=True))

            # Five kills and one server restart, in a seeded order, each once the ledger has reached a seeded
            # count of side effects (between 10% and 85% of all), then after a seeded pause of up to 0.3 s.
            events = ["kill"] * KILLS
            events.insert(rng.randrange(1, KILLS), "server")
            marks = sorted(rng.sample(range(total // 10, total * 85 // 100), len(events)))
            kills = restarts = 0
            for event, mark in zip(events, marks, strict=True):
                await _wait_for_effects(ledger, mark, fleet, worker)
                await asyncio.sleep(rng.uniform(0, 0.3))
                print(f"{time.monotonic() - started:6.1f} s  {event} at {ledger.execution_count()}/{total}")
                if event == "kill":
                    assert worker.sandbox_processes(), "the worker runs snippets in its own monty processes"
                    worker.kill()
                    assert worker.sandbox_processes() == [], "its monty processes died with it"
                    kills += 1
                    worker = await fleet.start(spare=True)
                    print(f"{time.monotonic() - started:6.1f} s  new worker polls")
                else:
                    await env.shutdown()
                    env = await start_dev_server(db_file=db, port=port)
                    restarts += 1
                    print(f"{time.monotonic() - started:6.1f} s  server back")
            assert ledger.execution_count() < total, "the last crash came before the runs were done"

            results = await asyncio.wait_for(asyncio.gather(*(_result(h) for h in handles)), 180)
            print(f"{time.monotonic() - started:6.1f} s  all runs done")
            tries = await asyncio.wait_for(approver, 10)
            assert worker.alive(), worker.tail()
            assert fleet.by_identity().keys() == {f"ledger-worker-{n}" for n in range(KILLS + 1)}
        assert fleet.leftovers() == [], "no worker or monty process outlives the test"

        for task, ok, result in zip(TASKS, APPROVED, results, strict=True):
            assert result.output == str(task.expected(approved=ok)), task
            assert ledger.balance(task.account) == task.expected(approved=ok)[2], task
            assert [a.approved for a in result.approvals] == [ok]
        per_key = ledger.executions_per_key()
        duplicates = ledger.duplicate_effects()
        assert duplicates == 0, {k: n for k, n in per_key.items() if n > 1}
        assert len(per_key) == total == ledger.execution_count()

        register_agents([ledger_agent(ledger)])  # the payout's approval rule is code: replays look it up
        for handle in handles:
            await replay(handle)
        print(f"{time.monotonic() - started:6.1f} s  replayed")
    finally:
        await env.shutdown()

    calls = sum(t.calls() for t in TASKS)
    ran = calls - APPROVED.count(False)  # a denied payout never runs
    report = (f"chaos: {kills} worker kills survived, {restarts} server restart, {RUNS} runs, {calls} nested calls "
              f"({ledger.attempt_count() - ran} attempts retried), {RUNS} approvals ({tries} decisions tried), "
              f"{duplicates} duplicates, all {RUNS} histories replay; {time.monotonic() - started:.0f} s")
    record_property("chaos_report", report)
    with capsys.disabled():  # the one-line report lands in the CI log, whatever the capture mode
        print(f"\n{report}")

