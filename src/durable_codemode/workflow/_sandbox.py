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
see `_snippet_driver.SnippetDriver`): a replay reads it and never times anything.

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

import contextlib
from typing import Any

import pydantic_monty
from pydantic_monty import CollectStreams, FunctionSnapshot, FutureSnapshot, MontyCrashedError, MontyError
from temporalio import workflow

from ..shared._config import monty_limits
from ..shared._records import FILE_LISTING_LIMIT
from ..shared._types import AgentSpec
from ._catalog import CatalogIndex
from ._files import RunFilesystem
from ._sandbox_sessions import SandboxSessions
from ._sandbox_types import (
    AwaitingPerson,
    SandboxNotices,
    SandboxUnavailableError,
    SnippetOutcome,
    StartTool,
    is_replaying,
)
from ._snippet_driver import SnippetDriver
from ._stubs import CATALOG_PRELUDE, FILES_PRELUDE, TYPE_CHECK_PRELUDE

__all__ = ["Repl", "close_repls"]


class _NoNotices:
    def printed(self, *, call_id: str, text: str) -> None:
        pass

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None:
        pass


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
        self.spec = spec
        self.sessions = sessions
        """The worker's Monty processes, as workflow code may use them (`_sandbox_sessions`)."""
        self.notices: SandboxNotices = notices or _NoNotices()
        self.files = files
        """The run's files (`RunFiles`), which outlive the REPL (a restart keeps them); `None`: the run has none."""
        self.start_tool = start_tool
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
        """A snippet ran unchecked, so the type checker no longer knows every name (see
        `_type_check.real_type_errors`)."""
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
            "limits": monty_limits(self.spec.limits, replaying=replaying),
            "os_policy": {"datetime": "call_host", "sleep": "call_host", "random_start": {"seed": seed}},
            "type_check": True,
            "type_check_stubs": (TYPE_CHECK_PRELUDE + self.spec.stubs
                                 + (FILES_PRELUDE if self.files is not None else "")
                                 + (CATALOG_PRELUDE if self.spec.catalog else "")),
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
        replaying = is_replaying()
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
        if not is_replaying() and self._idle_state is None and self._session is None:
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
        if self._catalog is None and self.spec.catalog is not None:
            self._catalog = CatalogIndex(self.spec.catalog)
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
        driver = SnippetDriver(self, self._tools, code, run_code_id, snippet=self._snippets)
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
        return not is_replaying()

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
