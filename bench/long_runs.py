"""The longest run and the largest payload, against the floor.

`python bench/long_runs.py [--snippets 40] [--calls 250] [--per-run 5] [--big-mb 10]`.

Long run: one agent run of S snippets, each gathering C nested calls and adding them to a REPL variable, with
`max_snippets_per_run=P` so it continues as new every P snippets, carrying its REPL (sealed with a key); the floor
is a bare workflow doing the same batches and continuing as new as often (`bench.long_floor`). Large payload: a
tool returning B MB into a program, through a payload store, against one bare activity returning the same. Both
sides use the same dev server and payload store in the same process; one table, ratios code mode / floor.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

from pydantic_ai import Agent
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Replayer, Worker

from bench.floor import floor_get, floor_model
from bench.long_floor import BigFloorWorkflow, LongFloorInput, LongFloorWorkflow, floor_big
from bench.run_bench import machine, run_and_exit
from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    LocalPayloadStore,
    SnippetLimits,
    connect,
    create_worker,
    start_dev_server,
    start_run,
)
from durable_codemode.testing import RunCode, Step, fetch_chain_histories, last_result, scripted_model
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner

CM_QUEUE = "bench-long-codemode"
FLOOR_QUEUE = "bench-long-floor"


def long_agent(snippets: int, calls: int, per_run: int) -> CodeModeAgent:
    step = (f"import asyncio\ntotal += sum(await asyncio.gather(*(get(i=i) for i in range({calls}))))\n"
            "done += 1\n[done, total]")
    steps: list[Step] = [RunCode("total = 0\ndone = 0"), *[RunCode(step) for _ in range(snippets)],
                         lambda m: str(last_result(m)["result"][1])]
    agent = Agent(scripted_model(*steps), name="bench-long", instructions="Use run_code.")

    @agent.tool_plain
    async def get(i: int) -> int:
        """The value of item i."""
        return i

    limits = SnippetLimits(max_snippets_per_run=per_run, max_tool_calls=max(calls, 1), max_model_requests=snippets + 5)
    return CodeModeAgent(agent, limits=limits)


def big_agent(size: int) -> CodeModeAgent:
    agent = Agent(scripted_model(RunCode(f"r = await make(size={size})\nlen(r)"),
                                 lambda m: str(last_result(m)["result"])), name="bench-big",
                  instructions="Use run_code.")

    @agent.tool_plain
    async def make(size: int) -> str:
        """A result of `size` characters."""
        return "x" * size

    return CodeModeAgent(agent)


@dataclass
class Measured:
    """One side of a scenario: its wall time, its chain's histories as stored, their replay time, its value."""

    value: Any
    wall: float
    histories: list[WorkflowHistory]
    total_bytes: int
    largest_bytes: int
    replay: float


async def measure(client: Client, start: Callable[[], Awaitable[WorkflowHandle[Any, Any]]],
                  workflows: list[type]) -> Measured:
    """Start a workflow, wait for it, and size and replay its continue-as-new chain.

    Sizes are of the histories as stored (payload references, not the payloads); the replay is offline, with
    the client's data converter (so the payload store resolves references).
    """
    t0 = time.perf_counter()
    handle = await start()
    value = await handle.result()
    wall = time.perf_counter() - t0
    histories = await fetch_chain_histories(handle)
    sizes = [sum(e.ByteSize() for e in h.events) for h in histories]
    replayer = Replayer(workflows=workflows, data_converter=client.data_converter, workflow_runner=workflow_runner())
    t0 = time.perf_counter()
    for history in histories:
        await replayer.replay_workflow(history)
    return Measured(value=value, wall=wall, histories=histories, total_bytes=sum(sizes), largest_bytes=max(sizes),
                    replay=time.perf_counter() - t0)


