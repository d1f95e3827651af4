"""A run's REPL: Monty driven from workflow code, every suspension answered through Temporal.

This module runs inside workflow code, so it must be deterministic given the history:
- tool calls become activities started in the order Monty announces them (deterministic given the same
  answers), with ids `<run_code id>.<n>`;
- a `FutureSnapshot` is answered with the calls Temporal reports done in this activation, in ascending call id
  order (Monty hands `pending_call_ids` back in random order, and the order of the answers decides which
  sandbox task wakes first and so every later call id);
- clock reads answer `workflow.now()`, sleeps are durable timers, `random` is seeded from `workflow.random()`,
  environment reads see only the recorded allow-list, file calls are answered from the run's own files
  (`_files.RunFilesystem`, plain data in workflow state) or refused when the run has none.

The non-deterministic outcomes are how long a stretch of compute takes (wall time) and a crashed sandbox. Each
is decided once, live, and recorded in that workflow task (a `workflow.patched` marker and the compute activity,
see `_SnippetDriver`): a replay reads it and never times anything.

A run holds a sandbox process only while its program computes, within one activation: whenever the program waits on
Temporal (tool calls, timers, a person), it is dumped into workflow memory and its process goes back to the pool,
and the next activation loads it into whichever process is free. (A program waiting on plain tool calls may keep
its process instead, within the pool's hold budget, live and in replays: `worker/_pool.SandboxPool.try_hold`; so may a
live run waiting on its model between snippets, and a fresh snippet may take a session warmed meanwhile:
`Repl.run`, `Repl.reserve_session`.) So the pool bounds the workflow tasks computing at once, not the runs whose
programs are live (see `PoolSettings`). Holding the process across the wait made every run past the pool's size
fail its workflow tasks with `SandboxUnavailableError` until one was free: 40 runs of 100 sequential calls on a
4-process pool took minutes, with 200+ failed tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, cast

import pydantic_monty
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
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from ..shared._compute_wire import NAME_LOOKUP, decode_dump, encode_answer, encode_dump, encoded_size
from ..shared._config import is_time_limit, monty_limits
from ..shared._files import FILES_ROOT
from ..shared._names import (
    COMPUTE_ACTIVITY,
    compute_activity_id,
    compute_marker,
    nested_call_id,
    type_check_rejection_marker,
)
from ..shared._results import bounded_result, clip, jsonable, preview, printable
from ..shared._types import FILE_LISTING_LIMIT, AgentSpec, CallRecord, ComputeRequest, ComputeResult
from ._catalog import CATALOG_FUNCTIONS, CatalogIndex
from ._files import FILE_FUNCTIONS, RunFilesystem
from ._guards import (
    MAX_ANSWERS_WITHOUT_WAIT,
    MAX_CALLS_IN_FLIGHT,
    args_bytes,
    non_json_problem,
    output_overflow_message,
    stopped_message,
)
from ._sandbox_sessions import SandboxSessions
from ._stubs import CATALOG_PRELUDE, FILES_PRELUDE, TYPE_CHECK_PRELUDE

__all__ = ["CallSite", "Repl", "SandboxUnavailableError", "SnippetOutcome", "StartTool", "close_repls"]

Settled = dict[str, Any]
"""A settled Monty answer: `{'return_value': v}` or `{'exc_type': 'ValueError', 'message': m}`."""

@dataclass(frozen=True)
class CallSite:
    """Where in a program a tool call is."""

    code: str
    line: int


StartTool = Callable[[str, dict[str, Any], str, CallSite], Awaitable[tuple[Settled, CallRecord]]]
"""Starts one tool call `(tool, kwargs, call_id, site)` and returns what settles it; supplied by the workflow.

It is called synchronously when the program makes the call, so anything it registers (a pending approval) is
visible before the program next waits."""

AwaitingPerson = Callable[[str], bool]
"""Whether the call with this id is waiting for a human decision (so the sandbox may be released meanwhile)."""


class SandboxNotices(Protocol):
    """What a program does that the run's observers hear of (`RunProgress`): what it prints, compute it hands on."""

    def printed(self, *, call_id: str, text: str) -> None: ...

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None: ...


class _NoNotices:
    def printed(self, *, call_id: str, text: str) -> None:
        pass

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None:
        pass

_FILE_FUNCTIONS_MESSAGE = "run_code has no file system or network; use the tools to read and change data"
_IMPORTS_MESSAGE = (
    "run_code programs have no processes, files or network; they can import asyncio, json, re, math, datetime, "
    "time, random, collections, itertools, functools, decimal, hashlib, base64, csv, typing, and os for getenv; "
    "use the tools for everything else"
)


