"""The compute activity: a stretch of a program past its in-workflow budget, computed (or recorded) here.

Workflow code gives each stretch of a program's compute (between two host round trips) a small budget
(`SnippetLimits.max_turn_seconds`), well under the 2 s in which Temporal must hear from a workflow task. A
stretch past it is not lost, and it is never timed again:

- one that workflow code finished anyway (it took 0.6 s) is *recorded* here: the request carries where the
  program got to, and the activity returns it, so a replay takes it from the history instead of running it;
- one still computing at the live backstop (`shared._config.LIVE_BACKSTOP_SECONDS`), or whose sandbox process died, is
  *computed* here: the activity loads the program's last dump, gives it again the answers it had since (it
  repeats itself exactly), and lets it compute on for up to `max_compute_seconds`, in the compute pool.

Either way the activity returns the program at its next host round trip (a tool call, a clock read, a wait) or
its end, and workflow code goes on from there, so every tool call is still one recorded activity with the same
id. It runs in a thread and heartbeats, so a worker killed under it is noticed after the heartbeat timeout and
the attempt runs again elsewhere, from the same dump (compute has no side effects); a cancelled attempt kills its
sandbox process instead of leaving it spinning.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from pydantic_monty import (
    CollectStreams,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySession,
    NameLookupSnapshot,
)

from ..shared._activity_io import ComputeRequest, ComputeResult
from ..shared._compute_wire import NAME_LOOKUP, decode_answer, decode_dump, encode_dump, encoded_size
from ..shared._config import is_time_limit, monty_limits
from ..shared._results import jsonable
from . import _pool

__all__ = ["compute_stretch"]


def _checkout(request: ComputeRequest) -> _pool.Checkout:
    # A loaded dump brings its own limits, `random` state and type-check context; a fresh REPL gets the seed the
    # workflow drew for it and the run's limits, exactly as workflow code would have checked it out.
    return _pool.POOL.session({
        "script_name": "snippet.py",
        "limits": monty_limits(request.limits),
        "os_policy": {"datetime": "call_host", "sleep": "call_host", "random_start": {"seed": request.seed}},
    }, kind="compute")


class _Stretch:
    """One attempt at computing a stretch, in a thread; `kill()` from another thread stops it."""

    def __init__(self, request: ComputeRequest) -> None:
        self._request = request
        self._session: MontySession | None = None
        self._killed = False

    def kill(self) -> None:
        session = self._session
        pid = session.worker_pid if session is not None else None
        self._killed = True
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def run(self) -> ComputeResult:
        request = self._request
        started = time.monotonic()
        streams = CollectStreams(max_bytes=request.limits.max_output_bytes + 1)

        def result(kind: Any, **fields: Any) -> ComputeResult:
            printed = "".join(text for _stream, text in streams.output)
            return ComputeResult(kind=kind, printed=printed, seconds=time.monotonic() - started, **fields)

        # Counted as checked out until the block ends, then ended; a process gone (crash, kill) is replaced.
        with _checkout(request) as session:
            self._session = session
            try:
                if self._killed:
                    return result("crashed", error="the attempt was cancelled")
                return self._compute(session, streams, result)
            finally:
                self._session = None

    def _compute(self, session: MontySession, streams: CollectStreams,
                 result: Callable[..., ComputeResult]) -> ComputeResult:
        request = self._request
        started = time.monotonic()
        try:
            state = decode_dump(request.state)
            if request.start == "feed":
                if state is not None:
                    session.load_session(state)
                # The snippet passed its type check in workflow code before its first stretch ran.
                snap: Any = session.feed_start(request.code, print_callback=streams, skip_type_check=True,
                                               cwd=request.cwd)
            else:
                if state is None:
                    return result("crashed", error="a snapshot start needs the program's dump")
                snap = session.load_snapshot(state, print_callback=streams)
            for encoded in request.answers:
                answer = decode_answer(encoded)
                if isinstance(snap, MontyComplete) or (answer is NAME_LOOKUP) != isinstance(snap,
                                                                                         NameLookupSnapshot):
                    return result("crashed", error="the program did not repeat itself in the compute activity "
                                  f"(it reached {type(snap).__name__} where workflow code had answered it)")
                snap = snap.resume() if answer is NAME_LOOKUP else snap.resume(answer)
            if isinstance(snap, MontyComplete):
                return result("complete", output=jsonable(snap.output), state=encode_dump(session.dump()))
            return result("suspended", state=encode_dump(snap.dump()))
        except MontyRuntimeError as e:
            if is_time_limit(e):
                return result("runaway", error=e.display("type-msg"))
            try:
                after: str | None = encode_dump(session.dump())
            except MontyError:
                after = None
            return result("error", error=e.display("type-msg"), traceback=e.display(), state=after)
        except MontyCrashedError as e:
            if self._killed:
                return result("crashed", error="the attempt was cancelled")
            if time.monotonic() - started >= request.limits.max_compute_seconds:
                # Inside one builtin (`10 ** (10 ** 8)`) Monty cannot check its clock: the pool kills the process
                # at the limit plus its grace. That is the runaway at its limit, not a crash to try again (which
                # would compute it all over, twice the limit, and tell the model of a failed process).
                return result("runaway", error=f"TimeoutError: time limit exceeded inside one operation ({e})")
            return result("crashed", error=str(e))
        except MontyError as e:
            return result("crashed", error=f"{type(e).__name__}: {e}")


async def compute_stretch(request: ComputeRequest) -> ComputeResult:
    """Compute (or record) the stretch of `request`; the caller heartbeats meanwhile."""
    if request.start == "computed":
        if request.computed is None:
            raise ValueError("a 'computed' compute request carries no outcome to record")
        return request.computed
    result = await _attempt(request)
    if result.kind == "crashed":  # a process killed under it (an OOM killer, a kill): once more, on a fresh one
        result = await _attempt(request)
    size = encoded_size(result.state)
    if request.max_dump_bytes is not None and size > request.max_dump_bytes:
        # It could not be recorded: Temporal refuses a payload over 2 MiB (the worker has no payload store).
        return ComputeResult(kind="too_large", error=str(size), seconds=result.seconds)
    return result


async def _attempt(request: ComputeRequest) -> ComputeResult:
    stretch = _Stretch(request)
    task = asyncio.ensure_future(asyncio.to_thread(stretch.run))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        stretch.kill()  # or the thread would compute on, for up to max_compute_seconds, for nobody
        with contextlib.suppress(BaseException):
            await task
        raise
