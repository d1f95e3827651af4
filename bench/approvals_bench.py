"""Approvals: how soon an approved call runs, and what a worker holding many paused runs costs in memory.

`python bench/approvals_bench.py [--reps 5] [--paused 1000] [--cache 1000] [--json rows.json] [--check]` starts a
dev server in memory and, in this process, code-mode workers and floor workers (`bench/approvals_floor.py`), then:

1. latency: runs whose program builds ~1 MB of REPL state (or almost none) and then calls a tool that needs
   approval; once the run is paused, the time from just before `decide(...)` is sent to the moment the tool
   function starts (`time.perf_counter()` inside the tool), on a worker that still caches the run and on one with
   `max_cached_workflows=0` (every workflow task replays the run from its history), against the floor;
2. memory: N runs paused at a gated call on one worker; the process's RSS, the Monty sandbox processes alive and
   held; then every call is approved and every run must complete.

It prints one table. See `bench/README.md` ("Approvals") for what is measured and how.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

import pydantic_monty
from pydantic_ai import Agent
from temporalio.client import Client, WorkflowHandle
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench.approvals_floor import (
    APPROVALS_FLOOR_ACTIVITIES,
    CALL_ID,
    ApprovalsFloorWorkflow,
    FloorApprovalInput,
)
from bench.approvals_floor import STARTS as FLOOR_STARTS
from bench.run_bench import machine, run_and_exit
from durable_codemode import (
    CodeModeAgent,
    PoolSettings,
    create_worker,
    current_call,
    decide,
    pending_approvals,
    start_dev_server,
    start_run,
)
from durable_codemode.client._moving import run_motion
from durable_codemode.testing import RunCode, child_processes, last_result, scripted_model
from durable_codemode.worker._pool import POOL, shutdown_pool
from durable_codemode.worker._worker import workflow_runner

Side = Literal["codemode", "floor"]
Cache = Literal["cached", "evicted"]
State = Literal["1 MB", "tiny", "none"]
T = TypeVar("T")

CM_CACHED_QUEUE = "bench-approvals-cm-cached"
CM_EVICTED_QUEUE = "bench-approvals-cm-evicted"
FLOOR_CACHED_QUEUE = "bench-approvals-floor-cached"
FLOOR_EVICTED_QUEUE = "bench-approvals-floor-evicted"
MEMORY_QUEUE = "bench-approvals-memory"

TARGET_TOTAL_RSS_MB = 300.0
SDK_DEFAULT_CACHE = 1000  # temporalio.worker.Worker(max_cached_workflows=...) default

BIG_CODE = "state = ['x' * 100 for _ in range(10000)]\nr = await gated(tag='big')\n[len(state), r]"
"""~1 MB of REPL state (10,000 strings of 100 characters) when the program pauses at the gated call."""
TINY_CODE = "state = 'x'\nr = await gated(tag='tiny')\n[len(state), r]"
MEMORY_CODE = "r = await gated(tag='mem')\nr"

CODES: dict[str, str] = {"1 MB": BIG_CODE, "tiny": TINY_CODE}
EXPECTED: dict[str, str] = {"1 MB": "[10000, 'done big']", "tiny": "[1, 'done tiny']"}
AGENT_NAMES: dict[str, str] = {"1 MB": "approvals-bench-1mb", "tiny": "approvals-bench-tiny"}
MEMORY_AGENT = "approvals-bench-mem"

STARTS: dict[str, float] = {}
"""`time.perf_counter()` when a code-mode run's gated tool started, by workflow id (first attempt wins)."""

CASES: list[tuple[Side, State, Cache]] = [
    ("codemode", "1 MB", "cached"), ("codemode", "tiny", "cached"), ("floor", "none", "cached"),
    ("codemode", "1 MB", "evicted"), ("codemode", "tiny", "evicted"), ("floor", "none", "evicted"),
]


