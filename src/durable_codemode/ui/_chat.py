"""Chat with a durable agent over pydantic-ai's UI protocols (Vercel AI data stream, AG-UI): `chat_app`.

A chat frontend that speaks the Vercel AI SDK (v6: tool approvals) or AG-UI (interrupts) posts each turn to
`/api/chat`; here, instead of running the agent in the server's process, each user message starts a durable run of
the `CodeModeAgent` on its workers, and the run's event stream is turned into the protocol's events by pydantic-ai's
own adapter (`VercelAIAdapter` / `AGUIAdapter`, `transform_stream`): the model's text as it streams, the `run_code`
call and its result, and code mode's events (`data-codemode.*` parts; AG-UI `CUSTOM` events).

- **A conversation's runs.** Turn `n` of chat `ID` is the run `<agent>-chat-ID-n`, started with the previous run's
  messages (`RunResult.messages`: what the model saw, kept in Temporal, not the client's copy). A request for a
  turn that already has its run (a page reload, a retry) attaches to that run and streams its events again from
  its start: nothing is started twice.
- **A paused call** (one that waits for a person) ends the response with the protocol's tool-approval request
  (Vercel AI: a `tool-approval-request` on a tool part for that call; AG-UI: `RUN_FINISHED` with an interrupt
  outcome), carrying the call's tool and arguments under an id that names the run, the call, the stream offset and
  the tool, under an HMAC the server made, so a client cannot point an answer at another run. The frontend's answer
  comes back as the next request (Vercel AI: the part in `approval-responded` state; AG-UI: `resume[]`); it is sent
  to the run as a decision by the app's one approver (`UIAccess`, signed as `codemode approve --key` signs), and the
  response goes on with the run's events after the pause. Such a tool call is the protocol's, not the model's: it
  never enters a run's history. An answer that edits the call's arguments (AG-UI's `editedArgs`) is refused: a
  person approves or denies what the program asked for.
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

from pydantic_ai.exceptions import UserError
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
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.ui import UIAdapter
from pydantic_ai.ui.vercel_ai import VercelAIAdapter
from pydantic_ai.ui.vercel_ai.request_types import SubmitMessage
from pydantic_ai.usage import RunUsage
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from .._pydantic_ai import agent_run_result
from ..client._deciding import decide, pending_approvals
from ..client._runs import run_result, start_run
from ..client._stream import stream_events
from ..shared._approvals import PendingApproval
from ..shared._errors import CodeModeUserError, DecisionConflictError, RunClosedError, WorkerUnavailableError
from ..shared._names import DEFAULT_TASK_QUEUE
from ..shared._results import printable
from ..shared._run_events import ApprovalWaitEvent
from ..worker._agent import CodeModeAgent
from ..workflow._run import CodeModeRunWorkflow
from ._app import UIAccess

__all__ = ["chat_app"]

_APPROVAL_PREFIX = "codemode-approval-"
_CHAT_ID = re.compile(r"[A-Za-z0-9_.-]{1,100}")


class _Approvals:
    """The tool-call ids a paused call travels under: its run, call, offset and tool, sealed by the server's key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def seal(self, run_id: str, call_id: str, offset: int, tool: str) -> str:
        payload = base64.urlsafe_b64encode(json.dumps([run_id, call_id, offset, tool]).encode()).decode().rstrip("=")
        mac = hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{_APPROVAL_PREFIX}{payload}.{mac}"

    def open(self, sealed: str) -> tuple[str, str, int, str] | None:
        """`(run_id, call_id, offset, tool)` of an id this server sealed; `None` for any other (or a forged) id."""
        if not sealed.startswith(_APPROVAL_PREFIX):
            return None
        payload, _, mac = sealed[len(_APPROVAL_PREFIX):].rpartition(".")
        expected = hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()[:32]
        if not payload or not hmac.compare_digest(mac, expected):
            return None
        try:
            run_id, call_id, offset, tool = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, TypeError):
            return None
        if not (isinstance(run_id, str) and isinstance(call_id, str) and isinstance(offset, int)
                and isinstance(tool, str)):
            return None
        return run_id, call_id, offset, tool


def _last_prompt(messages: list[ModelMessage]) -> str:
    """The text of the user's newest message."""
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            texts = [p.content for p in message.parts if isinstance(p, UserPromptPart) and isinstance(p.content, str)]
            if texts:
                return "\n".join(texts)
    raise CodeModeUserError("the request has no user message to answer")