def _compared(cm: Measured, fl: Measured, digits: int) -> list[str]:
    """The table cells both scenarios share: walls, their ratio, history sizes, replay times."""
    return [f"{cm.wall:.2f} s", f"{fl.wall:.2f} s", f"{cm.wall / fl.wall:.2f}x",
            f"{cm.total_bytes / 1e6:.{digits}f} / {cm.largest_bytes / 1e6:.{digits}f} MB",
            f"{fl.total_bytes / 1e6:.{digits}f} / {fl.largest_bytes / 1e6:.{digits}f} MB",
            f"{cm.replay * 1000:.0f} / {fl.replay * 1000:.0f} ms"]


def ok_text(ok: bool) -> str:
    return "ok" if ok else "WRONG"


async def run(args: argparse.Namespace) -> int:
    print(machine(), flush=True)
    env = await start_dev_server(banner="off")  # the dev server's banner would land in the table
    rows: list[list[str]] = []
    failures = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = LocalPayloadStore(Path(tmp) / "payloads")
            client = await connect(env.client.service_client.config.target_host, payload_store=store)
            size = int(args.big_mb * 1024 * 1024)
            agents = [long_agent(args.snippets, args.calls, args.per_run), big_agent(size)]
            cm_worker = create_worker(client, agents, task_queue=CM_QUEUE, repl_key=secrets.token_bytes(32))
            floor_worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[LongFloorWorkflow, BigFloorWorkflow],
                                  activities=[floor_get, floor_model, floor_big], workflow_runner=workflow_runner())
            async with cm_worker, floor_worker:
                expected = args.snippets * sum(range(args.calls))
                cm = await measure(client, lambda: start_run(client, "bench-long", "go", task_queue=CM_QUEUE),
                                   [CodeModeRunWorkflow])
                fl = await measure(client, lambda: client.start_workflow(
                    LongFloorWorkflow.run, LongFloorInput(batches=args.snippets, size=args.calls,
                                                          per_run=args.per_run),
                    id=f"long-floor-{uuid.uuid4().hex[:8]}", task_queue=FLOOR_QUEUE), [LongFloorWorkflow])
                ok = cm.value.output == str(expected) and fl.value == expected
                failures += not ok
                rows.append([f"long run: {args.snippets * args.calls:,} nested calls",
                             f"{len(cm.histories) - 1} / {len(fl.histories) - 1}", *_compared(cm, fl, 2), ok_text(ok)])
                cm = await measure(client, lambda: start_run(client, "bench-big", "go", task_queue=CM_QUEUE),
                                   [CodeModeRunWorkflow])
                fl = await measure(client, lambda: client.start_workflow(
                    BigFloorWorkflow.run, size, id=f"big-floor-{uuid.uuid4().hex[:8]}", task_queue=FLOOR_QUEUE),
                    [BigFloorWorkflow])
                ok = cm.value.output == str(size) and fl.value == size
                failures += not ok
                rows.append([f"payload: one {args.big_mb:g} MB tool result", "0 / 0", *_compared(cm, fl, 3),
                             ok_text(ok)])
    finally:
        await env.shutdown()
        shutdown_pool()
    head = ["scenario", "CAN cm / floor", "wall cm", "wall floor", "cm/floor", "history cm (all / largest run)",
            "history floor", "replay cm / floor", "result"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)), flush=True)
    print(f"{args.snippets} snippets x {args.calls} gathered calls, {args.per_run} snippets per workflow run (REPL "
          "carried across continue-as-new, sealed); payloads >= 256 KiB in a LocalPayloadStore on both sides; "
          "history = serialized protobuf bytes", flush=True)
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--snippets", type=int, default=40, help="snippets in the long run")
    parser.add_argument("--calls", type=int, default=250, help="gathered nested calls per snippet")
    parser.add_argument("--per-run", type=int, default=5, help="snippets per workflow run (continue-as-new after)")
    parser.add_argument("--big-mb", type=float, default=10, help="size of the large tool result, in MB")
    args = parser.parse_args(argv)
    if min(args.snippets, args.calls, args.per_run) < 1 or args.big_mb <= 0:
        parser.error("--snippets, --calls, --per-run and --big-mb must be positive")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
