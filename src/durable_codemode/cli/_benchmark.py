"""The code-mode benchmark: the bundled tasks in both modes at several N, graded by their oracles (`codemode bench`).

Each row is one (task, mode, N): a fresh instance seeded in a temporary directory, run on a worker with a fresh
task queue, graded with `Instance.check(reply)`, then measured from the run's result and its history: model
requests and tokens (pydantic-ai usage), wall time, nested and direct tool calls, history events and bytes summed
over the continue-as-new chain, and an offline replay of every run of the chain. A row that fails in any way
(setup, the run, the oracle, the replay) is recorded as a failed row with the reason; the table goes on.

Offline, the model's part is played by the tasks' scripted models (see `workflows.tasks`), named as scripted in
every output: their token counts are pydantic-ai's estimate from the messages' text, which shows how tool
calling's context grows with N, not what a provider would bill. With `model="openai:gpt-5"` (and its key) the same
instances run with that model.

```python
from durable_codemode import start_dev_server
from durable_codemode.cli._benchmark import run_benchmark
from durable_codemode.cli._benchmark_report import render_report
from durable_codemode.apps.workflows import all_tasks

async with await start_dev_server() as env:
    rows = await run_benchmark(env.client, all_tasks(), sizes=[5, 20], modes=["on", "off"])
print(render_report(rows))
```
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_ai.models import Model
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import Replayer

from .._bundled import bundled_apps
from .._outcome import EXIT_FAILED, EXIT_OK, run_failure_reason
from ..client._runs import start_run
from ..history._capture import REPLAY_BUILD_ID, failure_message
from ..shared._errors import CodeModeUserError
from ..testing import fetch_chain_histories
from ..worker._agent import CodeModeAgent
from ..worker._describe import describe_run
from ..worker._worker import create_worker, workflow_runner
from ..workflow._run import CodeModeRunWorkflow
from ._benchmark_report import MODE_LABELS, PLOT_INSTALL, BenchRow, render_report, why, write_json, write_plot

if TYPE_CHECKING:
    from ..apps.workflows.tasks import Mode, Task

__all__ = [
    "MIN_MODEL_REQUESTS",
    "add_bench_command",
    "bench_command",
    "check_model",
    "run_benchmark",
    "run_row",
]

MIN_MODEL_REQUESTS = 200
"""Every row's run may make at least this many model requests. The default (50) stops a looping model in
production; here a model calling tools directly needs one request per batch of calls, and a row must grade the
model, not the limit."""


def _model_name(model: Model | str) -> str:
    return model.model_name if isinstance(model, Model) else str(model)


def _error_text(error: BaseException) -> str:
    if isinstance(error, WorkflowFailureError):
        return f"the run failed: {run_failure_reason(error)}"
    if isinstance(error, TimeoutError):
        return f"timed out: {error}" if str(error) else "timed out"
    return f"{type(error).__name__}: {error}"


def check_model(model: str) -> None:
    """Fail before anything starts when `model` cannot be built here (unknown, its package or its key missing).

    Raises:
        CodeModeUserError: what is missing and how to provide it.

    """
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.models import infer_model

    try:
        infer_model(model)
    except (UserError, ImportError, ValueError) as e:
        raise CodeModeUserError(
            f"cannot use --model {model!r}: {e} (give a pydantic-ai model string such as openai:gpt-5 and set its "
            "provider's API key, e.g. OPENAI_API_KEY=...; without --model the scripted models run offline)"
        ) from e


async def _replay(histories: Sequence[Any], client: Client) -> tuple[bool, str | None, float]:
    # The client's converter, so runs whose large payloads live in a payload store replay too.
    replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=client.data_converter,
                        workflow_runner=workflow_runner(), debug_mode=True,  # offline: no deadlock detector
                        build_id=REPLAY_BUILD_ID)
    started = time.perf_counter()
    try:
        for history in histories:
            await replayer.replay_workflow(history)
    except Exception as e:
        return False, failure_message(e), time.perf_counter() - started
    return True, None, time.perf_counter() - started


async def _measure_history(row: BenchRow, handle: WorkflowHandle[Any, Any]) -> None:
    histories = await fetch_chain_histories(handle)
    row.runs = len(histories)
    row.history_events = sum(len(h.events) for h in histories)
    row.history_bytes = sum(History(events=list(h.events)).ByteSize() for h in histories)
    client = handle._client  # not pydantic-ai: temporalio's WorkflowHandle keeps its client private
    row.replay_ok, row.replay_error, row.replay_s = await _replay(histories, client)


async def run_row(
    client: Client, task: Task, mode: Mode, n: int, *, model: str | None = None, timeout: float = 600.0
) -> BenchRow:
    """Seed, run, grade and measure one (task, mode, N); never raises for the row's own failure.

    Args:
        client: A client of the server to run on; a worker is started on a fresh task queue for this row.
        task: The task (see `workflows.tasks.Task`).
        mode: `on` (code mode) or `off` (tool calling).
        n: The task's N (its record count).
        model: A pydantic-ai model string; `None`: the task's scripted model for `mode`.
        timeout: Seconds to wait for the run's result before terminating it and failing the row.

    """
    row = BenchRow(task=task.name, apps=list(task.apps), kind=task.kind, mode=mode, n=n, scripted=model is None)
    with tempfile.TemporaryDirectory(prefix="codemode-bench-") as tmp:
        handle: WorkflowHandle[Any, Any] | None = None
        try:
            instance = task.setup(Path(tmp), n)
            agent = instance.agent(mode, model)
            if agent.limits.max_model_requests < MIN_MODEL_REQUESTS:
                agent.limits = replace(agent.limits, max_model_requests=MIN_MODEL_REQUESTS)
            row.model = _model_name(agent.agent.model) if agent.agent.model is not None else (model or "")
            task_queue = f"bench-{uuid.uuid4().hex[:10]}"
            async with create_worker(client, [agent], task_queue=task_queue):
                started = time.perf_counter()
                handle = await start_run(client, agent.name, instance.prompt, task_queue=task_queue,
                                         run_id=f"bench-{task.name}-{mode}-{n}-{uuid.uuid4().hex[:8]}")
                row.run_id = handle.id
                try:
                    result = await asyncio.wait_for(handle.result(), timeout)
                except TimeoutError:
                    await handle.terminate(f"codemode bench: no result within {timeout:g} s")
                    raise TimeoutError(f"no result within {timeout:g} s; the run was terminated") from None
                row.wall_s = time.perf_counter() - started
            row.reply = result.output
            row.requests = result.usage.requests
            row.input_tokens = result.usage.input_tokens
            row.output_tokens = result.usage.output_tokens
            if row.scripted:
                row.definition_tokens = row.requests * await _definition_tokens(agent)
                row.input_tokens += row.definition_tokens
            row.nested_calls = len(result.nested_calls)
            row.direct_calls = len(result.direct_calls)
            problems = instance.check(result.output)
            row.duplicate_effects = instance.duplicate_effects()
            if row.duplicate_effects:
                problems.append(f"{row.duplicate_effects} side effects ran more than once")
            row.problems = problems[:10]
            row.ok = not problems
        except Exception as e:
            row.error = _error_text(e)
        if handle is not None:
            try:
                await _measure_history(row, handle)
            except Exception as e:
                row.error = row.error or f"measuring the history: {_error_text(e)}"
    return row


async def run_benchmark(
    client: Client,
    tasks: Iterable[Task],
    *,
    modes: Sequence[Mode] = ("on", "off"),
    sizes: Sequence[int] | None = None,
    model: str | None = None,
    timeout: float = 600.0,
    warmup: bool = True,
    reps: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """Run every task at every N in every mode; one `BenchRow` each, failed rows included.

    Args:
        client: The server's client.
        tasks: The tasks, e.g. `workflows.all_tasks()`.
        modes: `on` (code mode) and/or `off` (tool calling).
        sizes: The N to run every task at; `None`: each task's own `sizes`.
        model: A pydantic-ai model string for every row (check it first with `check_model`); `None`: scripted.
        timeout: Seconds per row (see `run_row`).
        warmup: First run the first task at its smallest N once per mode, unrecorded, so the first measured row
            does not pay for imports, the sandbox pool and the pollers starting.
        reps: Run every (task, N, mode) this many times, the modes' order alternating per repetition (shared
            machines are noisy: `summarize` takes the medians).
        progress: Called with one line per finished row.

    """
    tasks = list(tasks)
    plan = [(task, n, mode, rep) for rep in range(reps) for task in tasks for n in (sizes or task.sizes)
            for mode in (modes if rep % 2 == 0 else list(reversed(modes)))]
    if warmup and tasks and model is None:
        for mode in modes:
            await run_row(client, tasks[0], mode, min(sizes or tasks[0].sizes), timeout=timeout)
    rows: list[BenchRow] = []
    for i, (task, n, mode, rep) in enumerate(plan, start=1):
        row = await run_row(client, task, mode, n, model=model, timeout=timeout)
        row.rep = rep
        rows.append(row)
        if progress is not None:
            verdict = "ok" if row.passed else f"FAILED ({why(row)})"
            again = f" (repetition {rep + 1})" if reps > 1 else ""
            progress(f"[{i}/{len(plan)}] {task.name} N={n} {MODE_LABELS[mode]}{again}: {verdict}, {row.wall_s:.2f} s, "
                     f"{row.requests} requests, {row.tokens:,} tokens")
    return rows


_TOKEN_SPLIT = re.compile(r'[\s",.:]+')


def _estimate_tokens(text: str) -> int:
    """pydantic-ai's test-model estimate: pieces split on whitespace and punctuation."""
    return len(_TOKEN_SPLIT.split(text.strip())) if text.strip() else 0


