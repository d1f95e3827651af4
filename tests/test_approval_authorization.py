"""Approvals only the right people can give: approver policies, signed decisions, and a complete audit.

Every refused decision is rejected by the update validator before it enters the history: the run keeps waiting
and its history is unchanged. Every completed run's history replays, without the workers' keys.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from durable_codemode import (
    ApprovalSigner,
    ApproverPolicy,
    CodeModeAgent,
    CodeModeRunWorkflow,
    ToolOptions,
    decide,
    generate_approver_key,
    pending_approvals,
    rejected_decisions,
    start_run,
    wait_for_approvals,
)
from durable_codemode.apps.activities.cart import CartStore
from durable_codemode.apps.workflows import cart
from durable_codemode.client._devserver import temporal_cli_path
from durable_codemode.debugging import trace_run
from durable_codemode.shared._approvals import ApprovalDecision
from durable_codemode.shared._names import call_fingerprint
from durable_codemode.shared._signing import legacy_signing_payload, signing_payload
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model

from .test_approvals import wait_pending
from .test_debugging import address, codemode

KEYS = {name: generate_approver_key(name) for name in ("ana", "bob", "carol", "mallory")}
KEYRING = {k.key_id: k.public_entry() for k in KEYS.values()}
DIRECTORY = {"finance": ["ana", "bob", "carol"]}

TWO_REFUNDS = ("import asyncio\n"
               "async def one(order):\n"
               "    try:\n"
               "        return await refund(order=order, cents=500)\n"
               "    except PermissionError as e:\n"
               "        return str(e)\n"
               "await asyncio.gather(one('A'), one('B'))")


def payments_agent(name: str, code: str, refunds: list[str], **policy: Any) -> CodeModeAgent:
    agent = Agent(scripted_model(RunCode(code), lambda m: json.dumps(last_result(m))), name=name)

    @agent.tool_plain
    def refund(order: str, cents: int) -> str:
        """Refund `cents` on `order`."""
        refunds.append(order)
        return f"refunded {order}"

    rule = ApproverPolicy(approvers=("group:finance",), **policy)
    return CodeModeAgent(agent, tool_options={"refund": ToolOptions(requires_approval=True, approvers=rule)})


def worker(client: Client, agent: CodeModeAgent, tq: str, **options: Any) -> Any:
    return running_worker(client, [agent], task_queue=tq, approver_keys=KEYRING, approver_directory=DIRECTORY,
                          **options)


async def events(handle: WorkflowHandle[Any, Any]) -> int:
    return len((await handle.fetch_history()).events)


async def refused(client: Client, handle: WorkflowHandle[Any, Any], decision: ApprovalDecision) -> str:
    """Send `decision` as is; it must be refused, leaving the history as it was: the refusal's message."""
    before = await events(handle)
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await handle.execute_update(CodeModeRunWorkflow.decide, decision, id=f"{decision.call_id}-{before}")
    assert await events(handle) == before, "a refused decision changed the history"
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ApprovalRejected"
    assert cause.non_retryable, "a refused decision must say it is not retryable"
    return cause.message


async def fingerprint(handle: WorkflowHandle[Any, Any], call_id: str) -> str:
    """What a signature covers of call `call_id` as run `handle` lists it: its tool and arguments."""
    listed = {p.call_id: p for p in await handle.query(CodeModeRunWorkflow.pending_approvals)}
    call = listed.get(call_id)
    return call_fingerprint(call.tool, call.args) if call is not None else ""


async def signed(client: Client, handle: WorkflowHandle[Any, Any], call_id: str, signer: ApprovalSigner, *,
                 approver: str | None = None, approved: bool = True, note: str | None = None,
                 expires_at: datetime | None = None) -> ApprovalDecision:
    """A decision signed by `signer`'s key, claiming to be `approver`'s (default: the key's own)."""
    who = approver or signer.approver
    expiry = expires_at or datetime.now(UTC) + timedelta(minutes=5)
    payload = signing_payload(namespace=client.namespace, run_id=handle.id, call_id=call_id, approved=approved,
                              note=note, approver=who, expires_at=expiry,
                              call_fingerprint=await fingerprint(handle, call_id))
    return ApprovalDecision(call_id=call_id, approved=approved, note=note, approver=who, key_id=signer.key_id,
                            signature=signer.sign(payload), expires_at=expiry)


