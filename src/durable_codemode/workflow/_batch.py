"""Batched calls in workflow code: which calls share one batch activity, and how each gets its answer back.

The boundary is the program's own behaviour, never timing: a batch holds the calls to one batched tool that the
program starts before the workflow code driving it next yields, which is when the program next waits on
Temporal (a `FutureSnapshot`, a sleep, a compute activity). The first call queued schedules `_flush` with the
workflow event loop's `call_soon`; the loop runs it only after the driver suspends and after every call task
already started has queued its call, in the deterministic order of Temporal's workflow event loop, so a replay
forms the same batches from the same program. For `asyncio.gather(*(get(i=i) for i in range(200)))` that is one
batch of 200; for sequential `await get(i=i)` calls, batches of one, which run as the tool's ordinary activity
(the history is then the same as without batching).

A batch is split at `MAX_BATCH_CALLS` calls, and, without a payload store, where its arguments would pass the
limit for one tool call's arguments (`SnippetLimits.max_tool_args_bytes`), so its input fits a payload.

Each call gets back its `BatchOutcome` (or, if the whole batch activity failed, the `ActivityError`, after the
outcomes its last heartbeat reported), or `None`: run it as its own activity (a batch of one, or a result that
did not fit in the batch's payload, `deferred`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from ..shared._activity_io import BatchedCall, BatchInput, BatchOutcome, BatchResult
from ..shared._names import BATCH_ACTIVITY, batch_activity_id
from ..shared._results import clip, printable
from ..shared._types import ToolSpec
from ._guards import args_bytes

__all__ = ["MAX_BATCH_CALLS", "BatchAnswer", "ToolBatcher", "batch_timeout"]

MAX_BATCH_CALLS = 200
"""Calls one batch activity carries at most; more in flight at once go into several batches, run side by side."""

_BATCH_MARGIN = timedelta(seconds=10)
"""Start-to-close time a batch gets beyond the tries of one call (scheduling, heartbeats, the result's upload)."""

BatchAnswer = BatchOutcome | ActivityError | None
"""What a batched call is answered with: its outcome, the batch's failure, or `None`: run it on its own."""


def batch_timeout(spec: ToolSpec) -> timedelta:
    """A batch attempt's start-to-close timeout: every try of one call, the backoff between them, and a margin.

    Calls run at once inside the batch and each try has the tool's `timeout` there, so a batch needs no more than
    one call's tries, however many calls it holds.
    """
    policy = spec.retry_policy
    tries = max(policy.maximum_attempts, 1)
    waits = timedelta(0)
    interval = policy.initial_interval
    for _ in range(tries - 1):
        waits += interval
        interval = min(interval * policy.backoff_coefficient, policy.maximum_interval or interval * 100)
    return spec.timeout * tries + waits + _BATCH_MARGIN


@dataclass
class _Queued:
    call_id: str
    args: dict[str, Any]
    future: asyncio.Future[BatchAnswer]


def _heartbeated(error: ActivityError) -> dict[str, BatchOutcome]:
    """The outcomes a failed batch's last heartbeat carried (a timed-out attempt reports them), by call id."""
    cause = error.cause
    if not isinstance(cause, TemporalTimeoutError) or not cause.last_heartbeat_details:
        return {}
    found: dict[str, BatchOutcome] = {}
    for item in cause.last_heartbeat_details[0] or []:
        if isinstance(item, dict) and item.get("kind") in ("ok", "error") and isinstance(item.get("call_id"), str):
            found[item["call_id"]] = BatchOutcome(call_id=item["call_id"], kind=item["kind"], value=item.get("value"),
                                                  error_type=item.get("error_type"), message=item.get("message"))
    return found


class ToolBatcher:
    """Queues the calls of a run's batched tools and starts one batch activity per tool when the program waits."""

    def __init__(self, agent: str, deps: Any, *, args_limit: int | None) -> None:
        self._agent = agent
        self._deps = deps
        self._args_limit = args_limit
        """The limit for one call's arguments (`SnippetLimits.max_tool_args_bytes`): a batch's share of a payload;
        `None` (a payload store carries any size): batches are split by count only."""
        self._queued: dict[str, tuple[ToolSpec, list[_Queued]]] = {}
        self._flush_scheduled = False

    def submit(self, spec: ToolSpec, call_id: str, args: dict[str, Any]) -> asyncio.Future[BatchAnswer]:
        """Queue one call of a batched tool; the future settles when its batch does."""
        loop = asyncio.get_event_loop()
        future: asyncio.Future[BatchAnswer] = loop.create_future()
        self._queued.setdefault(spec.name, (spec, []))[1].append(_Queued(call_id, args, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    def _chunks(self, calls: list[_Queued]) -> list[list[_Queued]]:
        chunks: list[list[_Queued]] = [[]]
        size = 0
        for call in calls:
            weight = args_bytes(call.args) if self._args_limit is not None else 0
            current = chunks[-1]
            if current and (len(current) >= MAX_BATCH_CALLS or (
                    self._args_limit is not None and size + weight > self._args_limit)):
                chunks.append([])
                size = 0
            chunks[-1].append(call)
            size += weight
        return [c for c in chunks if c]

    def _flush(self) -> None:
        """Start the queued calls: one batch activity per tool (and per chunk), a batch of one on its own."""
        self._flush_scheduled = False
        queued, self._queued = self._queued, {}
        for spec, calls in queued.values():  # in the order each tool was first called: deterministic
            for chunk in self._chunks([c for c in calls if not c.future.done()]):
                if len(chunk) == 1:
                    chunk[0].future.set_result(None)
                    continue
                task = asyncio.ensure_future(self._run(spec, chunk))

                def cancel_when_unwanted(_: Any, chunk: list[_Queued] = chunk, task: Any = task) -> None:
                    # Every call's program task was cancelled (e.g. a gather that raised): stop the batch too.
                    if all(c.future.cancelled() for c in chunk) and not task.done():
                        task.cancel()

                for call in chunk:
                    call.future.add_done_callback(cancel_when_unwanted)

    async def _run(self, spec: ToolSpec, chunk: list[_Queued]) -> None:
        ids = [c.call_id for c in chunk]
        input = BatchInput(agent=self._agent, tool=spec.name, calls=[BatchedCall(call_id=c.call_id, args=c.args)
                                                                     for c in chunk],
                           deps=self._deps, timeout=spec.timeout, retry_policy=spec.retry_policy,
                           schema_digest=spec.schema_digest)
        answers: dict[str, BatchAnswer]
        try:
            result = await workflow.execute_activity(
                BATCH_ACTIVITY, input, result_type=BatchResult,
                activity_id=batch_activity_id(ids, spec.name, [c.args for c in chunk]),
                start_to_close_timeout=batch_timeout(spec), heartbeat_timeout=spec.heartbeat_timeout,
                retry_policy=spec.retry_policy, summary=printable(
                    f"{clip(ids[0], 60)}..{clip(ids[-1], 60)} {spec.name}() x{len(ids)} (batch)"))
            answers = {o.call_id: (None if o.kind == "deferred" else o) for o in result.outcomes}
        except ActivityError as e:
            done = _heartbeated(e)
            answers = {i: done.get(i, e) for i in ids}
        for call in chunk:
            if not call.future.done():
                call.future.set_result(answers.get(call.call_id))
