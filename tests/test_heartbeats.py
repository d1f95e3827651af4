"""Heartbeats: an attempt whose worker dies is retried after its heartbeat timeout, not its whole timeout.

What a test can see without killing a worker: the heartbeat timeouts are in the scheduled activities, and an
attempt that outlives its heartbeat timeout still completes on its first attempt, because the worker beats
while the tool runs (Temporal times out an attempt that does not beat, counting from its start). The kill itself
is tests/test_multi_worker.py and tests/test_chaos.py. Also: `testing.replay` finds the chain from any handle.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from durable_codemode import CodeModeUserError, ToolOptions
from durable_codemode.testing import RunCode

from ._agents import Effects
from .test_snippets import echo, run


async def test_a_call_longer_than_its_heartbeat_timeout_completes_on_its_first_attempt(client: Client) -> None:
    effects = Effects()
    result, handle = await run(client, RunCode("await slow(seconds=5.0)"), echo, effects=effects,
                               heartbeat_timeout=timedelta(seconds=2))
    assert "slow done" in result.output
    assert effects.calls == [("slow", 5.0)]  # one attempt: the beats kept it alive past 2 s
    scheduled = {e.activity_task_scheduled_event_attributes.activity_type.name:
                 e.activity_task_scheduled_event_attributes.heartbeat_timeout.ToTimedelta()
                 for e in (await handle.fetch_history()).events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
    assert scheduled[f"{handle.id.rsplit('-', 1)[0]}.slow"] == timedelta(seconds=2)
    assert scheduled["durable-codemode.model_request"] == timedelta(seconds=10)


async def test_local_tools_schedule_no_heartbeat(client: Client) -> None:
    result, handle = await run(client, RunCode("await get(i=4)"), echo, local=True)
    assert "40" in result.output
    markers = [e for e in (await handle.fetch_history()).events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert markers, "the call ran as a local activity"


def test_a_heartbeat_timeout_must_be_positive() -> None:
    with pytest.raises(CodeModeUserError, match="heartbeat_timeout must be positive or None"):
        ToolOptions(heartbeat_timeout=timedelta(0))
    assert ToolOptions(heartbeat_timeout=None).heartbeat_timeout is None


async def test_replay_of_a_handle_without_run_ids_replays_the_chain(client: Client) -> None:
    # `testing.replay` once walked nothing, and passed, for a handle from `get_workflow_handle(id)`.
    from durable_codemode.testing import replay

    _, handle = await run(client, RunCode("await get(i=1)"), echo)
    replayed = await replay(client.get_workflow_handle(handle.id))
    assert len(replayed) == 1 and replayed[0].replay_failure is None