def signed_over(client: Client, handle: WorkflowHandle[Any, Any], call_id: str, signer: ApprovalSigner,
                fingerprint: str | None) -> ApprovalDecision:
    """`signer`'s approval of `call_id`, signed over `fingerprint` (`None`: as clients of 0.2.0 signed, over none)."""
    expiry = datetime.now(UTC) + timedelta(minutes=5)
    fields: dict[str, Any] = {"namespace": client.namespace, "run_id": handle.id, "call_id": call_id, "approved": True,
                              "note": None, "approver": signer.approver, "expires_at": expiry}
    payload = (legacy_signing_payload(**fields) if fingerprint is None else
               signing_payload(**fields, call_fingerprint=fingerprint))
    return ApprovalDecision(call_id=call_id, approver=signer.approver, key_id=signer.key_id,
                            signature=signer.sign(payload), expires_at=expiry)


async def test_every_refused_decision_leaves_the_run_waiting_and_its_history_unchanged(client: Client) -> None:
    refunds: list[str] = []
    agent = payments_agent("authz-refused", TWO_REFUNDS, refunds, allow_self_approval=False)
    tq = new_task_queue()
    async with worker(client, agent, tq):
        handle = await start_run(client, agent, "refund A and B", task_queue=tq, started_by="carol")
        first, second = (p.call_id for p in await wait_pending(handle, 2))
        ana, mallory, carol = KEYS["ana"], KEYS["mallory"], KEYS["carol"]
        by_ana = await signed(client, handle, first, ana)
        reasons = {
            "unsigned": await refused(client, handle, ApprovalDecision(call_id=first, approver="ana")),
            "forged": await refused(client, handle, await signed(client, handle, first, mallory, approver="ana")),
            "tampered": await refused(client, handle, replace(by_ana, note="all fine")),
            "expired": await refused(client, handle, await signed(client, handle, first, ana,
                                                            expires_at=datetime.now(UTC) - timedelta(seconds=1))),
            "other call": await refused(client, handle, replace(await signed(client, handle, first, ana),
                                                                call_id=second)),
            "not an approver": await refused(client, handle, await signed(client, handle, first, mallory)),
            "self-approval": await refused(client, handle, await signed(client, handle, first, carol)),
            # Ana signed what a forged list showed her: the call's tool, other arguments. The run holds the real ones.
            "other arguments": await refused(client, handle, signed_over(client, handle, first, ana, call_fingerprint(
                "refund", {"order": "A", "cents": 1}))),
            # A client of 0.2.0 signed no arguments at all: refused by name, saying what to do.
            "old client": await refused(client, handle, signed_over(client, handle, first, ana, None)),
        }
        assert "for other arguments than the call holds" in reasons["other arguments"]
        assert "signed as clients of durable-codemode 0.2.0 and before signed" in reasons["old client"]
        assert "sign it again with this release's client" in reasons["old client"]
        assert "not signed" in reasons["unsigned"]
        assert "is 'mallory''s, but the decision says it is 'ana''s" in reasons["forged"]
        assert "does not match" in reasons["tampered"] and "does not match" in reasons["other call"]
        assert "expired" in reasons["expired"]
        assert "'mallory' may not decide refund() calls: they need one of group:finance" in reasons["not an approver"]
        assert "'carol' started this run and may not approve its own refund() calls" in reasons["self-approval"]
        assert {p.call_id for p in await pending_approvals(client, handle.id)} == {first, second}  # still waiting
        recent = await rejected_decisions(client, handle.id)
        assert [r.reason for r in recent] == list(reasons.values())
        # The right person's signed decisions settle both calls; nothing ran before.
        assert refunds == []
        for call_id in (first, second):
            record = await decide(client, handle.id, call_id, approved=True, signer=ana)
            assert record.signed and record.key_id == ana.key_id and record.policy == "one of group:finance, not " \
                "the run's starter"
        result = await handle.result()
    assert sorted(refunds) == ["A", "B"]
    assert all(r.signed for r in result.approvals)
    await replay(handle)


