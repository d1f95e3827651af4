"""Runs with encrypted payloads, end to end on the dev server: what the server holds, rotation, a missing key.

Each test connects its own clients to the session's server with the keys it needs (`connect(encryption=...)`), so
nothing process-wide is set, and a client with `encryption=False` reads the history as the server stores it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic_ai import Agent
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    EncryptionKeys,
    RunResult,
    ToolOptions,
    connect,
    decide,
    start_run,
    wait_for_approvals,
)
from durable_codemode._encryption import ENCRYPTION_KEYS_ENV, KEY_ID_METADATA, is_encrypted
from durable_codemode._history_fetch import fetch_chain, histories_from_json, histories_to_json
from durable_codemode._history_payloads import payload_fields
from durable_codemode.client._devserver import temporal_cli_path
from durable_codemode.debugging import list_runs, render_trace, replay_histories, trace_run
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model

from ._forked import run_codemode

M = "okapi-5120"
"""The marker every piece of run content carries."""

PROGRAM = f"""
row = await lookup(key='{M}-argument')
print('{M}-printed')
try:
    await broken(why='x')
except Exception as e:
    caught = 'caught'
done = await transfer(cents=5, memo='{M}-transfer')
[row, done, caught]
"""


def marker_agent(name: str) -> CodeModeAgent:
    model = scripted_model(RunCode(PROGRAM), lambda m: f"{M}-answer {last_result(m)!r}")
    agent = Agent(model, name=name, instructions=f"Use run_code. ({M}-instructions)")

    @agent.tool_plain
    def lookup(key: str) -> str:
        """A database row."""
        return f"{M}-result for {key}"

    @agent.tool_plain
    def broken(why: str) -> str:
        """Always fails, with run content in its message."""
        raise ValueError(f"{M}-error")

    @agent.tool_plain
    def transfer(cents: int, memo: str) -> str:
        """Move money (a person approves)."""
        return f"moved {cents}"

    return CodeModeAgent(agent, tool_options={"transfer": ToolOptions(requires_approval=True)})


def new_keys(*ids: str) -> EncryptionKeys:
    return EncryptionKeys.parse(",".join(f"{i}:{EncryptionKeys.new_key()}" for i in ids))


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


def raw_bytes(history: WorkflowHistory) -> bytes:
    return b"".join(e.SerializeToString() for e in history.events)


def key_ids(event: HistoryEvent) -> set[str]:
    return {p.metadata[KEY_ID_METADATA].decode() for p in payload_fields(event) if is_encrypted(p)}


async def next_event(client: Client, workflow_id: str, wanted: Callable[[HistoryEvent], bool]) -> HistoryEvent:
    """The first event of the run's history for which `wanted` holds, waiting for the server to record it."""
    token = b""
    for _ in range(600):
        response = await client.workflow_service.get_workflow_execution_history(
            GetWorkflowExecutionHistoryRequest(namespace=client.namespace,
                                               execution=WorkflowExecution(workflow_id=workflow_id),
                                               next_page_token=token, wait_new_event=True),
            timeout=timedelta(seconds=5))
        for event in response.history.events:
            if wanted(event):
                return event
        token = response.next_page_token or token
    raise AssertionError(f"run {workflow_id!r} never recorded the event waited for")


