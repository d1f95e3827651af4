"""What a model activity publishes to its run's event stream: the model's events, as the model streams them.

The model step (`_model_step`) streams the request when the run streams, and hands each pydantic-ai event to a
`ModelStreamPublisher`, which sends them to the run's workflow in batches over Workflow Streams' publish signal
(`WorkflowStreamClient`: one signal, so one history event, per batch; retried with the same sequence number, which
the workflow deduplicates). Per batch interval (`EventStreamSettings.model_batch_interval`) the model's deltas are
coalesced: consecutive deltas of one part become one, so a history records about one event per interval, not one
per token.

Exactly once across retries: a batch carries its attempt in its topic (`codemode.model:<turn>:<attempt>`), the
workflow takes no batch from an attempt older than one it has heard, and a retried attempt's first event is a
`ModelStreamResetEvent` telling subscribers to forget what the failed attempt streamed.

Publishing never fails the request: a subscriber is never needed, and a batch the run cannot take (it closed, the
server is unreachable past `_RETRY_FOR`) is dropped with a warning, after which this attempt publishes no more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from datetime import timedelta
from types import TracebackType
from typing import Any

from pydantic_ai.messages import (
    PartDeltaEvent,
    TextPartDelta,
    ThinkingPartDelta,
    ToolCallPartDelta,
)
from temporalio import activity
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.service import RPCError, RPCStatusCode

from ..shared._activity_io import ModelStreamTarget
from ..shared._run_events import ModelStreamResetEvent, model_topic

__all__ = ["ModelStreamPublisher", "coalesced"]

_log = logging.getLogger(__name__)

_RETRY_FOR = timedelta(seconds=30)
"""How long a batch that could not be sent is tried again (at each interval) before it is dropped."""
_FINAL = frozenset({RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.FAILED_PRECONDITION,
                    RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED})
"""Signal failures no retry helps: the run closed, or the server will not take it."""
_LAST_FLUSH_SECONDS = 10.0
"""How long the attempt waits, as it ends, for its last batch to reach the run (then it returns anyway)."""


def _merged(first: Any, second: Any) -> Any | None:
    """One delta doing what `first` then `second` do to a part, or `None` if they do not merge as one."""
    if isinstance(first, TextPartDelta) and isinstance(second, TextPartDelta):
        if second.provider_details is None and not second.citations_delta and (
                second.provider_name in (None, first.provider_name)):
            return replace(first, content_delta=first.content_delta + second.content_delta)
    elif isinstance(first, ThinkingPartDelta) and isinstance(second, ThinkingPartDelta):
        if (first.content_delta is not None and second.content_delta is not None and first.signature_delta is None
                and second.signature_delta is None and second.provider_details is None
                and second.provider_name in (None, first.provider_name)):
            return replace(first, content_delta=first.content_delta + second.content_delta)
    elif (isinstance(first, ToolCallPartDelta) and isinstance(second, ToolCallPartDelta)
          and isinstance(first.args_delta, str) and isinstance(second.args_delta, str)
          and second.tool_name_delta is None and second.tool_call_id in (None, first.tool_call_id)
          and second.provider_details is None and second.provider_name in (None, first.provider_name)):
        return replace(first, args_delta=first.args_delta + second.args_delta)
    return None


def coalesced(events: list[Any]) -> list[Any]:
    """`events` with each run of consecutive deltas to one part merged into one delta where they merge."""
    out: list[Any] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, PartDeltaEvent) and isinstance(last, PartDeltaEvent) and last.index == event.index:
            merged = _merged(last.delta, event.delta)
            if merged is not None:
                out[-1] = replace(last, delta=merged)
                continue
        out.append(event)
    return out


class ModelStreamPublisher:
    """Sends one model-request attempt's stream events to its run's event stream, a batch per interval.

    Use as an async context manager around the request, inside the model activity: `publish` each event.
    """

    def __init__(self, target: ModelStreamTarget) -> None:
        info = activity.info()
        client = activity.client()
        assert info.workflow_id is not None, "a model activity is scheduled by its run's workflow"
        # Pinned to this workflow run: a later run reusing the id never gets this attempt's events.
        handle = client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
        self._client = WorkflowStreamClient(handle, client=client, batch_interval=target.batch_interval,
                                            max_retry_duration=_RETRY_FOR)
        self._topic = self._client.topic(model_topic(target.turn, info.attempt))
        self._interval = target.batch_interval.total_seconds()
        self._turn, self._attempt = target.turn, info.attempt
        self._pending: list[Any] = []
        self._flusher: asyncio.Task[None] | None = None
        self.dropped: str | None = None
        """Why this attempt stopped publishing (a batch the run could not take), if it did."""
        self.published = 0
        """Events handed to the stream (after coalescing)."""

    async def __aenter__(self) -> ModelStreamPublisher:
        if self._attempt > 1:
            self._pending.append(ModelStreamResetEvent(
                turn=self._turn, attempt=self._attempt,
                reason=f"attempt {self._attempt - 1} of the model request failed; the model streams again"))
        self._flusher = asyncio.create_task(self._flush_every_interval())
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        if error is None or isinstance(error, Exception):  # what it streamed so far still reaches the run
            try:
                await asyncio.wait_for(self._flush(final=True), _LAST_FLUSH_SECONDS)
            except TimeoutError:
                self._stop(f"its last batch was not taken within {_LAST_FLUSH_SECONDS:g} s")

    def publish(self, event: Any) -> None:
        """Queue `event` for the next batch (a no-op once this attempt stopped publishing).

        Without its `origin` (the run id, step and attempt, since pydantic-ai 2.78): the stream is the run's own, the
        step is its `ModelRequestStartEvent` and the attempt its topic; it was ~120 of a delta's ~500 bytes.
        """
        if self.dropped is None:
            self._pending.append(replace(event, origin=None) if getattr(event, "origin", None) is not None else event)

    async def _flush_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self._flush()

    async def _flush(self, *, final: bool = False) -> None:
        if self.dropped is not None:
            return
        if self._pending:
            batch, self._pending = coalesced(self._pending), []
            for event in batch:
                self._topic.publish(event)
            self.published += len(batch)
        while True:
            try:
                await self._client.flush()
                return
            except TimeoutError as e:  # the batch was retried past `_RETRY_FOR`
                self._stop(str(e))
                return
            except RPCError as e:
                if e.status in _FINAL:  # the run closed meanwhile, or refuses: no retry helps
                    self._stop(f"{e.status.name}: {e.message}")
                    return
                if not final:
                    _log.debug("model stream batch not sent yet (tried again): %s", e)
                    return
                await asyncio.sleep(min(self._interval, 1.0))
            except Exception as e:  # any other failure: the batch stays pending, tried again
                if not final:
                    _log.debug("model stream batch not sent yet (tried again): %s", e)
                    return
                await asyncio.sleep(min(self._interval, 1.0))

    def _stop(self, why: str) -> None:
        self.dropped = why
        self._pending.clear()
        info = activity.info()
        _log.warning("model request %s of run %s stopped publishing its stream: %s", info.activity_id,
                     info.workflow_id, why)