class _Protocol:
    """What differs between the protocols: the adapter, where the chat's id is, and how an answer is told apart."""

    def __init__(self, name: Literal["vercel_ai", "ag_ui"]) -> None:
        self.name = name
        if name == "vercel_ai":
            self.adapter: type[UIAdapter[Any, Any, Any, Any, Any]] = VercelAIAdapter
            self.options: dict[str, Any] = {"sdk_version": 6}
            return
        if name != "ag_ui":
            raise CodeModeUserError(f"chat_app(protocol={name!r}): the protocol is 'vercel_ai' (the Vercel AI SDK data "
                                    "stream, v6) or 'ag_ui' (AG-UI)")
        try:
            import ag_ui.core
            from pydantic_ai.ui.ag_ui import AGUIAdapter
        except ImportError as e:
            raise CodeModeUserError("chat_app(protocol='ag_ui') needs the AG-UI SDK: pip install "
                                    f"'durable-codemode[ag-ui]' (or 'pydantic-ai-slim[ag-ui]') ({e})") from e
        if not hasattr(ag_ui.core, "ResumeEntry"):
            raise CodeModeUserError("chat_app(protocol='ag_ui') needs AG-UI's interrupts (a paused call is one): "
                                    "pip install 'ag-ui-protocol>=0.1.19'")
        self.adapter, self.options = AGUIAdapter, {}

    def chat_id(self, adapter: UIAdapter[Any, Any, Any, Any, Any]) -> str:
        run_input = adapter.run_input
        found = getattr(run_input, "id" if self.name == "vercel_ai" else "thread_id", None)
        return found if isinstance(found, str) else ""

    def answers(self, adapter: UIAdapter[Any, Any, Any, Any, Any]) -> DeferredToolResults | None:
        """The approval answers the request carries, if it is an answer (rather than a new user turn)."""
        messages = adapter.run_input.messages
        if self.name == "ag_ui":  # answers travel in `resume[]`, apart from the messages
            return adapter.deferred_tool_results
        if messages and messages[-1].role == "user":  # a new turn (older answered approvals stay in history)
            return None
        return adapter.deferred_tool_results


