"""Approvals inside programs: a gated call pauses the program until a decision arrives by update or signal."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai import Agent
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    RunResult,
    ToolOptions,
    decide,
    decide_all,
    pending_approvals,
    start_run,
)
from durable_codemode.shared._approvals import ApprovalDecision
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.worker._pool import POOL


def refunds_agent(name: str, code: str, refunds: list[tuple[str, int]], *, timeout: timedelta | None = None,
                  ) -> CodeModeAgent:
    agent = Agent(scripted_model(RunCode(code), lambda m: repr(last_result(m))), name=name)

    @agent.tool_plain(requires_approval=True)
    def refund(order: str, cents: int) -> str:
        """Refund an order (a person must approve each refund)."""
        refunds.append((order, cents))
        return f"refunded {cents} on {order}"

    @agent.tool_plain
    def lookup(order: str) -> int:
        """The order's total in cents."""
        return 1234

    return CodeModeAgent(agent, tool_options={"refund": ToolOptions(requires_approval=True,
                                                                    approval_timeout=timeout)})


async def wait_pending(handle: WorkflowHandle[Any, Any], n: int = 1) -> list[Any]:
    for _ in range(600):  # up to 30 s: the machine is shared, and a hundred runs start at once
        pending = await handle.query(CodeModeRunWorkflow.pending_approvals)
        if len(pending) >= n:
            return pending
        await asyncio.sleep(0.05)
    raise AssertionError(f"never saw {n} pending approval(s)")


async def test_pause_query_approve_continue(client: Client) -> None:
    refunds: list[tuple[str, int]] = []
    code = "total = await lookup(order='A1')\nprint('looked up')\nr = await refund(order='A1', cents=total)\n[total, r]"
    tq = new_task_queue()
    async with running_worker(client, [refunds_agent("refunds", code, refunds)], task_queue=tq,
                              unsigned_approvals=True):
        handle = await start_run(client, "refunds", "refund A1", task_queue=tq)
        (pending,) = await wait_pending(handle)
        assert (pending.call_id, pending.tool, pending.args, pending.line) == ("call_0.1", "refund",
                                                                               {"order": "A1", "cents": 1234}, 3)
        assert "await refund(" in pending.code
        assert refunds == []  # the call waits: nothing ran
        assert POOL.live_sessions() == 0  # the paused program holds no sandbox process
        # The Temporal UI shows the run's current details: what it waits for.
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert metadata.current_details.splitlines() == [
            "waiting for approval of 1 call(s): call_0.1 refund",
            "model turn 0: snippet call_0 waiting: 0 calls in flight, 1 waiting for approval, 1 done"]
        record = await decide(client, handle.id, "call_0.1", approved=True, note="ok", approver="ana")
        assert record.approved and record.approver == "ana"
        result: RunResult = await handle.result()
    seen = eval(result.output)
    assert seen == {"result": [1234, "refunded 1234 on A1"], "printed": "looked up\n"}  # nothing ran twice
    assert refunds == [("A1", 1234)]
    assert [(a.call_id, a.approved, a.approver, a.note, a.via) for a in result.approvals] == [
        ("call_0.1", True, "ana", "ok", "update")]
    await replay(handle)


async def test_deny_is_a_permission_error_the_program_can_catch(client: Client) -> None:
    refunds: list[tuple[str, int]] = []
    code = """
try:
    await refund(order='B2', cents=500)
    outcome = 'refunded'
except PermissionError as e:
    outcome = f'denied: {e}'
outcome
"""
    tq = new_task_queue()
    async with running_worker(client, [refunds_agent("refunds2", code, refunds)], task_queue=tq,
                              unsigned_approvals=True):
        handle = await start_run(client, "refunds2", "refund B2", task_queue=tq)
        await wait_pending(handle)
        await handle.signal(CodeModeRunWorkflow.deny, ApprovalDecision(call_id="call_0.0", note="too late",
                                                                       approver="bo"))
        result = await handle.result()
    assert eval(result.output) == {"result": "denied: refund() was denied by bo: too late"}
    assert refunds == []
    assert result.approvals[0].via == "signal" and not result.approvals[0].approved
    assert result.nested_calls[0].status == "denied"
    await replay(handle)


