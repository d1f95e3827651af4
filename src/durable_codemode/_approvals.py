"""Approvals as data: a pending call, a decision, its audit record, and the names decisions arrive under.

Shared by clients (who list and decide), workflow code (`workflow/_approval_state.py` holds a run's pending
calls and decisions) and history readers. Decisions:
- the update `decide` is validated: an unknown, already decided or expired call id is an error returned to the
  caller and never written to history; the call id serves as the update id, so repeating a decision is harmless;
- the signals `approve` / `deny` are for fire-and-forget senders: an invalid one is recorded and ignored, never
  raised (a signal handler that raises wedges the run in task retries);
- the update `decide_all` decides every pending call at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "APPROVE_SIGNAL",
    "DECIDE_ALL_UPDATE",
    "DECIDE_UPDATE",
    "DENY_SIGNAL",
    "PENDING_APPROVALS_QUERY",
    "ApprovalDecision",
    "ApprovalRecord",
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