class SandboxUnavailableError(RuntimeError):
    """No sandbox process was free in time (a worker breaking the rule of `PoolSettings`, under load).

    Raised in workflow code, it fails the workflow task (not the workflow), so Temporal retries the task once a
    process is free.
    """


@dataclass(kw_only=True)
class SnippetOutcome:
    """What one `run_code` call came to."""

    kind: Literal["ok", "error", "rejected", "compute_limit", "sandbox_crashed"]
    content: Any
    """For the model: the bounded result object (`ok`, `error`) or the message to retry with (`rejected`)."""
    calls: list[CallRecord] = field(default_factory=list)
    restart_repl: bool = False
    """The program was stopped mid-way (deterministically, unlike a compute limit): its REPL is discarded."""
    computed_seconds: float | None = None
    """Compute the program did in compute activities, past its in-workflow budget (`None`: none)."""
    files: dict[str, int] | None = None
    """The run's files after the snippet (path -> bytes, at most `FILE_LISTING_LIMIT`), if it changed them."""
    files_omitted: int = 0

    @property
    def ends_run(self) -> bool:
        """Whether the workflow run must continue as new now, in this workflow task."""
        return self.kind in ("compute_limit", "sandbox_crashed")

    @property
    def summary(self) -> str:
        """A preview for the run's summary."""
        return preview(self.content)


_REBINDING = "error[invalid-assignment]"
_UNKNOWN_NAME = "error[unresolved-reference]"


def _real_type_errors(error: MontyTypingError, *, lenient_names: bool) -> str:
    """The diagnostics of a rejected snippet worth rejecting it for (one per line in the concise format).

    Monty types a REPL's variables by their first value (`x = 1` declares `Literal[1]` for later snippets), so
    rebinding one in a later snippet (`x += 1`, `x = 'done'`) is reported as an invalid assignment. That is
    ordinary REPL use, so those diagnostics are dropped, and such a snippet runs unchecked. An unchecked snippet
    does not join the checker's context, so once one has run, the names it defined look unknown to the checker
    (`lenient_names`): unknown names are then left to the runtime's `NameError`. Everything else (missing
    `await`, wrong tool arguments) still rejects the snippet before it runs.
    """
    dropped = (_REBINDING, _UNKNOWN_NAME) if lenient_names else (_REBINDING,)
    return "\n".join(line for line in error.display().splitlines() if not any(d in line for d in dropped)).strip()


def _replaying() -> bool:
    return workflow.unsafe.is_replaying()


_open_repls: dict[str, set[Repl]] = {}
"""Live REPLs by task queue. A worker that shuts down drops its cached workflows without evicting them (their
`finally` blocks run only when garbage collected), so the worker closes its REPLs itself: `close_repls`."""


def close_repls(task_queue: str) -> int:
    """Close every live REPL of runs on `task_queue` in this process; returns how many were open."""
    repls = list(_open_repls.pop(task_queue, ()))
    for repl in repls:
        repl.close()
    return len(repls)


