"""Recorded behaviour versions: runs of every version this release supports replay as they ran; older ones are refused.

Every run records `AgentSpec.behavior_version` when it starts. A run recorded with a version this release does not
replay (0.1.0's runs record none: version 0) is refused by a workflow-task failure that names the release that
replays it, so the run is never failed: it waits, unchanged, for a worker of that release or for someone to end it.

`tests/histories/behavior_version_<N>.json` is a run of behaviour version N, recorded once by
`python -m tests.test_behavior_version` with the release that started such runs (a program that gathers, draws
random numbers, reads the clock, sleeps, waits for a person's approval and reuses its names in a second snippet;
from version 2 on, also calls a tool whose approval rule gates one call and lets another through); each must
replay as long as its version is supported. `behavior_version_1_rule.json` is a version-1 run whose approval rule
gated a call (replayed with its rule in `test_deploy_changes`). Version 2 also ends with the status the run's code
ends it with. The three `before_*.json` histories were recorded by 0.1.0.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.usage import RunUsage
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.worker import Replayer

from durable_codemode import CodeModeAgent, CodeModeRunWorkflow, ToolOptions, UnsupportedBehaviorVersionError
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode.shared._names import WORKFLOW_TYPE
from durable_codemode.shared._types import BEHAVIOR_VERSION, OLDEST_BEHAVIOR_VERSION, Continuation, RunInput
from durable_codemode.testing import RunCode, last_result, new_task_queue, running_worker, scripted_model
from durable_codemode.worker._describe import describe_run
from durable_codemode.worker._worker import workflow_runner

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)

HISTORIES = Path(__file__).parent / "histories"
CURRENT = HISTORIES / f"behavior_version_{BEHAVIOR_VERSION}.json"
SUPPORTED = [HISTORIES / f"behavior_version_{v}.json" for v in range(OLDEST_BEHAVIOR_VERSION, BEHAVIOR_VERSION + 1)]
RECORDED_BY_0_1 = ["before_parking.json", "before_sandbox_guards.json", "before_bounded_decisions.json"]

PROGRAM = """
import asyncio, random, time
from datetime import datetime
picks = [random.randint(0, 9) for _ in range(3)]
values = await asyncio.gather(*(get(i=p) for p in picks))
started = datetime.now()
time.sleep(1)
refund = await refund_order(order='A', cents=sum(values))
notes = [await note(text=t) for t in ['ok', 'a longer note']]
[picks, values, refund, notes, (datetime.now() - started).total_seconds()]
"""


def agent() -> CodeModeAgent:
    """The agent of the recorded run (a replay needs only the history; this is for recording it again)."""
    model = scripted_model(RunCode(PROGRAM), RunCode("len(values) + len(picks)"), lambda m: f"done: {last_result(m)}")
    inner = Agent(model, name="behavior-v1")

    @inner.tool_plain
    def get(i: int) -> int:
        """Item i's price in cents."""
        return 10 * i

    @inner.tool_plain
    def refund_order(order: str, cents: int) -> str:
        """Refund `cents` on `order` (a person approves it)."""
        return f"refunded {cents} on {order}"

    @inner.tool_plain
    def note(text: str) -> str:
        """Write a note (a person reads a long one first)."""
        return f"noted {text}"

    return CodeModeAgent(inner, tool_options={"refund_order": ToolOptions(requires_approval=True),
                                              "note": ToolOptions(approval_rule=lambda args: len(args["text"]) > 5)})


async def _replayed(name: str, text: str) -> BaseException | None:
    replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=DATA_CONVERTER,
                        workflow_runner=workflow_runner(), debug_mode=True)
    result = await replayer.replay_workflow(WorkflowHistory.from_json(name, text), raise_on_replay_failure=False)
    return result.replay_failure


@pytest.mark.parametrize("recorded", SUPPORTED, ids=lambda p: p.stem)
async def test_a_run_of_each_supported_behaviour_version_replays_as_it_ran(recorded: Path) -> None:
    assert await _replayed(recorded.stem, recorded.read_text()) is None


