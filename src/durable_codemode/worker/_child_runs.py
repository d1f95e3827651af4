"""Delegation to a durable sub-agent: a tool whose calls run another `CodeModeAgent` as a child run of the run.

pydantic-ai delegates from a tool: `await other.run(prompt, usage=ctx.usage)`. In a durable run that sub-agent runs
inside the tool's activity, its steps unrecorded (its usage is counted: `_tool_usage`). When the sub-agent is itself
a `CodeModeAgent` served on the run's task queue, `child_run_tool` makes a tool whose calls are child workflows
instead: the child is a run like any other (its own history, replayable, its model requests retried and its tool
calls recorded one by one), its approvals are listed with the parent's (`pending_approvals`), its output is the
call's result and its usage counts in the parent's. With `deps=`, its deps are derived from the calling run's
`RunContext` in an activity of their own (`child_deps`); it runs on a share of the parent's usage limits
(`workflow/_child_runs`). Under plain `agent.run()` the same tool delegates as pydantic-ai does.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset
from pydantic_core import to_json, to_jsonable_python

from ..shared._activity_io import ChildDeps
from ..shared._errors import CodeModeUserError
from ..shared._names import CHILD_DEPS_METADATA, CHILD_RUN_METADATA
from ._agent import CodeModeAgent

__all__ = ["ChildDepsFunction", "add_child_run_tool", "child_deps", "child_run_tool"]

ChildDepsFunction = Callable[[RunContext[Any]], Any] | Callable[[RunContext[Any]], Awaitable[Any]]
"""What a `child_run_tool(deps=...)` derives a child run's deps with: the calling run's `RunContext` (its
`ctx.deps`, `ctx.tool_call_id`, ...) to what the child records, as `start_run(deps=...)` takes them."""

_DEPS_ATTRIBUTE = "__codemode_child_deps__"
"""Where a child-run tool's function keeps its `deps` function, for the worker's child-deps activity to find."""

_JSON_TYPES = (dict, list, str, int, float, bool)


def _parts(agent: CodeModeAgent, name: str | None, description: str | None,
           deps: ChildDepsFunction | None) -> tuple[str, Callable[..., Any], dict[str, Any]]:
    """The tool's name, its function and its metadata (`child_run_tool`, `add_child_run_tool`)."""
    tool_name = name or "ask_" + re.sub(r"\W", "_", agent.name)
    if not tool_name.isidentifier():
        raise CodeModeUserError(f"child_run_tool name {tool_name!r} is not a Python identifier: programs call the "
                                "tool by its name; pass name='ask_extraction' or the like")
    if deps is not None and not callable(deps):
        raise CodeModeUserError(f"child_run_tool deps= must be a function of the calling run's RunContext giving "
                                f"the child's deps (e.g. lambda ctx: {{'tenant': ctx.deps.tenant}}), got "
                                f"{type(deps).__name__}")
    about = description or f"Ask the {agent.name} agent, which works on its own and answers with its output."

    async def run_child(ctx: RunContext[Any], prompt: str) -> Any:
        # Outside a durable run (plain `agent.run()`), pydantic-ai's own delegation, with the deps derived as a
        # durable run derives them; a durable run starts a child run instead (the tool is recorded with
        # `ToolSpec.child_run`) and never calls this.
        recorded = await _derived(deps, ctx) if deps is not None else None
        built = await agent.build_deps(to_jsonable_python(recorded) if recorded is not None else None)
        result = await agent.agent.run(prompt, usage=ctx.usage, deps=built)
        return result.output

    run_child.__annotations__["return"] = agent.output_type
    run_child.__doc__ = f"{about}\n\nArgs:\n    prompt: what to ask it, with everything it needs to know.\n"
    setattr(run_child, _DEPS_ATTRIBUTE, deps)
    metadata: dict[str, Any] = {CHILD_RUN_METADATA: agent.name}
    if deps is not None:
        metadata[CHILD_DEPS_METADATA] = True
    return tool_name, run_child, metadata


