"""Chat with a durable agent over pydantic-ai's UI protocol (Vercel AI data stream): `chat_app`.

A chat frontend that speaks the Vercel AI SDK (v6: tool approvals) posts each turn to `/api/chat`; here, instead of
running the agent in the server's process, each user message starts a durable run of the `CodeModeAgent` on its
workers, and the run's event stream is turned into the protocol's events by pydantic-ai's own adapter
(`VercelAIAdapter.transform_stream`): the model's text as it streams, the `run_code` call and its result, and code
mode's events as `data-codemode.*` parts.

- **A conversation's runs.** Turn `n` of chat `ID` is the run `<agent>-chat-ID-n`, started with the previous run's
  messages (`RunResult.messages`: what the model saw, kept in Temporal, not the client's copy). A request for a
  turn that already has its run (a page reload, a retry) attaches to that run and streams its events again from
  its start: nothing is started twice.
- **A paused call** (one that waits for a person) ends the response with the protocol's tool-approval request, on
  a tool part for that call (its tool and arguments; its id names the run, the call and the stream offset, under
  an HMAC the server made, so a client cannot point an answer at another run). The frontend's answer comes back
  as the next request; it is sent to the run as a decision by the app's one approver (`UIAccess`, signed as
  `codemode approve --key` signs), and the response goes on with the run's events after the pause. Such a tool
  part is the protocol's, not the model's: it never enters a run's history.
- Who may chat is the embedding server's business (put the app behind its authentication); who decides is the
  approver the app was made with, or nobody (an approval answer is then refused by name).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic_ai.messages import (
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    PartEndEvent,
    PartStartEvent,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.run import AgentRunResultEvent
from pydantic_ai.tools import DeferredToolRequests, ToolDenied
from pydantic_ai.ui.vercel_ai import VercelAIAdapter
from pydantic_ai.usage import RunUsage
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError

from .._errors import CodeModeUserError, DecisionConflictError, RunClosedError, WorkerUnavailableError
from .._pydantic_ai import agent_run_result
from .._results import printable
from .._run_events import ApprovalWaitEvent
from ..client._operations import decide, pending_approvals, run_result, start_run
from ..client._stream import stream_events
from ..worker._agent import CodeModeAgent
from ..worker._worker import DEFAULT_TASK_QUEUE
from ..workflow._run import CodeModeRunWorkflow
from ._app import UIAccess

__all__ = ["chat_app"]

_APPROVAL_PREFIX = "codemode-approval-"
_CHAT_ID = re.compile(r"[A-Za-z0-9_.-]{1,100}")


class _Approvals:
    """The tool-call ids a paused call travels under: its run, call and offset, sealed by the server's key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def seal(self, run_id: str, call_id: str, offset: int) -> str:
        payload = base64.urlsafe_b64encode(json.dumps([run_id, call_id, offset]).encode()).decode().rstrip("=")
        mac = hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{_APPROVAL_PREFIX}{payload}.{mac}"

    def open(self, sealed: str) -> tuple[str, str, int] | None:
        """`(run_id, call_id, offset)` of an id this server sealed; `None` for any other (or a forged) id."""
        if not sealed.startswith(_APPROVAL_PREFIX):
            return None
        payload, _, mac = sealed[len(_APPROVAL_PREFIX):].rpartition(".")
        expected = hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()[:32]
        if not payload or not hmac.compare_digest(mac, expected):
            return None
        try:
            run_id, call_id, offset = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, TypeError):
            return None
        if not (isinstance(run_id, str) and isinstance(call_id, str) and isinstance(offset, int)):
            return None
        return run_id, call_id, offset


def _last_prompt(messages: list[ModelMessage]) -> str:
    """The text of the user's newest message."""
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            texts = [p.content for p in message.parts if isinstance(p, UserPromptPart) and isinstance(p.content, str)]
            if texts:
                return "\n".join(texts)
    raise CodeModeUserError("the request has no user message to answer")


