"""Subscribing to a run's live event stream: `stream_events`, and `run_agent`'s `event_stream_handler`.

A streaming run's workflow hosts its events (`workflow/_event_stream`); a subscriber reads them with Workflow Streams'
poll *query*, from an offset, every `poll_interval` while it is caught up and at once while events are waiting. A
query costs the run's history nothing. (Workflow Streams' own subscriber long-polls with an *update* instead, which
answers sooner when idle but records two history events per poll and every event it returns: measured in
`bench/stream_bench.py`, a subscriber of that kind grew a 200-call run's history by a quarter.)

Offsets are the stream's own: increasing, the same for every subscriber and across continue-as-new. A subscriber
that stops (a dropped connection, a restarted process) resumes with `after=<the last offset it saw>` and gets each
later event exactly once. Events older than the run's window (`EventStreamSettings.keep_events`) are gone; a
subscriber that asks for them gets one `EventsTrimmedEvent` saying how many, then the oldest kept.
"""

from __future__ import annotations

import asyncio
import base64
import time
import warnings
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import pydantic
from pydantic_ai import RunContext
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.messages import (
    AgentStreamEvent,
    FinalResultEvent,
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.run import AgentRunResultEvent
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RunUsage
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowQueryFailedError
from temporalio.contrib.workflow_streams import PollInput, PollResult
from temporalio.service import RPCError, RPCStatusCode

from .._pydantic_ai import agent_run_result
from ..shared._errors import CodeModeUserError, RunNotFoundError, WorkerUnavailableError
from ..shared._names import STREAM_INFO_QUERY
from ..shared._run_events import (
    EventsTrimmedEvent,
    ModelRequestStartEvent,
    ModelStreamResetEvent,
    RunEndEvent,
    RunEndStatus,
    RunStartEvent,
)
from ..workflow._event_stream import StreamInfo
from ..workflow._run import CodeModeRunWorkflow
from ._answering import no_answer
from ._runs import DEFAULT_ANSWER_TIMEOUT, run_result

__all__ = ["DEFAULT_PATIENCE", "DEFAULT_POLL_INTERVAL", "RunEventItem", "feed_event_stream_handler", "stream_events",
           "streams"]

DEFAULT_POLL_INTERVAL = timedelta(milliseconds=100)
"""How often a caught-up subscriber asks the run for new events."""

_POLL_QUERY = "__temporal_workflow_stream_poll"
"""Workflow Streams' query for the events from an offset (its wire protocol's name)."""

DEFAULT_PATIENCE = timedelta(minutes=5)
"""How long a subscriber keeps asking while no worker answers or the server is unreachable (`stream_events`)."""

_PASSING = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED,
                      RPCStatusCode.INTERNAL, RPCStatusCode.UNKNOWN, RPCStatusCode.RESOURCE_EXHAUSTED})
"""Failures of a question that pass (a server restarting, a worker deploying): asked again, within `patience`."""
_AGAIN = 0.2
"""Seconds between questions while they fail that way."""

_CLOSED_CHECK = timedelta(seconds=1)
"""How long a subscriber hears nothing before it asks the server whether the run closed without an end event
(terminated, timed out: the workflow's code did not run to say so)."""

_ENDED: dict[WorkflowExecutionStatus, RunEndStatus] = {
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.COMPLETED: "completed",
}

_MODEL_PHASE = (PartStartEvent, PartDeltaEvent, PartEndEvent, FinalResultEvent, ModelRequestStartEvent,
                ModelStreamResetEvent)
"""The events of a model request (pydantic-ai's `ModelRequestNode` stream); the rest are a response's tool calls."""


@dataclass(frozen=True)
class RunEventItem:
    """One event of a run's stream, at its offset (resume after it with `stream_events(..., after=offset)`)."""

    offset: int
    event: AgentStreamEvent | AgentRunResultEvent[Any]
    """pydantic-ai's event, or one of code mode's (`durable_codemode.events`, pydantic-ai `CustomEvent`s); last, the
    run's end: `AgentRunResultEvent` for a completed run, `RunEndEvent` for one that ended otherwise."""


def _decoded(wire: str) -> Payload:
    payload = Payload()
    payload.ParseFromString(base64.b64decode(wire))
    return payload


