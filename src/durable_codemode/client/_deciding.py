"""What a Temporal client does to a run that waits for a person: list its calls, wait for them, decide them."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError
from temporalio.client import Client
from temporalio.service import RPCError

from ..shared._approvals import (
    DECIDE_ALL_UPDATE,
    DECIDE_UPDATE,
    ApprovalDecision,
    ApprovalRecord,
    BatchDecision,
    DecidedCalls,
    PendingApproval,
    RejectedDecision,
)
from ..shared._decisions import decision_update_id
from ..shared._errors import (
    CodeModeUserError,
    DecisionConflictError,
    RunClosedError,
    RunNotFoundError,
)
from ..shared._names import call_fingerprint
from ..shared._signing import signing_payload
from ..workflow._run import CodeModeRunWorkflow
from ._children import MAX_CHILD_DEPTH, children_of
from ._moving import run_motion
from ._runs import DEFAULT_ANSWER_TIMEOUT, closed_run, on_run, run_handle
from ._signer import ApprovalSigner

__all__ = ["children_waiting", "decide", "decide_all", "pending_approvals", "rejected_decisions", "wait_for_approvals"]


async def pending_approvals(
    client: Client, run_id: str, *, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT
) -> list[PendingApproval]:
    """The calls of run `run_id` waiting for a decision, then those its child runs wait on, each with its `run_id`.

    Queries: they answer in milliseconds and record nothing. A child's calls are read from the child itself, and
    only from the children the run lists as its own and the server confirms are (`_children`), never from what
    anyone signalled: a list someone forged cannot put another run's call in front of a person.

    Raises:
        RunNotFoundError: no run with that id.
        WorkerUnavailableError: no worker answered within `timeout` (a query needs one, even for a closed run);
            `WorkerBusyError` when one polls the run's task queue but was busy, so asking again later works.

    """
    return await _waiting_in(client, run_id, timeout, depth=0)


async def _waiting_in(client: Client, run_id: str, timeout: timedelta, *, depth: int) -> list[PendingApproval]:
    call = run_handle(client, run_id).query(CodeModeRunWorkflow.pending_approvals, rpc_timeout=timeout)
    # A worker of 0.2.0 also listed its children's calls, as their signals said: those are not taken from it.
    own = [p for p in await on_run(client, run_id, call, timeout) if p.run_id is None]
    return own + await children_waiting(client, run_id, timeout=timeout, depth=depth)


async def children_waiting(client: Client, run_id: str, *, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT,
                           depth: int = 0) -> list[PendingApproval]:
    """The calls run `run_id`'s child runs wait on, each read from the child and given its `run_id` (`_children`).

    Raises:
        RunNotFoundError / WorkerUnavailableError: as `pending_approvals`, for the run or one of its children.

    """
    if depth >= MAX_CHILD_DEPTH:
        return []
    children = await on_run(client, run_id, children_of(client, run_id, timeout=timeout), timeout)

    async def of_child(child: str) -> list[PendingApproval]:
        try:
            calls = await _waiting_in(client, child, timeout, depth=depth + 1)
        except (RunNotFoundError, RunClosedError):  # it ended meanwhile: nothing waits there
            return []
        return [p if p.run_id else replace(p, run_id=child) for p in calls]

    listed = await asyncio.gather(*(of_child(c.run_id) for c in children))
    return [p for calls in listed for p in calls]


async def wait_for_approvals(
    client: Client, run_id: str, *, count: int = 1, timeout: timedelta = timedelta(minutes=1),
) -> list[PendingApproval]:
    """Wait until run `run_id` has at least `count` calls waiting for a decision; returns them.

    Ten times a second it asks the server whether the run is moving (a workflow task or an activity in flight,
    `_moving.run_motion`), and asks the run itself (the `pending_approvals` query, which records nothing) when it is
    not: a query that reaches a run on a worker without a workflow cache just as an activity completes can cost the
    run a workflow task, and stall it for 10 s (`_moving`). A run whose own call waits while other calls run on (a
    long tool beside it in a gather) is asked every 2 s. Waiters on one run in this process share each query: two
    queries reaching such a worker together lose one of them the same way.

    Raises:
        TimeoutError: fewer calls than `count` waited within `timeout`.
        RunNotFoundError / WorkerUnavailableError: as `pending_approvals`.

    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout.total_seconds()
    asked_at = loop.time()
    pending: list[PendingApproval] = []
    while True:
        motion = await run_motion(client, run_id)
        if not motion.moving or (motion.waiting and loop.time() - asked_at >= _ASK_A_MOVING_RUN_EVERY):
            asked_at = loop.time()
            pending = await _shared_ask(client, run_id)
            if len(pending) >= count:
                return pending
        if loop.time() > deadline:
            raise TimeoutError(f"run {run_id!r} has {len(pending)} call(s) waiting for approval after {timeout}, "
                               f"not {count}")
        await asyncio.sleep(0.1)


