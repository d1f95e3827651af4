"""Where a replay's time goes, by timer: the workflow code of a replayed run, split by part, against the floor's.

`python bench/replay_costs.py [--n 20 200] [--kinds gather sequential] [--reps 15]` runs each scenario of
`bench/run_bench.py` once on each side (code mode, and the floor's bare workflow with the same unsandboxed
workflow runner), then replays both histories `--reps` times, interleaved, with Temporal's `Replayer`. Around the
replays, timers (`time.perf_counter`) wrap:

- every workflow activation (`_WorkflowInstanceImpl.activate`, the SDK's: all workflow code, both sides);
- the driver's host round trips (`_snippet_driver.SnippetDriver._next_stretch`: Monty's `resume`, the sandbox's
  own work included, since the workflow thread waits on it);
- the driver's answers to tool calls (`SnippetDriver._answer_call`: the checks, the call's id and the start of
  its task: everything code mode does when a program makes a call, bar the activity itself);
- the snippet's start (`SnippetDriver._first_stretch`: checkout, feed).

These are private seams of this package and of the SDK, patched in this process only, and each adds the cost of
one timer per call to what it measures (~1 µs). The activations are also timed by the workflow thread's CPU
(`time.thread_time`), which the machine's other work moves less than wall time. After the timed replays, one
more replay a side runs under cProfile, enabled inside the activations only, for the number of Python calls the
workflow code makes: a count, so it does not move with the machine at all.

It prints one table: per scenario, the replay's median wall time on each side and their ratio, then the median
milliseconds per replay in activations (both sides) and, for code mode, in each part; "rest" is the activations'
time outside the parts (the SDK's activity machinery, the run's loop, the call records, the progress details);
then the activations' CPU, code mode against the floor, and the Python calls. Replay is where code mode's costs
are easiest to see: no server, no network, no activity, only the workflow code on both sides.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

import temporalio.worker._workflow_instance as workflow_instance
from temporalio.worker import Replayer, Worker

from bench.floor import FLOOR_ACTIVITIES, FloorWorkflow
from bench.run_bench import CODEMODE_QUEUE, FLOOR_QUEUE, Bench, Kind, machine, make_agent, run_and_exit
from durable_codemode import CodeModeRunWorkflow, create_worker, start_dev_server
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner
from durable_codemode.workflow import _snippet_driver

PARTS = {
    "activations": (workflow_instance._WorkflowInstanceImpl, "activate", False),
    "Monty round trips": (_snippet_driver.SnippetDriver, "_next_stretch", True),
    "call answers": (_snippet_driver.SnippetDriver, "_answer_call", True),
    "snippet start": (_snippet_driver.SnippetDriver, "_first_stretch", True),
}
"""The timed parts: (class, method, whether it is a coroutine function)."""


class Timers:
    """Seconds spent in each of `PARTS` since the last `reset`, while installed."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.profile: cProfile.Profile | None = None
        """Set: the activations run under it (`python_calls`)."""
        self._originals: list[tuple[type, str, Callable[..., Any]]] = []

    def reset(self) -> None:
        self.spent.clear()

    def install(self) -> None:
        for part, (cls, name, is_async) in PARTS.items():
            original = getattr(cls, name)
            self._originals.append((cls, name, original))
            setattr(cls, name, self._timed_async(part, original) if is_async else self._timed(part, original))

    def uninstall(self) -> None:
        for cls, name, original in reversed(self._originals):
            setattr(cls, name, original)
        self._originals.clear()

    def _timed(self, part: str, original: Callable[..., Any]) -> Callable[..., Any]:
        spent = self.spent
        timers = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            profile = timers.profile
            if profile is not None:
                profile.enable()  # in the workflow thread, around the activation only
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start
                spent[f"{part} CPU"] += time.thread_time() - cpu
                if profile is not None:
                    profile.disable()

        return timed

    def _timed_async(self, part: str, original: Callable[..., Any]) -> Callable[..., Any]:
        spent = self.spent

        async def timed(*args: Any, **kwargs: Any) -> Any:
            # These coroutines await nothing in a replay of the benchmark's programs (no compute markers, no
            # parked waits), so their wall time is their own.
            start = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start

        return timed


