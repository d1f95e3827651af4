"""Why a replay left the recorded history, in the terms of the run: the turn, the snippet, the line, the call.

Temporal's replayer reports a divergence as core's one-liner about an activity id or a state machine. This module
turns it into what a person acts on: the model turn, the `run_code` snippet, the source line and the nested
call; the recorded call against the replayed one (tool and arguments: the digest in a call's activity id makes
changed arguments a loud mismatch, and the replayed side's arguments are read off the replay itself); or the
recorded event against the replayed command for other divergences; and the likely cause with what to do.
Two causes are expected, not failures (`_replay`'s module docstring says why).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from temporalio.client import WorkflowHistory

from .._history_events import RecordedActivity, RecordedRun, read_run
from ..shared._names import (
    BATCH_ACTIVITY,
    MODEL_REQUEST_ACTIVITY,
    call_id_of_activity,
    tool_of_activity_type,
)
from ..shared._results import code_lines, preview
from ..shared._types import RECORDED_RULE_VERDICTS, behavior_version_refusal
from ..workflow._approval_state import RULE_GONE
from ._capture import ReplayCapture, ReplayedCommand, ReplayedSnippet, failure_message
from ._read import _RULE_UNKNOWN
from ._trace import RunTrace, TraceSnippet

__all__ = ["CallSide", "Cause", "Divergence", "divergence"]

Cause = Literal[
    "tool_renamed", "arguments_changed", "call_order_changed", "other_tool_called", "sandbox_limits",
    "compute_limit_on_replay", "snippet_ended_early", "extra_call", "sandbox_crashed", "compute_limit_not_hit",
    "approval_rule_unknown", "approval_rule_changed", "approval_rule_gone", "behavior_version_unsupported",
    "non_deterministic", "other",
]

_EXPECTED: frozenset[str] = frozenset({"sandbox_crashed", "compute_limit_not_hit"})

_ID_MISMATCH = re.compile(r"Activity id of scheduled event '(?P<recorded>[^']*)' does not match activity id of "
                          r"activity command '(?P<replayed>[^']*)'")
_TYPE_MISMATCH = re.compile(r"Activity type of scheduled event '(?P<recorded>[^']*)' does not match activity type "
                            r"of activity command '(?P<replayed>[^']*)'")
_MACHINE = re.compile(r"(?P<machine>[A-Za-z ]+?) machine does not handle this event: "
                      r"HistoryEvent\(id: (?P<event>\d+), (?P<kind>\w+)\)")
_EVENT = re.compile(r"HistoryEvent\(id: (?P<event>\d+)")
_LIMIT_WORDS = ("tool call limit reached", "MemoryError", "RecursionError", "time limit exceeded", "compute budget")
"""Words in a snippet's result that mean a sandbox limit stopped it."""


@dataclass(kw_only=True)
class CallSide:
    """One side of a divergence: the recorded event or the replayed command."""

    what: str
    """In words: `get(i=1)`, `model request (turn 1)`, `a timer (sleep)`, `continue-as-new (compute_limit)`."""
    call_id: str | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    activity_type: str | None = None
    activity_id: str | None = None
    event_id: int | None = None


@dataclass(kw_only=True)
class Divergence:
    """Where a replay left the recorded history, and the likely cause."""

    cause: Cause
    explanation: str
    """The likely cause in words, and what to do about it."""
    message: str
    """Temporal's own message (core's `TMPRL1100 ...`, or the workflow task's error)."""
    turn: int | None = None
    snippet: str | None = None
    line: int | None = None
    line_guessed: bool = False
    """The line was found by searching the code for the tool's name (the replay did not reach the call)."""
    source_line: str | None = None
    call_id: str | None = None
    recorded: CallSide | None = None
    replayed: CallSide | None = None
    recorded_result: str | None = None
    """What the snippet returned when it ran (when the replay took another path through it)."""
    replayed_result: str | None = None
    """What the snippet returned on replay."""

    @property
    def expected(self) -> bool:
        """A divergence that is a known consequence of how the run ended, not of a change (`_replay`'s docstring)."""
        return self.cause in _EXPECTED