async def test_uncaught_denial_reaches_the_model(client: Client) -> None:
    tq = new_task_queue()
    async with running_worker(client, [refunds_agent("refunds3", "await refund(order='C', cents=1)", [])],
                              task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, "refunds3", "go", task_queue=tq)
        await wait_pending(handle)
        await decide(client, handle.id, "call_0.0", approved=False)
        result = await handle.result()
    assert "PermissionError: refund() was denied by an approver" in result.output
    await replay(handle)


async def test_bad_decisions_are_errors_to_the_approver_and_harmless(client: Client) -> None:
    refunds: list[tuple[str, int]] = []
    code = "import asyncio\nawait asyncio.gather(refund(order='D', cents=1), refund(order='E', cents=2))"
    tq = new_task_queue()
    async with running_worker(client, [refunds_agent("refunds4", code, refunds)], task_queue=tq,
                              unsigned_approvals=True):
        handle = await start_run(client, "refunds4", "go", task_queue=tq)
        assert len(await wait_pending(handle, 2)) == 2  # a gather with two gated calls: two pending at once
        with pytest.raises(WorkflowUpdateFailedError) as unknown:
            await decide(client, handle.id, "call_9.9", approved=True)
        assert "no call 'call_9.9' is waiting" in str(unknown.value.cause)
        await handle.signal(CodeModeRunWorkflow.approve, ApprovalDecision(call_id="nope"))  # ignored, recorded
        await decide(client, handle.id, "call_0.0", approved=True)
        await decide(client, handle.id, "call_0.0", approved=True)  # the same update again: deduplicated
        with pytest.raises(WorkflowUpdateFailedError) as again:
            await handle.execute_update(CodeModeRunWorkflow.decide, ApprovalDecision(call_id="call_0.0"))
        assert "already decided" in str(again.value.cause)
        assert [p.call_id for p in await pending_approvals(client, handle.id)] == ["call_0.1"]
        records = await decide_all(client, handle.id, approved=True, approver="batch")
        assert [r.call_id for r in records] == ["call_0.1"]
        result = await handle.result()
    assert sorted(refunds) == [("D", 1), ("E", 2)]
    assert [a.call_id for a in result.approvals] == ["call_0.0", "call_0.1"]
    await replay(handle)


async def test_approval_timeout_denies_with_a_note(client: Client) -> None:
    code = "try:\n    await refund(order='F', cents=1)\nexcept PermissionError as e:\n    r = str(e)\nr"
    tq = new_task_queue()
    async with running_worker(client, [refunds_agent("refunds5", code, [], timeout=timedelta(seconds=1))],
                              task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, "refunds5", "go", task_queue=tq)
        result = await handle.result()
    assert "denied by the approval timeout: no decision within 0:00:01" in result.output
    assert result.approvals[0].via == "timeout"
    await replay(handle)


async def test_cli_lists_approves_and_rejects_unknown_calls(client: Client) -> None:
    from .test_demo import _codemode

    refunds: list[tuple[str, int]] = []
    code = "import asyncio\nawait asyncio.gather(refund(order='G', cents=7), refund(order='H', cents=8))"
    address = client.service_client.config.target_host
    tq = new_task_queue()
    async with running_worker(client, [refunds_agent("refunds6", code, refunds)], task_queue=tq,
                              unsigned_approvals=True):
        handle = await start_run(client, "refunds6", "go", task_queue=tq)
        await wait_pending(handle, 2)
        rc, out, err = await _codemode(address, "approvals", handle.id)
        assert rc == 0, err
        assert "call_0.0" in out and "call_0.1" in out and "refund" in out
        assert "order='G'" in out
        rc, out, err = await _codemode(address, "approve", handle.id, "call_0.7")
        assert rc == 1 and "no call 'call_0.7' is waiting" in err
        rc, out, err = await _codemode(address, "approve", handle.id, "call_0.0", "--note", "fine")
        assert rc == 0 and "approved call_0.0" in out, err
        for _ in range(600):  # up to 30 s: the approved refund must run before the denial ends the program
            if refunds:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the approved refund never ran")  # not a silent go-ahead into a wrong result
        rc, out, err = await _codemode(address, "deny", handle.id, "--all", "--note", "duplicate order",
                                       "--approver", "cy")
        assert rc == 0 and "denied call_0.1" in out, err
        result = await handle.result()
    assert "refund() was denied by cy: duplicate order" in result.output  # the gather raised the denial
    assert refunds == [("G", 7)]
    assert [(a.call_id, a.approved) for a in result.approvals] == [("call_0.0", True), ("call_0.1", False)]
    await replay(handle)