def make_agent(name: str, code: str) -> CodeModeAgent:
    """An agent whose scripted model runs `code` once, then answers with the program's result."""
    model = scripted_model(RunCode(code), lambda m: repr(last_result(m)["result"]))
    agent = Agent(model, name=name, instructions="Use run_code.")

    @agent.tool_plain(requires_approval=True)
    async def gated(tag: str) -> str:
        """A call a person must approve."""
        STARTS.setdefault(current_call().workflow_id, time.perf_counter())
        return f"done {tag}"

    return CodeModeAgent(agent)


# -- measuring -------------------------------------------------------------------------------------------------


@dataclass
class LatencyRow:
    """One measured decision (`--json` writes these)."""

    side: str
    state: str
    cache: str
    rep: int
    run_id: str
    start_to_paused_s: float
    """`start_workflow` until the pending-approvals query first shows the call."""
    decide_to_tool_start_s: float
    """Just before the decision is sent until the gated tool (activity) function starts."""
    decide_returned_s: float
    """Just before the decision is sent until `decide()` (`execute_update`) returns."""
    decide_to_done_s: float
    """Just before the decision is sent until `handle.result()` returns."""


@dataclass
class MemoryResult:
    """The many-paused-runs phase (`--json` writes this)."""

    paused: int
    worker_settings: dict[str, Any]
    rss_before_mb: float
    rss_paused_mb: float
    hwm_paused_mb: float
    monty_alive: int
    monty_rss_mb: float
    live_sessions: int
    dev_server_rss_mb: float
    start_to_all_paused_s: float
    decide_to_all_done_s: float
    completed: int
    wrong_outputs: list[str]
    rss_after_mb: float
    monty_pss_mb: float = 0.0
    monty_alive_idle: int = 0
    """`monty` processes alive once the pool's idle shutdown (`PoolSettings.idle_shutdown_seconds`) stopped them."""
    monty_rss_idle_mb: float = 0.0
    rss_idle_mb: float = 0.0
    """The worker's RSS then."""
    idle_shutdown_s: float = 0.0
    """From all paused until the pool had stopped its processes."""
    failed_tasks_pausing: str = "0"
    """Temporal SDK warnings while the N runs start and pause (failed workflow tasks, by exception type)."""
    failed_tasks_approving: str = "0"
    """The same while every call is approved and the runs complete."""
    peak_held_pausing: int = 0
    """Peak of `live_sessions()` (sampled every 5 ms) while the runs start and pause."""
    peak_held_approving: int = 0
    """The same while they are approved and complete."""

    @property
    def total_mb(self) -> float:
        """Worker and monty RSS with every run paused, once the idle pool stopped its processes."""
        return self.rss_idle_mb + self.monty_rss_idle_mb

    @property
    def total_at_pause_mb(self) -> float:
        return self.rss_paused_mb + self.monty_rss_mb


