"""A run as a tree: model turns → `run_code` snippets → nested tool calls (→ approvals), and its one drawing.

`RunResult` summarizes a finished run; a trace is built from the history instead, so it exists for every run
(running, waiting for a person, completed, failed, continued as new) and has what only the history has: each
call's arguments, attempts, duration and error, the approvals and who decided them, the continue-as-new
boundaries and the workflow task failures of a wedged run. `render_trace` draws it as text; `render_tree` draws
a finished run's `RunResult` with the same drawing (what `codemode demo` and `codemode run` print), its code
cut to a few lines:

```
run refunds-1a2b (agent refunds): waiting for approval of call_0.1
model turn 0  scripted  73 ms
└─ run_code call_0  running  (2 nested calls)
   │ 1  total = await lookup(order='A1')
   │ 2  r = await refund(order='A1', cents=total)
   ├─ call_0.0  lookup(order="A1")  ok  line 1  9 ms  → 1234
   └─ call_0.1  refund(order="A1", cents=1234)  pending  line 2  waiting for approval since 2026-12-02 13:39:36
```
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import TypeAdapter

from .._history_events import RunStatus, TraceRun
from ..shared._approvals import ApprovalRecord, decided_by
from ..shared._config import SnippetLimits
from ..shared._records import CallRecord, RunResult, TurnRecord
from ..shared._results import PREVIEW_CHARS, answer_text, call_arguments, code_lines, printable

__all__ = [
    "CallStatus",
    "RunTrace",
    "TraceApproval",
    "TraceCall",
    "TraceRun",
    "TraceSnippet",
    "TraceTurn",
    "call_order",
    "render_trace",
    "render_tree",
    "seconds_between",
    "trace_call_of",
    "trace_json",
    "trace_turns_of",
]

CallStatus = Literal["ok", "error", "cancelled", "denied", "running", "pending"]
"""`running`: scheduled and not finished (an open run); `pending`: waiting for a person's decision."""


_PREVIEW = 200
"""Characters of a result, error or argument preview in a trace (the JSON form has the same previews)."""

_COLLAPSE_OVER = 12
"""A snippet with more calls than this shows its first `_HEAD` and last `_TAIL`, and every call that was not ok."""
_HEAD, _TAIL = 6, 3

_SUMMARY_CODE_LINES = 6
"""Lines of a snippet's code `render_tree` shows before `…`: enough to recognise it, not to read it."""


@dataclass(kw_only=True)
class TraceApproval:
    """A call that needed a person: pending, or decided (by whom, how, with what note)."""

    call_id: str
    tool: str
    args: dict[str, Any] | None
    state: Literal["pending", "approved", "denied"]
    via: str | None = None
    """`update`, `signal` or `timeout`; `None` while pending."""
    approver: str | None = None
    note: str | None = None
    requested_at: datetime | None = None
    decided_at: datetime | None = None
    expires_at: datetime | None = None
    line: int | None = None


@dataclass(kw_only=True)
class TraceCall:
    """One tool call, nested in a snippet or made directly by the model."""

    call_id: str
    tool: str
    args: dict[str, Any] | None
    """`None` when the history does not hold them (a local activity whose run was not replayed)."""
    status: CallStatus
    result: str | None = None
    """A preview of the value the call returned (`ok`)."""
    error: str | None = None
    """A preview of why it failed, was denied or cancelled."""
    activity_type: str | None = None
    activity_id: str | None = None
    local: bool = False
    line: int | None = None
    """The 1-based line of the snippet that made the call, when known (from a replay, or a pending approval)."""
    scheduled_at: datetime | None = None
    finished_at: datetime | None = None
    duration_s: float | None = None
    attempts: int = 0
    """Attempts of the activity (1: no retry); 0 when it never started."""
    last_failure: str | None = None
    """The failure of the attempt before the last one, when the call was retried."""
    approval: TraceApproval | None = None
    child_run_id: str | None = None
    """A `child_run_tool` call: the child run it started."""
    child: RunTrace | None = None
    """That child run's trace, drawn under the call (`trace_run` fetches it from the server)."""

    @property
    def retries(self) -> int:
        return max(self.attempts - 1, 0)


