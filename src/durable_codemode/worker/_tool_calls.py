"""A tool activity's body: one tool call of a run, validated and run as `agent.run()` would run it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic_ai.usage import RunUsage

from ..shared._results import jsonable
from ._capabilities import call_through_hooks, instrumentation_of, instrumented_context
from ._mcp import mcp_toolsets, reconnect_lost, schema_digest

if TYPE_CHECKING:
    from ._agent import CodeModeAgent
    from ._deps import CallDeps

__all__ = ["call_tool"]


async def call_tool(durable: CodeModeAgent, tool_name: str, args: dict[str, Any], *, call_id: str, attempt: int,
                    deps: CallDeps, recorded_schema: str | None = None, usage: RunUsage | None = None) -> Any:
    """Validate `args` and run the tool; its exceptions propagate unchanged (the caller classifies them).

    With capability tool hooks (or instrumentation) the call goes through pydantic-ai's `ToolManager`, hooks and
    spans around it; otherwise straight to the tool's toolset. `deps`: the run's, built once per activity
    (`CodeModeAgent.deps_for_calls`). `recorded_schema`: the MCP tool's `schema_digest`
    as the run recorded it, when it did. `usage`: the tool's `ctx.usage`, which holds afterwards what the tool
    added (a sub-agent run with `usage=ctx.usage`), for the run to count (`_tool_usage`); pydantic-ai's own count
    of this call is left out, the run counted it.

    Raises:
        KeyError: the agent has no tool called `tool_name`.
        TypeError: an MCP tool's schemas are not the ones the run recorded (the call is not made).
        ValueError: the arguments do not match the tool's schema (a pydantic `ValidationError`).

    """
    agent, name = durable.agent, durable.name
    run_deps = deps.value
    try:
        tools = await durable.tools(durable.run_context(deps=run_deps)) if deps.own else await durable.tools()
    except Exception as e:
        reconnect_lost(agent.toolsets, e, subject=f"the tools of agent {name!r}")
        raise
    if tool_name not in tools:
        if mcp_toolsets(agent.toolsets):
            raise KeyError(
                f"agent {name!r} has no tool {tool_name!r} now, though it had when the run started: the tool list "
                f"of its MCP servers changed since (its tools now: {sorted(tools)}). Runs started from now on see "
                "the new list; this run's programs were checked against the old one")
        raise KeyError(f"agent {name!r} has no tool {tool_name!r}")
    toolset, tool = tools[tool_name]
    if recorded_schema is not None and schema_digest(tool.tool_def) != recorded_schema:
        raise TypeError(
            f"MCP tool {tool_name!r} of agent {name!r} changed since the run started: its server now describes "
            "other arguments or another result than the stub this run's programs were checked against, so the "
            "call was not made. Runs started from now on see the new schema; start a new run to use it")
    ctx = durable.run_context(tool_name=tool_name, call_id=call_id, attempt=attempt, max_retries=tool.max_retries,
                              deps=run_deps, usage=usage)
    instrumentation = instrumentation_of(agent)
    try:
        if durable.capability_use.tool_hooks or instrumentation is not None:
            ctx = instrumented_context(ctx, instrumentation)
            result = jsonable(await call_through_hooks(agent, ctx, tool_name, args))
            if usage is not None and usage.tool_calls:  # pydantic-ai's ToolManager counted this call itself
                usage.tool_calls -= 1
            return result
        validated = tool.args_validator.validate_python(args, context=ctx.validation_context)
        return jsonable(await toolset.call_tool(tool_name, validated, ctx, tool))
    except Exception as e:
        reconnect_lost([tool.toolset], e, subject=f"{tool_name}() of agent {name!r}")
        raise
