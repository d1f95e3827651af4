"""Replay runs offline and, when one diverges, say where and why in the terms of the run.

Temporal's replayer reports a divergence as core's one-liner about an activity id or a state machine;
`_divergence` turns it into what a person acts on: the model turn, the `run_code` snippet, the source line and
the nested call, the recorded side against the replayed one, and the likely cause with what to do.

Replays use what the run recorded (the agent spec with its tools, stubs and limits), never the worker's current
configuration, so a deploy that changes an agent's limits does not change how old runs replay: that is by
design. What can change a replay is the workflow code (this library's version), the Monty runtime, an approval
rule, or the machine's speed against the wall-time limits.

Two divergences are expected and reported as such, not as failures: a run whose snippet crashed the sandbox
(the crash does not happen again on replay, so the replay goes on where the run continued as new) and a run
whose snippet hit its wall-time limit but finishes within it on a faster replay. Both ended that same workflow
task by continue-as-new, so no open run ever replays them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from temporalio.client import Client, WorkflowExecution, WorkflowHistory
from temporalio.runtime import Runtime

from .._history_fetch import fetch_chain, fetch_history, resolve_stored
from ..shared._config import SnippetLimits
from ..shared._errors import CodeModeUserError
from ..shared._names import WORKFLOW_TYPE
from ..shared._results import preview, printable
from ..worker._agent import CodeModeAgent
from ..workflow._approval_state import serve, served_agent, served_agents
from ._capture import replay_history
from ._divergence import CallSide, Divergence, divergence
from ._read import parse_histories

__all__ = [
    "ReplayReport",
    "RunReplay",
    "import_agents",
    "load_agents",
    "register_agents",
    "render_replay",
    "render_replay_table",
    "replay_histories",
    "replay_recent",
    "replay_run",
]


@dataclass(kw_only=True)
class RunReplay:
    """The replay of one workflow run."""

    workflow_id: str
    run_id: str
    agent: str | None = None
    status: str = ""
    """The run's status in its history (`running`, `completed`, ...)."""
    model_turns: int = 0
    snippets: int = 0
    nested_calls: int = 0
    direct_calls: int = 0
    limits: SnippetLimits | None = None
    divergence: Divergence | None = None

    @property
    def verdict(self) -> Literal["ok", "expected", "diverged", "not_replayed"]:
        """`not_replayed`: the replay could not run this far for want of something (the agents' approval rules)."""
        if self.divergence is None:
            return "ok"
        if self.divergence.cause in ("approval_rule_unknown", "behavior_version_unsupported"):
            return "not_replayed"
        return "expected" if self.divergence.expected else "diverged"


@dataclass(kw_only=True)
class ReplayReport:
    """The replay of a run: every run of its chain that was given."""

    workflow_id: str
    runs: list[RunReplay] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every run replayed, and none diverged other than in the expected ways."""
        return all(r.verdict in ("ok", "expected") for r in self.runs)

    @property
    def needs_agents(self) -> bool:
        """Some run could not be replayed without the agents' approval rules (`--worker MODULE`)."""
        return any(r.verdict == "not_replayed" for r in self.runs)

    @property
    def model_turns(self) -> int:
        return sum(r.model_turns for r in self.runs)

    @property
    def snippets(self) -> int:
        return sum(r.snippets for r in self.runs)

    @property
    def nested_calls(self) -> int:
        return sum(r.nested_calls for r in self.runs)

    @property
    def divergences(self) -> list[Divergence]:
        return [r.divergence for r in self.runs if r.divergence is not None]


# -- agents for approval rules -------------------------------------------------------------------------------


def register_agents(agents: Iterable[CodeModeAgent]) -> list[str]:
    """Make `agents` known to workflow code in this process, as `create_worker` does for a worker.

    A replay needs this only for agents with an `approval_rule`: the rule decides, on replay as when the run ran,
    whether a call waits for a person. Returns the agents' names.
    """
    names = []
    for agent in agents:
        serve(agent)
        names.append(agent.name)
    return names


