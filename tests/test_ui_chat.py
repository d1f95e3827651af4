"""Chat with a durable agent over pydantic-ai's UI protocols (`durable_codemode.ui.chat_app`).

Driven over HTTP with each protocol's own request shapes (the Vercel AI SDK v6's `submit-message` bodies, tool
parts in `approval-responded` state; AG-UI's `RunAgentInput`, its interrupts answered in `resume[]`), against the
same conversation run by `agent.run()` through pydantic-ai's own adapter (`VercelAIAdapter` / `AGUIAdapter`
`.dispatch_request`): two user turns with an approval in between. The durable agent writes a
`run_code` program whose call waits for a person; the plain agent calls its tool directly, with
`requires_approval=True`. What the user sees must be the same: the approval asked about the same call, the same
answers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.ui import UIAdapter
from pydantic_ai.ui.ag_ui import AGUIAdapter
from pydantic_ai.ui.vercel_ai import VercelAIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.client import Client

from durable_codemode import CodeModeAgent, CodeModeUserError, ToolOptions
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.ui import UIAccess, chat_app

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)

ADD = {"product": "espresso machine", "unit_price_cents": 15000}
PROMPTS = ["Add an espresso machine for $150", "How many lines do I have?"]


def _answer_first(result: Any) -> str:
    return f"Added line {result['line_id']}: {result['product']}."


def _answer_second(count: Any) -> str:
    return f"You have {count} lines."


def durable_agent(name: str, lines: list[dict[str, Any]]) -> CodeModeAgent:
    def second(messages: list[ModelMessage]) -> Any:
        return RunCode("await count_lines()")

    model = scripted_model(
        RunCode(f"await add_line(product={ADD['product']!r}, unit_price_cents={ADD['unit_price_cents']})"),
        lambda m: _answer_first(last_result(m)["result"]), second, lambda m: _answer_second(last_result(m)["result"]))
    agent = Agent(model, name=name)
    _tools(agent, lines)
    return CodeModeAgent(agent, tool_options={"add_line": ToolOptions(requires_approval=True)})


def plain_agent(lines: list[dict[str, Any]]) -> Agent[None, Any]:
    """The same conversation for `agent.run()`: the model calls the tools itself."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        returned = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart("add_line", dict(ADD), tool_call_id="t0")])
        if turn == 1:
            return ModelResponse(parts=[TextPart(_answer_first(returned[-1].content))])
        if turn == 2:
            return ModelResponse(parts=[ToolCallPart("count_lines", {}, tool_call_id="t1")])
        return ModelResponse(parts=[TextPart(_answer_second(returned[-1].content))])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        from pydantic_ai.models.function import DeltaToolCall

        response = respond(messages, info)
        for index, part in enumerate(response.parts):
            if isinstance(part, TextPart):
                yield part.content
            else:
                yield {index: DeltaToolCall(name=part.tool_name, json_args=part.args_as_json_str(),
                                            tool_call_id=part.tool_call_id)}

    agent: Agent[None, Any] = Agent(FunctionModel(respond, stream_function=stream), name="plain-chat",
                                    output_type=[str, DeferredToolRequests])  # a run may end asking approval
    _tools(agent, lines, approval=True)
    return agent


def _tools(agent: Agent[Any, Any], lines: list[dict[str, Any]], *, approval: bool = False) -> None:
    @agent.tool_plain(requires_approval=approval)
    def add_line(product: str, unit_price_cents: int) -> dict[str, Any]:
        """Add a line to the cart."""
        line = {"line_id": len(lines) + 1, "product": product, "unit_price_cents": unit_price_cents}
        lines.append(line)
        return line

    @agent.tool_plain
    def count_lines() -> int:
        """How many lines the cart has."""
        return len(lines)


def plain_app(agent: Agent[None, Any],
              adapter: type[UIAdapter[Any, Any, Any, Any, Any]] = VercelAIAdapter) -> Starlette:
    options: dict[str, Any] = {"sdk_version": 6} if adapter is VercelAIAdapter else {}

    async def chat(request: Request) -> Response:
        return await adapter.dispatch_request(request, agent=agent, **options)

    return Starlette(routes=[Route("/api/chat", chat, methods=["POST"])])