async def test_with_encryption_the_server_holds_no_run_content_and_our_tools_read_it_with_the_key(
    env: WorkflowEnvironment,
) -> None:
    keys = new_keys("k1")
    client = await connect(address(env), encryption=keys)
    blind = await connect(address(env), encryption=False)
    name = f"enc{os.urandom(3).hex()}"
    task_queue = new_task_queue()
    async with running_worker(client, [marker_agent(name)], task_queue=task_queue, unsigned_approvals=True):
        handle = await start_run(client, name, f"pay the bill ({M}-prompt)", task_queue=task_queue)
        (pending,) = await wait_for_approvals(client, handle.id)
        assert pending.args == {"cents": 5, "memo": f"{M}-transfer"}  # the client with the key reads the run
        await decide(client, handle.id, pending.call_id, approved=True, note=f"{M}-note", approver="ana")
        result: RunResult = await handle.result()
    assert result.output.startswith(f"{M}-answer") and f"{M}-result for {M}-argument" in result.output
    await replay(handle)

    # The server holds no marker: not in any payload, summary, failure message or memo.
    stored = await blind.get_workflow_handle(handle.id).fetch_history()
    assert M.encode() not in raw_bytes(stored)
    assert raw_bytes(stored).count(M.encode()) == 0 < raw_bytes((await fetch_chain(client, handle.id))[0]).count(
        M.encode())  # (decrypted with the key, every piece is there)
    assert sum(1 for e in stored.events for p in payload_fields(e) if is_encrypted(p)) > 10
    assert {k for e in stored.events for k in key_ids(e)} == {"k1"}
    failed = [e for e in stored.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert failed and failed[0].activity_task_failed_event_attributes.failure.message == "Encoded failure"
    shown = subprocess.run([temporal_cli_path(), "workflow", "show", "--workflow-id", handle.id, "--address",
                            address(env), "--output", "json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(shown)["events"] and M not in shown
    described = await blind.get_workflow_handle(handle.id).describe()
    assert M not in repr(described.raw_description)

    # With the key: the trace shows the run's content, and the history exported encrypted replays and reads.
    trace = render_trace(await trace_run(client, handle.id))
    for piece in ("argument", "result", "printed", "transfer", "note"):
        assert f"{M}-{piece}" in trace, piece
    exported = histories_to_json(await fetch_chain(client, handle.id, decrypt=False))
    assert M not in exported
    report = await replay_histories(histories_from_json(exported, encryption=keys))
    assert report.ok


async def test_a_run_started_under_key_a_finishes_under_b_on_a_worker_holding_both(env: WorkflowEnvironment) -> None:
    a = new_keys("A")
    b_then_a = EncryptionKeys(new_keys("B").keys + a.keys)
    client_a = await connect(address(env), encryption=a)
    name = f"rot{os.urandom(3).hex()}"
    task_queue = new_task_queue()
    async with running_worker(client_a, [marker_agent(name)], task_queue=task_queue, unsigned_approvals=True):
        handle = await start_run(client_a, name, "pay", task_queue=task_queue)
        (pending,) = await wait_for_approvals(client_a, handle.id)
    # The worker with key A is gone; one holding B (which encrypts) and A (which still decrypts) takes over.
    async with running_worker(client_a, [marker_agent(name)], task_queue=task_queue, unsigned_approvals=True,
                              encryption=b_then_a):
        client_b = await connect(address(env), encryption=b_then_a)
        await decide(client_b, handle.id, pending.call_id, approved=True, approver="ana")
        result = await client_b.get_workflow_handle_for(CodeModeRunWorkflow.run, handle.id).result()
    assert f"{M}-answer" in result.output
    stored = await (await connect(address(env), encryption=False)).get_workflow_handle(handle.id).fetch_history()
    assert key_ids(stored.events[0]) == {"A"}  # the run's input, from before the rotation
    assert key_ids(stored.events[-1]) == {"B"}  # its result, after
    await replay(client_b.get_workflow_handle_for(CodeModeRunWorkflow.run, handle.id))


@pytest.mark.slow
async def test_a_worker_missing_the_key_fails_only_the_task_and_the_run_waits_for_one_that_has_it(
    env: WorkflowEnvironment,
) -> None:
    a, b = new_keys("A"), new_keys("B")
    client_a = await connect(address(env), encryption=a)
    name = f"miss{os.urandom(3).hex()}"
    task_queue = new_task_queue()
    async with running_worker(client_a, [marker_agent(name)], task_queue=task_queue, unsigned_approvals=True,
                              encryption=b):
        handle = await start_run(client_a, name, "pay", task_queue=task_queue)
        failed = await next_event(client_a, handle.id,
                                  lambda e: e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    # The task failure is written by the worker with key B (encrypted with B, like every failure message): an
    # operator holding both keys reads it, and it names the key the worker lacked and the run.
    reader = await connect(address(env), encryption=EncryptionKeys(b.keys + a.keys))
    history = await fetch_chain(reader, handle.id)
    (read,) = [e for e in history[0].events if e.event_id == failed.event_id]
    message = read.workflow_task_failed_event_attributes.failure.message
    assert "encrypted with key 'A'" in message and f"run {handle.id!r}" in message, message
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING  # the run waits, not failed
    # A worker with the key takes the retried task: the run goes on and completes.
    async with running_worker(client_a, [marker_agent(name)], task_queue=task_queue, unsigned_approvals=True):
        (pending,) = await wait_for_approvals(client_a, handle.id, timeout=timedelta(minutes=2))
        await decide(client_a, handle.id, pending.call_id, approved=True, approver="ana")
        result = await asyncio.wait_for(handle.result(), 60)
    assert f"{M}-answer" in result.output
    await replay(handle)


async def codemode(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """`codemode ARGS` in a child process with exactly `env` (`tests/_forked.py`)."""
    return await run_codemode(args, env=env, timeout=120)


async def test_codemode_commands_export_encrypted_and_read_with_the_key_file(env: WorkflowEnvironment,
                                                                               tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(EncryptionKeys.new_entry("k7") + "\n")
    client = await connect(address(env), encryption=key_file)
    name = f"cli{os.urandom(3).hex()}"
    agent = Agent(scripted_model(RunCode(f"await lookup(key='{M}-argument')"), lambda m: "done"), name=name)

    @agent.tool_plain
    def lookup(key: str) -> str:
        """A database row."""
        return f"{M}-result"

    task_queue = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent)], task_queue=task_queue):
        handle = await start_run(client, name, "go", task_queue=task_queue)
        await handle.result()
    base = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", ENCRYPTION_KEYS_ENV)}
    keyed = {**base, "TEMPORAL_ADDRESS": address(env), ENCRYPTION_KEYS_ENV: str(key_file)}
    exported = tmp_path / "run.json"
    rc, _, err = await codemode("history", handle.id, "-o", str(exported), env=keyed)
    assert rc == 0, err
    assert M not in exported.read_text() and "k7" in exported.read_text()  # exported as stored: encrypted
    rc, out, err = await codemode("trace", "--history", str(exported), env=keyed)
    assert rc == 0 and f"{M}-argument" in out and f"{M}-result" in out, err
    rc, out, err = await codemode("trace", "--history", str(exported), env=base)
    assert rc == 2 and f"run {handle.id!r} is encrypted (key 'k7')" in err and ENCRYPTION_KEYS_ENV in err, err
    rc, out, err = await codemode("history", handle.id, "--decrypt", env=keyed)
    assert rc == 0 and f"{M}-result" in base64_texts(out), err


def base64_texts(history_json: str) -> str:
    """Every payload's data of a history file, decoded: plaintext payloads are base64 in Temporal's JSON."""
    found = []
    for event in json.loads(history_json)["events"]:
        stack: list[object] = [event]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if isinstance(item.get("data"), str) and "metadata" in item:
                    found.append(base64.b64decode(item["data"]).decode(errors="replace"))
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return "\n".join(found)


async def test_a_client_without_the_key_still_lists_every_run(env: WorkflowEnvironment) -> None:
    """An encrypted run in the namespace does not take the runs list down for a client without its key.

    Its memo cannot be read there (the page's runs list answered 500 for every run, found when the suite first ran
    encrypted and plain tests on one server); its agent and state come from the search attributes, in plaintext.
    """
    client = await connect(address(env), encryption=new_keys("k3"))
    name = f"listed{os.urandom(3).hex()}"
    agent = CodeModeAgent(Agent(scripted_model("done"), name=name))
    task_queue = new_task_queue()
    async with running_worker(client, [agent], task_queue=task_queue):
        handle = await start_run(client, name, "go", task_queue=task_queue)
        await handle.result()
    blind = await connect(address(env), encryption=False)
    listed = await list_runs(blind, agent=name)
    assert [(s.workflow_id, s.agent, s.state) for s in listed] == [(handle.id, name, "completed")]
    assert handle.id in [s.workflow_id for s in await list_runs(blind, limit=50)]  # unfiltered, too
    await replay(handle)