class Repl:
    """The Monty session of one workflow run; variables persist across its snippets."""

    def __init__(self, spec: AgentSpec, start_tool: StartTool, sessions: SandboxSessions,
                 awaiting_person: AwaitingPerson = lambda call_id: False,
                 files: RunFilesystem | None = None, notices: SandboxNotices | None = None) -> None:
        self._spec = spec
        self.sessions = sessions
        """The worker's Monty processes, as workflow code may use them (`_sandbox_sessions`)."""
        self.notices: SandboxNotices = notices or _NoNotices()
        self.files = files
        """The run's files (`RunFiles`), which outlive the REPL (a restart keeps them); `None`: the run has none."""
        self._start_tool = start_tool
        self.awaiting_person = awaiting_person
        self._session: pydantic_monty.MontySession | None = None
        self._checked_out = contextlib.ExitStack()
        """The checkout of `_session` (`SandboxPool.session`): closing it returns the session and counts it back."""
        self._tools = {t.name for t in spec.tools if t.in_sandbox}
        self._catalog: CatalogIndex | None = None
        self._idle_state: bytes | None = None
        """The REPL between snippets, dumped while the run waits on the model (the REPL of record, even while the
        session is kept: `run`)."""
        self.lenient_names = False
        """A snippet ran unchecked, so the type checker no longer knows every name (see `_real_type_errors`)."""
        self._task_queue = workflow.info().task_queue
        self._snippets = 0
        """Snippets this workflow run has fed (compute markers are keyed by it)."""
        self._kept = False
        """The session stayed checked out after the last snippet (`run`), on one of the hold budget's places."""
        self._reserved: tuple[int, str] | None = None
        """The next snippet's seed, drawn before the model request, and the key of its warm session."""

    def _checkout_options(self, seed: int, *, replaying: bool) -> dict[str, Any]:
        """What `Monty.checkout` is given for a session of this run (`seed` seeds its `random`)."""
        return {
            "script_name": "snippet.py",
            "limits": monty_limits(self._spec.limits, replaying=replaying),
            "os_policy": {"datetime": "call_host", "sleep": "call_host", "random_start": {"seed": seed}},
            "type_check": True,
            "type_check_stubs": (TYPE_CHECK_PRELUDE + self._spec.stubs
                                 + (FILES_PRELUDE if self.files is not None else "")
                                 + (CATALOG_PRELUDE if self._spec.catalog else "")),
            "type_check_format": "concise",
        }

    def _checkout(self, *, seed: int, warm_key: str | None = None) -> pydantic_monty.MontySession:
        """A fresh session from the pool; `seed` seeds its `random` (drawn from `workflow.random()` by the caller).

        A session that only loads a suspended program gets a fixed seed: the dump brings its own `random` state.
        `warm_key`: the session warmed for this snippet, if there is one (`reserve_session`), is taken instead of a
        cold one.
        """
        # A replayed task gets a process without the live backstop: what it re-runs, the live run finished in
        # workflow code, and its outcome must not depend on how fast this machine is (see `worker/_pool`).
        replaying = _replaying()
        options = self._checkout_options(seed, replaying=replaying)
        checkout = self.sessions.session(options, kind="replay" if replaying else "live",
                                            warm_key=None if replaying else warm_key)
        try:
            session = self._checked_out.enter_context(checkout)
        except TimeoutError as e:
            raise SandboxUnavailableError(
                "no Monty sandbox process was free in time; the workflow task will be retried. The process's "
                "code-mode workers have more workflow task slots than its pool has processes: give them fewer "
                "max_concurrent_workflow_tasks, or the pool more PoolSettings.max_processes."
            ) from e
        _open_repls.setdefault(self._task_queue, set()).add(self)
        return session

    def reserve_session(self) -> None:
        """Before a model request: draw the next snippet's seed now, and (live) warm a fresh session with it.

        A session's first type check costs ~15 ms (`worker/_pool.SandboxPool.prewarm_session`); drawn here, the seed is
        known while the request is in flight, so a fresh session for the snippet it may bring can be warmed
        meanwhile. Every code-mode run draws it here, whether a session is warmed or not (and a replay warms none):
        the same draws, live and on replay. A reservation not yet taken stands.
        """
        if self._reserved is not None:
            return
        key = f"{workflow.info().run_id}/{self._snippets}"
        self._reserved = (workflow.random().getrandbits(63), key)
        if not _replaying() and self._idle_state is None and self._session is None:
            self.sessions.prewarm_session(key, self._checkout_options(self._reserved[0], replaying=False))

    def take_reserved_seed(self) -> tuple[int, str] | None:
        """The seed `reserve_session` drew for this snippet, with its warm session's key; `None` if none was."""
        reserved, self._reserved = self._reserved, None
        return reserved

    def release_reservation(self) -> None:
        """The run ends: drop the session warmed for a snippet that will not come."""
        if self._reserved is not None:
            self.sessions.discard_warm_session(self._reserved[1])
            self._reserved = None

    @property
    def catalog(self) -> CatalogIndex | None:
        """The run's recorded catalog, if its description carries the index: it answers the catalog functions.

        Built at the first `search_tools` / `describe_tool` call (~20 ms for 300 tools), so runs that never
        search do not pay for it (see `_catalog`).
        """
        if self._catalog is None and self._spec.catalog is not None:
            self._catalog = CatalogIndex(self._spec.catalog)
        return self._catalog

    @property
    def idle_dump(self) -> bytes | None:
        """The REPL as it stands between snippets; `None` if it was never used (or was restarted and not used)."""
        return self._idle_state

    def preload(self, state: bytes, *, lenient_names: bool) -> None:
        """Start from a session dump (a REPL carried across continue-as-new); loaded at the next snippet."""
        self._idle_state = state
        self.lenient_names = lenient_names

    @property
    def session(self) -> pydantic_monty.MontySession | None:
        """The session this REPL holds right now, if any."""
        return self._session

    def park(self, snapshot: FutureSnapshot | FunctionSnapshot) -> bytes:
        """Dump a suspended program and give its sandbox process back to the pool while it waits."""
        state = snapshot.dump()
        self.close()
        return state

    def unpark(self, state: bytes, streams: CollectStreams) -> Any:
        """Load a parked program into a fresh sandbox process; returns its re-announced snapshot.

        The session gets a fixed seed: the dump brings its own `random` state.
        """
        self._session = self._checkout(seed=0)
        return self._session.load_snapshot(state, print_callback=streams)

    def close(self) -> None:
        """Return the sandbox process to the pool; the REPL's state is gone."""
        session, self._session = self._session, None
        if self._kept:
            self._kept = False
            self.sessions.release_hold()
        if session is not None:
            _open_repls.get(self._task_queue, set()).discard(self)
            self._checked_out.close()  # ended off the workflow thread; a process already gone is replaced

    async def run(self, code: str, *, run_code_id: str, restart: bool) -> SnippetOutcome:
        """Feed one snippet and drive it to completion; never raises a `MontyError`."""
        if restart:
            self.close()
            self._idle_state = None
            self.lenient_names = False
        self._snippets += 1
        files_before = self.files.version if self.files is not None else 0
        driver = _SnippetDriver(self, self._tools, code, run_code_id, snippet=self._snippets)
        outcome = await driver.drive()
        driver.tell_printed()
        if self.files is not None and self.files.version != files_before:
            listing = self.files.listing()
            outcome.files = dict(list(listing.items())[:FILE_LISTING_LIMIT])
            outcome.files_omitted = max(len(listing) - FILE_LISTING_LIMIT, 0)
        if driver.lost_note is not None and isinstance(outcome.content, dict):
            outcome.content["note"] = driver.lost_note
        if outcome.ends_run:
            self.close()
        elif outcome.restart_repl:
            self.close()
            self.lenient_names = False
        elif self._session is not None:
            # Between snippets the run waits on the model (seconds with a real one): the REPL is kept as a dump in
            # workflow memory, and the process is given back, unless one of the hold budget's places is free: then
            # the run keeps it, and its next snippet is fed to it without a load or the ~15 ms of a fresh
            # session's first type check. Holding without a budget made a burst of 1,000 approvals fail 2,732
            # workflow tasks with SandboxUnavailableError on a 4-process pool.
            try:
                self._idle_state = self._session.dump()
            except MontyError:
                self._idle_state = None  # the process died after the snippet: the next one starts fresh
                self.close()
                return outcome
            if self._may_keep_between_snippets() and self.sessions.try_hold():
                self._kept = True
            else:
                self.close()
        return outcome

    def _may_keep_between_snippets(self) -> bool:
        """Whether the session may stay checked out while the run waits on its model (see `run`).

        Live only: the dump taken at the snippet's end stays the REPL of record
        (a continue-as-new carries it, the compute activity computes from it), and the kept session is the same
        REPL, so feeding it the next snippet computes what loading the dump would. A replay loads dumps as it
        always did (a session checked out by a replay has no live backstop, and must not go on live).
        """
        return not _replaying()

    def adopt(self, state: bytes | None) -> None:
        """Make `state` (a REPL dump between snippets, or `None`: fresh) the REPL; no process is held."""
        self.close()
        self._idle_state = state

    def open_session(self, seed: int, warm_key: str | None = None) -> tuple[pydantic_monty.MontySession, str | None]:
        """Check out a session for a snippet's start, with the REPL loaded; and why the REPL was lost, if it was.

        `warm_key`: a fresh REPL takes the session warmed for it, if there is one; one that loads a dump drops it
        (a dump loads only into a session nothing was fed).
        """
        if warm_key is not None and self._idle_state is not None:
            self.sessions.discard_warm_session(warm_key)
            warm_key = None
        if self._kept and self._session is not None:  # the REPL's own session, kept since its last snippet
            self._kept = False
            self.sessions.release_hold()  # now this workflow task's session, as a checkout would be
            self._idle_state = None
            return self._session, None
        self._session = self._checkout(seed=seed, warm_key=warm_key)
        state, self._idle_state = self._idle_state, None
        if state is None:
            return self._session, None
        try:
            self._session.load_session(state)
        except MontyCrashedError:
            self.close()
            self._idle_state = state
            raise  # the process died under the load: the driver goes on in the compute activity
        except MontyError as e:  # deterministic for the same dump and Monty version, so replay-safe
            self.close()
            self._session = self._checkout(seed=seed)
            return self._session, (f"The REPL could not be restored ({type(e).__name__}: {e}) and was restarted: "
                                   "variables from earlier run_code calls are gone.")
        return self._session, None