def child_run_tool(agent: CodeModeAgent, *, name: str | None = None, description: str | None = None,
                   deps: ChildDepsFunction | None = None) -> Tool[Any]:
    """A tool that asks `agent` (a `CodeModeAgent`) a question, as a child run of the run that calls it.

    Give it to the parent agent like any tool (`Agent(..., tools=[child_run_tool(extraction)])`), or add it to an
    agent that exists already (`add_child_run_tool`), and serve both agents on the same task queue
    (`create_worker(client, [search, extraction])`). The tool takes one argument, `prompt`, and returns the child's
    output (its `output_type`, as JSON in the sandbox).

    Args:
        agent: the sub-agent; its name is recorded with the parent's runs, which start it by that name.
        name: the tool's name; default `ask_<agent name>` (non-word characters as `_`: programs call it).
        description: what the parent's model reads about the tool; default: that it asks the sub-agent.
        deps: the child's deps, as a function of the calling run's `RunContext` (`ctx.deps` are the parent's):
            what it returns is what the child run records (ids and settings, as `start_run(deps=...)` takes; the
            child's own `deps_factory` builds the rest on the worker). Called on the worker, in an activity of its
            own before each child starts (`async def` awaited, a plain one run in a worker thread), so a replay
            never calls it again. `None` (the default): the child gets no deps (its own defaults apply).

    Raises:
        CodeModeUserError: the name is not a Python identifier (programs could not call it), or `deps` is not a
            function.

    """
    tool_name, function, metadata = _parts(agent, name, description, deps)
    return Tool(function, name=tool_name, description=None, takes_ctx=True, metadata=metadata)


def add_child_run_tool(parent: Agent[Any, Any] | CodeModeAgent, agent: CodeModeAgent, *, name: str | None = None,
                       description: str | None = None, deps: ChildDepsFunction | None = None) -> None:
    """Add `child_run_tool(agent, ...)` to `parent`, an agent declared already (as `@parent.tool` adds a tool).

    For when the parent is written first, as pydantic-ai's delegation examples write it. Add it before the worker
    that serves `parent` starts: a worker reads an agent's tools when it starts. The arguments are
    `child_run_tool`'s.
    """
    tool_name, function, metadata = _parts(agent, name, description, deps)
    target = parent.agent if isinstance(parent, CodeModeAgent) else parent
    target.tool(name=tool_name, metadata=metadata)(function)
    if isinstance(parent, CodeModeAgent):
        parent.forget_tools()


def _function_tools(agent: Agent[Any, Any]) -> dict[str, Tool[Any]]:
    """The function tools of `agent`'s toolsets (its own and those given to it), by name."""
    leaves: list[AbstractToolset[Any]] = []
    for toolset in agent.toolsets:
        toolset.apply(leaves.append)
    found: dict[str, Tool[Any]] = {}
    for leaf in leaves:
        if isinstance(leaf, FunctionToolset):
            found.update(leaf.tools)
    return found


async def _derived(deps: ChildDepsFunction, ctx: RunContext[Any]) -> Any:
    """What `deps(ctx)` gives: awaited when `async def`, else run in a worker thread (as a plain tool runs)."""
    if inspect.iscoroutinefunction(deps):
        return await deps(ctx)
    value = await asyncio.to_thread(deps, ctx)
    return await value if inspect.isawaitable(value) else value


async def child_deps(durable: CodeModeAgent, tool: str, ctx: RunContext[Any]) -> ChildDeps:
    """The deps of the child run a call of `durable`'s `child_run_tool` `tool` starts, as the child records them.

    Raises:
        CodeModeUserError: the tool has no `deps=` function here (the worker's agent changed since the run
            started), or what it returns cannot be recorded (not data, or over `MAX_DEPS_BYTES`).
        Exception: what the `deps=` function raised (the caller classifies it).

    """
    from ..shared._types import MAX_DEPS_BYTES

    found = _function_tools(durable.agent).get(tool)
    deps = getattr(found.function, _DEPS_ATTRIBUTE, None) if found is not None else None
    if deps is None:
        raise CodeModeUserError(
            f"tool {tool!r} of agent {durable.name!r} derived its child runs' deps when the run started "
            "(child_run_tool(deps=...)), and has no deps= function on this worker now: serve the agent as it was, "
            "or start a new run")
    value = await _derived(deps, ctx)
    try:
        data = to_jsonable_python(value)
        size = len(to_json(data))
    except Exception as e:
        raise CodeModeUserError(
            f"the deps= function of child_run_tool {tool!r} of agent {durable.name!r} returned a "
            f"{type(value).__qualname__}, which a child run cannot record ({e}): return ids and settings (a "
            "dataclass, a BaseModel, a dict), and let the child's deps_factory build the rest") from e
    if size > MAX_DEPS_BYTES:
        raise CodeModeUserError(
            f"the deps= function of child_run_tool {tool!r} of agent {durable.name!r} returned {size:,} bytes of "
            f"JSON, over {MAX_DEPS_BYTES:,}: a child run records its deps, so return ids and settings")
    kind = type(value)
    return ChildDeps(deps=data, deps_type=None if value is None or isinstance(value, _JSON_TYPES)
                     else f"{kind.__module__}.{kind.__qualname__}")
