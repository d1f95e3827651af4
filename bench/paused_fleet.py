"""A fleet of paused runs on one worker: its footprint, how soon its sandboxes retire, and queries meanwhile.

`python bench/paused_fleet.py [--paused 250] [--slots N] [--idle S] [--json FILE]` starts a dev server in memory
and one code-mode worker in this process with the library's defaults (unless told otherwise), then:

1. starts N runs at once, each pausing mid-program at a call that needs approval, while a probe asks one paused
   run for its pending approvals every 0.25 s (`pending_approvals`, its default 10 s timeout), as a person's
   `codemode approvals` would while the fleet starts: each answer's latency, and each error by type
   (`WorkerBusyError`: a worker polls but was busy; `WorkerUnavailableError`: none polls);
2. once all are paused: the worker's RSS, the `monty` processes alive and their RSS; then how long after the
   last program computed (the last sandbox session given back) the pool's processes are gone, against
   `PoolSettings.idle_shutdown_seconds`, and the RSS then;
3. approves every call and checks every run completes.

It prints one table: just paused, pool idle, per run. The worker's RSS includes this process's client side (the
handles, the probe), as an operator's measurement of one process would not; the dev server is a separate process,
not counted. A 1,000-run fleet takes minutes on a 2-core machine: the footprint grows linearly with the runs
paused (per run, below), so a smaller N measures the per-run cost and the fixed part; say which N when quoting.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

from temporalio.client import Client, WorkflowHandle

from bench.approvals_bench import MEMORY_CODE, bounded, make_agent, pss_mb, quiet_sdk_core, rss_mb
from bench.approvals_floor import CALL_ID
from bench.run_bench import machine, run_and_exit
from durable_codemode import (
    PoolSettings,
    WorkerUnavailableError,
    create_worker,
    decide,
    pending_approvals,
    start_dev_server,
    start_run,
)
from durable_codemode.testing import child_processes
from durable_codemode.worker._pool import POOL, shutdown_pool

AGENT = "paused-fleet"
QUEUE = "bench-paused-fleet"
TARGET_TOTAL_MB_PER_1000 = 300.0
PROBE_INTERVAL = 0.25


@dataclass
class Probe:
    """The pending-approvals queries asked while the fleet started."""

    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def failed(self, error: WorkerUnavailableError) -> None:
        name = type(error).__name__  # WorkerBusyError is a WorkerUnavailableError
        self.errors[name] = self.errors.get(name, 0) + 1

    async def ask(self, client: Client, run_id: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                await pending_approvals(client, run_id)
                self.latencies_s.append(time.perf_counter() - t)
            except WorkerUnavailableError as e:
                self.failed(e)
            await asyncio.sleep(PROBE_INTERVAL)


@dataclass
class Result:
    paused: int
    slots: int
    pool_max_processes: int
    idle_shutdown_s: float | None
    rss_before_mb: float
    rss_paused_mb: float
    monty_paused: int
    monty_paused_rss_mb: float
    monty_paused_pss_mb: float
    start_to_all_paused_s: float
    retired_after_s: float
    """From the moment the pool was last used (all paused) until no `monty` process was left."""
    monty_idle: int
    rss_idle_mb: float
    completed: int
    probe_answers: int
    probe_p50_ms: float
    probe_max_ms: float
    probe_errors: dict[str, int]
    wait_errors: dict[str, int]
    approve_to_all_done_s: float
    decide_errors: dict[str, int]
    """Decisions (50 at a time) no worker took in time, each sent again."""
    """Errors of the queries that waited for each run to pause (32 at a time, every 0.2 s per run)."""

    @property
    def per_run_kb(self) -> float:
        return (self.rss_idle_mb - self.rss_before_mb) * 1024 / self.paused


async def measure(client: Client, args: argparse.Namespace) -> Result:
    pool = PoolSettings() if args.idle is None else PoolSettings(idle_shutdown_seconds=args.idle or None)
    options: dict[str, Any] = {"max_cached_workflows": args.cache}
    if args.slots:
        options["max_concurrent_workflow_tasks"] = args.slots
    worker = create_worker(client, [make_agent(AGENT, MEMORY_CODE)], task_queue=QUEUE, pool=pool,
                           unsigned_approvals=True, **options)
    slots = int(worker.config().get("max_concurrent_workflow_tasks") or 0)

    async def start(i: int) -> WorkflowHandle[Any, Any]:
        return await start_run(client, AGENT, "go", task_queue=QUEUE, run_id=f"fleet-{i}-{uuid.uuid4().hex[:8]}")

    waits = Probe()

    async def paused(handle: WorkflowHandle[Any, Any]) -> None:
        deadline = time.monotonic() + args.timeout
        while True:
            try:
                if await pending_approvals(client, handle.id):
                    return
            except WorkerUnavailableError as e:  # as a person polling for the run to pause would see it
                waits.failed(e)
            if time.monotonic() > deadline:
                raise AssertionError(f"run {handle.id} did not pause within {args.timeout:.0f} s")
            await asyncio.sleep(0.2)

    async with worker:
        warm = await start(-1)  # imports, the pool, the pollers; also the run the probe asks
        await paused(warm)
        gc.collect()
        rss_before = rss_mb()
        probe, stop = Probe(), asyncio.Event()
        asking = asyncio.create_task(probe.ask(client, warm.id, stop))
        t0 = time.perf_counter()
        handles = await bounded(50, list(range(args.paused)), start)
        await bounded(32, handles, paused)
        t_paused = time.perf_counter() - t0
        stop.set()
        await asking
        monty = child_processes(b"monty")
        rss_paused = rss_mb()
        monty_rss, monty_pss = sum(rss_mb(p) for p in monty), sum(pss_mb(p) for p in monty)
        # Retired: from the pool's last use (POOL.idle_for counts from it) until its processes are gone.
        deadline = time.perf_counter() + 3 * (pool.idle_shutdown_seconds or 0) + 30
        idle_at_start = POOL.idle_for() or 0.0
        t_idle = time.perf_counter()
        while child_processes(b"monty") and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        retired = time.perf_counter() - t_idle + idle_at_start
        gc.collect()
        monty_idle, rss_idle = len(child_processes(b"monty")), rss_mb()
        print(f"{args.paused} paused in {t_paused:.1f} s; pool retired {retired:.1f} s after its last use",
              file=sys.stderr, flush=True)
        decisions = Probe()

        async def approve(handle: WorkflowHandle[Any, Any]) -> None:
            while True:  # as a person would: a busy worker is asked again
                try:
                    await decide(client, handle.id, CALL_ID, approved=True)
                    return
                except WorkerUnavailableError as e:
                    decisions.failed(e)

        t1 = time.perf_counter()
        await bounded(50, [warm, *handles], approve)
        outputs = await bounded(100, [warm, *handles], lambda h: h.result())
        t_done = time.perf_counter() - t1
    latencies = sorted(probe.latencies_s) or [0.0]
    return Result(
        paused=args.paused, slots=slots, pool_max_processes=pool.max_processes,
        idle_shutdown_s=pool.idle_shutdown_seconds, rss_before_mb=rss_before, rss_paused_mb=rss_paused,
        monty_paused=len(monty), monty_paused_rss_mb=monty_rss, monty_paused_pss_mb=monty_pss,
        start_to_all_paused_s=t_paused, retired_after_s=retired, monty_idle=monty_idle, rss_idle_mb=rss_idle,
        completed=sum(1 for o in outputs if o.output == "'done mem'"), probe_answers=len(probe.latencies_s),
        probe_p50_ms=statistics.median(latencies) * 1000, probe_max_ms=latencies[-1] * 1000,
        probe_errors=probe.errors, wait_errors=waits.errors, approve_to_all_done_s=t_done,
        decide_errors=decisions.errors,
    )


def table(r: Result) -> str:
    n = r.paused
    rows = [
        ("worker", f"{r.slots} workflow task slots, pool of {r.pool_max_processes}, idle shutdown "
                   f"{r.idle_shutdown_s} s"),
        ("worker RSS before", f"{r.rss_before_mb:.0f} MB"),
        (f"just paused ({n} runs): worker RSS", f"{r.rss_paused_mb:.0f} MB"),
        ("just paused: monty processes", f"{r.monty_paused} ({r.monty_paused_rss_mb:.0f} MB RSS, "
                                         f"{r.monty_paused_pss_mb:.0f} MB PSS)"),
        ("just paused: total (worker + monty RSS)", f"{r.rss_paused_mb + r.monty_paused_rss_mb:.0f} MB"),
        ("pool retired after its last use", f"{r.retired_after_s:.1f} s ({r.monty_idle} monty left)"),
        ("idle: total (worker RSS)", f"{r.rss_idle_mb:.0f} MB"),
        ("per paused run", f"{r.per_run_kb:.0f} kB"),
        ("idle, extrapolated to 1,000 runs", f"{r.rss_before_mb + r.per_run_kb * 1000 / 1024:.0f} MB (goal < "
                                             f"{TARGET_TOTAL_MB_PER_1000:.0f} MB)"),
        (f"start {n} → all paused", f"{r.start_to_all_paused_s:.1f} s"),
        ("probe while starting: answers, p50, max", f"{r.probe_answers}, {r.probe_p50_ms:.0f} ms, "
                                                    f"{r.probe_max_ms:.0f} ms"),
        ("probe while starting: errors", ", ".join(f"{k} {v}" for k, v in r.probe_errors.items()) or "none"),
        ("queries waiting for each run to pause: errors",
         ", ".join(f"{k} {v}" for k, v in r.wait_errors.items()) or "none"),
        ("approved → completed", f"{r.completed}/{n + 1} in {r.approve_to_all_done_s:.1f} s"),
        ("decisions no worker took in time (sent again)",
         ", ".join(f"{k} {v}" for k, v in r.decide_errors.items()) or "none"),
    ]
    width = max(len(k) for k, _ in rows)
    header = f"{'measure':<{width}} | result\n{'-' * width}-+-{'-' * 40}\n"
    return header + "\n".join(f"{k:<{width}} | {v}" for k, v in rows)


async def run(args: argparse.Namespace) -> int:
    quiet_sdk_core()
    print(machine(), flush=True)
    env = await start_dev_server(banner="off")
    try:
        result = await measure(env.client, args)
    finally:
        await env.shutdown()
        shutdown_pool()
    print(table(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(result), "per_run_kb": result.per_run_kb}, indent=1))
    return 0 if result.completed == args.paused + 1 else 1


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--paused", type=int, default=250, help="runs paused at once (default 250)")
    parser.add_argument("--slots", type=int, default=0,
                        help="max_concurrent_workflow_tasks (default: create_worker's)")
    parser.add_argument("--idle", type=float, default=None, metavar="S",
                        help="PoolSettings.idle_shutdown_seconds (default: the library's; 0: never)")
    parser.add_argument("--cache", type=int, default=1000, help="max_cached_workflows (default: the SDK's, 1000)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take to pause")
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON")
    args = parser.parse_args(argv)
    if args.paused < 1:
        parser.error("--paused must be at least 1")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