async def test_a_two_person_rule_needs_two_distinct_signed_approvals(client: Client, tmp_path: Path) -> None:
    refunds: list[str] = []
    agent = payments_agent("authz-two", "await refund(order='A', cents=90000)", refunds, required=2)
    tq = new_task_queue()
    bob_key = tmp_path / "bob.json"
    KEYS["bob"].save(bob_key)
    async with worker(client, agent, tq):
        handle = await start_run(client, agent, "refund A", task_queue=tq)
        (pending,) = await wait_pending(handle)
        first = await decide(client, handle.id, pending.call_id, approved=True, signer=KEYS["ana"])
        assert not first.settled and refunds == []  # counted, not enough: the call still waits
        live = (await trace_run(client, handle.id)).audit  # the audit of the open run, from its history
        assert live == [first]
        again = await refused(client, handle, await signed(client, handle, pending.call_id, KEYS["ana"], note="again"))
        assert "'ana' has already decided call" in again and "2 distinct approvals from group:finance" in again
        # The second approval comes from the command line, signed with bob's key file.
        rc, out, err = await codemode("approve", handle.id, pending.call_id, "--key", str(bob_key), "--note", "ok",
                                      address=address(client))
        assert rc == 0, err
        result = await handle.result()
    assert refunds == ["A"]
    assert [(r.approver, r.settled, r.signed) for r in result.approvals] == [("ana", False, True), ("bob", True, True)]
    assert result.approvals[1].note == "ok" and result.approvals[0].args_digest == result.approvals[1].args_digest
    # The audit of the closed run, read from its history, is the run's own trail, and goes on from the live one.
    closed = (await trace_run(client, handle.id)).audit
    assert closed == result.approvals and closed[:1] == live
    rc, out, err = await codemode("audit", handle.id, "--json", address=address(client))
    assert rc == 0, err
    trail = json.loads(out)["decisions"]
    assert [(d["approver"], d["key_id"], d["policy"]) for d in trail] == [
        ("ana", KEYS["ana"].key_id, "2 distinct approvals from group:finance"),
        ("bob", KEYS["bob"].key_id, "2 distinct approvals from group:finance")]
    await replay(handle)


@pytest.mark.parametrize("denial_wins", [True, False])
async def test_a_denial_settles_as_the_policy_says(client: Client, denial_wins: bool) -> None:
    refunds: list[str] = []
    agent = payments_agent(f"authz-deny-{denial_wins}", TWO_REFUNDS.replace(", one('B')", ""), refunds, required=2,
                           any_denial_wins=denial_wins)
    tq = new_task_queue()
    async with worker(client, agent, tq):
        handle = await start_run(client, agent, "refund A", task_queue=tq)
        (pending,) = await wait_pending(handle)
        denial = await decide(client, handle.id, pending.call_id, approved=False, note="no", signer=KEYS["bob"])
        if not denial_wins:  # one vote against: ana and carol could still approve
            assert not denial.settled
            denial = await decide(client, handle.id, pending.call_id, approved=False, signer=KEYS["carol"])
        assert denial.settled
        result = await handle.result()
    assert refunds == [] and "refund() was denied by" in result.output
    await replay(handle)


async def test_a_worker_that_could_check_no_decision_refuses_the_run_at_its_first_step(client: Client) -> None:
    agent = payments_agent("authz-nokeys", "await refund(order='A', cents=1)", [])
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, approver_directory=DIRECTORY):
        handle = await start_run(client, agent, "refund A", task_queue=tq)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "holds no approver keys" in str(failed.value.cause.cause)
    assert "unsigned_approvals=True" in str(failed.value.cause.cause)


async def test_unsigned_decisions_where_the_author_allows_them_are_recorded_as_unsigned(client: Client) -> None:
    refunds: list[str] = []
    agent = payments_agent("authz-unsigned", "await refund(order='A', cents=1)", refunds)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, approver_directory=DIRECTORY,
                              unsigned_approvals=True):
        handle = await start_run(client, agent, "refund A", task_queue=tq)
        (pending,) = await wait_pending(handle)
        # The policy still holds without signatures.
        outsider = await refused(client, handle, ApprovalDecision(call_id=pending.call_id, approver="mallory"))
        assert "'mallory' may not decide" in outsider
        record = await decide(client, handle.id, pending.call_id, approved=True, approver="ana")
        await handle.result()
    assert not record.signed and record.key_id is None
    rc, out, _ = await codemode("audit", handle.id, address=address(client))
    assert rc == 0 and "UNSIGNED" in out and "by ana" in out
    await replay(handle)