async def _definition_tokens(agent: CodeModeAgent) -> int:
    """The estimated tokens of what each request carries besides the messages: instructions and tool definitions."""
    spec = await describe_run(agent)
    tools = sum(_estimate_tokens(f"{t.name} {t.description or ''} {json.dumps(t.parameters_json_schema)}")
                for t in spec.model_tools)
    return _estimate_tokens(spec.instructions or "") + tools


# -- the command ---------------------------------------------------------------------------------------------------


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas (5,20,50), got {text!r}") \
            from None
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"every N must be 2 or more, got {text!r}")
    return sorted(set(sizes))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return value


def _modes(text: str) -> list[Mode]:
    modes = _csv(text)
    bad = [m for m in modes if m not in MODE_LABELS]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"modes are 'on' (code mode) and 'off' (tool calling), got {text!r}")
    return [m for m in ("on", "off") if m in modes]


def add_bench_command(commands: Any) -> None:
    """Register `codemode bench` on the CLI's subparsers."""
    bench = commands.add_parser(
        "bench", help="code mode vs tool calling on the bundled tasks, graded by their oracles",
        description="Run the bundled apps' tasks in code mode and with code mode off (tool calling) at several N, "
        "grade every run with the task's oracle, replay its history, and print one table per N and the code mode / "
        "tool calling ratios. Offline by default: scripted models play the model's part. Runs on an embedded dev "
        "server unless TEMPORAL_ADDRESS is set.")
    bench.add_argument("--apps", type=_csv, metavar="A,B", help="only tasks over these apps (e.g. cart)")
    bench.add_argument("--tasks", type=_csv, metavar="T,U", help="only these tasks (see --list)")
    bench.add_argument("--n", type=_sizes, metavar="5,20,50,100,200",
                       help="run every selected task at these N (default: each task's own sizes: 5,20,50,100,200 "
                       "for scaling tasks, the record counts for long-horizon ones)")
    bench.add_argument("--mode", type=_modes, default=["on", "off"], metavar="on,off",
                       help="on: code mode; off: tool calling (default: both)")
    bench.add_argument("--model", help="a pydantic-ai model string (e.g. openai:gpt-5; needs its API key); "
                       "default: the scripted models, offline")
    bench.add_argument("--json", metavar="PATH", help="write the raw rows and ratios as JSON")
    bench.add_argument("--plot", metavar="PATH.png", help=f"plot cost and wall time against N (needs matplotlib: "
                       f"{PLOT_INSTALL})")
    bench.add_argument("--timeout", type=float, default=600.0, metavar="S",
                       help="seconds per row before its run is terminated (default: 600)")
    bench.add_argument("--reps", type=_positive, default=1, metavar="R",
                       help="run every row R times and report medians (default: 1)")
    bench.add_argument("--list", action="store_true", help="list the bundled tasks and exit")
    bench.set_defaults(handler=bench_command)


