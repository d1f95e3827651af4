"""A run's approvals in workflow memory: the calls waiting for a person, the decisions, the served rules.

The state changes only through what history records (the call reaching the tool, an accepted update, a signal, a
timer firing), so replay rebuilds it exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, NoReturn, Protocol

from pydantic import TypeAdapter
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from ..shared._approvals import (
    ApprovalDecision,
    ApprovalRecord,
    BatchDecision,
    PendingApproval,
    RecordedApproverPolicy,
    RejectedDecision,
)
from ..shared._decisions import (
    DecisionFieldError,
    read_batch,
    read_decision,
    rejected_entry,
    update_id_problem,
)
from ..shared._errors import CodeModeUserError
from ..shared._names import call_digest, call_fingerprint
from ..shared._results import clip, printable
from ..shared._signing import ApproverKeyring, legacy_signing_payload, signing_payload

__all__ = ["RULE_GONE", "RULE_UNKNOWN", "ApprovalRuleSource", "Approvals", "DecisionRules", "approval_rule",
           "denial_message", "keyring_for", "rule_verdict", "serve", "serve_keyring", "served_agent", "served_agents"]


class ApprovalRuleSource(Protocol):
    """What workflow code needs of a served agent: its name and its tools' approval rules (a `CodeModeAgent`)."""

    @property
    def name(self) -> str: ...

    def approval_rule_for(self, tool: str) -> Callable[[dict[str, Any]], bool] | None: ...


_SERVED: dict[str, ApprovalRuleSource] = {}
"""The agents `create_worker` serves in this process, for what workflow code needs of them: approval rules."""


RULE_UNKNOWN = "has an approval rule, but this process does not know it"
"""In `approval_rule`'s error when no agent of that name is served here (a replay without the worker's agents)."""

RULE_GONE = "no longer has an approval rule in this process"
"""In `approval_rule`'s error when the agent is served here but its tool has no rule now (a deploy dropped it)."""


def approval_rule(agent: str, tool: str) -> Callable[[dict[str, Any]], bool]:
    """The approval rule of `tool` of `agent` in this process.

    What runs of behaviour version 1 ask on every replay of a call (later runs record the verdict: `rule_verdict`).

    Raises:
        CodeModeUserError: this process does not serve that agent (e.g. a replay without the worker's agents), or
            serves it without a rule for that tool.

    """
    served = _SERVED.get(agent)
    rule = served.approval_rule_for(tool) if served is not None else None
    if rule is None and served is not None:
        raise CodeModeUserError(
            f"tool {tool!r} of agent {agent!r} {RULE_GONE}, but this run asks its rule again on every replay: it was "
            "started by a release that did not record rules' verdicts (behaviour version 1). Replay it, or let it "
            "finish, with the agent as it was when the run started (the worker version that started it)")
    if rule is None:
        raise CodeModeUserError(
            f"tool {tool!r} of agent {agent!r} {RULE_UNKNOWN}: run the workflow in a process where `create_worker` "
            "serves that agent"
        )
    return rule


