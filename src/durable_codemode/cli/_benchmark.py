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
from durable_codemode.cli._benchmark import render_report, run_benchmark
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
import os
import platform
import re
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_ai.models import Model
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import Replayer

from .._bundled import bundled_apps
from .._outcome import EXIT_FAILED, EXIT_OK, run_failure_reason
from ..client._runs import start_run
from ..history._capture import failure_message
from ..shared._errors import CodeModeUserError
from ..testing import fetch_chain_histories
from ..worker._agent import CodeModeAgent
from ..worker._describe import describe_run
from ..worker._worker import create_worker, workflow_runner
from ..workflow._run import CodeModeRunWorkflow

if TYPE_CHECKING:
    from ..apps.workflows.tasks import Mode, Task

__all__ = [
    "MIN_MODEL_REQUESTS",
    "MODE_LABELS",
    "PLOT_INSTALL",
    "SCRIPTED_NOTE",
    "BenchRow",
    "Ratio",
    "add_bench_command",
    "bench_command",
    "check_model",
    "ratios",
    "render_report",
    "run_benchmark",
    "run_row",
    "summarize",
    "write_json",
    "write_plot",
]

MODE_LABELS: dict[str, str] = {"on": "code mode", "off": "tool calling"}
"""How tables and plots name the two modes."""

MIN_MODEL_REQUESTS = 200
"""Every row's run may make at least this many model requests. The default (50) stops a looping model in
production; here a model calling tools directly needs one request per batch of calls, and a row must grade the
model, not the limit."""

SCRIPTED_NOTE = (
    "models: scripted (pydantic-ai FunctionModels playing the model's part, offline). Code mode: the model writes "
    "the program once. Tool calling: the model sees every tool result and each turn issues every call it can "
    "decide from what it has seen, at most 10 per response. Tokens are estimates (pydantic-ai's, from the "
    "messages' text, plus the instructions and tool definitions every request carries), not a provider's bill."
)


@dataclass(kw_only=True)
class BenchRow:
    """One (task, mode, N) run and what it measured; `write_json` writes these as they are."""

    task: str
    apps: list[str]
    kind: str
    mode: str
    """`on` (code mode) or `off` (tool calling)."""
    n: int
    rep: int = 0
    """Which repetition (0-based); the tables show the median of a (task, mode, N)'s repetitions."""
    model: str = ""
    """The model's name as the run recorded it (`scripted-...` for the offline models)."""
    scripted: bool = True
    ok: bool = False
    """The oracle found no problem and no side effect ran twice."""
    problems: list[str] = field(default_factory=list)
    """The oracle's problems (at most the first 10)."""
    error: str | None = None
    """Why the row did not complete (setup, the run, or the measuring), if it did not."""
    run_id: str | None = None
    reply: str | None = None
    requests: int = 0
    input_tokens: int = 0
    """Of the scripted models: pydantic-ai's estimate from the messages' text, plus `definition_tokens`."""
    output_tokens: int = 0
    definition_tokens: int = 0
    """Of the scripted models: what every request also carries, the instructions and the tool definitions (in code
    mode, `run_code` with every tool's stub), estimated the same way, times the requests. A provider counts these
    as input; pydantic-ai's estimate for a `FunctionModel` does not, so the benchmark adds them."""
    wall_s: float = 0.0
    """From starting the run to its result (the worker was already polling)."""
    nested_calls: int = 0
    direct_calls: int = 0
    duplicate_effects: int = 0
    runs: int = 0
    """Runs of the continue-as-new chain (1 when it never continued as new)."""
    history_events: int = 0
    history_bytes: int = 0
    """Serialized protobuf bytes of every run's history (what the server stores), summed over the chain; with a
    payload store (`CODEMODE_PAYLOAD_STORE`), large payloads count as their references."""
    replay_ok: bool | None = None
    """Every run of the chain replayed offline without divergence; `None` when there was nothing to replay."""
    replay_error: str | None = None
    replay_s: float = 0.0

    @property
    def tokens(self) -> int:
        """Input plus output tokens: the cost measure of the ratios and the plot."""
        return self.input_tokens + self.output_tokens

    @property
    def passed(self) -> bool:
        """Graded correct and replayed."""
        return self.ok and self.error is None and self.replay_ok is True