async def replay_costs(histories: dict[str, Any], reps: int, timers: Timers) -> dict[str, dict[str, float]]:
    """Median wall time and time per part of `reps` interleaved replays of each side's history (seconds)."""
    replayers = {
        "codemode": Replayer(workflows=[CodeModeRunWorkflow], data_converter=DATA_CONVERTER,
                             workflow_runner=workflow_runner()),
        "floor": Replayer(workflows=[FloorWorkflow], data_converter=DATA_CONVERTER, workflow_runner=workflow_runner()),
    }
    samples: dict[str, dict[str, list[float]]] = {side: defaultdict(list) for side in replayers}
    for rep in range(-2, reps):  # -2, -1: warm-ups
        for side in ("codemode", "floor") if rep % 2 == 0 else ("floor", "codemode"):
            timers.reset()
            start = time.perf_counter()
            await replayers[side].replay_workflow(histories[side])  # raises on any divergence
            wall = time.perf_counter() - start
            if rep >= 0:
                samples[side]["wall"].append(wall)
                samples[side]["activations CPU"].append(timers.spent.get("activations CPU", 0.0))
                for part in PARTS:
                    samples[side][part].append(timers.spent.get(part, 0.0))
    medians = {side: {k: statistics.median(v) for k, v in parts.items()} for side, parts in samples.items()}
    for side, replayer in replayers.items():
        medians[side]["python calls"] = await python_calls(replayer, histories[side], timers)
    return medians


async def python_calls(replayer: Replayer, history: Any, timers: Timers) -> float:
    """The Python calls (cProfile's count, primitive and recursive) inside the activations of one replay."""
    timers.profile = profile = cProfile.Profile()
    try:
        await replayer.replay_workflow(history)
    finally:
        timers.profile = None
    return float(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


def table(rows: Sequence[tuple[str, dict[str, dict[str, float]]]]) -> str:
    header = ["scenario", "replay cm", "replay floor", "cm/floor", "activations cm", "activations floor",
              "cm: Monty round trips", "cm: call answers", "cm: snippet start", "cm: rest",  # PARTS' order
              "activations CPU cm/floor", "Python calls cm / floor"]
    lines = []
    for scenario, med in rows:
        cm, fl = med["codemode"], med["floor"]
        parts = [p for p in PARTS if p != "activations"]
        rest = cm["activations"] - sum(cm[p] for p in parts)
        lines.append([scenario, f"{cm['wall'] * 1000:.1f} ms", f"{fl['wall'] * 1000:.1f} ms",
                      f"{cm['wall'] / fl['wall']:.2f}x", f"{cm['activations'] * 1000:.1f} ms",
                      f"{fl['activations'] * 1000:.1f} ms", *(f"{cm[p] * 1000:.1f} ms" for p in parts),
                      f"{rest * 1000:.1f} ms", f"{cm['activations CPU'] / fl['activations CPU']:.2f}x",
                      f"{cm['python calls']:,.0f} / {fl['python calls']:,.0f}"])
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def render(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                                 strict=True)))

    return "\n".join([render(header), "-+-".join("-" * w for w in widths), *(render(line) for line in lines)])


async def run(args: argparse.Namespace) -> int:
    print(machine(), flush=True)
    scenarios: list[tuple[Kind, int]] = [(kind, n) for n in args.n for kind in args.kinds]
    env = await start_dev_server(banner="off")
    histories: dict[str, dict[str, Any]] = {}
    try:
        worker = create_worker(env.client, [make_agent(kind, n) for kind, n in scenarios], task_queue=CODEMODE_QUEUE)
        floor = Worker(env.client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow], activities=FLOOR_ACTIVITIES,
                       workflow_runner=workflow_runner())
        async with worker, floor:
            bench = Bench(env.client)
            for kind, n in scenarios:
                _, cm = await bench.run_codemode(kind, n)
                _, fl = await bench.run_floor(kind, n)
                histories[f"{kind}-{n}"] = {"codemode": cm, "floor": fl}
    finally:
        await env.shutdown()
    timers = Timers()
    timers.install()
    try:
        rows = [(scenario, await replay_costs(h, args.reps, timers)) for scenario, h in histories.items()]
    finally:
        timers.uninstall()
        shutdown_pool()
    print(table(rows))
    print(f"medians of {args.reps} interleaved replay(s) per side of one recorded run each; floor = the bare "
          "workflow with the runtime's own unsandboxed workflow runner; ms per replay; activations CPU = the "
          "workflow thread's CPU in them; Python calls = cProfile's count inside the activations of one more "
          "replay; every replay checked by Temporal's Replayer", flush=True)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, nargs="+", default=[20, 200], help="nested calls per scenario")
    parser.add_argument("--kinds", nargs="+", choices=["gather", "sequential"], default=["gather", "sequential"],
                        help="how the program makes its calls (default both)")
    parser.add_argument("--reps", type=int, default=15, help="measured replays per side (median; default 15)")
    args = parser.parse_args()
    if args.reps < 1 or min(args.n) < 1:
        parser.error("--reps and --n must be at least 1")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