_ASK_A_MOVING_RUN_EVERY = 2.0
"""Seconds between `wait_for_approvals`' queries of a run that waits for a person while other calls run on."""


_ASKING: dict[tuple[int, int, str], asyncio.Future[list[PendingApproval]]] = {}
"""The `pending_approvals` query in flight for each (event loop, client, run), which `wait_for_approvals` share."""


async def _shared_ask(client: Client, run_id: str) -> list[PendingApproval]:
    """`pending_approvals(client, run_id)`, sharing the query in flight for the same run, if there is one."""
    key = (id(asyncio.get_running_loop()), id(client), run_id)
    asking = _ASKING.get(key)
    if asking is None:
        asking = _ASKING[key] = asyncio.ensure_future(pending_approvals(client, run_id))
        asking.add_done_callback(lambda _: _ASKING.pop(key, None))
    return await asyncio.shield(asking)


DEFAULT_SIGNATURE_LIFETIME = timedelta(minutes=5)
"""How long a signed decision stays valid by default: long enough to reach the run, too short to be kept."""


def _signed(client: Client, run_id: str, decision: ApprovalDecision, signer: ApprovalSigner | None,
            valid_for: timedelta, seen: PendingApproval | None) -> ApprovalDecision:
    """`decision` signed by `signer` (its approver, key id, expiry and signature set), or as it is without one.

    The signature covers the fingerprint of `seen`, the call as the approver saw it listed (its tool and
    arguments): the run refuses it if the call it holds is another (`None`: no such call is listed).
    """
    if signer is None:
        return decision
    if decision.approver not in (None, signer.approver):
        raise CodeModeUserError(f"the decision names approver {decision.approver!r}, but the key is "
                                f"{signer.approver!r}'s ({signer.key_id}): a decision is signed by its own approver")
    expires_at = datetime.now(UTC) + valid_for
    payload = signing_payload(namespace=client.namespace, run_id=run_id, call_id=decision.call_id,
                              approved=decision.approved, note=decision.note, approver=signer.approver,
                              expires_at=expires_at,
                              call_fingerprint=call_fingerprint(seen.tool, seen.args) if seen else "")
    return replace(decision, approver=signer.approver, key_id=signer.key_id, signature=signer.sign(payload),
                   expires_at=expires_at)