def load_agents(module_name: str) -> list[str]:
    """Import `module_name` (what `--worker MODULE` names) and register the agents it defines.

    The agents are its `agents()` function's result if it has one (the bundled `workflows.cart` does), else its
    module-level `CodeModeAgent` values; a module may also call `register_agents` itself. The current directory is
    importable, as it is for `python worker.py`.

    Raises:
        CodeModeUserError: the module cannot be imported, or defines no agent.

    """
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    before = served_agents()
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise CodeModeUserError(f"cannot import worker module {module_name!r}: {type(e).__name__}: {e}") from e
    found: list[CodeModeAgent] = []
    factory = getattr(module, "agents", None)
    if callable(factory):
        found = [a for a in factory() if isinstance(a, CodeModeAgent)]
    else:
        found = [v for v in vars(module).values() if isinstance(v, CodeModeAgent)]
    names = register_agents(found)
    names += sorted(served_agents() - before - set(names))
    if not names:
        raise CodeModeUserError(
            f"worker module {module_name!r} defines no CodeModeAgent: give it an `agents()` function returning "
            "them, module-level agents, or call durable_codemode.debugging.register_agents(...) in it"
        )
    return names


def import_agents(module_name: str) -> list[CodeModeAgent]:
    """The agents `module_name` defines (as `load_agents` finds and registers them), for checks that read them."""
    found = [served_agent(name) for name in load_agents(module_name)]
    return [a for a in found if isinstance(a, CodeModeAgent)]


async def _replay_one(history: WorkflowHistory, runtime: Runtime | None) -> RunReplay:
    capture = await replay_history(history, runtime=runtime)
    trace = parse_histories([history], captures=[capture])
    run = RunReplay(workflow_id=history.workflow_id, run_id=history.run_id, agent=trace.agent, status=trace.status,
                    model_turns=capture.model_requests, snippets=len(capture.snippets),
                    nested_calls=capture.nested_calls, direct_calls=capture.direct_calls, limits=trace.limits)
    if capture.failure is not None:
        run.divergence = divergence(history, capture, trace)
    return run


async def replay_histories(histories: Sequence[WorkflowHistory], *, runtime: Runtime | None = None) -> ReplayReport:
    """Replay histories (one run, or a chain first to last) offline, without a server and without any activity.

    Returns a report; it never raises for a divergence (check `report.ok`).

    Raises:
        CodeModeUserError: no history was given.

    """
    if not histories:
        raise CodeModeUserError("no history to replay")
    report = ReplayReport(workflow_id=histories[0].workflow_id)
    for history in await resolve_stored(histories):
        report.runs.append(await _replay_one(history, runtime))
    return report


async def replay_run(client: Client, workflow_id: str, *, runtime: Runtime | None = None) -> ReplayReport:
    """Fetch every run of `workflow_id`'s chain from the server and replay them offline.

    Raises:
        RunNotFoundError: no such run.

    """
    return await replay_histories(await fetch_chain(client, workflow_id), runtime=runtime)


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


async def replay_recent(
    client: Client,
    *,
    since: timedelta | None = timedelta(hours=24),
    query: str | None = None,
    limit: int = 200,
    runtime: Runtime | None = None,
) -> list[RunReplay]:
    """Replay the recent runs of the server, each workflow run on its own: the check before deploying a worker.

    Args:
        client: The server's client.
        since: Only runs started this long ago or later; `None`: all.
        query: A visibility query ANDed with the rest, e.g. `"TaskQueue = 'cart'"` or `"ExecutionStatus =
            'Running'"`.
        limit: At most this many runs, newest first.
        runtime: The Temporal runtime to replay with (the CLI passes a quiet one).

    """
    clauses = [f"WorkflowType = {_quote(WORKFLOW_TYPE)}"]
    if since is not None:
        start = (datetime.now(UTC) - since).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        clauses.append(f"StartTime >= {_quote(start)}")
    if query:
        clauses.append(f"({query})")
    executions: list[WorkflowExecution] = [e async for e in client.list_workflows(" AND ".join(clauses), limit=limit)]
    replays = []
    for execution in executions:
        history = await fetch_history(client, execution.id, run_id=execution.run_id)
        replays.append(await _replay_one(history, runtime))
    return replays


# -- reports -------------------------------------------------------------------------------------------------


def _counts(run: RunReplay) -> str:
    def n(count: int, word: str) -> str:
        return f"{count} {word}{'' if count == 1 else 's'}"

    text = f"{n(run.model_turns, 'model turn')}, {n(run.snippets, 'snippet')}, {n(run.nested_calls, 'nested call')}"
    if run.direct_calls:
        text += f", {n(run.direct_calls, 'direct call')}"
    return text


