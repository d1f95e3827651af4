"""Approvals as data: a pending call, a decision, its audit record, and the names decisions arrive under.

Shared by clients (who list and decide), workflow code (`workflow/_approval_state.py` holds a run's pending
calls and decisions) and history readers. Decisions:
- the update `decide` is validated: an unknown, already decided or expired call id, or a malformed field
  (`_decisions`), is an error returned to the caller and never written to history; its update id is
  `<call id> by <approver>`, so repeating a decision is harmless, and no one else may use that id;
- the signals `approve` / `deny` are for fire-and-forget senders: an invalid one is recorded and ignored, never
  raised (a signal handler that raises wedges the run in task retries);
- the update `decide_all` decides every pending call at once.

Who may decide is the tool's `ApproverPolicy`, recorded when the run starts (`RecordedApproverPolicy`), and checked
with each decision's signature (`_signing`) before the decision is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ._errors import CodeModeUserError

__all__ = [
    "APPROVE_SIGNAL",
    "DECIDE_ALL_UPDATE",
    "DECIDE_UPDATE",
    "DENY_SIGNAL",
    "GROUP_PREFIX",
    "PENDING_APPROVALS_QUERY",
    "REJECTED_DECISIONS_QUERY",
    "ApprovalDecision",
    "ApprovalRecord",
    "ApproverPolicy",
    "BatchDecision",
    "ChildApprovals",
    "ChildRun",
    "DecidedCalls",
    "PendingApproval",
    "RecordedApproverPolicy",
    "RejectedDecision",
    "decided_by",
]

DECIDE_UPDATE = "decide"
DECIDE_ALL_UPDATE = "decide_all"
APPROVE_SIGNAL = "approve"
DENY_SIGNAL = "deny"
PENDING_APPROVALS_QUERY = "pending_approvals"
REJECTED_DECISIONS_QUERY = "rejected_decisions"
GROUP_PREFIX = "group:"
"""An approver named `group:<name>` is every member of `<name>` in the worker's approver directory."""


@dataclass(frozen=True, kw_only=True)
class ApproverPolicy:
    """Who may decide the calls of a tool (`ToolOptions(approvers=...)`), checked before a decision is accepted.

    Example:
        ```python
        ToolOptions(requires_approval=True,
                    approvers=ApproverPolicy(approvers=("group:finance",), required=2, allow_self_approval=False))
        ```

    """

    approvers: tuple[str, ...]
    """People (the names their keys are registered under) and groups (`group:finance`), resolved by the worker's
    approver directory when a run starts."""
    required: int = 1
    """Distinct approvals a call needs before it runs (2: the two-person rule)."""
    allow_self_approval: bool = True
    """`False`: whoever started the run (`start_run(started_by=...)`) may not approve its calls."""
    any_denial_wins: bool = True
    """A denial from any approver denies the call. `False`: a denial is one vote against, and the call is denied
    only once the approvals it needs can no longer come."""

    def __post_init__(self) -> None:
        if isinstance(self.approvers, str) or not self.approvers:
            raise CodeModeUserError("ApproverPolicy.approvers must name at least one person or group, as a tuple "
                                    "(e.g. approvers=('ana', 'group:finance'))")
        if self.required < 1:
            raise CodeModeUserError(f"ApproverPolicy.required must be at least 1, got {self.required}")


@dataclass(kw_only=True)
class RecordedApproverPolicy:
    """A tool's approver policy as a run recorded it when it started: groups resolved to their members then.

    Recorded, so a deploy (or a change to the directory) never changes who may decide an old run's calls.
    """

    approvers: list[str]
    """The people who may decide."""
    named: list[str]
    """The policy as its author wrote it (people and `group:` names), for messages."""
    required: int = 1
    allow_self_approval: bool = True
    any_denial_wins: bool = True

    def describe(self) -> str:
        """The rule in words, for errors and the audit trail."""
        who = ", ".join(self.named)
        rule = f"{self.required} distinct approvals from {who}" if self.required > 1 else f"one of {who}"
        if not self.allow_self_approval:
            rule += ", not the run's starter"
        return rule

    @classmethod
    def resolve(cls, policy: ApproverPolicy, members: dict[str, Sequence[str]]) -> RecordedApproverPolicy:
        """`policy` with each `group:` replaced by its members (`members`: the directory's, by group name)."""
        people: list[str] = []
        for name in policy.approvers:
            found = members[name.removeprefix(GROUP_PREFIX)] if name.startswith(GROUP_PREFIX) else [name]
            people += [p for p in found if p not in people]
        return cls(approvers=people, named=list(policy.approvers), required=policy.required,
                   allow_self_approval=policy.allow_self_approval, any_denial_wins=policy.any_denial_wins)


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
    run_id: str | None = None
    """The child run the call waits in (a sub-agent this run delegated to, `child_run_tool`): decide it there,
    `decide(client, run_id, call_id)`. `None`: the call is this run's own. Set by the client
    (`durable_codemode.pending_approvals`), which reads each child's calls from the child itself."""