@dataclass(frozen=True)
class _Run:
    """The questions a subscriber asks one run, with their failures as errors that say what to do."""

    client: Client
    handle: WorkflowHandle[Any, Any]
    timeout: timedelta
    patience: timedelta = DEFAULT_PATIENCE

    async def _ask(self, what: Awaitable[Any]) -> Any:
        run_id = self.handle.id
        try:
            return await what
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFoundError(run_id, self.client.service_client.config.target_host) from e
            if e.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
                # Its events are served by the run's workflow: a worker must answer.
                raise await no_answer(self.client, run_id, self.timeout, what="answered",
                                      todo="follow its events again") from e
            raise
        except WorkflowQueryFailedError as e:
            if "unknown" in str(e).lower() or "not registered" in str(e).lower():
                raise CodeModeUserError(
                    f"run {run_id!r} is served by a worker that does not stream events (a durable-codemode release "
                    f"before streaming): upgrade its workers, or follow it with `codemode watch {run_id}`") from e
            raise

    async def info(self, poll: float) -> StreamInfo:
        """Whether the run streams, waiting for it to say (it does once it has recorded its agent's settings)."""
        while True:
            info: StreamInfo = await self._ask(self.handle.query(STREAM_INFO_QUERY, result_type=StreamInfo,
                                                                 rpc_timeout=self.timeout))
            if info.streams is not None:
                return info
            await asyncio.sleep(poll)

    async def page(self, offset: int) -> PollResult:
        """The run's events from `offset` on; while no worker or server answers, asked again for `patience`."""
        since = time.monotonic()
        while True:
            try:
                page: PollResult = await self._ask(self.handle.query(
                    _POLL_QUERY, PollInput(topics=[], from_offset=offset), result_type=PollResult,
                    rpc_timeout=self.timeout))
                return page
            except (WorkerUnavailableError, RPCError) as e:
                passing = not isinstance(e, RPCError) or e.status in _PASSING
                if not passing or time.monotonic() - since > self.patience.total_seconds():
                    raise
            await asyncio.sleep(_AGAIN)


async def streams(client: Client, run_id: str, *, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT) -> bool:
    """Whether run `run_id` streams its events (waiting, briefly, for a run that has not said yet).

    `False` too when no worker answers or the run's worker predates streaming: its history can still be followed.

    Raises:
        RunNotFoundError: no run `run_id` on the server.

    """
    run = _Run(client, client.get_workflow_handle_for(CodeModeRunWorkflow.run, run_id), timeout)
    try:
        info = await run.info(DEFAULT_POLL_INTERVAL.total_seconds())
    except (WorkerUnavailableError, CodeModeUserError, RPCError, WorkflowQueryFailedError):
        return False
    return bool(info.streams)


async def stream_events(
    client: Client,
    run_id: str,
    *,
    after: int | None = None,
    output_type: Any = None,
    poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
    timeout: timedelta = DEFAULT_ANSWER_TIMEOUT,
    patience: timedelta = DEFAULT_PATIENCE,
) -> AsyncGenerator[RunEventItem, None]:
    """The events of run `run_id` as it publishes them, from its start or after offset `after`, until its end.

    Args:
        client: from `durable_codemode.connect()`.
        run_id: the run's workflow id (it must stream: `start_run(stream=True)` or `CodeModeAgent(stream=True)`).
        after: the last offset already seen: resume after it (each later event exactly once). `None`: from the
            first event the run still keeps.
        output_type: the type a completed run's output is rebuilt as in its `AgentRunResultEvent` (as `run_agent`
            takes it); `None`: the JSON the workflow returned.
        poll_interval: how often to ask the run for new events while caught up (one query each, no history).
        timeout: how long one question may wait for a worker to answer.
        patience: once streaming, how long to keep asking while no worker answers or the server is unreachable (a
            deploy, a crashed worker, a server restart) before giving up with the error; the run's events wait in
            its history meanwhile, and nothing is lost or repeated when a worker answers again.

    Yields:
        `RunEventItem`s in offset order. The last is the run's end: pydantic-ai's `AgentRunResultEvent` when it
        completed, else a `RunEndEvent` (failed, cancelled, terminated, timed out); the iterator then ends. A run
        that continues as new goes on in the same stream (a `RunContinuedEvent` marks it).

    Raises:
        RunNotFoundError: no run `run_id` on the server.
        CodeModeUserError: the run does not stream its events, or `after` is not an offset.
        WorkerUnavailableError: no worker answers for the run (its events are served by its workflow): at once
            for the first question, after `patience` later.

    """
    if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < -1):
        raise CodeModeUserError(f"after must be an offset (an int >= -1) from a RunEventItem, got {after!r}")
    if poll_interval <= timedelta(0):
        raise CodeModeUserError(f"poll_interval must be positive, got {poll_interval}")
    handle = client.get_workflow_handle_for(CodeModeRunWorkflow.run, run_id)
    run = _Run(client, handle, timeout, patience)
    poll = poll_interval.total_seconds()
    info = await run.info(poll)
    if not info.streams:
        raise CodeModeUserError(
            f"run {run_id!r} does not stream its events: start it with start_run(..., stream=True) or give its agent "
            f"CodeModeAgent(..., stream=True); follow this one with `codemode watch {run_id}` (from its history)")
    converter = client.data_converter.payload_converter
    offset = after + 1 if after is not None else 0
    quiet = 0.0
    warned: set[str] = set()
    while True:
        page = await run.page(offset)
        for wire in page.items:
            if wire.offset < offset:  # (never: the query answers from `offset` on)
                continue
            if wire.offset > offset:
                yield RunEventItem(offset, EventsTrimmedEvent(missed=wire.offset - offset, first_kept=wire.offset))
            offset = wire.offset + 1
            event = _event(converter.from_payload, _decoded(wire.data), warned)
            if event is None:
                continue
            if isinstance(event, RunEndEvent):
                yield RunEventItem(wire.offset, await _end(handle, event, output_type))
                return
            yield RunEventItem(wire.offset, event)
        offset = max(offset, page.next_offset)
        if page.more_ready:
            continue
        quiet = 0.0 if page.items else quiet + poll
        if quiet >= _CLOSED_CHECK.total_seconds():
            quiet = 0.0
            status = await _status(handle)
            if status is not None:  # closed without an end event: a last look, then the end the server says
                page = await run.page(offset)
                if page.items:
                    continue
                yield RunEventItem(offset, RunEndEvent(status=status, error=f"the run was {status.replace('_', ' ')}"))
                return
        await asyncio.sleep(poll)