@dataclass
class _Parked:
    """A program dumped while it waited; loaded again (`Repl.unpark`) only when its next stretch runs."""

    state: bytes


@dataclass
class _Completed:
    """A snippet the compute activity finished: its value (as JSON) and the REPL after it."""

    output: Any
    state: bytes | None


@dataclass(slots=True)
class _InFlight:
    """A tool call the program started and has not had the answer of; its record is made only if it never does.

    (Every call has one while it runs; a `CallRecord` and the preview of its arguments per call cost more than the
    call's own bookkeeping in a replay of a 200-call gather.)
    """

    call_id: str
    tool: str
    args: dict[str, Any]
    started_at: datetime

    def cancelled(self) -> CallRecord:
        return CallRecord(call_id=self.call_id, tool=self.tool, args=preview(self.args), status="cancelled",
                          result="the program ended before this call finished; the tool may still have run",
                          started_at=self.started_at, finished_at=self.started_at)


@dataclass
class _Base:
    """Where the compute activity would start a stretch from: a dump, and the answers given since."""

    start: Literal["feed", "snapshot"]
    state: bytes | None
    printed: str
    """What the program had printed when `state` was taken (the activity prints the rest again)."""
    answers: list[Any] = field(default_factory=list)


def _too_large(size: int) -> str:
    return (f"it computed past its in-workflow budget with {size:,} bytes of state (compressed), more than a "
            "compute activity can carry without a payload store (Temporal refuses payloads over 2 MiB): give the "
            "workers a payload store (CODEMODE_PAYLOAD_STORE), or keep less data in variables")