@dataclass(kw_only=True)
class ChildApprovals:
    """A child run's calls waiting for a person, as it tells its parent (`CHILD_APPROVALS_SIGNAL`).

    Anyone can send a signal, so nothing lists calls from it (`_names.CHILD_APPROVALS_SIGNAL`).
    """

    run_id: str
    pending: list[PendingApproval]


@dataclass(kw_only=True)
class ChildRun:
    """A child run a run started and waits on (the `CHILD_RUNS_QUERY` answer): a source only the run writes."""

    run_id: str
    """The child's workflow id (`<parent id>/<call id>`)."""
    call_id: str
    """The parent's call that started it."""
    agent: str
    """The sub-agent it runs."""


class DecidedCalls(list["ApprovalRecord"]):
    """What `decide_all` recorded (a list of audit records) and the calls it left to the runs they wait in.

    `elsewhere`: calls waiting in the run's child runs (`PendingApproval.run_id`), which a decision sent to the
    run cannot decide: each is decided on its own run (`decide(client, p.run_id, p.call_id)`, `codemode approve
    RUN_ID CALL_ID`).
    """

    def __init__(self, records: Sequence[ApprovalRecord] = (), elsewhere: Sequence[PendingApproval] = ()) -> None:
        super().__init__(records)
        self.elsewhere: list[PendingApproval] = list(elsewhere)


@dataclass(kw_only=True)
class ApprovalDecision:
    """Approve or deny one call (the payload of the `decide` update and of the `approve`/`deny` signals)."""

    call_id: str
    approved: bool = True
    """Ignored by the signals: `approve` approves, `deny` denies."""
    note: str | None = None
    approver: str | None = None
    key_id: str | None = None
    """The key that signed this decision (`_signing`), one of the workers' approver keys."""
    signature: str | None = None
    """Base64 Ed25519 signature over the namespace, run, call, `approved`, `note`, `approver` and `expires_at`."""
    expires_at: datetime | None = None
    """Until when the signature may be used (signed decisions must carry one)."""


@dataclass(kw_only=True)
class BatchDecision:
    """Approve or deny every pending call of a run (the `decide_all` update)."""

    approved: bool
    note: str | None = None
    approver: str | None = None
    key_id: str | None = None
    signatures: dict[str, str] = field(default_factory=dict)
    """One signature per waiting call, by call id (each over that call's decision, as for `ApprovalDecision`)."""
    expires_at: datetime | None = None


@dataclass(kw_only=True)
class RejectedDecision:
    """A decision the run refused (it never entered the history): who tried, about which call, and why."""

    call_id: str
    approver: str | None
    key_id: str | None
    approved: bool
    reason: str
    at: datetime


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
    key_id: str | None = None
    """The key that signed the decision; `None`: it was not signed (a run whose worker allows unsigned ones)."""
    signed: bool = False
    policy: str | None = None
    """The approver policy the decision was checked against (`RecordedApproverPolicy.describe`)."""
    args_digest: str | None = None
    """A digest of the call's arguments (`_names.call_digest`), to match the record to the call that ran."""
    settled: bool = True
    """Whether this decision settled the call; `False`: an approval counted toward the `required` ones."""


def decided_by(approver: str | None, via: str | None) -> str:
    """Who decided a call, in the words `codemode trace` and `codemode audit` both use.

    The approver's name; else the approval timeout (`via='timeout'`); else "an unnamed approver" (a decision sent
    without one, by update or signal): `via` says how a decision came, never who made it.
    """
    if approver:
        return approver
    return "the approval timeout" if via == "timeout" else "an unnamed approver"
