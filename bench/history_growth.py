"""How a run's history grows with its turns: ours, ours before behaviour version 4, and pydantic-ai's own Temporal.

`python bench/history_growth.py [--turns 10 20 40 100] [--calls 3]` starts one dev server in memory and runs the
same scripted conversation of T turns, once per T, three ways:

- **ours**: a `CodeModeAgent` whose scripted model runs one small program per turn (C calls of one tool, then a
  sum), then answers "done"; its limits are raised so no snippet or model-request cap forces continue-as-new.
- **ours v3**: the same agent, the run started with its recorded spec set to behaviour version 3 (every model
  request carries the whole conversation), as a run a version-3 worker started goes on live on this release.
- **pydantic-ai**: an `Agent` with `TemporalDurability()` and a `FunctionModel` that calls the same tool once per
  turn as a plain tool call, then answers "done"; its workflow returns the run's messages (ours returns its turns).

Every side runs on Temporal's workflow runner without the sandbox (`workflow_runner()`), and every history is
replayed offline. It prints one table: each chain's history bytes (the sum of `event.ByteSize()` over every run of
the chain), events, its largest model-request activity input, continue-as-new runs, and how the history compares
with the conversation it holds. See `bench/README.md` ("History size per turn").
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin, TemporalDurability
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RunUsage, UsageLimits
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Replayer, Worker

from bench.run_bench import machine, run_and_exit
from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    RunResult,
    SnippetLimits,
    create_worker,
    start_dev_server,
    start_run,
)
from durable_codemode._visibility import start_options
from durable_codemode.shared._names import MODEL_REQUEST_ACTIVITY
from durable_codemode.shared._types import Continuation, RunInput
from durable_codemode.testing import RunCode, fetch_chain_histories, replay, scripted_model, user_prompt
from durable_codemode.worker._describe import describe_run
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner

OURS_QUEUE = "bench-growth-codemode"
ANCHOR_QUEUE = "bench-growth-pydantic-ai"
OURS = "history-growth"
ANCHOR = "history_growth_anchor"
BEFORE_VERSION = 3
"""The last behaviour version that sent the whole conversation with every model request."""


def _turns_asked(messages: Sequence[ModelMessage]) -> int:
    """The run's number of turns, from its prompt (`turns=N`): one agent serves every size."""
    return int(user_prompt(messages).removeprefix("turns="))


def _answered(messages: Sequence[ModelMessage]) -> int:
    return sum(isinstance(m, ModelResponse) for m in messages)


def look(i: int) -> int:
    """Item i's value."""
    return i * 10


def ours_agent(max_turns: int, calls: int, per_run: int | None = None) -> CodeModeAgent:
    """Our side: turn k runs a program calling `look` `calls` times; after the prompt's turns, it answers.

    `per_run`: the snippets one workflow run executes before it continues as new; `None`: more than any run makes.
    """

    def step(messages: list[ModelMessage]) -> RunCode | str:
        k = _answered(messages)
        if k >= _turns_asked(messages):
            return "done"
        return RunCode(f"rows = [await look(i=i) for i in range({calls})]\nsum(rows) + {k}")

    agent = Agent(scripted_model(*[step] * (max_turns + 1)), name=OURS, instructions="Use run_code.")
    agent.tool_plain(look)
    # Raised so that neither the snippet cap (25 per workflow run) nor the model-request cap (50) cuts the run:
    # one workflow run holds the whole conversation, unless Temporal suggests continuing as new.
    limits = SnippetLimits(max_snippets_per_run=per_run or max_turns + 1, max_model_requests=max_turns + 5)
    return CodeModeAgent(agent, limits=limits)


def _anchor_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Turn k calls `look(i=k)` as a plain tool call; after the prompt's turns, it answers."""
    k = _answered(messages)
    if k >= _turns_asked(messages):
        return ModelResponse(parts=[TextPart("done")])
    return ModelResponse(parts=[ToolCallPart("look", {"i": k}, tool_call_id=f"call_{k}")])


ANCHOR_AGENT = Agent(FunctionModel(_anchor_model), name=ANCHOR, instructions="Use look.", tools=[look],
                     capabilities=[TemporalDurability()])


@workflow.defn(name="bench.history-growth.anchor")
class AnchorWorkflow:
    """pydantic-ai's agent run in a workflow, as its Temporal guide has it; returns the run's messages."""

    @workflow.run
    async def run(self, prompt: str) -> list[ModelMessage]:
        # pydantic-ai's default `request_limit` (50) would end a 100-turn run, as our raised limits do not.
        result = await ANCHOR_AGENT.run(prompt, usage_limits=UsageLimits(request_limit=None))
        return result.all_messages()


