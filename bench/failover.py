"""The stall after a worker is SIGKILLed mid-run, for several sticky-queue timeouts.

`python bench/failover.py [--sticky 1,3,10] [--reps 3] [--runs 8]`.

For each `sticky_queue_schedule_to_start_timeout` and repetition: two ledger worker processes (`tests._workers`,
`tests._ledger_worker`) on one dev server and a fresh task queue, `--runs` concurrent runs of mostly sequential
nested calls (each pausing 20 ms in the tool), and once 40% of their side effects are done the worker holding
more runs is SIGKILLed (with its sandbox processes). For each run that worker held, from the history and the
ledger: **resumed**, seconds from the kill until the survivor started the run's next workflow task, and **next
call**, until the first nested call made from there returned on the survivor. Every run must still finish right,
with no side effect twice. Tool attempts time out after 3 s (an attempt lost with the worker is retried then).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` and `tests.*` must be importable

from temporalio.client import Client

from bench.run_bench import machine, run_and_exit
from durable_codemode import start_dev_server, start_run
from durable_codemode.testing import new_task_queue
from tests._ledger_worker import AGENT, Ledger, LedgerTask
from tests._workers import stall_after_kill, worker_fleet, workflow_task_workers


async def one_kill(client: Client, address: str, sticky: float, runs: int, calls: int, tmp: Path) -> tuple[
        list[tuple[float, float]], str]:
    """One repetition: the stalls (resumed, next call) of the runs the killed worker held, and a problem or ''."""
    task_queue = new_task_queue("failover")
    tasks = [LedgerTask(account=f"f-{i}", gathers=1, width=4, sequential=calls, pause_ms=20) for i in range(runs)]
    total = sum(t.mutations() for t in tasks)
    async with worker_fleet(client, address, task_queue, tmp, sticky=sticky, max_processes=runs + 2,
                            tool_timeout=3.0) as fleet:
        ledger = Ledger(fleet.ledger)
        await asyncio.gather(fleet.start(), fleet.start())
        handles = await asyncio.gather(*(start_run(client, AGENT, t.prompt(), task_queue=task_queue)
                                         for t in tasks))
        deadline = time.monotonic() + 120
        while ledger.execution_count() < total * 4 // 10:
            if time.monotonic() > deadline:
                return [], f"stuck at {ledger.execution_count()}/{total} before the kill"
            await asyncio.sleep(0.02)
        last = [tasks_[-1][1] for tasks_ in await asyncio.gather(*(
            workflow_task_workers(client, h.id, completed=True) for h in handles))]
        victim = max(fleet.by_identity().values(), key=lambda w: last.count(w.identity))
        survivor = next(w for w in fleet.by_identity().values() if w is not victim)
        held = [h for h, who in zip(handles, last, strict=True) if who == victim.identity]
        victim.kill()
        assert victim.killed_at is not None
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 180)
    wrong = [t.account for t, r in zip(tasks, results, strict=True) if r.output != str(t.expected(approved=True))]
    if wrong or ledger.duplicate_effects() or ledger.execution_count() != total:
        return [], f"WRONG: runs {wrong}, {ledger.duplicate_effects()} duplicates"
    stalls = await asyncio.gather(*(stall_after_kill(client, ledger, h.id, survivor, victim.killed_at)
                                    for h in held))
    return [s for s in stalls if s is not None], ""


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):5.1f} / {max(values):5.1f} s" if values else "—"


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sticky", default="1,3,10", help="sticky_queue_schedule_to_start_timeout values, s")
    parser.add_argument("--reps", type=int, default=3, help="kills per setting")
    parser.add_argument("--runs", type=int, default=8, help="concurrent runs per kill")
    parser.add_argument("--calls", type=int, default=30, help="sequential nested calls per run (plus a gather of 4)")
    args = parser.parse_args(argv)
    settings = [float(s) for s in args.sticky.split(",")]
    print(machine())
    rows: list[tuple[float, list[tuple[float, float]]]] = []
    problems: list[str] = []
    async with await start_dev_server() as env:
        address = env.client.service_client.config.target_host
        for sticky in settings:
            stalls: list[tuple[float, float]] = []
            for rep in range(args.reps):
                with tempfile.TemporaryDirectory() as tmp:
                    got, problem = await one_kill(env.client, address, sticky, args.runs, args.calls, Path(tmp))
                stalls += got
                if problem:
                    problems.append(f"sticky {sticky:g} s, kill {rep + 1}: {problem}")
                print(f"sticky {sticky:g} s, kill {rep + 1}: {len(got)} held runs, resumed after "
                      f"{', '.join(f'{r:.1f}' for r, _ in got)} s", file=sys.stderr)
            rows.append((sticky, stalls))
    header = f"{'sticky timeout':>14} | {'kills':>5} | {'held runs':>9} | {'resumed median / max':>20} | " \
             f"{'next call median / max':>22}"
    print(header)
    print("-" * len(header))
    for sticky, stalls in rows:
        print(f"{sticky:>12g} s | {args.reps:>5} | {len(stalls):>9} | {_cell([r for r, _ in stalls]):>20} | "
              f"{_cell([c for _, c in stalls]):>22}")
    print(f"{args.runs} runs of {args.calls + 5} nested calls per kill, 2 worker processes, tool attempt timeout 3 s, "
          "workflow task timeout 10 s; held runs: those whose last workflow task before the kill ran on the killed "
          "worker")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    run_and_exit(main())
