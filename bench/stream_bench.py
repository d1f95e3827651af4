"""A run's live event stream: what it costs and how late it is, streaming on against off in the same run.

`python bench/stream_bench.py [--reps 5] [--calls 40] [--gather 200] [--tokens 1000] [--json rows.json]` starts
a dev server in memory and one worker, then per repetition (the order of the runs flipping every repetition):

- **calls**: a program of `--calls` sequential calls to a tool that takes 50 ms, each after a `print`; run without
  streaming (`off`) and streaming with one subscriber (`stream_events`). Latency is from each call's activity
  completing (its `ActivityTaskCompleted` event, stamped by the server) to its `NestedCallEndEvent` reaching the
  subscriber (the same machine's clock). History: events and bytes per nested call that streaming adds.
- **slow subscriber / no subscriber**: the same run streamed with a subscriber that takes 50 ms over every event,
  and with none: a subscriber must not slow the run (their wall times, paired by repetition).
- **update subscriber** (Workflow Streams' stock `WorkflowStreamClient.subscribe`, long-poll updates): the same
  streamed run, for what its polls add to the history; why `stream_events` reads by query instead.
- **gather**: a gather of `--gather` calls (a burst: 200 answers in a few workflow tasks), off and with a subscriber.
- **tokens**: a model that streams `--tokens` tokens (a numbered word each, 10 ms apart, so ~100 tokens/s) as its
  answer; off, streamed with a subscriber (`model_deltas`, the default), and with the response published whole
  (`EventStreamSettings(model_deltas=False)`). Latency is from the model making a token to the subscriber holding
  the delta that carries it; history: what streaming adds per 1,000 tokens, and against the unstreamed run. Also at
  a `model_batch_interval` of 250 and 500 ms (`batch 250 ms`): fewer history events, later tokens.

It prints one table of medians over the repetitions, and the goals: latency p95 <= 250 ms (calls and tokens),
history <= 1.2x the unstreamed run's bytes for the token run, wall time with a slow subscriber within 5% of none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.run_bench`

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from bench.run_bench import machine, run_and_exit
from durable_codemode import (
    CodeModeAgent,
    EventStreamSettings,
    create_worker,
    start_dev_server,
    start_run,
    stream_events,
)
from durable_codemode.events import NestedCallEndEvent
from durable_codemode.testing import RunCode, last_result, scripted_model
from durable_codemode.worker._pool import shutdown_pool

QUEUE = "bench-stream"
TOOL_PAUSE = 0.05
TOKEN_PAUSE = 0.01
SLOW_SUBSCRIBER = 0.05
BATCHES = (250, 500)
"""`model_batch_interval`s the token run is also measured at (with a subscriber), beside the default 100 ms."""
GOAL_LATENCY_P95 = 0.25
GOAL_TOKEN_HISTORY = 1.2
GOAL_SLOW_WALL = 1.05


def calls_agent(calls: int, gather: int) -> CodeModeAgent:
    program = (f"total = 0\nfor i in range({calls}):\n    print('working on', i)\n    total += await work(i=i)\n"
               "total")
    agent = Agent(scripted_model(RunCode(program), lambda m: str(last_result(m)["result"])), name="bench-stream-calls")

    @agent.tool_plain
    async def work(i: int) -> int:
        """Work on item i (50 ms)."""
        await asyncio.sleep(TOOL_PAUSE)
        return i

    return CodeModeAgent(agent)


def gather_agent(gather: int) -> CodeModeAgent:
    program = f"import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range({gather})))\nsum(r)"
    agent = Agent(scripted_model(RunCode(program), lambda m: str(last_result(m)["result"])),
                  name="bench-stream-gather")

    @agent.tool_plain
    async def get(i: int) -> int:
        """Get item i."""
        return i

    return CodeModeAgent(agent)


MADE: dict[str, float] = {}
"""When the token model made each token (`time.time()`), by token, for the run in flight."""


def tokens_agent(tokens: int, *, name: str = "bench-stream-tokens",
                 stream: EventStreamSettings | None = None) -> CodeModeAgent:
    words = [f"w{i:05d} " for i in range(tokens)]

    async def whole(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(TOKEN_PAUSE * len(words))  # as long as the streamed answer takes
        return ModelResponse(parts=[TextPart("".join(words))])

    async def stream_tokens(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        for word in words:
            await asyncio.sleep(TOKEN_PAUSE)
            MADE[word] = time.time()
            yield word

    return CodeModeAgent(Agent(FunctionModel(whole, stream_function=stream_tokens), name=name), stream=stream or False)


@dataclass
class Measured:
    """One run."""

    scenario: str
    side: str
    rep: int
    wall_s: float
    events: int
    history_bytes: int
    latencies: list[float] = field(default_factory=list)


def _sizes(history: WorkflowHistory) -> tuple[int, int]:
    return len(history.events), History(events=list(history.events)).ByteSize()


def _completed_at(history: WorkflowHistory) -> dict[str, float]:
    """Each nested call's activity completion time (server clock), by call id."""
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_id for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
    return {scheduled[e.activity_task_completed_event_attributes.scheduled_event_id].rsplit("-", 1)[0]:
            e.event_time.ToNanoseconds() / 1e9 for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and e.activity_task_completed_event_attributes.scheduled_event_id in scheduled}


