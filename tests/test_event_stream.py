"""A run's live event stream (`stream_events`): every event of a streaming run, in order, exactly once.

Real dev server, real Monty, real activities; the model is scripted (it streams its responses in chunks). Each
scenario replays its history with Temporal's `Replayer`.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import sys
from collections.abc import AsyncIterable, AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import Hooks, ProcessEventStream
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    FinalResultEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessage,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.run import AgentRunResultEvent
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.workflow_streams import PublishEntry, PublishInput

from durable_codemode import (
    CodeModeAgent,
    EventStreamSettings,
    SnippetLimits,
    ToolOptions,
    child_run_tool,
    decide,
    run_agent,
    start_run,
    stream_events,
)
from durable_codemode.events import (
    ApprovalDecidedEvent,
    ApprovalWaitEvent,
    ChildRunEndEvent,
    ChildRunStartEvent,
    CodeModeEvent,
    EventsTrimmedEvent,
    ModelRequestStartEvent,
    ModelStreamResetEvent,
    NestedCallEndEvent,
    NestedCallStartEvent,
    PrintEvent,
    RunContinuedEvent,
    RunEventItem,
    RunStartEvent,
    SnippetEndEvent,
    SnippetStartEvent,
)
from durable_codemode.shared._errors import CodeModeUserError, RunNotFoundError
from durable_codemode.shared._names import STREAM_INFO_QUERY
from durable_codemode.testing import (
    FinalOutput,
    RunCode,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)
from durable_codemode.workflow._event_stream import PUBLISH_SIGNAL, StreamInfo

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)

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
        assert isinstance(wait, ApprovalWaitEvent) and wait.tool == "note" and wait.args == 'text="sum is 30"'
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


def _text_of(events: list[Any], turn: int) -> str:
    """The text a subscriber shows for model turn `turn`, applying its parts and deltas and honouring resets."""
    text: dict[int, str] = {}
    current: int | None = None
    for event in events:
        if isinstance(event, ModelRequestStartEvent):
            current = event.turn
        elif current != turn:
            continue
        elif isinstance(event, ModelStreamResetEvent):
            text = {}
        elif isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
            text[event.index] = event.part.content
        elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
            text[event.index] += event.delta.content_delta
    return "".join(text[i] for i in sorted(text))


async def test_a_retried_model_request_resets_what_its_failed_attempt_streamed(client: Client) -> None:
    async def flaky(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "The answer "
        yield "is "
        if activity.info().attempt == 1:
            raise ModelHTTPError(503, "flaky", "overloaded")  # a provider outage: the activity is retried
        yield "forty-two."

    agent = CodeModeAgent(Agent(FunctionModel(stream_function=flaky), name=f"flaky{os.urandom(3).hex()}"))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "What is it?", task_queue=tq, stream=True)
        items = await collect(client, handle.id)
        result = await handle.result()
    events = [i.event for i in items]
    resets = [e for e in events if isinstance(e, ModelStreamResetEvent)]
    assert [(r.turn, r.attempt) for r in resets] == [(0, 2)], events
    # What the failed attempt streamed came first, then the reset, then the whole answer again.
    before = events[:events.index(resets[0])]
    assert _text_of(before, 0) == "The answer is "
    assert _text_of(events, 0) == "The answer is forty-two." == result.output
    await replay(handle)


async def test_a_forged_publish_is_refused_by_name(client: Client) -> None:
    suffix = os.urandom(3).hex()
    gate = asyncio.Event()

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "thinking"
        await gate.wait()  # the run waits on model turn 0 meanwhile
        yield " done"

    agent = CodeModeAgent(Agent(FunctionModel(stream_function=slow), name=f"forged{suffix}"))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "Go", task_queue=tq, stream=True)
        await collect(client, handle.id, until=PartStartEvent)
        converter = client.data_converter.payload_converter

        def batch(topic: str, event: Any, sequence: int = 1) -> PublishInput:
            payload = converter.to_payloads([event])[0]
            wire = base64.b64encode(payload.SerializeToString()).decode()
            return PublishInput(items=[PublishEntry(topic=topic, data=wire)], publisher_id="attacker",
                                sequence=sequence)

        fake_call = NestedCallEndEvent(call_id="call_0.0", tool="transfer", status="ok", seconds=0, result="done")
        await handle.signal(PUBLISH_SIGNAL, batch("codemode.events", fake_call))
        await handle.signal(PUBLISH_SIGNAL, batch("codemode.model:7:1", PartStartEvent(index=0, part=TextPart("x"))))
        await handle.signal(PUBLISH_SIGNAL, batch("codemode.model:0:1", fake_call))
        await handle.signal(PUBLISH_SIGNAL, "not a batch")
        async with asyncio.timeout(20):
            while len((info := await handle.query(STREAM_INFO_QUERY, result_type=StreamInfo)).refused) < 4:
                await asyncio.sleep(0.05)
        gate.set()
        items = await collect(client, handle.id)
        await handle.result()
    assert info.refused == [
        "only a model activity publishes to this stream, on a model topic; got codemode.events",
        "a publish for model turn 7, while the run waits on model turn 0",
        "a NestedCallEndEvent, which a model activity does not publish",
        "a publish is a PublishInput object, got str",
    ]
    assert not any(isinstance(i.event, NestedCallEndEvent) for i in items)
    assert _text_of([i.event for i in items], 0) == "thinking done"
    await replay(handle)


def _chain_agent(name: str, settings: EventStreamSettings) -> CodeModeAgent:
    """Two snippets, one per workflow run (so the run continues as new twice), with eight calls in the first."""
    program = "total = 0\nfor i in range(8):\n    total += await get(i=i)\ntotal"
    model = scripted_model(RunCode(program), RunCode("2 * 28"), lambda m: f"done: {last_result(m)['result']}")
    agent = Agent(model, name=name)

    @agent.tool_plain
    def get(i: int) -> int:
        """A number."""
        return i

    return CodeModeAgent(agent, limits=SnippetLimits(max_snippets_per_run=1), stream=settings)


async def test_the_stream_goes_on_across_continue_as_new(client: Client) -> None:
    durable = _chain_agent(f"chain{os.urandom(3).hex()}", EventStreamSettings())
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):
        handle = await start_run(client, durable, "Go", task_queue=tq)
        result = await handle.result()
        # Read once the chain is done, from its last workflow run: the earlier runs' events came with its input.
        items = await collect(client, handle.id)
    assert result.output == "done: 56" and result.continued_as_new == 2
    assert [i.offset for i in items] == list(range(len(items)))
    events = [i.event for i in items]
    assert isinstance(events[0], RunStartEvent) and isinstance(events[-1], AgentRunResultEvent)
    assert [e.run_index for e in events if isinstance(e, RunContinuedEvent)] == [1, 2]
    assert sum(isinstance(e, NestedCallEndEvent) for e in events) == 8
    await replay(handle)


async def test_the_window_is_trimmed_and_a_late_subscriber_told(client: Client) -> None:
    durable = _chain_agent(f"trim{os.urandom(3).hex()}", EventStreamSettings(keep_events=12))
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):
        handle = await start_run(client, durable, "Go", task_queue=tq)
        await handle.result()
        late = await collect(client, handle.id)
        resumed = await collect(client, handle.id, after=late[3].offset)
    trimmed = late[0].event
    assert isinstance(trimmed, EventsTrimmedEvent) and late[0].offset == 0
    assert trimmed.first_kept == late[1].offset == trimmed.missed > 0
    assert len(late) - 1 <= 12 and [i.offset for i in late[1:]] == list(range(late[1].offset, late[-1].offset + 1))
    assert isinstance(late[-1].event, AgentRunResultEvent)
    assert [_comparable(i) for i in resumed] == [_comparable(i) for i in late[4:]]
    await replay(handle)


def _comparable(item: RunEventItem, *, durations: bool = True) -> tuple[int, str]:
    """An item as two reads compare it (without a call's duration: `test_event_stream_faults._comparable` says why)."""
    event = item.event
    if isinstance(event, AgentRunResultEvent):
        return item.offset, f"end {event.result.output}"
    if isinstance(event, NestedCallEndEvent) and not durations:
        return item.offset, repr(dataclasses.replace(event, seconds=0.0))
    return item.offset, repr(event)


async def test_capability_event_hooks_and_process_event_stream_see_the_model_step(client: Client) -> None:
    suffix = os.urandom(3).hex()
    seen_by_hook: list[str] = []
    seen_by_handler: list[str] = []
    hooks = Hooks()

    @hooks.on.event
    async def on_event(ctx: RunContext[None], event: Any) -> Any:
        seen_by_hook.append(event.event_kind)
        return event

    async def handler(ctx: RunContext[None], stream: AsyncIterable[Any]) -> None:
        async for event in stream:
            seen_by_handler.append(event.event_kind)

    # `ProcessEventStream` is pydantic-ai's agent-level event stream handler (the Agent takes no such argument now).
    agent = Agent(scripted_model("hello there"), name=f"hooked{suffix}",
                  capabilities=[hooks, ProcessEventStream(handler)])
    durable = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):
        handle = await start_run(client, durable, "Hi", task_queue=tq)  # not streaming: the hooks still run
        assert (await handle.result()).output == "hello there"
    # In the model activity, on the step's events, as agent.run() gives them (a plain agent on the same script).
    plain: list[str] = []

    async def keep(ctx: RunContext[None], stream: AsyncIterable[Any]) -> None:
        plain.extend([e.event_kind async for e in stream if isinstance(e, _MODEL_EVENTS)])

    await Agent(scripted_model("hello there")).run("Hi", event_stream_handler=keep)
    assert seen_by_hook == plain and seen_by_handler == plain, (seen_by_hook, seen_by_handler, plain)
    await replay(handle)