def _status_kb(pid: int | str, key: str) -> float:
    """A `kB` line of /proc/<pid>/status (`VmRSS`, `VmHWM`), 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def rss_mb(pid: int | str = "self", key: str = "VmRSS") -> float:
    return _status_kb(pid, key) / 1024


def pss_mb(pid: int) -> float:
    """Proportional set size (shared pages divided among their users), 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return float(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def snapshot_bytes(code: str) -> int:
    """Size of the dump of `code` paused at its gated call, measured with pydantic_monty directly.

    The same kind of dump a paused run keeps in workflow memory (`Repl.park`); no type checking or limits here.
    """
    pool = pydantic_monty.Monty(min_processes=1, max_processes=1, checkout_timeout=1.0)
    pool.__enter__()
    try:
        session = pool.checkout(script_name="snippet.py")
        session.__enter__()
        try:
            snap: Any = session.feed_start(code)
            if not isinstance(snap, pydantic_monty.FunctionSnapshot):
                raise AssertionError(f"expected the gated call, got {snap!r}")
            snap = snap.resume({"future": ...})
            return len(snap.dump())
        finally:
            session.__exit__(None, None, None)
    finally:
        pool.__exit__(None, None, None)


class WarningCounter(logging.Handler):
    """Counts, per phase, the warnings the Temporal SDK logs: chiefly failed workflow tasks ("Failed activation")."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.phase = "setup"
        self.kinds: dict[str, Counter[str]] = {}
        """By phase: how many warnings, by the exception type of the failed activation (else `other`)."""
        self.runs: dict[str, set[str]] = {}
        """By phase: the workflow ids whose workflow task failed at least once."""
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.kinds.setdefault(self.phase, Counter())[type(exc).__name__ if exc else "other"] += 1
        details = getattr(record, "temporal_workflow", None)
        if isinstance(details, dict) and details.get("workflow_id"):
            self.runs.setdefault(self.phase, set()).add(str(details["workflow_id"]))
        if len(self.first) < 3:
            self.first.append(f"[{self.phase}] {record.getMessage()[:200]}: {exc!r}"[:400])

    def summary(self, phase: str) -> str:
        kinds = self.kinds.get(phase)
        if not kinds:
            return "0"
        what = ", ".join(f"{name} x{n}" for name, n in kinds.most_common())
        return f"{sum(kinds.values())} ({what}; {len(self.runs.get(phase, ()))} distinct runs)"


class SessionSampler:
    """Samples `live_sessions()` every few milliseconds; the peak per phase."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.phase = "setup"
        self.peak: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.peak[self.phase] = max(self.peak.get(self.phase, 0), POOL.live_sessions())
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._sample())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def bounded(limit: int, items: Sequence[T], fn: Callable[[T], Awaitable[Any]]) -> list[Any]:
    """`fn` over `items`, at most `limit` at a time, results in order."""
    sem = asyncio.Semaphore(limit)

    async def one(item: T) -> Any:
        async with sem:
            return await fn(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


async def wait_paused(client: Client, run_id: str, poll: Callable[[], Awaitable[int]], *, timeout: float,
                      interval: float) -> None:
    """Until `poll()` (a pending-approvals query) reports a waiting call.

    The run is queried only while the server says nothing is about to move it (`run_motion`): on the evicting
    worker (`max_cached_workflows=0`) a query that lands as an activity completes can make Temporal's core drop the
    run's next workflow task, which then stalls 10 s and fails the queries meanwhile (`durable_codemode.client.
    _moving`; the smoke test failed about one run in ten on it).
    """
    deadline = time.monotonic() + timeout
    while True:
        if not (await run_motion(client, run_id)).moving and await poll() >= 1:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no pending approval after {timeout:.0f} s")
        await asyncio.sleep(interval)


class LatencyBench:
    """Runs one decision per call; the four workers must be running."""

    def __init__(self, client: Client, settle: float) -> None:
        self.client = client
        self.settle = settle

    async def measure(self, side: Side, state: State, cache: Cache, rep: int) -> LatencyRow:
        client = self.client
        run_id = f"bench-appr-{side}-{state.replace(' ', '')}-{cache}-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        handle: WorkflowHandle[Any, Any]
        floor: WorkflowHandle[ApprovalsFloorWorkflow, str] | None = None
        if side == "codemode":
            queue = CM_CACHED_QUEUE if cache == "cached" else CM_EVICTED_QUEUE
            handle = await start_run(client, AGENT_NAMES[state], "go", task_queue=queue, run_id=run_id)

            async def poll() -> int:
                return len(await pending_approvals(client, run_id))
        else:
            queue = FLOOR_CACHED_QUEUE if cache == "cached" else FLOOR_EVICTED_QUEUE
            handle = floor = await client.start_workflow(ApprovalsFloorWorkflow.run, FloorApprovalInput(tag="floor"),
                                                         id=run_id, task_queue=queue)

            async def poll() -> int:
                assert floor is not None
                return len(await floor.query(ApprovalsFloorWorkflow.pending))

        await wait_paused(client, run_id, poll, timeout=60, interval=0.02)
        paused = time.perf_counter() - started
        # Let the workflow task that answered the last query, and anything else in flight, finish.
        await asyncio.sleep(self.settle)
        t0 = time.perf_counter()
        if floor is None:
            await decide(client, run_id, CALL_ID, approved=True)
        else:
            await floor.execute_update(ApprovalsFloorWorkflow.decide, CALL_ID, id=f"decide-{CALL_ID}")
        t1 = time.perf_counter()
        result: Any = await handle.result()
        t2 = time.perf_counter()
        if floor is None:
            if result.output != EXPECTED[state]:
                raise AssertionError(f"{run_id}: output {result.output!r}, want {EXPECTED[state]!r}")
            tool_start = STARTS[run_id]
        else:
            if result != "done floor":
                raise AssertionError(f"{run_id}: got {result!r}")
            tool_start = FLOOR_STARTS[run_id]
        return LatencyRow(side=side, state=state, cache=cache, rep=rep, run_id=run_id, start_to_paused_s=paused,
                          decide_to_tool_start_s=tool_start - t0, decide_returned_s=t1 - t0,
                          decide_to_done_s=t2 - t0)


async def memory_phase(client: Client, args: argparse.Namespace, pool: PoolSettings, warnings: WarningCounter,
                       log: Callable[[str], None]) -> MemoryResult:
    """N paused runs on one worker: RSS, sandboxes alive and held; then approve all and check they complete."""
    n = args.paused
    settings: dict[str, Any] = {
        "max_cached_workflows": args.cache,
        "max_concurrent_workflow_tasks": pool.max_processes,
        "max_concurrent_activities": 100,
        "pool_max_processes": pool.max_processes,
        "pool_checkout_timeout_s": pool.checkout_timeout,
    }
    agent = make_agent(MEMORY_AGENT, MEMORY_CODE)
    worker = create_worker(client, [agent], task_queue=MEMORY_QUEUE, pool=pool,
                           max_cached_workflows=args.cache, max_concurrent_workflow_tasks=pool.max_processes,
                           max_concurrent_activities=100, unsigned_approvals=True)  # decisions as in the floor

    async def start(i: int) -> WorkflowHandle[Any, Any]:
        return await start_run(client, MEMORY_AGENT, "go", task_queue=MEMORY_QUEUE,
                               run_id=f"bench-appr-mem-{i}-{uuid.uuid4().hex[:8]}")

    async def paused(handle: WorkflowHandle[Any, Any]) -> None:
        async def poll() -> int:
            return len(await pending_approvals(client, handle.id))

        await wait_paused(client, handle.id, poll, timeout=args.timeout, interval=0.1)

    async def approve(handle: WorkflowHandle[Any, Any]) -> None:
        await decide(client, handle.id, CALL_ID, approved=True)

    async def finish(handle: WorkflowHandle[Any, Any]) -> str:
        return str((await handle.result()).output)

    async with worker:
        # Warm-up (imports, the sandbox pool, pollers): one run paused, approved and completed.
        warm = await start(-1)
        await paused(warm)
        await approve(warm)
        await finish(warm)
        gc.collect()
        rss_before = rss_mb()
        sampler = SessionSampler()
        sampler.start()
        warnings.phase = sampler.phase = "pausing"
        t0 = time.perf_counter()
        handles = await bounded(50, list(range(n)), start)
        await bounded(32, handles, paused)
        t_paused = time.perf_counter() - t0
        log(f"memory: {n} runs paused in {t_paused:.1f} s")
        rss_paused, hwm = rss_mb(), rss_mb(key="VmHWM")
        monty = child_processes(b"monty")
        monty_rss = sum(rss_mb(p) for p in monty)
        monty_pss = sum(pss_mb(p) for p in monty)
        held = POOL.live_sessions()
        dev_server_rss = sum(rss_mb(p) for p in child_processes(b"temporal"))
        t_idle = time.perf_counter()
        deadline = t_idle + 3 * (pool.idle_shutdown_seconds or 0) + 30
        while (POOL.running_pools() or child_processes(b"monty")) and time.perf_counter() < deadline:
            await asyncio.sleep(0.1)  # the paused runs use no sandbox: the pool's idle shutdown stops it
        idle_s = time.perf_counter() - t_idle
        monty_idle = child_processes(b"monty")
        monty_rss_idle, rss_idle = sum(rss_mb(p) for p in monty_idle), rss_mb()
        log(f"memory: pool idle after {idle_s:.1f} s, {len(monty_idle)} monty processes left")
        warnings.phase = sampler.phase = "approving"
        t1 = time.perf_counter()
        await bounded(50, handles, approve)
        outputs = await bounded(100, handles, finish)
        t_done = time.perf_counter() - t1
        log(f"memory: {n} runs approved and completed in {t_done:.1f} s")
        warnings.phase = "latency"
        await sampler.stop()
    wrong = [o for o in outputs if o != "'done mem'"]
    return MemoryResult(
        paused=n, worker_settings=settings, rss_before_mb=rss_before, rss_paused_mb=rss_paused, hwm_paused_mb=hwm,
        monty_alive=len(monty), monty_rss_mb=monty_rss, live_sessions=held, dev_server_rss_mb=dev_server_rss,
        start_to_all_paused_s=t_paused, decide_to_all_done_s=t_done, completed=len(outputs) - len(wrong),
        wrong_outputs=wrong[:5], rss_after_mb=rss_mb(), monty_pss_mb=monty_pss, monty_alive_idle=len(monty_idle),
        monty_rss_idle_mb=monty_rss_idle, rss_idle_mb=rss_idle, idle_shutdown_s=idle_s,
        failed_tasks_pausing=warnings.summary("pausing"), failed_tasks_approving=warnings.summary("approving"),
        peak_held_pausing=sampler.peak.get("pausing", 0), peak_held_approving=sampler.peak.get("approving", 0),
    )


# -- the table -------------------------------------------------------------------------------------------------


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _values(rows: Sequence[LatencyRow], side: str, state: str, cache: str, attr: str) -> dict[int, float]:
    return {r.rep: float(getattr(r, attr)) for r in rows if (r.side, r.state, r.cache) == (side, state, cache)}


def table(rows: Sequence[LatencyRow], mem: MemoryResult, reps: int, sizes: dict[str, int],
          latency_warnings: str) -> tuple[str, list[bool]]:
    """The one table, and the target verdicts."""
    header = ["measure", "code mode", "floor", "cm/floor", "target"]
    lines: list[list[str]] = []
    verdicts: list[bool] = []
    for attr, what in (("decide_to_tool_start_s", "decision → tool starts"),
                       ("decide_to_done_s", "decision → run completed")):
        for cache in ("cached", "evicted"):
            floor = _values(rows, "floor", "none", cache, attr)
            for state in ("1 MB", "tiny"):
                cm = _values(rows, "codemode", state, cache, attr)
                ratio = statistics.median(cm[rep] / floor[rep] for rep in cm)
                lines.append([f"{what}, {state} REPL, {cache}", fmt_s(statistics.median(cm.values())),
                              fmt_s(statistics.median(floor.values())), f"{ratio:.2f}x", "—"])
    n = mem.paused
    held_ok = mem.live_sessions == 0
    total_ok = mem.total_mb < TARGET_TOTAL_RSS_MB
    done_ok = mem.completed == n
    verdicts += [total_ok, held_ok, done_ok]
    per_run_kb = (mem.rss_paused_mb - mem.rss_before_mb) * 1024 / n
    lines += [
        [f"worker RSS before the {n} runs", f"{mem.rss_before_mb:.0f} MB", "—", "—", "—"],
        [f"worker RSS, {n} runs paused", f"{mem.rss_paused_mb:.0f} MB (+{mem.rss_paused_mb - mem.rss_before_mb:.0f}"
         f" MB, {per_run_kb:.0f} kB/run)", "—", "—", "—"],
        ["monty processes alive (children)",
         f"{mem.monty_alive} ({mem.monty_rss_mb:.0f} MB RSS, {mem.monty_pss_mb:.0f} MB PSS)", "—", "—", "—"],
        ["total RSS (worker + monty), all just paused", f"{mem.total_at_pause_mb:.0f} MB", "—", "—", "—"],
        [f"monty processes alive, pool idle {mem.idle_shutdown_s:.0f} s later",
         f"{mem.monty_alive_idle} ({mem.monty_rss_idle_mb:.0f} MB RSS)", "—", "—", "—"],
        ["total RSS (worker + monty), pool idle", f"{mem.total_mb:.0f} MB", "—", "—",
         f"< {TARGET_TOTAL_RSS_MB:.0f} MB {verdict(total_ok)}"],
        [f"sandbox sessions held, {n} paused (live_sessions)", f"{mem.live_sessions}", "—", "—",
         f"= 0 {verdict(held_ok)}"],
        ["peak sessions held: pausing / approving", f"{mem.peak_held_pausing} / {mem.peak_held_approving}", "—", "—",
         "—"],
        [f"start {n} runs → all paused", fmt_s(mem.start_to_all_paused_s), "—", "—", "—"],
        [f"approve {n} → all completed", f"{fmt_s(mem.decide_to_all_done_s)} ({mem.completed}/{n} ok)", "—", "—",
         f"all complete {verdict(done_ok)}"],
    ]
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def render(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [render(header), "-+-".join("-" * w for w in widths)]
    out += [render(line) for line in lines]
    failed = len(verdicts) - sum(verdicts)
    out.append(f"targets: {sum(verdicts)}/{len(verdicts)} PASS" + (f", {failed} FAIL" if failed else ""))
    s = mem.worker_settings
    out += [
        f"latency: medians of {reps} repetition(s); cm/floor = median of the per-repetition ratios; tool start = "
        "perf_counter() inside the tool (same process); evicted = a worker with max_cached_workflows=0, so every "
        "workflow task replays the run from its history (floor likewise); REPL state dumped at the pause: "
        f"1 MB program {sizes['1 MB']:,} B, tiny {sizes['tiny']:,} B",
        f"memory: worker max_cached_workflows={s['max_cached_workflows']}, max_concurrent_workflow_tasks="
        f"{s['max_concurrent_workflow_tasks']}, max_concurrent_activities={s['max_concurrent_activities']}, Monty "
        f"pool max_processes={s['pool_max_processes']} checkout_timeout={s['pool_checkout_timeout_s']:g} s; "
        f"peak RSS (VmHWM) {mem.hwm_paused_mb:.0f} MB, RSS after all completed {mem.rss_after_mb:.0f} MB; dev "
        f"server RSS {mem.dev_server_rss_mb:.0f} MB (not counted)",
        f"failed workflow tasks (SDK warnings) while the {n} runs started and paused: {mem.failed_tasks_pausing}; "
        f"while they were approved and completed: {mem.failed_tasks_approving}; during the latency runs: "
        f"{latency_warnings}",
    ]
    return "\n".join(out), verdicts


# -- running ---------------------------------------------------------------------------------------------------


async def start_server(verbose: bool) -> WorkflowEnvironment:
    """The dev server, its banner kept off stdout (which carries only the machine line and the table)."""
    return await start_dev_server(banner="stderr" if verbose else "off")


def quiet_sdk_core() -> None:
    """Keep the SDK core's log to errors: it writes every failed workflow task to stderr, a page each."""
    Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="ERROR", other_level="ERROR")))), error_if_already_set=False)