def _nested(call_id: str | None) -> bool:
    return bool(call_id) and "." in str(call_id) and str(call_id).rsplit(".", 1)[1].isdigit()


def _args_text(args: dict[str, Any] | None) -> str:
    if args is None:
        return "…"
    return ", ".join(f"{k}={preview(json.dumps(v, ensure_ascii=False, default=repr), 60)}" for k, v in args.items())


def _recorded_side(activity: RecordedActivity, trace: RunTrace) -> CallSide:
    if activity.activity_type == MODEL_REQUEST_ACTIVITY:
        index = activity.summary.removeprefix("model turn ") if activity.summary else "?"
        return CallSide(what=f"model request (turn {index})", activity_type=activity.activity_type,
                        activity_id=activity.activity_id, event_id=activity.event_id)
    payload = activity.input if isinstance(activity.input, dict) else {}
    if activity.activity_type == BATCH_ACTIVITY:  # one activity for several calls: name them all
        ids = [str(c.get("call_id")) for c in payload.get("calls") or [] if isinstance(c, dict)]
        tool = str(payload.get("tool") or "?")
        return CallSide(what=f"a batch of {len(ids)} {tool}() calls ({', '.join(ids[:3])}{', …' * (len(ids) > 3)})",
                        call_id=ids[0] if ids else None, tool=tool, activity_type=activity.activity_type,
                        activity_id=activity.activity_id, event_id=activity.event_id)
    call_id = str(payload.get("call_id") or call_id_of_activity(activity.activity_id))
    tool = str(payload.get("tool") or tool_of_activity_type(activity.activity_type))
    args = payload.get("args") if isinstance(payload.get("args"), dict) else None
    if args is None and activity.local:
        call = trace.call(call_id)
        args = call.args if call else None
    # The activity type is what a renamed tool changes; show the tool the type names, not the input's field.
    tool = activity.activity_type.rsplit(".", 1)[-1] if "." in activity.activity_type else tool
    return CallSide(what=f"{tool}({_args_text(args)})", call_id=call_id, tool=tool, args=args,
                    activity_type=activity.activity_type, activity_id=activity.activity_id,
                    event_id=activity.event_id)


def _replayed_side(command: ReplayedCommand, capture: ReplayCapture) -> CallSide:
    if command.kind == "continue_as_new":
        note = getattr(getattr(command.input, "continuation", None), "note", None)
        return CallSide(what=f"continue-as-new ({note or 'snippet cap'})")
    if command.activity_type == MODEL_REQUEST_ACTIVITY:
        turns = sum(1 for c in capture.commands[: capture.commands.index(command)]
                    if c.activity_type == MODEL_REQUEST_ACTIVITY)
        messages = getattr(command.input, "messages", None)
        summary = command.summary or ""
        if summary.startswith("model turn ") and summary.removeprefix("model turn ").isdigit():
            index = int(summary.removeprefix("model turn "))
        elif messages and getattr(command.input, "earlier", None) is None:  # recorded before summaries
            index = sum(1 for m in messages if getattr(m, "kind", "") == "response")
        else:
            index = turns
        return CallSide(what=f"model request (turn {index})", activity_type=command.activity_type,
                        activity_id=command.effective_id)
    # The call id and tool are the activity's id and type (`ToolCallInput`); its input holds the arguments.
    call_id = call_id_of_activity(command.activity_id) if command.activity_id else None
    tool = tool_of_activity_type(command.activity_type or "")
    args = getattr(command.input, "args", None)
    return CallSide(what=f"{tool}({_args_text(args)})", call_id=call_id, tool=tool, args=args,
                    activity_type=command.activity_type, activity_id=command.effective_id)


def _event_side(history: WorkflowHistory, event_id: int, recorded: RecordedRun, trace: RunTrace) -> CallSide:
    activity = next((a for a in recorded.activities if a.event_id == event_id), None)
    if activity is not None:
        return _recorded_side(activity, trace)
    event = next((e for e in history.events if e.event_id == event_id), None)
    kind = event.WhichOneof("attributes") if event is not None else None
    name = (kind or "event").removesuffix("_event_attributes").replace("_", " ")
    if kind == "workflow_execution_continued_as_new_event_attributes":
        reason = recorded.run.continue_reason or "snippet cap"
        return CallSide(what=f"continue-as-new ({reason})", event_id=event_id)
    if kind == "timer_started_event_attributes":
        return CallSide(what="a timer (a sleep, or an approval timeout)", event_id=event_id)
    return CallSide(what=f"{name} (event {event_id})", event_id=event_id)


