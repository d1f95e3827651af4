"""One snippet of a run's REPL, driven to its end: its stretches of compute, and the answers to its host calls.

How the driver stays deterministic given the history (call ids, answer order, what is decided live and recorded)
is told in `_sandbox`'s module docstring. This module runs in workflow code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal, cast

import pydantic_monty
from pydantic_core import to_json
from pydantic_monty import (
    CollectStreams,
    FunctionSnapshot,
    FutureSnapshot,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySyntaxError,
    MontyTypingError,
    NameLookupSnapshot,
)
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from ..shared._activity_io import ComputeRequest, ComputeResult
from ..shared._compute_wire import NAME_LOOKUP, decode_dump, encode_answer, encode_dump, encoded_size
from ..shared._config import LIVE_BACKSTOP_SECONDS, LIVE_TASK_SECONDS, is_time_limit
from ..shared._files import FILES_ROOT
from ..shared._names import (
    COMPUTE_ACTIVITY,
    compute_activity_id,
    compute_marker,
    nested_call_id,
    type_check_rejection_marker,
)
from ..shared._records import CallRecord
from ..shared._results import bounded_result, clip, jsonable, printable
from ..shared._types import COMPUTE_IS_NO_WAIT
from ._catalog import CATALOG_FUNCTIONS
from ._guards import MAX_ANSWERS_WITHOUT_WAIT, call_refusal, output_overflow_message, stopped_message
from ._os_calls import os_call_answer
from ._sandbox_types import (
    CallSite,
    DrivenRepl,
    SandboxUnavailableError,
    Settled,
    SnippetOutcome,
    is_replaying,
)
from ._snippet_state import (
    COMPUTE_HEARTBEAT,
    COMPUTE_RETRY,
    DUMP_LIMIT_WITHOUT_STORE,
    MAX_ANSWERS_SINCE_DUMP,
    Base,
    Completed,
    InFlight,
    Parked,
    PendingFutures,
    SnippetEnded,
    too_large,
)
from ._task_clock import task_began
from ._type_check import RECORDED_REJECTION, real_type_errors

__all__ = ["SnippetDriver"]


class SnippetDriver:
    """Answers one snippet's suspensions until it completes.

    The program runs in *stretches* of compute, each between two host round trips; stretch 0 starts the
    snippet, stretch n runs from the answer to round trip n. Each live stretch is timed, and one past the
    in-workflow budget is recorded by a `workflow.patched` marker (`compute_marker`) and the compute activity, in
    the same workflow task: finished in workflow code, its outcome is recorded; killed by the live backstop, or by
    a crash, it is computed again in the activity from the last dump (`Base`). A replay asks for the marker
    before every stretch and, when it is there, takes the activity's recorded outcome instead of running the
    stretch: no replay times anything.
    """

    def __init__(self, repl: DrivenRepl, tools: set[str], code: str, run_code_id: str, *, snippet: int) -> None:
        self._repl = repl
        self._spec = spec = repl.spec
        self._tools = tools
        self._start_tool = repl.start_tool
        self._code = code
        self._run_code_id = run_code_id
        self._snippet = snippet
        self._pending: PendingFutures[tuple[Settled, CallRecord | None]] = PendingFutures()
        self._started: dict[int, InFlight] = {}
        """Tool calls in flight, by Monty call id: what their record says if the program ends before they do."""
        self._calls: list[CallRecord] = []
        self._n = 0
        self._streams = CollectStreams(max_bytes=spec.limits.max_output_bytes + 1)
        self._printed_before = ""
        """Printed output from before `_streams` was replaced (after a stretch came from the compute activity)."""
        self._told = 0
        """Characters of the printed output the run's observers were told of (`tell_printed`)."""
        self._answers = 0
        """Host round trips since the program last waited (see `_guards.MAX_ANSWERS_WITHOUT_WAIT`)."""
        self._clock = workflow.now()
        """The program's clock (behaviour version 3 on): `workflow.now()` when it last waited, or started."""
        self._compute_is_no_wait = repl.spec.behavior_version >= COMPUTE_IS_NO_WAIT
        self._args_in_flight: dict[int, int] = {}
        """Argument bytes of the tool calls in flight, by Monty call id."""
        self._stretch = 0
        self._task_started = time.monotonic()  # determinism: ok (decides live only what is recorded)
        """When the driver last took up the program in a workflow task (live; `max_feed_seconds`)."""
        self._computed_seconds = 0.0
        self._base: Base | None = None
        self._start_state: bytes | None = None
        """The REPL before this snippet: what it goes back to if the program is lost."""
        self._rejected_on_replay: bool | None = None
        """On replay: whether the type checker rejected this snippet live (`None`: check it; see `_feed`)."""
        self.lost_note: str | None = None
        """Why the REPL was restarted at the snippet's start, if it was (for the model)."""

    def _printed(self) -> str:
        return self._printed_before + "".join(text for _stream, text in self._streams.output)

    def tell_printed(self) -> None:
        """Tell the run's observers what the program printed since they were last told.

        Called where the program makes a tool call or is about to wait on Temporal, and at its end: points a replay
        reaches with the same printed text (never between a stretch and its recorded outcome, whose prints a replay
        learns only from the compute activity's result), so the text comes in the same pieces live and on replay.
        """
        printed = self._printed()
        if len(printed) > self._told:
            self._repl.notices.printed(call_id=self._run_code_id, text=printed[self._told:])
            self._told = len(printed)

    def _waited(self) -> None:
        """The program just waited (a tool call it awaited, a sleep): a new workflow task, with its own budgets."""
        self._answers = 0
        self._clock = workflow.now()
        self._new_task()

    def _new_task(self) -> None:
        """The driver takes the program up again in a new workflow task, the program having waited or not."""
        self._task_started = time.monotonic()  # determinism: ok (decides live only what is recorded)

    def _computed_elsewhere(self) -> None:
        """A stretch came back from the compute activity: for the program (version 3 on), no wait at all.

        Where a stretch computes is decided by the live machine's speed, so from behaviour version 3 on it must
        not change what the program sees: its clock stays, and its host calls without a wait go on counting.
        """
        if self._compute_is_no_wait:
            self._new_task()
        else:
            self._waited()

    async def drive(self) -> SnippetOutcome:
        limits = self._spec.limits
        try:
            try:
                snap = await self._first_stretch()
                while not isinstance(snap, (MontyComplete, Completed)):
                    self._answers += 1
                    if self._answers > MAX_ANSWERS_WITHOUT_WAIT:
                        return self._stopped()
                    if isinstance(snap, FunctionSnapshot):
                        current, answer = await self._answer_call(snap)
                    elif isinstance(snap, FutureSnapshot):
                        current, answer = await self._settle(snap)
                    elif isinstance(snap, NameLookupSnapshot):
                        current, answer = snap, NAME_LOOKUP  # an undefined name: NameError inside the snippet
                    else:  # pragma: no cover - Monty's sync API has no other snapshot kind
                        raise TypeError(f"unexpected Monty snapshot {snap!r}")
                    snap = await self._next_stretch(current, answer)
                if isinstance(snap, Completed):
                    self._repl.adopt(snap.state)
                    output = snap.output
                else:
                    output = snap.output
                content = bounded_result(output, self._printed(), max_bytes=limits.max_output_bytes)
                return self._with_compute(SnippetOutcome(kind="ok", content=content, calls=self._calls))
            finally:
                self._cancel_pending()
        except SnippetEnded as ended:
            ended.outcome.calls = self._calls
            return self._with_compute(ended.outcome)
        except MontySyntaxError as e:
            return self._rejected("SyntaxError", e.display("type-msg"))
        except MontyTypingError as e:
            return self._rejected("type error", real_type_errors(e, lenient_names=self._repl.lenient_names))
        except MontyRuntimeError as e:
            return SnippetOutcome(kind="error", content=self._error_content(e.display("type-msg"), e.display()),
                                  calls=self._calls)
        except MontyCrashedError as e:
            return self._crashed(str(e))
        except MontyError as e:  # disconnects, conversion errors: the session cannot be trusted any more
            return self._crashed(f"{type(e).__name__}: {e}")

    def _with_compute(self, outcome: SnippetOutcome) -> SnippetOutcome:
        if self._computed_seconds:
            outcome.computed_seconds = round(self._computed_seconds, 3)
        return outcome

    def _error_content(self, message: str, traceback: str | None) -> dict[str, Any]:
        limits = self._spec.limits
        error = bounded_result(None, self._printed(), max_bytes=limits.max_output_bytes)
        error["error"] = output_overflow_message(message, collector_cap=limits.max_output_bytes + 1,
                                                 limit=limits.max_output_bytes) or message
        if traceback is not None:
            error["traceback"] = traceback
        return error

    # -- stretches

    def _replayed_rejection(self) -> bool | None:
        """On replay: whether the checker rejected this snippet live; `None` live (check it)."""
        if not is_replaying():
            return None
        return workflow.patched(type_check_rejection_marker(self._snippet, self._run_code_id))

    @property
    def _cwd(self) -> str | None:
        """Each snippet's working directory: the run's files, if it has any (relative paths start there)."""
        return FILES_ROOT if self._repl.files is not None else None

    def _feed(self, session: pydantic_monty.MontySession) -> Any:
        """Type-check the snippet and start it; live, a rejection is recorded, and a replay reads it.

        Checking is most of what a replayed snippet costs (a session's first check loads the stubs), and the
        verdict was decided live, so a replay of a run that records rejections starts a snippet without one
        unchecked, and checks a rejected one again only for the message the model got. An unchecked snippet does
        not join the checker's context, so once a replay has skipped a check, the REPL's later checks leave
        unknown names to the runtime (`lenient_names`), as after any snippet that ran unchecked.
        """
        rejected = self._rejected_on_replay
        if rejected is False:
            self._repl.lenient_names = True
            return session.feed_start(self._code, print_callback=self._streams, skip_type_check=True, cwd=self._cwd)
        try:
            snap = session.feed_start(self._code, print_callback=self._streams, cwd=self._cwd)
        except MontyTypingError as e:
            real = real_type_errors(e, lenient_names=self._repl.lenient_names)
            if rejected and not real:  # what made it rejected was context this replay lacks
                raise SnippetEnded(SnippetOutcome(kind="rejected", content=RECORDED_REJECTION,
                                                   calls=self._calls)) from e
            if real:
                if rejected is None and not is_replaying():
                    workflow.patched(type_check_rejection_marker(self._snippet, self._run_code_id))
                raise
            self._repl.lenient_names = True
            return session.feed_start(self._code, print_callback=self._streams, skip_type_check=True, cwd=self._cwd)
        if rejected:  # checked again with less context than live: still rejected, as recorded
            self._repl.adopt(self._start_state if self.lost_note is None else None)  # the program did not run
            raise SnippetEnded(SnippetOutcome(kind="rejected", content=RECORDED_REJECTION, calls=self._calls))
        return snap

    async def _first_stretch(self) -> Any:
        """Stretch 0: check out a session, load the REPL, start the snippet."""
        reserved = self._repl.take_reserved_seed()  # drawn before the model request (`Repl.reserve_session`)
        # Else drawn first, always: the same draws live and on replay.
        seed, warm_key = reserved if reserved is not None else (workflow.random().getrandbits(63), None)
        # Asked before the compute marker: live, a rejection is recorded while the stretch runs, before it.
        self._rejected_on_replay = self._replayed_rejection()
        self._start_state = self._repl.idle_dump
        self._base = Base("feed", self._start_state, printed="")
        if is_replaying() and workflow.patched(self._marker(0)):
            return await self._from_activity(self._request(seed))
        base = self._base

        def start() -> Any:
            session, self.lost_note = self._repl.open_session(seed, warm_key)
            if self.lost_note is not None:
                self._start_state = base.state = None
            return self._feed(session)

        return await self._live_stretch(start, seed)

    async def _next_stretch(self, current: Any, answer: Any) -> Any:
        """Answer a host round trip: the program computes on to its next one, or its end."""
        self._stretch += 1
        assert self._base is not None
        if isinstance(current, Parked):
            self._base = Base("snapshot", current.state, printed=self._printed())
        self._base.answers.append(answer)
        if is_replaying() and workflow.patched(self._marker(self._stretch)):
            self._repl.close()
            return await self._from_activity(self._request())

        def resume() -> Any:
            snap = self._repl.unpark(current.state, self._streams) if isinstance(current, Parked) else current
            return snap.resume() if answer is NAME_LOOKUP else snap.resume(answer)

        return await self._live_stretch(resume)

    async def _live_stretch(self, step: Callable[[], Any], seed: int = 0) -> Any:
        """Run one stretch (`step`: load if need be, then feed or resume); what stops it goes to the activity.

        A process killed under it (the live backstop, a crash) and the session's own time limit
        (`max_compute_seconds`, when under the backstop: wall time too) are decided where the replay reads them:
        the compute activity computes the stretch from the last dump. The program's own errors propagate.
        """
        started = time.monotonic()  # determinism: ok (timed live only; what it decides is recorded)
        late = started - task_began(self._task_started) + LIVE_BACKSTOP_SECONDS > LIVE_TASK_SECONDS
        if late and self._stretch > 0 and not is_replaying():
            # Run here, the stretch could keep the task past Temporal's deadlock limit: the activity runs it. Not
            # the first: it type-checks the snippet, which the activity does not (it would run a rejected one).
            return await self._went_over(self._request(seed))
        try:
            snap = step()
        except MontyRuntimeError as e:
            if not is_time_limit(e) and not self._past_backstop(started):
                raise
            return await self._went_over(self._request(seed), killed=e)
        except (MontySyntaxError, MontyTypingError):
            raise
        except MontyError as e:
            return await self._went_over(self._request(seed), killed=e)
        return await self._timed(snap, started, seed)

    @staticmethod
    def _past_backstop(started: float) -> bool:
        """Whether a live stretch that answered ran past the backstop, so its process may be killed under it.

        The pool's timer and the sandbox's answer race: a stretch that answered (even with the program's own error)
        after `LIVE_BACKSTOP_SECONDS` may have a killed process, which the next request finds ("this checkout has
        already been finished"). Such a stretch is computed again in the activity, as a killed one is.
        """
        if is_replaying():
            return False  # the replay pool has no backstop
        return time.monotonic() - started >= LIVE_BACKSTOP_SECONDS  # determinism: ok (live only; recorded)

    async def _timed(self, snap: Any, started: float, seed: int) -> Any:
        """A live stretch that finished in workflow code: recorded if it was past the in-workflow budget."""
        if is_replaying():
            return snap  # a replay decides nothing by the clock: over-budget stretches have their marker
        if self._past_backstop(started):
            return await self._went_over(self._request(seed))
        now = time.monotonic()  # determinism: ok (timed live only; what it decides is recorded)
        took, in_task = now - started, now - task_began(self._task_started)
        limits = self._spec.limits
        if took <= limits.max_turn_seconds and in_task <= limits.max_feed_seconds:
            return snap
        try:
            outcome = self._outcome_of(snap, took)
        except MontyCrashedError:  # its dump killed by the backstop (a big REPL, a loaded machine): compute it again
            return await self._went_over(self._request(seed))
        if outcome is None:
            return snap  # too big to record without a payload store: a replay computes it again
        request = ComputeRequest(agent=self._spec.agent, run_code_id=self._run_code_id, start="computed",
                                 state=None, limits=limits, computed=outcome)
        if outcome.kind == "suspended" and self._repl.sessions.try_hold():
            # The program is where the record says: it keeps its process over the recording (see `_may_hold`).
            try:
                return await self._went_over(request, keep=snap)
            finally:
                self._repl.sessions.release_hold()
        return await self._went_over(request)

    def _outcome_of(self, snap: Any, took: float) -> ComputeResult | None:
        """What a stretch computed in workflow code came to, to record; `None` if it is too big to."""
        assert self._base is not None
        session = self._repl.session
        if isinstance(snap, MontyComplete):
            state = session.dump() if session is not None else None
            kind: Literal["suspended", "complete"] = "complete"
        else:
            state, kind = snap.dump(), "suspended"
        encoded = encode_dump(state)
        output = jsonable(snap.output) if isinstance(snap, MontyComplete) else None
        printed = self._printed()[len(self._base.printed):]
        # The value and the printed text travel too: a program's last value may be 10 MB ('x' * 10**7).
        carried = encoded_size(encoded) + len(printed) + (len(to_json(output)) if output is not None else 0)
        if carried > DUMP_LIMIT_WITHOUT_STORE and not self._spec.payload_store:
            return None
        return ComputeResult(kind=kind, state=encoded, where="workflow", seconds=took, output=output, printed=printed)

    def _request(self, seed: int = 0) -> ComputeRequest:
        """The compute activity's input: the stretch from the last dump (unchecked on replay: never re-sent)."""
        base = self._base
        assert base is not None
        if is_replaying():  # never sent: the replay takes the recorded result (Temporal compares no inputs)
            return ComputeRequest(agent=self._spec.agent, run_code_id=self._run_code_id, start=base.start,
                                  state=None, limits=self._spec.limits)
        return ComputeRequest(
            agent=self._spec.agent, run_code_id=self._run_code_id, start=base.start, state=encode_dump(base.state),
            code=self._code if base.start == "feed" else "", answers=[encode_answer(a) for a in base.answers],
            limits=self._spec.limits, seed=seed,
            max_dump_bytes=None if self._spec.payload_store else DUMP_LIMIT_WITHOUT_STORE, cwd=self._cwd)

    def _marker(self, stretch: int) -> str:
        return compute_marker(self._snippet, self._run_code_id, stretch)

    async def _went_over(self, request: ComputeRequest, *, killed: MontyError | None = None,
                         keep: Any = None) -> Any:
        """Live: record that this stretch comes from the compute activity, then get it from there."""
        if killed is not None and is_replaying():
            # Only a live stretch may be recorded; a replayed one that dies (the replay pool has no backstop, so
            # a real crash) cannot take another path than the run it replays: fail the task, to be retried.
            raise SandboxUnavailableError(
                f"a replayed stretch of {self._run_code_id} stopped in its sandbox ({type(killed).__name__}: "
                f"{killed}); the workflow task will be retried") from killed
        if request.max_dump_bytes is not None and encoded_size(request.state) > request.max_dump_bytes:
            self._repl.close()
            raise SnippetEnded(self._lost(too_large(encoded_size(request.state))))
        workflow.patched(self._marker(self._stretch))  # live: records the marker, before the activity's command
        if keep is None:
            self._repl.close()
        return await self._from_activity(request, keep=keep)

    async def _from_activity(self, request: ComputeRequest, *, keep: Any = None) -> Any:
        """The stretch's outcome from the compute activity (recorded live, read from the history on replay).

        `keep`: the live snapshot the recorded outcome is a dump of, still in its process: it goes on from there.
        """
        limits = self._spec.limits
        # Live and on replay alike (a replay comes here from the marker): the same notice at the same point.
        self._repl.notices.compute_escalated(
            call_id=self._run_code_id, stretch=self._stretch,
            reason=f"computed past its in-workflow budget ({limits.max_turn_seconds:g} s a stretch, "
                   f"{limits.max_feed_seconds:g} s a workflow task): the compute activity takes it")
        recorded = request.start == "computed"
        shown = printable(clip(self._run_code_id, 80))  # the model's tool call id: untrusted text
        summary = (f"{shown}: records a stretch computed in workflow code past its budget "
                   f"({limits.max_turn_seconds:g} s)" if recorded else
                   f"{shown}: computes past its in-workflow budget ({limits.max_turn_seconds:g} s)")
        try:
            result = await workflow.execute_activity(
                COMPUTE_ACTIVITY, request, result_type=ComputeResult,
                activity_id=compute_activity_id(self._run_code_id, self._stretch),
                start_to_close_timeout=timedelta(seconds=limits.max_compute_seconds + 30),
                heartbeat_timeout=COMPUTE_HEARTBEAT, retry_policy=COMPUTE_RETRY, summary=summary)
        except ActivityError as e:
            cause = e.cause.message if isinstance(e.cause, ApplicationError) else str(e.cause or e)
            raise SnippetEnded(self._lost(f"its compute activity failed: {cause}")) from e
        self._computed_elsewhere()
        if result.where == "activity":  # from the result, so a replay decides the same
            self._computed_seconds += result.seconds
            self._repl.lenient_names = True  # it ran unchecked: later checks may not know the names it defined
        assert self._base is not None
        state = decode_dump(result.state)
        if keep is not None and result.kind == "suspended" and state is not None:
            self._base = Base("snapshot", state, printed=self._printed())
            return keep  # its prints went to `_streams`, as the recorded ones say
        self._printed_before = self._base.printed + result.printed
        self._streams = CollectStreams(max_bytes=limits.max_output_bytes + 1)
        if result.kind == "suspended" and state is not None:
            snap = self._load_outcome(state)
            self._base = Base("snapshot", state, printed=self._printed())
            return snap
        if result.kind == "complete":
            return Completed(output=result.output, state=state)
        if result.kind == "error":
            self._repl.adopt(state)
            raise SnippetEnded(SnippetOutcome(kind="error", content=self._error_content(
                result.error or "the program failed", result.traceback)))
        if result.kind == "too_large":
            raise SnippetEnded(self._lost(too_large(int(result.error or 0))))
        if result.kind == "runaway":
            raise SnippetEnded(self._lost(
                f"it computed for more than {limits.max_compute_seconds:g} s without a tool call or other host "
                f"round trip ({result.error}): a runaway loop, or work to split into smaller steps "
                "(SnippetLimits.max_compute_seconds)"))
        raise SnippetEnded(self._lost(f"its sandbox process failed ({result.error})"))

    def _load_outcome(self, state: bytes) -> Any:
        """Load where the compute activity left the program; a process that dies under the load is replaced.

        Loading decides nothing (no command depends on how long it takes), so a second try is replay-safe; a
        second failure fails the workflow task, and Temporal retries it. A load the backstop killed is not tried
        again in the same task: a second one as slow would keep the task past Temporal's 2 s deadlock limit (a
        28 MB REPL on a loaded machine), so the task fails at once and its retry loads it afresh.
        """
        started = time.monotonic()  # determinism: ok (decides only a retry of this task, which replays the same)
        try:
            return self._repl.unpark(state, self._streams)
        except MontyCrashedError as e:
            self._repl.close()
            if self._past_backstop(started):
                raise SandboxUnavailableError(
                    f"loading {self._run_code_id}'s program ({len(state):,} bytes) back from its compute activity "
                    f"took past the live sandbox's {LIVE_BACKSTOP_SECONDS:g} s backstop (a loaded worker); the "
                    "workflow task will be retried") from e
        try:
            return self._repl.unpark(state, self._streams)
        except MontyCrashedError as e:
            self._repl.close()
            raise SandboxUnavailableError(
                f"the sandbox process died twice loading {self._run_code_id}'s program ({len(state):,} bytes) back "
                f"from its compute activity ({e}); the workflow task will be retried") from e

    def _lost(self, why: str) -> SnippetOutcome:
        """The snippet fails and the REPL goes back to what it was before it."""
        self._repl.adopt(self._start_state)
        return SnippetOutcome(kind="error", content=self._error_content(
            f"The program was stopped: {why}. The REPL is as it was before this run_code call (its variables are "
            "kept; what this program assigned is not). Tool calls it made did happen.", None))

    def _stopped(self) -> SnippetOutcome:
        # Not resumed, the program never continues; its session is mid-snippet, so the REPL goes with it.
        content = bounded_result(None, self._printed(), max_bytes=self._spec.limits.max_output_bytes)
        content["error"] = stopped_message(MAX_ANSWERS_WITHOUT_WAIT)
        return SnippetOutcome(kind="error", content=content, calls=self._calls, restart_repl=True)

    def _rejected(self, what: str, message: str) -> SnippetOutcome:
        return SnippetOutcome(
            kind="rejected",
            content=f"The code was not run: {what}.\n{message.strip()}\nFix the code and call run_code again.",
            calls=self._calls,
        )

    def _crashed(self, message: str) -> SnippetOutcome:
        return SnippetOutcome(
            kind="sandbox_crashed",
            content={
                "error": f"The sandbox process stopped ({message}). The REPL was restarted: variables from "
                "earlier run_code calls are gone. Tool calls that completed before it stopped did happen."
            },
            calls=self._calls,
        )

    async def _answer_call(self, snap: FunctionSnapshot) -> tuple[Any, Any]:
        """The answer to a call, and what to give it to."""
        if snap.is_os_function:
            return await self._answer_os_call(snap)
        name = snap.function_name
        catalog = self._repl.catalog
        if catalog is not None and name in CATALOG_FUNCTIONS:  # answered at once, from the recorded catalog
            return snap, cast(Any, catalog.answer(name, snap.args, dict(snap.kwargs)))
        if name not in self._tools:
            return snap, {"exc_type": "NameError", "message": f"name '{name}' is not defined"}
        if snap.args:
            return snap, {
                "exc_type": "TypeError",
                "message": f"{name}() takes keyword arguments only, e.g. {name}(id=1); got {len(snap.args)} "
                "positional",
            }
        if self._n >= self._spec.limits.max_tool_calls:
            return snap, {
                "exc_type": "RuntimeError",
                "message": f"tool call limit reached: a program may make {self._spec.limits.max_tool_calls} "
                "tool calls; split the work across several run_code calls",
            }
        kwargs = dict(snap.kwargs)
        refusal, size = call_refusal(name, kwargs, in_flight=len(self._started),
                                     limit=self._spec.limits.max_tool_args_bytes,
                                     args_in_flight=self._args_in_flight)
        if refusal is not None:
            return snap, cast(Any, refusal)  # a Settled exception answer, as Monty's TypedDict
        self._args_in_flight[snap.call_id] = size
        self.tell_printed()  # what it printed before the call comes before the call
        call_id = nested_call_id(self._run_code_id, self._n)
        self._n += 1
        site = CallSite(code=self._code, line=self._code.count("\n", 0, max(0, snap.position.start)) + 1)
        self._pending.track(snap.call_id, asyncio.ensure_future(self._start_tool(name, kwargs, call_id, site)))
        self._started[snap.call_id] = InFlight(call_id, name, kwargs, workflow.now())
        return snap, {"future": ...}

    async def _answer_os_call(self, snap: FunctionSnapshot) -> tuple[Any, Any]:
        name = snap.function_name
        args = snap.args
        if name in ("time.sleep", "asyncio.sleep"):
            seconds = float(args[0]) if args else 0.0
            if name == "asyncio.sleep":
                self._pending.track(snap.call_id, asyncio.ensure_future(self._sleep(seconds)))
                return snap, {"future": ...}
            if seconds > 0:  # a durable timer: the program waits without its process
                self.tell_printed()
                state = self._repl.park(snap)
                await self._sleep(seconds)
                self._waited()
                return Parked(state), {"return_value": None}
            return snap, {"return_value": None}
        now = self._clock if self._compute_is_no_wait else workflow.now()
        return snap, os_call_answer(name, args, snap.kwargs, now=now, env=self._spec.env, files=self._repl.files)

    @staticmethod
    async def _sleep(seconds: float) -> tuple[Settled, CallRecord | None]:
        if seconds > 0:
            await workflow.sleep(seconds)
        return {"return_value": None}, None

    async def _settle(self, snap: FutureSnapshot) -> tuple[Any, Any]:
        ids = sorted(snap.pending_call_ids)
        pending = self._pending
        current: Any = snap
        if not any(pending[i].done() for i in ids):
            self.tell_printed()
            for_people = self._waiting_on_people(ids)
            if self._may_hold(ids, for_people) and self._repl.sessions.try_hold():
                # A short wait on tool calls: the program keeps its process, saving a dump and a load.
                try:
                    await self._pending.first_done(ids)
                finally:
                    self._repl.sessions.release_hold()
            else:
                # The program waits on Temporal: release its process for the wait (see `_sandbox`'s module docstring).
                current = Parked(self._repl.park(snap))
                await self._pending.first_done(ids)
            self._waited()
        answers: dict[int, Any] = {}
        for i in ids:  # ascending: see `_sandbox`'s module docstring
            future = self._pending[i]
            if future.done():
                del self._pending[i]
                self._started.pop(i, None)
                self._args_in_flight.pop(i, None)
                settled, record = future.result()
                if record is not None:
                    self._calls.append(record)
                answers[i] = settled
        return current, answers

    def _may_hold(self, ids: list[int], for_people: bool) -> bool:
        """Whether the program may keep its process while it waits on `ids` (see `worker/_pool.SandboxPool.try_hold`).

        Only for waits on tool calls (not people, not timers: both can be
        long), and only while the last dump is recent enough to compute from again (a process that dies while
        held is replaced by the compute activity, from `_base` with the answers since). Replays hold too: their
        waits last no longer than the next activation from the history, and a dump and a load per wait made a
        replay twice the floor's time. Holding or not computes the same, so a replay may decide otherwise than
        the run it replays (and `_base` matters only live: a replay never sends a compute request).
        """
        return (not for_people and self._base is not None
                and len(self._base.answers) < MAX_ANSWERS_SINCE_DUMP and self._started.keys() >= set(ids))

    def _waiting_on_people(self, ids: list[int]) -> bool:
        """Whether every pending call waits for a person: a wait that may last days, so never held."""
        return all(i in self._started and self._repl.awaiting_person(self._started[i].call_id) for i in ids)

    def _cancel_pending(self) -> None:
        # Calls still running when the program ends (e.g. a gather that raised) are cancelled, and recorded
        # as such; then the records are put in call order (they were appended in completion order).
        for i, future in self._pending.items():
            started = self._started.pop(i, None)
            record = None
            if future.done() and not future.cancelled():
                record = future.result()[1]
            else:
                future.cancel()
            if record is None and started is not None:  # made only for a call that has no record of its own
                record = started.cancelled()
            if record is not None:
                self._calls.append(record)
        self._pending.clear()
        self._calls.sort(key=lambda r: int(r.call_id.rsplit(".", 1)[1]))