@dataclass(kw_only=True)
class TraceSnippet:
    """One `run_code` call: its code, what it came to, and the calls it made in call order."""

    call_id: str
    code: str
    restart: bool = False
    outcome: Literal["ok", "error", "rejected", "compute_limit", "sandbox_crashed", "running", "unknown"]
    result: str | None = None
    """A preview of what the model got back (the next request's tool return)."""
    calls: list[TraceCall] = field(default_factory=list)
    computed_s: float | None = None
    """Seconds the program computed in compute activities, past its in-workflow budget (`None`: none)."""
    recorded_stretches: int = 0
    """Stretches of compute that went past the in-workflow budget: each recorded in the history (so no replay
    re-runs it), computed in an activity or finished in workflow code."""
    files: dict[str, int] | None = None
    """The run's files after the snippet (path under `/files` -> bytes), when it changed them (`RunFiles`)."""
    files_omitted: int = 0
    """Files left out of `files` (a run summary lists at most `FILE_LISTING_LIMIT`)."""


@dataclass(kw_only=True)
class TraceTurn:
    """One model request and what the run did with the response."""

    index: int
    run: int
    """The run of the chain (0-based) whose history holds this turn; -1 for a turn known only from the summary
    an earlier run carried over (its history was not given)."""
    status: Literal["ok", "running", "error"]
    text: str = ""
    error: str | None = None
    model_name: str | None = None
    requested_at: datetime | None = None
    responded_at: datetime | None = None
    duration_s: float | None = None
    attempts: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    snippets: list[TraceSnippet] = field(default_factory=list)
    direct_calls: list[TraceCall] = field(default_factory=list)
    output: str | None = None
    """What the output check of the response found (agents with an `output_type`): `accepted`, `rejected, ...`."""


@dataclass(kw_only=True)
class RunTrace:
    """A whole agent run (every run of its chain that was given), as a tree."""

    workflow_id: str
    agent: str | None
    status: RunStatus
    """The last run's status."""
    runs: list[TraceRun]
    turns: list[TraceTurn]
    approvals: list[TraceApproval] = field(default_factory=list)
    audit: list[ApprovalRecord] = field(default_factory=list)
    """Every approval decision of the chain, in order (what `codemode audit` prints)."""
    output: Any = None
    """The run's output: the final text, or a structured output as JSON."""
    failure: str | None = None
    limits: SnippetLimits | None = None
    """The snippet limits recorded when the run started (what every replay uses)."""
    notes: list[str] = field(default_factory=list)

    @property
    def snippets(self) -> list[TraceSnippet]:
        return [s for t in self.turns for s in t.snippets]

    @property
    def nested_calls(self) -> list[TraceCall]:
        return [c for s in self.snippets for c in s.calls]

    @property
    def direct_calls(self) -> list[TraceCall]:
        return [c for t in self.turns for c in t.direct_calls]

    @property
    def pending(self) -> list[TraceApproval]:
        return [a for a in self.approvals if a.state == "pending"]

    @property
    def state(self) -> str:
        """The status as people say it: `waiting for approval` for a running run that waits on a person."""
        if self.status == "running" and self.pending:
            return "waiting for approval"
        return self.status.replace("_", "-")

    def call(self, call_id: str) -> TraceCall | None:
        """The call with this id, nested or direct."""
        return next((c for c in [*self.nested_calls, *self.direct_calls] if c.call_id == call_id), None)


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start and end else None


def call_order(call: TraceCall) -> tuple[int, str]:
    """Calls are recorded as they finish; a tree shows them in the order the program made them."""
    tail = call.call_id.rsplit(".", 1)[-1]
    return (int(tail), call.call_id) if tail.isdigit() else (-1, call.call_id)


