"""How tools run: native (direct) calls, code mode off, local activities, transient retries, bad arguments."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from durable_codemode import CodeModeUserError, ToolOptions
from durable_codemode.testing import CallTool, RunCode, last_result

from ._agents import Effects
from .test_snippets import echo, run

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


def scheduled(history: Any) -> list[str]:
    return [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]


async def test_native_tools_stay_outside_the_sandbox(client: Client) -> None:
    effects = Effects()
    result, handle = await run(
        client,
        [CallTool("store", {"key": "k", "value": 3}), RunCode("await get(i=2)")],
        lambda m: repr([last_result(m, 0), last_result(m, 1)]),
        effects=effects, agent_options={"sandbox_tools": ["get", "fail", "flaky"]},
    )
    stored, snippet = eval(result.output)
    assert stored == {"k": 3}
    assert snippet == {"result": 20}
    assert [c.tool for c in result.direct_calls] == ["store"]
    assert [c.tool for c in result.nested_calls] == ["get"]
    types = scheduled(await handle.fetch_history())
    assert sorted(t for t in types if not t.startswith("durable-codemode.")) == [
        f"{handle.id.rsplit('-', 1)[0]}.get", f"{handle.id.rsplit('-', 1)[0]}.store"]


async def test_a_snippet_cannot_call_a_native_tool(client: Client) -> None:
    effects = Effects()
    result, _ = await run(client, RunCode("await store(key='x', value=1)"), echo, effects=effects,
                          agent_options={"sandbox_tools": lambda tool: tool.name != "store"})
    assert "store" in result.output and "not defined" in result.output
    assert effects.calls == []


async def test_code_mode_off_every_call_is_direct(client: Client) -> None:
    result, _ = await run(
        client,
        [CallTool("get", {"i": 1}), CallTool("get", {"i": 2})],
        CallTool("get", {"i": -1}),
        lambda m: repr(last_result(m)),
        agent_options={"code_mode": False},
    )
    assert [c.status for c in result.direct_calls] == ["ok", "ok", "error"]
    assert "KeyError: no item -1" in result.output  # a tool error comes back for the model to retry
    assert not result.nested_calls


async def test_bad_arguments_from_the_model_are_a_retry(client: Client) -> None:
    result, _ = await run(client, CallTool("get", {"i": "not a number"}), lambda m: repr(last_result(m)),
                          agent_options={"code_mode": False})
    assert "invalid arguments for get()" in result.output and "i:" in result.output


async def test_transient_failures_are_retried_within_the_policy(client: Client) -> None:
    effects = Effects()
    code = "ok = await flaky(n=2)\ntry:\n    await flaky(n=9)\nexcept RuntimeError as e:\n    err = str(e)\n[ok, err]"
    result, _ = await run(client, RunCode(code), echo, effects=effects)
    ok, err = eval(result.output)["result"]
    assert ok == 2
    assert "TransientToolError: backend busy (attempt 3)" in err  # the default policy stops after 3 attempts
    assert effects.calls == [("flaky", 1), ("flaky", 2), ("flaky", 1), ("flaky", 2), ("flaky", 3)]


async def test_local_activities(client: Client) -> None:
    code = "import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range(10)))\nsum(r)"
    result, handle = await run(client, RunCode(code), echo, local=True)
    assert eval(result.output) == {"result": 450}
    history = await handle.fetch_history()
    assert len([t for t in scheduled(history) if not t.startswith("durable-codemode.")]) == 0
    markers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert len(markers) == 10 + 1  # ten tool calls and describe_agent


def test_tool_options_are_validated_when_built() -> None:
    from datetime import timedelta

    from temporalio.common import RetryPolicy

    with pytest.raises(CodeModeUserError, match="retry forever"):
        ToolOptions(retry_policy=RetryPolicy(maximum_attempts=0))
    with pytest.raises(CodeModeUserError, match="timeout must be positive"):
        ToolOptions(timeout=timedelta(0))
