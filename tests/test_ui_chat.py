"""Chat with a durable agent over the Vercel AI data stream protocol (`durable_codemode.ui.chat_app`).

Driven over HTTP with the protocol's own request shapes (the Vercel AI SDK v6's `submit-message` bodies, tool parts
in `approval-responded` state), against the same conversation run by `agent.run()` through pydantic-ai's own
adapter (`VercelAIAdapter.dispatch_request`): two user turns with an approval in between. The durable agent writes a
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
from pydantic_ai.ui.vercel_ai import VercelAIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.client import Client

from durable_codemode import CodeModeAgent, CodeModeUserError, ToolOptions
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.ui import UIAccess, chat_app

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


def plain_app(agent: Agent[None, Any]) -> Starlette:
    async def chat(request: Request) -> Response:
        return await VercelAIAdapter.dispatch_request(request, agent=agent, sdk_version=6)

    return Starlette(routes=[Route("/api/chat", chat, methods=["POST"])])


async def post(app: Starlette, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a chat request to `app`; the response's chunks (the SSE `data:` lines, decoded)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                 timeout=60) as http:
        response = await http.post("/api/chat", json=body, headers={"accept": "text/event-stream"})
    assert response.status_code == 200, response.text
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
    answer: dict[str, Any] = {"id": "a1", "role": "assistant", "parts": []}
    apply(answer, first, approve=True)
    history.append(answer)
    second = await post(app, {"id": chat_id, "trigger": "submit-message", "messages": history})
    apply(answer, second)
    history.append(user_message("u2", PROMPTS[1]))
    third = await post(app, {"id": chat_id, "trigger": "submit-message", "messages": history})
    return [seen(first), seen(second), seen(third)]


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


def test_ag_ui_is_refused_by_name(client: Client) -> None:
    agent = durable_agent(f"agui{os.urandom(3).hex()}", [])
    with pytest.raises(CodeModeUserError, match="only 'vercel_ai'"):
        chat_app(agent, client, protocol="ag_ui")
