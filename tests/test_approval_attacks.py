"""Approvals against someone who can reach the server: squatted update ids, malformed fields, closed runs.

Each attack is sent to a real run waiting for a decision. Every refused one leaves the run waiting and its history
unchanged (event count and bytes); then the honest approvers' decisions complete the run, and it replays.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from durable_codemode import (
    CodeModeRunWorkflow,
    DecisionConflictError,
    RunClosedError,
    decide,
    decide_all,
    pending_approvals,
    rejected_decisions,
    start_run,
)
from durable_codemode.client._deciding import _own_record
from durable_codemode.shared._approvals import ApprovalDecision, ApprovalRecord
from durable_codemode.shared._decisions import MAX_APPROVER_CHARS, MAX_NOTE_CHARS, decision_update_id
from durable_codemode.shared._signing import signing_payload
from durable_codemode.testing import new_task_queue, replay

from .test_approval_authorization import KEYS, TWO_REFUNDS, fingerprint, payments_agent, signed, worker
from .test_approvals import wait_pending
from .test_debugging import address, codemode


async def history_size(handle: WorkflowHandle[Any, Any]) -> tuple[int, int]:
    """The run's history as (events, bytes of its JSON)."""
    history = await handle.fetch_history()
    return len(history.events), len(history.to_json())


async def refused_under(handle: WorkflowHandle[Any, Any], update: str, payload: Any, update_id: str) -> str:
    """Send `payload` as the `update` under `update_id`: it must be refused, not retryable, history unchanged."""
    before = await history_size(handle)
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await handle.execute_update(update, payload, id=update_id)
    assert await history_size(handle) == before, f"a refused {update} changed the history"
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ApprovalRejected", cause
    assert cause.non_retryable, "a refused decision must say it is not retryable"
    return cause.message


async def signed_batch(client: Client, handle: WorkflowHandle[Any, Any], call_ids: list[str],
                       who: str) -> dict[str, Any]:
    """A `decide_all` input approving `call_ids`, validly signed by `who`."""
    expires = datetime.now(UTC) + timedelta(minutes=5)
    signer = KEYS[who]
    signatures = {c: signer.sign(signing_payload(namespace=client.namespace, run_id=handle.id, call_id=c,
                                                 approved=True, note=None, approver=who, expires_at=expires,
                                                 call_fingerprint=await fingerprint(handle, c)))
                  for c in call_ids}
    return {"approved": True, "approver": who, "key_id": signer.key_id, "signatures": signatures,
            "expires_at": expires.isoformat()}


@pytest.mark.slow
async def test_an_update_id_belongs_to_its_approver_and_nobody_else_can_take_it(client: Client,
                                                                              tmp_path: Path) -> None:
    refunds: list[str] = []
    agent = payments_agent("attack-squat", TWO_REFUNDS, refunds, required=2)
    tq = new_task_queue()
    bob_key = tmp_path / "bob.json"
    KEYS["bob"].save(bob_key)
    async with worker(client, agent, tq):
        handle = await start_run(client, agent, "refund A and B", task_queue=tq)
        first, second = sorted(p.call_id for p in await wait_pending(handle, 2))
        bobs_id = decision_update_id(second, "bob")
        assert bobs_id == f"{second} by bob"  # predictable, so it must be bound to bob
        # ana's own, validly signed approval, sent under the id bob's decision will use: refused.
        squat = await refused_under(handle, "decide", await signed(client, handle, second, KEYS["ana"]), bobs_id)
        assert f"the update id '{bobs_id}' is reserved for another decision" in squat
        assert f"goes under '{second} by ana'" in squat
        # Nor can a batch take a decision's id: neither '<call> by <approver>' nor a bare call id.
        batch = await signed_batch(client, handle, [first, second], "ana")
        assert "reserved for one decision" in await refused_under(handle, "decide_all", batch, bobs_id)
        assert "reserved for one decision" in await refused_under(handle, "decide_all", batch, second)
        assert [p.call_id for p in await pending_approvals(client, handle.id)] == [first, second]
        listed = await rejected_decisions(client, handle.id)
        assert (listed[0].approver, listed[0].call_id, listed[0].reason) == ("ana", second, squat)
        assert [r.call_id for r in listed][1:] == ["(every waiting call)"] * 2
        # bob's own decision goes under his id, from the command line: his vote, not a copy of ana's.
        rc, out, err = await codemode("approve", handle.id, second, "--key", str(bob_key), address=address(client))
        assert rc == 0, err
        assert f"approved {second} refund(" in out and "by bob (counted; the call needs more approvals)" in out
        # bob changing his mind under the same id: the run holds his approval, and both paths say so loudly.
        before = await history_size(handle)
        with pytest.raises(DecisionConflictError, match=r"already holds 'bob''s approval of call .* a recorded "
                                                        r"decision stands \(its verdict differs"):
            await decide(client, handle.id, second, approved=False, signer=KEYS["bob"])
        rc, out, err = await codemode("deny", handle.id, second, "--key", str(bob_key), address=address(client))
        assert rc == 1 and "did not record this decision" in err and "denied" not in out, (out, err)
        assert await history_size(handle) == before
        # The same decision again is harmless: his own record comes back.
        again = await decide(client, handle.id, second, approved=True, signer=KEYS["bob"])
        assert (again.approver, again.approved, again.settled) == ("bob", True, False)
        # The honest second approvals complete the run.
        for call_id in (first, second):
            await decide(client, handle.id, call_id, approved=True, signer=KEYS["ana"])
        await decide(client, handle.id, first, approved=True, signer=KEYS["carol"])
        result = await handle.result()
    assert sorted(refunds) == ["A", "B"]
    assert [(r.call_id, r.approver) for r in result.approvals] == [
        (second, "bob"), (first, "ana"), (second, "ana"), (first, "carol")]
    await replay(handle)


