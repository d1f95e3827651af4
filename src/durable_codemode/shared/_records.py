"""The run's records: every tool call, snippet and turn, and the result a run returns with them.

Every call of a run has a record in its result and in each continue-as-new input, so they are compact, and
`bound_turns` keeps them under Temporal's payload limit. They are replayed, so deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import SerializationInfo, SerializerFunctionWrapHandler, model_serializer, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ToolReturnPart
from pydantic_ai.usage import RunUsage

from ._approvals import ApprovalRecord

__all__ = [
    "FILE_LISTING_LIMIT",
    "NAMED_RECORDS",
    "CallRecord",
    "RunResult",
    "SnippetRecord",
    "TurnRecord",
    "bound_turns",
]

TURNS_BUDGET_BYTES = 512 * 1024
"""Roughly how much of a run's result (and of each continue-as-new input) its turn records may take: a record is
~300 B, and Temporal refuses payloads over 2 MiB, which 25 snippets of 500 calls would pass."""


@pydantic_dataclass(kw_only=True)
class CallRecord:
    """One tool call, nested in a snippet or made directly by the model.

    Every call of a run has one in the run's result (and in each continue-as-new input), so its JSON is compact: a
    list `[call_id, tool, args, status, result, started_at, microseconds to finished_at]`, about 100 bytes fewer
    per call than an object with these keys. Objects with the keys (records written before, or by hand) are read
    too. `codemode run --json` prints objects (`NAMED_RECORDS`), as `dataclasses.asdict(record)` gives them. A
    pydantic dataclass so that its serializer applies wherever a record is nested (Temporal's converter writes
    payloads without a type).
    """

    call_id: str
    tool: str
    args: str
    """A preview of the arguments (at most ~200 characters)."""
    status: Literal["ok", "error", "cancelled", "denied"]
    result: str
    """A preview of the result or the error."""
    started_at: datetime
    finished_at: datetime

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            return value  # an object with the field names, or keyword arguments: validated as they are
        if len(value) != 7 or not isinstance(value[6], int):
            raise ValueError("a compact CallRecord is [call_id, tool, args, status, result, started_at, "
                             "microseconds to finished_at]")
        call_id, tool, args, status, result, started, micros = value
        started_at = started if isinstance(started, datetime) else datetime.fromisoformat(started)
        return {"call_id": call_id, "tool": tool, "args": args, "status": status, "result": result,
                "started_at": started_at, "finished_at": started_at + timedelta(microseconds=micros)}

    @classmethod
    def made(cls, *, call_id: str, tool: str, args: str, status: Literal["ok", "error", "cancelled", "denied"],
             result: str, started_at: datetime, finished_at: datetime) -> CallRecord:
        """A record of fields workflow code made itself, so of the right types: built without validation.

        Every nested call builds one in workflow code; validating what is right by construction was most of its
        cost there (`_record`, timed in a replay of sequential-200: ~23 -> ~12 µs of CPU a call). Records read
        from payloads are validated as ever.
        """
        record = object.__new__(cls)
        record.__dict__.update(call_id=call_id, tool=tool, args=args, status=status, result=result,
                               started_at=started_at, finished_at=finished_at)
        return record

    @model_serializer(mode="wrap")
    def _to_list(self, named: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        if isinstance(info.context, dict) and info.context.get("records") == NAMED_RECORDS["records"]:
            return named(self)
        micros = (self.finished_at - self.started_at) // timedelta(microseconds=1)
        return [self.call_id, self.tool, self.args, self.status, self.result, self.started_at, micros]


NAMED_RECORDS = {"records": "named"}
"""The serialization context that writes `CallRecord`s as objects with their field names (for people and scripts
that read the JSON), e.g. `TypeAdapter(RunResult[Any]).dump_json(result, context=NAMED_RECORDS)`."""


@dataclass(kw_only=True)
class SnippetRecord:
    """One `run_code` call."""

    call_id: str
    code: str
    outcome: Literal["ok", "error", "rejected", "compute_limit", "sandbox_crashed"]
    """`ok`: completed; `error`: raised inside the sandbox; `rejected`: syntax/type error, the model was asked
    to retry; `compute_limit` / `sandbox_crashed`: the run continued as new."""
    result: str
    """A preview of what the model got back."""
    calls: list[CallRecord] = field(default_factory=list)
    omitted_calls: int = 0
    """Call records dropped from `calls` to keep a long run's summary under Temporal's payload limit (oldest
    snippets first, see `bound_turns`); the calls themselves are in the history (`codemode trace`)."""
    computed_seconds: float | None = None
    """Compute the program did in compute activities (past its in-workflow budget); `None`: it needed none."""
    files: dict[str, int] | None = None
    """The run's files after the snippet (path under `/files` -> bytes), when it changed them; `None`: unchanged
    (or the run has no files). At most `FILE_LISTING_LIMIT` entries; `files_omitted` counts the rest."""
    files_omitted: int = 0


FILE_LISTING_LIMIT = 50
"""Files a snippet record lists at most (`SnippetRecord.files`), so a run with thousands stays small."""


@dataclass(kw_only=True)
class TurnRecord:
    """One model request and what the run did with its response."""

    index: int
    text: str
    """The text parts of the response (the final answer, on the last turn)."""
    snippets: list[SnippetRecord] = field(default_factory=list)
    direct_calls: list[CallRecord] = field(default_factory=list)
    omitted_direct_calls: int = 0
    """Like `SnippetRecord.omitted_calls`, for `direct_calls`."""


OutputT = TypeVar("OutputT")


@dataclass(kw_only=True)
class RunResult(Generic[OutputT]):
    """What an agent run returns; `RunResult[Answer]` when the client asked for the output as its type.

    From the workflow the output is the answer as JSON (a `BaseModel` as its dict); `run_agent(output_type=...)`
    and `run_result(handle, output_type=...)` validate it back into the agent's output type.
    """

    output: OutputT
    usage: RunUsage
    turns: list[TurnRecord]
    continued_as_new: int
    """Runs of this chain that ended by continue-as-new."""
    approvals: list[ApprovalRecord] = field(default_factory=list)
    """The audit trail: every approval decision of the run (who, when, note, call, arguments)."""
    messages: list[ModelMessage] = field(default_factory=list)
    """The conversation at the run's end, as `AgentRunResult.all_messages()` gives it: the history the run was given,
    then its own requests and responses (ending, for an output tool's answer, with that tool's return). Empty in
    results of runs that ended before the field existed."""
    new_message_index: int = 0
    """Where this run's own messages start in `messages` (`new_messages()`)."""
    output_tool_name: str | None = None
    """The output tool whose call gave the output, when one did (`all_messages(output_tool_return_content=...)`)."""
    run_id: str | None = None
    """The run's workflow id (`AgentRunResult.run_id`): `client.get_workflow_handle(run_id)` finds its history, and
    `codemode trace RUN_ID` draws it. `None` in results of runs that ended before the field existed."""

    def all_messages(self, *, output_tool_return_content: str | None = None) -> list[ModelMessage]:
        """The run's whole conversation, to continue it in the next run (`start_run(message_history=...)`).

        As pydantic-ai's `AgentRunResult.all_messages`: `output_tool_return_content` replaces what the output tool's
        call returned in the last message (`'Final result processed.'`), e.g. 'Please suggest another flight'.

        Raises:
            ValueError: `output_tool_return_content` for a run whose output was not given by an output tool.
            LookupError: the last message has no return of the output tool.

        """
        if output_tool_return_content is None:
            return list(self.messages)
        if self.output_tool_name is None:
            raise ValueError("Cannot set output tool return content when the output was not given by an output tool "
                             "(a text answer, or a run that ended before RunResult recorded its output tool).")
        last = self.messages[-1] if self.messages else None
        if isinstance(last, ModelRequest):
            for i, part in enumerate(last.parts):
                if isinstance(part, ToolReturnPart) and part.tool_name == self.output_tool_name:
                    answered = replace(cast(Any, part), content=output_tool_return_content)  # (subclasses narrow it)
                    parts = [*last.parts[:i], answered, *last.parts[i + 1:]]
                    return [*self.messages[:-1], replace(last, parts=parts)]
        raise LookupError(f"No tool call found with tool name {self.output_tool_name!r}.")

    def new_messages(self, *, output_tool_return_content: str | None = None) -> list[ModelMessage]:
        """The messages this run added: `all_messages()` without the history it was given."""
        return self.all_messages(output_tool_return_content=output_tool_return_content)[self.new_message_index:]

    def all_messages_json(self, *, output_tool_return_content: str | None = None) -> bytes:
        """`all_messages()` as JSON (`ModelMessagesTypeAdapter`), e.g. to store a conversation."""
        return ModelMessagesTypeAdapter.dump_json(
            self.all_messages(output_tool_return_content=output_tool_return_content))

    def new_messages_json(self, *, output_tool_return_content: str | None = None) -> bytes:
        """`new_messages()` as JSON (`ModelMessagesTypeAdapter`)."""
        return ModelMessagesTypeAdapter.dump_json(
            self.new_messages(output_tool_return_content=output_tool_return_content))

    @property
    def nested_calls(self) -> list[CallRecord]:
        """Every tool call made from a snippet, in order.

        A very long run's oldest call records may be omitted to bound the result (`SnippetRecord.omitted_calls`).
        """
        return [c for t in self.turns for s in t.snippets for c in s.calls]

    @property
    def direct_calls(self) -> list[CallRecord]:
        """Every tool call the model made directly (tools outside the sandbox, or code mode off)."""
        return [c for t in self.turns for c in t.direct_calls]


