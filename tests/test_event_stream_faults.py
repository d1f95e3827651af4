"""A run's event stream across a worker SIGKILL and a server restart: nothing lost, nothing repeated.

A subscriber follows one streaming run of the ledger agent (its worker a separate process) as a UI would: when its
connection breaks it resumes after the last offset it saw. Meanwhile the worker is SIGKILLed (its spare takes over)
and the dev server is stopped and started again on its SQLite file. What the subscriber saw live must be exactly
what a fresh subscriber reads from the finished run: the same events at the same offsets, each nested call
started and ended once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic_ai.run import AgentRunResultEvent
from temporalio.client import Client
from temporalio.service import RPCError

from durable_codemode import WorkerUnavailableError, connect, decide, start_dev_server, start_run, stream_events
from durable_codemode.debugging import register_agents
from durable_codemode.events import ApprovalWaitEvent, NestedCallEndEvent, NestedCallStartEvent, RunEventItem
from durable_codemode.testing import new_task_queue, replay

from ._ledger_worker import AGENT, Ledger, LedgerTask, ledger_agent
from ._workers import worker_fleet


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _comparable(item: RunEventItem) -> tuple[int, str]:
    """An item as compared live and after the run: everything but a call's duration.

    A duration is workflow time (`workflow.now()` at the call and at its answer), and that was measured to differ
    between the live run and a replay of it around a server restart: the live workflow task just after the restart
    read the previous task's time (a call of 0.43 s by its history was 0.0 s live, and the next one 0.80 s for
    0.37 s), while a replay reads each task's own start time. Which events, at which offsets, with what else in
    them, is the same.
    """
    event = item.event
    if isinstance(event, AgentRunResultEvent):
        return item.offset, f"end {event.result.output}"
    if isinstance(event, NestedCallEndEvent):
        return item.offset, repr(dataclasses.replace(event, seconds=0.0))
    return item.offset, repr(event)


class Follower:
    """A subscriber that resumes after the last offset it saw whenever its stream breaks."""

    def __init__(self, client: Client, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.items: list[RunEventItem] = []
        self.breaks = 0
        self.changed = asyncio.Event()

    def count(self, kind: type) -> int:
        return sum(isinstance(i.event, kind) for i in self.items)

    async def follow(self) -> None:
        while True:
            after = self.items[-1].offset if self.items else None
            try:
                async for item in stream_events(self.client, self.run_id, after=after, timeout=timedelta(seconds=3)):
                    self.items.append(item)
                    self.changed.set()
                    if isinstance(item.event, AgentRunResultEvent):
                        return
            except (RPCError, WorkerUnavailableError):
                self.breaks += 1
                await asyncio.sleep(0.2)

    async def until(self, predicate: Callable[[], bool], deadline: float) -> None:
        while not predicate():
            assert time.monotonic() < deadline, f"stuck after {len(self.items)} events"
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_subscriber_sees_each_event_once_across_a_worker_kill_and_a_server_restart(tmp_path: Path) -> None:
    port = _free_port()
    db = tmp_path / "temporal.sqlite"
    address = f"127.0.0.1:{port}"
    env = await start_dev_server(db_file=db, port=port)
    try:
        client = await connect(address)
        task_queue = new_task_queue("streamfaults")
        task = LedgerTask(account="acc-stream", gathers=2, width=5, sequential=30, pause_ms=40, payout=True, after=10)
        async with worker_fleet(client, address, task_queue, tmp_path, sticky=1.0, tool_timeout=3.0) as fleet:
            worker = await fleet.start(spare=True)
            handle = await start_run(client, AGENT, task.prompt(), task_queue=task_queue, run_id=f"{task_queue}-run",
                                     stream=True)
            follower = Follower(client, handle.id)
            following = asyncio.create_task(follower.follow())
            deadline = time.monotonic() + 180
            await follower.until(lambda: follower.count(NestedCallEndEvent) >= 12, deadline)
            worker.kill()
            worker = await fleet.start(spare=True)
            await follower.until(lambda: follower.count(NestedCallEndEvent) >= 25, deadline)
            await env.shutdown()
            env = await start_dev_server(db_file=db, port=port)
            await follower.until(lambda: follower.count(ApprovalWaitEvent) >= 1, deadline)
            wait = next(i.event for i in follower.items if isinstance(i.event, ApprovalWaitEvent))
            while True:
                try:
                    await decide(client, handle.id, wait.call_id, approved=True, approver="ops")
                    break
                except (RPCError, WorkerUnavailableError):
                    await asyncio.sleep(0.2)
            await asyncio.wait_for(following, 120)
            result = await handle.result()
            fresh = [item async for item in stream_events(client, handle.id)]
            register_agents([ledger_agent(Ledger(fleet.ledger))])  # the payout's rule is code: replays look it up
            await replay(handle)
        assert fleet.leftovers() == []
    finally:
        await env.shutdown()
    assert result.output == str(task.expected(approved=True))
    live = [_comparable(i) for i in follower.items]
    assert [o for o, _ in live] == list(range(len(live))), "offsets increase by one: none skipped, none repeated"
    assert live == [_comparable(i) for i in fresh], "what was seen live is what the finished run holds"
    starts = Counter(i.event.call_id for i in follower.items if isinstance(i.event, NestedCallStartEvent))
    ends = Counter(i.event.call_id for i in follower.items if isinstance(i.event, NestedCallEndEvent))
    assert set(starts.values()) == set(ends.values()) == {1} and starts.keys() == ends.keys()
    assert len(ends) == task.calls()