_RECORDED_REJECTION = ("The code was not run: type error (recorded when this run first checked it).\nFix the code "
                       "and call run_code again.")
"""A rejected snippet's content when a replay's check, with less context than live, found nothing to reject."""


class _SnippetEnded(Exception):
    """The snippet ends with `outcome` (it came back from the compute activity finished, failed or lost)."""

    def __init__(self, outcome: SnippetOutcome) -> None:
        super().__init__(outcome.kind)
        self.outcome = outcome


_COMPUTE_HEARTBEAT = timedelta(seconds=5)
_COMPUTE_RETRY = RetryPolicy(maximum_attempts=3)
"""Attempts of the compute activity: an attempt fails only when its worker is lost (a sandbox crash is a result)."""

_MAX_ANSWERS_SINCE_DUMP = 200
"""Answers a program may be given since its last dump while it keeps its process over waits; then it is dumped
at its next wait, so the compute activity never has a long history of answers to give again."""

_DUMP_LIMIT_WITHOUT_STORE = 1_800_000
"""Characters of encoded dump (`_compute_wire.encode_dump`) a compute activity may carry without a payload
store: inside Temporal's 2 MiB payload limit, with room for the rest of the payload."""


class _SnippetDriver:
    """Answers one snippet's suspensions until it completes.

    The program runs in *stretches* of compute, each between two host round trips; stretch 0 starts the
    snippet, stretch n runs from the answer to round trip n. Each live stretch is timed, and one past the
    in-workflow budget is recorded by a `workflow.patched` marker (`compute_marker`) and the compute activity, in
    the same workflow task: finished in workflow code, its outcome is recorded; killed by the live backstop, or by
    a crash, it is computed again in the activity from the last dump (`_Base`). A replay asks for the marker
    before every stretch and, when it is there, takes the activity's recorded outcome instead of running the
    stretch: no replay times anything.
    """

    def __init__(self, repl: Repl, tools: set[str], code: str, run_code_id: str, *, snippet: int) -> None:
        self._repl = repl
        self._spec = spec = repl._spec
        self._tools = tools
        self._start_tool = repl._start_tool
        self._code = code
        self._run_code_id = run_code_id
        self._snippet = snippet
        self._pending: dict[int, asyncio.Future[tuple[Settled, CallRecord | None]]] = {}
        self._started: dict[int, _InFlight] = {}
        """Tool calls in flight, by Monty call id: what their record says if the program ends before they do."""
        self._calls: list[CallRecord] = []
        self._n = 0
        self._streams = CollectStreams(max_bytes=spec.limits.max_output_bytes + 1)
        self._printed_before = ""
        """Printed output from before `_streams` was replaced (after a stretch came from the compute activity)."""
        self._told = 0
        """Characters of the printed output the run's observers were told of (`tell_printed`)."""
        self._answers = 0
        """Host round trips since the driver last waited on Temporal (see `_guards.MAX_ANSWERS_WITHOUT_WAIT`)."""
        self._args_in_flight: dict[int, int] = {}
        """Argument bytes of the tool calls in flight, by Monty call id."""
        self._stretch = 0
        self._activation_seconds = 0.0
        """Compute of the stretches run since the driver last waited on Temporal (`max_feed_seconds`)."""
        self._computed_seconds = 0.0
        self._base: _Base | None = None
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
        """The program just waited on Temporal: a new workflow task, with its own budgets."""
        self._answers = 0
        self._activation_seconds = 0.0

    async def drive(self) -> SnippetOutcome:
        limits = self._spec.limits
        try:
            try:
                snap = await self._first_stretch()
                while not isinstance(snap, (MontyComplete, _Completed)):
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
                if isinstance(snap, _Completed):
                    self._repl.adopt(snap.state)
                    output = snap.output
                else:
                    output = snap.output
                content = bounded_result(output, self._printed(), max_bytes=limits.max_output_bytes)
                return self._with_compute(SnippetOutcome(kind="ok", content=content, calls=self._calls))
            finally:
                self._cancel_pending()
        except _SnippetEnded as ended:
            ended.outcome.calls = self._calls
            return self._with_compute(ended.outcome)
        except MontySyntaxError as e:
            return self._rejected("SyntaxError", e.display("type-msg"))
        except MontyTypingError as e:
            return self._rejected("type error", _real_type_errors(e, lenient_names=self._repl.lenient_names))
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
        if not _replaying():
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
            real = _real_type_errors(e, lenient_names=self._repl.lenient_names)
            if rejected and not real:  # what made it rejected was context this replay lacks
                raise _SnippetEnded(SnippetOutcome(kind="rejected", content=_RECORDED_REJECTION,
                                                   calls=self._calls)) from e
            if real:
                if rejected is None and not _replaying():
                    workflow.patched(type_check_rejection_marker(self._snippet, self._run_code_id))
                raise
            self._repl.lenient_names = True
            return session.feed_start(self._code, print_callback=self._streams, skip_type_check=True, cwd=self._cwd)
        if rejected:  # checked again with less context than live: still rejected, as recorded
            self._repl.adopt(self._start_state if self.lost_note is None else None)  # the program did not run
            raise _SnippetEnded(SnippetOutcome(kind="rejected", content=_RECORDED_REJECTION, calls=self._calls))
        return snap

    async def _first_stretch(self) -> Any:
        """Stretch 0: check out a session, load the REPL, start the snippet."""
        reserved = self._repl.take_reserved_seed()  # drawn before the model request (`Repl.reserve_session`)
        # Else drawn first, always: the same draws live and on replay.
        seed, warm_key = reserved if reserved is not None else (workflow.random().getrandbits(63), None)
        # Asked before the compute marker: live, a rejection is recorded while the stretch runs, before it.
        self._rejected_on_replay = self._replayed_rejection()
        self._start_state = self._repl.idle_dump
        self._base = _Base("feed", self._start_state, printed="")
        if _replaying() and workflow.patched(self._marker(0)):
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
        if isinstance(current, _Parked):
            self._base = _Base("snapshot", current.state, printed=self._printed())
        self._base.answers.append(answer)
        if _replaying() and workflow.patched(self._marker(self._stretch)):
            self._repl.close()
            return await self._from_activity(self._request())

        def resume() -> Any:
            snap = self._repl.unpark(current.state, self._streams) if isinstance(current, _Parked) else current
            return snap.resume() if answer is NAME_LOOKUP else snap.resume(answer)

        return await self._live_stretch(resume)

    async def _live_stretch(self, step: Callable[[], Any], seed: int = 0) -> Any:
        """Run one stretch (`step`: load if need be, then feed or resume); what stops it goes to the activity.

        A process killed under it (the live backstop, a crash) and the session's own time limit
        (`max_compute_seconds`, when under the backstop: wall time too) are decided where the replay reads them:
        the compute activity computes the stretch from the last dump. The program's own errors propagate.
        """
        started = time.monotonic()  # determinism: ok (timed live only; what it decides is recorded)
        try:
            snap = step()
        except MontyRuntimeError as e:
            if not is_time_limit(e):
                raise
            return await self._went_over(self._request(seed), killed=e)
        except (MontySyntaxError, MontyTypingError):
            raise
        except MontyError as e:
            return await self._went_over(self._request(seed), killed=e)
        return await self._timed(snap, started)

    async def _timed(self, snap: Any, started: float) -> Any:
        """A live stretch that finished in workflow code: recorded if it was past the in-workflow budget."""
        if _replaying():
            return snap  # a replay decides nothing by the clock: over-budget stretches have their marker
        took = time.monotonic() - started  # determinism: ok (timed live only; what it decides is recorded)
        self._activation_seconds += took
        limits = self._spec.limits
        if took <= limits.max_turn_seconds and self._activation_seconds <= limits.max_feed_seconds:
            return snap
        outcome = self._outcome_of(snap, took)
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
        if encoded_size(encoded) > _DUMP_LIMIT_WITHOUT_STORE and not self._spec.payload_store:
            return None
        return ComputeResult(kind=kind, state=encoded, where="workflow", seconds=took,
                             output=jsonable(snap.output) if isinstance(snap, MontyComplete) else None,
                             printed=self._printed()[len(self._base.printed):])

    def _request(self, seed: int = 0) -> ComputeRequest:
        """The compute activity's input: the stretch from the last dump (unchecked on replay: never re-sent)."""
        base = self._base
        assert base is not None
        if _replaying():  # never sent: the replay takes the recorded result (Temporal compares no inputs)
            return ComputeRequest(agent=self._spec.agent, run_code_id=self._run_code_id, start=base.start,
                                  state=None, limits=self._spec.limits)
        return ComputeRequest(
            agent=self._spec.agent, run_code_id=self._run_code_id, start=base.start, state=encode_dump(base.state),
            code=self._code if base.start == "feed" else "", answers=[encode_answer(a) for a in base.answers],
            limits=self._spec.limits, seed=seed,
            max_dump_bytes=None if self._spec.payload_store else _DUMP_LIMIT_WITHOUT_STORE, cwd=self._cwd)

    def _marker(self, stretch: int) -> str:
        return compute_marker(self._snippet, self._run_code_id, stretch)

    async def _went_over(self, request: ComputeRequest, *, killed: MontyError | None = None,
                         keep: Any = None) -> Any:
        """Live: record that this stretch comes from the compute activity, then get it from there."""
        if killed is not None and _replaying():
            # Only a live stretch may be recorded; a replayed one that dies (the replay pool has no backstop, so
            # a real crash) cannot take another path than the run it replays: fail the task, to be retried.
            raise SandboxUnavailableError(
                f"a replayed stretch of {self._run_code_id} stopped in its sandbox ({type(killed).__name__}: "
                f"{killed}); the workflow task will be retried") from killed
        if request.max_dump_bytes is not None and encoded_size(request.state) > request.max_dump_bytes:
            self._repl.close()
            raise _SnippetEnded(self._lost(_too_large(encoded_size(request.state))))
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
                heartbeat_timeout=_COMPUTE_HEARTBEAT, retry_policy=_COMPUTE_RETRY, summary=summary)
        except ActivityError as e:
            cause = e.cause.message if isinstance(e.cause, ApplicationError) else str(e.cause or e)
            raise _SnippetEnded(self._lost(f"its compute activity failed: {cause}")) from e
        self._waited()
        if result.where == "activity":  # from the result, so a replay decides the same
            self._computed_seconds += result.seconds
            self._repl.lenient_names = True  # it ran unchecked: later checks may not know the names it defined
        assert self._base is not None
        state = decode_dump(result.state)
        if keep is not None and result.kind == "suspended" and state is not None:
            self._base = _Base("snapshot", state, printed=self._printed())
            return keep  # its prints went to `_streams`, as the recorded ones say
        self._printed_before = self._base.printed + result.printed
        self._streams = CollectStreams(max_bytes=limits.max_output_bytes + 1)
        if result.kind == "suspended" and state is not None:
            snap = self._load_outcome(state)
            self._base = _Base("snapshot", state, printed=self._printed())
            return snap
        if result.kind == "complete":
            return _Completed(output=result.output, state=state)
        if result.kind == "error":
            self._repl.adopt(state)
            raise _SnippetEnded(SnippetOutcome(kind="error", content=self._error_content(
                result.error or "the program failed", result.traceback)))
        if result.kind == "too_large":
            raise _SnippetEnded(self._lost(_too_large(int(result.error or 0))))
        if result.kind == "runaway":
            raise _SnippetEnded(self._lost(
                f"it computed for more than {limits.max_compute_seconds:g} s without a tool call or other host "
                f"round trip ({result.error}): a runaway loop, or work to split into smaller steps "
                "(SnippetLimits.max_compute_seconds)"))
        raise _SnippetEnded(self._lost(f"its sandbox process failed ({result.error})"))

    def _load_outcome(self, state: bytes) -> Any:
        """Load where the compute activity left the program; a process that dies under the load is replaced.

        Loading decides nothing (no command depends on how long it takes), so a second try is replay-safe; a
        second failure fails the workflow task, and Temporal retries it.
        """
        try:
            return self._repl.unpark(state, self._streams)
        except MontyCrashedError:
            self._repl.close()
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

    def _refused(self, name: str, kwargs: dict[str, Any]) -> tuple[Settled | None, int]:
        """Why a call must not start (the exception the program gets, or `None`), and its argument bytes.

        See `_guards` for what each refusal prevents.
        """
        problem = non_json_problem(kwargs, "the arguments")
        if problem is not None:
            return {"exc_type": "TypeError", "message": f"{name}(): {problem}"}, 0
        in_flight = len(self._started)
        if in_flight >= MAX_CALLS_IN_FLIGHT:
            return {"exc_type": "RuntimeError", "message": f"{name}(): {in_flight} tool calls are already in "
                    f"flight, the most a program may have at once; gather at most {MAX_CALLS_IN_FLIGHT} calls "
                    "at a time (in batches)"}, 0
        limit = self._spec.limits.max_tool_args_bytes
        if limit is None:
            return None, 0
        size = args_bytes(kwargs)
        if size > limit:
            return {"exc_type": "ValueError", "message": f"{name}(): the arguments are {size:,} bytes of JSON, "
                    f"over the {limit:,}-byte limit for one tool call (SnippetLimits.max_tool_args_bytes); pass "
                    "less per call (an id, a page, a slice), or have the tool fetch the data itself"}, 0
        pending = sum(self._args_in_flight.values())
        if pending + size > 2 * limit:
            return {"exc_type": "RuntimeError", "message": f"{name}(): the calls in flight already carry "
                    f"{pending:,} bytes of arguments, and this one {size:,}, over the {2 * limit:,} bytes calls in "
                    "flight may carry at once (twice SnippetLimits.max_tool_args_bytes); await some of them "
                    "first, or gather fewer at a time"}, 0
        return None, size

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
        refusal, size = self._refused(name, kwargs)
        if refusal is not None:
            return snap, cast(Any, refusal)  # a Settled exception answer, as Monty's TypedDict
        self._args_in_flight[snap.call_id] = size
        self.tell_printed()  # what it printed before the call comes before the call
        call_id = nested_call_id(self._run_code_id, self._n)
        self._n += 1
        site = CallSite(code=self._code, line=self._code.count("\n", 0, max(0, snap.position.start)) + 1)
        future = asyncio.ensure_future(self._start_tool(name, kwargs, call_id, site))
        self._pending[snap.call_id] = future  # type: ignore[assignment]
        self._started[snap.call_id] = _InFlight(call_id, name, kwargs, workflow.now())
        return snap, {"future": ...}

    async def _answer_os_call(self, snap: FunctionSnapshot) -> tuple[Any, Any]:
        name = snap.function_name
        args = snap.args
        now = workflow.now()
        if name == "datetime.now":
            tz = args[0] if args else None
            value: Any = now.astimezone(tz) if tz is not None else now.replace(tzinfo=None)
            return snap, {"return_value": value}
        if name == "date.today":
            return snap, {"return_value": now.date()}
        if name == "time.time":
            return snap, {"return_value": now.timestamp()}
        if name in ("time.sleep", "asyncio.sleep"):
            seconds = float(args[0]) if args else 0.0
            if name == "asyncio.sleep":
                self._pending[snap.call_id] = asyncio.ensure_future(self._sleep(seconds))
                return snap, {"future": ...}
            if seconds > 0:  # a durable timer: the program waits without its process
                self.tell_printed()
                state = self._repl.park(snap)
                await self._sleep(seconds)
                self._waited()
                return _Parked(state), {"return_value": None}
            return snap, {"return_value": None}
        if name == "os.getenv":
            key = args[0] if args else None
            default = args[1] if len(args) > 1 else None
            return snap, {"return_value": self._spec.env.get(str(key), default)}
        if name == "os.environ":
            return snap, {"return_value": dict(self._spec.env)}
        if name == "os.urandom":
            n = min(int(args[0]) if args else 0, 1 << 20)
            return snap, {"return_value": workflow.random().randbytes(n)}
        if name in ("import_stubs", "import"):
            modules = args[0] if args and isinstance(args[0], list) else list(args)
            return snap, {"exc_type": "ModuleNotFoundError", "message": f"No module named "
                                f"{', '.join(repr(m) for m in modules) or '?'}: {_IMPORTS_MESSAGE}"}
        if name in FILE_FUNCTIONS:
            files = self._repl.files
            if files is not None:  # a pure function of the run's files: the same answers on replay
                return snap, cast(Any, files.answer(name, args, dict(snap.kwargs or {})))
        return snap, {"exc_type": "PermissionError", "message": f"{name}: {_FILE_FUNCTIONS_MESSAGE}"}

    @staticmethod
    async def _sleep(seconds: float) -> tuple[Settled, CallRecord | None]:
        if seconds > 0:
            await workflow.sleep(seconds)
        return {"return_value": None}, None

    async def _settle(self, snap: FutureSnapshot) -> tuple[Any, Any]:
        ids = sorted(snap.pending_call_ids)
        futures = [self._pending[i] for i in ids]
        current: Any = snap
        if not any(f.done() for f in futures):
            self.tell_printed()
            for_people = self._waiting_on_people(ids)
            if self._may_hold(ids, for_people) and self._repl.sessions.try_hold():
                # A short wait on tool calls: the program keeps its process, saving a dump and a load.
                try:
                    await workflow.wait(futures, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self._repl.sessions.release_hold()
            else:
                # The program waits on Temporal: release its process for the wait (see the module docstring).
                current = _Parked(self._repl.park(snap))
                await workflow.wait(futures, return_when=asyncio.FIRST_COMPLETED)
            self._waited()
        answers: dict[int, Any] = {}
        for i in ids:  # ascending: see the module docstring
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
                and len(self._base.answers) < _MAX_ANSWERS_SINCE_DUMP and all(i in self._started for i in ids))

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

