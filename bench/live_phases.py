"""Where a live run's wall time goes, phase by phase, code mode against the floor, read from their histories.

`python bench/live_phases.py [--n 20 200] [--kinds gather sequential] [--reps 8]` runs each scenario of
`bench/run_bench.py` `--reps` times on each side (code mode, and the floor's bare workflow with the same unsandboxed
workflow runner), alternating which side goes first, and splits each run's wall time by the server's own event
times. Both sides have the same shape (one describe step, a model request, N tool calls, a model request), so the
same seven phases cut both runs end to end, with nothing left over and nothing counted twice:

1. **start, describe**: the run's start to its first model request's scheduling (the first workflow task: the
   describe local activity, for code mode pydantic-ai's probe of the agent; the floor's is a bare function);
2. **model request 1**: that activity, scheduled to completed (code mode: one step of pydantic-ai's own agent
   graph around the scripted model; the floor: a bare function);
3. **program start**: the first model request's completion to the first tool call's scheduling (code mode: the
   response read, the snippet checked and started in Monty, its calls made; the floor: its loop starting);
4. **tool calls**: the first tool call's scheduling to the last one's completion (the activities, and for a
   sequential run the workflow task between each two);
5. **program end**: the last tool call's completion to the second model request's scheduling;
6. **model request 2**: as 2;
7. **end**: the second model request's completion to the run's completion.

It prints one table per scenario (titled with it): the median milliseconds of each phase per side, code mode's
extra time, and that phase's share of the whole gap; then the medians of the whole run (the phases' medians need
not add up to it) and the median of the per-repetition ratios, as `bench/run_bench.py` computes its wall ratio.
Event times are the server's clock, at millisecond-ish resolution: use enough repetitions for the N=20 runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.worker import Worker

from bench.floor import FLOOR_ACTIVITIES, FloorWorkflow
from bench.run_bench import CODEMODE_QUEUE, FLOOR_QUEUE, Bench, Kind, machine, make_agent, run_and_exit
from durable_codemode import create_worker, start_dev_server
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner

PHASES = ("start, describe", "model request 1", "program start", "tool calls", "program end", "model request 2",
          "end")


@dataclass(frozen=True)
class Phases:
    """One run's wall time by phase (milliseconds, in `PHASES` order) and in all."""

    phases: tuple[float, ...]
    total: float


def _ms(at: Timestamp) -> float:
    return at.ToNanoseconds() / 1e6


def phases_of(history: WorkflowHistory) -> Phases:
    """Cut a finished run of a benchmark scenario into `PHASES` by its events' times.

    The model requests are the activities whose type names a model (`durable-codemode.model_request`,
    `bench.floor_model`); every other activity is a tool call.

    Raises:
        ValueError: the history is not a finished run of that shape (two model requests around the tool calls).

    """
    scheduled: dict[int, tuple[float, bool]] = {}  # event id -> (time, is a model request)
    models: list[tuple[float, float]] = []  # (scheduled, completed)
    tools: list[tuple[float, float]] = []
    events = list(history.events)
    for event in events:
        at = _ms(event.event_time)
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = (at, "model" in name)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            start, is_model = scheduled[event.activity_task_completed_event_attributes.scheduled_event_id]
            (models if is_model else tools).append((start, at))
    if len(models) != 2 or not tools:
        raise ValueError(f"run {history.workflow_id}: {len(models)} model requests and {len(tools)} tool calls; "
                         "a scenario's run has two model requests around its tool calls")
    begin, finish = _ms(events[0].event_time), _ms(events[-1].event_time)
    (m1_start, m1_end), (m2_start, m2_end) = sorted(models)
    first_tool = min(start for start, _ in tools)
    last_tool = max(end for _, end in tools)
    cuts = (begin, m1_start, m1_end, first_tool, last_tool, m2_start, m2_end, finish)
    return Phases(phases=tuple(b - a for a, b in pairwise(cuts)), total=finish - begin)


def table(scenario: str, cm: Sequence[Phases], floor: Sequence[Phases]) -> str:
    """One scenario's table: each phase's median per side, code mode's extra, and its share of the gap."""
    def med(runs: Sequence[Phases], i: int) -> float:
        return statistics.median(run.phases[i] for run in runs)

    total_cm = statistics.median(run.total for run in cm)
    total_floor = statistics.median(run.total for run in floor)
    gap = total_cm - total_floor
    ratio = statistics.median(a.total / b.total for a, b in zip(cm, floor, strict=True))
    width = max(len(p) for p in PHASES)
    lines = [f"{scenario}, {len(cm)} run(s) a side:",
             f"{'phase':<{width}} | cm ms  | floor ms | cm - floor | share of gap",
             f"{'-' * width}-|--------|----------|------------|-------------"]
    for i, phase in enumerate(PHASES):
        a, b = med(cm, i), med(floor, i)
        share = f"{(a - b) / gap:>11.0%}" if gap > 0 else f"{'—':>11}"
        lines.append(f"{phase:<{width}} | {a:6.1f} | {b:8.1f} | {a - b:+10.1f} | {share}")
    lines.append(f"{'whole run':<{width}} | {total_cm:6.1f} | {total_floor:8.1f} | {gap:+10.1f} | "
                 f"cm/floor {ratio:.2f}x")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    scenarios: list[tuple[Kind, int]] = [(kind, n) for kind in args.kinds for n in sorted(set(args.n))]
    print(machine(), flush=True)
    env = await start_dev_server(banner="off")
    try:
        client = env.client
        cm_worker = create_worker(client, [make_agent(k, n) for k, n in scenarios], task_queue=CODEMODE_QUEUE)
        floor_worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow],
                              activities=FLOOR_ACTIVITIES, workflow_runner=workflow_runner())
        async with cm_worker, floor_worker:
            bench = Bench(client)
            for kind, n in scenarios:
                await bench.run_codemode(kind, n)  # warm-up, unmeasured: imports, the sandbox pool, pollers
                await bench.run_floor(kind, n)
                runs: dict[str, list[Phases]] = {"cm": [], "floor": []}
                for rep in range(args.reps):
                    for side in ("cm", "floor") if rep % 2 == 0 else ("floor", "cm"):
                        _, history = await (bench.run_codemode(kind, n) if side == "cm" else bench.run_floor(kind, n))
                        runs[side].append(phases_of(history))
                print(f"\n{table(f'{kind}-{n}', runs['cm'], runs['floor'])}", flush=True)
    finally:
        await env.shutdown()
        shutdown_pool()
    print("\nms = median of --reps runs a side, alternating which side goes first; phases by the server's event "
          "times (see the module docstring); cm/floor = median of the per-repetition ratios of whole runs")
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, nargs="+", default=[20, 200], help="nested calls per scenario")
    parser.add_argument("--kinds", nargs="+", choices=("gather", "sequential"), default=["gather", "sequential"])
    parser.add_argument("--reps", type=int, default=8, help="measured runs a side per scenario (median)")
    args = parser.parse_args(argv)
    if args.reps < 1 or min(args.n) < 1:
        parser.error("--reps and --n must be at least 1")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