def test_a_record_that_is_not_the_callers_decision_is_an_error() -> None:
    """What `decide()` does when an older worker let another decision take its id (the run cannot make one now)."""
    anas = ApprovalRecord(call_id="call_0.1", tool="refund", args={}, requested_at=datetime.now(UTC),
                          decided_at=datetime.now(UTC), approved=True, note=None, approver="ana", via="update")
    bobs = ApprovalDecision(call_id="call_0.1", approved=True, approver="bob")
    with pytest.raises(DecisionConflictError, match=r"holds 'ana''s approval of call 'call_0\.1'.*upgrade the run's "
                                                    r"workers") as conflict:
        _own_record("run-1", "call_0.1 by bob", bobs, anas.__dict__)
    assert conflict.value.record == anas
    with pytest.raises(DecisionConflictError, match="was already used by another update"):
        _own_record("run-1", "call_0.1", bobs, [anas.__dict__])  # a decide_all's answer under a decision's id
    assert _own_record("run-1", "call_0.1 by ana", replace(bobs, approver="ana"), anas.__dict__) == anas


MALFORMED: list[tuple[str, dict[str, Any] | str, str]] = [
    ("a naive expiry", {"expires_at": "2030-01-01T00:00:00"}, "the decision's expires_at has no time zone"),
    ("an expiry that is a number", {"expires_at": 1893456000}, "the decision's expires_at must be an ISO 8601"),
    ("an expiry that is no date", {"expires_at": "tomorrow"}, "the decision's expires_at is not an ISO 8601"),
    ("approved as a string", {"approved": "yes"}, "the decision's approved must be true or false, got str"),
    ("a note that is a number", {"note": 123}, "the decision's note must be a string, got int"),
    ("a 1 MB note", {"note": "x" * 1_000_000},
     f"the decision's note is 1,000,000 characters long; at most {MAX_NOTE_CHARS:,} are allowed"),
    ("a long approver name", {"approver": "a" * (MAX_APPROVER_CHARS + 1)},
     f"the decision's approver is {MAX_APPROVER_CHARS + 1} characters long"),
    ("an approver name with an escape sequence", {"approver": "bob\x1b[2K"},
     "the decision's approver holds control characters ('bob\\\\x1b[2K')"),
    ("an approver that is a list", {"approver": ["ana"]}, "the decision's approver must be a string"),
    ("no call id", {"call_id": None}, "the decision's call_id is missing"),
    ("a call id that is a number", {"call_id": 7}, "the decision's call_id must be a string, got int"),
    ("a 1 MB call id", {"call_id": "c" * 1_000_000}, "the decision's call_id is 1,000,000 characters long"),
    ("a long signature", {"signature": "s" * 10_000}, "the decision's signature is 10,000 characters long"),
    ("an unknown field", {"padding": "x" * 1_000_000}, "the decision's field 'padding' is not part of a decision"),
    ("no object at all", "approve it", "the decision's payload must be a JSON object"),
]


