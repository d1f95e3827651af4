"""A run's REPL: Monty driven from workflow code, every suspension answered through Temporal.

This module runs inside workflow code, so it must be deterministic given the history:
- tool calls become activities started in the order Monty announces them (deterministic given the same
  answers), with ids `<run_code id>.<n>`;
- a `FutureSnapshot` is answered with the calls Temporal reports done in this activation, in ascending call id
  order (Monty hands `pending_call_ids` back in random order, and the order of the answers decides which
  sandbox task wakes first and so every later call id);
- clock reads answer `workflow.now()`, sleeps are durable timers, `random` is seeded from `workflow.random()`,
  environment reads see only the recorded allow-list, files are refused.

The one non-deterministic outcome is a compute limit (wall time) or a crashed sandbox: the caller ends the
workflow run by continue-as-new in the same workflow task, so an open run never replays one.

A run holds a sandbox process only while its program computes, within one activation: whenever the program
waits on Temporal (tool calls, timers, a person), it is dumped into workflow memory and its process goes back
to the pool, and the next activation loads it into whichever process is free. So the pool bounds the workflow
tasks computing at once, not the runs whose programs are live (see `PoolSettings`). Holding the process across
the wait made every run past the pool's size fail its workflow tasks with `SandboxUnavailableError` until one
was free: 40 runs of 100 sequential calls on a 4-process pool took minutes, with 200+ failed tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

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

from .. import _pool
from .._names import SANDBOX_GUARDS_PATCH, nested_call_id
from .._results import bounded_result, preview
from .._stubs import TYPE_CHECK_PRELUDE
from .._types import AgentSpec, CallRecord
from ._guards import (
    MAX_ANSWERS_WITHOUT_WAIT,
    MAX_CALLS_IN_FLIGHT,
    args_bytes,
    non_json_problem,
    output_overflow_message,
    stopped_message,
)

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


def _guarded(spec: AgentSpec) -> bool:
    """Whether a guard that would act here does.

    In every run that recorded `sandbox_guards`, and in runs of the release that marked guards with a patch
    instead (asked only then, so runs older than both replay as they ran).
    """
    return spec.sandbox_guards or workflow.patched(SANDBOX_GUARDS_PATCH)


def _is_time_limit(error: MontyRuntimeError) -> bool:
    exc = error.exception()
    return isinstance(exc, TimeoutError) and "time limit exceeded" in str(exc)


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

    def __init__(self, spec: AgentSpec, start_tool: StartTool,
                 awaiting_person: AwaitingPerson = lambda call_id: False) -> None:
        self._spec = spec
        self._start_tool = start_tool
        self.awaiting_person = awaiting_person
        self._session: pydantic_monty.MontySession | None = None
        self._tools = {t.name for t in spec.tools if t.in_sandbox}
        self._idle_state: bytes | None = None
        """The REPL between snippets, dumped while the run waits on the model."""
        self.lenient_names = False
        """A snippet ran unchecked, so the type checker no longer knows every name (see `_real_type_errors`)."""
        self._task_queue = workflow.info().task_queue

    def _checkout(self, *, seed: int | None = None) -> pydantic_monty.MontySession:
        """A fresh session from the pool; `seed` seeds its `random` (default: drawn from `workflow.random()`).

        A session that only loads a suspended program gets a fixed seed: the dump brings its own `random` state,
        and drawing would change the `workflow.random()` stream (and so `os.urandom`) of runs recorded before
        programs were released while they wait.
        """
        limits = self._spec.limits
        session = _pool.get_pool().checkout(
            script_name="snippet.py",
            limits={
                "max_turn_duration_secs": limits.max_turn_seconds,
                "max_feed_duration_secs": limits.max_feed_seconds,
                "max_memory": limits.max_memory_bytes,
                "max_recursion_depth": limits.max_recursion_depth,
                # Our own bound is tool calls per snippet; Monty's counts every suspension of the whole session
                # (clock reads, future resolutions) and cannot be disabled, so it is set far out of the way.
                "max_suspensions": 1_000_000_000,
            },
            os_policy={
                "datetime": "call_host",
                "sleep": "call_host",
                "random_start": {"seed": workflow.random().getrandbits(63) if seed is None else seed},
            },
            type_check=True,
            type_check_stubs=TYPE_CHECK_PRELUDE + self._spec.stubs,
            type_check_format="concise",
        )
        try:
            session.__enter__()
        except TimeoutError as e:
            raise SandboxUnavailableError(
                "no Monty sandbox process was free in time; the workflow task will be retried. The process's "
                "code-mode workers have more workflow task slots than its pool has processes: give them fewer "
                "max_concurrent_workflow_tasks, or the pool more PoolSettings.max_processes."
            ) from e
        _pool.note_checkout(+1)
        _open_repls.setdefault(self._task_queue, set()).add(self)
        return session

    @property
    def idle_dump(self) -> bytes | None:
        """The REPL as it stands between snippets; `None` if it was never used (or was restarted and not used)."""
        return self._idle_state

    def preload(self, state: bytes, *, lenient_names: bool) -> None:
        """Start from a session dump (a REPL carried across continue-as-new); loaded at the next snippet."""
        self._idle_state = state
        self.lenient_names = lenient_names

    @property
    def held(self) -> bool:
        """Whether this REPL holds a sandbox process right now."""
        return self._session is not None

    def park(self, snapshot: FutureSnapshot | FunctionSnapshot) -> bytes:
        """Dump a suspended program and give its sandbox process back to the pool while it waits."""
        state = snapshot.dump()
        self.close()
        return state

    def unpark(self, state: bytes, streams: CollectStreams, *, draw_seed: bool = False) -> Any:
        """Load a parked program into a fresh sandbox process; returns its re-announced snapshot.

        `draw_seed`: draw the new session's seed from `workflow.random()` anyway, as programs parked for a person
        always did (the draw is part of how their runs replay).
        """
        self._session = self._checkout(seed=None if draw_seed else 0)
        return self._session.load_snapshot(state, print_callback=streams)

    def close(self) -> None:
        """Return the sandbox process to the pool; the REPL's state is gone."""
        session, self._session = self._session, None
        if session is not None:
            _pool.note_checkout(-1)
            _open_repls.get(self._task_queue, set()).discard(self)
            # The process may already be gone (crash, time limit); the pool replaces it.
            with contextlib.suppress(MontyError):
                session.__exit__(None, None, None)

    async def run(self, code: str, *, run_code_id: str, restart: bool) -> SnippetOutcome:
        """Feed one snippet and drive it to completion; never raises a `MontyError`."""
        if restart:
            self.close()
            self._idle_state = None
            self.lenient_names = False
        lost: str | None = None
        if self._session is None:
            # Checkout happens on first use, so a run that never calls run_code holds no sandbox process.
            self._session = self._checkout()
            state, self._idle_state = self._idle_state, None
            if state is not None:
                try:
                    self._session.load_session(state)
                except MontyError as e:  # deterministic for the same dump and Monty version, so replay-safe
                    self.close()
                    self._session = self._checkout()
                    lost = (f"The REPL could not be restored ({type(e).__name__}: {e}) and was restarted: variables "
                            "from earlier run_code calls are gone.")
        driver = _SnippetDriver(self, self._tools, code, run_code_id)
        outcome = await driver.drive(self._session)
        if lost is not None and isinstance(outcome.content, dict):
            outcome.content["note"] = lost
        if outcome.ends_run:
            self.close()
        elif outcome.restart_repl:
            self.close()
            self.lenient_names = False
        elif self._session is not None:
            # Between snippets the run waits on the model (seconds with a real one): keep the REPL as a dump in
            # workflow memory and give the process back. Holding it made a burst of 1,000 approvals fail 2,732
            # workflow tasks with SandboxUnavailableError on a 4-process pool.
            try:
                self._idle_state = self._session.dump()
            except MontyError:
                self._idle_state = None  # the process died after the snippet: the next one starts fresh
            self.close()
        return outcome


