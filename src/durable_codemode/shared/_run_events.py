"""The events of a run's live stream: pydantic-ai's own, and code mode's beside them, as the wire carries them.

A streaming run publishes, in order, on one offset-addressed stream (Temporal's Workflow Streams, hosted by the run's
workflow: `workflow/_event_stream`):

- **pydantic-ai's events, for what pydantic-ai would emit**: the model's `PartStartEvent` / `PartDeltaEvent` /
  `PartEndEvent` / `FinalResultEvent` (published by the model activity as the model streams them, deltas coalesced
  per batch), then `FunctionToolCallEvent` / `FunctionToolResultEvent` for `run_code` and for the tools the model
  calls directly (published by the workflow);
- **code mode's events**, which no peer has: a program's start and end, each nested call as it starts and ends, what
  it prints, its approvals, the child runs it starts, compute it hands to an activity. They are pydantic-ai
  `CustomEvent`s (`event_kind` `'custom'`), each registered under a name in the `codemode.` namespace (as
  pydantic-ai asks of a library's events), so every consumer of pydantic-ai's `AgentStreamEvent` takes them: an
  `event_stream_handler`, the UI adapters of `pydantic_ai.ui` (which forward custom events to the frontend), an
  `isinstance` check. A new `event_kind` would have failed pydantic-ai's discriminated union in all of them.

Every field that carries untrusted text (model-written code, tool arguments and results, what a program prints,
approver names and notes, error messages) is bounded here, when the event is made; it is escaped where a person
reads it (the CLI's `printable`), never here: the events are data.

The names (`name=` below, the topics) are compatibility data, like every name in `_names`: a subscriber of one
version reads a run published by another. `tests/test_compat.py` pins them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic_ai.messages import CustomEvent

from ._errors import CodeModeUserError
from ._results import clip, one_line

__all__ = [
    "EVENTS_TOPIC",
    "MAX_EVENT_TEXT",
    "MAX_NAME",
    "MAX_PREVIEW",
    "MODEL_TOPIC_PREFIX",
    "ApprovalDecidedEvent",
    "ApprovalWaitEvent",
    "ChildRunEndEvent",
    "ChildRunStartEvent",
    "CodeModeEvent",
    "ComputeEscalatedEvent",
    "EventStreamSettings",
    "EventsTrimmedEvent",
    "ModelRequestStartEvent",
    "ModelStreamResetEvent",
    "NestedCallEndEvent",
    "NestedCallStartEvent",
    "PrintEvent",
    "RunContinuedEvent",
    "RunEndEvent",
    "RunEndStatus",
    "RunStartEvent",
    "SnippetEndEvent",
    "SnippetStartEvent",
    "bounded",
    "bounded_text",
    "model_topic",
    "model_topic_parts",
]

EVENTS_TOPIC = "codemode.events"
"""The topic the run's workflow publishes on: every event but the model's stream."""

MODEL_TOPIC_PREFIX = "codemode.model:"
"""Model activities publish on `codemode.model:<turn>:<attempt>` (`model_topic`): the workflow accepts a batch only
for the model turn it waits on, and never from an attempt older than one it has heard (`workflow/_event_stream`)."""

MAX_PREVIEW = 200
"""Characters of a preview (a nested call's arguments and result, a snippet's result)."""

MAX_EVENT_TEXT = 8192
"""Characters of a long text in one event (a program's source, a chunk of what it printed, an error message)."""

MAX_NAME = 500
"""Characters of an approver's name or note in an event."""


RunEndStatus = Literal["completed", "failed", "cancelled", "terminated", "timed_out"]
"""How a run ended (`RunEndEvent.status`)."""


def model_topic(turn: int, attempt: int) -> str:
    """The topic attempt `attempt` of the model request of turn `turn` publishes its stream on."""
    return f"{MODEL_TOPIC_PREFIX}{turn}:{attempt}"


def model_topic_parts(topic: str) -> tuple[int, int] | None:
    """`(turn, attempt)` of a model topic, or `None` if `topic` is not one."""
    if not topic.startswith(MODEL_TOPIC_PREFIX):
        return None
    turn, _, attempt = topic[len(MODEL_TOPIC_PREFIX):].partition(":")
    if not (turn.isdigit() and attempt.isdigit()) or len(turn) > 9 or len(attempt) > 9:
        return None
    return int(turn), int(attempt)


def bounded(value: Any, limit: int = MAX_PREVIEW) -> str:
    """`value` as one line of text (JSON unless it is a string), at most `limit` characters, `…` if cut."""
    return clip(one_line(value), limit)


def bounded_text(text: str, limit: int = MAX_EVENT_TEXT) -> str:
    """Multi-line `text` kept as it is, cut to `limit` characters with a note of how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"…({len(text) - limit:,} more characters)"


@dataclass(frozen=True, kw_only=True)
class EventStreamSettings:
    """How a streaming run's event stream behaves: `CodeModeAgent(stream=EventStreamSettings(...))`.

    Recorded when the run starts (in its `AgentSpec`), so a deploy never changes the window an open run keeps.

    Example:
        ```python
        from datetime import timedelta

        from durable_codemode import EventStreamSettings

        settings = EventStreamSettings(model_batch_interval=timedelta(milliseconds=250), keep_events=2_000)
        ```

    """

    model_batch_interval: timedelta = timedelta(milliseconds=100)
    """How often a model activity sends what the model streamed to the run (one signal, one history event each):
    the model's deltas within one interval are coalesced into one delta per part. Longer: fewer history events,
    a later first token at the subscriber. Between 10 ms and 10 s."""
    model_deltas: bool = True
    """Stream the model's response as it is made (parts and deltas, published by the model activity: a signal, so
    a history event, per batch interval while the model streams). `False`: each part is published whole, once the
    response is in, by the workflow: no history event at all, and no text before the response is complete."""
    keep_events: int = 5_000
    """Events the run keeps in its workflow's memory for subscribers; older ones are trimmed (a subscriber that
    resumes from a trimmed offset gets a `codemode.events_trimmed` event saying how many it missed)."""
    keep_bytes: int = 4 * 1024 * 1024
    """Bytes of events the run keeps in memory (their encoded payloads), whichever bound comes first."""
    carry_bytes: int = 256 * 1024
    """Bytes of the newest events carried across continue-as-new, in the next run's input (so in its history):
    a subscriber resuming across the boundary loses nothing within them."""

    def __post_init__(self) -> None:
        problems = []
        if not timedelta(milliseconds=10) <= self.model_batch_interval <= timedelta(seconds=10):
            problems.append(f"model_batch_interval must be between 10 ms and 10 s, got {self.model_batch_interval}")
        if not 10 <= self.keep_events <= 1_000_000:
            problems.append(f"keep_events must be between 10 and 1,000,000, got {self.keep_events}")
        if not 64 * 1024 <= self.keep_bytes <= 256 * 1024 * 1024:
            problems.append(f"keep_bytes must be between 64 KiB and 256 MiB, got {self.keep_bytes}")
        if not 0 <= self.carry_bytes <= 1024 * 1024:
            problems.append(f"carry_bytes must be between 0 and 1 MiB (it travels in the continue-as-new input, "
                            f"under Temporal's 2 MiB payload limit), got {self.carry_bytes}")
        if problems:
            raise CodeModeUserError("EventStreamSettings: " + "; ".join(problems))


@dataclass(kw_only=True, repr=False)
class CodeModeEvent(CustomEvent, abstract=True):
    """A code-mode event of a run's stream (a pydantic-ai `CustomEvent`): `isinstance(e, CodeModeEvent)`.

    `tool_call_id` is the model's tool call the event belongs to (the `run_code` call of a program's events, so a
    UI adapter attributes them to it), `tool_name` that tool's name.
    """


@dataclass(kw_only=True, repr=False)
class RunStartEvent(CodeModeEvent, name="codemode.run_start"):
    """The run started (first thing on its stream)."""

    agent: str
    run_id: str
    """The run's workflow id."""
    model: str | None = None
    """The model the run asks (its `model=` override or the agent's), as recorded."""