class StreamBench:
    def __init__(self, client: Client, calls: int, gather: int, tokens: int) -> None:
        self.client = client
        self.agents = {"calls": calls_agent(calls, gather), "gather": gather_agent(gather),
                       "tokens": tokens_agent(tokens),
                       "whole": tokens_agent(tokens, name="bench-stream-whole",
                                             stream=EventStreamSettings(model_deltas=False)),
                       **{f"batch {ms} ms": tokens_agent(
                           tokens, name=f"bench-stream-batch-{ms}",
                           stream=EventStreamSettings(model_batch_interval=timedelta(milliseconds=ms)))
                          for ms in BATCHES}}
        self.tokens = tokens

    async def run(self, scenario: str, side: str, rep: int) -> Measured:
        own = side == "whole parts" or side.startswith("batch ")  # the agent's own settings
        agent = self.agents["whole" if side == "whole parts" else side if side.startswith("batch ") else scenario]
        stream = None if own else side != "off"
        MADE.clear()
        started = time.monotonic()
        handle = await start_run(self.client, agent, "go", task_queue=QUEUE, stream=stream,
                                 run_id=f"bench-{scenario}-{side}-{uuid.uuid4().hex[:8]}")
        received: dict[str, float] = {}
        reader = None
        if side in ("subscriber", "slow subscriber", "whole parts") or side.startswith("batch "):
            reader = asyncio.create_task(self._subscribe(handle.id, received, slow=side == "slow subscriber"))
        elif side == "update subscriber":
            reader = asyncio.create_task(self._update_subscriber(handle.id))
        await handle.result()
        wall = time.monotonic() - started
        if reader is not None:
            await asyncio.wait_for(reader, 300)
        history = await handle.fetch_history()
        events, size = _sizes(history)
        if scenario == "tokens":
            latencies = [received[w] - MADE[w] for w in received if w in MADE]
        else:
            done = _completed_at(history)
            latencies = [received[c] - done[c] for c in received if c in done]
        return Measured(scenario, side, rep, wall, events, size, latencies)

    async def _subscribe(self, run_id: str, received: dict[str, float], *, slow: bool) -> None:
        text = ""
        async for item in stream_events(self.client, run_id):
            now = time.time()
            event = item.event
            if isinstance(event, NestedCallEndEvent):
                received.setdefault(event.call_id, now)
            elif isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                text = event.part.content
                for word in _words(text):
                    received.setdefault(word, now)
            elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                text += event.delta.content_delta
                for word in _words(text):
                    received.setdefault(word, now)
            if slow:
                await asyncio.sleep(SLOW_SUBSCRIBER)

    async def _update_subscriber(self, run_id: str) -> None:
        stock = WorkflowStreamClient.create(self.client, run_id)
        async for item in stock.subscribe(poll_cooldown=timedelta(milliseconds=100)):
            if isinstance(item.data, dict) and item.data.get("name") == "codemode.run_end":
                return


def _words(text: str) -> list[str]:
    return [w + " " for w in text.split(" ")[:-1]]


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _median(rows: list[Measured], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in rows)


