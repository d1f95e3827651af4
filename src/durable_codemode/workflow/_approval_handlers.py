"""The run workflow's approval handlers: the queries, updates and signals people and parent runs decide through.

A mixin of `CodeModeRunWorkflow` (Temporal collects a workflow's handlers from its base classes too, as it does
for `PinnedCodeModeRunWorkflow`), kept apart from the run's loop: each handler reads and decides through the run's
`Approvals` and `ChildRuns`, and tells the run's details and its parent run what waits (`_show_details`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ..shared._approvals import (
        APPROVE_SIGNAL,
        DECIDE_ALL_UPDATE,
        DECIDE_UPDATE,
        DENY_SIGNAL,
        PENDING_APPROVALS_QUERY,
        REJECTED_DECISIONS_QUERY,
        ApprovalDecision,
        ApprovalRecord,
        ChildApprovals,
        ChildRun,
        PendingApproval,
        RejectedDecision,
    )
    from ..shared._decisions import batch_of, decision_of
    from ..shared._names import CHILD_APPROVALS_SIGNAL, CHILD_RUNS_QUERY
    from ..shared._results import clip, printable
    from ..shared._signing import ApproverKeyring
    from ._approval_state import Approvals, keyring_for
    from ._child_runs import ChildRuns
    from ._progress import RunProgress

__all__ = ["ApprovalHandlers"]


class ApprovalHandlers:
    """The approval and child-run handlers of the run workflow, over the state the workflow keeps."""

    _approvals: Approvals
    """The run's calls waiting for a decision, and its audit (`CodeModeRunWorkflow.__init__`, `run`)."""
    _children: ChildRuns
    """The child runs the run started and waits on."""
    _progress: RunProgress
    """The run's details and events."""

    @workflow.query(name=PENDING_APPROVALS_QUERY)
    def pending_approvals(self) -> list[PendingApproval]:
        """The calls of this run waiting for a decision, with their arguments and the program that made them.

        Only its own: the calls its child runs wait on are read from each child (`child_runs`,
        `durable_codemode.pending_approvals`), never from what someone signalled.
        """
        return list(self._approvals.pending.values())

    @workflow.query(name=CHILD_RUNS_QUERY)
    def child_runs(self) -> list[ChildRun]:
        """The child runs this run started and waits on (`child_run_tool`), where their calls are read."""
        return list(self._children.running.values())

    def _told_parent(self) -> list[PendingApproval]:
        """What this run tells its parent it waits on (`ChildRuns.tell_parent`).

        Its calls and, as its children signalled, theirs: as recorded runs told it, so a replay sends the same.
        """
        return [*self._approvals.pending.values(), *self._children.waiting()]

    @workflow.signal(name=CHILD_APPROVALS_SIGNAL)
    def child_approvals(self, news: ChildApprovals) -> None:
        """A child run's calls waiting for a person, as it says: passed on to our parent, listed by no one."""
        self._children.heard(news)
        self._children.tell_parent(self._told_parent())

    @workflow.query(name=REJECTED_DECISIONS_QUERY)
    def rejected_decisions(self) -> list[RejectedDecision]:
        """Recent decisions this run refused, with why (kept in the worker's memory: see `Approvals.rejected`)."""
        return list(self._approvals.rejected)

    @workflow.update(name=DECIDE_UPDATE)
    def decide(self, decision: Any) -> ApprovalRecord:
        """Approve or deny one waiting call (an `ApprovalDecision` as JSON); returns the audit record.

        The input is taken as plain JSON so the validator, not the payload converter, reads it: a malformed
        field is then refused by name (`_decisions`) instead of failing to decode.
        """
        record = self._approvals.decide(decision_of(decision), via="update")
        self._show_details()
        return record

    @decide.validator
    def _validate_decision(self, decision: Any) -> None:
        """Reject an update whose decision may not be taken, before it enters the history; say why.

        Signatures are checked here with this worker's keys: a replay never runs a validator again, so it never
        needs them. A rejection is final (not retryable): sending the same decision again cannot succeed.
        """
        self._refuse_a_childs_call(decision)
        self._approvals.checked(decision, update_id=self._update_id(), keyring=self._keyring())

    def _refuse_a_childs_call(self, decision: Any) -> None:
        """A decision sent to this run about no call of its own while it has child runs: refused, saying where to.

        Which child holds the call is the child's to say (this run knows only whom it started), so the refusal
        names the children, and is listed by `rejected_decisions` like every refusal.
        """
        call_id = decision.get("call_id") if isinstance(decision, dict) else getattr(decision, "call_id", None)
        children = sorted(self._children.running)
        if not children or not isinstance(call_id, str) or call_id in self._approvals.asked():
            return
        shown = printable(clip(call_id, 80))
        if len(children) == 1:
            child = children[0]
            where = (f"it may wait in this run's child run {child!r} (a sub-agent it asked): decide it there, "
                     f"decide(client, {child!r}, {shown!r}) or `codemode approve {child} {shown}`")
        else:
            named = ", ".join(repr(c) for c in children[:5]) + (f" and {len(children) - 5} more" if len(children) > 5
                                                                else "")
            where = (f"it may wait in one of this run's child runs ({named}): decide it on the run it waits in; "
                     f"`codemode approvals {workflow.info().workflow_id}` lists each call with its run")
        self._approvals.refuse(decision, f"call {shown!r} is not one of this run's; {where}")

    @staticmethod
    def _keyring() -> ApproverKeyring:
        return keyring_for(workflow.info().task_queue) or ApproverKeyring({})

    @staticmethod
    def _update_id() -> str:
        info = workflow.current_update_info()
        assert info is not None, "called from an update's validator"
        return info.id

    @workflow.update(name=DECIDE_ALL_UPDATE)
    def decide_all(self, batch: Any) -> list[ApprovalRecord]:
        """Approve or deny every waiting call at once (a `BatchDecision` as JSON)."""
        decisions = self._approvals.batch_decisions(batch_of(batch))
        records = [self._approvals.decide(decision, via="update") for decision in decisions]
        self._show_details()
        return records

    @decide_all.validator
    def _validate_batch(self, batch: Any) -> None:
        self._approvals.checked_batch(batch, update_id=self._update_id(), keyring=self._keyring())

    @workflow.signal(name=APPROVE_SIGNAL)
    def approve(self, decision: ApprovalDecision) -> None:
        """Approve one waiting call (fire-and-forget; an invalid decision is recorded and ignored)."""
        self._signal(decision, approved=True)

    @workflow.signal(name=DENY_SIGNAL)
    def deny(self, decision: ApprovalDecision) -> None:
        """Deny one waiting call (fire-and-forget; an invalid decision is recorded and ignored)."""
        self._signal(decision, approved=False)

    def _signal(self, decision: ApprovalDecision, *, approved: bool) -> None:
        decision = replace(decision, approved=approved)
        # No keys: a replay runs signal handlers again, so their checks may use only what the run recorded.
        problem = self._approvals.refusal(decision, keyring=None)
        if problem:
            # Never raise from a signal handler: that fails the workflow task, forever.
            self._approvals.ignored_signals.append(problem)
            workflow.logger.warning("ignored approval signal: %s", problem)
            return
        self._approvals.decide(replace(decision, key_id=None, signature=None), via="signal")
        self._show_details()

    def _show_details(self) -> None:
        self._progress.show()
        self._children.tell_parent(self._told_parent())  # a child run: its parent hears of these calls, as it did
