"""Throughput of one worker: many concurrent runs, each a program making nested calls, against the floor.

`python bench/throughput.py [--runs 50] [--calls 100] [--pool 4] [--mode sequential gather] [--json rows.json]`
starts a dev server in memory, one code-mode worker and one floor worker in this process, and for each mode starts
`--runs` runs at once on one side, waits for all of them, then does the same on the other side (the order flips
per repetition). A code-mode run is one `run_code` program of `--calls` nested calls (one after another, or one
`asyncio.gather`) and a final answer; the floor is `bench.floor`'s bare workflow making the same activity calls.
It prints one table: runs/s, nested calls/s, the worker's RSS (this process plus its `monty` children, sampled
from /proc) and the workflow tasks that failed, code mode against the floor as ratios, plus the load average.
See `bench/README.md` ("Throughput") for what is measured and how.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from bench.approvals_bench import WarningCounter, quiet_sdk_core, rss_mb, start_server
from bench.floor import FLOOR_ACTIVITIES, FloorInput, FloorWorkflow
from bench.run_bench import Kind, fmt_s, machine, make_agent, run_and_exit
from durable_codemode import PoolSettings, create_worker, start_run
from durable_codemode.testing import child_processes, replay
from durable_codemode.worker._pool import POOL, shutdown_pool
from durable_codemode.worker._worker import workflow_runner

CM_QUEUE = "bench-throughput-codemode"
FLOOR_QUEUE = "bench-throughput-floor"
START_CONCURRENCY = 50
"""Runs started at a time (the client's own concurrency, not the worker's)."""
REPLAYED = 3
"""Code-mode runs per batch replayed with Temporal's `Replayer` afterwards (each must replay cleanly)."""


@dataclass
class Batch:
    """One side's batch of concurrent runs (`--json` writes these)."""

    side: str
    mode: str
    rep: int
    runs: int
    calls: int
    wall_s: float
    correct: int
    failed_tasks: int
    """`WorkflowTaskFailed` events across the batch's histories."""
    timed_out_tasks: int
    """`WorkflowTaskTimedOut` events across the batch's histories."""
    rss_mb: float
    """Peak of this process's RSS while the batch ran."""
    monty_rss_mb: float
    """Peak of the summed RSS of this process's `monty` children while the batch ran."""
    monty_processes: int
    peak_sessions: int
    """Peak of `live_sessions()`: sandbox sessions checked out at once."""
    load_avg: list[float] = field(default_factory=list)
    """1, 5 and 15 minute load averages when the batch ended."""
    replayed: int = 0
    cpu_ms_per_run: dict[str, float] = field(default_factory=dict)
    """CPU time per run over the batch, by process: `bench` (this one: both workers, the client, the benchmark),
    `server` (the dev server) and `monty` (this process's sandbox processes; one that exited meanwhile is missed)."""

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.wall_s

    @property
    def calls_per_s(self) -> float:
        return self.runs * self.calls / self.wall_s


