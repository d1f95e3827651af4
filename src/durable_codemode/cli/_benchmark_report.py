"""What the code-mode benchmark's rows come to: medians, ratios of the two modes, the table, the JSON and the plot.

`_benchmark` runs the rows (`codemode bench`); this module only reads them, so a report can be redrawn from a
`write_json` file without running anything.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..shared._errors import CodeModeUserError

__all__ = [
    "MODE_LABELS",
    "PLOT_INSTALL",
    "SCRIPTED_NOTE",
    "BenchRow",
    "Ratio",
    "ratios",
    "render_report",
    "summarize",
    "why",
    "write_json",
    "write_plot",
]

MODE_LABELS: dict[str, str] = {"on": "code mode", "off": "tool calling"}
"""How tables and plots name the two modes."""

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


def why(row: BenchRow) -> str:
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
        out.append(f"  FAILED {r.task} N={r.n} {MODE_LABELS.get(r.mode, r.mode)}: {why(r)}")
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