async def test_malformed_decision_fields_are_refused_by_name_and_never_reach_the_history(client: Client) -> None:
    refunds: list[str] = []
    agent = payments_agent("attack-fields", TWO_REFUNDS.replace(", one('B')", ""), refunds)
    tq = new_task_queue()
    async with worker(client, agent, tq):
        handle = await start_run(client, agent, "refund A", task_queue=tq)
        (pending,) = await wait_pending(handle)
        good = await signed(client, handle, pending.call_id, KEYS["ana"])
        valid = {**good.__dict__, "expires_at": datetime.isoformat(good.expires_at or datetime.now(UTC))}
        before = await history_size(handle)
        reasons = []
        for n, (what, change, expected) in enumerate(MALFORMED):
            payload = change if isinstance(change, str) else {k: v for k, v in {**valid, **change}.items()
                                                              if v is not None or k != "call_id"}
            reason = await refused_under(handle, "decide", payload, f"malformed-{n}")
            assert expected in reason, (what, reason)
            reasons.append(reason)
        batch = await signed_batch(client, handle, [pending.call_id], "ana")
        for change, expected in (({"approved": "yes"}, "approved must be true or false"),
                                 ({"note": "n" * 1_000_000}, "note is 1,000,000 characters long"),
                                 ({"expires_at": "2030-01-01T00:00:00"}, "expires_at has no time zone"),
                                 ({"signatures": {"call_9.9": "x"}}, "signatures names call 'call_9.9', which this "
                                                                     "run never asked about")):
            reason = await refused_under(handle, "decide_all", {**batch, **change}, "malformed-batch")
            assert expected in reason, reason
            reasons.append(reason)
        # Nothing of it reached the history; the run still waits, and lists every refusal with its reason.
        assert await history_size(handle) == before
        assert [p.call_id for p in await pending_approvals(client, handle.id)] == [pending.call_id]
        recent = await rejected_decisions(client, handle.id)
        assert [r.reason for r in recent] == reasons
        by_what = dict(zip((what for what, _, _ in MALFORMED), recent, strict=False))
        assert by_what["a 1 MB note"].call_id == pending.call_id and by_what["a 1 MB note"].approver == "ana"
        long_id = by_what["a 1 MB call id"].call_id
        assert long_id.startswith("c" * 100) and len(long_id) <= 120  # kept short in the worker's memory too
        # The honest approver's decision, as it was, completes the run.
        record = await handle.execute_update(CodeModeRunWorkflow.decide, good, id=decision_update_id(
            pending.call_id, "ana"))
        assert record.approver == "ana" and record.signed
        result = await handle.result()
    assert refunds == ["A"] and [r.approver for r in result.approvals] == ["ana"]
    await replay(handle)


async def test_a_signal_with_a_malformed_decision_is_ignored(client: Client) -> None:
    """Signals cannot be refused (their input is recorded when sent), so a malformed one is ignored and logged."""
    refunds: list[str] = []
    agent = payments_agent("attack-signal", TWO_REFUNDS.replace(", one('B')", ""), refunds)
    tq = new_task_queue()
    async with worker(client, agent, tq, unsigned_approvals=True):
        handle = await start_run(client, agent, "refund A", task_queue=tq)
        (pending,) = await wait_pending(handle)
        note = ApprovalDecision(call_id=pending.call_id, approver="ana", note="x" * (MAX_NOTE_CHARS + 1))
        await handle.signal(CodeModeRunWorkflow.approve, note)
        await handle.signal(CodeModeRunWorkflow.approve, replace(note, note=None, approver="ana\x1b[1A"))
        assert [p.call_id for p in await pending_approvals(client, handle.id)] == [pending.call_id]
        await handle.signal(CodeModeRunWorkflow.deny, replace(note, note="no"))
        result = await handle.result()
    assert refunds == [] and [(r.approver, r.note, r.via) for r in result.approvals] == [("ana", "no", "signal")]
    await replay(handle)