def trace_call_of(record: CallRecord) -> TraceCall:
    try:
        args = json.loads(record.args)
    except ValueError:  # a preview cut short
        args = None
    ok = record.status == "ok"
    return TraceCall(call_id=record.call_id, tool=record.tool, args=args if isinstance(args, dict) else None,
                     status=record.status, result=record.result if ok else None, error=None if ok else record.result,
                     scheduled_at=record.started_at, finished_at=record.finished_at,
                     duration_s=seconds_between(record.started_at, record.finished_at))


def trace_turns_of(records: list[TurnRecord], *, run: int) -> list[TraceTurn]:
    """A run summary's turns (`RunResult.turns`) as trace turns, calls in call order; `run` as in `TraceTurn`."""
    return [
        TraceTurn(
            index=record.index, run=run, status="ok", text=record.text,
            snippets=[TraceSnippet(call_id=s.call_id, code=s.code, outcome=s.outcome, result=s.result,
                                   calls=sorted((trace_call_of(c) for c in s.calls), key=call_order),
                                   computed_s=s.computed_seconds, files=s.files, files_omitted=s.files_omitted)
                      for s in record.snippets],
            direct_calls=[trace_call_of(c) for c in record.direct_calls],
        )
        for record in records
    ]


def trace_json(trace: RunTrace) -> str:
    """The trace as indented JSON (`codemode trace --json`)."""
    return TypeAdapter(RunTrace).dump_json(trace, indent=2).decode()


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def _args_text(args: dict[str, Any] | None, limit: int) -> str:
    """A call's arguments in the one format of every view of a call (`call_arguments`), cut at `limit`."""
    if args is None:
        return "…"
    return call_arguments(args, limit)


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "?"


def _approval_text(approval: TraceApproval) -> str:
    if approval.state == "pending":
        expires = f", denied automatically at {_when(approval.expires_at)}" if approval.expires_at else ""
        return f"waiting for approval since {_when(approval.requested_at)}{expires}"
    who = decided_by(approval.approver, approval.via)
    note = f": {approval.note}" if approval.note else ""
    return f"{approval.state} by {who} ({approval.via or '?'}){note}"


