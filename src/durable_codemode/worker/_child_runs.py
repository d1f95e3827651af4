"""Delegation to a durable sub-agent: a tool whose calls run another `CodeModeAgent` as a child run of the run.

pydantic-ai delegates from a tool: `await other.run(prompt, usage=ctx.usage)`. In a durable run that sub-agent runs
inside the tool's activity, its steps unrecorded (its usage is counted: `_tool_usage`). When the sub-agent is itself
a `CodeModeAgent` served on the run's task queue, `child_run_tool` makes a tool whose calls are child workflows
instead: the child is a run like any other (its own history, replayable, its model requests retried and its tool
calls recorded one by one), its approvals are listed by the parent's `pending_approvals`, its output is the call's
result and its usage counts in the parent's. Under plain `agent.run()` the same tool delegates as pydantic-ai does.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_ai import RunContext, Tool

from .._errors import CodeModeUserError
from .._names import CHILD_RUN_METADATA
from ._agent import CodeModeAgent

__all__ = ["child_run_tool"]


def child_run_tool(agent: CodeModeAgent, *, name: str | None = None, description: str | None = None) -> Tool[Any]:
    """A tool that asks `agent` (a `CodeModeAgent`) a question, as a child run of the run that calls it.

    Give it to the parent agent like any tool (`Agent(..., tools=[child_run_tool(extraction)])`) and serve both
    agents on the same task queue (`create_worker(client, [search, extraction])`). The tool takes one argument,
    `prompt`, and returns the child's output (its `output_type`, as JSON in the sandbox).

    Args:
        agent: the sub-agent; its name is recorded with the parent's runs, which start it by that name.
        name: the tool's name; default `ask_<agent name>` (non-word characters as `_`: programs call it).
        description: what the parent's model reads about the tool; default: that it asks the sub-agent.

    Raises:
        CodeModeUserError: the name is not a Python identifier (programs could not call it).

    """
    tool_name = name or "ask_" + re.sub(r"\W", "_", agent.name)
    if not tool_name.isidentifier():
        raise CodeModeUserError(f"child_run_tool name {tool_name!r} is not a Python identifier: programs call the "
                                "tool by its name; pass name='ask_extraction' or the like")
    about = description or f"Ask the {agent.name} agent, which works on its own and answers with its output."

    async def run_child(ctx: RunContext[Any], prompt: str) -> Any:
        # Outside a durable run (plain `agent.run()`), pydantic-ai's own delegation; a durable run starts a child
        # run instead (the tool is recorded with `ToolSpec.child_run`) and never calls this.
        result = await agent.agent.run(prompt, usage=ctx.usage)
        return result.output

    run_child.__annotations__["return"] = agent.output_type
    run_child.__doc__ = f"{about}\n\nArgs:\n    prompt: what to ask it, with everything it needs to know.\n"
    return Tool(run_child, name=tool_name, description=None, takes_ctx=True,
                metadata={CHILD_RUN_METADATA: agent.name})
