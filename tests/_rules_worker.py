"""A worker module for `codemode replay --worker tests._rules_worker`: refunds over $100 wait for a person.

Approval rules are code, not recorded data, so a replay of this agent's runs needs this module imported.
"""

from __future__ import annotations

from pydantic_ai import Agent

from durable_codemode import CodeModeAgent, ToolOptions
from durable_codemode.testing import RunCode, last_result, scripted_model

NAME = "dbg-rules"

CODE = "import asyncio\nawait asyncio.gather(*(refund(order=o, cents=c) for o, c in [('S', 500), ('L', 50000)]))"


def rules_agent() -> CodeModeAgent:
    """The agent; its rule gates only refunds over 10,000 cents."""
    agent = Agent(scripted_model(RunCode(CODE), lambda m: repr(last_result(m))), name=NAME)

    @agent.tool_plain
    def refund(order: str, cents: int) -> str:
        """Refund an order."""
        return f"refunded {order}"

    return CodeModeAgent(agent, tool_options={"refund": ToolOptions(approval_rule=lambda a: a["cents"] > 10_000)})


def agents() -> list[CodeModeAgent]:
    """What `--worker` registers."""
    return [rules_agent()]