@dataclass(kw_only=True, repr=False)
class ModelRequestStartEvent(CodeModeEvent, name="codemode.model_request"):
    """The run asks its model (turn `turn`, from 0); the model's own events follow as it streams."""

    turn: int


@dataclass(kw_only=True, repr=False)
class ModelStreamResetEvent(CodeModeEvent, name="codemode.model_stream_reset"):
    """Forget what the model streamed so far in turn `turn`: that attempt failed; a retry streams it again.

    Published by a retried model activity before its first event, and by the run when a model request fails for
    good (its partial stream belongs to no response).
    """

    turn: int
    attempt: int
    """The attempt that streams next (2 for the first retry); 0 when none will."""
    reason: str = ""


@dataclass(kw_only=True, repr=False)
class SnippetStartEvent(CodeModeEvent, name="codemode.snippet_start"):
    """A `run_code` program starts (`tool_call_id` is its call id)."""

    code: str
    """The program's source (cut past `MAX_EVENT_TEXT` characters, with a note)."""


@dataclass(kw_only=True, repr=False)
class NestedCallStartEvent(CodeModeEvent, name="codemode.nested_call_start"):
    """A program calls a tool (one activity, or a child run): in the order the program made the calls."""

    call_id: str
    """The nested call's id, `<run_code call id>.<n>` (also its activity's id, before the digest)."""
    tool: str
    args: str
    """A preview of the arguments as the call is written (`i=3, name="x"`), at most `MAX_PREVIEW` characters."""
    line: int
    """The program's line the call is on (1-based)."""
    needs_approval: bool = False
    """The call waits for a person first (an `ApprovalWaitEvent` follows)."""


