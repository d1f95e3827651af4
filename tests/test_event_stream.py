"""A run's live event stream (`stream_events`): every event of a streaming run, in order, exactly once.

Real dev server, real Monty, real activities; the model is scripted (it streams its responses in chunks). Each
scenario replays its history with Temporal's `Replayer`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    FinalResultEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.run import AgentRunResultEvent
from temporalio.client import Client

from durable_codemode import (
    CodeModeAgent,
    RunEventItem,
    ToolOptions,
    child_run_tool,
    decide,
    start_run,
    stream_events,
)
from durable_codemode._errors import CodeModeUserError, RunNotFoundError
from durable_codemode.events import (
    ApprovalDecidedEvent,
    ApprovalWaitEvent,
    ChildRunEndEvent,
    ChildRunStartEvent,
    CodeModeEvent,
    ModelRequestStartEvent,
    NestedCallEndEvent,
    NestedCallStartEvent,
    PrintEvent,
    RunEndEvent,
    RunStartEvent,
    SnippetEndEvent,
    SnippetStartEvent,
)
from durable_codemode.testing import (
    FinalOutput,
    RunCode,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)

PROGRAM = """\
import asyncio
print("fetching")
values = await asyncio.gather(*(get(i=i) for i in range(3)))
print("got", sum(values))
await note(text="sum is " + str(sum(values)))
r = await ask_{child}(prompt="summarise " + str(sum(values)))
sum(values)
"""


class Summary(BaseModel):
    text: str


def child_agent(name: str) -> CodeModeAgent:
    agent = Agent(scripted_model(FinalOutput({"text": "a summary"})), name=name, output_type=Summary)
    return CodeModeAgent(agent)


def parent_agent(name: str, child: CodeModeAgent) -> CodeModeAgent:
    model = scripted_model(RunCode(PROGRAM.format(child=child.name)),
                           lambda m: f"the sum is {last_result(m)['result']}")
    agent = Agent(model, name=name, tools=[child_run_tool(child)])

    @agent.tool_plain
    def get(i: int) -> int:
        """A number."""
        return i * 10

    @agent.tool_plain
    def note(text: str) -> str:
        """Write a note (a person approves it)."""
        return "noted"

    return CodeModeAgent(agent, tool_options={"note": ToolOptions(requires_approval=True)})


async def collect(client: Client, run_id: str, *, after: int | None = None,
                  until: type | None = None) -> list[RunEventItem]:
    """The run's events from `after` on, to its end (or through the first of type `until`)."""
    items: list[RunEventItem] = []
    async with asyncio.timeout(60):
        async for item in stream_events(client, run_id, after=after):
            items.append(item)
            if until is not None and isinstance(item.event, until):
                break
    return items