@dataclass
class Measured:
    """One chain: whether the run answered right, its histories' sizes, its model inputs, and its times."""

    side: str
    turns: int
    ok: bool
    history_bytes: int
    events: int
    first_model_input: int
    largest_later_input: int
    runs: int
    message_bytes: int
    wall: float
    replay: float


def model_inputs(history: WorkflowHistory, is_model: Callable[[str], bool]) -> list[int]:
    """The bytes of each model-request activity input in `history` (the payloads' data, as the converter wrote it)."""
    sizes = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if is_model(attrs.activity_type.name):
                sizes.append(sum(len(p.data) for p in attrs.input.payloads))
    return sizes


async def measure(side: str, turns: int, start: Callable[[], Awaitable[WorkflowHandle[Any, Any]]],
                  messages_of: Callable[[Any], list[ModelMessage]], is_model: Callable[[str], bool],
                  replay_chain: Callable[[WorkflowHandle[Any, Any], list[WorkflowHistory]], Awaitable[None]],
                  ) -> Measured:
    """Run one chain to its end, size every run of it, and replay it."""
    t0 = time.perf_counter()
    handle = await start()
    value = await handle.result()
    wall = time.perf_counter() - t0
    histories = await fetch_chain_histories(handle)
    t0 = time.perf_counter()
    await replay_chain(handle, histories)
    replayed = time.perf_counter() - t0
    messages = messages_of(value)
    inputs = [size for h in histories for size in model_inputs(h, is_model)]
    ok = (len(messages) == 2 * turns + 2 and isinstance(messages[-1], ModelResponse)
          and messages[-1].parts == [TextPart("done")])
    return Measured(
        side=side, turns=turns, ok=ok,
        history_bytes=sum(e.ByteSize() for h in histories for e in h.events),
        events=sum(len(h.events) for h in histories),
        first_model_input=inputs[0], largest_later_input=max(inputs[1:]),
        runs=len(histories) - 1,
        message_bytes=len(ModelMessagesTypeAdapter.dump_json(messages)),
        wall=wall, replay=replayed)


async def run(args: argparse.Namespace) -> int:
    print(machine(), flush=True)
    began = time.perf_counter()
    durable = ours_agent(max(args.turns), args.calls, args.snippets_per_run)
    env = await start_dev_server(banner="off")  # the dev server's banner would land in the table
    rows: list[Measured] = []
    try:
        client = env.client
        anchor_client = await Client.connect(client.service_client.config.target_host,
                                             namespace=client.namespace, plugins=[PydanticAIPlugin()])
        ours_worker = create_worker(client, [durable], task_queue=OURS_QUEUE)
        # The plugin keeps a runner that is not Temporal's sandbox as it is: both sides run unsandboxed.
        anchor_worker = Worker(anchor_client, task_queue=ANCHOR_QUEUE, workflows=[AnchorWorkflow],
                               plugins=[AgentPlugin(ANCHOR_AGENT)], workflow_runner=workflow_runner())
        anchor_replayer = Replayer(workflows=[AnchorWorkflow], plugins=[PydanticAIPlugin()],
                                   workflow_runner=workflow_runner())

        async def replay_ours(handle: WorkflowHandle[Any, Any], _: list[WorkflowHistory]) -> None:
            await replay(handle)

        async def replay_anchor(_: WorkflowHandle[Any, Any], histories: list[WorkflowHistory]) -> None:
            for history in histories:
                await anchor_replayer.replay_workflow(history)

        async def start_before(turns: int) -> WorkflowHandle[Any, Any]:
            # As a run a version-3 worker started: its recorded spec says so, and this release keeps behaving so.
            spec = await describe_run(durable)
            spec.behavior_version = BEFORE_VERSION
            return await client.start_workflow(
                CodeModeRunWorkflow.run, RunInput(agent=OURS, prompt=f"turns={turns}", continuation=Continuation(
                    spec=spec, usage=RunUsage(), turns=[], runs=0)),
                id=f"{OURS}-v{BEFORE_VERSION}-{uuid.uuid4().hex[:8]}", task_queue=OURS_QUEUE,
                **start_options(client, OURS))

        def ours_messages(result: RunResult[Any]) -> list[ModelMessage]:
            return result.all_messages()

        def ours_model(name: str) -> bool:
            return name == MODEL_REQUEST_ACTIVITY

        def anchor_messages(messages: list[ModelMessage]) -> list[ModelMessage]:
            return messages

        def anchor_model(name: str) -> bool:
            return name == f"agent__{ANCHOR}__model_request"

        async with ours_worker, anchor_worker:
            for turns in args.turns:
                prompt = f"turns={turns}"
                rows.append(await measure("ours", turns, partial(start_run, client, OURS, prompt,
                                                                 task_queue=OURS_QUEUE),
                                          ours_messages, ours_model, replay_ours))
                rows.append(await measure(f"ours v{BEFORE_VERSION}", turns, partial(start_before, turns),
                                          ours_messages, ours_model, replay_ours))
                rows.append(await measure("pydantic-ai", turns, partial(
                    anchor_client.start_workflow, AnchorWorkflow.run, prompt, id=f"{ANCHOR}-{uuid.uuid4().hex[:8]}",
                    task_queue=ANCHOR_QUEUE), anchor_messages, anchor_model, replay_anchor))
                print(f"{turns} turns: done ({time.perf_counter() - began:.0f} s)", file=sys.stderr, flush=True)
    finally:
        await env.shutdown()
        shutdown_pool()
    print(table(rows, args.calls, args.snippets_per_run), flush=True)
    print(f"wall time of the whole bench: {time.perf_counter() - began:.0f} s", flush=True)
    return 0 if all(r.ok for r in rows) else 1


