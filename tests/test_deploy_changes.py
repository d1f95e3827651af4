"""A run paused across a deploy that changes its agent: it goes on with what it recorded, or stops naming the change.

Each test starts a run on a worker of the old code, lets it pause for a person, stops that worker and starts one
of the new code (the same agent name, changed), decides the call, and watches what the run does on the new worker.
The new worker holds no cached run, so it rebuilds the run from its history first, as after any deploy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory

from durable_codemode import (
    ApproverKeyring,
    ApproverPolicy,
    CodeModeAgent,
    SnippetLimits,
    ToolOptions,
    create_worker,
    decide,
    generate_approver_key,
    start_run,
    wait_for_approvals,
)
from durable_codemode.debugging import list_runs, register_agents, render_replay, replay_histories
from durable_codemode.shared._names import MODEL_REQUEST_ACTIVITY
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.worker._waiting_runs import check_waiting_runs

from . import _rules_worker

HISTORIES = Path(__file__).parent / "histories"


class City(BaseModel):
    city: str


class Town(BaseModel):
    town: str


class CityAndCountry(BaseModel):
    city: str
    country: str | None = None


Seen = list[AgentInfo]


def model(seen: Seen) -> FunctionModel:
    """Turn 0: a program whose refund waits for a person. Turn 1: the answer, in the shape the request offers.

    As a real model would: with an output tool offered it calls the first one (`{"city": "Paris"}`), else it answers
    in text. Every request's `AgentInfo` is kept in `seen`, to check what the run offered.
    """
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        if sum(isinstance(m, ModelResponse) for m in messages) == 0:
            return ModelResponse(parts=[ToolCallPart("run_code", {"code": "await refund(order='A', cents=5)"},
                                                     tool_call_id="call_0")])
        if info.output_tools:
            return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"city": "Paris"},
                                                     tool_call_id=f"out_{len(messages)}")])
        return ModelResponse(parts=[TextPart("Paris")])

    return FunctionModel(respond)


def agent(name: str, seen: Seen, output_type: Any = str) -> CodeModeAgent:
    inner: Agent[None, Any] = Agent(model(seen), name=name, output_type=output_type)

    @inner.tool_plain
    def refund(order: str, cents: int) -> str:
        """Refund `cents` on `order`."""
        return f"refunded {cents} on {order}"

    return CodeModeAgent(inner, tool_options={"refund": ToolOptions(requires_approval=True)},
                         limits=SnippetLimits(max_model_requests=8))


async def across_a_deploy(client: Client, old: CodeModeAgent, new: CodeModeAgent) -> Any:
    """Start a run on `old`'s worker; once it waits for a person, serve `new` instead and approve the call.

    The run's handle, for its result.
    """
    tq = new_task_queue("deploy")
    async with running_worker(client, [old], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, old.name, "Where?", task_queue=tq)
        (pending,) = await wait_for_approvals(client, handle.id)
    async with running_worker(client, [new], task_queue=tq, unsigned_approvals=True):
        await decide(client, handle.id, pending.call_id, approved=True, approver="ana")
        with contextlib.suppress(WorkflowFailureError):  # each test reads the result (or failure) itself
            await handle.result()
    return handle


async def model_requests(handle: Any) -> int:
    history = await handle.fetch_history()
    return sum(1 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
               and e.activity_task_scheduled_event_attributes.activity_type.name == MODEL_REQUEST_ACTIVITY)


def output_tools(info: AgentInfo) -> list[tuple[str, list[str]]]:
    return [(t.name, sorted(t.parameters_json_schema.get("properties", {}))) for t in info.output_tools]


async def test_a_run_that_recorded_text_output_is_offered_no_output_tool_of_the_new_agent(client: Client) -> None:
    # The leak: an agent whose output changed from `str` to a model. The old run must be offered text only (it
    # recorded no output tool), and it ends with its text answer; the new agent's `final_result` used to be offered,
    # the model called it, the run answered "Unknown tool 'final_result'" every turn and failed at its request limit.
    name = f"leak-{os.urandom(3).hex()}"
    old_seen: Seen = []
    new_seen: Seen = []
    handle = await across_a_deploy(client, agent(name, old_seen), agent(name, new_seen, output_type=City))
    result = await handle.result()
    assert result.output == "Paris"
    assert [output_tools(i) for i in new_seen] == [[]] and new_seen[-1].allow_text_output
    assert await model_requests(handle) == 2
    await replay(handle)


async def test_a_changed_output_that_rejects_the_answer_fails_the_run_naming_the_change(client: Client) -> None:
    # A renamed field: the run offers the model the output it recorded (`city`), and the new agent's (`town`) rejects
    # the answer. Asking the model again cannot help, so the run fails at once, saying what changed.
    name = f"renamed-{os.urandom(3).hex()}"
    old_seen: Seen = []
    new_seen: Seen = []
    handle = await across_a_deploy(client, agent(name, old_seen, output_type=City),
                                   agent(name, new_seen, output_type=Town))
    assert [output_tools(i) for i in new_seen] == [[("final_result", ["city"])]]  # the recorded schema, not `town`
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    message = getattr(cause, "message", str(cause))
    assert getattr(cause, "type", None) == "OutputChangedError", cause
    assert f"the output of agent {name!r} changed since this run started" in message
    assert "output tool final_result {city: string}" in message and "output tool final_result {town: string}" in message
    assert "town: Field required" in message, message
    assert await model_requests(handle) == 2  # once: not retried until the output retries or request limit ran out
    await replay(handle)


async def test_a_compatible_output_change_accepts_the_answer(client: Client) -> None:
    # An optional field added: the new output still takes the answer made for the recorded one.
    name = f"compatible-{os.urandom(3).hex()}"
    seen: Seen = []
    handle = await across_a_deploy(client, agent(name, [], output_type=City),
                                   agent(name, seen, output_type=CityAndCountry))
    result = await handle.result()
    assert result.output == {"city": "Paris", "country": None}
    assert [output_tools(i) for i in seen] == [[("final_result", ["city"])]]
    await replay(handle)


# -- approval rules: each verdict is recorded when its call is made ----------------------------------------------

TRANSFERS = """
import asyncio
first = await asyncio.gather(*(transfer(order=o, cents=c) for o, c in [('S', 500), ('L', 50_000)]))
later = await transfer(order='M', cents=20_000)
[first, later]
"""

RULES: dict[str, Callable[[dict[str, Any]], bool] | None] = {
    "old": lambda args: args["cents"] > 10_000,
    "raised": lambda args: args["cents"] > 100_000,  # M no longer needs approval
    "dropped": None,  # the new worker's agent has no rule: the run's later ruled call waits for a person
    "broken": lambda args: args["amount"] > 1,  # raises KeyError: the call waits for a person
}


def ruled_agent(name: str, rule: Callable[[dict[str, Any]], bool] | None, ran: list[str]) -> CodeModeAgent:
    inner = Agent(scripted_model(RunCode(TRANSFERS), lambda m: json.dumps(last_result(m))), name=name)

    @inner.tool_plain
    def transfer(order: str, cents: int) -> str:
        """Move `cents` for `order`."""
        ran.append(order)
        return f"moved {cents} for {order}"

    return CodeModeAgent(inner, tool_options={"transfer": ToolOptions(approval_rule=rule)} if rule else {})


def markers(history: Any, prefix: str) -> list[str]:
    found = []
    for event in history.events:
        attrs = event.marker_recorded_event_attributes
        if event.HasField("marker_recorded_event_attributes") and "patch-data" in attrs.details:
            patch = json.loads(attrs.details["patch-data"].payloads[0].data)["id"]
            if patch.startswith(prefix):
                found.append(patch)
    return found


@pytest.mark.parametrize("new_rule", ["raised", "dropped", "broken"])
async def test_a_rule_changed_while_a_run_waits_leaves_its_recorded_verdicts_alone(client: Client,
                                                                                   new_rule: str) -> None:
    # Before, the new worker asked the changed rule again while it replayed the run: the decision's workflow task
    # failed with TMPRL1100 (or "does not know it" for a dropped rule) and the run wedged until the old worker came
    # back. Now the verdict of L is read from the history; the rule as the new worker has it judges only M, made
    # after the deploy (a rule it lacks, or one that raises, sends M to a person). Every workflow task replays the
    # run (no cache), so each one reads the recorded verdicts.
    name = f"rules-{new_rule}-{os.urandom(3).hex()}"
    ran: list[str] = []
    tq = new_task_queue("deploy")
    async with running_worker(client, [ruled_agent(name, RULES["old"], ran)], task_queue=tq,
                              unsigned_approvals=True):
        handle = await start_run(client, name, "go", task_queue=tq)
        (waiting,) = await wait_for_approvals(client, handle.id)
        assert (waiting.call_id, waiting.args) == ("call_0.1", {"order": "L", "cents": 50_000})
    async with running_worker(client, [ruled_agent(name, RULES[new_rule], ran)], task_queue=tq,
                              unsigned_approvals=True, max_cached_workflows=0):
        await decide(client, handle.id, "call_0.1", approved=True, approver="ana")
        if new_rule != "raised":  # M waits for a person: the safe verdict when the rule is gone or raises
            (later,) = await wait_for_approvals(client, handle.id)
            assert later.args == {"order": "M", "cents": 20_000}
            await decide(client, handle.id, later.call_id, approved=True, approver="ana")
        result = await asyncio.wait_for(handle.result(), 60)
    assert json.loads(result.output)["result"] == [["moved 500 for S", "moved 50000 for L"], "moved 20000 for M"]
    assert sorted(ran) == ["L", "M", "S"]
    history = await handle.fetch_history()
    assert not [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
    gated = ["durable-codemode.approval.2.call_0.1"] + (["durable-codemode.approval.3.call_0.2"]
                                                         if new_rule != "raised" else [])
    assert markers(history, "durable-codemode.approval.") == gated  # only gated calls record a marker
    # The replay reads the verdicts: it needs no rule, so an agent of that name without one replays it too.
    register_agents([ruled_agent(name, None, [])])
    await replay(handle)


async def test_a_run_recorded_before_verdicts_were_recorded_replays_with_its_rule_and_names_a_changed_one() -> None:
    # `behavior_version_1_rule.json` (recorded by main before this release): refunds S and L, L over the rule's
    # 10,000 cents and approved. Such a run asks its rule on every replay: with the rule as it was it replays; a
    # changed rule is named as the cause, and a dropped one is told apart from a replay given no agents at all.
    text = (HISTORIES / "behavior_version_1_rule.json").read_text()

    async def replayed(rule: Callable[[dict[str, Any]], bool] | None) -> str:
        register_agents([ruled_refunds(rule)])
        return render_replay(await replay_histories([WorkflowHistory.from_json("v1-rule", text)]))

    assert ": ok, 2 model turns, 1 snippet, 2 nested calls" in await replayed(lambda a: a["cents"] > 10_000)
    raised = await replayed(lambda a: a["cents"] > 100_000)
    assert "DIVERGED" in raised and "the approval rule of refund() changed since this run started" in raised
    assert 'call call_0.1 refund(order="L", cents=50000) needs no approval by the rule given to this replay, but ' \
           "waited for a person when it ran" in raised
    lowered = await replayed(lambda a: a["cents"] > 1)
    assert 'call call_0.0 refund(order="S", cents=500) needs approval by the rule given to this replay, but ran ' \
           "without one when it ran" in lowered
    dropped = await replayed(None)
    assert "no approval rule for refund() any more" in dropped and "pass --worker MODULE" not in dropped


def ruled_refunds(rule: Callable[[dict[str, Any]], bool] | None) -> CodeModeAgent:
    """`tests/_rules_worker`'s agent with another rule (or none)."""
    inner = Agent(scripted_model(RunCode("unused"), "unused"), name=_rules_worker.NAME)

    @inner.tool_plain
    def refund(order: str, cents: int) -> str:
        """Refund an order."""
        return f"refunded {order}"

    return CodeModeAgent(inner, tool_options={"refund": ToolOptions(approval_rule=rule)} if rule else {})


