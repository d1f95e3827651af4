"""A conversation sent once: each model request carries only what is new, and the model still sees everything.

From behaviour version 4 a model request's activity input carries the messages new since the run's previous
request and a reference (count and digest) to the ones before; its tool definitions are referred to by digest after
the run's first request. The worker finds what is referred to in its cache or asks the run (a query: no history),
and checks the digest: a worker that holds nothing (a restart, another worker) still gives the model the whole
conversation, and a corrupted cache is never fed to the model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart
from pydantic_ai.tools import ToolDefinition
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import ActivityEnvironment

from durable_codemode import CodeModeAgent, ToolOptions, decide, start_run, wait_for_approvals
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode.shared._activity_io import ModelRequestInput
from durable_codemode.shared._conversation import ConversationRange, message_json
from durable_codemode.shared._names import MODEL_REQUEST_ACTIVITY
from durable_codemode.testing import (
    RunCode,
    conversation_cache,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)
from durable_codemode.worker._conversations import ConversationCache
from durable_codemode.workflow._conversation import SentConversation

from ._runs import run_to_end

pytestmark = pytest.mark.pydantic_ai_release  # the messages are pydantic-ai's: runs again on the oldest release


def _json(messages: list[ModelMessage]) -> list[Any]:
    """`messages` as JSON, without the run's ids: `RunResult.all_messages()` stamps them on, as pydantic-ai does."""
    return [{k: v for k, v in m.items() if k not in ("run_id", "conversation_id")}
            for m in json.loads(ModelMessagesTypeAdapter.dump_json(messages))]


def _agent(name: str, seen: list[list[Any]], turns: int, *, gated_turn: int | None = None) -> CodeModeAgent:
    """An agent whose scripted model writes down every conversation it is sent, and runs a snippet per turn."""

    def turn(k: int) -> Callable[[list[ModelMessage]], RunCode]:
        def step(messages: list[ModelMessage]) -> RunCode:
            seen.append(_json(messages))
            call = "await refund(order='A')" if k == gated_turn else "0"
            return RunCode(f"rows = [await look(i=i) for i in range(3)]\n{call}\nsum(rows) + {k}")
        return step

    def last(messages: list[ModelMessage]) -> str:
        seen.append(_json(messages))
        return "done"

    inner = Agent(scripted_model(*(turn(k) for k in range(turns)), last), name=name, instructions="Use run_code.")

    @inner.tool_plain
    def look(i: int) -> int:
        """Item i's value."""
        return i * 10

    @inner.tool_plain
    def refund(order: str) -> str:
        """Refund an order (a person approves it)."""
        return f"refunded {order}"

    return CodeModeAgent(inner, tool_options={"refund": ToolOptions(requires_approval=True)})


@dataclasses.dataclass(kw_only=True)
class _RequestBeforeVersion4:
    """`ModelRequestInput` as releases before behaviour version 4 read it: the conversation and tools required."""

    agent: str
    model: str | None
    messages: list[ModelMessage]
    tools: list[ToolDefinition]


def _model_requests(history: WorkflowHistory) -> list[tuple[ModelRequestInput, int, Any]]:
    """Each model request of the run: its input, the input's bytes, and the started event of its last attempt."""
    scheduled: dict[int, tuple[ModelRequestInput, int]] = {}
    out = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == MODEL_REQUEST_ACTIVITY:
                [value] = DATA_CONVERTER.payload_converter.from_payloads(list(attrs.input.payloads),
                                                                           [ModelRequestInput])
                scheduled[event.event_id] = (value, sum(len(p.data) for p in attrs.input.payloads))
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if started.scheduled_event_id in scheduled:
                out.append((*scheduled[started.scheduled_event_id], started))
    return out


def _check_seen_whole(seen: list[list[Any]], messages: list[ModelMessage]) -> None:
    """Request k was sent the run's conversation up to its k-th request: every message, none changed.

    pydantic-ai stamps the request it sends (its time, the run's id) as it sends it, so of that one the parts count.
    """
    whole = _json(messages)
    for k, conversation in enumerate(seen):
        assert len(conversation) == 2 * k + 1, f"request {k} was sent {len(conversation)} messages"
        assert conversation[:-1] == whole[:2 * k], f"request {k} was sent another conversation"
        assert conversation[-1]["parts"] == whole[2 * k]["parts"], f"request {k} was sent another request"


async def test_each_model_request_carries_only_what_is_new_and_the_model_sees_everything(client: Client) -> None:
    seen: list[list[Any]] = []
    result, handle = await run_to_end(client, _agent("sent-once", seen, turns=8), unsigned_approvals=True)
    assert result.output == "done"
    _check_seen_whole(seen, result.all_messages())
    requests = _model_requests(await handle.fetch_history())
    assert len(requests) == 9
    first, first_bytes, _ = requests[0]
    assert first.earlier is None and first.messages and first.tools and first.tools_ref is None  # all of it
    for k, (input, size, _) in enumerate(requests[1:], start=1):
        # Request k: the tool's return (one new message), the 2k before it by reference, the tools by digest.
        assert input.earlier is not None and input.earlier.count == 2 * k
        assert len(input.new_messages) == 1 and input.tools_ref is not None
        assert input.messages is None and input.tools is None  # what a worker of an older release refuses
        new_bytes = len(ModelMessagesTypeAdapter.dump_json(input.new_messages))
        assert size <= 2048 + new_bytes, (k, size, new_bytes)
    assert requests[-1][1] < first_bytes  # the run's eighth request is smaller than its first
    # A worker of a release before behaviour version 4 reads the input as the whole conversation and the tools:
    # it refuses one that refers to them, rather than send its model half a conversation and no tools.
    payload = DATA_CONVERTER.payload_converter.to_payloads([requests[1][0]])[0]
    with pytest.raises(ValueError, match=r"messages[\s\S]*tools"):
        DATA_CONVERTER.payload_converter.from_payloads([payload], [_RequestBeforeVersion4])


