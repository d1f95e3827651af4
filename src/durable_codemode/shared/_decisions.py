"""A decision as it arrives from anyone who can reach the server: its fields checked, bounded, and bound to its id.

The `decide` and `decide_all` updates take their decision as plain JSON, so the validator reads it here, field by
field, before anything is written: a malformed decision (a naive `expires_at`, a number where a name goes, a
1 MB note, a field nobody defined) is refused as `ApprovalRejected` naming the field, and never reaches the
history (an accepted update's input is recorded whole, so every field must be bounded before it is accepted).

Update ids bind a decision to its approver. `decide()` sends a decision under `<call id> by <approver>`
(`decision_update_id`), so repeating it is harmless (Temporal returns the first outcome under that id). An id in
that form is therefore reserved: a decision is accepted under it only if it is that approver's decision about
that call, so nobody can take the id another approver's decision will use (which would turn their decision into
a copy of someone else's). Other ids (a random one, as the plain `temporal` CLI sends) name no approver and are
accepted for any decision.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import fields
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ._approvals import ApprovalDecision, BatchDecision, RejectedDecision
from ._results import clip, printable

__all__ = [
    "MAX_APPROVER_CHARS",
    "MAX_CALL_ID_CHARS",
    "MAX_KEY_ID_CHARS",
    "MAX_NOTE_CHARS",
    "MAX_SIGNATURE_CHARS",
    "DecisionFieldError",
    "approver_name_problem",
    "batch_of",
    "decision_of",
    "decision_update_id",
    "read_batch",
    "read_decision",
    "rejected_entry",
    "update_id_problem",
]

MAX_NOTE_CHARS = 2_000
"""The longest note a decision may carry, in characters (a denial's note reaches the program and the model)."""
MAX_APPROVER_CHARS = 100
"""The longest approver name, in characters; a name may hold no control character (see `_results.printable`)."""
MAX_KEY_ID_CHARS = 100
"""The longest key id (`codemode keygen` makes `<approver>-<8 hex digits>`)."""
MAX_CALL_ID_CHARS = 200
"""The longest call id a decision may name (`<run_code call id>.<n>`; a provider's tool call id is ~40)."""
MAX_SIGNATURE_CHARS = 200
"""The longest signature (an Ed25519 signature is 88 characters of base64)."""

_BY = " by "

_DECISION = TypeAdapter(ApprovalDecision)
_BATCH = TypeAdapter(BatchDecision)
_DATETIME = TypeAdapter(datetime)


class DecisionFieldError(ValueError):
    """A field of a decision is malformed: `field` names it, the message says what it must be."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"the decision's {field} {problem}")
        self.field = field


def decision_update_id(call_id: str, approver: str | None) -> str:
    """The update id `decide()` sends a decision under: `<call id> by <approver>`, or the call id with no approver."""
    return call_id if approver is None else f"{call_id}{_BY}{approver}"


def update_id_problem(update_id: str, decision: ApprovalDecision | None, call_ids: Collection[str]) -> str | None:
    """Why `decision` may not be taken under `update_id`, or `None` if it may.

    `decision`: `None` for a `decide_all` batch, which may use no id reserved for one decision. `call_ids`: the
    calls this run has asked about, whose bare ids are reserved for their approver-less decisions.
    """
    own = decision_update_id(decision.call_id, decision.approver) if decision is not None else None
    if update_id == own:
        return None
    if _BY not in update_id and update_id not in call_ids:
        return None  # names no approver and no call: a random id, as the plain `temporal` CLI sends
    shown = printable(clip(update_id, 2 * MAX_CALL_ID_CHARS))
    if decision is None:
        return (f"the update id {shown!r} is reserved for one decision ('<call id> by <approver>'): send "
                "decide_all under an id of its own (decide_all() and codemode approve --all pick a random one)")
    return (f"the update id {shown!r} is reserved for another decision ('<call id> by <approver>'); this one, "
            f"{decision.approver!r}'s about call {decision.call_id!r}, goes under {own!r} (what decide() and "
            "codemode approve send) or a random id")


def approver_name_problem(name: Any) -> str | None:
    """Why `name` cannot be an approver's name, or `None` if it can: 1 to `MAX_APPROVER_CHARS` printable characters."""
    if not isinstance(name, str):
        return f"must be a string (the approver's name), got {type(name).__name__}"
    if not name.strip():
        return "must not be empty"
    if len(name) > MAX_APPROVER_CHARS:
        return f"is {len(name):,} characters long; at most {MAX_APPROVER_CHARS} are allowed"
    if printable(name) != name:
        return f"holds control characters ({printable(clip(name, 40))!r}); a name must be printable text"
    return None


def _text(raw: dict[str, Any], field: str, limit: int, *, required: bool = False) -> None:
    value = raw.get(field)
    if value is None:
        if required:
            raise DecisionFieldError(field, "is missing")
        return
    if not isinstance(value, str):
        raise DecisionFieldError(field, f"must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise DecisionFieldError(field, f"is {len(value):,} characters long; at most {limit:,} are allowed")
    if required and not value:
        raise DecisionFieldError(field, "must not be empty")


def _common(raw: Any, allowed: Collection[str], what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise DecisionFieldError("payload", f"must be a JSON object ({what}), got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        names = ", ".join(repr(printable(clip(k, 40))) for k in unknown[:5])
        raise DecisionFieldError(f"field {names}" if len(unknown) == 1 else f"fields {names}",
                                 f"{'is' if len(unknown) == 1 else 'are'} not part of a decision (it has: "
                                 f"{', '.join(sorted(allowed))})")
    if not isinstance(raw.get("approved", True), bool):
        raise DecisionFieldError("approved", f"must be true or false, got {type(raw['approved']).__name__}")
    _text(raw, "note", MAX_NOTE_CHARS)
    if raw.get("approver") is not None:
        problem = approver_name_problem(raw["approver"])
        if problem:
            raise DecisionFieldError("approver", problem)
    _text(raw, "key_id", MAX_KEY_ID_CHARS)
    expires = raw.get("expires_at")
    if expires is not None:
        if not isinstance(expires, str):
            raise DecisionFieldError("expires_at", f"must be an ISO 8601 date and time with its time zone, got "
                                     f"{type(expires).__name__}")
        try:
            moment = _DATETIME.validate_python(expires)
        except ValidationError:
            raise DecisionFieldError("expires_at", f"is not an ISO 8601 date and time: "
                                     f"{printable(clip(expires, 60))!r}") from None
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise DecisionFieldError("expires_at", f"has no time zone ({printable(clip(expires, 60))!r}): give "
                                     "its offset, e.g. 2026-12-05T10:00:00Z, so every worker reads the same moment")
    return raw


_DECISION_FIELDS = {f.name for f in fields(ApprovalDecision)}
_BATCH_FIELDS = {f.name for f in fields(BatchDecision)}


def read_decision(raw: Any) -> ApprovalDecision:
    """The `decide` update's input as a decision, every field checked (the update validator).

    Raises:
        DecisionFieldError: a field is missing, of the wrong type, too long, or unknown; the message names it.

    """
    raw = _common(raw, _DECISION_FIELDS, "call_id, approved, note, approver, key_id, signature, expires_at")
    _text(raw, "call_id", MAX_CALL_ID_CHARS, required=True)
    _text(raw, "signature", MAX_SIGNATURE_CHARS)
    return decision_of(raw)


def read_batch(raw: Any, call_ids: Collection[str]) -> BatchDecision:
    """The `decide_all` update's input as a batch decision, every field checked (the update validator).

    `call_ids`: the calls this run has asked about; a signature for any other call is refused (so a batch's size
    is bounded by the run's own calls).

    Raises:
        DecisionFieldError: as `read_decision`; also a signature for a call the run never asked about.

    """
    raw = _common(raw, _BATCH_FIELDS, "approved, note, approver, key_id, signatures, expires_at")
    if "approved" not in raw:
        raise DecisionFieldError("approved", "is missing (true approves every waiting call, false denies them)")
    signatures = raw.get("signatures") or {}
    if not isinstance(signatures, dict):
        raise DecisionFieldError("signatures", f"must map call ids to signatures, got {type(signatures).__name__}")
    for call_id, signature in signatures.items():
        if call_id not in call_ids:
            raise DecisionFieldError("signatures", f"names call {printable(clip(str(call_id), 60))!r}, which this "
                                     "run never asked about")
        if not isinstance(signature, str) or len(signature) > MAX_SIGNATURE_CHARS:
            raise DecisionFieldError("signatures", f"of call {call_id!r} must be a string of at most "
                                     f"{MAX_SIGNATURE_CHARS} characters")
    return batch_of(raw)


def decision_of(raw: Any) -> ApprovalDecision:
    """The `decide` update's input as the handler reads it (the validator, `read_decision`, has checked it).

    As the payload converter read it before the updates took plain JSON, so a recorded decision replays as it ran.
    """
    return _DECISION.validate_python(raw)


def batch_of(raw: Any) -> BatchDecision:
    """The `decide_all` update's input as the handler reads it (see `decision_of`)."""
    return _BATCH.validate_python(raw)


def rejected_entry(raw: Any, reason: str, at: datetime, *, call_id: str | None = None) -> RejectedDecision:
    """A refused input as the `rejected_decisions` query lists it, its fields cut short (it may be anything).

    `call_id`: what to list as its call (a batch names none); default: the input's own `call_id`.
    """
    def field(name: str) -> str | None:
        value = raw.get(name) if isinstance(raw, dict) else None
        return None if value is None else clip(value if isinstance(value, str) else repr(value), 120)

    approved = raw.get("approved", True) if isinstance(raw, dict) else True
    return RejectedDecision(call_id=call_id or field("call_id") or "?", approver=field("approver"),
                            key_id=field("key_id"), approved=approved is True, reason=clip(reason, 1_000), at=at)