def _where(div: Divergence) -> str:
    parts = []
    if div.turn is not None:
        parts.append(f"model turn {div.turn}")
    if div.snippet:
        parts.append(f"snippet {div.snippet}")
    if div.line:
        parts.append(f"line {div.line}" + (" (found by the tool's name)" if div.line_guessed else ""))
    if div.call_id:
        parts.append(f"call {div.call_id}")
    return ", ".join(parts)


def _side(label: str, side: CallSide | None) -> str:
    if side is None:
        return f"  {label:<9} (nothing)"
    where = []
    if side.activity_type:
        where.append(f"activity {side.activity_type}")
    if side.activity_id:
        where.append(f"id {side.activity_id}")
    if side.event_id:
        where.append(f"event {side.event_id}")
    return f"  {label:<9} {side.what}" + (f"   [{', '.join(where)}]" if where else "")


def render_replay(report: ReplayReport) -> str:
    """The report as text: one line per run, then for each divergence where, what and why."""
    lines: list[str] = []
    total = len(report.runs)
    for i, run in enumerate(report.runs, 1):
        of = f" (run {i} of {total}, {run.run_id})" if total > 1 else f" ({run.run_id})"
        if run.verdict == "ok":
            lines.append(f"replay of {run.workflow_id}{of}: ok, {_counts(run)}, {run.status}")
            continue
        div = run.divergence
        assert div is not None
        verdict = {"expected": "expected divergence", "not_replayed": "NOT REPLAYED"}.get(run.verdict, "DIVERGED")
        lines.append(f"replay of {run.workflow_id}{of}: {verdict}")
        where = _where(div)
        if where:
            lines.append(f"  {'where':<9} {where}")
        if div.source_line is not None and div.line:
            lines.append(f"  {'':<9} {div.line} │ {div.source_line.strip()}")
        if div.recorded is not None:
            lines.append(_side("recorded", div.recorded))
            lines.append(_side("replayed", div.replayed))
        if div.replayed_result and div.replayed_result != div.recorded_result:
            lines.append(f"  {'snippet':<9} returned {preview(div.recorded_result or '(nothing yet)', 150)} when it "
                         f"ran; {preview(div.replayed_result, 150)} on replay")
        lines.append(f"  {'cause':<9} {div.explanation}")
        lines.append(f"  {'Temporal':<9} {preview(div.message, 400)}")
    if report.ok:
        runs = f"{total} run{'s' if total != 1 else ''}"
        counts = _counts(RunReplay(workflow_id="", run_id="", model_turns=report.model_turns,
                                   snippets=report.snippets, nested_calls=report.nested_calls))
        lines.append(f"replayed {runs} offline with the recorded agent specs and limits; no activity ran: {counts}")
    return _text(lines)


def _text(lines: Sequence[str]) -> str:
    """`lines` as the report's text: each one line, with what a terminal would act on escaped (`printable`)."""
    return "\n".join(printable(line) for line in lines)


def render_replay_table(replays: Sequence[RunReplay]) -> str:
    """A table of many replays (`codemode replay --all`), then the details of each divergence."""
    if not replays:
        return "no runs matched"
    rows = [("run", "run id", "agent", "status", "replay")]
    for r in replays:
        if r.divergence is None:
            outcome = f"ok ({_counts(r)})"
        else:
            label = {"expected": "expected", "not_replayed": "NOT REPLAYED"}.get(r.verdict, "DIVERGED")
            outcome = f"{label}: {r.divergence.cause.replace('_', ' ')}" + (
                f" at {_where(r.divergence)}" if _where(r.divergence) else "")
        rows.append((printable(r.workflow_id), r.run_id[:8], printable(r.agent or "?"), r.status.replace("_", "-"),
                     outcome))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)) for row in rows]
    diverged = [r for r in replays if r.verdict in ("diverged", "not_replayed")]
    counts = {v: sum(1 for r in replays if r.verdict == v) for v in ("ok", "expected", "diverged", "not_replayed")}
    lines.append(f"{len(replays)} runs: {counts['ok']} replayed cleanly, {counts['expected']} expected divergences, "
                 f"{counts['diverged']} diverged, {counts['not_replayed']} not replayed (need --worker MODULE)")
    for r in diverged:
        lines.append("")
        lines += render_replay(ReplayReport(workflow_id=r.workflow_id, runs=[r])).split("\n")
    return _text(lines)