def _size_text(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB" if size < 1024 * 1024 else f"{size / 2**20:.1f} MiB"


def files_text(files: dict[str, int], omitted: int = 0) -> str:
    """A run's files after a snippet as one line: `notes.txt 12 B, seed/prices.csv 2.0 KiB`."""
    if not files:
        return f"{omitted} files, not listed in the run's summary (kept short)" if omitted else "(none)"
    more = f", … {omitted} more" if omitted else ""
    return ", ".join(f"{path} {_size_text(size)}" for path, size in files.items()) + more


def call_line(call: TraceCall, room: int) -> str:
    """One call as a line: id, tool(args), status, duration, attempts, approval, result or error."""
    args = _args_text(call.args, max(room // 3, 12))
    parts = [f"{call.call_id}  {call.tool}({args})  {call.status}"]
    if call.line:
        parts.append(f"line {call.line}")
    if call.duration_s is not None:
        parts.append(_seconds(call.duration_s))
    if call.attempts > 1:
        failure = f" (last failure: {_one_line(call.last_failure)})" if call.last_failure else ""
        parts.append(f"{call.attempts} attempts{failure}")
    if call.local:
        parts.append("local")
    if call.approval is not None and call.status != "denied":
        parts.append(_approval_text(call.approval))
    if call.status == "ok":
        parts.append(f"→ {_one_line(call.result or '')}")
    elif call.status == "denied" and call.approval is not None:
        parts.append(f"✗ {_approval_text(call.approval)}")
    elif call.error:
        parts.append(f"✗ {_one_line(call.error)}")
    return "  ".join(parts)


class _Drawing:
    def __init__(self, width: int, *, code_lines: int | None = None) -> None:
        self.width = max(width, 20)
        self.code_lines = code_lines
        """`None`: every line of a snippet's code; else its first non-blank lines, then `…`."""
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        # Every line is one line of the drawing: a newline, escape sequence or CR in a run's text is shown escaped.
        self.lines.append(_fit(printable(line), self.width))

    def calls(self, calls: list[TraceCall], indent: str) -> None:
        shown: list[TraceCall | str] = list(calls)
        if len(calls) > _COLLAPSE_OVER:
            middle = calls[_HEAD:-_TAIL]
            # Collapsing hides only calls that went well: a failed, denied or waiting call is always shown.
            hidden = [c for c in middle if c.status == "ok"]
            tools: dict[str, int] = {}
            for c in hidden:
                tools[c.tool] = tools.get(c.tool, 0) + 1
            summary = ", ".join(f"{tool} \u00d7{n}" for tool, n in tools.items())
            shown = [*calls[:_HEAD], f"… {len(hidden)} more calls, all ok ({summary})",
                     *[c for c in middle if c.status != "ok"], *calls[-_TAIL:]]
        room = self.width - len(indent) - 3
        for i, item in enumerate(shown):
            branch = "└─ " if i == len(shown) - 1 else "├─ "
            self.add(indent + branch + (item if isinstance(item, str) else call_line(item, room)))
            if not isinstance(item, str):
                self.child_run(item, indent + ("   " if i == len(shown) - 1 else "│  "))

    def child_run(self, call: TraceCall, indent: str) -> None:
        """A `child_run_tool` call's child run, as a subtree under the call: its headline and its turns."""
        if call.child is None:
            if call.child_run_id is not None:
                self.add(f"{indent}   child run {call.child_run_id}")
            return
        sub = _Drawing(self.width - len(indent) - 3, code_lines=self.code_lines)
        sub.add(f"child {_headline(call.child)}")
        for j, turn in enumerate(call.child.turns):
            sub.turn(turn, final=j == len(call.child.turns) - 1)
        self.lines += [f"{indent}   {line}" for line in sub.lines]

    def snippet(self, snippet: TraceSnippet, last: bool) -> None:
        n = len(snippet.calls)
        count = f"  ({n} nested call{'s' if n != 1 else ''})" if n else ""
        restart = "  restart" if snippet.restart else ""
        computed = f"  computed in an activity for {snippet.computed_s:.1f} s" if snippet.computed_s else ""
        self.add(f"{'└─ ' if last else '├─ '}run_code {snippet.call_id}  {snippet.outcome}{restart}{computed}{count}")
        inner = "   " if last else "│  "
        gutter = inner + ("│ " if n else "  ")
        code = snippet.code.expandtabs(4).rstrip("\r\n")
        lines = code_lines(code) if code else []
        digits = len(str(len(lines)))
        numbered = list(enumerate(lines, 1))
        if self.code_lines is not None:  # a preview: blank lines carry nothing in six lines
            numbered = [(n, text) for n, text in numbered if text.strip()]
        for number, text in numbered[: self.code_lines]:
            self.add(f"{gutter}{number:>{digits}}  {text.rstrip()}")
        if self.code_lines is not None and len(numbered) > self.code_lines:
            self.add(f"{gutter}…")
        if snippet.result:
            self.add(f"{gutter}= {_one_line(snippet.result)}")
        if snippet.files is not None:
            self.add(f"{gutter}files: {files_text(snippet.files, snippet.files_omitted)}")
        self.calls(snippet.calls, inner)

    def turn(self, turn: TraceTurn, final: bool) -> None:
        facts = [f for f in (turn.model_name, _seconds(turn.duration_s),
                             f"{turn.attempts} attempts" if turn.attempts > 1 else "") if f]
        origin = "  (from the summary of an earlier run)" if turn.run < 0 else ""  # a trace that lacks its history
        self.add(f"model turn {turn.index}" + (f"  {'  '.join(facts)}" if facts else "") + origin)
        children: list[str | TraceSnippet | TraceCall] = []
        acted = bool(turn.snippets or turn.direct_calls)
        if turn.status == "running":
            children.append("(waiting for the model's response)")
        elif turn.status == "error":
            children.append(f"model request failed: {_one_line(turn.error or '')}")
        elif turn.text:
            children.append(f"{'answer' if final and not acted else 'text'}: {_one_line(turn.text)}")
        elif not acted and turn.output is None:
            children.append("(no text and no tool call: the model was asked again)")
        children += turn.snippets
        children += turn.direct_calls
        if turn.output is not None:
            children.append(f"output {_one_line(turn.output)}")
        for i, child in enumerate(children):
            last = i == len(children) - 1
            if isinstance(child, TraceSnippet):
                self.snippet(child, last)
            elif isinstance(child, TraceCall):
                self.add(f"{'└─ ' if last else '├─ '}tool call {call_line(child, self.width - 13)}")
                self.child_run(child, "   " if last else "│  ")
            else:
                self.add(f"{'└─ ' if last else '├─ '}{child}")


def _headline(trace: RunTrace) -> str:
    agent = f" (agent {trace.agent})" if trace.agent else ""
    state = trace.state
    if trace.pending:
        state += " of " + ", ".join(a.call_id for a in trace.pending)
    runs = len(trace.runs)
    chain = f", {runs} runs" if runs > 1 else ""
    return f"run {trace.workflow_id}{agent}: {state}{chain}"


def render_trace(trace: RunTrace, *, width: int = 120) -> str:
    """The trace as plain text: turns, each snippet's numbered code, each call with its status and timings."""
    drawing = _Drawing(width)
    drawing.add(_headline(trace))
    run = trace.turns[0].run if trace.turns else 0
    for i, turn in enumerate(trace.turns):
        if turn.run != run and turn.run >= 0:
            previous = trace.runs[run] if 0 <= run < len(trace.runs) else None
            reason = f" ({previous.continue_reason})" if previous and previous.continue_reason else ""
            drawing.add(f"── continued as new{reason}: run {turn.run + 1} of {len(trace.runs)}, "
                        f"{trace.runs[turn.run].run_id} ──")
        run = turn.run if turn.run >= 0 else run
        drawing.turn(turn, final=i == len(trace.turns) - 1)
    for r in trace.runs:
        for failure in r.task_failures:
            drawing.add(f"workflow task failed (run {r.run_id}): {_one_line(failure)}")
    if trace.output is not None:
        drawing.add(f"output: {answer_text(trace.output)}")
    elif trace.failure is not None:
        drawing.add(f"{trace.status.replace('_', ' ')}: {_one_line(trace.failure)}")
    decided = [a for a in trace.approvals if a.state != "pending"]
    if decided:
        drawing.add("approvals:")
        for a in decided:
            drawing.add(f"  {a.call_id}  {a.tool}({_args_text(a.args, PREVIEW_CHARS)})  {_approval_text(a)}  "
                        f"at {_when(a.decided_at)}")
    # Notes are never cut to the width: they say what the trace is missing and why.
    drawing.lines += [printable(f"note: {note}") for note in trace.notes]
    return "\n".join(drawing.lines)


def render_tree(result: RunResult[Any], *, width: int = 100) -> str:
    """A finished run as a tree of model turns, snippets (with the start of their code) and nested calls.

    The drawing is `render_trace`'s, from what the run returned instead of its history: no headline, approvals
    or timings of model requests (the history has those: `codemode trace RUN_ID`).

    Args:
        result: A finished run's result.
        width: Maximum characters per line; longer lines (previews, code) end in `…`. At least 20.

    """
    drawing = _Drawing(width, code_lines=_SUMMARY_CODE_LINES)
    turns = trace_turns_of(result.turns, run=0)
    for i, turn in enumerate(turns):
        drawing.turn(turn, final=i == len(turns) - 1)
    if result.continued_as_new:
        runs = result.continued_as_new
        drawing.add(f"(the run continued as new {runs} time{'s' if runs != 1 else ''})")
    return "\n".join(drawing.lines)
