"""A run's live event stream: what it costs and how late it is, streaming on against off in the same run.

`python bench/stream_bench.py [--reps 3] [--calls 20] [--gather 200] [--tokens 1000] [--json rows.json]` starts a
dev server in memory and one worker, then per repetition (the order of each pair flipping every repetition):

- **nested calls**: a program of `--calls` sequential calls to a tool that takes 50 ms, then a gather of
  `--gather` calls; run once without streaming and once streaming with one subscriber (`stream_events`). Latency
  is from each call's activity completing (its `ActivityTaskCompleted` event, stamped by the server) to its
  `NestedCallEndEvent` reaching the subscriber (the same machine's clock). History: events and bytes per nested
  call that streaming adds.
- **model tokens**: a model that streams `--tokens` tokens (a numbered word each, 10 ms apart) as its answer; run
  unstreamed and streamed with a subscriber. Latency is from the model making a token to the subscriber holding
  the delta that carries it; history: what streaming adds per 1,000 tokens, and against the unstreamed run.
- **slow subscriber**: the nested-call run streamed with a subscriber that takes 50 ms over every event, against
  the same run streamed with no subscriber: a subscriber must not slow the run.
- **update subscriber** (Workflow Streams' stock `WorkflowStreamClient.subscribe`, long-poll updates): the same
  streamed run, for what its polls add to the history; why `stream_events` reads by query instead.

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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.run_bench`

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from bench.run_bench import machine, run_and_exit
from durable_codemode import CodeModeAgent, create_worker, start_dev_server, start_run, stream_events
from durable_codemode._pool import shutdown_pool
from durable_codemode.events import NestedCallEndEvent
from durable_codemode.testing import RunCode, last_result, scripted_model

QUEUE = "bench-stream"
TOOL_PAUSE = 0.05
TOKEN_PAUSE = 0.01
SLOW_SUBSCRIBER = 0.05
GOAL_LATENCY_P95 = 0.25
GOAL_TOKEN_HISTORY = 1.2
GOAL_SLOW_WALL = 1.05


def calls_agent(calls: int, gather: int) -> CodeModeAgent:
    program = (f"import asyncio\ntotal = 0\nfor i in range({calls}):\n    total += await work(i=i)\n"
               f"r = await asyncio.gather(*(get(i=i) for i in range({gather})))\ntotal + sum(r)")
    agent = Agent(scripted_model(RunCode(program), lambda m: str(last_result(m)["result"])), name="bench-stream-calls")

    @agent.tool_plain
    async def work(i: int) -> int:
        """Work on item i (50 ms)."""
        await asyncio.sleep(TOOL_PAUSE)
        return i

    @agent.tool_plain
    async def get(i: int) -> int:
        """Get item i."""
        return i

    return CodeModeAgent(agent)


MADE: dict[str, float] = {}
"""When the token model made each token (`time.time()`), by token, for the run in flight."""


def tokens_agent(tokens: int) -> CodeModeAgent:
    words = [f"w{i:05d} " for i in range(tokens)]

    def whole(messages: list[ModelMessage], info: AgentInfo) -> Any:
        from pydantic_ai.messages import ModelResponse

        return ModelResponse(parts=[TextPart("".join(words))])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        for word in words:
            await asyncio.sleep(TOKEN_PAUSE)
            MADE[word] = time.time()
            yield word

    return CodeModeAgent(Agent(FunctionModel(whole, stream_function=stream), name="bench-stream-tokens"))


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
        self.calls_agent, self.tokens_agent = calls_agent(calls, gather), tokens_agent(tokens)
        self.tokens = tokens

    async def run(self, scenario: str, side: str, rep: int) -> Measured:
        agent = self.tokens_agent if scenario == "tokens" else self.calls_agent
        stream = side != "off"
        MADE.clear()
        started = time.monotonic()
        handle = await start_run(self.client, agent, "go", task_queue=QUEUE, stream=stream,
                                 run_id=f"bench-{scenario}-{side}-{uuid.uuid4().hex[:8]}")
        received: dict[str, float] = {}
        reader = None
        if side in ("subscriber", "slow subscriber"):
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


def table(rows: list[Measured], calls: int, tokens: int) -> tuple[str, bool]:
    def of(scenario: str, side: str) -> list[Measured]:
        return [r for r in rows if r.scenario == scenario and r.side == side]

    lines = [f"{'scenario':<8} {'side':<18} {'wall s':>7} {'x off':>6} {'events':>7} {'+ev':>5} {'history B':>10} "
             f"{'x off':>6} {'+B/call':>8} {'+B/1k tok':>9} {'lat p50':>8} {'lat p95':>8}"]
    ok = True
    for scenario, sides in (("calls", ("off", "subscriber", "slow subscriber", "no subscriber",
                                       "update subscriber")), ("tokens", ("off", "subscriber"))):
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
            per_call = f"{(size - bytes0) / calls:8.0f}" if scenario == "calls" else f"{'':>8}"
            per_tok = f"{(size - bytes0) * 1000 / tokens:9.0f}" if scenario == "tokens" else f"{'':>9}"
            p50, p95 = (f"{_p(lat, .5) * 1000:6.0f}ms", f"{_p(lat, .95) * 1000:6.0f}ms") if lat else ("", "")
            lines.append(f"{scenario:<8} {side:<18} {wall:7.2f} {wall / wall0:6.2f} {events:7.0f} "
                         f"{events - events0:5.0f} {size:10.0f} {size / bytes0:6.2f} {per_call} {per_tok} "
                         f"{p50:>8} {p95:>8}")
            if lat and _p(lat, .95) > GOAL_LATENCY_P95:
                ok = False
    checks = []
    token_history = _median(of("tokens", "subscriber"), "history_bytes") / _median(of("tokens", "off"),
                                                                                   "history_bytes")
    checks.append(("token run history <= 1.2x unstreamed", token_history, token_history <= GOAL_TOKEN_HISTORY))
    slow = statistics.median(s.wall_s / n.wall_s for s, n in zip(of("calls", "slow subscriber"),
                                                                   of("calls", "no subscriber"), strict=True))
    checks.append(("wall, slow subscriber / none (median of pairs)", slow, slow <= GOAL_SLOW_WALL))
    lines.append("")
    lines += [f"{name}: {value:.2f} {'ok' if good else 'MISSED'}" for name, value, good in checks]
    lines.append(f"latency p95 goal {GOAL_LATENCY_P95 * 1000:.0f} ms: {'ok' if ok else 'MISSED'}")
    return "\n".join(lines), ok and all(good for _, _, good in checks)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--gather", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None, help="write every measured run here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    print(machine())
    async with await start_dev_server() as env:
        bench = StreamBench(env.client, args.calls, args.gather, args.tokens)
        worker = create_worker(env.client, [bench.calls_agent, bench.tokens_agent], task_queue=QUEUE)
        rows: list[Measured] = []
        async with worker:
            await bench.run("calls", "off", -1)  # warm-up
            for rep in range(args.reps):
                pairs = [("calls", "off"), ("calls", "subscriber"), ("calls", "no subscriber"),
                         ("calls", "slow subscriber"), ("calls", "update subscriber"), ("tokens", "off"),
                         ("tokens", "subscriber")]
                for scenario, side in (pairs if rep % 2 == 0 else list(reversed(pairs))):
                    rows.append(await bench.run(scenario, side, rep))
                print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr)
        shutdown_pool()
    text, ok = table(rows, args.calls + args.gather, args.tokens)
    print(text)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    run_and_exit(main())