@dataclass(kw_only=True)
class Ratio:
    """Code mode / tool calling for one task at one N; `None` where either row did not complete."""

    task: str
    n: int
    tokens: float | None
    wall: float | None
    requests: float | None
    history_bytes: float | None
    both_passed: bool


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
                        workflow_runner=workflow_runner(), debug_mode=True)  # offline: no deadlock detector
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
            verdict = "ok" if row.passed else f"FAILED ({_why(row)})"
            again = f" (repetition {rep + 1})" if reps > 1 else ""
            progress(f"[{i}/{len(plan)}] {task.name} N={n} {MODE_LABELS[mode]}{again}: {verdict}, {row.wall_s:.2f} s, "
                     f"{row.requests} requests, {row.tokens:,} tokens")
    return rows


def _why(row: BenchRow) -> str:
    if row.error:
        return row.error
    if row.problems:
        return row.problems[0] + (f" (+{len(row.problems) - 1} more)" if len(row.problems) > 1 else "")
    if row.replay_ok is False:
        return f"replay: {row.replay_error}"
    return "not replayed"


# -- ratios and tables -------------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


_MEDIAN_FIELDS = ("requests", "input_tokens", "output_tokens", "wall_s", "nested_calls", "direct_calls",
                  "duplicate_effects", "runs", "history_events", "history_bytes", "replay_s")


def summarize(rows: Sequence[BenchRow]) -> list[BenchRow]:
    """One row per (task, mode, N): the median of its repetitions that completed; failed if any repetition was.

    With one repetition each, the rows themselves.
    """
    groups: dict[tuple[str, str, int], list[BenchRow]] = {}
    for r in rows:
        groups.setdefault((r.task, r.mode, r.n), []).append(r)
    out: list[BenchRow] = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        done = [r for r in group if r.error is None] or group
        first_bad = next((r for r in group if not r.passed), None)
        merged = replace(done[0], rep=-1)
        for name in _MEDIAN_FIELDS:
            value = statistics.median(getattr(r, name) for r in done)
            setattr(merged, name, type(getattr(done[0], name))(value))
        merged.ok = all(r.ok for r in group)
        merged.error = next((r.error for r in group if r.error), None)
        merged.problems = first_bad.problems if first_bad else []
        replays = [r.replay_ok for r in group]
        merged.replay_ok = False if False in replays else None if None in replays else True
        merged.replay_error = next((r.replay_error for r in group if r.replay_error), None)
        out.append(merged)
    return out


def ratios(rows: Sequence[BenchRow]) -> list[Ratio]:
    """Code mode / tool calling per task and N (medians over repetitions), where both sides ran to a result."""
    by_key = {(r.task, r.n, r.mode): r for r in summarize(rows)}
    out: list[Ratio] = []
    for task, n in dict.fromkeys((r.task, r.n) for r in rows):
        on, off = by_key.get((task, n, "on")), by_key.get((task, n, "off"))
        if on is None or off is None:
            continue
        done = on.error is None and off.error is None
        out.append(Ratio(
            task=task, n=n,
            tokens=_ratio(on.tokens, off.tokens) if done else None,
            wall=_ratio(on.wall_s, off.wall_s) if done else None,
            requests=_ratio(on.requests, off.requests) if done else None,
            history_bytes=_ratio(on.history_bytes, off.history_bytes) if done else None,
            both_passed=on.passed and off.passed,
        ))
    return out


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