def test_a_run_of_version_2_records_how_it_ended_and_one_of_version_1_does_not() -> None:
    # Version 2's end: the status the run's code ends it with, in the task that ends it (version 1 leaves it).
    for version, last in ((1, "running"), (2, "completed")):
        events = json.loads((HISTORIES / f"behavior_version_{version}.json").read_text())["events"]
        upserts = [e["upsertWorkflowSearchAttributesEventAttributes"]["searchAttributes"]["indexedFields"]
                   for e in events if "upsertWorkflowSearchAttributesEventAttributes" in e]
        statuses = [json.loads(base64.b64decode(fields["CodemodeStatus"]["data"]))
                    for fields in upserts if "CodemodeStatus" in fields]  # a rule's marker upserts another
        assert statuses[-1] == last, (version, statuses)


@pytest.mark.parametrize("recorded", RECORDED_BY_0_1)
async def test_a_run_recorded_by_0_1_is_refused_naming_the_release_that_replays_it(recorded: str) -> None:
    failure = await _replayed(recorded, (HISTORIES / recorded).read_text())
    assert failure is not None
    assert "behaviour version 0, which durable-codemode 0.1.0 replays" in str(failure)
    assert "pip install 'durable-codemode==0.1.0'" in str(failure)


async def test_a_live_run_of_an_older_version_waits_and_its_task_failure_says_why(client: Client) -> None:
    # As a worker of this release meets a run 0.1.0 started: its spec records no behaviour version.
    durable = agent()
    spec = await describe_run(durable)
    spec.behavior_version = 0
    tq = new_task_queue()
    run_id = f"old-run-{os.urandom(3).hex()}"
    async with running_worker(client, [durable], task_queue=tq):
        handle = await client.start_workflow(
            WORKFLOW_TYPE, RunInput(agent=durable.name, prompt="go", continuation=Continuation(
                spec=spec, usage=RunUsage(), turns=[], runs=1)),
            id=run_id, task_queue=tq, result_type=None)
        reason = None
        deadline = asyncio.get_running_loop().time() + 60
        while reason is None and asyncio.get_running_loop().time() < deadline:  # wait for the failed task's event
            events = [e async for e in handle.fetch_history_events()]
            failed = [e for e in events if e.HasField("workflow_task_failed_event_attributes")]
            if failed:
                reason = failed[0].workflow_task_failed_event_attributes.failure.message
            else:
                await asyncio.sleep(0.05)
        assert reason is not None and "behaviour version 0, which durable-codemode 0.1.0 replays" in reason
        assert f"temporal workflow terminate --workflow-id '{run_id}'" in reason
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING  # refused, never failed
        await handle.terminate("refused by behaviour version, as the test expects")


def test_the_refusal_of_a_run_newer_than_this_release_says_to_upgrade() -> None:
    error = UnsupportedBehaviorVersionError("r-9", BEHAVIOR_VERSION + 1, None, 1, BEHAVIOR_VERSION)
    assert "a newer release of durable-codemode replays" in str(error)
    assert str(error).endswith("upgrade the workers of its task queue.")


async def _record() -> None:
    """Record `CURRENT`: a run of `agent()` on an embedded dev server, its gated calls approved by `ana`."""
    from durable_codemode import decide, pending_approvals, start_dev_server, start_run

    async with await start_dev_server(banner="off") as env:
        client, tq = env.client, new_task_queue()
        async with running_worker(client, [agent()], task_queue=tq, unsigned_approvals=True):
            handle = await start_run(client, "behavior-v1", "go", task_queue=tq)
            result = asyncio.ensure_future(handle.result())
            while not result.done():  # the refund, then the long note
                for call in await pending_approvals(client, handle.id):
                    await decide(client, handle.id, call.call_id, approved=True, approver="ana")
                await asyncio.sleep(0.1)
            print((await result).output)
        history = await handle.fetch_history()
    CURRENT.write_text(history.to_json())


if __name__ == "__main__":
    asyncio.run(_record())