def rule_verdict(agent: str, tool: str, args: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether the approval rule of `tool` sends this call to a person, live; and why it did without asking, if so.

    A rule this process does not have (a deploy dropped it, or the agent), or one that raises, sends the call to a
    person: the verdict that never lets a call through unchecked, and never fails the workflow task (which would
    wedge the run in task retries). The second value says why, for the worker's log.
    """
    served = _SERVED.get(agent)
    rule = served.approval_rule_for(tool) if served is not None else None
    if rule is None:
        where = "this worker does not serve the agent" if served is None else "this worker's agent has no rule for it"
        return True, (f"the run recorded that tool {tool!r} of agent {agent!r} has an approval rule, but {where}: "
                      "the call waits for a person")
    try:
        return bool(rule(args)), None
    except Exception as e:  # a user's rule: whatever it raises, the call is decided by a person
        return True, (f"the approval rule of tool {tool!r} of agent {agent!r} raised {type(e).__name__}: {e}: the "
                      "call waits for a person")


def serve(agent: ApprovalRuleSource) -> None:
    """Make `agent` known to workflow code in this process (done by `create_worker` and the replay commands)."""
    _SERVED[agent.name] = agent


def served_agents() -> set[str]:
    """The names of the agents workflow code in this process knows."""
    return set(_SERVED)


def served_agent(name: str) -> ApprovalRuleSource | None:
    """The agent called `name` that workflow code in this process knows, if any."""
    return _SERVED.get(name)


_KEYRINGS: dict[str, ApproverKeyring] = {}
"""The approver keys of the workers in this process, by task queue: what the update validator checks with."""


def serve_keyring(task_queue: str, keyring: ApproverKeyring) -> None:
    """Make a worker's approver keys known to workflow code of its task queue (done by `create_worker`)."""
    _KEYRINGS[task_queue] = keyring


def keyring_for(task_queue: str) -> ApproverKeyring | None:
    """The approver keys of this process's worker on `task_queue`, if it has any."""
    return _KEYRINGS.get(task_queue)


@dataclass(frozen=True)
class DecisionRules:
    """What a run checks a decision against, all recorded when it started (so a replay checks the same)."""

    policy_of: Callable[[str], RecordedApproverPolicy | None]
    """The approver policy of a tool, by name."""
    signed: bool
    """Decisions must be signed (`AgentSpec.signed_approvals`)."""
    starter: str | None
    """Who started the run (`RunInput.started_by`)."""


_RECENT_REJECTIONS = 50

_DECISION_JSON = TypeAdapter(ApprovalDecision)


class Approvals:
    """The pending calls and decisions of one workflow run."""

    def __init__(self, audit: list[ApprovalRecord] | None = None, rules: DecisionRules | None = None) -> None:
        self.pending: dict[str, PendingApproval] = {}
        self.decided: dict[str, ApprovalRecord] = {}
        self.audit: list[ApprovalRecord] = list(audit or [])
        self.ignored_signals: list[str] = []
        self.rules = rules or DecisionRules(policy_of=lambda tool: None, signed=False, starter=None)
        self.votes: dict[str, list[ApprovalRecord]] = {}
        """The decisions counted so far on calls that need several (a policy's `required`), by call id."""
        self.on_decided: Callable[[ApprovalRecord], None] = lambda record: None
        """Told of every decision `decide` records (the run's observers: its event stream)."""
        self.rejected: deque[RejectedDecision] = deque(maxlen=_RECENT_REJECTIONS)
        """Recent decisions the update validator refused. Kept in the worker's memory only (a refused decision
        never enters the history), so it starts empty when a worker loads the run again."""

    def asked(self) -> set[str]:
        """The calls this run has asked a person about (waiting, being voted on, or decided)."""
        return {*self.pending, *self.votes, *self.decided}

    def checked(self, raw: Any, *, update_id: str, keyring: ApproverKeyring) -> ApprovalDecision:
        """The `decide` update's input as a decision this run may take now (the update validator).

        Raises:
            ApplicationError: `ApprovalRejected`, not retryable, saying why (a malformed field, by name; an update
                id reserved for another decision; the call, the approver policy, the signature); the refusal is
                remembered for the `rejected_decisions` query.

        """
        try:
            decision = read_decision(raw)
        except DecisionFieldError as e:
            self._refuse(rejected_entry(raw, str(e), workflow.now()))
        problem = update_id_problem(update_id, decision, self.asked()) or self.refusal(decision, keyring=keyring)
        if problem:
            self._refuse(self._rejected(decision, problem))
        return decision

    def checked_batch(self, raw: Any, *, update_id: str, keyring: ApproverKeyring) -> list[ApprovalDecision]:
        """The `decide_all` update's input as the decisions it makes, if this run may take them all (as `checked`)."""
        try:
            batch = read_batch(raw, self.asked())
        except DecisionFieldError as e:
            self._refuse(rejected_entry(raw, str(e), workflow.now(), call_id="(every waiting call)"))
        problem = update_id_problem(update_id, None, self.asked())
        if problem is None and not self.pending:
            problem = "no call is waiting for approval in this run"
        if problem:
            self._refuse(rejected_entry(raw, problem, workflow.now(), call_id="(every waiting call)"))
        decisions = self.batch_decisions(batch)
        for decision in decisions:
            refusal = self.refusal(decision, keyring=keyring)
            if refusal:
                self._refuse(self._rejected(decision, refusal))
        return decisions

    def batch_decisions(self, batch: BatchDecision) -> list[ApprovalDecision]:
        """A `decide_all` batch as one decision per waiting call, in call id order."""
        return [ApprovalDecision(call_id=call_id, approved=batch.approved, note=batch.note, approver=batch.approver,
                                 key_id=batch.key_id, signature=batch.signatures.get(call_id),
                                 expires_at=batch.expires_at)
                for call_id in sorted(self.pending)]

    def refuse(self, raw: Any, reason: str) -> NoReturn:
        """Refuse the update whose input is `raw`, saying `reason`: listed by `rejected_decisions`, not retryable."""
        self._refuse(rejected_entry(raw, reason, workflow.now()))

    def _refuse(self, entry: RejectedDecision) -> NoReturn:
        self.rejected.append(entry)
        raise ApplicationError(entry.reason, type="ApprovalRejected", non_retryable=True)

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

    def refusal(self, decision: ApprovalDecision, *, keyring: ApproverKeyring | None) -> str | None:
        """Why `decision` may not be taken (its call, the approver policy, its signature), or `None` if it may.

        `keyring`: the worker's approver keys, to verify signatures (the update validator, which a replay never
        runs again); `None` for signals, which a replay does run again, so they cannot depend on keys.
        """
        rules = self.rules
        if keyring is None:
            # A signal's decision is held to the update's field rules (`_decisions`: sizes, types, printable
            # approver names) and ignored when it breaks one. Its input is decoded before it gets here, so it is
            # checked as it would have arrived as JSON.
            try:
                read_decision(_DECISION_JSON.dump_python(decision, mode="json"))
            except DecisionFieldError as e:
                return str(e)
        problem = self.problem(decision.call_id)
        if problem:
            return problem
        pending = self.pending[decision.call_id]
        if keyring is None and rules.signed:
            return ("this run takes only signed decisions, and signals cannot be checked for a signature: send the "
                    "decision by the `decide` update (codemode approve, durable_codemode.decide)")
        policy = rules.policy_of(pending.tool)
        if policy is not None:
            if decision.approver not in policy.approvers:
                who = repr(decision.approver) if decision.approver else "a decision naming no approver"
                return f"{who} may not decide {pending.tool}() calls: they need {policy.describe()}"
            if decision.approved and not policy.allow_self_approval and decision.approver == rules.starter:
                return (f"{decision.approver!r} started this run and may not approve its own {pending.tool}() "
                        f"calls: they need {policy.describe()}")
            if any(v.approver == decision.approver for v in self.votes.get(decision.call_id, [])):
                return (f"{decision.approver!r} has already decided call {decision.call_id!r}; it needs "
                        f"{policy.describe()}")
        if keyring is not None and (rules.signed or decision.signature is not None):
            return self._signature_problem(decision, keyring)
        return None

    def _signature_problem(self, decision: ApprovalDecision, keyring: ApproverKeyring) -> str | None:
        if not decision.signature or not decision.key_id:
            return keyring.verify(decision.key_id, decision.signature, b"", decision.approver)  # says what to do
        if decision.expires_at is None:
            return "a signed decision needs expires_at (when its signature stops being valid)"
        now = workflow.now()
        if decision.expires_at <= now:
            return f"the decision expired at {decision.expires_at.isoformat()}; sign it again"
        info = workflow.info()
        pending = self.pending[decision.call_id]
        signed: dict[str, Any] = {
            "namespace": info.namespace, "run_id": info.workflow_id, "call_id": decision.call_id,
            "approved": decision.approved, "note": decision.note, "approver": decision.approver or "",
            "expires_at": decision.expires_at}
        payload = signing_payload(**signed, call_fingerprint=call_fingerprint(pending.tool, pending.args))
        if not keyring:
            return ("this worker holds no approver keys to check the signature with: give create_worker("
                    "approver_keys=...) the approvers' public keys")
        problem = keyring.verify(decision.key_id, decision.signature, payload, decision.approver)
        if problem is not None and keyring.verify(decision.key_id, decision.signature, legacy_signing_payload(
                **signed), decision.approver) is None:
            return ("the decision is signed as clients of durable-codemode 0.2.0 and before signed, which does not "
                    "cover the call's arguments, so it cannot show the approver saw the arguments the call holds: "
                    "sign it again with this release's client (codemode approve --key FILE, or decide(..., "
                    "signer=ApprovalSigner.load(FILE)))")
        return problem

    @staticmethod
    def _rejected(decision: ApprovalDecision, reason: str) -> RejectedDecision:
        return RejectedDecision(call_id=decision.call_id, approver=decision.approver, key_id=decision.key_id,
                                approved=decision.approved, reason=reason, at=workflow.now())

    def decide(self, decision: ApprovalDecision, *, via: Literal["update", "signal", "timeout"]) -> ApprovalRecord:
        """Record a decision on a pending call (the caller has checked `refusal()` first); settle it when it may.

        Under an approver policy a call settles once it has its `required` approvals, or at a denial (the first
        one when `any_denial_wins`, else once the approvals it needs can no longer come).
        """
        pending = self.pending[decision.call_id]
        policy = self.rules.policy_of(pending.tool) if via != "timeout" else None
        record = ApprovalRecord(
            call_id=pending.call_id, tool=pending.tool, args=pending.args, requested_at=pending.requested_at,
            decided_at=workflow.now(), approved=decision.approved, note=decision.note, approver=decision.approver,
            via=via, key_id=decision.key_id, signed=decision.signature is not None,
            policy=policy.describe() if policy else None, args_digest=call_digest(pending.tool, pending.args),
        )
        votes = self.votes.setdefault(pending.call_id, [])
        votes.append(record)
        record.settled = policy is None or self._settles(policy, votes)
        self.audit.append(record)
        if record.settled:
            self.pending.pop(pending.call_id)
            self.votes.pop(pending.call_id, None)
            self.decided[pending.call_id] = record  # the settling decision's own vote is the call's outcome
        self.on_decided(record)
        return record

    def _settles(self, policy: RecordedApproverPolicy, votes: list[ApprovalRecord]) -> bool:
        approvals = sum(v.approved for v in votes)
        if votes[-1].approved:
            return approvals >= policy.required
        if policy.any_denial_wins:
            return True
        voted = {v.approver for v in votes}
        could_still = [p for p in policy.approvers if p not in voted
                       and (policy.allow_self_approval or p != self.rules.starter)]
        return approvals + len(could_still) < policy.required

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
        """What the run waits for, for the Temporal UI's current details.

        Call ids hold the model's tool call ids (untrusted text, escaped as the CLI escapes it), and a gather may
        wait on hundreds of calls: the first `_DETAILS_CALLS` are named, then how many more.
        """
        if not self.pending:
            return ""
        waiting = list(self.pending.values())
        calls = "; ".join(f"{printable(clip(p.call_id, 80))} {p.tool}" for p in waiting[:_DETAILS_CALLS])
        if len(waiting) > _DETAILS_CALLS:
            calls += f"; … {len(waiting) - _DETAILS_CALLS} more"
        return f"waiting for approval of {len(self.pending)} call(s): {calls}"


_DETAILS_CALLS = 10
"""Waiting calls the current details name one by one (`Approvals.details`); the rest are counted."""

def denial_message(record: ApprovalRecord) -> str:
    """The `PermissionError` message a program sees for a denied call."""
    who = record.approver or ("the approval timeout" if record.via == "timeout" else "an approver")
    return f"{record.tool}() was denied by {who}" + (f": {record.note}" if record.note else "")