def _table(header: Sequence[str], lines: Sequence[Sequence[str]], left: int = 2) -> list[str]:
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def render(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [render(header), "  ".join("-" * w for w in widths), *(render(line) for line in lines)]


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fmt_bytes(n: int) -> str:
    return f"{n / 1024:,.0f} KiB" if n < 10 * 1024 * 1024 else f"{n / 1024 / 1024:,.1f} MiB"


def _fmt_ratio(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}x" if value < 0.1 else f"{value:.2f}x"


def render_report(rows: Sequence[BenchRow]) -> str:
    """The tables: one per N (a row per task and mode), then the code mode / tool calling ratios, then failures.

    With repetitions, every number is the median over them, and a (task, mode, N) passed only if each did.
    """
    out: list[str] = []
    reps = max((r.rep for r in rows), default=0) + 1
    raw, rows = rows, summarize(rows)
    if rows and all(r.scripted for r in rows):
        out += [*textwrap.wrap(SCRIPTED_NOTE, 116), ""]
    elif rows:
        out += [f"model: {', '.join(sorted({r.model for r in rows}))}", ""]
    header = ["task", "mode", "ok", "requests", "input tok", "output tok", "wall", "nested", "direct", "runs",
              "events", "history", "replay"]
    for n in sorted({r.n for r in rows}):
        lines = []
        for r in (r for r in rows if r.n == n):
            done = r.error is None
            lines.append([
                r.task, MODE_LABELS.get(r.mode, r.mode), "yes" if r.ok and done else "NO",
                str(r.requests) if done else "—", f"{r.input_tokens:,}" if done else "—",
                f"{r.output_tokens:,}" if done else "—", _fmt_s(r.wall_s) if done else "—",
                str(r.nested_calls), str(r.direct_calls), str(r.runs), f"{r.history_events:,}",
                _fmt_bytes(r.history_bytes),
                {True: f"ok {_fmt_s(r.replay_s)}", False: "DIVERGED", None: "—"}[r.replay_ok],
            ])
        out += [f"N = {n}", *_table(header, lines), ""]
    pairs = ratios(rows)
    if pairs:
        out.append("code mode / tool calling (below 1: code mode costs less)")
        out += _table(["task", "N", "tokens", "wall time", "requests", "history bytes", "both ok"], [
            [p.task, str(p.n), _fmt_ratio(p.tokens), _fmt_ratio(p.wall), _fmt_ratio(p.requests),
             _fmt_ratio(p.history_bytes), "yes" if p.both_passed else "NO"] for p in pairs
        ], left=1)
        out.append("")
    if reps > 1:
        out.append(f"medians of {reps} repetitions (the order of the modes alternating)")
    failed = [r for r in raw if not r.passed]
    out.append(f"{len(raw) - len(failed)}/{len(raw)} rows passed (graded by the task's oracle, no duplicate side "
               "effect, history replayed)")
    for r in failed:
        out.append(f"  FAILED {r.task} N={r.n} {MODE_LABELS.get(r.mode, r.mode)}: {_why(r)}")
    return "\n".join(out)


# -- outputs -----------------------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    return {d: version(d) for d in ("durable-codemode", "temporalio", "pydantic-monty", "pydantic-ai-slim")}


def write_json(rows: Sequence[BenchRow], path: str | os.PathLike[str], *, server: str = "") -> None:
    """Write the raw rows, the ratios and where they were measured to `path` as JSON."""
    document = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpu_count": os.cpu_count(), **_versions()},
        "server": server,
        "scripted": all(r.scripted for r in rows),
        "reps": max((r.rep for r in rows), default=0) + 1,
        "note": SCRIPTED_NOTE if all(r.scripted for r in rows) else "",
        "rows": [{**asdict(r), "tokens": r.tokens, "passed": r.passed} for r in rows],
        "medians": [{**asdict(r), "tokens": r.tokens, "passed": r.passed} for r in summarize(rows)],
        "ratios": [asdict(p) for p in ratios(rows)],
    }
    Path(path).write_text(json.dumps(document, indent=2) + "\n")


PLOT_INSTALL = "pip install 'durable-codemode[bench]' (or: pip install matplotlib)"
"""How to get the plot's one dependency."""


def write_plot(rows: Sequence[BenchRow], path: str | os.PathLike[str]) -> None:
    """Plot cost (tokens) and wall time against N for both modes, one line per task and mode, to a PNG.

    Raises:
        CodeModeUserError: matplotlib is not installed (the message says how to install it).

    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed, and none is wanted from a command line
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise CodeModeUserError(f"the plot needs matplotlib: {PLOT_INSTALL}") from e
    done = [r for r in summarize(rows) if r.error is None]
    tasks = list(dict.fromkeys(r.task for r in done))
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 2, figsize=(13, 6.2))
    panels: list[tuple[Any, str, Callable[[BenchRow], float]]] = [
        (axes[0], "cost: input + output tokens", lambda r: float(r.tokens)),
        (axes[1], "wall time (s)", lambda r: r.wall_s),
    ]
    for ax, label, value in panels:
        for i, task in enumerate(tasks):
            for mode, style, marker in (("on", "-", "o"), ("off", "--", "s")):
                points = sorted((r.n, value(r)) for r in done if r.task == task and r.mode == mode)
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], linestyle=style, marker=marker,
                            color=colors(i % 10), label=f"{task}, {MODE_LABELS[mode]}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ns = sorted({r.n for r in done})
        ax.set_xticks(ns, [str(n) for n in ns])  # the N that ran, not powers of ten
        ax.minorticks_off()
        ax.set_xlabel("N (records)")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, max(1, len(labels))), fontsize=8,
               title="solid: code mode, dashed: tool calling", title_fontsize=8)
    scripted = all(r.scripted for r in rows)
    models = "scripted models" if scripted else ", ".join(sorted({r.model for r in rows}))
    fig.suptitle(f"durable-codemode: code mode vs tool calling ({models}), log-log")
    legend_rows = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * legend_rows, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
