"""The worker process's sandbox pool: its Monty processes, and who holds them.

One `SandboxPool` per worker process (`POOL`), shared by every workflow run and compute activity in it (this module
is passed through Temporal's workflow sandbox). It runs three Monty pools, each created on first checkout (creating
them at import would spawn `monty` processes in every process that imports the workflow module: clients, the replay
command):

- the **live** pool serves programs computing in live workflow tasks. Its `request_timeout` backstop
  (`LIVE_BACKSTOP_SECONDS`) kills a process that computes past it, well before Temporal's 2 s deadlock limit;
  the program then goes on in the compute activity (see `workflow/_sandbox`);
- the **replay** pool serves replayed workflow tasks. It has no backstop: a replayed stretch of compute is one
  the live run finished in workflow code (an over-budget one is recorded and never re-run), so its outcome must
  not depend on how fast the replaying machine is;
- the **compute** pool serves the compute activity (`worker/_compute`): programs past their in-workflow budget,
  bounded by their own in-sandbox limit (`SnippetLimits.max_compute_seconds`).

What it owns, all under one lock: the three pools and the settings they run with; the count of sessions checked out
(`SandboxPool.session`, a context manager, counts them, so no caller keeps the count); the hold budget's places
(`try_hold`); the sessions warmed ahead of a snippet, each by a thread of its own (`prewarm_session`); and the thread
that ends the sessions runs give back (`session` on exit). `shutdown` stops all of it; the next checkout starts it
again.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import pydantic_monty
from pydantic_monty._binary import find_monty_binary

from ..shared._config import LIVE_BACKSTOP_SECONDS
from ..shared._errors import CodeModeUserError
from ..workflow._sandbox_sessions import SessionKind, provide_sandbox_sessions

__all__ = [
    "LIVE_BACKSTOP_SECONDS",
    "POOL",
    "PoolSettings",
    "SandboxPool",
    "check_sandbox_binary",
    "default_compute_processes",
    "default_max_processes",
    "hold_budget",
    "max_sandbox_processes",
    "shutdown_pool",
]



@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    """Sizing of the Monty pool, one per worker process, shared by every code-mode worker in it.

    The rule: **a worker process runs at most `max_processes` workflow tasks at once** (the sum of its code-mode
    workers' `max_concurrent_workflow_tasks`; `create_worker` sets it to `max_processes` unless told otherwise).
    Then a workflow task never waits for a sandbox process:

    - a run holds a process only while its program computes, inside one workflow task: while the program waits
      on tool calls, timers or a person, and between snippets, it is a dump in workflow memory (0.2-0.5 ms a
      dump and load for small state, a few ms per MB);
    - so the pool bounds the workflow tasks computing at once, never the runs in flight: 50 runs with live
      programs on a 4-process pool all complete; they queue for workflow task slots, which Temporal hands out;
    - a program waiting on plain tool calls, or a run waiting on its model between snippets, may keep its
      process instead (`SandboxPool.try_hold`), and a fresh snippet's session may be warmed while its model
      request is in flight (`SandboxPool.prewarm_session`), for up to half as many runs again, in processes
      beyond `max_processes`: a wait then costs no dump and load (and a next snippet no fresh session's first
      type check).

    The default is 4 per usable CPU, from 4 to 32: a workflow task slot is also held while its completion
    travels to the server, so a few per core keep the CPUs busy. Measured on 2 CPUs (`bench/throughput.py`, 50
    runs x 100 nested calls, sequential and gathered, a machine at load 7-12), 4, 8 and 16 processes all ran at
    0.75-1.33x the calls/s of bare activities, with no size ahead in both modes; what grows with the size is
    memory: the pool starts processes only as they are needed and keeps them while it is in use, ~30 MB of RSS
    each once used; once it has been idle for `idle_shutdown_seconds`, they exit.
    """

    max_processes: int = field(default_factory=lambda: default_max_processes())
    """Sandbox processes at most, and so the most workflow tasks the process's code-mode workers run at once.
    At least 2 (Temporal needs two workflow task slots for a worker with a workflow cache). Default:
    `default_max_processes()`."""

    checkout_timeout: float = 1.0
    """Seconds a workflow task waits for a free sandbox process. Under the rule above it never waits for
    another run, only for a process being started; past the timeout the workflow task fails and Temporal retries
    it (`SandboxUnavailableError`), instead of the worker's workflow thread wedging. Kept well under Temporal's
    2 s deadlock limit."""

    idle_shutdown_seconds: float | None = 10.0
    """Seconds the pool may go unused (no program computing, none holding a session, none warming) before its
    processes exit (`None`: never). A used `monty` process keeps ~27-32 MB of RSS, so a worker whose runs all
    wait on people or timers would otherwise keep its whole pool for nothing (9 processes, ~285 MB, next to a
    worker of ~250 MB holding 1,000 paused runs). Runs that are active keep it: each tool result or snippet
    checks a session out, and a run waiting on its model holds one warming for its next snippet. The next
    checkout after a stop starts a process again (a few ms, and the type checker's first check in it, ~15 ms).
    The processes exit `idle_shutdown_seconds` after the last use, to within a second (`stop_idle_sandboxes`);
    before, the worker looked every period and they exited one to two periods after (79 and 111 s of 60)."""

    compute_processes: int = field(default_factory=lambda: default_compute_processes())
    """Sandbox processes for the compute activity (programs past their in-workflow budget), at most: so at most
    this many such programs compute at once in the process; more wait for a free one (heartbeating). Default:
    one per usable CPU, at least 2."""

    def __post_init__(self) -> None:
        if self.max_processes < 2:
            raise CodeModeUserError(
                f"PoolSettings.max_processes must be at least 2, got {self.max_processes}: it also bounds the "
                "worker's workflow task slots, and Temporal needs two for a worker with a workflow cache"
            )
        if not 0 < self.checkout_timeout <= 1.5:
            raise CodeModeUserError(
                f"PoolSettings.checkout_timeout must be in (0, 1.5] seconds, got {self.checkout_timeout}: a "
                "checkout blocks the workflow thread, which Temporal fails after 2 s"
            )
        if self.idle_shutdown_seconds is not None and self.idle_shutdown_seconds <= 0:
            raise CodeModeUserError(
                f"PoolSettings.idle_shutdown_seconds must be positive or None (never), got "
                f"{self.idle_shutdown_seconds}"
            )


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_max_processes() -> int:
    """4 per CPU this process may use, at least 4 and at most 32."""
    return min(32, max(4, 4 * _cpus()))


def default_compute_processes() -> int:
    """One per CPU this process may use, at least 2."""
    return max(2, _cpus())


def hold_budget(settings: PoolSettings) -> int:
    """Sessions the process's programs may hold while they wait on tool calls: half the pool, at least 1."""
    return max(1, settings.max_processes // 2)


def max_sandbox_processes(settings: PoolSettings) -> int:
    """The most `monty` processes a worker process runs with `settings`: its three pools at their caps."""
    return 2 * settings.max_processes + hold_budget(settings) + settings.compute_processes


def check_sandbox_binary() -> str:
    """The `monty` binary the pools will run; raises `CodeModeUserError` if there is none to run.

    Checked when a worker starts: a pool that cannot spawn its processes fails inside workflow tasks, which
    Temporal retries forever, so every run on the worker would wedge at its first snippet instead.
    """
    try:
        path = find_monty_binary()
    except FileNotFoundError as e:
        raise CodeModeUserError(f"this worker cannot run sandboxes: {e}") from e
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise CodeModeUserError(
            f"this worker cannot run sandboxes: the `monty` binary {path!r} is not an executable file (from "
            "MONTY_BIN, or the environment's scripts directory); reinstall pydantic-monty in this environment, or "
            "point MONTY_BIN at the binary")
    return path


PoolKind = SessionKind
"""Which of the three pools (see the module docstring)."""

WARM_UP_PROGRAM = (
    "import asyncio\n"
    "(0 + 0, sum([1]), len('x'), [i for i in range(2)], {'a': 1}.get('a'), ''.join([]), asyncio.gather,\n"
    " _durable_codemode_warm_up_is_never_run())\n"
)
"""What warms a session's type checker: it touches the builtins and `asyncio`, so the checker loads their stubs,
and it calls an undefined name, so the checker rejects it and nothing of it runs or stays (a rejected snippet does
not join the checker's context, and a dump of the session is the same as a cold one's). Kept to what every
program needs: touching more modules (`json`, `re`, `datetime`) doubled the warm-up (`bench/snippet_costs.py`)
and saved ~1 ms of a program's check that uses them, while a fast model's request gives the warm-up ~15 ms."""

WARMING_THREAD = "durable-codemode-warm-session"
"""The name of the threads that warm sessions (`SandboxPool.prewarm_session`)."""

WARM_UP_WAIT_SECONDS = 0.25
"""Seconds a snippet waits for its session's warm-up to finish (~15 ms on these machines; more under load)."""

WARM_SESSION_SECONDS = 60.0
"""Seconds an unclaimed warm session is kept (its run may have been evicted, or is waiting on a slow model)."""

GIVING_BACK_THREAD = "durable-codemode-give-back"
"""The name of the thread that ends the sessions runs give back (`SandboxPool.session`)."""


@dataclass(eq=False)
class _WarmSession:
    options: dict[str, Any]
    started: float
    ready: threading.Event = field(default_factory=threading.Event)  # determinism: ok (decides no workflow step)
    """Set when the warming is done (with a session, or without one)."""
    has_process: bool = False
    """The session got its process: what is left is the warm-up program itself."""
    session: pydantic_monty.MontySession | None = None
    abandoned: bool = False
    """Nobody will claim it: the warming thread closes the session when it is done."""


def _close_quietly(session: pydantic_monty.MontySession) -> None:
    with contextlib.suppress(Exception):  # the process is gone already (or its pool stopped): nothing to give back
        session.__exit__(None, None, None)


class Checkout:
    """A session of one of the pool's Monty pools, counted as checked out from `__enter__` to `__exit__`.

    Made by `SandboxPool.session`; `__enter__` checks the session out (or takes the one warmed for the snippet) and
    returns it, `__exit__` counts it back and ends it. A class, not a generator: a generator's `finally` would also
    run when a forgotten checkout is garbage collected, at any allocation of any thread, maybe under the pool's lock.
    """

    def __init__(self, pool: SandboxPool, kind: PoolKind, options: dict[str, Any], warm_key: str | None) -> None:
        self._pool, self._kind, self._options, self._warm_key = pool, kind, options, warm_key
        self._session: pydantic_monty.MontySession | None = None

    def __enter__(self) -> pydantic_monty.MontySession:
        self._session = self._pool._check_out(self._kind, self._options, self._warm_key)
        return self._session

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        session, self._session = self._session, None
        if session is not None:
            self._pool._check_in(self._kind, session)


class SandboxPool:
    """The process's Monty pools, with everything that holds one of their sessions; one per process: `POOL`.

    Every method may be called from any thread (workflow threads, activity threads, the worker's event loop).
    Nothing here decides a workflow command: which process a program computes in, whether it holds one while it
    waits and whether its session was warmed change only what a wait or a snippet costs, never what it computes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # determinism: ok (guards the process-wide pool; decides no workflow step)
        self._settings = PoolSettings()
        """The settings the next pool starts with (`configure`)."""
        self._running: PoolSettings | None = None
        """The settings the running pools were started with."""
        self._pools: dict[PoolKind, pydantic_monty.Monty] = {}
        """The running pools."""
        self._live = 0
        """Sessions checked out now (`session`)."""
        self._last_used = time.monotonic()  # determinism: ok (when the pool may stop; decides no workflow step)
        """When a pool was last handed out, or a session checked out or in (`idle_for`)."""
        self._held = 0
        """Places of the hold budget taken (`try_hold`)."""
        self._task_slots = 0
        """Workflow task slots of the code-mode workers running in this process (see `PoolSettings`)."""
        self._warming: dict[str, _WarmSession] = {}
        """Sessions warming or warm, not yet claimed, by key (`prewarm_session`)."""
        self._warm_claimed = 0
        self._giver: queue.SimpleQueue[pydantic_monty.MontySession | None] | None = None
        """The queue of the thread that ends given-back sessions, started by the first one (`None` on it stops it)."""
        self._giving_back = 0
        """Sessions given back and not yet ended."""
        self._given_back_all = threading.Condition(self._lock)  # determinism: ok (decides no workflow step)

    # -- settings ------------------------------------------------------------------------------------------------

    def configure(self, settings: PoolSettings) -> PoolSettings:
        """Set the pool's size before its first use; returns the settings in force.

        A pool already running keeps its settings until shut down: then those are returned.
        """
        with self._lock:
            self._settings = settings
            return self._running or settings

    def reserve_task_slots(self, slots: int) -> int:
        """Count a code-mode worker's workflow task slots while it runs (`-slots` when it stops); the process's sum."""
        with self._lock:
            self._task_slots += slots
            return self._task_slots

    # -- sessions ------------------------------------------------------------------------------------------------

    def session(self, options: dict[str, Any], *, kind: PoolKind = "live", warm_key: str | None = None) -> Checkout:
        """A session of the `kind` pool checked out with `options` (`Monty.checkout`'s), for a `with` block.

        The pool is started on first use. While the block runs, the session counts as checked out
        (`live_sessions`, and the pool is not idle); at its end the session is ended: a workflow task's (`live`,
        `replay`) off the workflow thread, by the giving-back thread (ending a session that has type-checked costs
        its process 2-4 ms, which the workflow thread would otherwise wait through at the end of every snippet;
        a checkout meanwhile takes another process, or waits the few ms), a compute activity's in its own thread.
        `warm_key`: take the live session `prewarm_session(warm_key, options)` warmed, if there is one.

        Raises:
            TimeoutError: on entering, no process of the `live` or `replay` pool was free within
                `PoolSettings.checkout_timeout`; nothing is checked out.

        """
        return Checkout(self, kind, options, warm_key)

    def _monty(self, kind: PoolKind) -> pydantic_monty.Monty:
        with self._lock:
            self._last_used = time.monotonic()  # determinism: ok (see `_last_used`)
            pool = self._pools.get(kind)
            if pool is None:
                settings = self._running or self._settings
                if kind == "compute":
                    # Waits for a free process as long as it takes: the compute activity heartbeats meanwhile.
                    pool = pydantic_monty.Monty(min_processes=0, max_processes=settings.compute_processes)
                else:
                    pool = pydantic_monty.Monty(
                        min_processes=1,
                        # The live pool has room for the sessions programs hold while they wait (`try_hold`) on
                        # top of one per workflow task slot, so a held session never makes a workflow task wait.
                        max_processes=settings.max_processes + (hold_budget(settings) if kind == "live" else 0),
                        checkout_timeout=settings.checkout_timeout,
                        request_timeout=LIVE_BACKSTOP_SECONDS if kind == "live" else None,
                    )
                pool.__enter__()
                self._pools[kind], self._running = pool, settings
            return pool

    def _check_out(self, kind: PoolKind, options: dict[str, Any], warm_key: str | None) -> pydantic_monty.MontySession:
        session = None
        if warm_key is not None:
            session = self._claim_warm(warm_key, options, timeout=WARM_UP_WAIT_SECONDS)
        if session is None:
            session = self._monty(kind).checkout(**options)
            session.__enter__()
        with self._lock:
            self._live += 1
            self._last_used = time.monotonic()  # determinism: ok (see `_last_used`)
        return session

    def _check_in(self, kind: PoolKind, session: pydantic_monty.MontySession) -> None:
        with self._lock:
            self._live -= 1
            self._last_used = time.monotonic()  # determinism: ok (see `_last_used`)
        if kind == "compute":
            _close_quietly(session)
        else:
            self._give_back(session)

    def _give_back(self, session: pydantic_monty.MontySession) -> None:
        with self._lock:
            self._giving_back += 1
            if self._giver is None:
                self._giver = queue.SimpleQueue()
                threading.Thread(  # determinism: ok (off the workflow thread; decides nothing recorded)
                    target=self._end_given_back, args=(self._giver,), name=GIVING_BACK_THREAD, daemon=True).start()
            self._giver.put(session)

    def _end_given_back(self, sessions: queue.SimpleQueue[pydantic_monty.MontySession | None]) -> None:
        while (session := sessions.get()) is not None:
            _close_quietly(session)
            with self._lock:
                self._giving_back -= 1
                if not self._giving_back:
                    self._given_back_all.notify_all()

    def wait_given_back(self, timeout: float = 10.0) -> bool:
        """Wait until every session given back has ended; whether they all had within `timeout`."""
        with self._lock:
            return self._given_back_all.wait_for(lambda: not self._giving_back, timeout)

    # -- the hold budget -----------------------------------------------------------------------------------------

    def try_hold(self) -> bool:
        """Take one of the hold budget's places (a program keeps its session while it waits); `False` if none is free.

        Whether a program holds its session or is dumped while it waits changes nothing it computes (a dump loads
        back exactly), only what the wait costs: a dump and a load, ~1 ms for small state but ~0.75 s for a program
        holding 200k rows. So this may depend on the moment; it decides no workflow command.
        """
        with self._lock:
            if self._held >= hold_budget(self._running or self._settings):
                return False
            self._held += 1
            return True

    def release_hold(self) -> None:
        """Give back a place taken by `try_hold`."""
        with self._lock:
            self._held -= 1

    # -- warm sessions -------------------------------------------------------------------------------------------

    def prewarm_session(self, key: str, options: dict[str, Any]) -> bool:
        """Check out a live session with `options` in the background and warm its type checker; `False` if not.

        A session's first type check costs ~15 ms on these machines (the checker loads the builtins' stubs), and
        every snippet that starts a fresh REPL pays it on the workflow thread. A run asks for its next fresh session
        while its model request is in flight, so that cost overlaps the request; `session(options, warm_key=key)`
        takes it. A warm session holds one of the hold budget's places (`try_hold`) until claimed or dropped; none
        is warmed when they are all taken. Whether a session was warmed decides nothing a run records.
        """
        self._drop_stale()
        with self._lock:
            if key in self._warming:
                return True
        if not self.try_hold():
            return False
        entry = _WarmSession(options=dict(options), started=time.monotonic())  # determinism: ok (expiry only)
        with self._lock:
            self._warming[key] = entry
        # The thread decides nothing a run records: a warm session computes as a cold one.
        warm = threading.Thread(target=self._warm, args=(entry,), name=WARMING_THREAD)  # determinism: ok (see above)
        warm.daemon = True
        warm.start()
        return True

    def _warm(self, entry: _WarmSession) -> None:
        # Dropped before it started (the pool is shutting down): it starts no pool again.
        session = None if entry.abandoned else self._warmed(entry)
        with self._lock:  # set and read under the lock, as `_drop` does: one of the two ends a dropped entry
            entry.session = session
            entry.ready.set()
            abandoned = entry.abandoned
        if abandoned:
            self._end(entry)

    def _warmed(self, entry: _WarmSession) -> pydantic_monty.MontySession | None:
        """A session checked out with the entry's options, its checker warmed; `None` if none could be."""
        session: pydantic_monty.MontySession | None = None
        try:
            session = self._monty("live").checkout(**entry.options)
            session.__enter__()
            entry.has_process = True
            session.feed_start(WARM_UP_PROGRAM, print_callback=pydantic_monty.CollectStreams())
        except pydantic_monty.MontyTypingError:
            return session  # rejected, as it must be: the checker is warm and nothing ran
        except Exception:  # no process free in time, a crash: the run checks out a cold session instead
            if session is not None:
                _close_quietly(session)
            return None
        # pragma: no cover - the program calls an undefined name, so the checker always rejects it: here it ran
        _close_quietly(session)
        return None

    def _end(self, entry: _WarmSession) -> None:
        """Close an entry's session, if it has one, and give back its hold place (once its warming is done)."""
        with self._lock:
            session, entry.session = entry.session, None
        if session is not None:
            _close_quietly(session)
        self.release_hold()

    def _drop(self, entry: _WarmSession) -> None:
        with self._lock:
            done = entry.ready.is_set()
            entry.abandoned = not done
        if done:
            self._end(entry)

    def _claim_warm(self, key: str, options: dict[str, Any], *, timeout: float) -> pydantic_monty.MontySession | None:
        """The session `prewarm_session(key, options)` warmed, entered; `None` if there is none (check out cold).

        Waits up to `timeout` for one still running its warm-up, never for one still waiting for a process: then the
        workflow task checks out cold at once, as it would have, and never waits for two checkouts. A session warmed
        with other options (the run's spec changed under it, which a new worker version may do) is closed, never
        handed out.
        """
        with self._lock:
            entry = self._warming.pop(key, None)
        if entry is None:
            return None
        if not entry.has_process or not entry.ready.wait(timeout) or entry.options != options:
            self._drop(entry)
            return None
        with self._lock:
            session, entry.session = entry.session, None
            if session is not None:
                self._warm_claimed += 1
        self.release_hold()
        return session

    def discard_warm_session(self, key: str) -> None:
        """Drop the session warmed for `key`, if any (its run ended, or its next snippet loads a REPL)."""
        with self._lock:
            entry = self._warming.pop(key, None)
        if entry is not None:
            self._drop(entry)

    def _drop_stale(self) -> None:
        now = time.monotonic()  # determinism: ok (expiry of sessions no run claimed)
        with self._lock:
            stale = [k for k, e in self._warming.items() if now - e.started > WARM_SESSION_SECONDS]
            entries = [self._warming.pop(k) for k in stale]
        for entry in entries:
            self._drop(entry)

    # -- what tests and metrics read -----------------------------------------------------------------------------

    def live_sessions(self) -> int:
        """Sessions currently checked out (a run's live REPL each, a compute activity's): for tests and metrics."""
        return self._live

    def held_sessions(self) -> int:
        """Places of the hold budget taken now (held by waiting programs, or warm sessions): for tests and metrics."""
        return self._held

    def warm_sessions(self) -> tuple[int, int]:
        """Sessions warming or warm and not yet claimed, and warm sessions claimed so far: for tests and metrics."""
        with self._lock:
            return len(self._warming), self._warm_claimed

    def running_pools(self) -> int:
        """Pools running in this process (each keeps its processes in use, and one warm): for tests and metrics."""
        return len(self._pools)

    # -- stopping ------------------------------------------------------------------------------------------------

    def idle_for(self) -> float | None:
        """Seconds since the pool was last used, if it runs and nothing holds it; `None` if it is in use or stopped.

        In use: a session checked out (a program computing, a compute activity), held by a program waiting on tool
        calls or warming for a run's next snippet (`try_hold`), or being ended.
        """
        with self._lock:
            if self._live or self._held or self._giving_back or not self._pools:
                return None
            return time.monotonic() - self._last_used  # determinism: ok (see `_last_used`)

    def close_if_idle(self, idle_seconds: float) -> bool:
        """Stop every pool if it has been idle (`idle_for`) for `idle_seconds` at least; whether any was stopped.

        The worker calls this when the pool should have been idle that long (`stop_idle_sandboxes`); the next
        checkout starts the pools again, with the settings in force.
        """
        self._drop_stale()
        with self._lock:
            idle = None if self._live or self._held or self._giving_back or not self._pools else (
                time.monotonic() - self._last_used)  # determinism: ok (see `_last_used`)
            if idle is None or idle < idle_seconds:
                return False
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.__exit__(None, None, None)
        return True

    def shutdown(self) -> None:
        """Stop every sandbox process of every pool, and the giving-back thread; the next checkout starts them again."""
        with self._lock:
            warm = list(self._warming.values())
            self._warming.clear()
        for entry in warm:
            self._drop(entry)
        self.wait_given_back()
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
            self._running = None
            giver, self._giver = self._giver, None
        if giver is not None:
            giver.put(None)  # it ends what is still queued first, if a session outlived the wait
        for pool in pools:
            pool.__exit__(None, None, None)


POOL = SandboxPool()
provide_sandbox_sessions(POOL)  # the run workflows this process hosts use it (`workflow/_sandbox_sessions`)
"""The process's one sandbox pool."""


def shutdown_pool() -> None:
    """Stop the process's sandbox pool (`SandboxPool.shutdown`): at exit, and before a command's `os._exit`."""
    POOL.shutdown()


atexit.register(shutdown_pool)
