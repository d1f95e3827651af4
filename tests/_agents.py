"""Small agents for the runtime tests, each a few tools with side effects the tests can count."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent

from durable_codemode import CodeModeAgent, SnippetLimits, ToolOptions, TransientToolError, current_call
from durable_codemode.testing import scripted_model


@dataclass
class Effects:
    """What the tools did, keyed by idempotency key, so a test can assert 'exactly once'."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    keys: Counter[str] = field(default_factory=Counter)

    def record(self, tool: str, arg: Any) -> None:
        self.calls.append((tool, arg))
        self.keys[current_call().idempotency_key] += 1

    @property
    def duplicates(self) -> int:
        return sum(1 for n in self.keys.values() if n > 1)


def items_agent(name: str, *steps: Any, effects: Effects | None = None, limits: SnippetLimits | None = None,
                env_allowlist: tuple[str, ...] = (), agent_options: dict[str, Any] | None = None,
                **options: Any) -> CodeModeAgent:
    """An agent with `get(i)`, `flaky(n)`, `fail(kind)` and `store(key, value)` tools and a scripted model."""
    fx = effects if effects is not None else Effects()
    agent = Agent(scripted_model(*steps), name=name, instructions="Use run_code.")
    data: dict[str, Any] = {}

    @agent.tool_plain
    def get(i: int) -> int:
        """The value of item `i` (ten times i); unknown (negative) items raise KeyError."""
        fx.record("get", i)
        if i < 0:
            raise KeyError(f"no item {i}")
        return i * 10

    @agent.tool_plain
    def fail(kind: str) -> None:
        """Raise the named error."""
        fx.record("fail", kind)
        errors: dict[str, Exception] = {"value": ValueError("bad value"), "permission": PermissionError("nope"),
                                        "custom": _CustomError("custom trouble")}
        raise errors[kind]

    @agent.tool_plain
    def store(key: str, value: int) -> dict[str, int]:
        """Store a value and return everything stored."""
        fx.record("store", (key, value))
        data[key] = value
        return dict(data)

    @agent.tool_plain
    async def slow(seconds: float) -> str:
        """Answer after `seconds`."""
        fx.record("slow", seconds)
        await asyncio.sleep(seconds)
        return "slow done"

    attempts: Counter[str] = Counter()

    @agent.tool_plain
    def flaky(n: int) -> int:
        """Fails transiently until its n-th attempt, then returns the attempt number."""
        call = current_call()
        attempts[call.idempotency_key] += 1
        fx.calls.append(("flaky", call.attempt))
        if call.attempt < n:
            raise TransientToolError(f"backend busy (attempt {call.attempt})")
        return call.attempt

    return CodeModeAgent(agent, limits=limits, env_allowlist=env_allowlist,
                         default_tool_options=ToolOptions(**options) if options else None, **(agent_options or {}))


class _CustomError(Exception):
    pass