def _select(args: argparse.Namespace) -> list[Task]:
    with bundled_apps("codemode bench"):
        from ..apps.workflows import all_tasks

    tasks = all_tasks()
    known_apps = sorted({app for t in tasks for app in t.apps})
    if args.apps:
        unknown = [a for a in args.apps if a not in known_apps]
        if unknown:
            raise CodeModeUserError(f"no bundled app {', '.join(unknown)}; the apps are {', '.join(known_apps)}")
        tasks = [t for t in tasks if set(t.apps) & set(args.apps)]
    if args.tasks:
        names = [t.name for t in tasks]
        unknown = [name for name in args.tasks if name not in names]
        if unknown:
            raise CodeModeUserError(f"no such task {', '.join(unknown)}"
                                    + (" among the selected apps" if args.apps else "")
                                    + f"; the tasks are {', '.join(names)} (`codemode bench --list`)")
        tasks = [t for t in tasks if t.name in args.tasks]
    return tasks


async def bench_command(args: argparse.Namespace) -> int:
    """`codemode bench`: exit 0 when every row passed, 1 when one did not, 2 on a usage error."""
    from ..client._connect import configured_address, connect
    from ..client._devserver import start_dev_server

    def say(text: str = "") -> None:
        print(text, flush=True)

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    tasks = _select(args)
    if args.list:
        for t in tasks:
            say(f"{t.name}  ({t.kind}, apps {', '.join(t.apps)}, N {','.join(map(str, t.sizes))})  {t.description}")
        return EXIT_OK
    if args.model:
        check_model(args.model)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        progress(f"codemode: warning: --plot needs matplotlib ({PLOT_INSTALL}); the tables and --json are still "
                 "written")
    if configured_address():
        client = await connect()
        server = f"{client.service_client.config.target_host} (TEMPORAL_ADDRESS or the Temporal profile)"
        rows = await _bench_on(client, tasks, args, server, progress)
    else:
        env = await start_dev_server(banner="off")  # stdout is for the tables
        async with env:
            server = f"embedded dev server at {env.client.service_client.config.target_host}"
            rows = await _bench_on(env.client, tasks, args, server, progress)
    say(render_report(rows))
    if args.json:
        write_json(rows, args.json, server=server)
        say(f"\nrows written to {args.json}")
    if args.plot:
        try:
            write_plot(rows, args.plot)
            say(f"plot written to {args.plot}")
        except CodeModeUserError as e:
            progress(f"codemode: no plot: {e}")
    return EXIT_OK if rows and all(r.passed for r in rows) else EXIT_FAILED


async def _bench_on(
    client: Client, tasks: Sequence[Task], args: argparse.Namespace, server: str, progress: Callable[[str], None]
) -> list[BenchRow]:
    sizes = args.n
    count = sum(len(sizes or t.sizes) for t in tasks) * len(args.mode) * args.reps
    who = args.model or "scripted models"
    progress(f"codemode bench: {len(tasks)} tasks, {count} rows, {who}, on the {server}")
    return await run_benchmark(client, tasks, modes=args.mode, sizes=sizes, model=args.model,
                               timeout=args.timeout, reps=args.reps, progress=progress)