def _event(decode: Callable[..., Any], payload: Payload, warned: set[str]) -> Any:
    """An event from its payload; `None` for a kind this process does not know (skipped, with one warning each)."""
    try:
        return decode(payload, cast(Any, AgentStreamEvent))
    except pydantic.ValidationError as e:
        kind = next((str(d.get("ctx", {}).get("tag")) for d in e.errors()
                     if d["type"] == "union_tag_invalid" and d["loc"] == ()), None)
        if kind is None:
            raise
        if kind not in warned:
            warned.add(kind)
            warnings.warn(f"skipping events of kind {kind!r}: published by a newer pydantic-ai than this process "
                          "has; upgrade pydantic-ai here to receive them", UserWarning, stacklevel=3)
        return None


async def _status(handle: WorkflowHandle[Any, Any]) -> RunEndStatus | None:
    """How the run ended, if it has (`None`: running, or continued as new into a run that is)."""
    try:
        description = await handle.describe()
    except RPCError:
        return None
    return _ENDED.get(description.status) if description.status is not None else None


async def _end(handle: WorkflowHandle[Any, Any], event: RunEndEvent, output_type: Any) -> Any:
    """The stream's last event: a completed run's as pydantic-ai's `AgentRunResultEvent`, with the run's result."""
    if event.status != "completed":
        return event
    result = await run_result(handle, output_type)
    return AgentRunResultEvent(agent_run_result(result.output, result.messages, result.usage))


class _WorkerSideModel(Model):
    """The model of a run that a `RunContext` on the client names: it runs on the worker, so it cannot be asked here."""

    def __init__(self, name: str | None) -> None:
        super().__init__()
        self._name = name or "unknown"

    @property
    def model_name(self) -> str:
        return self._name.split(":", 1)[-1]

    @property
    def system(self) -> str:
        return self._name.split(":", 1)[0] if ":" in self._name else "unknown"

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        raise CodeModeUserError("this RunContext belongs to a durable run's event stream, read on the client: the "
                                "run's model is asked on its worker, not here")


async def feed_event_stream_handler(handler: EventStreamHandler[Any], items: AsyncIterable[RunEventItem], *,
                                    deps: Any, prompt: str | None, run_id: str, model: str | None) -> None:
    """Hand a run's events to a pydantic-ai `event_stream_handler`, as `agent.run()` does: one call per node.

    Each model request's events (its parts and deltas) are one stream, each response's tool calls and what they did
    (a program's code-mode events among them) the next; the run's end is not handed on (as in `agent.run()`).
    The handler's `RunContext` carries the run's deps and prompt as the client gave them, its id, and the model
    request's step; its `model` only names the run's model (asking it raises: it runs on the worker).
    """
    queue: asyncio.Queue[Any] | None = None
    task: asyncio.Task[None] | None = None
    phase: str | None = None
    step = 0
    done = object()

    async def events(source: asyncio.Queue[Any]) -> AsyncIterator[Any]:
        while (event := await source.get()) is not done:
            yield event

    async def close() -> None:
        if queue is not None and task is not None:
            await queue.put(done)
            await task

    try:
        async for item in items:
            event = item.event
            if isinstance(event, (AgentRunResultEvent, RunEndEvent)):
                break
            kind = "model" if isinstance(event, _MODEL_PHASE) else "tools"
            if isinstance(event, ModelRequestStartEvent):
                step = event.turn + 1
            elif isinstance(event, RunStartEvent) and model is None:
                model = event.model
            if kind != phase:
                await close()  # raises what the handler raised
                phase, queue = kind, asyncio.Queue()
                context = RunContext(deps=deps, model=_WorkerSideModel(model), usage=RunUsage(), prompt=prompt,
                                     run_id=run_id, run_step=step)
                task = asyncio.ensure_future(handler(context, events(queue)))
            assert queue is not None and task is not None
            if task.done():  # the handler stopped reading this stream (or raised: `close` says so)
                continue
            await queue.put(event)
        await close()
    finally:
        if task is not None and not task.done():
            task.cancel()