def _machine_side(machine: str, capture: ReplayCapture, position: int) -> CallSide:
    machine = machine.strip().lower()
    if machine.startswith("continue as new"):
        command = next((c for c in reversed(capture.commands) if c.kind == "continue_as_new"), None)
        if command is not None:
            return _replayed_side(command, capture)
        return CallSide(what="continue-as-new")
    if machine.startswith("timer"):
        return CallSide(what="a timer (a sleep, or an approval timeout)")
    if machine.startswith("activity") or machine.startswith("local activity"):
        kind = "local_activity" if machine.startswith("local") else "activity"
        commands = [c for c in capture.commands if c.kind == kind]
        if position < len(commands):
            return _replayed_side(commands[position], capture)
        return CallSide(what="an activity")
    if machine.startswith("complete workflow"):
        return CallSide(what="the run completing")
    if machine.startswith("fail workflow"):
        return CallSide(what="the run failing")
    return CallSide(what=f"a {machine} command")


def _guess_line(code: str, tool: str | None, *, start: int = 1) -> int | None:
    if not tool:
        return None
    pattern = re.compile(rf"\b{re.escape(tool)}\s*\(")
    found = [n for n, text in enumerate(code_lines(code), 1) if pattern.search(text)]
    return next((n for n in found if n >= start), found[0] if found else None)


_FRAME = re.compile(r'File "<python-input-(?P<input>\d+)>", line (?P<line>\d+)')


def _traceback_line(snippet: ReplayedSnippet | None) -> int | None:
    """The line a replayed snippet raised at: the innermost frame of its own code (the newest REPL input)."""
    content = snippet.content if snippet is not None else None
    traceback = content.get("traceback") if isinstance(content, dict) else None
    if not isinstance(traceback, str):
        return None
    frames = [(int(m["input"]), int(m["line"])) for m in _FRAME.finditer(traceback)]
    if not frames:
        return None
    newest = max(i for i, _ in frames)
    return [line for i, line in frames if i == newest][-1]


def _limit_hit(text: str | None) -> bool:
    return bool(text) and any(word in str(text) for word in _LIMIT_WORDS)


def _locate(div: Divergence, trace: RunTrace, capture: ReplayCapture) -> None:
    """Fill in the turn, snippet, line and source line from the call ids and what the replay ran last."""
    call_id = next((s.call_id for s in (div.recorded, div.replayed) if s is not None and _nested(s.call_id)), None)
    snippet: TraceSnippet | None = None
    if call_id is not None:
        div.call_id = call_id
        parent = call_id.rsplit(".", 1)[0]
        snippet = next((s for s in trace.snippets if s.call_id == parent), None)
    if snippet is None and capture.snippets:
        snippet = next((s for s in reversed(trace.snippets) if s.call_id == capture.snippets[-1].call_id), None)
    if snippet is None and div.recorded is not None and div.recorded.what.startswith("continue-as-new"):
        snippet = trace.snippets[-1] if trace.snippets else None
    if snippet is None:
        return
    div.snippet = snippet.call_id
    div.turn = next((t.index for t in trace.turns if snippet in t.snippets), None)
    replayed = capture.calls.get(div.call_id or "")
    replayed_snippet = next((s for s in reversed(capture.snippets) if s.call_id == snippet.call_id), None)
    div.recorded_result = snippet.result
    if replayed_snippet is not None and replayed_snippet.outcome is not None:
        div.replayed_result = preview(replayed_snippet.content)
    if replayed is not None and replayed.line:
        div.line = replayed.line
    elif (line := _traceback_line(replayed_snippet)) is not None:
        div.line = line  # where the replayed program stopped instead of making the call
    elif div.call_id is not None:
        recorded_tool = div.recorded.tool if div.recorded else None
        # Search from the snippet's last replayed call on: a tool called on several lines is then found where the
        # program had got to, not at its first use.
        made = [c.line for c in capture.calls.values() if c.call_id.rsplit(".", 1)[0] == snippet.call_id and c.line]
        div.line, div.line_guessed = _guess_line(snippet.code, recorded_tool, start=max(made, default=1)), True
    lines = code_lines(snippet.code)
    if div.line and 0 < div.line <= len(lines):
        div.source_line = lines[div.line - 1].rstrip()


