"""Heavy compute in code mode, against plain Monty plus the floor: the 200k-row sort, then 10 tool calls.

    python bench/compute.py              # 5 repetitions, one table
    python bench/compute.py --reps 9

The program builds 200,000 small dicts, sorts them (about 0.5 s in Monty here: past the 0.4 s in-workflow
budget, so the stretch is recorded in the history, or goes on in the compute activity), then makes 10
sequential tool calls with the first 10 ids and returns their sum. Side by side, in the same run:

- **code mode**: the program as a `run_code` snippet of a `CodeModeAgent` (scripted model, default limits), on
  an embedded dev server with a payload store (the program's state is a ~28 MB dump);
- **plain Monty**: the same program in one Monty session outside Temporal, its 10 calls answered inline;
- **floor-10**: `bench/floor.py`'s bare workflow making 10 sequential activities (with the workers'
  unsandboxed runner);
- **plain + floor**: the sum of the two, what the work costs without code mode's durability.

The ratio is code mode over plain + floor, median of the per-repetition ratios (goal: at most 1.5x).
"stretches recorded" counts the compute activities of all the measured runs: whether the sort went past the
0.4 s budget depends on the machine's speed and load at the moment (and is then recorded).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from pydantic_ai import Agent
from pydantic_monty import CollectStreams, FunctionSnapshot, FutureSnapshot, Monty, MontyComplete
from temporalio.client import Client
from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.floor import FLOOR_ACTIVITIES, FloorInput, FloorWorkflow
from bench.run_bench import machine, run_and_exit
from durable_codemode import (
    CodeModeAgent,
    LocalPayloadStore,
    SnippetLimits,
    connect,
    create_worker,
    start_dev_server,
    start_run,
)
from durable_codemode.testing import RunCode, last_result, scripted_model
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner

PROGRAM = """rows = [{"id": i, "key": (i * 7919) % 200_003} for i in range(200_000)]
rows.sort(key=lambda r: r["key"])
total = 0
for r in rows[:10]:
    total += await get(i=r["id"])
total
"""
EXPECTED = sum(sorted(range(200_000), key=lambda i: ((i * 7919) % 200_003, i))[:10])
CODEMODE_QUEUE, FLOOR_QUEUE = "bench-compute", "bench-compute-floor"


SCENARIOS = {"default budget": SnippetLimits(), "budget 0.1 s": SnippetLimits(max_turn_seconds=0.1)}
"""The default in-workflow budget (0.4 s a stretch), and one the sort always goes past (so it is recorded)."""


def agent_name(scenario: str) -> str:
    return "bench-compute-" + scenario.replace(" ", "-").replace(".", "")


def make_agent(scenario: str) -> CodeModeAgent:
    agent = Agent(scripted_model(RunCode(PROGRAM), lambda m: str(last_result(m)["result"])),
                  name=agent_name(scenario))

    @agent.tool_plain
    async def get(i: int) -> int:
        """Item `i`: `i` itself."""
        return i

    return CodeModeAgent(agent, limits=SCENARIOS[scenario])


def plain_monty(pool: Monty) -> float:
    """The program in one Monty session, its calls answered inline; seconds."""
    start = time.perf_counter()
    with pool.checkout(limits={"max_memory": 256 * 1024 * 1024}) as session:
        snap = session.feed_start(PROGRAM, print_callback=CollectStreams())
        pending: dict[int, int] = {}
        while not isinstance(snap, MontyComplete):
            if isinstance(snap, FunctionSnapshot):
                pending[snap.call_id] = snap.kwargs["i"]
                snap = snap.resume({"future": ...})
            elif isinstance(snap, FutureSnapshot):
                snap = snap.resume({i: {"return_value": pending.pop(i)} for i in sorted(snap.pending_call_ids)})
            else:
                raise TypeError(f"unexpected {snap!r}")
    wall = time.perf_counter() - start
    if snap.output != EXPECTED:
        raise AssertionError(f"plain Monty: {snap.output!r}, want {EXPECTED}")
    return wall


async def run(args: argparse.Namespace) -> int:
    print(machine(), flush=True)
    env = await start_dev_server(banner="off")  # stdout carries only the table
    rows: dict[str, list[dict[str, float]]] = {scenario: [] for scenario in SCENARIOS}
    try:
        with tempfile.TemporaryDirectory() as store_dir:
            client = await connect(env.client.service_client.config.target_host,
                                   payload_store=LocalPayloadStore(store_dir))
            cm_worker = create_worker(client, [make_agent(s) for s in SCENARIOS], task_queue=CODEMODE_QUEUE)
            floor_worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow],
                                  activities=FLOOR_ACTIVITIES, workflow_runner=workflow_runner())
            with Monty(max_processes=1, checkout_timeout=5) as pool:
                async with cm_worker, floor_worker:
                    for rep in range(-1, args.reps):  # rep -1 warms up
                        for scenario in SCENARIOS:
                            row = await measure(client, pool, scenario)
                            if rep >= 0:
                                rows[scenario].append(row)
    finally:
        await env.shutdown()
        shutdown_pool()
    print(table(rows), flush=True)
    return 0


async def measure(client: Client, pool: Monty, scenario: str) -> dict[str, float]:
    """One repetition: the code-mode run, plain Monty, the floor, back to back."""
    row: dict[str, float] = {}
    start = time.perf_counter()
    handle = await start_run(client, agent_name(scenario), "go", task_queue=CODEMODE_QUEUE,
                             run_id=f"bench-compute-{uuid.uuid4().hex[:8]}")
    result = await handle.result()
    row["codemode"] = time.perf_counter() - start
    if result.output != str(EXPECTED):
        raise AssertionError(f"code mode: {result.output!r}, want {EXPECTED}")
    history = await handle.fetch_history()
    row["recorded"] = sum(1 for e in history.events if e.activity_task_scheduled_event_attributes.activity_type.name
                          == "durable-codemode.compute")
    row["plain"] = plain_monty(pool)
    start = time.perf_counter()
    floor = await client.execute_workflow(FloorWorkflow.run, FloorInput(n=10, mode="sequential"),
                                          id=f"bench-compute-floor-{uuid.uuid4().hex[:8]}", task_queue=FLOOR_QUEUE)
    row["floor"] = time.perf_counter() - start
    assert floor == sum(range(10))
    return row


def table(rows: dict[str, list[dict[str, float]]]) -> str:
    reps = len(next(iter(rows.values())))
    lines = [
        f"compute-heavy: 200k-row sort then 10 sequential calls, {reps} repetitions (medians)",
        "| in-workflow budget | code mode | plain Monty | floor-10 | plain + floor | code mode / (plain + floor) | "
        "runs with the sort recorded |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario, measured in rows.items():
        def med(key: str, measured: list[dict[str, float]] = measured) -> float:
            return statistics.median(r[key] for r in measured)

        ratio = statistics.median(r["codemode"] / (r["plain"] + r["floor"]) for r in measured)
        plain_floor = statistics.median(r["plain"] + r["floor"] for r in measured)
        recorded = sum(1 for r in measured if r["recorded"])
        lines.append(f"| {scenario} | {med('codemode'):.2f} s | {med('plain'):.2f} s | {med('floor'):.2f} s | "
                     f"{plain_floor:.2f} s | {ratio:.2f}x (goal ≤ 1.5x) | {recorded} of {len(measured)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=5, help="measured repetitions (median)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