@dataclass(kw_only=True, repr=False)
class NestedCallEndEvent(CodeModeEvent, name="codemode.nested_call_end"):
    """A program's tool call settled: its answer reached the program."""

    call_id: str
    tool: str
    status: Literal["ok", "error", "denied", "cancelled"]
    seconds: float
    """From the call's start (once approved, if it waited for a person) to its answer, in workflow time."""
    result: str
    """A preview of the result (`ok`), or the exception the program got (`error`, `denied`)."""


@dataclass(kw_only=True, repr=False)
class PrintEvent(CodeModeEvent, name="codemode.print"):
    """What the program printed since its last print event (whenever it next waits on Temporal, and at its end)."""

    text: str


@dataclass(kw_only=True, repr=False)
class ApprovalWaitEvent(CodeModeEvent, name="codemode.approval_wait"):
    """A call waits for a person to decide it: decide with `codemode approve RUN CALL` or `decide(...)`."""

    call_id: str
    tool: str
    args: str
    """A preview of the arguments as the call is written (`pending_approvals` has them whole)."""
    line: int
    policy: str | None = None
    """Who may decide, in words (the tool's approver policy); `None`: anyone the workers accept."""
    expires_at: datetime | None = None
    """When it is denied automatically; `None`: it waits as long as it takes."""


@dataclass(kw_only=True, repr=False)
class ApprovalDecidedEvent(CodeModeEvent, name="codemode.approval_decided"):
    """A person (or the timeout) decided a waiting call."""

    call_id: str
    tool: str
    approved: bool
    approver: str | None
    """Who decided (as the decision names them; checked against the policy and the key when signed)."""
    note: str | None = None
    via: str = "update"
    """How the decision came: `update`, `signal` or `timeout`."""
    settled: bool = True
    """Whether it settled the call; `False`: one approval of several the policy requires."""


@dataclass(kw_only=True, repr=False)
class ChildRunStartEvent(CodeModeEvent, name="codemode.child_run_start"):
    """A call starts a child run (`child_run_tool`): subscribe to `run_id` to follow the child's own events."""

    call_id: str
    run_id: str
    agent: str


@dataclass(kw_only=True, repr=False)
class ChildRunEndEvent(CodeModeEvent, name="codemode.child_run_end"):
    """A child run ended: its output answers the call, or its failure is the program's exception."""

    call_id: str
    run_id: str
    status: Literal["completed", "failed"]
    error: str | None = None


@dataclass(kw_only=True, repr=False)
class ComputeEscalatedEvent(CodeModeEvent, name="codemode.compute_escalated"):
    """The program computed past its in-workflow budget: it goes on in the compute activity."""

    stretch: int
    """Which stretch of compute (0: from the start; n: after the program's n-th host round trip)."""
    reason: str


@dataclass(kw_only=True, repr=False)
class SnippetEndEvent(CodeModeEvent, name="codemode.snippet_end"):
    """A `run_code` program ended; its result goes back to the model (the `FunctionToolResultEvent` after this)."""

    outcome: Literal["ok", "error", "rejected", "compute_limit", "sandbox_crashed"]
    calls: int
    """Nested calls the program made."""
    result: str
    """A preview of what goes back to the model."""
    computed_seconds: float | None = None
    """Compute it did in the compute activity, if any."""


@dataclass(kw_only=True, repr=False)
class RunContinuedEvent(CodeModeEvent, name="codemode.continued_as_new"):
    """The run goes on as a fresh workflow run (same run id, same stream: offsets go on)."""

    run_index: int
    """The new workflow run's index in the chain (1 for the first continuation)."""


@dataclass(kw_only=True, repr=False)
class RunEndEvent(CodeModeEvent, name="codemode.run_end"):
    """The run ended: the last event of its stream.

    `durable_codemode.stream_events` hands a completed run's end on as pydantic-ai's `AgentRunResultEvent` (with the
    run's `RunResult`); a run that ended otherwise ends the stream with this event itself.
    """

    status: RunEndStatus
    error: str | None = None
    """Why the run failed, as its failure says."""


@dataclass(kw_only=True, repr=False)
class EventsTrimmedEvent(CodeModeEvent, name="codemode.events_trimmed"):
    """Events a subscriber asked for were trimmed from the run's window before it read them (made by the client).

    Its offset is the first one missed; reading goes on at `first_kept`.
    """

    missed: int
    first_kept: int