def _explain(div: Divergence, recorded: RecordedRun) -> None:
    """Decide the likely cause from the two sides, and say what to do."""
    rec, rep = div.recorded, div.replayed
    rec_call = rec is not None and (_nested(rec.call_id) or rec.tool is not None)
    rep_call = rep is not None and (_nested(rep.call_id) or rep.tool is not None)
    limits = recorded.spec.limits if recorded.spec else None
    recorded_limits = (f" (the run's recorded limits: max_tool_calls={limits.max_tool_calls}, max_memory_bytes="
                       f"{limits.max_memory_bytes}, max_recursion_depth={limits.max_recursion_depth}, "
                       f"max_turn_seconds={limits.max_turn_seconds}, max_feed_seconds={limits.max_feed_seconds})"
                       if limits else "")
    reason = recorded.run.continue_reason
    if rec is not None and rec.what.startswith("continue-as-new") and reason == "sandbox_crashed":
        div.cause = "sandbox_crashed"
        div.explanation = (
            "expected: this run's snippet crashed the sandbox and the run continued as new in that workflow task. "
            "A crash does not happen again on replay, so the replay carries on past it. The open run never replays "
            "this task, and the next run of the chain replays on its own."
        )
    elif rec is not None and rec.what.startswith("continue-as-new") and reason == "compute_limit":
        div.cause = "compute_limit_not_hit"
        div.explanation = (
            "expected: this run's snippet went over its wall-time limit when it ran, but finished within it on this "
            f"replay (a faster or idler machine){recorded_limits}. Wall-time limits are not replay-safe, which is why "
            "the run ended that task by continue-as-new: no open run replays it."
        )
    elif rep is not None and rep.what.startswith("continue-as-new (compute_limit"):
        div.cause = "compute_limit_on_replay"
        div.explanation = (
            f"the snippet went over its wall-time limit on this replay but not when it ran{recorded_limits}: this "
            "machine is slower or busier than the worker was. Replay again on an idle machine; if it keeps "
            "happening, the snippet runs close to its limit (give later runs more time with SnippetLimits)."
        )
    elif rec_call and rep_call and rec is not None and rep is not None:
        if rec.call_id != rep.call_id:
            div.cause = "call_order_changed"
            div.explanation = (
                f"the replayed program made its calls in another order ({rep.call_id} is {rep.what} on replay, "
                f"{rec.call_id} was {rec.what}): non-deterministic code (something that differs between runs, "
                "such as an unsorted set or a value read outside the tools), or a change in the runtime."
            )
        elif rec.activity_type != rep.activity_type and recorded.spec is not None and any(
                t.activity_type == rec.activity_type for t in recorded.spec.tools):
            div.cause = "other_tool_called"
            div.explanation = (
                f"the replayed program calls {rep.what} as call {rep.call_id}, where the run called {rec.what} (both "
                "are tools of the agent): the program took another path through its code. Non-deterministic code "
                "(something that differs between runs), or a change in the runtime."
            )
        elif rec.activity_type != rep.activity_type:
            div.cause = "tool_renamed"
            div.explanation = (
                f"tool renamed: call {rec.call_id} went to activity type {rec.activity_type!r} when it ran; the "
                f"replay calls {rep.activity_type!r}. Runs started before a rename replay only where the old tool "
                "name is still served: keep the old name (an alias) until those runs are done, or let them finish "
                "on the old worker."
            )
        else:
            div.cause = "arguments_changed"
            div.explanation = (
                f"arguments changed: call {rec.call_id} is {rep.what} on replay, but was {rec.what} when it ran "
                "(same tool; the argument digest in the activity id differs). The snippet's code is recorded, so "
                "the program computed other arguments: non-deterministic code, a tool result read differently, or "
                "a change in the runtime that converts arguments."
            )
    elif rec_call and rec is not None:
        replayed_result = div.replayed_result
        if _limit_hit(replayed_result):
            div.cause = "sandbox_limits"
            div.explanation = (
                f"a sandbox limit stopped the replayed program before call {rec.call_id} ({rec.what}), which the "
                f"run made{recorded_limits}. Replays use the recorded limits, so the runtime now enforces them "
                "differently (a Monty or durable-codemode upgrade that counts calls, memory or recursion "
                "differently), or the recorded limits were edited."
            )
        else:
            div.cause = "snippet_ended_early"
            div.explanation = (
                f"the replayed program stopped before call {rec.call_id} ({rec.what}) and did "
                f"{rep.what if rep else 'something else'} instead: non-deterministic code or a runtime change."
            )
    elif rep_call and rep is not None:
        div.cause = "sandbox_limits" if _limit_hit(div.recorded_result) else "extra_call"
        div.explanation = (
            f"the replayed program made call {rep.call_id} ({rep.what}) where the run did "
            f"{rec.what if rec else 'something else'}"
            + (f"; when it ran, a sandbox limit had stopped it there{recorded_limits}" if div.cause == "sandbox_limits"
               else ": non-deterministic code, or a runtime change")
            + "."
        )
    elif rep is not None and rep.what.startswith("a timer"):
        div.cause = "non_deterministic"
        div.explanation = ("the replayed program waits on a timer (a sleep) where the run did "
                           f"{rec.what if rec else '?'}: non-deterministic code, or a runtime change.")
    else:
        div.cause = "other"
        div.explanation = (
            "the workflow took another path than the recorded one: most likely a change in durable-codemode's "
            "workflow code between the version that ran this and this one. Replay with the version that ran it."
        )