_MODEL_EVENTS = (PartStartEvent, PartDeltaEvent, PartEndEvent, FinalResultEvent)


async def test_run_agent_feeds_an_event_stream_handler_per_node(client: Client) -> None:
    suffix = os.urandom(3).hex()
    program = "print('working')\n[await get(i=i) for i in range(2)]"
    agent = Agent(scripted_model(RunCode(program), "two numbers"), name=f"handled{suffix}", deps_type=str)

    @agent.tool_plain
    def get(i: int) -> int:
        """A number."""
        return i

    durable = CodeModeAgent(agent)
    calls: list[tuple[int, str | None, list[str]]] = []

    async def handler(ctx: RunContext[str], stream: AsyncIterable[Any]) -> None:
        kinds = [e.name if isinstance(e, CodeModeEvent) else e.event_kind async for e in stream]
        calls.append((ctx.run_step, ctx.deps, kinds))

    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):
        result = await run_agent(client, durable, "Get two", task_queue=tq, deps="the deps",
                                 event_stream_handler=handler)
    assert result.output == "two numbers"
    # One call per node, as agent.run() makes them: the model request, the response's tool calls, the next request.
    assert [(step, deps) for step, deps, _ in calls] == [(0, "the deps"), (1, "the deps"), (1, "the deps"),
                                                          (2, "the deps"), (2, "the deps")][:len(calls)]
    model_first, tools, model_second = calls[1][2], calls[2][2], calls[3][2]
    assert model_first[0] == "codemode.model_request" and "part_start" in model_first
    assert tools[0] == "function_tool_call" and tools[-1] == "function_tool_result"
    assert "codemode.print" in tools and tools.count("codemode.nested_call_end") == 2
    assert model_second[0] == "codemode.model_request"