async def test_deciding_a_closed_run_says_it_is_closed_and_how_it_ended(client: Client, tmp_path: Path) -> None:
    refunds: list[str] = []
    agent = payments_agent("attack-closed", TWO_REFUNDS.replace(", one('B')", ""), refunds)
    tq = new_task_queue()
    ana_key, bob_key = tmp_path / "ana.json", tmp_path / "bob.json"
    KEYS["ana"].save(ana_key)
    KEYS["bob"].save(bob_key)
    async with worker(client, agent, tq):
        handle = await start_run(client, agent, "refund A", task_queue=tq)
        (pending,) = await wait_pending(handle)
        await decide(client, handle.id, pending.call_id, approved=True, signer=KEYS["ana"])
        await handle.result()
        with pytest.raises(RunClosedError, match=rf"run '{handle.id}' is closed: it completed at .*codemode audit"):
            await decide(client, handle.id, pending.call_id, approved=False, signer=KEYS["bob"])
        with pytest.raises(RunClosedError, match="it completed"):
            await decide_all(client, handle.id, approved=True, approver="ana")
    rc, _, err = await codemode("deny", handle.id, pending.call_id, "--key", str(bob_key), address=address(client))
    assert rc == 2 and f"run '{handle.id}' is closed: it completed at" in err and "no run with id" not in err
    # ana's own decision, sent again, is the one the run recorded (Temporal keeps an update's outcome by its id).
    rc, out, err = await codemode("approve", handle.id, pending.call_id, "--key", str(ana_key),
                                  address=address(client))
    assert rc == 0 and f"approved {pending.call_id} refund(" in out, err
    # ana deciding otherwise now hears what bob heard, with the same exit status: the run is closed.
    with pytest.raises(RunClosedError, match=rf"run '{handle.id}' is closed: it completed at .*codemode audit"):
        await decide(client, handle.id, pending.call_id, approved=False, signer=KEYS["ana"])
    rc, _, err_ana = await codemode("deny", handle.id, pending.call_id, "--key", str(ana_key), address=address(client))
    assert rc == 2 and f"run '{handle.id}' is closed: it completed at" in err_ana and "stands" not in err_ana, err_ana
    await replay(handle)


async def test_a_public_keys_file_given_as_key_says_what_it_is(tmp_path: Path) -> None:
    public = tmp_path / "ana.pub.json"
    public.write_text(json.dumps({KEYS["ana"].key_id: KEYS["ana"].public_entry()}))  # what keygen prints
    rc, _, err = await codemode("approve", "some-run", "call_0.0", "--key", str(public))
    assert rc == 2 and "holds public keys" in err and "codemode keygen NAME -o FILE" in err, err
    assert "KeyError" not in err and "'approver'" not in err
    (tmp_path / "half.json").write_text(json.dumps({"approver": "ana"}))
    rc, _, err = await codemode("approve", "some-run", "call_0.0", "--key", str(tmp_path / "half.json"))
    assert rc == 2 and "has no 'key_id', 'private_key'" in err, err


def test_a_run_that_closes_while_a_decision_is_taken_says_so() -> None:
    """Temporal aborts an update when its run closes before answering it (e.g. terminated): the error says which."""
    closed_at = datetime(2026, 12, 5, 10, 2, 11, tzinfo=UTC)
    assert str(RunClosedError("r-1", "terminated", closed_at, during=True)) == (
        "run 'r-1' closed while this decision was being taken: it was terminated at 2026-12-05 10:02:11 UTC; "
        "whether the decision was recorded first, `codemode audit r-1` shows")
    assert str(RunClosedError("r-1", "failed", None)).startswith("run 'r-1' is closed: it failed, so it takes no")


def test_trace_and_audit_name_who_decided_in_the_same_words() -> None:
    """A decision sent without an approver is "an unnamed approver" in both (trace said "someone", audit "update")."""
    from durable_codemode.shared._approvals import decided_by

    assert decided_by(None, "update") == decided_by(None, "signal") == "an unnamed approver"
    assert (decided_by(None, "timeout"), decided_by("ana", "update")) == ("the approval timeout", "ana")
    src = Path(__file__).resolve().parent.parent / "src" / "durable_codemode"
    for module in ("history/_trace.py", "cli/_approvals.py"):
        assert "decided_by(" in (src / module).read_text(), f"{module} words the approver its own way"
