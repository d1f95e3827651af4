"""A run's live event stream, hosted by its own workflow on Temporal's Workflow Streams.

The run workflow hosts a `temporalio.contrib.workflow_streams.WorkflowStream`: an offset-addressed log in workflow
memory, with Temporal's own handlers to read it (a query, and a long-poll update for its stock client). What the
run publishes to it, and how it stays exact:

- **The workflow publishes what it decides, where it decides it** (this module is one of the run's observers,
  `_observers.RunTelemetry`): a program's start and end, each nested call as the program makes it and as its answer
  reaches the program, prints, approvals, child runs, compute escalation, the model's tool calls and their
  answers, the run's end. A workflow-side publish is an append to workflow memory: no command, no history event. A
  replay (after an eviction, a crash, on another worker) re-executes the same code over the same history, so it
  rebuilds the same log at the same offsets: nothing is published twice and nothing is lost, by construction.
- **A model activity publishes the model's stream** (`worker/_model_stream`): batches by Workflow Streams' publish
  signal (one history event each), deduplicated by the stream's (publisher id, sequence). The signal is public, so
  this module checks every batch before the stream takes it: only while the run waits on that model turn, only
  pydantic-ai's model stream events, bounded in size, never from an attempt older than one already heard (a retry's
  first event resets what the failed attempt streamed: `ModelStreamResetEvent`). Anything else is refused by name
  and logged, never raised (a signal handler that raises fails the workflow task, forever).
- **Bounded**: the log keeps the newest `EventStreamSettings.keep_events` / `keep_bytes`; continue-as-new carries
  the newest `carry_bytes` of it (with the stream's dedup state) in the next run's input, and offsets go on.
- **A run that does not stream** publishes nothing and accepts no publish: it costs no history event and no memory.

Subscribers read with the stream's poll *query* (`client/_stream`), which costs the history nothing; the stream's
poll *update* (its stock `WorkflowStreamClient.subscribe`) records two events and every item it returns per poll.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.contrib.workflow_streams import PublishEntry, PublishInput, WorkflowStream, WorkflowStreamState

with workflow.unsafe.imports_passed_through():
    from google.protobuf.message import DecodeError
    from pydantic_ai.messages import (
        AgentStreamEvent,
        FinalResultEvent,
        FunctionToolCallEvent,
        FunctionToolResultEvent,
        PartDeltaEvent,
        PartEndEvent,
        PartStartEvent,
        ToolCallPart,
        ToolReturnPart,
    )

    from ..shared._names import RUN_CODE_TOOL
    from ..shared._results import call_arguments, one_line
    from ..shared._run_events import (
        EVENTS_TOPIC,
        MAX_EVENT_TEXT,
        MAX_NAME,
        ApprovalDecidedEvent,
        ApprovalWaitEvent,
        ChildRunEndEvent,
        ChildRunStartEvent,
        ComputeEscalatedEvent,
        EventStreamSettings,
        ModelRequestStartEvent,
        ModelStreamResetEvent,
        NestedCallEndEvent,
        NestedCallStartEvent,
        PrintEvent,
        RunContinuedEvent,
        RunEndEvent,
        RunStartEvent,
        SnippetEndEvent,
        SnippetStartEvent,
        bounded,
        bounded_text,
        model_topic_parts,
    )
    from ._observers import RunTelemetry

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelResponse

    from ..shared._approvals import ApprovalRecord, PendingApproval
    from ..shared._records import CallRecord, RunResult
    from ._approval_state import Approvals
    from ._sandbox_types import Settled, SnippetOutcome

__all__ = ["PUBLISH_SIGNAL", "RunEventStream", "StreamInfo"]

PUBLISH_SIGNAL = "__temporal_workflow_stream_publish"
"""Workflow Streams' signal for publishing from outside the workflow (its wire protocol's name)."""
_OFFSET_QUERY = "__temporal_workflow_stream_offset"
"""Workflow Streams' query for the log's next offset (its wire protocol's name)."""

_MODEL_EVENTS = (PartStartEvent, PartDeltaEvent, PartEndEvent, FinalResultEvent, ModelStreamResetEvent)
"""What a model activity may publish."""

_MAX_BATCH_ITEMS = 1_000
_MAX_ITEM_BYTES = 256 * 1024
"""A model event bigger than this is refused: one part's delta, coalesced over one batch interval, is far less."""
_MAX_PUBLISHER_ID = 128
_MAX_TOOL_CONTENT = 32 * 1024
"""Characters of a tool call's arguments or answer in a `FunctionToolCallEvent` / `FunctionToolResultEvent`: a
bigger one is shown by its preview (the model got all of it; the history has it)."""
_RECENT_REFUSALS = 20


@dataclass(kw_only=True)
class StreamInfo:
    """Whether a run streams, and its stream's window (the `STREAM_INFO_QUERY`)."""

    streams: bool | None
    """`None`: not known yet (the run has not recorded its agent's settings)."""
    base_offset: int
    """The oldest offset still kept."""
    next_offset: int
    """The offset the next event will have."""
    refused: list[str]
    """The latest publishes refused (a forged or late batch), newest last."""
    calls: int = 0
    """Tool calls the run has made so far (its usage's `tool_calls`), for the runs page."""


def _decode(wire: str) -> Payload:
    """A Workflow Streams wire item's payload: base64 of the serialized `Payload`."""
    payload = Payload()
    payload.ParseFromString(base64.b64decode(wire, validate=True))
    return payload


def _cut_part(part: Any) -> Any:
    """`part` for the stream: a tool call's arguments or a tool's answer past `_MAX_TOOL_CONTENT` as its preview."""
    if isinstance(part, ToolCallPart):
        args = part.args if isinstance(part.args, str) else one_line(part.args)
        if len(args) > _MAX_TOOL_CONTENT:
            return ToolCallPart(tool_name=part.tool_name, tool_call_id=part.tool_call_id,
                                args=bounded_text(args, _MAX_TOOL_CONTENT))
        return part
    if isinstance(part, ToolReturnPart):
        text = one_line(part.content)
        if len(text) > _MAX_TOOL_CONTENT:
            return ToolReturnPart(tool_name=part.tool_name, tool_call_id=part.tool_call_id,
                                  content=bounded_text(text, _MAX_TOOL_CONTENT), timestamp=part.timestamp,
                                  outcome=part.outcome, retry=part.retry)
        return part
    return part


def _valid_json(call: ToolCallPart) -> bool:
    """Whether the call's arguments are a JSON object (the run checks the rest where the call runs)."""
    try:
        call.args_as_dict()
    except ValueError:
        return False
    return True


class RunEventStream(RunTelemetry):
    """One run's event stream: the Workflow Stream it hosts, and the observer that publishes to it.

    Construct it in the workflow's `__init__` (Workflow Streams registers its handlers there); it publishes only
    once `start` says the run streams.
    """

    def __init__(self, prior: WorkflowStreamState | None) -> None:
        self._stream = WorkflowStream(prior)  # (its constructor checks it is called from an `__init__`)
        self._topic = self._stream.topic(EVENTS_TOPIC)
        self._stock_publish = workflow.get_signal_handler(PUBLISH_SIGNAL)
        workflow.set_signal_handler(PUBLISH_SIGNAL, self._checked_publish)
        self.settings: EventStreamSettings | None = None
        self._decided = prior is not None
        """Whether the run has said if it streams (a continued run's stream came with its input)."""
        self._sizes: deque[int] = deque((len(item.data) * 3) // 4 for item in prior.log) if prior else deque()
        self._bytes = sum(self._sizes)
        self._next = (prior.base_offset + len(prior.log)) if prior else 0
        self._model_turn: int | None = None
        self._model_attempts: dict[int, int] = {}
        """The newest attempt heard from, by model turn."""
        self._sites: dict[str, int] = {}
        """The program line of each nested call made and not yet started (`call_made` → `call`)."""
        self._waits: dict[str, ApprovalWaitEvent] = {}
        """Approval waits of nested calls not yet started: published right after their call's start (`call`)."""
        self.refused: deque[str] = deque(maxlen=_RECENT_REFUSALS)

    # -- the stream ----------------------------------------------------------------------------------------------

    def start(self, settings: EventStreamSettings | None, *, agent: str, model: str | None, first: bool) -> None:
        """The run streams with `settings` (`None`: it does not); `first`: the first workflow run of the chain."""
        self.settings, self._decided = settings, True
        if first:
            self._publish(RunStartEvent(agent=agent, run_id=workflow.info().workflow_id, model=model))

    @property
    def streams(self) -> bool:
        return self.settings is not None

    def info(self) -> StreamInfo:
        return StreamInfo(streams=self.streams if self._decided else None, base_offset=self._next - len(self._sizes),
                          next_offset=self._next, refused=list(self.refused))

    def carried(self) -> WorkflowStreamState | None:
        """The stream for the next run of a continue-as-new: its newest `carry_bytes`; `None` if it does not stream.

        Waiting pollers of the stock subscription are let go first (they follow the run into its next workflow run).
        """
        settings = self.settings
        if settings is None:
            return None
        self._trim(max_events=settings.keep_events, max_bytes=settings.carry_bytes)
        self._stream.detach_pollers()
        return self._stream.get_state()

    async def release_pollers(self) -> None:
        """Let the stock subscription's waiting polls go before the run closes (they then read it by query)."""
        self._stream.detach_pollers()
        if not workflow.all_handlers_finished():
            await workflow.wait_condition(workflow.all_handlers_finished)

    def _publish(self, event: Any) -> None:
        if self.settings is None:
            return
        payload = workflow.payload_converter().to_payloads([event])[0]
        self._topic.publish(payload)
        self._added([payload.ByteSize()])

    def _added(self, sizes: Sequence[int]) -> None:
        self._sizes.extend(sizes)
        self._bytes += sum(sizes)
        self._next += len(sizes)
        settings = self.settings
        assert settings is not None
        if len(self._sizes) > settings.keep_events or self._bytes > settings.keep_bytes:
            # Down to nine tenths of both bounds at once, so trimming (a copy of the log) is not done per event.
            self._trim(max_events=settings.keep_events * 9 // 10, max_bytes=settings.keep_bytes * 9 // 10)

    def _trim(self, *, max_events: int, max_bytes: int) -> None:
        dropped = 0
        while self._sizes and (len(self._sizes) > max_events or self._bytes > max_bytes):
            self._bytes -= self._sizes.popleft()
            dropped += 1
        if dropped:
            self._stream.truncate(self._next - len(self._sizes))

    # -- publishes from model activities -------------------------------------------------------------------------

    def _checked_publish(self, batch: Any) -> None:
        """Workflow Streams' publish signal, checked first.

        A batch the run may take goes to the stream's own handler (which drops a batch it has already taken); any
        other is refused whole, by name.
        """
        checked = self._check_batch(batch)
        if isinstance(checked, str):
            self.refused.append(checked)
            workflow.logger.warning("refused a publish to run %s's event stream: %s", workflow.info().workflow_id,
                                    checked)
            return
        publish, sizes, attempts = checked
        offset_of = workflow.get_query_handler(_OFFSET_QUERY)
        assert offset_of is not None and self._stock_publish is not None
        before = offset_of()
        self._stock_publish(publish)
        if offset_of() > before:  # taken (not a batch it had already)
            self._added(sizes)
            for turn, attempt in attempts.items():
                self._model_attempts[turn] = max(attempt, self._model_attempts.get(turn, 0))

    def _check_batch(self, batch: Any) -> tuple[PublishInput, list[int], dict[int, int]] | str:
        if self.settings is None:
            return "this run does not stream events"
        if not isinstance(batch, dict):
            return f"a publish is a PublishInput object, got {type(batch).__name__}"
        items, publisher, sequence = batch.get("items"), batch.get("publisher_id"), batch.get("sequence")
        if not isinstance(items, list) or not 0 < len(items) <= _MAX_BATCH_ITEMS:
            return f"items must be a list of 1 to {_MAX_BATCH_ITEMS} entries"
        if not isinstance(publisher, str) or not 0 < len(publisher) <= _MAX_PUBLISHER_ID:
            return f"publisher_id must be a string of 1 to {_MAX_PUBLISHER_ID} characters"
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
            return "sequence must be a positive integer"
        entries: list[PublishEntry] = []
        sizes: list[int] = []
        attempts: dict[int, int] = {}
        for item in items:
            topic, data = (item.get("topic"), item.get("data")) if isinstance(item, dict) else (None, None)
            if not isinstance(topic, str) or not isinstance(data, str):
                return "every item needs a topic and data, both strings"
            where = model_topic_parts(topic)
            if where is None:
                return f"only a model activity publishes to this stream, on a model topic; got {bounded(topic, 80)}"
            turn, attempt = where
            if turn != self._model_turn:
                waiting = "no model turn" if self._model_turn is None else f"model turn {self._model_turn}"
                return f"a publish for model turn {turn}, while the run waits on {waiting}"
            newest = max(self._model_attempts.get(turn, 0), attempts.get(turn, 0))
            if attempt < newest:
                return f"a publish from attempt {attempt} of model turn {turn}, after attempt {newest} was heard"
            if len(data) > _MAX_ITEM_BYTES * 4 // 3 + 4:
                return f"an item of {len(data):,} characters, over the {_MAX_ITEM_BYTES:,}-byte limit"
            try:
                payload = _decode(data)
                event = workflow.payload_converter().from_payload(payload, cast(Any, AgentStreamEvent))
            except (binascii.Error, DecodeError, ValueError, TypeError) as e:
                return f"an item that is not a model stream event ({type(e).__name__})"
            if not isinstance(event, _MODEL_EVENTS):
                return f"a {type(event).__name__}, which a model activity does not publish"
            attempts[turn] = max(attempt, attempts.get(turn, 0))
            entries.append(PublishEntry(topic=topic, data=data))
            sizes.append(payload.ByteSize())
        return PublishInput(items=entries, publisher_id=publisher, sequence=sequence), sizes, attempts

    # -- the observer's hooks ------------------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, RunResult[Any]], *, agent: str, run_index: int
            ) -> Coroutine[Any, Any, RunResult[Any]]:
        return self._run(coro)

    async def _run(self, coro: Coroutine[Any, Any, RunResult[Any]]) -> RunResult[Any]:
        try:
            result = await coro
        except workflow.ContinueAsNewError:
            raise  # `continuing` published it, before its input took the stream
        except asyncio.CancelledError:
            self._publish(RunEndEvent(status="cancelled"))
            self._stream.detach_pollers()
            raise
        except Exception as e:
            if workflow.is_failure_exception(e):  # it fails the run (anything else fails the task, retried)
                self._publish(RunEndEvent(status="failed", error=bounded_text(f"{type(e).__name__}: {e}")))
                await self.release_pollers()
            raise
        self._publish(RunEndEvent(status="completed"))
        await self.release_pollers()
        return result

    def continuing(self, *, run_index: int) -> None:
        self._publish(RunContinuedEvent(run_index=run_index))

    def model_request(self, coro: Coroutine[Any, Any, ModelResponse], *, turn: int, model: str | None
                      ) -> Coroutine[Any, Any, ModelResponse]:
        if self.settings is None:
            return coro
        return self._model_request(coro, turn)

    async def _model_request(self, coro: Coroutine[Any, Any, ModelResponse], turn: int) -> ModelResponse:
        self._publish(ModelRequestStartEvent(turn=turn))
        self._model_turn = turn
        try:
            answer = await coro
        except BaseException:
            if turn in self._model_attempts:  # what it streamed belongs to no response
                self._publish(ModelStreamResetEvent(turn=turn, attempt=0, reason="the model request failed"))
            raise
        finally:
            self._model_turn = None
        settings = self.settings
        if settings is not None and not settings.model_deltas:  # the response whole, each part at once
            response = getattr(answer, "response", answer)  # (a `ModelStep` carries it)
            for index, part in enumerate(getattr(response, "parts", ())):
                self._publish(PartStartEvent(index=index, part=part))
                self._publish(PartEndEvent(index=index, part=part))
        return answer

    def tool_calls(self, calls: Sequence[ToolCallPart]) -> None:
        for call in calls:
            # The run goes on to run each (pydantic-ai's `args_valid`: a UI adapter shows a call's input on it).
            self._publish(FunctionToolCallEvent(_cut_part(call), args_valid=_valid_json(call)))

    def tool_returned(self, part: ToolReturnPart) -> None:
        self._publish(FunctionToolResultEvent(_cut_part(part)))

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        if self.settings is None:
            return coro
        return self._snippet(coro, call_id, code)

    async def _snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], call_id: str, code: str) -> SnippetOutcome:
        self._publish(SnippetStartEvent(code=bounded_text(code), tool_call_id=call_id, tool_name=RUN_CODE_TOOL))
        outcome = await coro
        self._publish(SnippetEndEvent(outcome=outcome.kind, calls=len(outcome.calls), result=bounded(outcome.content),
                                      computed_seconds=outcome.computed_seconds, tool_call_id=call_id,
                                      tool_name=RUN_CODE_TOOL))
        return outcome

    def printed(self, *, call_id: str, text: str) -> None:
        for start in range(0, len(text), MAX_EVENT_TEXT):
            self._publish(PrintEvent(text=text[start:start + MAX_EVENT_TEXT], tool_call_id=call_id,
                                     tool_name=RUN_CODE_TOOL))

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None:
        self._publish(ComputeEscalatedEvent(stretch=stretch, reason=bounded_text(reason), tool_call_id=call_id,
                                            tool_name=RUN_CODE_TOOL))

    def call_made(self, *, tool: str, call_id: str, args: dict[str, Any], code: str, line: int) -> None:
        if code and self.settings is not None:  # a program's call (a direct call has no program)
            self._sites[call_id] = line

    def call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], *, tool: str, call_id: str,
             args: dict[str, Any], approvals: Approvals) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        line = self._sites.pop(call_id, None)
        if line is None:  # a direct call (its FunctionToolCallEvent says it), or a run that does not stream
            return coro
        snippet = call_id.rsplit(".", 1)[0]
        self._publish(NestedCallStartEvent(call_id=call_id, tool=tool, args=call_arguments(args), line=line,
                                           needs_approval=call_id in approvals.pending, tool_call_id=snippet,
                                           tool_name=RUN_CODE_TOOL))
        wait = self._waits.pop(call_id, None)
        if wait is not None:
            self._publish(wait)
        return self._call(coro, snippet)

    async def _call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], snippet: str
                    ) -> tuple[Settled, CallRecord]:
        settled, record = await coro
        self._publish(NestedCallEndEvent(
            call_id=record.call_id, tool=record.tool, status=record.status,
            seconds=round((record.finished_at - record.started_at).total_seconds(), 3),
            result=bounded(record.result), tool_call_id=snippet, tool_name=RUN_CODE_TOOL))
        return settled, record

    def approval_waiting(self, pending: PendingApproval, *, policy: str | None) -> None:
        nested = pending.call_id in self._sites
        wait = ApprovalWaitEvent(call_id=pending.call_id, tool=pending.tool, args=call_arguments(pending.args),
                                 line=pending.line, policy=policy, expires_at=pending.expires_at,
                                 tool_call_id=pending.call_id.rsplit(".", 1)[0] if nested else pending.call_id,
                                 tool_name=RUN_CODE_TOOL if nested else pending.tool)
        if nested:  # told before the workflow starts the call's coroutine: published after its start
            self._waits[pending.call_id] = wait
        else:
            self._publish(wait)

    def approval_decided(self, record: ApprovalRecord) -> None:
        self._publish(ApprovalDecidedEvent(
            call_id=record.call_id, tool=record.tool, approved=record.approved,
            approver=bounded(record.approver, MAX_NAME) if record.approver is not None else None,
            note=bounded(record.note, MAX_NAME) if record.note is not None else None, via=record.via,
            settled=record.settled, tool_call_id=record.call_id.rsplit(".", 1)[0], tool_name=RUN_CODE_TOOL))

    def child_run_started(self, *, call_id: str, run_id: str, agent: str) -> None:
        self._publish(ChildRunStartEvent(call_id=call_id, run_id=run_id, agent=agent,
                                         tool_call_id=call_id.rsplit(".", 1)[0], tool_name=RUN_CODE_TOOL))

    def child_run_ended(self, *, call_id: str, run_id: str, error: str | None) -> None:
        self._publish(ChildRunEndEvent(call_id=call_id, run_id=run_id, status="failed" if error else "completed",
                                       error=bounded_text(error) if error else None,
                                       tool_call_id=call_id.rsplit(".", 1)[0], tool_name=RUN_CODE_TOOL))