def _blame_a_changed_rule(div: Divergence, recorded: RecordedRun, capture: ReplayCapture) -> None:
    """Name the approval rule when a changed rule is what made a run of behaviour version 1 diverge.

    Such runs ask their rules again on replay (later runs record each verdict). A rule changed when the replay
    gates a call the run made without a person, or lets through a call a person decided when the run ran; or, for
    an open run waiting on a call, when the replay schedules that call where the run recorded that it waits.
    """
    spec = recorded.spec
    if spec is None or spec.behavior_version >= RECORDED_RULE_VERDICTS:
        return
    ruled = {t.name for t in spec.tools if t.approval_rule}
    if not ruled:
        return
    decided = {r.call_id for r in recorded.records} | {d.call_id for _, d in recorded.signals}
    ran_unasked = {a.tool_call()[0] for a in recorded.activities if not a.local} - decided
    asked = set(capture.asked)
    changed: tuple[str, str, str] | None = None
    for made in capture.calls.values():
        if made.tool not in ruled:
            continue
        if made.call_id in decided and made.call_id not in asked:
            changed = (made.call_id, "needs no approval", "waited for a person")
        elif made.call_id in asked and made.call_id in ran_unasked:
            changed = (made.call_id, "needs approval", "ran without one")
        if changed is not None:
            break
    rep = div.replayed
    if changed is None and rep is not None and rep.tool in ruled and rep.call_id not in asked and (
            div.recorded is not None and div.recorded.what.startswith("upsert workflow search attributes")):
        changed = (str(rep.call_id), "needs no approval", "waited for a person (the run waits there)")
    if changed is None:
        return
    call_id, now, then = changed
    call = capture.calls.get(call_id)
    what = f"{call.tool}({_args_text(call.args)})" if call is not None else call_id
    div.cause = "approval_rule_changed"
    div.call_id = call_id
    div.explanation = (
        f"the approval rule of {call.tool if call else 'the tool'}() changed since this run started: call {call_id} "
        f"{what} {now} by the rule given to this replay, but {then} when it ran. This run asks its rules again on "
        "every replay (it was started by a release that did not record rules' verdicts: behaviour version 1), so "
        "it replays, and finishes, only with the rule as it was: let it finish on the worker version that started "
        "it (a pinned deploy), or keep the old rule until such runs are done. Runs of this release record each "
        "verdict, and no rule change affects their replay.")


