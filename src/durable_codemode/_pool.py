"""The worker process's pools of Monty sandbox processes.

Three pools per worker process, each created on first use (creating them at import would spawn `monty`
processes in every process that imports the workflow module: clients, the replay command):

- the **live** pool serves programs computing in live workflow tasks. Its `request_timeout` backstop
  (`LIVE_BACKSTOP_SECONDS`) kills a process that computes past it, well before Temporal's 2 s deadlock limit;
  the program then goes on in the compute activity (see `workflow/_sandbox`);
- the **replay** pool serves replayed workflow tasks. It has no backstop: a replayed stretch of compute is one
  the live run finished in workflow code (an over-budget one is recorded and never re-run), so its outcome must
  not depend on how fast the replaying machine is;
- the **compute** pool serves the compute activity (`worker/_compute`): programs past their in-workflow budget,
  bounded by their own in-sandbox limit (`SnippetLimits.max_compute_seconds`).

This module is passed through Temporal's workflow sandbox, so every workflow run in the process shares them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pydantic_monty
from pydantic_monty._binary import find_monty_binary

from ._errors import CodeModeUserError

__all__ = [
    "LIVE_BACKSTOP_SECONDS",
    "PoolSettings",
    "check_sandbox_binary",
    "claim_warm_session",
    "configure_pool",
    "default_max_processes",
    "discard_warm_session",
    "get_compute_pool",
    "get_pool",
    "give_back",
    "held_sessions",
    "hold_budget",
    "live_sessions",
    "max_sandbox_processes",
    "prewarm_session",
    "release_hold",
    "reserve_task_slots",
    "shutdown_pool",
    "try_hold",
    "wait_given_back",
    "warm_sessions",
]

LIVE_BACKSTOP_SECONDS = 1.2
"""Seconds one request to a live workflow task's sandbox (a stretch of compute, a load, a dump) may take before
its process is killed: under Temporal's 2 s deadlock limit with room for the rest of the task. A program past it
is not lost: it goes on in the compute activity."""


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
      process instead (`try_hold`), and a fresh snippet's session may be warmed while its model request is in
      flight (`prewarm_session`), for up to half as many runs again, in processes beyond `max_processes`: a
      wait then costs no dump and load (and a next snippet no fresh session's first type check).

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

    idle_shutdown_seconds: float | None = 60.0
    """Seconds without any sandbox session checked out after which the pool's processes exit (`None`: never).
    An idle `monty` process keeps ~27 MB of RSS, so a worker whose runs all wait (on people, timers, models)
    would otherwise keep its whole pool for nothing; the next checkout starts a process again (a few ms, and
    the type checker's first check in it). A worker checks every `idle_shutdown_seconds`, so the processes exit
    between one and two such periods after the last session was returned."""

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


_lock = threading.Lock()  # determinism: ok (guards the process-wide pool; decides no workflow step)
_settings = PoolSettings()
_pools: dict[str, pydantic_monty.Monty] = {}
"""The running pools: `live`, `replay`, `compute`."""
_running: PoolSettings | None = None
"""The settings the running pool was started with."""
_live = 0
_uses = 0
"""Pools handed out and sessions checked out so far: unchanged between two looks means nothing used the pool."""
_held = 0
"""Sessions held by programs waiting on tool calls (see `try_hold`)."""
_task_slots = 0
"""Workflow task slots of the code-mode workers running in this process (see `PoolSettings`)."""


def configure_pool(settings: PoolSettings) -> PoolSettings:
    """Set the pool's size before its first use; returns the settings in force.

    A pool already running keeps its settings until shut down: then those are returned.
    """
    global _settings
    with _lock:
        _settings = settings
        return _running or settings


def reserve_task_slots(slots: int) -> int:
    """Count a code-mode worker's workflow task slots while it runs (`-slots` when it stops); the process's sum."""
    global _task_slots
    with _lock:
        _task_slots += slots
        return _task_slots


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


def _get(kind: str) -> pydantic_monty.Monty:
    global _running, _uses
    with _lock:
        _uses += 1
        pool = _pools.get(kind)
        if pool is None:
            settings = _running or _settings
            if kind == "compute":
                # Waits for a free process as long as it takes: the compute activity heartbeats meanwhile.
                pool = pydantic_monty.Monty(min_processes=0, max_processes=settings.compute_processes)
            else:
                pool = pydantic_monty.Monty(
                    min_processes=1,
                    # The live pool has room for the sessions programs hold while they wait (`try_hold`) on top
                    # of one per workflow task slot, so a held session never makes a workflow task wait.
                    max_processes=settings.max_processes + (hold_budget(settings) if kind == "live" else 0),
                    checkout_timeout=settings.checkout_timeout,
                    request_timeout=LIVE_BACKSTOP_SECONDS if kind == "live" else None,
                )
            pool.__enter__()
            _pools[kind], _running = pool, settings
        return pool


def get_pool(*, replaying: bool = False) -> pydantic_monty.Monty:
    """The pool for workflow tasks (the `replay` pool when `replaying`), started on first call."""
    return _get("replay" if replaying else "live")


def get_compute_pool() -> pydantic_monty.Monty:
    """The pool of the compute activity, started on first call."""
    return _get("compute")


def hold_budget(settings: PoolSettings) -> int:
    """Sessions the process's programs may hold while they wait on tool calls: half the pool, at least 1."""
    return max(1, settings.max_processes // 2)


def max_sandbox_processes(settings: PoolSettings) -> int:
    """The most `monty` processes a worker process runs with `settings`: its three pools at their caps."""
    return 2 * settings.max_processes + hold_budget(settings) + settings.compute_processes


def try_hold() -> bool:
    """Take one of the hold budget's places (a program keeps its session while it waits); `False` if none is free.

    Whether a program holds its session or is dumped while it waits changes nothing it computes (a dump loads
    back exactly), only what the wait costs: a dump and a load, ~1 ms for small state but ~0.75 s for a program
    holding 200k rows. So this may depend on the moment; it decides no workflow command.
    """
    global _held
    with _lock:
        if _held >= hold_budget(_running or _settings):
            return False
        _held += 1
        return True


def release_hold() -> None:
    """Give back a place taken by `try_hold`."""
    global _held
    with _lock:
        _held -= 1


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
"""The name of the threads that warm sessions (`prewarm_session`)."""

WARM_UP_WAIT_SECONDS = 0.25
"""Seconds a snippet waits for its session's warm-up to finish (~15 ms on these machines; more under load)."""

WARM_SESSION_SECONDS = 60.0
"""Seconds an unclaimed warm session is kept (its run may have been evicted, or is waiting on a slow model)."""


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


_warming: dict[str, _WarmSession] = {}
_warm_claimed = 0


def prewarm_session(key: str, options: dict[str, Any]) -> bool:
    """Check out a live session with `options` in the background and warm its type checker; `False` if not.

    A session's first type check costs ~15 ms on these machines (the checker loads the builtins' stubs), and
    every snippet that starts a fresh REPL pays it on the workflow thread. A run asks for its next fresh session
    while its model request is in flight, so that cost overlaps the request; `claim_warm_session(key, options)`
    takes it. A warm session holds one of the hold budget's places (`try_hold`) until claimed or dropped; none
    is warmed when they are all taken. Whether a session was warmed decides nothing a run records.
    """
    _drop_stale()
    with _lock:
        if key in _warming:
            return True
    if not try_hold():
        return False
    entry = _WarmSession(options=dict(options), started=time.monotonic())  # determinism: ok (expiry only)
    with _lock:
        _warming[key] = entry
    # The thread decides nothing a run records: a warm session computes as a cold one.
    warm = threading.Thread(target=_warm, args=(entry,), name=WARMING_THREAD)  # determinism: ok (see above)
    warm.daemon = True
    warm.start()
    return True


def _warm(entry: _WarmSession) -> None:
    # Dropped before it started (the pool is shutting down): it starts no pool again.
    session = None if entry.abandoned else _warmed(entry)
    with _lock:  # set and read under the lock, as `_drop` does: one of the two ends a dropped entry
        entry.session = session
        entry.ready.set()
        abandoned = entry.abandoned
    if abandoned:
        _end(entry)


def _warmed(entry: _WarmSession) -> pydantic_monty.MontySession | None:
    """A session checked out with the entry's options, its checker warmed; `None` if none could be."""
    session: pydantic_monty.MontySession | None = None
    try:
        session = get_pool().checkout(**entry.options)
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


def _close_quietly(session: pydantic_monty.MontySession) -> None:
    with contextlib.suppress(Exception):  # the process is gone already (or its pool stopped): nothing to give back
        session.__exit__(None, None, None)


def _end(entry: _WarmSession) -> None:
    """Close an entry's session, if it has one, and give back its hold place (once its warming is done)."""
    with _lock:
        session, entry.session = entry.session, None
    if session is not None:
        _close_quietly(session)
    release_hold()


def _drop(entry: _WarmSession) -> None:
    with _lock:
        done = entry.ready.is_set()
        entry.abandoned = not done
    if done:
        _end(entry)


def claim_warm_session(key: str, options: dict[str, Any], *, timeout: float) -> pydantic_monty.MontySession | None:
    """The session `prewarm_session(key, options)` warmed, entered; `None` if there is none (check out cold).

    Waits up to `timeout` for one still running its warm-up, never for one still waiting for a process: then the
    workflow task checks out cold at once, as it would have, and never waits for two checkouts. A session warmed
    with other options (the run's spec changed under it, which a new worker version may do) is closed, never
    handed out.
    """
    global _warm_claimed
    with _lock:
        entry = _warming.pop(key, None)
    if entry is None:
        return None
    if not entry.has_process or not entry.ready.wait(timeout) or entry.options != options:
        _drop(entry)
        return None
    with _lock:
        session, entry.session = entry.session, None
        if session is not None:
            _warm_claimed += 1
    release_hold()
    return session


def discard_warm_session(key: str) -> None:
    """Drop the session warmed for `key`, if any (its run ended, or its next snippet loads a REPL)."""
    with _lock:
        entry = _warming.pop(key, None)
    if entry is not None:
        _drop(entry)


def _drop_stale() -> None:
    now = time.monotonic()  # determinism: ok (expiry of sessions no run claimed)
    with _lock:
        stale = [k for k, e in _warming.items() if now - e.started > WARM_SESSION_SECONDS]
        entries = [_warming.pop(k) for k in stale]
    for entry in entries:
        _drop(entry)


def warm_sessions() -> tuple[int, int]:
    """Sessions warming or warm and not yet claimed, and warm sessions claimed so far: for tests and metrics."""
    with _lock:
        return len(_warming), _warm_claimed


def held_sessions() -> int:
    """Places of the hold budget taken now (held by waiting programs, or warm sessions): for tests and metrics."""
    return _held


GIVING_BACK_THREAD = "durable-codemode-give-back"
"""The name of the thread that ends the sessions runs give back (`give_back`)."""

_given_back: queue.SimpleQueue[pydantic_monty.MontySession] = queue.SimpleQueue()
_giving_back = 0
"""Sessions given back and not yet ended."""
_given_back_all = threading.Condition(_lock)  # determinism: ok (decides no workflow step)
_giver: threading.Thread | None = None  # determinism: ok (see `give_back`)


def give_back(session: pydantic_monty.MontySession) -> None:
    """End a run's session off the workflow thread: its process goes back to the pool when that is done.

    Ending a session that has type-checked costs its process 2-4 ms on these machines (the checker's state is
    dropped), which the workflow thread would otherwise wait through at the end of every snippet. Nothing a run
    records depends on when it ends; a checkout meanwhile takes another process, or waits the few ms.
    """
    global _giving_back, _giver
    with _lock:
        _giving_back += 1
        if _giver is None:
            _giver = threading.Thread(  # determinism: ok (off the workflow thread; decides nothing recorded)
                target=_end_given_back, name=GIVING_BACK_THREAD, daemon=True)
            _giver.start()
    _given_back.put(session)


def _end_given_back() -> None:
    global _giving_back
    while True:
        session = _given_back.get()
        _close_quietly(session)
        with _lock:
            _giving_back -= 1
            if not _giving_back:
                _given_back_all.notify_all()


def wait_given_back(timeout: float = 10.0) -> bool:
    """Wait until every session given back has ended (`give_back`); whether they all had within `timeout`."""
    with _lock:
        return _given_back_all.wait_for(lambda: not _giving_back, timeout)


def live_sessions() -> int:
    """Sessions currently checked out of the pool (a run's live REPL each): for tests and metrics."""
    return _live


def note_checkout(delta: int) -> None:
    """Count a session checked out (+1) or returned (-1)."""
    global _live, _uses
    with _lock:
        _live += delta
        _uses += 1


def pool_uses() -> int:
    """A count that changes whenever the pool is used (see `close_if_idle`)."""
    return _uses


def running_pools() -> int:
    """Pools running in this process (each keeps its processes in use, and one warm): for tests and metrics."""
    return len(_pools)


def close_if_idle(uses_then: int) -> bool:
    """Stop every pool if no session is checked out and nothing used the pool since `pool_uses()` was `uses_then`.

    The worker calls this periodically (`PoolSettings.idle_shutdown_seconds`); the next `get_pool()` starts the
    pools again, with the settings in force. Returns whether any pool was stopped.
    """
    _drop_stale()
    with _lock:
        if _uses != uses_then or _live or _held or _giving_back or not _pools:
            return False
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.__exit__(None, None, None)
    return True


def shutdown_pool() -> None:
    """Stop every sandbox process of every pool; the next `get_pool()` starts new pools."""
    global _running
    with _lock:
        warm = list(_warming.values())
        _warming.clear()
    for entry in warm:
        _drop(entry)
    wait_given_back()
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
        _running = None
    for pool in pools:
        pool.__exit__(None, None, None)


atexit.register(shutdown_pool)