class Sampler:
    """Peaks of RSS (this process, its monty children) and of sessions held, sampled while a batch runs."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.rss = self.monty_rss = 0.0
        self.monty = self.sessions = 0
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            monty = child_processes(b"monty")
            self.rss = max(self.rss, rss_mb())
            self.monty_rss = max(self.monty_rss, sum(rss_mb(p) for p in monty))
            self.monty = max(self.monty, len(monty))
            self.sessions = max(self.sessions, POOL.live_sessions())
            await asyncio.sleep(self.interval)

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (0 once it has exited), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)", which may hold spaces
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


class CpuMeter:
    """CPU time used during a batch by this process, the dev server and the sandbox processes."""

    def __init__(self) -> None:
        self._server = child_processes(b"start-dev")
        self._bench, self._server_s = self._own(), sum(cpu_s(p) for p in self._server)
        self._monty = {p: cpu_s(p) for p in child_processes(b"monty")}

    @staticmethod
    def _own() -> float:
        me = os.times()
        return me.user + me.system

    def per_run(self, runs: int) -> dict[str, float]:
        """CPU ms per run since this meter started, by process kind.

        A sandbox process started during the batch counts from 0; one that exited before the end is missed (the
        pool keeps its processes, so this is rare).
        """
        monty = 0.0
        for pid in {*self._monty, *child_processes(b"monty")}:
            now = cpu_s(pid)
            if now > 0:
                monty += now - self._monty.get(pid, 0.0)
        used = {"bench": self._own() - self._bench, "server": sum(cpu_s(p) for p in self._server) - self._server_s,
                "monty": monty}
        return {k: round(v * 1000 / runs, 1) for k, v in used.items()}


async def task_trouble(handle: WorkflowHandle[Any, Any]) -> tuple[int, int]:
    """Workflow tasks of the run that failed, and that timed out (a sticky queue's schedule-to-start included)."""
    history = await handle.fetch_history()
    kinds = [e.event_type for e in history.events]
    for e in history.events:  # say why, on stderr: a count alone cannot be acted on
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            a = e.workflow_task_failed_event_attributes
            print(f"{handle.id}: workflow task failed ({WorkflowTaskFailedCause.Name(a.cause)}): "
                  f"{a.failure.message[:200]}", file=sys.stderr, flush=True)
    return (kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED),
            kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT))


async def gather_bounded(limit: int, coros: Sequence[Any]) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(coro: Any) -> Any:
        async with sem:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


async def batch(client: Client, side: str, mode: Kind, rep: int, args: argparse.Namespace) -> Batch:
    """Start `args.runs` runs of one side at once, wait for every result; check, count and sample."""
    n, calls = args.runs, args.calls
    expected = sum(range(calls))
    tag = uuid.uuid4().hex[:8]

    assert mode != "batched", "the throughput bench runs sequential and gathered programs only (--mode)"

    async def start(i: int) -> WorkflowHandle[Any, Any]:
        if side == "codemode":
            return await start_run(client, f"bench-{mode}-{calls}", "go", task_queue=CM_QUEUE,
                                   run_id=f"bench-tp-cm-{mode}-{tag}-{i}")
        return await client.start_workflow(FloorWorkflow.run, FloorInput(n=calls, mode=mode),
                                           id=f"bench-tp-floor-{mode}-{tag}-{i}", task_queue=FLOOR_QUEUE)

    def correct(result: Any) -> bool:
        if side == "codemode":
            return bool(result.output == str(expected) and len(result.nested_calls) == calls)
        return bool(result == expected)

    async with Sampler() as sampler:
        cpu = CpuMeter()
        t0 = time.perf_counter()
        handles = await gather_bounded(START_CONCURRENCY, [start(i) for i in range(n)])
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), args.timeout)
        wall = time.perf_counter() - t0
        cpu_per_run = cpu.per_run(n)
    trouble = await gather_bounded(20, [task_trouble(h) for h in handles])
    replayed = 0
    if side == "codemode":
        for handle in handles[:REPLAYED]:
            await replay(handle)  # raises on any divergence
            replayed += 1
    return Batch(side=side, mode=mode, rep=rep, runs=n, calls=calls, wall_s=wall,
                 correct=sum(correct(r) for r in results), failed_tasks=sum(f for f, _ in trouble),
                 timed_out_tasks=sum(t for _, t in trouble), rss_mb=sampler.rss,
                 monty_rss_mb=sampler.monty_rss, monty_processes=sampler.monty, peak_sessions=sampler.sessions,
                 load_avg=[round(x, 2) for x in os.getloadavg()], replayed=replayed, cpu_ms_per_run=cpu_per_run)


def _cpu_total(batch: Batch) -> float:
    return sum(batch.cpu_ms_per_run.values()) or float("nan")


def cpu_cell(batches: Sequence[Batch], parts: Sequence[str]) -> str:
    """Median CPU ms per run of each part, `a+b+c ms`."""
    return "+".join(f"{statistics.median(b.cpu_ms_per_run.get(p, 0.0) for b in batches):.0f}" for p in parts) + " ms"