class _SnippetDriver:
    """Answers one snippet's suspensions until it completes."""

    def __init__(self, repl: Repl, tools: set[str], code: str, run_code_id: str) -> None:
        self._repl = repl
        self._spec = spec = repl._spec
        self._tools = tools
        self._start_tool = repl._start_tool
        self._code = code
        self._run_code_id = run_code_id
        self._pending: dict[int, asyncio.Future[tuple[Settled, CallRecord | None]]] = {}
        self._started: dict[int, CallRecord] = {}
        """Tool calls in flight, by Monty call id: what their record says if the program ends before they do."""
        self._calls: list[CallRecord] = []
        self._n = 0
        self._streams = CollectStreams(max_bytes=spec.limits.max_output_bytes + 1)
        self._answers = 0
        """Host round trips since the driver last waited on Temporal (see `_guards.MAX_ANSWERS_WITHOUT_WAIT`)."""
        self._args_in_flight: dict[int, int] = {}
        """Argument bytes of the tool calls in flight, by Monty call id."""

    def _printed(self) -> str:
        return "".join(text for _stream, text in self._streams.output)

    async def drive(self, session: pydantic_monty.MontySession) -> SnippetOutcome:
        limits = self._spec.limits
        try:
            try:
                try:
                    snap = session.feed_start(self._code, print_callback=self._streams)
                except MontyTypingError as e:
                    if _real_type_errors(e, lenient_names=self._repl.lenient_names):
                        raise
                    snap = session.feed_start(self._code, print_callback=self._streams, skip_type_check=True)
                    self._repl.lenient_names = True
                while not isinstance(snap, MontyComplete):
                    self._answers += 1
                    if self._answers > MAX_ANSWERS_WITHOUT_WAIT and _guarded(self._spec):
                        return self._stopped()
                    if isinstance(snap, FunctionSnapshot):
                        snap = await self._answer_call(snap)
                    elif isinstance(snap, FutureSnapshot):
                        snap = await self._settle(snap)
                    elif isinstance(snap, NameLookupSnapshot):
                        snap = snap.resume()  # an undefined name: NameError inside the snippet
                    else:  # pragma: no cover - Monty's sync API has no other snapshot kind
                        raise TypeError(f"unexpected Monty snapshot {snap!r}")
                content = bounded_result(snap.output, self._printed(), max_bytes=limits.max_output_bytes)
                return SnippetOutcome(kind="ok", content=content, calls=self._calls)
            finally:
                self._cancel_pending()
        except MontySyntaxError as e:
            return self._rejected("SyntaxError", e.display("type-msg"), e)
        except MontyTypingError as e:
            return self._rejected("type error", _real_type_errors(e, lenient_names=self._repl.lenient_names), e)
        except MontyRuntimeError as e:
            if _is_time_limit(e):
                return SnippetOutcome(
                    kind="compute_limit",
                    content={
                        "error": f"{e.display('type-msg')}. The program used more than its compute budget "
                        f"({limits.max_turn_seconds:g} s between tool calls, {limits.max_feed_seconds:g} s in "
                        "all) and was stopped. The REPL was restarted: variables from earlier run_code calls "
                        "are gone. Do heavy work in smaller steps, or with fewer loops over the data."
                    },
                    calls=self._calls,
                )
            error = bounded_result(None, self._printed(), max_bytes=limits.max_output_bytes)
            error["error"] = output_overflow_message(e.display("type-msg"), collector_cap=limits.max_output_bytes + 1,
                                                     limit=limits.max_output_bytes) or e.display("type-msg")
            error["traceback"] = e.display()
            return SnippetOutcome(kind="error", content=error, calls=self._calls)
        except MontyCrashedError as e:
            return self._crashed(str(e))
        except MontyError as e:  # disconnects, conversion errors: the session cannot be trusted any more
            return self._crashed(f"{type(e).__name__}: {e}")

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
        if problem is not None and _guarded(self._spec):
            return {"exc_type": "TypeError", "message": f"{name}(): {problem}"}, 0
        in_flight = len(self._started)
        if in_flight >= MAX_CALLS_IN_FLIGHT and _guarded(self._spec):
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

    def _rejected(self, what: str, message: str, error: MontyError) -> SnippetOutcome:
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

    async def _answer_call(self, snap: FunctionSnapshot) -> Any:
        if snap.is_os_function:
            return await self._answer_os_call(snap)
        name = snap.function_name
        if name not in self._tools:
            return snap.resume({"exc_type": "NameError", "message": f"name '{name}' is not defined"})
        if snap.args:
            return snap.resume({
                "exc_type": "TypeError",
                "message": f"{name}() takes keyword arguments only, e.g. {name}(id=1); got {len(snap.args)} "
                "positional",
            })
        if self._n >= self._spec.limits.max_tool_calls:
            return snap.resume({
                "exc_type": "RuntimeError",
                "message": f"tool call limit reached: a program may make {self._spec.limits.max_tool_calls} "
                "tool calls; split the work across several run_code calls",
            })
        kwargs = dict(snap.kwargs)
        refusal, size = self._refused(name, kwargs)
        if refusal is not None:
            return snap.resume(cast(Any, refusal))  # a Settled exception answer, as Monty's TypedDict
        self._args_in_flight[snap.call_id] = size
        call_id = nested_call_id(self._run_code_id, self._n)
        self._n += 1
        site = CallSite(code=self._code, line=self._code.count("\n", 0, max(0, snap.position.start)) + 1)
        future = asyncio.ensure_future(self._start_tool(name, kwargs, call_id, site))
        self._pending[snap.call_id] = future  # type: ignore[assignment]
        now = workflow.now()
        self._started[snap.call_id] = CallRecord(
            call_id=call_id, tool=name, args=preview(kwargs), status="cancelled",
            result="the program ended before this call finished; the tool may still have run",
            started_at=now, finished_at=now)
        return snap.resume({"future": ...})

    async def _answer_os_call(self, snap: FunctionSnapshot) -> Any:
        name = snap.function_name
        args = snap.args
        now = workflow.now()
        if name == "datetime.now":
            tz = args[0] if args else None
            value: Any = now.astimezone(tz) if tz is not None else now.replace(tzinfo=None)
            return snap.resume({"return_value": value})
        if name == "date.today":
            return snap.resume({"return_value": now.date()})
        if name == "time.time":
            return snap.resume({"return_value": now.timestamp()})
        if name in ("time.sleep", "asyncio.sleep"):
            seconds = float(args[0]) if args else 0.0
            if name == "asyncio.sleep":
                self._pending[snap.call_id] = asyncio.ensure_future(self._sleep(seconds))
                return snap.resume({"future": ...})
            if seconds > 0:  # a durable timer: the program waits without its process
                state = self._repl.park(snap)
                await self._sleep(seconds)
                snap = self._repl.unpark(state, self._streams)
                self._answers = 0
            return snap.resume({"return_value": None})
        if name == "os.getenv":
            key = args[0] if args else None
            default = args[1] if len(args) > 1 else None
            return snap.resume({"return_value": self._spec.env.get(str(key), default)})
        if name == "os.environ":
            return snap.resume({"return_value": dict(self._spec.env)})
        if name == "os.urandom":
            n = min(int(args[0]) if args else 0, 1 << 20)
            return snap.resume({"return_value": workflow.random().randbytes(n)})
        if name in ("import_stubs", "import"):
            modules = args[0] if args and isinstance(args[0], list) else list(args)
            return snap.resume({"exc_type": "ModuleNotFoundError", "message": f"No module named "
                                f"{', '.join(repr(m) for m in modules) or '?'}: {_IMPORTS_MESSAGE}"})
        return snap.resume({"exc_type": "PermissionError", "message": f"{name}: {_FILE_FUNCTIONS_MESSAGE}"})

    @staticmethod
    async def _sleep(seconds: float) -> tuple[Settled, CallRecord | None]:
        if seconds > 0:
            await workflow.sleep(seconds)
        return {"return_value": None}, None

    async def _settle(self, snap: FutureSnapshot) -> Any:
        ids = sorted(snap.pending_call_ids)
        futures = [self._pending[i] for i in ids]
        if not any(f.done() for f in futures):
            # The program waits on Temporal: release its process for the wait (see the module docstring).
            for_people = self._waiting_on_people(ids)
            state = self._repl.park(snap)
            await workflow.wait(futures, return_when=asyncio.FIRST_COMPLETED)
            self._answers = 0
            snap = self._repl.unpark(state, self._streams, draw_seed=for_people)
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
        return snap.resume(answers)

    def _waiting_on_people(self, ids: list[int]) -> bool:
        # Whether every pending call waits for a human. Such programs were the only ones parked before every
        # wait released the process, and their unpark drew a seed; it still does, so their runs replay.
        return all(i in self._started and self._repl.awaiting_person(self._started[i].call_id) for i in ids)

    def _cancel_pending(self) -> None:
        # Calls still running when the program ends (e.g. a gather that raised) are cancelled, and recorded
        # as such; then the records are put in call order (they were appended in completion order).
        for i, future in self._pending.items():
            record = self._started.pop(i, None)
            if future.done() and not future.cancelled():
                record = future.result()[1] or record
            else:
                future.cancel()
            if record is not None:
                self._calls.append(record)
        self._pending.clear()
        self._calls.sort(key=lambda r: int(r.call_id.rsplit(".", 1)[1]))