def chat_app(agent: CodeModeAgent, client: Client, *, protocol: Literal["vercel_ai", "ag_ui"] = "vercel_ai",
             task_queue: str = DEFAULT_TASK_QUEUE, access: UIAccess | None = None, key: bytes | None = None,
             path: str = "/api/chat") -> Starlette:
    """A Starlette app serving a chat endpoint (`POST path`) over durable runs of `agent`.

    Args:
        agent: the `CodeModeAgent` the chat talks to (served by workers on `task_queue`).
        client: from `durable_codemode.connect()`.
        protocol: the UI protocol: `vercel_ai` (the Vercel AI SDK's data stream, v6) or `ag_ui` (AG-UI, with its
            interrupts; needs `pip install 'durable-codemode[ag-ui]'`).
        task_queue: the workers' task queue.
        access: who approves or denies a paused call when the frontend answers its approval request (`UIAccess`:
            a key to sign with, or a name for unsigned decisions); `None`: answers are refused.
        key: the key the approval requests' ids are sealed with (default: random, so an approval request survives
            only as long as this process; give one to keep them valid across restarts).
        path: where the endpoint is.

    """
    kind = _Protocol(protocol)
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
            # A wait decided since (a reload of a turn that went on) streams on, as the events it was.
            pending = await _still_waiting(run_id, event.call_id) if isinstance(event, ApprovalWaitEvent) else None
            if isinstance(event, ApprovalWaitEvent) and pending is not None:
                asked = ToolCallPart(tool_name=event.tool, args=pending.args,
                                     tool_call_id=approvals.seal(run_id, event.call_id, item.offset, event.tool))
                yield PartStartEvent(index=0, part=asked)
                yield PartEndEvent(index=0, part=asked)
                yield FunctionToolCallEvent(asked, args_valid=True)
                yield AgentRunResultEvent(agent_run_result(
                    DeferredToolRequests(approvals=[asked]), [ModelResponse(parts=[asked])], RunUsage()))
                return
            yield event

    async def _still_waiting(run_id: str, call_id: str) -> PendingApproval | None:
        try:
            waiting = await pending_approvals(client, run_id)
        except RunClosedError:
            return None  # the run ended since: whatever waited was decided (or expired)
        return next((p for p in waiting if p.call_id == call_id), None)

    async def answer(results: DeferredToolResults, answered: list[ToolReturnPart]) -> tuple[str, int | None] | Response:
        """Send the frontend's answers to approval requests; the run to go on with, after which offset."""
        resumed: tuple[str, int | None] | None = None
        for sealed, verdict in results.approvals.items():
            opened = approvals.open(sealed)
            if opened is None:
                continue  # not ours (or no longer valid): the run's own tool parts are not answered here
            run_id, call_id, offset, tool = opened
            if not access.can_decide:
                return _refused(403, "this chat decides no approvals: make it with chat_app(..., access=UIAccess("
                                     "signer=...)) to decide as an approver")
            if isinstance(verdict, ToolApproved) and verdict.override_args is not None:
                return _refused(400, f"the answer to {tool} edits its arguments: a paused call is approved or "
                                     "denied as the program asked for it (deny it, with a note, to have it asked "
                                     "again); nothing was decided")
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
            answered.append(ToolReturnPart(tool_name=tool, content=verdict_text, tool_call_id=sealed))
            resumed = (run_id, offset)
        if resumed is None:
            return _refused(400, "the request answers no approval request of this chat")
        return resumed

    async def chat(request: Request) -> Response:
        try:
            adapter = await kind.adapter.from_request(request, agent=agent.agent, **kind.options)
        except Exception as e:  # a malformed body: pydantic's validation error, or the content type
            status = getattr(e, "status_code", 400)
            return _refused(status, f"not a {_NAMES[kind.name]} chat request: {e}")
        chat_id = kind.chat_id(adapter)
        if not _CHAT_ID.fullmatch(chat_id):
            return _refused(400, f"the chat request needs its {'threadId' if kind.name == 'ag_ui' else 'id'} "
                                 "(letters, digits, _ . -, at most 100)")
        answered: list[ToolReturnPart] = []
        messages = adapter.run_input.messages
        try:
            results = kind.answers(adapter)
            if results is not None:
                resumed = await answer(results, answered)
                if isinstance(resumed, Response):
                    return resumed
                run_id, after = resumed
            elif messages and messages[-1].role == "user":
                run_id, after = await _start_turn(adapter, chat_id), None
            else:
                return _refused(400, "the request neither asks (its last message is not the user's) nor answers an "
                                     "approval request")
        except UserError as e:  # pydantic-ai's reading of a malformed answer (an AG-UI resume payload)
            return _refused(400, f"the approval answer is malformed: {e}; nothing was decided")
        except WorkerUnavailableError as e:
            return _refused(503, str(e))
        except CodeModeUserError as e:
            return _refused(400, str(e))
        return adapter.streaming_response(adapter.transform_stream(native(run_id, after, answered)))

    async def _start_turn(adapter: UIAdapter[Any, Any, Any, Any, Any], chat_id: str) -> str:
        """Start (or find) the run of the chat's newest user turn; its run id."""
        turn = sum(1 for m in adapter.run_input.messages if m.role == "user")
        run_id = f"{agent.name}-chat-{chat_id}-{turn}"
        history: list[ModelMessage] = []
        if turn > 1:  # the conversation so far, as the previous run left it
            previous = await run_result(client.get_workflow_handle_for(
                CodeModeRunWorkflow.run, f"{agent.name}-chat-{chat_id}-{turn - 1}"))
            history = list(previous.messages)
        # A reload or a retry of the same turn finds its run (running or closed: a closed run's id would be reused
        # by a new run, the turn done twice): it is streamed again.
        if await _turn(chat_id, turn) is not None:
            return run_id
        with contextlib.suppress(WorkflowAlreadyStartedError):  # two requests for the turn at once: one starts it
            await start_run(client, agent, _last_prompt(adapter.messages), task_queue=task_queue,
                            message_history=history, run_id=run_id, stream=True)
        return run_id

    async def reconnect(request: Request) -> Response:
        """The Vercel AI SDK's `resume: true` (`GET path/ID/stream`): the chat's latest turn, if it has not ended.

        204 when there is nothing to resume (no turn, or its run closed), as the SDK expects. The page lost what it
        had of the turn, so the turn's run streams from its start.
        """
        chat_id = str(request.path_params["chat_id"])
        if not _CHAT_ID.fullmatch(chat_id):
            return _refused(400, "the chat id is letters, digits, _ . - (at most 100)")
        try:
            latest = await _latest_turn(chat_id)
        except RPCError as e:
            return _refused(503, f"cannot read chat {chat_id!r} from Temporal: {e.message}")
        run_id = latest.id if latest is not None and latest.status == WorkflowExecutionStatus.RUNNING else None
        if run_id is None:
            return Response(status_code=204)
        adapter = VercelAIAdapter(agent=agent.agent, run_input=SubmitMessage(id=chat_id, messages=[]),
                                  accept=request.headers.get("accept"), sdk_version=6)
        return adapter.streaming_response(adapter.transform_stream(native(run_id, None, [])))

    async def _turn(chat_id: str, turn: int) -> WorkflowExecutionDescription | None:
        try:
            return await client.get_workflow_handle(f"{agent.name}-chat-{chat_id}-{turn}").describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None
            raise

    async def _latest_turn(chat_id: str) -> WorkflowExecutionDescription | None:
        """The run of the chat's newest turn: turns are numbered from 1 without gaps, so double, then halve."""
        found, high = await _turn(chat_id, 1), 2
        if found is None:
            return None
        low = 1
        while (later := await _turn(chat_id, high)) is not None:
            found, low, high = later, high, high * 2
        while high - low > 1:  # turn `low` exists, turn `high` does not
            middle = (low + high) // 2
            if (later := await _turn(chat_id, middle)) is not None:
                found, low = later, middle
            else:
                high = middle
        return found

    routes = [Route(path, chat, methods=["POST"])]
    if kind.name == "vercel_ai":
        routes.append(Route(path.rstrip("/") + "/{chat_id}/stream", reconnect, methods=["GET"]))
    return Starlette(routes=routes)


_NAMES = {"vercel_ai": "Vercel AI", "ag_ui": "AG-UI"}


def _refused(status: int, message: str) -> Response:
    return JSONResponse({"error": printable(message)}, status_code=status)

