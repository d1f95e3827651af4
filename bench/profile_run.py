"""Where the time of a code-mode run goes, next to the floor's: a per-call breakdown by part of the stack.

`python bench/profile_run.py [--kind sequential] [--n 200] [--reps 5]` (needs `py-spy`: `pip install py-spy`, or
the `bench` extra) runs the scenario of `bench/run_bench.py` R times on each side, code mode and the floor
(the bare workflow, with the same unsandboxed workflow runner), then replays every history; each of those four
phases is sampled by py-spy attached to this process (every thread, idle ones too, 500 samples a second).

Each sample is put on one part of the stack by its innermost Python frame and the source line it runs: a
line that calls into Monty (`resume`, `dump`, `load_snapshot`, `feed_start`, a checkout) is Monty's time, with
the sandbox process's own work (the thread waits on it with the GIL released); a frame in the data converter,
telemetry, protobuf, Temporal's workflow machinery or its bridge to the Rust core, our workflow code, pydantic-ai
or asyncio is that part's. A thread blocked on a queue, lock or selector is idle and left out, and so is a
thread with no Python frame (the SDK core's native threads) and the sandbox pool's own helper threads while they
wait for work; their waits on Monty (warming a session's checker, ending a session) are a row of their own, and so
is a workflow-task thread's hand-off of its finished activation to the event loop (`HAND_OFF`). It
prints one table: µs per nested call, by part (rows) and phase and thread kind (columns); `--raw DIR` keeps
py-spy's samples.

Sampling is statistical: a part below a few µs per call is noise. Times are those of `run_bench.py`'s scenario
and match its wall times within the sampling error; the ratios themselves are `run_bench.py`'s to report.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, Worker

from bench.floor import FLOOR_ACTIVITIES, FloorWorkflow
from bench.run_bench import CODEMODE_QUEUE, FLOOR_QUEUE, Bench, Kind, machine, make_agent, run_and_exit
from durable_codemode import CodeModeRunWorkflow, create_worker, start_dev_server
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode.worker._pool import GIVING_BACK_THREAD, WARMING_THREAD, shutdown_pool
from durable_codemode.worker._worker import workflow_runner

RATE = 500
"""Samples a second per thread."""

IDLE = "idle"
MONTY_CALLS: list[tuple[str, re.Pattern[str]]] = [
    ("monty: resume", re.compile(r"\.resume\(|resume_not_handled\(")),
    ("monty: dump / load", re.compile(r"\.dump\(|load_snapshot\(|load_session\(")),
    ("monty: feed", re.compile(r"feed_start\(|feed_run\(|\.feed\(")),
    ("monty: checkout / release", re.compile(r"checkout\(|__enter__\(|__exit__\(|\.close\(\)")),
]
PARTS: list[tuple[str, re.Pattern[str]]] = [
    (IDLE, re.compile(r"(^|/)(threading|queue|selectors)\.py|concurrent/futures/thread\.py")),
    ("data converter (pydantic, json)", re.compile(r"temporalio/converter|temporalio/contrib/pydantic|(^|/)pydantic/|"
                                                   r"pydantic_core|(^|/)json/|durable_codemode/_converter")),
    ("telemetry (opentelemetry)", re.compile(r"opentelemetry")),
    ("protobuf", re.compile(r"google/protobuf|_pb2")),
    ("temporalio workflow machinery", re.compile(r"temporalio/worker/_workflow|temporalio/workflow\.py")),
    ("temporalio bridge to the core", re.compile(r"temporalio/bridge")),
    ("temporalio activities, client, other", re.compile(r"temporalio/")),
    ("our workflow code", re.compile(r"durable_codemode/(workflow|shared)/")),
    ("our worker code (activities)", re.compile(r"durable_codemode/")),
    ("pydantic-ai", re.compile(r"pydantic_ai/")),
    ("asyncio", re.compile(r"(^|/)asyncio/")),
]
OTHER = "other (stdlib, bench)"
WARM_UP = "monty: warm-up, session end (helper threads)"
"""The pool's own threads (`_pool`): a fresh session's checker warmed while the model request is in flight, and
sessions ended off the workflow thread. Their waits on the sandbox process overlap other work; idle otherwise."""
HAND_OFF = "hand-off to the event loop (GIL)"
"""A workflow-task thread giving its finished activation back to the event loop (`call_soon_threadsafe`'s write to
the loop's socket), and taking the GIL back afterwards while the loop, just woken, runs: the thread has nothing left
to do for the activation then, so this is not on the run's path; it was "asyncio", most of that row's difference."""
ROWS = ([name for name, _ in MONTY_CALLS] + [WARM_UP, HAND_OFF] + [name for name, _ in PARTS if name != IDLE]
        + [OTHER])

HELPER_THREADS = (WARMING_THREAD, GIVING_BACK_THREAD)
_BLOCKING_LINE = re.compile(r"\.get\(\)|\.wait\(|\.acquire\(|time\.sleep\(")
"""A source line that blocks its thread (a queue, an event, a lock, a sleep), when it is the innermost frame."""

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")


@functools.cache
def _full_path(file: str) -> str:
    """py-spy names a module's file relative to the `sys.path` entry it was found in."""
    if os.path.isabs(file):
        return file
    for root in sys.path:
        candidate = os.path.join(root or ".", file)
        if os.path.exists(candidate):
            return candidate
    return file


def part_of(frame: str, thread: str = "") -> str:
    """The part of the stack an innermost frame `function (file:line)` of `thread` belongs to.

    A thread with no Python frame (py-spy names only the thread: the SDK core's and Monty's native threads,
    waiting) and a helper thread of the pool blocked on its queue are idle; a helper thread waiting on Monty is
    `WARM_UP`. (Before 2026-12-06 the pool's give-back thread, blocked on its queue all along, was counted as "our
    worker code" for the whole of every phase, code mode's and the floor's alike: ~13 ms a call.)
    """
    match = _FRAME.match(frame)
    if match is None:
        return IDLE
    file = match["file"]
    source = linecache.getline(_full_path(file), int(match["line"]))
    helper = any(name in thread for name in HELPER_THREADS)
    if "durable_codemode" in file or "pydantic_monty" in file:
        for name, call in MONTY_CALLS:
            if call.search(source):
                return WARM_UP if helper else name
        if _BLOCKING_LINE.search(source):
            return IDLE
    if "_write_to_self" in match["function"] and thread_kind(thread) == "workflow":
        return HAND_OFF
    if helper:
        return IDLE if any(pattern.search(file) for name, pattern in PARTS if name == IDLE) else WARM_UP
    for name, pattern in PARTS:
        if pattern.search(file):
            return name
    return OTHER


def thread_kind(thread: str) -> str:
    """`workflow` for the workflow-task threads (named by their executors), `loop` for the rest."""
    return "workflow" if "workflow-task" in thread else "loop"


def read_samples(path: Path) -> dict[str, dict[str, int]]:
    """py-spy's raw output as samples by thread kind and part."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        if any(frame.startswith("sampled (") for frame in frames):
            continue  # the sampler's own start (a blocking sleep while py-spy attaches)
        counts[thread_kind(frames[0])][part_of(frames[-1], frames[0])] += int(count)
    return counts


@asynccontextmanager
async def sampled(into: dict[str, dict[str, dict[str, int]]], phase: str,
                  keep: Path | None = None) -> AsyncIterator[None]:
    """Sample this process with py-spy for the block; the samples land in `into[phase]`.

    `keep`: a folder to copy py-spy's raw output into too, as `<phase>.txt`.
    """
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = Path(tempfile.mkdtemp()) / "samples.txt"
    process = subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--rate", str(RATE), "--idle",
                                "--threads", "--format", "raw", "--output", str(out), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches (a blocking sleep: nothing else of ours may run meanwhile)
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        if not out.exists():
            raise RuntimeError(f"py-spy wrote no samples ({err.decode(errors='replace').strip()}); on Linux it "
                               "needs ptrace: run as root, or set kernel.yama.ptrace_scope=0")
        into[phase] = read_samples(out)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(out, keep / f"{phase.replace(' ', '_')}.txt")


async def run(args: argparse.Namespace) -> int:
    kind: Kind = args.kind
    n: int = args.n
    print(machine(), flush=True)
    env = await start_dev_server(banner="off")
    samples: dict[str, dict[str, dict[str, int]]] = {}
    agents = [make_agent(kind, n)]
    cm_exec = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="cm-workflow-task")
    floor_exec = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="floor-workflow-task")
    try:
        client = env.client
        bench = Bench(client)
        histories: dict[str, list[WorkflowHistory]] = {"cm": [], "floor": []}
        cm_worker = create_worker(client, agents, task_queue=CODEMODE_QUEUE, workflow_task_executor=cm_exec)
        floor_worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow], activities=FLOOR_ACTIVITIES,
                              workflow_runner=workflow_runner(), workflow_task_executor=floor_exec)
        async with cm_worker, floor_worker:
            await bench.run_codemode(kind, n)  # warm-up, unmeasured: imports, the sandbox pool, pollers
            await bench.run_floor(kind, n)
            async with sampled(samples, "cm run", args.raw):
                for _ in range(args.reps):
                    histories["cm"].append((await bench.run_codemode(kind, n))[1])
            async with sampled(samples, "floor run", args.raw):
                for _ in range(args.reps):
                    histories["floor"].append((await bench.run_floor(kind, n))[1])
        replay_exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replay-workflow-task")
        for side, workflow_class in (("cm", CodeModeRunWorkflow), ("floor", FloorWorkflow)):
            replayer = Replayer(workflows=[workflow_class], data_converter=DATA_CONVERTER,
                                workflow_runner=workflow_runner(), workflow_task_executor=replay_exec)
            await replayer.replay_workflow(histories[side][0])  # warm-up
            async with sampled(samples, f"{side} replay", args.raw):
                for history in histories[side]:
                    await replayer.replay_workflow(history)
    finally:
        await env.shutdown()
        shutdown_pool()
    print(render(samples, runs=args.reps, calls=n, title=f"{kind}-{n}, {args.reps} run(s) and replays per side"))
    return 0


def render(samples: dict[str, dict[str, dict[str, int]]], *, runs: int, calls: int, title: str) -> str:
    """The one table: µs per nested call by part (rows), for each phase and thread kind (columns)."""
    headers = {("cm run", "workflow"): "cm run workflow", ("floor run", "workflow"): "floor run workflow",
               ("cm run", "loop"): "cm run loop", ("floor run", "loop"): "floor run loop",
               ("cm replay", "workflow"): "cm replay workflow", ("floor replay", "workflow"): "floor replay workflow",
               ("cm replay", "loop"): "cm replay loop", ("floor replay", "loop"): "floor replay loop"}
    columns = list(headers)

    def us(count: float) -> str:
        return f"{count / RATE / (runs * calls) * 1e6:.0f}"

    header = ["µs per nested call", *headers.values()]
    lines = [[row, *(us(samples[p][k].get(row, 0)) if k in samples[p] else "0" for p, k in columns)]
             for row in ROWS]
    lines.append(["total (idle left out)", *(us(sum(v for part, v in samples[p].get(k, {}).items() if part != IDLE))
                                            for p, k in columns)])
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def row(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([
        title, row(header), "-+-".join("-" * w for w in widths), *(row(line) for line in lines),
        "workflow = the workflow-task threads (activations, the sandbox); loop = every other Python thread (the event "
        f"loop: activities, the worker's polling and completions, the client); py-spy at {RATE} Hz, idle left out",
    ])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kind", choices=["gather", "sequential"], default="sequential")
    parser.add_argument("--n", type=int, default=200, help="nested calls per run")
    parser.add_argument("--reps", type=int, default=5, help="sampled runs (and replays) per side")
    parser.add_argument("--raw", type=Path, metavar="DIR", help="keep py-spy's raw samples of each phase in DIR")
    args = parser.parse_args(argv)
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
