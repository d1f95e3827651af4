"""A run survives its worker: stopped mid-run, a new worker replays the snippet and finishes, no call repeated."""

from __future__ import annotations

import asyncio

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from durable_codemode import start_run
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker
from durable_codemode.worker._pool import POOL

from ._agents import Effects, items_agent


async def _wait_for_event(client: Client, workflow_id: str, kind: EventType.ValueType, timeout: float = 20) -> None:
    async def poll() -> None:
        while True:
            history = await client.get_workflow_handle(workflow_id).fetch_history()
            if any(e.event_type == kind for e in history.events):
                return
            await asyncio.sleep(0.1)

    await asyncio.wait_for(poll(), timeout)


async def test_worker_stopped_mid_run_new_worker_finishes_exactly_once(client: Client) -> None:
    effects = Effects()
    code = """
import time
before = await store(key='a', value=await get(i=1))
time.sleep(2)
after = await store(key='b', value=await get(i=2))
[before, after]
"""
    agent = items_agent("restartable", RunCode(code), lambda m: repr(last_result(m)["result"]), effects=effects)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "restartable", "go", task_queue=tq)
        await _wait_for_event(client, handle.id, EventType.EVENT_TYPE_TIMER_STARTED)
    # The first worker is gone mid-snippet (its REPL released); a fresh worker has no cached state and must
    # rebuild the REPL by replaying the snippet from history.
    assert POOL.live_sessions() == 0
    async with running_worker(client, [agent], task_queue=tq):
        result = await handle.result()
    assert eval(result.output) == [{"a": 10}, {"a": 10, "b": 20}]
    assert effects.calls == [("get", 1), ("store", ("a", 10)), ("get", 2), ("store", ("b", 20))]
    assert effects.duplicates == 0
    assert POOL.live_sessions() == 0
    await replay(handle)