async def run(args: argparse.Namespace) -> int:
    def log(text: str) -> None:
        if args.verbose:
            print(text, file=sys.stderr, flush=True)

    if not args.verbose:
        quiet_sdk_core()  # the failed workflow tasks are counted below
    machine_text = machine()
    print(machine_text, flush=True)
    pool = PoolSettings(max_processes=args.pool, idle_shutdown_seconds=args.idle_shutdown)
    warnings = WarningCounter()
    logging.getLogger("temporalio").addHandler(warnings)
    sizes = {state: snapshot_bytes(code) for state, code in CODES.items()}
    env = await start_server(args.verbose)
    try:
        client = env.client
        # Memory first, in a process that has done little yet, so the RSS is close to a fresh worker's.
        mem = await memory_phase(client, args, pool, warnings, log)
        agents = [make_agent(AGENT_NAMES[s], CODES[s]) for s in ("1 MB", "tiny")]
        # Two code-mode workers share the process's pool: half its processes' worth of workflow task slots each.
        slots = max(2, pool.max_processes // 2)
        workers = [
            create_worker(client, agents, task_queue=CM_CACHED_QUEUE, pool=pool, max_concurrent_workflow_tasks=slots,
                          unsigned_approvals=True),
            create_worker(client, agents, task_queue=CM_EVICTED_QUEUE, pool=pool, max_cached_workflows=0,
                          max_concurrent_workflow_tasks=slots, unsigned_approvals=True),
            Worker(client, task_queue=FLOOR_CACHED_QUEUE, workflows=[ApprovalsFloorWorkflow],
                   activities=APPROVALS_FLOOR_ACTIVITIES, workflow_runner=workflow_runner()),
            Worker(client, task_queue=FLOOR_EVICTED_QUEUE, workflows=[ApprovalsFloorWorkflow],
                   activities=APPROVALS_FLOOR_ACTIVITIES, max_cached_workflows=0, workflow_runner=workflow_runner()),
        ]
        rows: list[LatencyRow] = []
        async with workers[0], workers[1], workers[2], workers[3]:
            bench = LatencyBench(client, settle=args.settle)
            for side, state, cache in CASES:  # warm-up, unmeasured
                row = await bench.measure(side, state, cache, -1)
                log(f"warm-up {side} {state} {cache}: {row.decide_to_tool_start_s * 1000:.1f} ms")
            for rep in range(args.reps):
                for side, state, cache in (CASES if rep % 2 == 0 else CASES[::-1]):
                    row = await bench.measure(side, state, cache, rep)
                    rows.append(row)
                    log(f"rep {rep} {side} {state} {cache}: decision → tool {row.decide_to_tool_start_s * 1000:.1f}"
                        f" ms, decide() {row.decide_returned_s * 1000:.1f} ms, → done "
                        f"{row.decide_to_done_s * 1000:.1f} ms (paused after {row.start_to_paused_s:.2f} s)")
    finally:
        await env.shutdown()
        shutdown_pool()
    for line in warnings.first:
        log(f"first SDK warnings: {line}")
    text, verdicts = table(rows, mem, args.reps, sizes, warnings.summary("latency"))
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine_text, "reps": args.reps, "paused": args.paused, "snapshot_bytes": sizes,
            "pool_max_processes": args.pool, "latency_rows": [asdict(r) for r in rows], "memory": asdict(mem),
        }, indent=1))
    return 1 if args.check and not all(verdicts) else 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=5, help="measured decisions per latency case (median)")
    parser.add_argument("--paused", type=int, default=1000, help="runs paused at once in the memory phase")
    parser.add_argument("--cache", type=int, default=SDK_DEFAULT_CACHE,
                        help="max_cached_workflows of the memory-phase worker (default: the SDK's, 1000)")
    parser.add_argument("--pool", type=int, default=PoolSettings().max_processes,
                        help="PoolSettings.max_processes of the process's Monty pool (default: PoolSettings's, 4 "
                        "per usable CPU)")
    parser.add_argument("--idle-shutdown", type=float, default=5.0, metavar="S",
                        help="PoolSettings.idle_shutdown_seconds (default 5; the library's default is 60)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="seconds to wait after a run is seen paused before deciding (default 0.2)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a memory-phase run may take to pause (default 600)")
    parser.add_argument("--json", metavar="FILE", help="write the raw rows (every decision) as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every run to stderr")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.paused < 1 or args.pool < 1 or args.cache < 0:
        parser.error("--reps, --paused and --pool must be at least 1, --cache at least 0")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
