"""A run of several snippets, its session kept between them or released: one table.

`python bench/between_snippets.py [--snippets 5] [--reps 12]` runs an agent whose scripted model makes K `run_code`
calls, one per turn (`x = 0`, then `x += await get(i=k)`), then answers. Each repetition runs it twice on one
worker, interleaved (the order alternating): as the runtime runs it (**kept**: between snippets the run keeps its
session on one of the hold budget's places, and the next snippet is fed to it), and with keeping switched off in
this process (**released**: every snippet checks out a fresh session, loads the REPL's dump and pays the fresh
session's first type check, as before 2026-12-04). It prints the medians of the run's wall time and of the
workflow thread's time starting the K snippets (checkout, load, first check), and their ratios, and replays
every history.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

from pydantic_ai import Agent
from temporalio.worker import Replayer

from bench.run_bench import machine, run_and_exit
from durable_codemode import CodeModeAgent, CodeModeRunWorkflow, create_worker, start_dev_server, start_run
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode.testing import RunCode, scripted_model
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner
from durable_codemode.workflow import _sandbox, _snippet_driver

QUEUE = "bench-between-snippets"
_KEEP = "_may_keep_between_snippets"
"""The `Repl` method that decides whether a run keeps its session between snippets (switched off: released)."""


def make_agent(snippets: int) -> CodeModeAgent:
    steps: list[Any] = [RunCode("x = 0"), *(RunCode(f"x += await get(i={k})") for k in range(1, snippets)), "done"]
    agent = Agent(scripted_model(*steps), name="bench-between-snippets", instructions="Use run_code.")

    @agent.tool_plain
    async def get(i: int) -> int:
        """Get the value of item i."""
        return i

    return CodeModeAgent(agent)


async def run(args: argparse.Namespace) -> int:
    print(machine(), flush=True)
    starting = 0.0
    first_stretch = _snippet_driver.SnippetDriver._first_stretch

    async def timed_first_stretch(self: _snippet_driver.SnippetDriver) -> Any:
        nonlocal starting
        start = time.perf_counter()
        try:
            return await first_stretch(self)
        finally:
            starting += time.perf_counter() - start

    keep = _sandbox.Repl._may_keep_between_snippets
    released: Callable[[_sandbox.Repl], bool] = lambda repl: False  # noqa: E731
    _snippet_driver.SnippetDriver._first_stretch = timed_first_stretch  # type: ignore[method-assign]
    env = await start_dev_server(banner="off")
    replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=DATA_CONVERTER,
                        workflow_runner=workflow_runner())
    walls: dict[str, list[float]] = {"kept": [], "released": []}
    starts: dict[str, list[float]] = {"kept": [], "released": []}
    try:
        async with create_worker(env.client, [make_agent(args.snippets)], task_queue=QUEUE):
            for rep in range(-1, args.reps):  # -1: the warm-up
                for side in ("kept", "released") if rep % 2 == 0 else ("released", "kept"):
                    setattr(_sandbox.Repl, _KEEP, keep if side == "kept" else released)
                    starting = 0.0
                    start = time.perf_counter()
                    handle = await start_run(env.client, "bench-between-snippets", "go", task_queue=QUEUE)
                    result = await handle.result()
                    wall = time.perf_counter() - start
                    if result.output != "done" or len(result.nested_calls) != args.snippets - 1:
                        raise AssertionError(f"{side}: output {result.output!r}, {len(result.nested_calls)} calls")
                    await replayer.replay_workflow(await handle.fetch_history())
                    if rep >= 0:
                        walls[side].append(wall)
                        starts[side].append(starting)
    finally:
        setattr(_sandbox.Repl, _KEEP, keep)
        _snippet_driver.SnippetDriver._first_stretch = first_stretch  # type: ignore[method-assign]
        await env.shutdown()
        shutdown_pool()
    med = {k: (statistics.median(walls[k]), statistics.median(starts[k])) for k in walls}
    header = ["snippets", "wall kept", "wall released", "kept/released", "starting kept", "starting released",
              "kept/released (starting)"]
    row = [str(args.snippets), f"{med['kept'][0] * 1000:.0f} ms", f"{med['released'][0] * 1000:.0f} ms",
           f"{med['kept'][0] / med['released'][0]:.2f}x", f"{med['kept'][1] * 1000:.1f} ms",
           f"{med['released'][1] * 1000:.1f} ms", f"{med['kept'][1] / med['released'][1]:.2f}x"]
    widths = [max(len(h), len(c)) for h, c in zip(header, row, strict=True)]
    print(" | ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    print(" | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    print(f"medians of {args.reps} repetition(s) per side, interleaved; starting = the workflow thread's time "
          "starting the run's snippets (checkout, load, first type check); every history replayed")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--snippets", type=int, default=5, help="run_code calls per run (at least 2)")
    parser.add_argument("--reps", type=int, default=12, help="repetitions per side (median)")
    args = parser.parse_args()
    if args.snippets < 2 or args.reps < 1:
        parser.error("--snippets must be at least 2 and --reps at least 1")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
