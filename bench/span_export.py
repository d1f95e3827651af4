"""Spans exported per run when runs move between worker processes: duplicates and losses, per scenario.

`python bench/span_export.py [--runs 4] [--reps 2] [--scenarios replaced,cache0,sigkill]`.

Each scenario starts two ledger worker processes (`tests._workers`, `tests._ledger_worker --spans DIR`) that trace
their runs with Temporal's replay-safe tracer provider, each exporting every span as it is exported to a JSON-lines
file of its own (written through, so a SIGKILL keeps what was exported). `--runs` runs of the ledger agent start
at once (two gathers of 5 deposits and 12 sequential ones, 20 ms each, then a balance read). Then:

- **replaced**: while a client queries every open run every 50 ms, the worker that ran more of the runs' latest
  workflow tasks is stopped (SIGTERM: a graceful shutdown, as a deploy does) once 30% of the side effects ran, and
  a fresh worker process takes its place;
- **cache0**: both workers run with `max_cached_workflows=0` (every workflow task replays the run), while a
  client queries every open run every 50 ms;
- **sigkill**: the worker that ran more of the runs' latest workflow tasks is SIGKILLed once 30% ran.

Once every run completed and every worker has stopped (the survivors gracefully), the span files are read. Only
the spans made in workflow code count (`codemode.run`, `codemode.model_request`, `codemode.run_code`,
`codemode.call`): an attempt's span is made once per attempt by the activity. A run should export exactly
`4 + calls` of them (its run, two model requests, one snippet, one span per nested call), each once.
**duplicated**: extra copies of a span (the same step of the same run: its name, call id and run index; a replay
that re-creates a span in another order gives the copy another span id); **missing**: expected spans never
exported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` and `tests.*` must be importable

from temporalio.client import Client

from bench.run_bench import machine, run_and_exit
from durable_codemode import CodeModeRunWorkflow, start_dev_server, start_run
from durable_codemode.testing import new_task_queue
from tests._ledger_worker import AGENT, Ledger, LedgerTask
from tests._workers import WorkerFleet, worker_fleet, workflow_task_workers

WORKFLOW_SPANS = ("codemode.run ", "codemode.model_request ", "codemode.run_code ", "codemode.call ")
"""The names (prefixes) of the spans made in workflow code."""

SCENARIOS = ("replaced", "cache0", "sigkill")

KEEP: Path | None = None
"""Where to copy each repetition's span files (`--keep`)."""


@dataclass
class Count:
    """What one scenario's runs exported."""

    runs: int = 0
    expected: int = 0
    exported: int = 0
    duplicated: int = 0
    """Extra copies: exported minus distinct."""
    missing: int = 0
    duplicated_roots: int = 0
    """Extra copies of `codemode.run` spans."""
    duplicated_names: Counter[str] | None = None

    def add(self, other: Count) -> None:
        self.runs += other.runs
        self.expected += other.expected
        self.exported += other.exported
        self.duplicated += other.duplicated
        self.missing += other.missing
        self.duplicated_roots += other.duplicated_roots
        names = self.duplicated_names or Counter()
        names.update(other.duplicated_names or Counter())
        self.duplicated_names = names


def read_spans(directory: Path) -> list[dict[str, Any]]:
    """Every span every worker of the scenario exported."""
    spans = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                spans.append(json.loads(line))
    return spans


def what(span: dict[str, Any]) -> tuple[str, ...]:
    """What a span stands for in its trace: its name with its call id and run index (its id may differ per copy).

    A span re-created in another order by a replay gets another id, yet stands for the same step: both count.
    """
    attributes = span["attributes"]
    return (span["trace_id"], span["name"], str(attributes.get("codemode.call_id")),
            str(attributes.get("codemode.run_index")))


def count(spans: list[dict[str, Any]], workflow_ids: set[str], calls: int) -> Count:
    """Duplicates and losses among the workflow-side spans of the runs `workflow_ids`."""
    roots = {s["trace_id"] for s in spans if s["name"].startswith("codemode.run ")
             and s["attributes"].get("temporalWorkflowID") in workflow_ids}
    ours = [s for s in spans if s["trace_id"] in roots and s["name"].startswith(WORKFLOW_SPANS)]
    copies = Counter(what(s) for s in ours)
    extra: Counter[str] = Counter()
    for key, n in copies.items():
        extra[key[1].split()[0]] += n - 1
    expected = len(workflow_ids) * (4 + calls)
    return Count(runs=len(workflow_ids), expected=expected, exported=len(ours), duplicated=len(ours) - len(copies),
                 missing=max(0, expected - len(copies)), duplicated_roots=extra.get("codemode.run", 0),
                 duplicated_names=+extra)


