"""A program that goes on in the compute activity answers the same as one that stays in workflow code.

Where a stretch of compute runs (in workflow code, or in the compute activity past its in-workflow budget) is
decided by the clock of a live worker: on a loaded machine more stretches go to the activity. Before behaviour
version 3, going there counted as a wait of the program: its clock moved on (a clock read after it saw the
activity's time) and its count of host calls without a wait (`_guards.MAX_ANSWERS_WITHOUT_WAIT`) started again, so
a busy-wait on the clock ended, or a loop that retries a refused call forever was never stopped, only on a loaded
machine. From version 3 only the program's own waits (a tool call it awaits, a sleep) move its clock and end its
count; runs of version 2 replay as they ran.

`tests/histories/compute_escalations_v<N>.json` is a run of `agent()` recorded with the release that started runs
of behaviour version N (`python -m tests.test_compute_not_a_wait`). Its limits (`TIGHT`) send every stretch of
real compute to the compute activity, so the recorded run escalates on any machine.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from durable_codemode import CodeModeAgent, CodeModeRunWorkflow, SnippetLimits, start_run
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode.shared._types import BEHAVIOR_VERSION
from durable_codemode.testing import RunCode, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.worker._worker import workflow_runner

HISTORIES = Path(__file__).parent / "histories"

TIGHT = SnippetLimits(max_turn_seconds=0.02, max_feed_seconds=0.05)
"""An in-workflow budget any real compute goes past: every heavy stretch goes to the compute activity."""

CLOCK = """
import time
t0 = time.time()
x = sum(range(2_000_000))
t1 = time.time()
[x, t1 - t0]
"""
"""Reads the clock around compute that goes to the compute activity: no time passes for the program."""

COUNT = """
import time
for _ in range(1_500):
    time.time()
x = sum(range(2_000_000))
for _ in range(1_500):
    time.time()
x
"""
"""3,000 clock reads without a wait, compute in the activity between them: stopped past 2,000 from version 3."""


def seen_by_model(messages: list[ModelMessage]) -> list[Any]:
    return [p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart)]


def agent(name: str = "compute-waits") -> CodeModeAgent:
    model = scripted_model(RunCode(CLOCK), RunCode(COUNT), lambda m: json.dumps(seen_by_model(m), default=repr))
    return CodeModeAgent(Agent(model, name=name), limits=TIGHT)


async def _replayed(name: str, text: str) -> BaseException | None:
    replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=DATA_CONVERTER,
                        workflow_runner=workflow_runner(), debug_mode=True)
    result = await replayer.replay_workflow(WorkflowHistory.from_json(name, text), raise_on_replay_failure=False)
    return result.replay_failure


def _escalations(history_json: str) -> int:
    events = json.loads(history_json)["events"]
    return sum(1 for e in events if e.get("activityTaskScheduledEventAttributes", {}).get("activityType", {})
               .get("name", "").endswith("compute"))


def _outputs(history_json: str) -> list[Any]:
    """What the model saw of each snippet, from the run's recorded result."""
    import base64

    events = json.loads(history_json)["events"]
    done = [e for e in events if "workflowExecutionCompletedEventAttributes" in e]
    payload = done[-1]["workflowExecutionCompletedEventAttributes"]["result"]["payloads"][0]
    return list(json.loads(json.loads(base64.b64decode(payload["data"]))["output"]))


def test_a_run_of_version_2_moved_its_clock_and_reset_its_count_in_the_compute_activity() -> None:
    recorded = (HISTORIES / "compute_escalations_v2.json").read_text()
    assert _escalations(recorded) >= 2
    clock, count = _outputs(recorded)
    assert clock["result"][1] > 0  # the activity's time passed for the program
    assert count == {"result": sum(range(2_000_000))}  # 3,000 reads, never stopped: the count began again


@pytest.mark.parametrize("version", [2, 3])
async def test_recorded_runs_replay_as_they_ran(version: int) -> None:
    recorded = HISTORIES / f"compute_escalations_v{version}.json"
    assert await _replayed(recorded.stem, recorded.read_text()) is None


async def test_compute_in_the_activity_is_no_wait_of_the_program(client: Client) -> None:
    tq = new_task_queue()
    async with running_worker(client, [agent()], task_queue=tq):
        handle = await start_run(client, "compute-waits", "go", task_queue=tq)
        result = await asyncio.wait_for(handle.result(), 120)
        history = (await handle.fetch_history()).to_json()
        await replay(handle)
    assert _escalations(history) >= 2, "TIGHT limits must send the compute to the activity"
    clock, count = json.loads(result.output)
    assert clock["result"] == [sum(range(2_000_000)), 0.0]  # no time passed for the program
    assert "host calls in a row" in count["error"], count  # stopped, as it is where nothing escalates
    assert BEHAVIOR_VERSION >= 3


async def _record() -> None:
    from durable_codemode import start_dev_server

    async with await start_dev_server(banner="off") as env:
        tq = new_task_queue()
        async with running_worker(env.client, [agent()], task_queue=tq):
            handle = await start_run(env.client, "compute-waits", "go", task_queue=tq)
            print((await handle.result()).output)
        history = await handle.fetch_history()
    (HISTORIES / f"compute_escalations_v{BEHAVIOR_VERSION}.json").write_text(history.to_json())


if __name__ == "__main__":
    asyncio.run(_record())


def test_the_compute_budget_counts_from_the_activation_start() -> None:
    """The worker's runner tells workflow code, on the activation's thread, when the activation began."""
    import threading
    import time

    from temporalio.worker import UnsandboxedWorkflowRunner

    from durable_codemode.worker._task_timing import TaskTimingRunner, _TimedInstance
    from durable_codemode.workflow._task_clock import activation_began, task_began

    later = time.monotonic()
    assert task_began(later) <= later
    seen: list[float] = []

    def on_another_thread() -> None:  # nothing recorded there yet: the driver's own start
        seen.append(task_began(later))

    thread = threading.Thread(target=on_another_thread)
    thread.start()
    thread.join()
    assert seen == [later]
    activation_began(later - 1.5)  # an activation that began 1.5 s before the driver took the program up
    assert task_began(later) == later - 1.5
    assert task_began(later - 2) == later - 2  # never later than the driver's own start

    class Probe:
        def activate(self, act: Any) -> Any:
            return task_began(float("inf"))

    instance = _TimedInstance(Probe())  # type: ignore[arg-type]
    before = time.monotonic()
    assert before <= instance.activate(None) <= time.monotonic()  # type: ignore[arg-type]
    assert isinstance(TaskTimingRunner(UnsandboxedWorkflowRunner()), TaskTimingRunner)


async def test_create_worker_times_its_activations(client: Client) -> None:
    from durable_codemode import create_worker
    from durable_codemode.worker._task_timing import TaskTimingRunner

    worker = create_worker(client, [agent("timed-worker")], task_queue=new_task_queue())
    assert isinstance(worker.config()["workflow_runner"], TaskTimingRunner)