async def decide(
    client: Client, run_id: str, call_id: str, *, approved: bool, note: str | None = None,
    approver: str | None = None, signer: ApprovalSigner | None = None, seen: PendingApproval | None = None,
    valid_for: timedelta = DEFAULT_SIGNATURE_LIFETIME, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT,
) -> ApprovalRecord:
    """Approve or deny one waiting call; returns its audit record once the run has recorded it.

    The update id is `<call id> by <approver>` (`_decisions.decision_update_id`), so sending the same decision
    twice is harmless: the second gets the first's record back. The run accepts a decision under that id only if
    it is that approver's about that call, so nobody else can take it. The record returned is checked to be this
    decision (call, approver, verdict, note): a different decision sent under an id that already holds one (the
    approver changed their mind after deciding) raises `DecisionConflictError` instead of returning the first.
    With `signer` (`ApprovalSigner.load(path)`), the decision is signed as its approver, valid for `valid_for`,
    over the call as the approver saw it: `seen`, the `PendingApproval` they read (`pending_approvals`); without
    it, the call as run `run_id` lists it now. A run refuses a signature made for other arguments than its call's.

    Raises:
        temporalio.client.WorkflowUpdateFailedError: the run refused the decision, with a message saying why
            (unknown, decided or expired call; an approver the tool's policy does not name; a missing, forged or
            expired signature, or one made on other arguments; a malformed or over-long field, by name); the run
            is unaffected, and sending it again would fail the same way.
        DecisionConflictError: the run holds another decision under this update id; this one was not recorded.
        CodeModeUserError: `seen` is another call, or one listed as waiting in another run (its `run_id`).
        RunNotFoundError: no run with that id.
        RunClosedError: the run has ended (the message says how); nothing was recorded.
        WorkerUnavailableError: no worker took the decision within `timeout`; nothing was recorded
            (`WorkerBusyError`: one polls the run's task queue but was busy: decide again in a moment).

    """
    if seen is not None and (seen.call_id != call_id or seen.run_id not in (None, run_id)):
        where = f"run {seen.run_id!r}" if seen.run_id not in (None, run_id) else f"call {seen.call_id!r}"
        raise CodeModeUserError(f"seen= is {where}'s listed call, not call {call_id!r} of run {run_id!r}: pass the "
                                "PendingApproval of the call decided, and decide it on the run it waits in "
                                "(decide(client, p.run_id or run_id, p.call_id, seen=p))")
    # A signed decision covers what the approver saw: the call as the run lists it. A closed run lists nothing, and
    # a query of it waits for a worker to replay it (the whole `timeout` when none polls: measured 10-12 s per
    # `codemode deny --key` of a closed run), so a closed run is not asked: the update says what holds.
    if signer is not None and seen is None and await closed_run(client, run_id) is None:
        try:
            listed = await on_run(client, run_id, run_handle(client, run_id).query(
                CodeModeRunWorkflow.pending_approvals, rpc_timeout=timeout), timeout)
        except (RPCError, CodeModeUserError):  # no worker, or closed: the update says what holds (a recorded
            listed = []                        # decision comes back by its update id, from a closed run too)
        seen = next((p for p in listed if p.call_id == call_id and p.run_id is None), None)
    decision = _signed(client, run_id, ApprovalDecision(call_id=call_id, approved=approved, note=note,
                                                        approver=approver), signer, valid_for, seen)
    update_id = decision_update_id(call_id, decision.approver)
    call = run_handle(client, run_id).execute_update(DECIDE_UPDATE, decision, id=update_id, rpc_timeout=timeout)
    answer = await on_run(client, run_id, call, timeout)
    try:
        return _own_record(run_id, update_id, decision, answer)
    except DecisionConflictError as conflict:
        # Temporal answers an update id's first outcome even from a closed run: an approver who decided before
        # would hear "a recorded decision stands" (exit 1) where anyone else hears "run is closed" (exit 2). One
        # situation, one answer: a closed run says so, to everyone (its audit trail shows what it recorded).
        closed = await closed_run(client, run_id)
        if closed is not None:
            raise closed from conflict
        raise


