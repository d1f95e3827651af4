"""Live progress of a streaming run, drawn from its event stream: `codemode watch` and `codemode run --follow`.

A run that streams its events (`start_run(stream=True)`, `CodeModeAgent(stream=True)`, and every `codemode run
--follow`) is followed here from its stream (`stream_events`), with no history polling: each model turn as it is
asked and what it answered, the program's source, each nested call as it starts and as its answer reaches the
program, what the program prints as it prints it, compute handed to an activity, child runs, each pause for a
person and who decided it. A run that does not stream is followed from its history instead (`_watch`).

As there, a snippet's first calls are shown one by one and a long one's progress in lines of `call_3: 120/200
done` at most every `progress_every` seconds; every error is shown. Watching stops when the run ends, or when it can
go no further without a person (every call in flight waits for a decision and nothing has moved for a moment): it
then says what waits, and how to decide it.

Every line passes `printable` (`_Follower.say`): run content is untrusted text.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any, TextIO

from pydantic_ai.messages import FunctionToolCallEvent, PartEndEvent, TextPart, ToolCallPart
from pydantic_ai.run import AgentRunResultEvent
from temporalio.client import Client

from ..shared._names import RUN_CODE_TOOL
from ..shared._results import call_arguments, code_lines, preview
from ..shared._run_events import (
    ApprovalDecidedEvent,
    ApprovalWaitEvent,
    ChildRunEndEvent,
    ChildRunStartEvent,
    ComputeEscalatedEvent,
    EventsTrimmedEvent,
    ModelRequestStartEvent,
    ModelStreamResetEvent,
    NestedCallEndEvent,
    NestedCallStartEvent,
    PrintEvent,
    RunContinuedEvent,
    RunEndEvent,
    RunEndStatus,
    SnippetEndEvent,
)
from ..workflow._run import CodeModeRunWorkflow
from ._deciding import pending_approvals
from ._runs import run_result
from ._stream import RunEventItem, stream_events
from ._watch import _FEW, WatchOutcome, WatchState
from ._watch import _Follower as _Lines

__all__ = ["watch_stream"]

_OUTCOMES: dict[RunEndStatus, WatchState] = {
    "completed": "completed", "failed": "failed", "cancelled": "cancelled", "terminated": "terminated",
    "timed_out": "timed-out"}

_QUIET = timedelta(seconds=1)
"""Nothing new for this long while every call in flight waits for a person: the run waits; watching stops."""


class _StreamFollower:
    """Draws a run's events as lines, with the history follower's snippet counts and progress lines."""

    def __init__(self, out: TextIO, progress_every: float) -> None:
        self._lines = _Lines(out, progress_every)
        self._shown: set[str] = set()
        """The calls shown as they started (a long snippet's first few), whose end is shown too."""
        self._labels: dict[str, str] = {}
        self.in_flight: set[str] = set()
        self.waiting: set[str] = set()
        """Calls waiting for a decision."""
        self.children: set[str] = set()
        """Calls running a child run (which may itself wait for a person)."""
        self._turn = 0

    def say(self, text: str) -> None:
        self._lines.say(text)

    def event(self, event: Any) -> None:
        match event:
            case ModelRequestStartEvent(turn=turn):
                self._turn = turn
                self.say(f"model turn {turn} …")
            case ModelStreamResetEvent(turn=turn, attempt=attempt, reason=reason):
                again = f"; attempt {attempt} streams it again" if attempt else ""
                self.say(f"model turn {turn}: what it streamed is void ({reason}){again}")
            case PartEndEvent(part=TextPart(content=text)) if text.strip():
                self.say(f"model turn {self._turn} → answer: {preview(text, 200)}")
            case FunctionToolCallEvent(part=ToolCallPart(tool_name=name, tool_call_id=call_id) as part):
                if name == RUN_CODE_TOOL:
                    code = str(part.args_as_dict().get("code", ""))
                    lines = code_lines(code.rstrip("\r\n"))
                    self.say(f"model turn {self._turn} → run_code {call_id} ({len(lines)} lines)")
                    for line in lines[:6]:
                        self.say(f"   │ {line}")
                    if len(lines) > 6:
                        self.say("   │ …")
                else:
                    self.say(f"model turn {self._turn} → {name}({call_arguments(part.args_as_dict(), 80)})")
            case NestedCallStartEvent(call_id=call_id, tool=tool, args=args):
                self._started(call_id, tool, args)
            case NestedCallEndEvent(call_id=call_id, status=status, seconds=seconds, result=result):
                self._finished(call_id, status, seconds, result)
            case PrintEvent(text=text):
                for line in code_lines(text.rstrip("\n")):
                    self.say(f"  ┆ {line}")
            case ApprovalWaitEvent(call_id=call_id, line=line, policy=policy):
                self.waiting.add(call_id)
                who = f"; {policy} may decide" if policy else ""
                self.say(f"  ⏸ {self._labels.get(call_id, call_id)} waits for approval (line {line}){who}")
            case ApprovalDecidedEvent(call_id=call_id, approved=approved, approver=approver, note=note,
                                      settled=settled, via=via):
                verdict = "approved" if approved else "denied"
                by = "by the timeout" if via == "timeout" else f"by {approver or 'an approver'}"
                more = "" if settled else " (one of the approvals it needs)"
                self.say(f"  {'✔' if approved else '✘'} {call_id} {verdict} {by}{more}" + (f": {note}" if note else ""))
                if settled:
                    self.waiting.discard(call_id)
            case ChildRunStartEvent(call_id=call_id, run_id=run_id, agent=agent):
                self.children.add(call_id)
                self.say(f"  ↳ {call_id} started child run {run_id} (agent {agent}): codemode watch {run_id}")
            case ChildRunEndEvent(call_id=call_id, run_id=run_id, status=status, error=error):
                self.children.discard(call_id)
                self.say(f"  ↳ child run {run_id} {status}" + (f": {preview(error, 200)}" if error else ""))
            case ComputeEscalatedEvent(tool_call_id=snippet_id, reason=reason):
                self.say(f"  ⚙ {snippet_id} {reason}")
            case SnippetEndEvent(tool_call_id=snippet_id, outcome=outcome, calls=calls):
                self.progress(final=True)
                if outcome != "ok":
                    self.say(f"  {snippet_id}: {outcome} ({calls} calls)")
            case RunContinuedEvent():
                self.say("… continued as new (a fresh workflow run; the conversation goes on)")
            case EventsTrimmedEvent(missed=missed):
                self.say(f"… {missed} earlier events are no longer kept by the run")

    def _started(self, call_id: str, tool: str, args: str) -> None:
        name, snippet = self._lines.snippet_of(call_id)
        snippet.started += 1
        self.in_flight.add(call_id)
        label = self._labels[call_id] = f"{call_id} {tool}({args})"
        if snippet.started <= _FEW:
            self.say(f"  ▸ {label}")
            self._shown.add(call_id)
        elif snippet.started == _FEW + 1:
            self.say(f"  ▸ … more calls from {name}; progress below")

    def _finished(self, call_id: str, status: str, seconds: float, result: str) -> None:
        self.in_flight.discard(call_id)
        self.waiting.discard(call_id)
        _, snippet = self._lines.snippet_of(call_id)
        snippet.done += 1
        error = status != "ok"
        snippet.errors += error
        if error or call_id in self._shown:
            mark = "✓" if not error else "✗"
            text = f"ok {seconds * 1000:.0f} ms → {preview(result, 60)}" if not error else f"{status}: {result}"
            self.say(f"  {mark} {self._labels.get(call_id, call_id)}  {text}")
        self.progress()

    def progress(self, *, final: bool = False) -> None:
        self._lines.progress(final=final)

    @property
    def held_by_people(self) -> bool:
        """Whether every call in flight may be waiting for a person: for a decision, or in a child run.

        Then, once nothing has moved for a moment, the run is asked what waits (its children's calls included).
        """
        maybe = self.waiting | self.children
        return bool(maybe) and self.in_flight <= maybe


async def watch_stream(client: Client, workflow_id: str, *, out: TextIO, progress_every: float = 2.0
                       ) -> WatchOutcome:
    """Print a streaming run's progress to `out` from its event stream until it ends or waits for a person.

    Raises:
        RunNotFoundError: no run with that id.
        CodeModeUserError: the run does not stream (follow it with `_watch.watch_run`).

    """
    follower = _StreamFollower(out, progress_every)
    queue: asyncio.Queue[RunEventItem | BaseException] = asyncio.Queue()

    async def read() -> None:
        try:
            async for item in stream_events(client, workflow_id):
                await queue.put(item)
        except BaseException as e:  # handed to the reader below (a cancellation too)
            await queue.put(e)

    reader = asyncio.create_task(read())
    try:
        while True:
            try:
                got = await asyncio.wait_for(queue.get(), _QUIET.total_seconds() if follower.held_by_people else None)
            except TimeoutError:
                pending = await pending_approvals(client, workflow_id)
                if pending:
                    follower.progress(final=True)
                    return WatchOutcome("waiting", pending=pending)
                continue
            if isinstance(got, BaseException):
                raise got
            event = got.event
            if isinstance(event, AgentRunResultEvent):
                follower.progress(final=True)
                return WatchOutcome("completed", result=await run_result(
                    client.get_workflow_handle_for(CodeModeRunWorkflow.run, workflow_id)))
            if isinstance(event, RunEndEvent):
                follower.progress(final=True)
                return WatchOutcome(_OUTCOMES[event.status], failure=event.error)
            follower.event(event)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