async def test_codemode_watch_draws_a_streaming_run_from_its_stream(client: Client) -> None:
    from .test_debugging import address, codemode

    suffix = os.urandom(3).hex()
    child = child_agent(f"sumw{suffix}")
    parent = parent_agent(f"watched{suffix}", child)
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, parent, "Add them up", task_queue=tq, stream=True)
        rc, out, err = await codemode("watch", handle.id, address=address(client))
        assert rc == 3, (rc, out, err)  # it stops where the run waits for a person, and says how to decide
        lines = out.splitlines()
        assert "model turn 0 …" in lines and "model turn 0 → run_code call_0 (7 lines)" in lines, out
        assert "  ┆ fetching" in lines and "  ┆ got 30" in lines, out
        assert "  ▸ call_0.0 get(i=0)" in lines and any(line.startswith("  ✓ call_0.2 get(i=2)  ok ") for line in lines)
        assert '  ⏸ call_0.3 note(text="sum is 30") waits for approval (line 5)' in lines, out
        decide_with = f"  codemode approve {handle.id} call_0.3    # or: codemode deny {handle.id} call_0.3 --note ..."
        assert decide_with in lines, out
        assert lines.index("  ┆ got 30") < lines.index("  ▸ call_0.3 note(text=\"sum is 30\")")
        await decide(client, handle.id, "call_0.3", approved=True, approver="ana", note="fine")
        rc, out, err = await codemode("watch", handle.id, address=address(client))
        await handle.result()
    assert rc == 0, (rc, out, err)
    lines = out.splitlines()
    assert "  ✔ call_0.3 approved by ana: fine" in lines, out
    assert f"  ↳ call_0.4 started child run {handle.id}/call_0.4 (agent {child.name}): codemode watch " \
           f"{handle.id}/call_0.4" in lines, out
    assert f"  ↳ child run {handle.id}/call_0.4 completed" in lines
    assert "model turn 1 → answer: the sum is 30" in lines and "answer: the sum is 30" in lines, out
    await replay(handle)