async def test_signals_cannot_carry_a_signed_decision(client: Client) -> None:
    refunds: list[str] = []
    agent = payments_agent("authz-signal", "await refund(order='A', cents=1)", refunds)
    tq = new_task_queue()
    async with worker(client, agent, tq):
        handle = await start_run(client, agent, "refund A", task_queue=tq)
        (pending,) = await wait_pending(handle)
        # A signal's check would run again on replay, where the keys may be gone: signed runs ignore them.
        await handle.signal(CodeModeRunWorkflow.approve, await signed(client, handle, pending.call_id, KEYS["ana"]))
        assert [p.call_id for p in await pending_approvals(client, handle.id)] == [pending.call_id]
        await decide(client, handle.id, pending.call_id, approved=True, signer=KEYS["ana"])
        await handle.result()
    assert refunds == ["A"]
    await replay(handle)


async def test_keygen_writes_a_private_key_and_prints_its_public_entry(tmp_path: Path) -> None:
    target = tmp_path / "dana.json"
    rc, out, err = await codemode("keygen", "dana", "-o", str(target), "--key-id", "dana-1")
    assert rc == 0, err
    entry = json.loads(out)
    assert list(entry) == ["dana-1"] and entry["dana-1"]["approver"] == "dana"
    assert target.stat().st_mode & 0o777 == 0o600
    signer = ApprovalSigner.load(target)
    assert signer.public_entry() == entry["dana-1"]
    rc, _, err = await codemode("keygen", "dana", "-o", str(target))
    assert rc != 0 and "exists" in err


async def test_the_guarded_cart_waits_and_the_plain_temporal_cli_decides(client: Client, tmp_path: Path) -> None:
    """The README's walk-through: the bundled `cart-guarded` agent pauses its $150 add; `temporal` approves it."""
    store = CartStore(tmp_path / "cart.sqlite")
    store.seed(lines=3)
    agent = cart.guarded_cart_agent(store)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, agent, cart.GUARDED_PROMPT, task_queue=tq)
        (pending,) = await wait_for_approvals(client, handle.id)
        assert (pending.tool, pending.args["unit_price_cents"]) == ("add_line", 15000)
        assert not any(line["product"] == "espresso machine" for line in store.all_lines())
        decision = json.dumps({"call_id": pending.call_id, "approved": True, "approver": "ana"})
        proc = await asyncio.create_subprocess_exec(
            str(temporal_cli_path()), "workflow", "update", "execute", "--address", address(client),
            "--workflow-id", handle.id, "--name", "decide", "--input", decision,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        result = await handle.result()
    assert result.output.startswith("Added line") and "espresso machine at $150.00" in result.output
    assert [r.approver for r in result.approvals] == ["ana"] and not result.approvals[0].signed
    assert any(line["product"] == "espresso machine" for line in store.all_lines())
    await replay(handle)


def test_keys_and_the_directory_load_from_files_and_malformed_ones_say_what_is_wrong(tmp_path: Path) -> None:
    from durable_codemode import ApproverKeyring, CodeModeUserError
    from durable_codemode.worker._approvers import ApproverDirectory

    keys = tmp_path / "approvers.json"
    keys.write_text(json.dumps(KEYRING))
    ring = ApproverKeyring.of(keys)
    ana = KEYS["ana"]
    payload = b"payload"
    assert ring.verify(ana.key_id, ana.sign(payload), payload, "ana") is None
    assert "does not match" in (ring.verify(ana.key_id, ana.sign(b"other"), payload, "ana") or "")
    (tmp_path / "bad.json").write_text(json.dumps({"k1": {"approver": "ana"}}))
    with pytest.raises(CodeModeUserError, match=r"entry 'k1' of .*bad.json is not an approver key: it needs"):
        ApproverKeyring.of(tmp_path / "bad.json")
    with pytest.raises(CodeModeUserError, match="cannot read the approver keys"):
        ApproverKeyring.of(tmp_path / "missing.json")

    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps(DIRECTORY))
    policy = ApproverPolicy(approvers=("group:finance", "dana"), required=2)
    recorded = ApproverDirectory(groups).resolve(policy)
    assert recorded.approvers == ["ana", "bob", "carol", "dana"] and recorded.named == ["group:finance", "dana"]
    with pytest.raises(CodeModeUserError, match="approver group 'legal' is not in the worker's approver directory"):
        ApproverDirectory(groups).resolve(ApproverPolicy(approvers=("group:legal",)))
    with pytest.raises(CodeModeUserError, match="needs 3 distinct approvers but names 1"):
        ApproverDirectory({"ops": ["eve"]}).resolve(ApproverPolicy(approvers=("group:ops",), required=3))
    with pytest.raises(CodeModeUserError, match="at least one person or group"):
        ApproverPolicy(approvers="ana")  # type: ignore[arg-type]  # a string, not a tuple of names