async def query_every(client: Client, workflow_id: str, interval: float, done: asyncio.Event) -> None:
    """Query run `workflow_id` every `interval` seconds until `done` (failures ignored: a worker may be moving)."""
    handle = client.get_workflow_handle_for(CodeModeRunWorkflow.run, workflow_id)
    while not done.is_set():
        with contextlib.suppress(Exception):  # a query is the load, not the measure
            await handle.query(CodeModeRunWorkflow.pending_approvals, rpc_timeout=timedelta(seconds=2))
        await asyncio.sleep(interval)


async def busiest(client: Client, fleet: WorkerFleet, workflow_ids: list[str]) -> Any:
    """The live worker that completed more of the runs' latest workflow tasks."""
    last = [tasks[-1][1] for tasks in await asyncio.gather(*(
        workflow_task_workers(client, w, completed=True) for w in workflow_ids)) if tasks]
    return max(fleet.by_identity().values(), key=lambda w: last.count(w.identity))


async def scenario(client: Client, address: str, name: str, runs: int, tmp: Path) -> Count:
    """One repetition of scenario `name`: its span count."""
    spans = tmp / "spans"
    spans.mkdir()
    extra = ("--spans", str(spans), *(("--cache", "0") if name == "cache0" else ()))
    task_queue = new_task_queue(f"spans-{name}")
    tasks = [LedgerTask(account=f"s-{i}", gathers=2, width=5, sequential=12, pause_ms=20) for i in range(runs)]
    total = sum(t.mutations() for t in tasks)
    async with worker_fleet(client, address, task_queue, tmp, max_processes=runs + 4, tool_timeout=3.0,
                            extra_args=extra) as fleet:
        ledger = Ledger(fleet.ledger)
        await asyncio.gather(fleet.start(), fleet.start())
        handles = await asyncio.gather(*(start_run(client, AGENT, t.prompt(), task_queue=task_queue)
                                         for t in tasks))
        ids = [h.id for h in handles]
        done = asyncio.Event()
        queries = [asyncio.create_task(query_every(client, w, 0.05, done)) for w in ids] if name != "sigkill" else []
        deadline = time.monotonic() + 120
        while ledger.execution_count() < total * 3 // 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if name == "replaced":
            victim = await busiest(client, fleet, ids)
            victim.stop()
            await fleet.start()
        elif name == "sigkill":
            (await busiest(client, fleet, ids)).kill()
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 240)
        done.set()
        await asyncio.gather(*queries)
        wrong = [t.account for t, r in zip(tasks, results, strict=True) if r.output != str(t.expected(approved=False))]
        if wrong:
            raise AssertionError(f"runs {wrong} ended wrong")
        for worker in fleet.started:
            if worker.alive():
                worker.stop()  # gracefully: what a worker still holds is exported as it stops
    if KEEP is not None:
        shutil.copytree(spans, KEEP / f"{name}-{task_queue}")
    return count(read_spans(spans), set(ids), tasks[0].calls())


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4, help="concurrent runs per repetition")
    parser.add_argument("--reps", type=int, default=2, help="repetitions per scenario")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="which, comma-separated")
    parser.add_argument("--keep", metavar="DIR", help="copy each repetition's span files into DIR")
    args = parser.parse_args(argv)
    global KEEP
    KEEP = Path(args.keep) if args.keep else None
    print(machine())
    rows: list[tuple[str, Count]] = []
    async with await start_dev_server(banner="off") as env:
        address = env.client.service_client.config.target_host
        for name in args.scenarios.split(","):
            total = Count()
            for rep in range(args.reps):
                with tempfile.TemporaryDirectory() as tmp:
                    got = await scenario(env.client, address, name, args.runs, Path(tmp))
                print(f"{name} {rep + 1}: {got.exported} exported, {got.duplicated} duplicated "
                      f"({dict(got.duplicated_names or {})}), {got.missing} missing", file=sys.stderr)
                total.add(got)
            rows.append((name, total))
    header = (f"{'scenario':<9} | {'runs':>4} | {'expected':>8} | {'exported':>8} | {'duplicated':>10} | "
              f"{'of them runs':>12} | {'missing':>7} | {'per run':>14}")
    print(header)
    print("-" * len(header))
    for name, c in rows:
        per_run = f"{c.exported / c.runs:.1f} / {c.expected / c.runs:.0f}" if c.runs else "—"
        print(f"{name:<9} | {c.runs:>4} | {c.expected:>8} | {c.exported:>8} | {c.duplicated:>10} | "
              f"{c.duplicated_roots:>12} | {c.missing:>7} | {per_run:>14}")
    print("workflow-side spans only (run, model request, snippet, nested call); per run: exported / expected. "
          "Two worker processes per scenario; queries every 50 ms on every open run in replaced and cache0.")
    return 0


if __name__ == "__main__":
    run_and_exit(main())