def table(batches: Sequence[Batch], modes: Sequence[str]) -> tuple[str, bool]:
    """The one table, and whether every run was correct with no failed workflow task."""
    header = ["scenario", "runs/s cm", "runs/s floor", "calls/s cm", "calls/s floor", "cm/floor", "wall cm",
              "wall floor", "worker RSS cm", "monty RSS (procs)", "RSS floor", "failed tasks cm/floor",
              "timed-out tasks cm/floor", "CPU/run cm: bench+server+monty", "CPU/run floor: bench+server",
              "CPU cm/floor", "result"]
    lines: list[list[str]] = []
    ok = True
    for mode in modes:
        cm = [b for b in batches if b.mode == mode and b.side == "codemode"]
        fl = [b for b in batches if b.mode == mode and b.side == "floor"]
        if not cm or not fl:
            continue
        pairs = {b.rep: b for b in fl}
        ratio = statistics.median(b.calls_per_s / pairs[b.rep].calls_per_s for b in cm)
        med = statistics.median
        right = all(b.correct == b.runs for b in [*cm, *fl])
        failed_cm, failed_fl = sum(b.failed_tasks for b in cm), sum(b.failed_tasks for b in fl)
        late_cm, late_fl = sum(b.timed_out_tasks for b in cm), sum(b.timed_out_tasks for b in fl)
        ok = ok and right and failed_cm == 0
        lines.append([
            f"{mode}: {cm[0].runs} runs x {cm[0].calls} calls",
            f"{med(b.runs_per_s for b in cm):.2f}", f"{med(b.runs_per_s for b in fl):.2f}",
            f"{med(b.calls_per_s for b in cm):.0f}", f"{med(b.calls_per_s for b in fl):.0f}", f"{ratio:.2f}x",
            fmt_s(med(b.wall_s for b in cm)), fmt_s(med(b.wall_s for b in fl)),
            f"{max(b.rss_mb for b in cm):.0f} MB", f"{max(b.monty_rss_mb for b in cm):.0f} MB "
            f"({max(b.monty_processes for b in cm)})", f"{max(b.rss_mb for b in fl):.0f} MB",
            f"{failed_cm} / {failed_fl}", f"{late_cm} / {late_fl}",
            cpu_cell(cm, ("bench", "server", "monty")), cpu_cell(fl, ("bench", "server")),
            f"{med(_cpu_total(b) / _cpu_total(pairs[b.rep]) for b in cm):.2f}x", "ok" if right else "WRONG",
        ])
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def render(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([render(header), "-+-".join("-" * w for w in widths), *(render(line) for line in lines)]), ok


async def run(args: argparse.Namespace) -> int:
    def log(text: str) -> None:
        if args.verbose:
            print(text, file=sys.stderr, flush=True)

    if not args.verbose:
        quiet_sdk_core()  # the histories count the failed workflow tasks
    warnings = WarningCounter()
    logging.getLogger("temporalio").addHandler(warnings)
    machine_text = machine()
    print(machine_text, flush=True)
    modes: list[Kind] = list(dict.fromkeys(args.mode))
    pool = PoolSettings(max_processes=args.pool)
    settings: dict[str, Any] = {
        "pool_max_processes": pool.max_processes, "pool_checkout_timeout_s": pool.checkout_timeout,
        "max_cached_workflows": args.cache,
        "max_concurrent_activities": args.activities, "floor_max_concurrent_workflow_tasks": "SDK default (100)",
    }
    env = await start_server(args.verbose)
    batches: list[Batch] = []
    try:
        client = env.client
        slot_option = {} if args.slots is None else {"max_concurrent_workflow_tasks": args.slots}
        cm_worker = create_worker(client, [make_agent(m, args.calls) for m in modes], task_queue=CM_QUEUE, pool=pool,
                                  max_cached_workflows=args.cache, max_concurrent_activities=args.activities,
                                  **slot_option)
        slots = cm_worker.config()["max_concurrent_workflow_tasks"]  # create_worker's default for this pool
        settings["max_concurrent_workflow_tasks"] = slots
        floor_worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow], activities=FLOOR_ACTIVITIES,
                              max_cached_workflows=args.cache, max_concurrent_activities=args.activities,
                              workflow_runner=workflow_runner())  # the runtime's own runner: a fair floor
        async with cm_worker, floor_worker:
            for mode in modes:  # warm-up: a few runs of each side (imports, the pool, pollers)
                for side in ("codemode", "floor"):
                    warm = argparse.Namespace(**{**vars(args), "runs": min(args.runs, 4)})
                    await batch(client, side, mode, -1, warm)
            for rep in range(args.reps):
                for mode in modes:
                    for side in (("codemode", "floor") if rep % 2 == 0 else ("floor", "codemode")):
                        b = await batch(client, side, mode, rep, args)
                        batches.append(b)
                        log(f"rep {rep} {mode} {side}: {b.wall_s:.1f} s, {b.calls_per_s:.0f} calls/s, "
                            f"{b.correct}/{b.runs} correct, {b.failed_tasks} failed and {b.timed_out_tasks} "
                            f"timed-out tasks, load {b.load_avg}")
    finally:
        await env.shutdown()
        shutdown_pool()
    text, ok = table(batches, modes)
    print(text, flush=True)
    loads = [b.load_avg[0] for b in batches]
    print(f"medians of {args.reps} repetition(s); cm/floor = median of per-repetition nested calls/s ratios; "
          f"{args.runs} runs started at once per side (the other side idle); worker: Monty pool {pool.max_processes} "
          f"processes, max_concurrent_workflow_tasks={settings['max_concurrent_workflow_tasks']}, "
          f"max_cached_workflows={args.cache}, max_concurrent_activities="
          f"{args.activities} (both sides); RSS = peaks of this process and of its monty children (sampled every "
          f"0.25 s); load average (1 min) {min(loads):.1f}-{max(loads):.1f} at batch ends on "
          f"{os.cpu_count()} CPUs; {REPLAYED} code-mode runs per batch replayed cleanly", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine_text, "settings": settings, "runs": args.runs, "calls": args.calls,
            "reps": args.reps, "batches": [asdict(b) | {"runs_per_s": b.runs_per_s, "calls_per_s": b.calls_per_s}
                                           for b in batches],
            "sdk_warnings": {phase: dict(c) for phase, c in warnings.kinds.items()},
        }, indent=1))
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=50, help="concurrent runs per batch (default 50)")
    parser.add_argument("--calls", type=int, default=100, help="nested calls per run (default 100)")
    parser.add_argument("--mode", nargs="+", choices=["sequential", "gather"], default=["sequential", "gather"],
                        help="how a program makes its calls: one after another, or one asyncio.gather (default both)")
    parser.add_argument("--pool", type=int, default=PoolSettings().max_processes,
                        help="PoolSettings.max_processes; the worker's max_concurrent_workflow_tasks is "
                        "create_worker's default for it (4, or the pool if smaller) "
                        f"(default {PoolSettings().max_processes}: PoolSettings' default, 4 per usable CPU)")
    parser.add_argument("--slots", type=int, help="max_concurrent_workflow_tasks of the code-mode worker, at most "
                        "--pool (default: create_worker's default for the pool)")
    parser.add_argument("--cache", type=int, default=1000, help="max_cached_workflows of both workers (default "
                        "1000, the SDK's)")
    parser.add_argument("--activities", type=int, default=100, help="max_concurrent_activities of both workers "
                        "(default 100, the SDK's)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions (median; default 1)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a batch may take before the benchmark "
                        "fails (default 900)")
    parser.add_argument("--json", metavar="FILE", help="write every batch and the worker settings as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every batch to stderr, keep the SDK's "
                        "own logs")
    args = parser.parse_args(argv)
    if min(args.runs, args.calls, args.reps, args.cache + 1, args.activities) < 1 or args.timeout <= 0:
        parser.error("--runs, --calls, --reps and --activities must be at least 1, --cache at least 0")
    if args.slots is not None and not 2 <= args.slots <= args.pool:
        parser.error("--slots must be from 2 to --pool (create_worker refuses more slots than sandbox processes)")
    if args.pool < 2:
        parser.error("--pool must be at least 2 (PoolSettings)")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
