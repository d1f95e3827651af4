"""What a durable run does not apply yet is refused by name when the agent is wrapped, never silently dropped."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import Hooks

from durable_codemode import CodeModeAgent, CodeModeUserError


def test_capabilities_are_refused_by_name() -> None:
    hooks = Hooks()
    calls: list[str] = []

    @hooks.on.before_tool_execute
    async def log(ctx, *, call, tool_def, args):  # type: ignore[no-untyped-def]
        calls.append(call.tool_name)
        return args

    agent = Agent("test", name="hooked", capabilities=[hooks])
    with pytest.raises(CodeModeUserError, match=r"'hooked' declares capabilities \(Hooks\).*agent\.run\(\)"):
        CodeModeAgent(agent)


def test_output_validators_are_refused_by_name() -> None:
    agent = Agent("test", name="checked")

    @agent.output_validator
    def not_empty(text: str) -> str:
        return text

    with pytest.raises(CodeModeUserError, match=r"'checked' declares output validators \(1\)"):
        CodeModeAgent(agent)


def test_a_plain_agent_is_accepted() -> None:
    assert CodeModeAgent(Agent("test", name="plain")).name == "plain"