def divergence(history: WorkflowHistory, capture: ReplayCapture, trace: RunTrace) -> Divergence:
    assert capture.failure is not None
    message = failure_message(capture.failure)
    recorded = read_run(history)
    div = Divergence(cause="other", explanation="", message=message)
    refusal = behavior_version_refusal(recorded.spec, history.workflow_id) if recorded.spec is not None else None
    if refusal is not None:
        div.cause = "behavior_version_unsupported"
        div.explanation = (
            f"the run was recorded with behaviour version {refusal.version}, which this release does not replay: "
            "replay it " + (f"with {refusal.release} (pip install '{refusal.requirement}')." if refusal.release else
                            "with the newer release that recorded it."))
        return div
    if RULE_GONE in message:
        div.cause = "approval_rule_gone"
        last = list(capture.calls.values())[-1] if capture.calls else None  # the call whose rule was looked up
        tool = f"{last.tool}()" if last is not None else "this tool"
        if last is not None:
            div.replayed = CallSide(what=f"{last.tool}({_args_text(last.args)})", call_id=last.call_id,
                                    tool=last.tool, args=last.args)
        div.explanation = (
            f"the agents given to this replay (--worker MODULE) have no approval rule for {tool} any more, and this "
            "run asks its rules again on every replay: it was started by a release that did not record rules' "
            "verdicts (behaviour version 1). Replay it with the worker module of the version that started it, and "
            "let such runs finish on that version (a pinned deploy) before dropping the rule.")
        _locate(div, trace, capture)
        return div
    if _RULE_UNKNOWN in message:
        div.cause = "approval_rule_unknown"
        div.explanation = (
            "the replay needs the agent's approval rules, which live in code: pass --worker MODULE (a module that "
            "defines the agents, e.g. the one your worker imports) or call "
            "durable_codemode.debugging.register_agents(...) before replaying."
        )
        if capture.calls:
            call = list(capture.calls.values())[-1]  # the call whose rule was looked up when the replay stopped
            div.replayed = CallSide(what=f"{call.tool}({_args_text(call.args)})", call_id=call.call_id,
                                    tool=call.tool, args=call.args)
        _locate(div, trace, capture)
        return div
    scheduled = [a for a in recorded.activities if not a.local]
    if found := _ID_MISMATCH.search(message):
        rec = next((a for a in scheduled if a.activity_id == found["recorded"]), None)
        command = capture.command_for_id(found["replayed"])
        div.recorded = _recorded_side(rec, trace) if rec else CallSide(what=f"activity {found['recorded']}")
        div.replayed = _replayed_side(command, capture) if command else CallSide(what=f"activity {found['replayed']}")
    elif found := _TYPE_MISMATCH.search(message):
        commands = [c for c in capture.commands if c.kind == "activity"]
        pairs = list(zip(scheduled, commands, strict=False))
        pair = next(((a, c) for a, c in pairs if a.activity_type == found["recorded"]
                     and c.activity_type == found["replayed"]), None)
        if pair is not None:
            div.recorded, div.replayed = _recorded_side(pair[0], trace), _replayed_side(pair[1], capture)
        else:
            div.recorded = CallSide(what=f"activity type {found['recorded']}", activity_type=found["recorded"])
            div.replayed = CallSide(what=f"activity type {found['replayed']}", activity_type=found["replayed"])
    elif found := _MACHINE.search(message):
        event_id = int(found["event"])
        div.recorded = _event_side(history, event_id, recorded, trace)
        position = sum(1 for a in scheduled if a.event_id < event_id)
        div.replayed = _machine_side(found["machine"], capture, position)
    elif found := _EVENT.search(message):
        div.recorded = _event_side(history, int(found["event"]), recorded, trace)
    _locate(div, trace, capture)
    _explain(div, recorded)
    _blame_a_changed_rule(div, recorded, capture)
    if not div.explanation:
        div.explanation = "the replay failed inside the workflow: " + message
    return div