def _own_record(run_id: str, update_id: str, decision: ApprovalDecision, answer: Any) -> ApprovalRecord:
    """The record the run answered `decision` with, if it is that decision's.

    Raises:
        DecisionConflictError: it is another decision's record (or no record at all).

    """
    try:
        record = _RECORD.validate_python(answer)
    except ValidationError:
        raise DecisionConflictError(
            f"run {run_id!r} did not record this decision: update id {update_id!r} was already used by another "
            "update, whose outcome Temporal returned instead (a worker from before update ids were bound to their "
            "approver let it through); upgrade the run's workers, then decide again with an approver named",
            None) from None
    differs = [what for what, mine, recorded in (
        ("call", decision.call_id, record.call_id), ("approver", decision.approver, record.approver),
        ("verdict", decision.approved, record.approved), ("note", decision.note, record.note)) if mine != recorded]
    if not differs:
        return record
    verb = "approval" if record.approved else "denial"
    held = (f"{record.approver!r}'s {verb} of call {record.call_id!r}" if record.approver else
            f"an {verb} of call {record.call_id!r}") + f", recorded at {record.decided_at:%Y-%m-%d %H:%M:%S}"
    if set(differs) <= {"verdict", "note"}:  # the same approver's earlier decision about the same call
        raise DecisionConflictError(
            f"run {run_id!r} did not record this decision: it already holds {held} under update id {update_id!r}, "
            f"and a recorded decision stands (its {' and '.join(differs)} differs from this one's)", record)
    raise DecisionConflictError(
        f"run {run_id!r} did not record this decision: update id {update_id!r} holds {held}, not this decision "
        "(a worker from before update ids were bound to their approver let another decision take the id); "
        "upgrade the run's workers, then decide again", record)


_RECORD = TypeAdapter(ApprovalRecord)


_RECORDS = TypeAdapter(list[ApprovalRecord])


async def decide_all(
    client: Client, run_id: str, *, approved: bool, note: str | None = None, approver: str | None = None,
    signer: ApprovalSigner | None = None, valid_for: timedelta = DEFAULT_SIGNATURE_LIFETIME,
    timeout: timedelta = DEFAULT_ANSWER_TIMEOUT,
) -> DecidedCalls:
    """Approve or deny every call of run `run_id` waiting for a decision (raises as `decide` does).

    The calls are listed first (`pending_approvals`); with `signer`, each of the run's own is signed over what the
    listing shows. The calls its child runs wait on cannot be decided on this run: they come back unanswered in
    the result's `elsewhere`, each with the `run_id` to decide it on (`codemode approve --all` names the command).
    The update id is random (an id of the form `<call id> by <approver>` is reserved for one decision); no update
    is sent when only child runs' calls wait.
    """
    listed = await pending_approvals(client, run_id, timeout=timeout)
    own = [p for p in listed if p.run_id is None]
    elsewhere = [p for p in listed if p.run_id is not None]
    if not own and elsewhere:
        return DecidedCalls([], elsewhere)
    batch = BatchDecision(approved=approved, note=note, approver=approver)
    if signer is not None:
        signed = [_signed(client, run_id, ApprovalDecision(call_id=p.call_id, approved=approved, note=note,
                                                           approver=approver), signer, valid_for, p)
                  for p in own]
        batch = BatchDecision(approved=approved, note=note, approver=signer.approver, key_id=signer.key_id,
                              signatures={d.call_id: d.signature or "" for d in signed},
                              expires_at=signed[0].expires_at if signed else None)
    update_id = str(uuid.uuid4())
    call = run_handle(client, run_id).execute_update(DECIDE_ALL_UPDATE, batch, id=update_id, rpc_timeout=timeout)
    answer = await on_run(client, run_id, call, timeout)
    try:
        records = _RECORDS.validate_python(answer)
    except ValidationError:
        raise DecisionConflictError(f"run {run_id!r} answered decide_all with something other than its records "
                                    f"(update id {update_id!r}); nothing here says what it recorded", None) from None
    for record in records:
        _own_record(run_id, update_id, ApprovalDecision(call_id=record.call_id, approved=approved, note=note,
                                                        approver=batch.approver), record)
    return DecidedCalls(records, elsewhere)


async def rejected_decisions(
    client: Client, run_id: str, *, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT
) -> list[RejectedDecision]:
    """Recent decisions run `run_id` refused, with why.

    A query; the run keeps them in its worker's memory (a refused decision never enters the history), so after a
    worker restart it lists only those refused since.
    """
    call = run_handle(client, run_id).query(CodeModeRunWorkflow.rejected_decisions, rpc_timeout=timeout)
    return await on_run(client, run_id, call, timeout)