def _size(call: CallRecord) -> int:
    return len(call.call_id) + len(call.tool) + len(call.args) + len(call.result) + 160  # keys, timestamps


def _files_size(snippet: SnippetRecord) -> int:
    return sum(len(path) + 12 for path in snippet.files) if snippet.files else 0


def bound_turns(turns: list[TurnRecord], budget: int = TURNS_BUDGET_BYTES) -> None:
    """Drop the call records of the oldest snippets (and direct calls) until the records fit `budget` (in place).

    Turns, snippets, their code and result previews are kept; only per-call detail goes, counted in
    `omitted_calls`, and the snippets' file listings, counted in `files_omitted`. It is deterministic, as workflow
    code must be.
    """
    total = sum(len(s.code) + len(s.result) + 120 + sum(_size(c) for c in s.calls) + _files_size(s)
                for t in turns for s in t.snippets) + sum(_size(c) for t in turns for c in t.direct_calls)
    for turn in turns:
        if total <= budget:
            return
        for snippet in turn.snippets:
            total -= sum(_size(c) for c in snippet.calls) + _files_size(snippet)
            snippet.omitted_calls += len(snippet.calls)
            snippet.calls = []
            if snippet.files:
                snippet.files_omitted += len(snippet.files)
                snippet.files = {}
        total -= sum(_size(c) for c in turn.direct_calls)
        turn.omitted_direct_calls += len(turn.direct_calls)
        turn.direct_calls = []