async def test_a_worker_that_holds_nothing_of_the_run_asks_the_run_for_it(client: Client) -> None:
    seen: list[list[Any]] = []
    durable = _agent("sent-once-moved", seen, turns=4, gated_turn=2)
    task_queue = new_task_queue()
    async with running_worker(client, [durable], task_queue=task_queue, unsigned_approvals=True):
        handle = await start_run(client, durable.name, "go", task_queue=task_queue)
        [pending] = await wait_for_approvals(client, handle.id)
    # Another worker takes the run on, as after a restart: its cache holds nothing of it.
    async with running_worker(client, [durable], task_queue=task_queue, unsigned_approvals=True) as fresh:
        await decide(client, handle.id, pending.call_id, approved=True, approver="ana")
        result = await handle.result()
        asked = conversation_cache(fresh).asked
    assert asked == 2  # the messages and the tool definitions, once each: the next requests found them held
    _check_seen_whole(seen, result.all_messages())
    await replay(handle)


async def test_a_corrupted_cache_is_never_sent_to_the_model(client: Client) -> None:
    seen: list[list[Any]] = []
    durable = _agent("sent-once-corrupted", seen, turns=4, gated_turn=2)
    task_queue = new_task_queue()
    async with running_worker(client, [durable], task_queue=task_queue, unsigned_approvals=True) as worker:
        handle = await start_run(client, durable.name, "go", task_queue=task_queue)
        [pending] = await wait_for_approvals(client, handle.id)
        # The model's first answer, as this worker's cache holds it, rewritten behind the cache's back.
        held = conversation_cache(worker)._entries[handle.id]
        held.items[1] = message_json(ModelResponse(parts=[TextPart("forged")], model_name="scripted"))
        await decide(client, handle.id, pending.call_id, approved=True, approver="ana")
        result = await handle.result()
    _check_seen_whole(seen, result.all_messages())
    assert not any("forged" in json.dumps(conversation) for conversation in seen)
    retried = [started for _, _, started in _model_requests(await handle.fetch_history()) if started.attempt > 1]
    assert len(retried) == 1  # the request after the approval: its first attempt refused the cache, by name
    assert retried[0].last_failure.application_failure_info.type == "ConversationMismatch"
    assert "do not match the digest" in retried[0].last_failure.message
    await replay(handle)


async def test_the_cache_is_bounded_by_runs_and_bytes() -> None:
    message = ModelResponse(parts=[TextPart("x" * 1000)], model_name="scripted")

    async def keep(cache: ConversationCache, run: str) -> None:
        activity = ActivityEnvironment()
        activity.info = dataclasses.replace(activity.info, workflow_id=run)
        await activity.run(cache.resolve, [message], None, subject=f"run {run}")

    by_runs = ConversationCache(max_runs=2)
    for run in ("a", "b", "c"):
        await keep(by_runs, run)
    assert by_runs.held_runs() == ["b", "c"]  # the least recently used went first
    by_bytes = ConversationCache(max_bytes=2 * len(message_json(message)) + 10)  # room for two runs
    for run in ("a", "b", "c"):
        await keep(by_bytes, run)
    assert by_bytes.held_runs() == ["b", "c"]
    too_big = ConversationCache(max_bytes=len(message_json(message)) - 1)
    await keep(too_big, "a")
    assert too_big.held_runs() == []  # a conversation bigger than the whole cache is not kept


def test_the_run_answers_its_conversation_in_chunks_a_query_can_carry() -> None:
    messages: list[ModelMessage] = [ModelResponse(parts=[TextPart(str(i) * 400)], model_name="m") for i in range(6)]
    sent = SentConversation(messages, sends_once=True)
    room = 2 * len(message_json(messages[0])) + 10  # two messages a chunk
    chunks, start = [], 0
    while start < 6:
        chunk = sent.messages(ConversationRange(start=start, end=6, max_bytes=room))
        assert chunk and sum(len(c) for c in chunk) <= room
        chunks.append(chunk)
        start += len(chunk)
    assert len(chunks) == 3 and [c.encode() for chunk in chunks for c in chunk] == [message_json(m) for m in messages]
    with pytest.raises(ValueError, match="the run holds 6 messages of its conversation, not 0 to 7"):
        sent.messages(ConversationRange(start=0, end=7))


def test_a_history_a_hook_rewrote_refers_to_the_messages_it_left_as_they_were() -> None:
    messages: list[ModelMessage] = [ModelResponse(parts=[TextPart(f"answer {i}")], model_name="m") for i in range(5)]
    sent = SentConversation(sends_once=True)
    assert sent.refer(messages) == (None, messages)
    # A hook hands back the history as new objects, the fourth message redacted: the three before it are held.
    rewritten = [dataclasses.replace(m) for m in messages]
    rewritten[3] = ModelResponse(parts=[TextPart("[redacted]")], model_name="m")
    earlier, new = sent.refer(rewritten)
    assert earlier is not None and earlier.count == 3 and new == rewritten[3:]
    # Versions before 4 send the whole conversation, each time.
    assert SentConversation(messages, sends_once=False).refer(messages) == (None, messages)