async def post(app: Starlette, body: dict[str, Any], *, status: int = 200) -> list[dict[str, Any]]:
    """POST a chat request to `app`; the response's chunks (the SSE `data:` lines, decoded), or its error."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                 timeout=60) as http:
        response = await http.post("/api/chat", json=body, headers={"accept": "text/event-stream"})
    assert response.status_code == status, response.text
    if status != 200:
        return [response.json()]
    chunks = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunks.append(json.loads(line[len("data: "):]))
    return chunks


def apply(message: dict[str, Any], chunks: list[dict[str, Any]], *, approve: bool | None = None) -> None:
    """Build the assistant's UI message from `chunks` as the SDK does (tool parts, text), an approval answered."""
    parts = message["parts"]
    tools = {part["toolCallId"]: part for part in parts if "toolCallId" in part}
    texts: dict[str, str] = {}
    for chunk in chunks:
        kind = chunk["type"]
        if kind == "tool-input-available" and chunk["toolCallId"] in tools:  # a resumed call: the same part
            tools[chunk["toolCallId"]]["input"] = chunk["input"]
        elif kind == "tool-input-available":
            part = {"type": f"tool-{chunk['toolName']}", "toolCallId": chunk["toolCallId"], "state": "input-available",
                    "input": chunk["input"]}
            tools[chunk["toolCallId"]] = part
            parts.append(part)
        elif kind == "tool-output-available" and chunk["toolCallId"] in tools:
            tools[chunk["toolCallId"]].update(state="output-available", output=chunk["output"])
            tools[chunk["toolCallId"]].pop("approval", None)
        elif kind == "tool-approval-request":
            tools[chunk["toolCallId"]].update(state="approval-responded",
                                              approval={"id": chunk["approvalId"], "approved": approve})
        elif kind == "text-start":
            texts[chunk["id"]] = ""
        elif kind == "text-delta":
            texts[chunk["id"]] += chunk["delta"]
        elif kind == "text-end":
            parts.append({"type": "text", "text": texts[chunk["id"]]})


