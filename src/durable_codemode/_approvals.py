"""Approvals inside programs: a tool call that needs a human pauses the program at the call until a decision.

The state lives in workflow memory and changes only through what history records (the call reaching the tool,
an accepted update, a signal, a timer firing), so replay rebuilds it exactly. Decisions:
- the update `decide` is validated: an unknown, already decided or expired call id is an error returned to the
  caller and never written to history; the call id serves as the update id, so repeating a decision is harmless;
- the signals `approve` / `deny` are for fire-and-forget senders: an invalid one is recorded and ignored, never
  raised (a signal handler that raises wedges the run in task retries);
- the update `decide_all` decides every pending call at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from temporalio import workflow

__all__ = [
    "APPROVE_SIGNAL",
    "DECIDE_ALL_UPDATE",
    "DECIDE_UPDATE",
    "DENY_SIGNAL",
    "PENDING_APPROVALS_QUERY",
    "ApprovalDecision",
    "ApprovalRecord",
    "Approvals",
    "BatchDecision",
    "PendingApproval",
]

DECIDE_UPDATE = "decide"
DECIDE_ALL_UPDATE = "decide_all"
APPROVE_SIGNAL = "approve"
DENY_SIGNAL = "deny"
PENDING_APPROVALS_QUERY = "pending_approvals"


@dataclass(kw_only=True)
class PendingApproval:
    """A tool call waiting for a decision."""

    call_id: str
    tool: str
    args: dict[str, Any]
    code: str
    """The program that made the call."""
    line: int
    """The 1-based line of `code` where the call is."""
    requested_at: datetime
    expires_at: datetime | None = None
    """When it is denied automatically; `None`: it waits for as long as it takes."""


@dataclass(kw_only=True)
class ApprovalDecision:
    """Approve or deny one call (the payload of the `decide` update and of the `approve`/`deny` signals)."""

    call_id: str
    approved: bool = True
    """Ignored by the signals: `approve` approves, `deny` denies."""
    note: str | None = None
    approver: str | None = None


@dataclass(kw_only=True)
class BatchDecision:
    """Approve or deny every pending call of a run (the `decide_all` update)."""

    approved: bool
    note: str | None = None
    approver: str | None = None


@dataclass(kw_only=True)
class ApprovalRecord:
    """One entry of a run's audit trail of decisions."""

    call_id: str
    tool: str
    args: dict[str, Any]
    requested_at: datetime
    decided_at: datetime
    approved: bool
    note: str | None
    approver: str | None
    via: Literal["update", "signal", "timeout"]


class Approvals:
    """The pending calls and decisions of one workflow run."""

    def __init__(self, audit: list[ApprovalRecord] | None = None) -> None:
        self.pending: dict[str, PendingApproval] = {}
        self.decided: dict[str, ApprovalRecord] = {}
        self.audit: list[ApprovalRecord] = list(audit or [])
        self.ignored_signals: list[str] = []

    def problem(self, call_id: str) -> str | None:
        """Why a decision about `call_id` cannot be taken now, or `None` if it can."""
        if call_id in self.pending:
            return None
        if call_id in self.decided:
            record = self.decided[call_id]
            what = "expired and was denied" if record.via == "timeout" else (
                "approved" if record.approved else "denied")
            return f"call {call_id!r} was already decided: it {what} at {record.decided_at.isoformat()}"
        waiting = ", ".join(sorted(self.pending)) or "none"
        return f"no call {call_id!r} is waiting for approval in this run (waiting: {waiting})"

    def decide(self, decision: ApprovalDecision, *, via: Literal["update", "signal", "timeout"]) -> ApprovalRecord:
        """Record a decision on a pending call; the caller has checked `problem()` first."""
        pending = self.pending.pop(decision.call_id)
        record = ApprovalRecord(
            call_id=pending.call_id, tool=pending.tool, args=pending.args, requested_at=pending.requested_at,
            decided_at=workflow.now(), approved=decision.approved, note=decision.note, approver=decision.approver,
            via=via,
        )
        self.decided[pending.call_id] = record
        self.audit.append(record)
        return record

    async def wait(self, pending: PendingApproval, timeout: timedelta | None) -> ApprovalRecord:
        """Wait, durably, for a decision on `pending`; past `timeout` the call is denied with a note saying so."""
        self.pending[pending.call_id] = pending
        try:
            await workflow.wait_condition(lambda: pending.call_id in self.decided, timeout=timeout)
        except TimeoutError:
            self.decide(ApprovalDecision(call_id=pending.call_id, approved=False,
                                         note=f"no decision within {timeout}; denied automatically"), via="timeout")
        finally:
            # A program that ends while a call waits (a gather that raised) takes the question back.
            self.pending.pop(pending.call_id, None)
        return self.decided[pending.call_id]

    def details(self) -> str:
        """What the run waits for, for the Temporal UI's current details."""
        if not self.pending:
            return ""
        calls = "; ".join(f"{p.call_id} {p.tool}" for p in self.pending.values())
        return f"waiting for approval of {len(self.pending)} call(s): {calls}"


def denial_message(record: ApprovalRecord) -> str:
    """The `PermissionError` message a program sees for a denied call."""
    who = record.approver or ("the approval timeout" if record.via == "timeout" else "an approver")
    return f"{record.tool}() was denied by {who}" + (f": {record.note}" if record.note else "")