async def test_worker_restarted_while_paused_then_approved(client: Client) -> None:
    refunds: list[tuple[str, int]] = []
    code = "x = await lookup(order='J')\nr = await refund(order='J', cents=x)\n[x, r]"
    agent = refunds_agent("refunds7", code, refunds)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, "refunds7", "go", task_queue=tq)
        await wait_pending(handle)
    assert POOL.live_sessions() == 0
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        # The new worker rebuilds the paused program by replay, and the decision continues it from the call.
        await decide(client, handle.id, "call_0.1", approved=True)
        result = await handle.result()
    assert eval(result.output) == {"result": [1234, "refunded 1234 on J"]}
    assert refunds == [("J", 1234)]
    await replay(handle)


@pytest.mark.slow
@pytest.mark.xdist_group("cpu-heavy")  # one at a time (tests/conftest.py)
@pytest.mark.timeout(240)
async def test_a_hundred_paused_runs_hold_no_sandbox_process(client: Client) -> None:
    refunds: list[tuple[str, int]] = []
    code = "state = {'rows': list(range(1000))}\nawait refund(order='K', cents=len(state['rows']))"
    tq = new_task_queue()
    async with running_worker(client, [refunds_agent("refunds8", code, refunds)], task_queue=tq,
                              unsigned_approvals=True):
        handles = [await start_run(client, "refunds8", "go", task_queue=tq) for _ in range(100)]
        for handle in handles:
            await wait_pending(handle)
        assert POOL.live_sessions() == 0  # every paused program was dumped and its process given back
        for handle in handles:
            await decide(client, handle.id, "call_0.0", approved=True)
        results = await asyncio.gather(*(h.result() for h in handles))
    assert all(eval(r.output) == {"result": "refunded 1000 on K"} for r in results)
    assert len(refunds) == 100
    await replay(handles[0])


async def test_approval_rule_gates_only_the_calls_it_matches(client: Client) -> None:
    refunds: list[tuple[str, int]] = []
    agent = Agent(scripted_model(RunCode(
        "import asyncio\nawait asyncio.gather(*(refund(order=o, cents=c) for o, c in [('S', 500), ('L', 50000)]))"
    ), lambda m: repr(last_result(m))), name="rules")

    @agent.tool_plain
    def refund(order: str, cents: int) -> str:
        """Refund an order; refunds over $100 need a person's approval."""
        refunds.append((order, cents))
        return f"refunded {order}"

    rule = ToolOptions(approval_rule=lambda args: args["cents"] > 10_000)
    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent, tool_options={"refund": rule})], task_queue=tq,
                              unsigned_approvals=True):
        handle = await start_run(client, "rules", "go", task_queue=tq)
        (pending,) = await wait_pending(handle)
        assert pending.args == {"order": "L", "cents": 50000}
        assert refunds == [("S", 500)] or refunds == []  # the small one runs at once, without asking
        await decide(client, handle.id, pending.call_id, approved=True)
        result = await handle.result()
    assert sorted(refunds) == [("L", 50000), ("S", 500)]
    assert [a.args["order"] for a in result.approvals] == ["L"]
    await replay(handle)