def table(rows: list[Measured], calls: dict[str, int], tokens: int) -> tuple[str, bool]:
    def of(scenario: str, side: str) -> list[Measured]:
        return [r for r in rows if r.scenario == scenario and r.side == side]

    header = ["scenario", "side", "wall s", "wall x off", "events", "+events", "history B", "history x off",
              "+B/call", "+B/1k tokens", "latency p50", "latency p95"]
    table_rows: list[list[str]] = []
    ok = True
    for scenario, sides in (("calls", ("off", "subscriber", "no subscriber", "slow subscriber", "update subscriber")),
                            ("gather", ("off", "subscriber")),
                            ("tokens", ("off", "subscriber", *(f"batch {ms} ms" for ms in BATCHES), "whole parts"))):
        base = of(scenario, "off")
        if not base:
            continue
        wall0, events0, bytes0 = _median(base, "wall_s"), _median(base, "events"), _median(base, "history_bytes")
        for side in sides:
            mine = of(scenario, side)
            if not mine:
                continue
            wall, events, size = _median(mine, "wall_s"), _median(mine, "events"), _median(mine, "history_bytes")
            lat = [x for r in mine for x in r.latencies]
            table_rows.append([
                scenario, side, f"{wall:.2f}", f"{wall / wall0:.2f}x", f"{events:.0f}", f"{events - events0:+.0f}",
                f"{size:,.0f}", f"{size / bytes0:.2f}x",
                f"{(size - bytes0) / calls[scenario]:+,.0f}" if scenario in calls else "—",
                f"{(size - bytes0) * 1000 / tokens:+,.0f}" if scenario == "tokens" else "—",
                f"{_p(lat, .5) * 1000:.0f} ms" if lat else "—", f"{_p(lat, .95) * 1000:.0f} ms" if lat else "—"])
            if lat and _p(lat, .95) > GOAL_LATENCY_P95 and side == "subscriber" and scenario != "gather":
                ok = False
    widths = [max(len(r[i]) for r in [header, *table_rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths,
                                                                                                   strict=True)))
             for row in [header, *table_rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    checks = []
    token_history = _median(of("tokens", "subscriber"), "history_bytes") / _median(of("tokens", "off"),
                                                                                   "history_bytes")
    checks.append(("token run history <= 1.2x unstreamed", token_history, token_history <= GOAL_TOKEN_HISTORY))
    slow = statistics.median(s.wall_s / n.wall_s for s, n in zip(of("calls", "slow subscriber"),
                                                                   of("calls", "no subscriber"), strict=True))
    checks.append(("wall, slow subscriber / none (median of pairs)", slow, slow <= GOAL_SLOW_WALL))
    lines.append("")
    lines += [f"{name}: {value:.2f} {'ok' if good else 'MISSED'}" for name, value, good in checks]
    lines.append(f"latency p95 goal {GOAL_LATENCY_P95 * 1000:.0f} ms (calls, tokens): {'ok' if ok else 'MISSED'}")
    return "\n".join(lines), ok and all(good for _, _, good in checks)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--gather", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None, help="write every measured run here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    print(machine())
    async with await start_dev_server() as env:
        bench = StreamBench(env.client, args.calls, args.gather, args.tokens)
        worker = create_worker(env.client, list(bench.agents.values()), task_queue=QUEUE)
        rows: list[Measured] = []
        async with worker:
            await bench.run("calls", "off", -1)  # warm-up
            for rep in range(args.reps):
                pairs = [("calls", "off"), ("calls", "subscriber"), ("calls", "no subscriber"),
                         ("calls", "slow subscriber"), ("calls", "update subscriber"), ("gather", "off"),
                         ("gather", "subscriber"), ("tokens", "off"), ("tokens", "subscriber"),
                         *(("tokens", f"batch {ms} ms") for ms in BATCHES), ("tokens", "whole parts")]
                for scenario, side in (pairs if rep % 2 == 0 else list(reversed(pairs))):
                    rows.append(await bench.run(scenario, side, rep))
                print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr)
        shutdown_pool()
    text, ok = table(rows, {"calls": args.calls, "gather": args.gather}, args.tokens)
    print(text)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    run_and_exit(main())