SIDE_ORDER = ("ours", f"ours v{BEFORE_VERSION}", "pydantic-ai")


def table(rows: list[Measured], calls: int, per_run: int | None) -> str:
    """One table, grouped by side; the ratio against each side's own fixed bytes per turn (see the footnote)."""
    header = ["side", "turns", "history KB", "B/turn", "events", "model input B: first / largest later", "CAN runs",
              "messages KB", "history / (messages + fixed)", "wall s", "replay s", "result"]
    lines = []
    for side in SIDE_ORDER:
        mine = sorted((r for r in rows if r.side == side), key=lambda r: r.turns)
        if not mine:
            continue
        reference = mine[0]
        fixed = (reference.history_bytes - reference.message_bytes) / reference.turns
        for r in mine:
            ratio = r.history_bytes / (r.message_bytes + fixed * r.turns)
            lines.append([side, str(r.turns), f"{r.history_bytes / 1000:,.0f}", f"{r.history_bytes / r.turns:,.0f}",
                          f"{r.events:,}", f"{r.first_model_input:,} / {r.largest_later_input:,}", str(r.runs),
                          f"{r.message_bytes / 1000:,.1f}", f"{ratio:.2f}x",
                          f"{r.wall:.1f}", f"{r.replay:.1f}", "ok" if r.ok else "WRONG"])
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def render(cells: list[str]) -> str:
        return " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    smallest = min(r.turns for r in rows)
    notes = [
        f"A turn: ours and ours v{BEFORE_VERSION} run one program calling one tool {calls} times (one activity "
        "each); pydantic-ai calls the same tool once, as a plain tool call. Each run ends with a text answer. Ours: "
        + (f"{per_run} snippets per workflow run, then continue-as-new." if per_run else
           "no snippet cap per workflow run (raised past the turns).")
        + " Ours' model-request cap and pydantic-ai's request_limit are raised past the turns.",
        "history: sum of event.ByteSize() over every run of the chain (serialized protobuf, as stored); model "
        "input: a model-request activity's input (its payloads' data), the run's first request and the largest of "
        "the others; CAN runs: runs that continued as new (ours follows Temporal's suggestion, given past 4 MB of "
        "history; pydantic-ai's agent has no continue_as_new handler here, so it does not).",
        "messages: ModelMessagesTypeAdapter.dump_json of the run's whole conversation (result.all_messages()).",
        f"fixed: a side's fixed bytes per turn = (history - messages) / turns of its {smallest}-turn run, so that "
        "run's ratio is 1.00 by definition; a side whose history is linear in turns stays at or under 1.00 as "
        "turns grow (its per-run constants spread thinner), one that grows with the square goes over.",
        f"ours v{BEFORE_VERSION}: started with its recorded spec at behaviour version {BEFORE_VERSION} (the spec "
        "in the run's input, not a describe marker; otherwise the same run). Every side replayed offline.",
    ]
    out = [render(header), "-+-".join("-" * w for w in widths), *(render(line) for line in lines)]
    return "\n".join([*out, *notes])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 20, 40, 100], help="turns of each run")
    parser.add_argument("--calls", type=int, default=3, help="tool calls each of our programs makes")
    parser.add_argument("--snippets-per-run", type=int, default=None,
                        help="our runs continue as new after this many snippets (default: never; 25 is the "
                             "SnippetLimits default)")
    args = parser.parse_args(argv)
    if min(args.turns) < 1 or args.calls < 1 or (args.snippets_per_run or 1) < 1:
        parser.error("--turns, --calls and --snippets-per-run must be positive")
    run_and_exit(run(args))


if __name__ == "__main__":
    main()
