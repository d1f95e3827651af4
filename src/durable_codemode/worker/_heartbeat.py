"""Heartbeats for activities that may outlive their worker: the model request and tool calls.

Without a heartbeat timeout Temporal notices a dead worker's activity only when its start-to-close timeout
passes (5 minutes for a model request), and the run waits that long after a SIGKILL. With one, it retries the
attempt elsewhere once heartbeats stop. The call itself need not know: `heartbeating` beats while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import activity

__all__ = ["heartbeating"]

_T = TypeVar("_T")

_BEATS_PER_TIMEOUT = 3
"""Beats sent per heartbeat timeout, so one delayed beat does not time a live attempt out."""


async def heartbeating(call: Awaitable[_T], details: Callable[[], Sequence[Any]] | None = None) -> _T:
    """Await `call` in the current activity, heartbeating meanwhile if the activity has a heartbeat timeout.

    `details`: what each beat carries (read at each beat), for an activity whose retried attempt resumes from its
    last heartbeat (the batch activity's outcomes so far); none by default.

    No beat until the call has run a third of its timeout, so a short call costs no heartbeat; the SDK throttles
    and batches the later ones. The beats run on the event loop:
    a synchronous tool runs in a thread (pydantic-ai's `run_in_executor`), so a slow tool keeps beating, while a
    coroutine that blocks the loop stops the beats and is retried as a lost attempt, which is what it looks like.
    """
    timeout = activity.info().heartbeat_timeout
    if not timeout or timeout <= timedelta(0):
        return await call

    # The first beat only once the call has run a third of its timeout: a short call (most tool calls) then sends
    # none, where a beat at its start cost a heartbeat RPC per call. A dead worker is still noticed in time: the
    # server counts the heartbeat timeout from the attempt's start until its first beat. A timer on the loop, not
    # a task: a task made and cancelled around every call cost two more turns of the event loop per call.
    loop = asyncio.get_running_loop()
    interval = timeout.total_seconds() / _BEATS_PER_TIMEOUT
    timer: asyncio.TimerHandle

    def beat() -> None:  # runs in this activity's context (`call_later` copies it), as `activity.heartbeat` needs
        nonlocal timer
        activity.heartbeat(*(details() if details is not None else ()))
        timer = loop.call_later(interval, beat)

    timer = loop.call_later(interval, beat)
    try:
        return await call
    finally:
        timer.cancel()
