"""A run's approvals in workflow memory: the calls waiting for a person, the decisions, the served rules.

The state changes only through what history records (the call reaching the tool, an accepted update, a signal, a
timer firing), so replay rebuilds it exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal, Protocol

from temporalio import workflow

from .._approvals import ApprovalDecision, ApprovalRecord, PendingApproval
from .._errors import CodeModeUserError

__all__ = ["ApprovalRuleSource", "Approvals", "approval_rule", "denial_message", "serve", "served_agents"]


class ApprovalRuleSource(Protocol):
    """What workflow code needs of a served agent: its name and its tools' approval rules (a `CodeModeAgent`)."""

    @property
    def name(self) -> str: ...

    def approval_rule_for(self, tool: str) -> Callable[[dict[str, Any]], bool] | None: ...


_SERVED: dict[str, ApprovalRuleSource] = {}
"""The agents `create_worker` serves in this process, for what workflow code needs of them: approval rules."""


def approval_rule(agent: str, tool: str) -> Callable[[dict[str, Any]], bool]:
    """The approval rule of `tool` of `agent` in this process.

    Raises:
        CodeModeUserError: this process does not serve that agent (e.g. a replay without the worker's agents).

    """
    served = _SERVED.get(agent)
    rule = served.approval_rule_for(tool) if served is not None else None
    if rule is None:
        raise CodeModeUserError(
            f"tool {tool!r} of agent {agent!r} has an approval rule, but this process does not know it: run the "
            "workflow in a process where `create_worker` serves that agent"
        )
    return rule


def serve(agent: ApprovalRuleSource) -> None:
    """Make `agent` known to workflow code in this process (done by `create_worker` and the replay commands)."""
    _SERVED[agent.name] = agent


def served_agents() -> set[str]:
    """The names of the agents workflow code in this process knows."""
    return set(_SERVED)


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
