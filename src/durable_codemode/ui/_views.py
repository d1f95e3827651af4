r"""What the web page is sent: runs, a run's events, its waiting calls and its trace, as JSON made for display.

Every string that comes from a run (model-written code, tool arguments and results, prints, approver names and
notes, error messages, ids) passes `printable` here, on the server: control characters and bidirectional overrides
become visible escapes (`\x1b`, `\u202e`) before the page sees them, and the page puts them in the document as
text (`textContent`), never as HTML. Multi-line texts (code, prints) keep their line breaks.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic_ai.messages import (
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
)
from pydantic_ai.run import AgentRunResultEvent

from ..client._listing import RunSummary
from ..client._stream import RunEventItem
from ..shared._approvals import PendingApproval
from ..shared._names import RUN_CODE_TOOL
from ..shared._results import answer_text, call_arguments, preview, printable
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
    RunStartEvent,
    SnippetEndEvent,
    SnippetStartEvent,
)

__all__ = ["event_view", "pending_view", "run_view"]


def _text(value: Any) -> str:
    """One line of untrusted text, made safe to show."""
    return printable(str(value))


def _lines(value: Any) -> str:
    """Untrusted text whose line breaks are its own (code, prints), made safe to show."""
    return printable(str(value), lines=True)


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def run_view(run: RunSummary) -> dict[str, Any]:
    """A row of the runs page."""
    return {"id": _text(run.workflow_id), "raw_id": run.workflow_id, "agent": _text(run.agent or "?"),
            "state": run.state, "started": _when(run.started_at), "closed": _when(run.closed_at),
            "waiting": run.pending_approvals, "calls": None}


def pending_view(pending: PendingApproval, *, policy: str | None = None) -> dict[str, Any]:
    """A call waiting for a person, with what the person decides on: its arguments whole, its line of code."""
    lines = pending.code.splitlines()
    line = lines[pending.line - 1] if 0 < pending.line <= len(lines) else ""
    return {"call_id": _text(pending.call_id), "raw_call_id": pending.call_id, "tool": _text(pending.tool),
            "args": _text(call_arguments(pending.args, 2000)), "line": pending.line, "code_line": _lines(line),
            "requested": _when(pending.requested_at), "expires": _when(pending.expires_at), "policy": policy,
            "run_id": _text(pending.run_id) if pending.run_id else None}


def event_view(item: RunEventItem) -> dict[str, Any] | None:
    """One event of a run's stream as the run page draws it; `None` for what it does not draw."""
    event = item.event
    view: dict[str, Any]
    match event:
        case RunStartEvent(agent=agent, model=model):
            view = {"kind": "run_start", "agent": _text(agent), "model": _text(model or "")}
        case ModelRequestStartEvent(turn=turn):
            view = {"kind": "model_request", "turn": turn}
        case ModelStreamResetEvent(turn=turn, reason=reason):
            view = {"kind": "reset", "turn": turn, "reason": _text(reason)}
        case PartStartEvent(index=index, part=TextPart(content=text)):
            view = {"kind": "text", "index": index, "text": _lines(text), "start": True}
        case PartDeltaEvent(index=index, delta=TextPartDelta(content_delta=text)):
            view = {"kind": "text", "index": index, "text": _lines(text), "start": False}
        case PartEndEvent(index=index, part=TextPart(content=text)):
            view = {"kind": "text_end", "index": index, "text": _lines(text)}
        case FunctionToolCallEvent(part=ToolCallPart(tool_name=tool, tool_call_id=call_id) as part):
            args = part.args_as_dict() if not isinstance(part.args, str) or part.args.strip().startswith("{") else {}
            view = {"kind": "tool_call", "call_id": _text(call_id), "tool": _text(tool),
                    "args": "" if tool == RUN_CODE_TOOL else _text(call_arguments(args, 500))}
        case FunctionToolResultEvent(part=part):
            view = {"kind": "tool_result", "call_id": _text(part.tool_call_id), "result": _text(preview(part.content))}
        case SnippetStartEvent(code=code, tool_call_id=call_id):
            view = {"kind": "snippet_start", "call_id": _text(call_id or ""), "code": _lines(code)}
        case NestedCallStartEvent(call_id=call_id, tool=tool, args=args, line=line, needs_approval=gated):
            view = {"kind": "call_start", "call_id": _text(call_id), "tool": _text(tool), "args": _text(args),
                    "line": line, "gated": gated}
        case NestedCallEndEvent(call_id=call_id, status=status, seconds=seconds, result=result):
            view = {"kind": "call_end", "call_id": _text(call_id), "status": status, "seconds": seconds,
                    "result": _text(result)}
        case PrintEvent(text=text, tool_call_id=call_id):
            view = {"kind": "print", "call_id": _text(call_id or ""), "text": _lines(text)}
        case ApprovalWaitEvent(call_id=call_id, tool=tool, args=args, line=line, policy=policy):
            view = {"kind": "approval_wait", "call_id": _text(call_id), "raw_call_id": call_id, "tool": _text(tool),
                    "args": _text(args), "line": line, "policy": _text(policy) if policy else None}
        case ApprovalDecidedEvent(call_id=call_id, approved=approved, approver=approver, note=note, via=via,
                                  settled=settled):
            view = {"kind": "approval_decided", "call_id": _text(call_id), "approved": approved,
                    "approver": _text(approver) if approver else None, "note": _text(note) if note else None,
                    "via": _text(via), "settled": settled}
        case ChildRunStartEvent(call_id=call_id, run_id=run_id, agent=agent):
            view = {"kind": "child_start", "call_id": _text(call_id), "run_id": _text(run_id), "raw_run_id": run_id,
                    "agent": _text(agent)}
        case ChildRunEndEvent(call_id=call_id, run_id=run_id, status=status, error=error):
            view = {"kind": "child_end", "call_id": _text(call_id), "run_id": _text(run_id), "status": status,
                    "error": _text(error) if error else None}
        case ComputeEscalatedEvent(reason=reason, tool_call_id=call_id):
            view = {"kind": "compute", "call_id": _text(call_id or ""), "reason": _text(reason)}
        case SnippetEndEvent(outcome=outcome, calls=calls, result=result, tool_call_id=call_id):
            view = {"kind": "snippet_end", "call_id": _text(call_id or ""), "outcome": outcome, "calls": calls,
                    "result": _text(result)}
        case RunContinuedEvent(run_index=index):
            view = {"kind": "continued", "run_index": index}
        case EventsTrimmedEvent(missed=missed):
            view = {"kind": "trimmed", "missed": missed}
        case RunEndEvent(status=status, error=error):
            view = {"kind": "end", "status": status, "error": _text(error) if error else None, "output": None}
        case AgentRunResultEvent(result=result):
            view = {"kind": "end", "status": "completed", "error": None,
                    "output": _lines(preview(answer_text(result.output), 2000))}
        case _:
            return None
    view["offset"] = item.offset
    return view