async def test_subscribers_of_an_uncached_run_under_load_see_the_same_events(client: Client) -> None:
    """Every workflow task and every query replays the run (no cache), while a busy process loads the machine."""
    suffix = os.urandom(3).hex()
    program = ("import asyncio\nfor i in range(12):\n    print('step', i)\n    await get(i=i)\n"
               "await asyncio.gather(*(get(i=i) for i in range(10)))")
    agent = Agent(scripted_model(RunCode(program), "done"), name=f"uncached{suffix}")

    @agent.tool_plain
    async def get(i: int) -> int:
        """A number."""
        return i

    durable = CodeModeAgent(agent, stream=True)
    burner = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
    tq = new_task_queue()
    try:
        async with running_worker(client, [durable], task_queue=tq, max_cached_workflows=0):
            handle = await start_run(client, durable, "Go", task_queue=tq)

            async def read() -> list[RunEventItem]:
                return [item async for item in stream_events(client, handle.id, poll_interval=timedelta(
                    milliseconds=20))]

            seen = await asyncio.gather(read(), read())
            await handle.result()
            fresh = await collect(client, handle.id)
    finally:
        burner.kill()
        await burner.wait()
    expected = [_comparable(i, durations=False) for i in fresh]
    for reader, items in enumerate(seen):
        got = [_comparable(i, durations=False) for i in items]
        pairs = enumerate(zip(got, expected, strict=False))
        n = next((k for k, (a, b) in pairs if a != b), min(len(got), len(expected)))
        assert got == expected, (f"reader {reader}: {len(got)} events, {len(expected)} expected; first difference at "
                                 f"{n}: got {got[max(n - 1, 0):n + 2]}, expected {expected[max(n - 1, 0):n + 2]}")
    prints = "".join(i.event.text for i in fresh if isinstance(i.event, PrintEvent))
    assert prints == "".join(f"step {i}\n" for i in range(12))
    await replay(handle)


async def test_a_run_without_model_deltas_publishes_each_part_whole_and_no_signal(client: Client) -> None:
    suffix = os.urandom(3).hex()
    agent = Agent(scripted_model(RunCode("print('hi')\n6 * 7"), "forty-two"), name=f"whole{suffix}")
    durable = CodeModeAgent(agent, stream=EventStreamSettings(model_deltas=False))
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq):
        handle = await start_run(client, durable, "Go", task_queue=tq)
        items = await collect(client, handle.id)
        assert (await handle.result()).output == "forty-two"
    events = [i.event for i in items]
    assert not any(isinstance(e, PartDeltaEvent) for e in events)
    parts = [e.part for e in events if isinstance(e, PartEndEvent)]
    assert [type(p).__name__ for p in parts] == ["ToolCallPart", "TextPart"] and parts[1].content == "forty-two"
    history = await handle.fetch_history()
    assert not any(e.HasField("workflow_execution_signaled_event_attributes") for e in history.events)
    await replay(handle)


async def test_codemode_watch_stops_where_a_child_run_waits_for_a_person(client: Client) -> None:
    from .test_child_runs import PROGRAM, extraction, search
    from .test_debugging import address, codemode

    suffix = os.urandom(3).hex()
    child = extraction(f"xwatch{suffix}", approval=True)
    parent = CodeModeAgent(search(f"swatch{suffix}", child, PROGRAM.format(child=f"xwatch{suffix}")))
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, parent, "Find the cheapest flight", task_queue=tq, stream=True)
        rc, out, err = await codemode("watch", handle.id, address=address(client))
        child_id = f"{handle.id}/call_0.0"
        assert rc == 3, (rc, out, err)  # waiting, in the child: it says where to decide
        assert f"  ↳ call_0.0 started child run {child_id} (agent xwatch{suffix}): codemode watch {child_id}" in out
        assert f"codemode approve {child_id} call_0.0" in out, out
        await decide(client, child_id, "call_0.0", approved=True, approver="ana")
        result = await handle.result()
    assert result.output == "cheapest: LA101"
    await replay(handle)
    await replay(client.get_workflow_handle(child_id))