def user_message(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def seen(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a user of the chat sees of a response: the call asked about, and the answer's text."""
    asked = [(c["toolName"], c["input"]) for c in chunks if c["type"] == "tool-input-available"
             and any(a["toolCallId"] == c["toolCallId"] for a in chunks if a["type"] == "tool-approval-request")]
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    return {"approval for": asked, "text": text}


async def converse(app: Starlette, chat_id: str, *, reload: bool = False) -> list[dict[str, Any]]:
    """Two user turns with an approval in between, as a chat frontend sends them; what the user saw each time."""
    history = [user_message("u1", PROMPTS[0])]
    first = await post(app, {"id": chat_id, "trigger": "submit-message", "messages": history})
    if reload:  # the page reloads and sends the turn again: the same run, the same approval request
        again = await post(app, {"id": chat_id, "trigger": "submit-message", "messages": history})
        assert [c for c in again if c["type"] == "tool-approval-request"] == [
            c for c in first if c["type"] == "tool-approval-request"]
        # The SDK's `resume: true` reconnects to the turn still running: the same approval request.
        resumed = await reconnect(app, chat_id)
        assert resumed is not None and seen(resumed) == seen(first)
    answer: dict[str, Any] = {"id": "a1", "role": "assistant", "parts": []}
    apply(answer, first, approve=True)
    history.append(answer)
    second = await post(app, {"id": chat_id, "trigger": "submit-message", "messages": history})
    apply(answer, second)
    if reload:  # the first turn sent again after its answer: its whole run, the decided wait not asked again
        again = await post(app, {"id": chat_id, "trigger": "submit-message", "messages": history[:1]})
        assert seen(again) == {"approval for": [], "text": seen(second)["text"]}
    history.append(user_message("u2", PROMPTS[1]))
    third = await post(app, {"id": chat_id, "trigger": "submit-message", "messages": history})
    if reload:
        assert await reconnect(app, chat_id) is None, "no turn runs: nothing to resume"
        assert await reconnect(app, "no-such-chat") is None
    return [seen(first), seen(second), seen(third)]


async def reconnect(app: Starlette, chat_id: str) -> list[dict[str, Any]] | None:
    """`GET /api/chat/ID/stream`, as the Vercel AI SDK resumes a chat: its chunks, or `None` (204: nothing runs)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                 timeout=60) as http:
        response = await http.get(f"/api/chat/{chat_id}/stream", headers={"accept": "text/event-stream"})
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    return [json.loads(line[len("data: "):]) for line in response.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


async def test_a_durable_chat_sees_what_agent_run_through_the_adapter_sees(client: Client, tmp_path: Path) -> None:
    durable_lines: list[dict[str, Any]] = [{"line_id": 1, "product": "mug", "unit_price_cents": 900}]
    plain_lines = [dict(line) for line in durable_lines]
    agent = durable_agent(f"chat{os.urandom(3).hex()}", durable_lines)
    tq = new_task_queue()
    chat_id = f"c{os.urandom(4).hex()}"
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        durable = await converse(chat_app(agent, client, task_queue=tq, access=UIAccess(approver="ana")), chat_id,
                                 reload=True)
        handles = [client.get_workflow_handle(f"{agent.name}-chat-{chat_id}-{n}") for n in (1, 2)]
        results = [await h.result() for h in handles]
    plain = await converse(plain_app(plain_agent(plain_lines)), "plain")
    assert durable[0]["approval for"] == plain[0]["approval for"] == [("add_line", ADD)], (durable, plain)
    assert durable[1]["text"] == plain[1]["text"] == "Added line 2: espresso machine.", (durable, plain)
    assert durable[2]["text"] == plain[2]["text"] == "You have 2 lines.", (durable, plain)
    assert durable_lines == plain_lines
    # The second run continued the conversation the first left (its messages, from Temporal), and ana decided.
    assert results[0]["approvals"][0]["approver"] == "ana"
    for handle in handles:
        await replay(handle)


def run_input(thread: str, messages: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    """An AG-UI `RunAgentInput`, as a client sends it (a new run id each time)."""
    return {"threadId": thread, "runId": f"r{os.urandom(3).hex()}", "state": None, "messages": messages,
            "tools": [], "context": [], "forwardedProps": None, **more}


def assistant(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages an AG-UI client keeps from a run's events, in their order.

    Assistant messages (text, tool calls, each call on its parent message) and tool results.
    """
    kept: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    calls: dict[str, dict[str, Any]] = {}
    for e in events:
        kind = e["type"]
        if kind == "TEXT_MESSAGE_START":
            by_id[e["messageId"]] = {"id": e["messageId"], "role": "assistant", "content": ""}
            kept.append(by_id[e["messageId"]])
        elif kind == "TEXT_MESSAGE_CONTENT":
            by_id[e["messageId"]]["content"] += e["delta"]
        elif kind == "TOOL_CALL_START":
            parent = by_id.get(e.get("parentMessageId") or "")
            if parent is None:
                parent = {"id": f"m{len(kept)}", "role": "assistant", "content": ""}
                kept.append(parent)
            calls[e["toolCallId"]] = {"id": e["toolCallId"], "type": "function",
                                      "function": {"name": e["toolCallName"], "arguments": ""}}
            parent.setdefault("toolCalls", []).append(calls[e["toolCallId"]])
        elif kind == "TOOL_CALL_ARGS":
            calls[e["toolCallId"]]["function"]["arguments"] += e["delta"]
        elif kind == "TOOL_CALL_RESULT":
            kept.append({"id": e["messageId"], "role": "tool", "toolCallId": e["toolCallId"], "content": e["content"]})
    for message in kept:
        message["content"] = message["content"] or None
    return kept


def interrupts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    finished = [e for e in events if e["type"] == "RUN_FINISHED"]
    assert len(finished) == 1, events
    outcome = finished[0].get("outcome") or {}
    return list(outcome.get("interrupts", [])) if outcome.get("type") == "interrupt" else []


def seen_ag_ui(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a user of an AG-UI chat sees of a response: the approval asked (its question, its call), the text."""
    names = {e["toolCallId"]: e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"}
    asked = [(i["message"], names.get(i["toolCallId"])) for i in interrupts(events)]
    return {"approval for": asked, "text": "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")}


async def converse_ag_ui(app: Starlette, thread: str, *, probe: bool = False) -> list[dict[str, Any]]:
    """Two user turns with an approval in between, as an AG-UI client sends them; what the user saw each time.

    `probe`: before answering, send what a wrong client would (a reload, a forged interrupt id, edited arguments,
    a malformed answer) and check each is answered by name, nothing decided.
    """
    history = [{"id": "u1", "role": "user", "content": PROMPTS[0]}]
    first = await post(app, run_input(thread, history))
    (interrupt,) = interrupts(first)
    if probe:
        again = await post(app, run_input(thread, history))  # a reload: the same run, the same interrupt
        assert interrupts(again) == [interrupt]
        prefix, _, mac = interrupt["id"].rpartition(".")
        forged = f"{prefix}.{'0' * len(mac)}"
        wrong = [
            (forged, {"approved": True}, "answers no approval request"),
            (interrupt["id"], {"approved": True, "editedArgs": {"unit_price_cents": 1}}, "edits its arguments"),
            (interrupt["id"], {"approved": "yes"}, "malformed"),
        ]
        for interrupt_id, payload, said in wrong:
            (error,) = await post(app, run_input(thread, history, resume=[
                {"interruptId": interrupt_id, "status": "resolved", "payload": payload}]), status=400)
            assert said in error["error"], error
    history += assistant(first)
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    second = await post(app, run_input(thread, history, resume=resume))
    history += assistant(second)
    history.append({"id": "u2", "role": "user", "content": PROMPTS[1]})
    third = await post(app, run_input(thread, history))
    return [seen_ag_ui(first), seen_ag_ui(second), seen_ag_ui(third)]


async def test_a_durable_ag_ui_chat_sees_what_agent_run_through_the_adapter_sees(client: Client,
                                                                                tmp_path: Path) -> None:
    durable_lines: list[dict[str, Any]] = [{"line_id": 1, "product": "mug", "unit_price_cents": 900}]
    plain_lines = [dict(line) for line in durable_lines]
    agent = durable_agent(f"agui{os.urandom(3).hex()}", durable_lines)
    tq = new_task_queue()
    thread = f"t{os.urandom(4).hex()}"
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        app = chat_app(agent, client, protocol="ag_ui", task_queue=tq, access=UIAccess(approver="ana"))
        first = client.get_workflow_handle(f"{agent.name}-chat-{thread}-1")
        durable = await converse_ag_ui(app, thread, probe=True)
        handles = [first, client.get_workflow_handle(f"{agent.name}-chat-{thread}-2")]
        results = [await h.result() for h in handles]
    plain = await converse_ag_ui(plain_app(plain_agent(plain_lines), AGUIAdapter), "plain")
    question = f"Approve add_line({json.dumps(ADD, separators=(',', ':'))})?"
    assert durable[0]["approval for"] == plain[0]["approval for"] == [(question, "add_line")], (durable, plain)
    assert durable[1]["text"] == plain[1]["text"] == "Added line 2: espresso machine.", (durable, plain)
    assert durable[2]["text"] == plain[2]["text"] == "You have 2 lines.", (durable, plain)
    assert durable_lines == plain_lines, "the probes decided nothing: one line added, once"
    assert [(a["approver"], a["approved"]) for a in results[0]["approvals"]] == [("ana", True)]
    for handle in handles:
        await replay(handle)


def test_an_unknown_protocol_is_refused_by_name(client: Client) -> None:
    agent = durable_agent(f"proto{os.urandom(3).hex()}", [])
    with pytest.raises(CodeModeUserError, match=r"'vercel_ai' .* or 'ag_ui'"):
        chat_app(agent, client, protocol="a2a")  # type: ignore[arg-type]