# -- approver keys: a worker says at start which waiting runs it cannot approve --------------------------------------

KEYS = {name: generate_approver_key(name) for name in ("ana", "bob")}


def keyring(*names: str) -> dict[str, Any]:
    return {KEYS[n].key_id: KEYS[n].public_entry() for n in names}


async def test_a_worker_without_a_key_a_waiting_run_needs_says_so_when_it_starts(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    name = f"keys-{os.urandom(3).hex()}"
    inner = Agent(scripted_model(RunCode("await refund(order='A', cents=5)"), "done"), name=name)

    @inner.tool_plain
    def refund(order: str, cents: int) -> str:
        """Refund `cents` on `order`."""
        return "refunded"

    durable = CodeModeAgent(inner, tool_options={"refund": ToolOptions(
        requires_approval=True, approvers=ApproverPolicy(approvers=("ana", "bob"), required=2))})
    tq = new_task_queue("keys")
    async with running_worker(client, [durable], task_queue=tq, approver_keys=keyring("ana", "bob")):
        handle = await start_run(client, name, "go", task_queue=tq)
        await wait_for_approvals(client, handle.id)
    for _ in range(100):  # visibility is eventually consistent: the run is listed as waiting
        if [r for r in await list_runs(client, status="waiting", query=f"TaskQueue = '{tq}'") if r.workflow_id
                == handle.id]:
            break
        await asyncio.sleep(0.1)
    with caplog.at_level(logging.WARNING, logger="durable_codemode.worker"):
        worker = create_worker(client, [durable], task_queue=tq, approver_keys=keyring("ana"))
        async with worker:
            problems = await check_waiting_runs(client, tq, ApproverKeyring.of(keyring("ana")))
            deadline = asyncio.get_running_loop().time() + 30
            while "need approver keys this worker does not hold" not in caplog.text:  # the start's own check
                assert asyncio.get_running_loop().time() < deadline, caplog.text
                await asyncio.sleep(0.05)
    assert [(run, p.tool, p.missing, p.severity) for run, p in problems] == [(handle.id, "refund", ("bob",), "error")]
    assert f"run {handle.id} waits for approval, and this worker cannot approve it all: refund() calls need 2 " \
           "distinct approvals from ana, bob; no key is held for bob, so none can be approved" in caplog.text
    assert f"1 run(s) waiting on task queue {tq!r} need approver keys this worker does not hold (bob): " \
           f"{handle.id}" in caplog.text
    # A worker with both keys has nothing to say.
    assert await check_waiting_runs(client, tq, ApproverKeyring.of(keyring("ana", "bob"))) == []
    await handle.terminate("the test is done")