async def test_a_streaming_run_publishes_every_step_in_order_once(client: Client) -> None:
    suffix = os.urandom(3).hex()
    child = child_agent(f"summarise{suffix}")
    parent = parent_agent(f"streamer{suffix}", child)
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, parent, "Add them up", task_queue=tq, stream=True)
        # Up to the pause: the person decides once the stream says a call waits (waiting on the event, no sleep).
        first = await collect(client, handle.id, until=ApprovalWaitEvent)
        wait = first[-1].event
        assert isinstance(wait, ApprovalWaitEvent) and wait.tool == "note" and wait.args == '{"text": "sum is 30"}'
        await decide(client, handle.id, wait.call_id, approved=True, approver="ana", note="fine")
        # A second subscriber resumes after the last offset it saw: nothing lost, nothing repeated.
        rest = await collect(client, handle.id, after=first[-1].offset)
        result = await handle.result()
        # The child streams too: its own stream, from its start event's run id (a closed run's stream is read from
        # its workflow, so while a worker serves it).
        child_start = next(i.event for i in rest if isinstance(i.event, ChildRunStartEvent))
        child_items = await collect(client, child_start.run_id)
    items = first + rest
    offsets = [i.offset for i in items]
    assert offsets == list(range(len(items))), offsets
    events = [i.event for i in items]
    assert isinstance(events[0], RunStartEvent) and events[0].agent == parent.name
    assert isinstance(events[-1], AgentRunResultEvent) and events[-1].result.output == result.output
    kinds = [_kind(e) for e in events]
    # The model's first turn streamed its run_code call: the part, its deltas (coalesced: the scripted model streams
    # faster than a batch interval), its end, then the call and the program.
    assert kinds[1:5] == ["codemode.model_request", "part_start", "part_delta", "part_end"], kinds[:6]
    assert "function_tool_call" in kinds and kinds.index("function_tool_call") < kinds.index("codemode.snippet_start")
    snippet = next(e for e in events if isinstance(e, SnippetStartEvent))
    assert snippet.code == PROGRAM.format(child=child.name) and snippet.tool_call_id == "call_0"
    # The program's steps, in the order it took them.
    steps = [_step(e) for e in events if isinstance(e, (CodeModeEvent,)) and _step(e)]
    # (the gathered calls end in the order their activities completed, which this run's history fixes)
    assert sorted(steps[4:7]) == ["end call_0.0 ok", "end call_0.1 ok", "end call_0.2 ok"], steps
    assert steps[:4] + steps[7:] == [
        "print fetching\n",
        "start call_0.0 get", "start call_0.1 get", "start call_0.2 get",
        "print got 30\n",
        "start call_0.3 note", "wait call_0.3", "decided call_0.3 ana",
        "end call_0.3 ok",
        "start call_0.4 ask_" + child.name, f"child {handle.id}/call_0.4", "child end completed",
        "end call_0.4 ok",
        "snippet end ok 5",
    ], steps
    ends = sorted((e for e in events if isinstance(e, NestedCallEndEvent)), key=lambda e: e.call_id)
    assert [e.result for e in ends[:3]] == ["0", "10", "20"] and all(e.seconds >= 0 for e in ends)
    decided = next(e for e in events if isinstance(e, ApprovalDecidedEvent))
    assert (decided.approved, decided.note, decided.via) == (True, "fine", "update")
    # The answer's turn streamed too, and the tool result went back as pydantic-ai's event.
    results = [e for e in events if isinstance(e, FunctionToolResultEvent)]
    assert len(results) == 1 and results[0].part.tool_call_id == "call_0"
    answer = next(e for e in events if isinstance(e, PartEndEvent) and isinstance(e.part, TextPart))
    assert answer.part.content == "the sum is 30" == result.output
    calls = [e for e in events if isinstance(e, FunctionToolCallEvent)]
    assert len(calls) == 1 and isinstance(calls[0].part, ToolCallPart) and calls[0].part.tool_name == "run_code"
    assert not any(isinstance(e, FinalResultEvent) and e.tool_name for e in events)
    assert isinstance(child_items[0].event, RunStartEvent) and child_items[0].event.agent == child.name
    assert isinstance(child_items[-1].event, AgentRunResultEvent)
    await replay(handle)
    await replay(client.get_workflow_handle(child_start.run_id))


def _kind(event: Any) -> str:
    return str(event.name) if isinstance(event, CodeModeEvent) else str(event.event_kind)


def _step(event: Any) -> str | None:
    match event:
        case PrintEvent(text=text):
            return f"print {text}"
        case NestedCallStartEvent(call_id=call, tool=tool):
            return f"start {call} {tool}"
        case NestedCallEndEvent(call_id=call, status=status):
            return f"end {call} {status}"
        case ApprovalWaitEvent(call_id=call):
            return f"wait {call}"
        case ApprovalDecidedEvent(call_id=call, approver=who):
            return f"decided {call} {who}"
        case ChildRunStartEvent(run_id=run):
            return f"child {run}"
        case ChildRunEndEvent(status=status):
            return f"child end {status}"
        case SnippetEndEvent(outcome=outcome, calls=calls):
            return f"snippet end {outcome} {calls}"
    return None


async def test_a_run_that_does_not_stream_says_so_and_costs_nothing(client: Client) -> None:
    suffix = os.urandom(3).hex()
    agent = CodeModeAgent(Agent(scripted_model(RunCode("1 + 1"), "two"), name=f"quiet{suffix}"))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "Add", task_queue=tq)
        await handle.result()
        with pytest.raises(CodeModeUserError, match="does not stream its events: start it with start_run"):
            await collect(client, handle.id)
        streamed = await start_run(client, agent, "Add", task_queue=tq, stream=True)
        await streamed.result()
        items = await collect(client, streamed.id)
    assert isinstance(items[-1].event, AgentRunResultEvent)
    quiet = await handle.fetch_history()
    loud = await streamed.fetch_history()
    # Not streaming costs no event; streaming a two-turn run adds none either (the model's stream came in one batch
    # per turn at most: the scripted model answers at once).
    assert not any(e.HasField("workflow_execution_signaled_event_attributes") for e in quiet.events)
    signals = sum(e.HasField("workflow_execution_signaled_event_attributes") for e in loud.events)
    assert signals <= 2 * 2, signals  # a batch per turn, and the attempt's last one
    await replay(handle)
    await replay(streamed)


async def test_an_unknown_run_is_refused_by_name(client: Client) -> None:
    with pytest.raises(RunNotFoundError):
        await collect(client, f"no-such-run-{os.urandom(3).hex()}")
    with pytest.raises(CodeModeUserError, match="after must be an offset"):
        await collect(client, "whatever", after="3")  # type: ignore[arg-type]


def _unused() -> tuple[Any, ...]:
    return (ModelRequestStartEvent, PartDeltaEvent, PartStartEvent, RunEndEvent)
