"""Payloads over Temporal's 2 MiB limit: with a payload store, they live outside the history and still replay."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pydantic_ai import Agent
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    CodeModeUserError,
    LocalPayloadStore,
    PayloadNotFoundError,
    connect,
    data_converter,
    start_run,
)
from durable_codemode._storage import resolve_history
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.worker._worker import workflow_runner

MB = 1024 * 1024


def big_agent(name: str) -> CodeModeAgent:
    code = "report = await make_report(size=3_000_000)\nn = await measure(text=report + '!')\n[len(report), n]"
    agent = Agent(scripted_model(RunCode(code), lambda m: repr(last_result(m))), name=name,
                  instructions="Use run_code.")

    @agent.tool_plain
    def make_report(size: int) -> str:
        """A report of `size` characters (3 MB: over Temporal's 2 MiB payload limit)."""
        return "x" * size

    @agent.tool_plain
    def measure(text: str) -> int:
        """The length of `text` (its argument is over the payload limit too)."""
        return len(text)

    return CodeModeAgent(agent)


def history_bytes(history: WorkflowHistory) -> int:
    return sum(e.ByteSize() for e in history.events)


async def test_results_and_arguments_over_2_mib_go_to_the_store_and_replay_offline(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    store = LocalPayloadStore(tmp_path / "payloads")
    client = await connect(env.client.service_client.config.target_host, payload_store=store)
    name = f"big{os.urandom(3).hex()}"
    task_queue = new_task_queue()
    async with running_worker(client, [big_agent(name)], task_queue=task_queue):
        handle = await start_run(client, name, "go", task_queue=task_queue)
        result = await handle.result()
    assert eval(result.output) == {"result": [3_000_000, 3_000_001]}
    await replay(handle)

    history = await handle.fetch_history()
    assert history_bytes(history) < MB  # the 3 MB result and the 3 MB argument are references in the history
    assert len(list((tmp_path / "payloads").rglob("*"))) >= 2

    # Exported, then replayed elsewhere with the same store: offline, no server.
    exported = WorkflowHistory.from_json(history.workflow_id, history.to_json())
    replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=data_converter(store),
                        workflow_runner=workflow_runner())
    await replayer.replay_workflow(exported)
    # Or resolved into a self-contained history, which replays with no store at all.
    resolved = await resolve_history(WorkflowHistory.from_json(history.workflow_id, history.to_json()), [store])
    assert history_bytes(resolved) > 6_000_000
    await Replayer(workflows=[CodeModeRunWorkflow], data_converter=data_converter(None),
                   workflow_runner=workflow_runner()).replay_workflow(resolved)


async def test_a_reference_without_its_store_is_a_clear_error(env: WorkflowEnvironment, tmp_path: Path) -> None:
    store = LocalPayloadStore(tmp_path / "payloads")
    client = await connect(env.client.service_client.config.target_host, payload_store=store)
    name = f"big{os.urandom(3).hex()}"
    task_queue = new_task_queue()
    async with running_worker(client, [big_agent(name)], task_queue=task_queue):
        handle = await start_run(client, name, "go", task_queue=task_queue)
        await handle.result()
    history = await handle.fetch_history()
    with pytest.raises(CodeModeUserError, match="set CODEMODE_PAYLOAD_STORE to the directory"):
        await resolve_history(history, [])
    # The store's own directory, emptied: the missing payload is named, with what to do.
    shutil.rmtree(store.directory)
    store.directory.mkdir()
    with pytest.raises(PayloadNotFoundError, match=r"is not in the payload store .*: point CODEMODE_PAYLOAD_STORE"):
        await resolve_history(history, [store])