def chat_app(agent: CodeModeAgent, client: Client, *, protocol: Literal["vercel_ai", "ag_ui"] = "vercel_ai",
             task_queue: str = DEFAULT_TASK_QUEUE, access: UIAccess | None = None, key: bytes | None = None,
             path: str = "/api/chat") -> Starlette:
    """A Starlette app serving a Vercel AI SDK chat endpoint (`POST path`) over durable runs of `agent`.

    Args:
        protocol: the UI protocol: `vercel_ai` (the Vercel AI SDK's data stream, v6). AG-UI is refused by name:
            its approvals (interrupts) are not mapped onto a durable run's pause yet.
        agent: the `CodeModeAgent` the chat talks to (served by workers on `task_queue`).
        client: from `durable_codemode.connect()`.
        task_queue: the workers' task queue.
        access: who approves or denies a paused call when the frontend answers its approval request (`UIAccess`:
            a key to sign with, or a name for unsigned decisions); `None`: answers are refused.
        key: the key the approval requests' ids are sealed with (default: random, so an approval request survives
            only as long as this process; give one to keep them valid across restarts).
        path: where the endpoint is.

    """
    if protocol != "vercel_ai":
        raise CodeModeUserError(f"chat_app(protocol={protocol!r}): only 'vercel_ai' (the Vercel AI SDK data stream, "
                                "v6) is served over durable runs yet; AG-UI's interrupts are not mapped onto a run's "
                                "pause for approval")
    access = access or UIAccess()
    approvals = _Approvals(key or os.urandom(32))
    output_type = agent.output_type

    async def native(run_id: str, after: int | None, answered: list[ToolReturnPart]) -> AsyncIterator[Any]:
        """The run's events for pydantic-ai's adapter, a paused call as the protocol's approval request.

        `answered`: the approval requests this request answered, closed first (the frontend then shows them done,
        and does not send them as answers again).
        """
        for closed in answered:
            yield FunctionToolResultEvent(closed)
        async for item in stream_events(client, run_id, after=after, output_type=output_type):
            event = item.event
            if isinstance(event, ApprovalWaitEvent):
                waiting = {p.call_id: p for p in await pending_approvals(client, run_id)}
                pending = waiting.get(event.call_id)
                args = pending.args if pending is not None else {}
                asked = ToolCallPart(tool_name=event.tool, args=args,
                                     tool_call_id=approvals.seal(run_id, event.call_id, item.offset))
                yield PartStartEvent(index=0, part=asked)
                yield PartEndEvent(index=0, part=asked)
                yield FunctionToolCallEvent(asked, args_valid=True)
                yield AgentRunResultEvent(agent_run_result(
                    DeferredToolRequests(approvals=[asked]), [ModelResponse(parts=[asked])], RunUsage()))
                return
            yield event

    async def answer(adapter: VercelAIAdapter[Any, Any],
                     answered: list[ToolReturnPart]) -> tuple[str, int | None] | Response:
        """Send the frontend's answers to approval requests; the run to go on with, after which offset."""
        results = adapter.deferred_tool_results
        assert results is not None
        resumed: tuple[str, int | None] | None = None
        # (from the UI parts, `tool-<name>`: the history pydantic-ai would load ends with the calls being answered)
        tools = {str(getattr(p, "tool_call_id", "")): str(p.type).removeprefix("tool-")
                 for m in adapter.run_input.messages for p in m.parts if str(p.type).startswith("tool-")}
        for sealed, verdict in results.approvals.items():
            opened = approvals.open(sealed)
            if opened is None:
                continue  # not ours (or no longer valid): the run's own tool parts are not answered here
            run_id, call_id, offset = opened
            if not access.can_decide:
                return _refused(403, "this chat decides no approvals: make it with chat_app(..., access=UIAccess("
                                     "signer=...)) to decide as an approver")
            approved = verdict is True or (not isinstance(verdict, ToolDenied) and bool(verdict))
            note = verdict.message if isinstance(verdict, ToolDenied) else None
            try:
                await decide(client, run_id, call_id, approved=approved, note=note, approver=access.name,
                             signer=access.signer)
            except WorkflowUpdateFailedError as e:  # decided before (this answer sent again: it goes on), or refused
                cause = getattr(e.cause, "message", None) or str(e.cause or e)
                if "already decided" not in cause:
                    return _refused(409, f"the run refused the decision: {cause}")
            except (DecisionConflictError, RunClosedError) as e:
                return _refused(409, f"{e}; nothing was decided")
            verdict_text = ("approved" if approved else "denied") + f" by {access.name}" + (f": {note}" if note else "")
            answered.append(ToolReturnPart(tool_name=tools.get(sealed, call_id), content=verdict_text,
                                           tool_call_id=sealed))
            resumed = (run_id, offset)
        if resumed is None:
            return _refused(400, "the request answers no approval request of this chat")
        return resumed

    async def chat(request: Request) -> Response:
        try:
            adapter = await VercelAIAdapter.from_request(request, agent=agent.agent, sdk_version=6)
        except Exception as e:  # a malformed body: pydantic's validation error, or the content type
            status = getattr(e, "status_code", 400)
            return _refused(status, f"not a Vercel AI chat request: {e}")
        chat_id = getattr(adapter.run_input, "id", None) or ""
        if not _CHAT_ID.fullmatch(chat_id):
            return _refused(400, "the chat request needs its id (letters, digits, _ . -, at most 100)")
        answered: list[ToolReturnPart] = []
        messages = adapter.run_input.messages
        try:
            if messages and messages[-1].role == "user":  # a new turn (older answered approvals stay in history)
                run_id, after = await _start_turn(adapter, chat_id), None
            elif adapter.deferred_tool_results is not None:
                resumed = await answer(adapter, answered)
                if isinstance(resumed, Response):
                    return resumed
                run_id, after = resumed
            else:
                return _refused(400, "the request neither asks (its last message is not the user's) nor answers an "
                                     "approval request")
        except WorkerUnavailableError as e:
            return _refused(503, str(e))
        except CodeModeUserError as e:
            return _refused(400, str(e))
        return adapter.streaming_response(adapter.transform_stream(native(run_id, after, answered)))

    async def _start_turn(adapter: VercelAIAdapter[Any, Any], chat_id: str) -> str:
        """Start (or find) the run of the chat's newest user turn; its run id."""
        turn = sum(1 for m in adapter.run_input.messages if m.role == "user")
        run_id = f"{agent.name}-chat-{chat_id}-{turn}"
        history: list[ModelMessage] = []
        if turn > 1:  # the conversation so far, as the previous run left it
            previous = await run_result(client.get_workflow_handle_for(
                CodeModeRunWorkflow.run, f"{agent.name}-chat-{chat_id}-{turn - 1}"))
            history = list(previous.messages)
        # A reload or a retry of the same turn finds its run started: it goes on, and is streamed again.
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await start_run(client, agent, _last_prompt(adapter.messages), task_queue=task_queue,
                            message_history=history, run_id=run_id, stream=True)
        return run_id

    return Starlette(routes=[Route(path, chat, methods=["POST"])])


def _refused(status: int, message: str) -> Response:
    return JSONResponse({"error": printable(message)}, status_code=status)

