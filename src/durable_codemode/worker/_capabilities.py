"""Which pydantic-ai capability hooks a durable run applies, and the tool calls that go through them.

A durable run calls each tool in its own activity, and checks each candidate answer in the output activity, both
on the worker. There pydantic-ai's own `ToolManager` and output processing dispatch a capability's tool hooks and
output hooks exactly as `agent.run()` does, with the call's `RunContext`. Every other hook belongs to pydantic-ai's
run loop (before/after a run, a node, a model request; history processing; event streams; tool preparation), which
a durable run does not drive, so a capability with one of those is refused by name, never silently dropped.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability, Hooks
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.toolsets import CombinedToolset

__all__ = ["APPLIED_HOOKS", "call_through_hooks", "extra_capabilities", "unapplied_hooks"]

TOOL_HOOKS = frozenset({
    "before_tool_validate", "after_tool_validate", "wrap_tool_validate", "on_tool_validate_error",
    "before_tool_execute", "after_tool_execute", "wrap_tool_execute", "on_tool_execute_error",
})
"""Dispatched by `ToolManager.handle_call` in each tool call's activity (sandbox and native calls alike)."""

OUTPUT_HOOKS = frozenset({
    "before_output_validate", "after_output_validate", "wrap_output_validate", "on_output_validate_error",
    "before_output_process", "after_output_process", "wrap_output_process", "on_output_process_error",
})
"""Dispatched by pydantic-ai's output processing, which the output activity runs for each candidate answer."""

APPLIED_HOOKS = TOOL_HOOKS | OUTPUT_HOOKS

_NOT_HOOKS = frozenset({
    "apply", "combine", "for_agent", "for_run", "from_spec", "get_ordering", "get_serialization_name",
    "get_description", "has_on_event", "has_resolve_model_id", "has_wrap_node_run", "has_wrap_run_event_stream",
    "listens_to", "replace_occurrence", "visit_and_replace",
})
"""Public methods of `AbstractCapability` that describe or build a capability rather than act in a run."""


@functools.cache
def _hook_names() -> frozenset[str]:
    """Every public method of `AbstractCapability` through which a capability acts in a run."""
    return frozenset(name for name, _ in inspect.getmembers(AbstractCapability, inspect.isfunction)
                     if not name.startswith("_") and name not in _NOT_HOOKS)


def _hooks_of(capability: AbstractCapability[Any]) -> set[str]:
    """The hooks `capability` acts through: a `Hooks`' registered ones, else the methods its class overrides."""
    if isinstance(capability, Hooks):
        return {name for name, entries in capability._registry.items() if entries}  # pinned by test_compat
    return {name for name in _hook_names()
            if getattr(type(capability), name, None) is not getattr(AbstractCapability, name)}


@functools.cache
def _built_in() -> frozenset[type[Any]]:
    """The capability types every pydantic-ai agent has by default (what `Agent(model)` alone carries)."""
    return frozenset(type(c) for c in _capabilities(Agent("test")))


def _capabilities(agent: Agent[Any, Any]) -> list[AbstractCapability[Any]]:
    root = agent.root_capability
    return list(getattr(root, "capabilities", [root]))


def extra_capabilities(agent: Agent[Any, Any]) -> list[AbstractCapability[Any]]:
    """The capabilities `agent` was given, beyond the ones every agent has."""
    return [c for c in _capabilities(agent) if type(c) not in _built_in()]


def unapplied_hooks(agent: Agent[Any, Any]) -> list[str]:
    """`Type: hook, hook` for each capability of `agent` with hooks a durable run would not call."""
    found = []
    for capability in extra_capabilities(agent):
        missing = sorted(_hooks_of(capability) - APPLIED_HOOKS)
        if missing:
            found.append(f"{type(capability).__name__}: {', '.join(missing)}")
    return found


async def call_through_hooks(agent: Agent[Any, Any], ctx: RunContext[Any], tool_name: str,
                             args: dict[str, Any]) -> Any:
    """Call `tool_name` as `agent.run()` would from a tool call part: validated, with every tool hook around it.

    The durable run has already decided the call may run (an approval, if it needed one, was given in workflow
    code), so it goes in approved. Validation errors and `ModelRetry` propagate raw, for the activity to classify.
    """
    root = await agent.root_capability.for_run(ctx)
    manager = await ToolManager(toolset=CombinedToolset(agent.toolsets), root_capability=root).for_run_step(ctx)
    return await manager.handle_call(ToolCallPart(tool_name, args, tool_call_id=ctx.tool_call_id or ""),
                                     approved=True, wrap_validation_errors=False)
