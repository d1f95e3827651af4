"""The one place durable-codemode touches pydantic-ai's private names: every one of them, and why.

durable-codemode supports a range of pydantic-ai releases (`pyproject.toml`: `pydantic-ai-slim>=2.62,<3`), tested
on the oldest and the newest in CI. It uses pydantic-ai's public API everywhere it can; where pydantic-ai keeps
what a durable run needs private, the access lives here and nowhere else (`tests/test_private_names.py` fails on
any other module that reaches for a private pydantic-ai name). Each function below:

- stands in for one private name (`PRIVATE_NAMES` lists them, with the public API that would replace each);
- is pinned by its own test in `tests/test_compat.py`, which checks the shape this function relies on, so a
  release that moves one fails there, naming this function, instead of silently changing a run;
- handles the releases it knows by feature detection (what the object has), never by version strings.

Private modules are imported inside the function that needs them, so a release that drops one breaks only that
function (and its pin), not the import of the runtime.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_ai import Agent, AgentRunResult
from pydantic_ai.capabilities import AbstractCapability, CombinedCapability, Hooks
from pydantic_ai.messages import ModelMessage
from pydantic_ai.usage import RunUsage

if TYPE_CHECKING:
    from pydantic_ai import RunContext
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from pydantic_ai.run import AgentRun
    from pydantic_ai.toolsets import AbstractToolset

__all__ = [
    "PRIVATE_NAMES",
    "AgentSettings",
    "agent_run_result",
    "agent_settings",
    "instrumentation_settings",
    "output_types",
    "override_root_capability",
    "registered_hooks",
    "resolves_per_run",
    "run_capabilities",
    "start_step",
    "step_run_context",
]

PRIVATE_NAMES: dict[str, tuple[str, str]] = {
    "override_root_capability": (
        "Agent._override_root_capability (only where Agent.override takes no `capabilities`)",
        "Agent.override(capabilities=...), which newer releases have (2.78 does): used wherever it exists"),
    "start_step": (
        "AgentRun.ctx.state.run_step / .output_retries_used and AgentRun.ctx.deps.tool_manager",
        "a way to start a run at a given step with retries already used (Agent.iter(run_step=..., retries_used=...))"),
    "registered_hooks": (
        "Hooks._registry",
        "a public reader of the hooks a Hooks instance registered (Hooks.registered_hooks())"),
    "run_capabilities": (
        "pydantic_ai.agent._build_run_capabilities",
        "RunContext.capabilities as Agent.iter builds it, for a context built outside a run"),
    "instrumentation_settings": (
        "Agent._resolve_instrumentation_settings",
        "a public resolver of the instrumentation an agent's runs use (agent.instrument, else the default)"),
    "agent_run_result": (
        "pydantic_ai._agent_graph.GraphAgentState (AgentRunResult's _state)",
        "a public AgentRunResult constructor from output, messages and usage"),
    "output_types": (
        "pydantic_ai._output.types_from_output_spec",
        "a public reader of the types an output spec produces"),
    "agent_settings": (
        "Agent._max_tool_retries, ._max_output_retries, ._output_validators, ._metadata and ._concurrency_limiter",
        "public readers of what Agent(retries=, metadata=, max_concurrency=) and @agent.output_validator set"),
    "resolves_per_run": (
        "MCPToolset._resolves_per_run",
        "a public flag for an MCP toolset whose auth or headers are a function of the run"),
    "step_run_context": (
        "pydantic_ai._agent_graph.build_run_context",
        "a public RunContext of an AgentRun (AgentRun.run_context), as agent.run() hands its event_stream_handler"),
}
"""Each function of this module, with the private name it reads and the public API that would replace it."""


@functools.cache
def _override_takes_capabilities() -> bool:
    return "capabilities" in inspect.signature(Agent.override).parameters


@contextmanager
def override_root_capability(agent: Agent[Any, Any],
                             capabilities: Sequence[AbstractCapability[Any]]) -> Iterator[None]:
    """Within: `agent`'s runs in this context use `capabilities` instead of its own (the worker's probes and steps).

    The worker runs pydantic-ai's own graph for one step at a time, or to ask it what it would send, with some
    hooks masked (those that run once per durable run, elsewhere). Newer releases take the list publicly
    (`Agent.override(capabilities=...)`, 2.78); older ones (2.68) only through the override slot that
    `override(spec=...)` sets, a `ContextVar` of `Some(CombinedCapability)`. Either way the override is scoped to
    this task, so concurrent activities and `agent.run()` elsewhere in the process are untouched.
    """
    if _override_takes_capabilities():
        with agent.override(capabilities=list(capabilities)):  # type: ignore[call-arg,unused-ignore]
            yield
        return
    from pydantic_ai._utils import Some

    slot = agent._override_root_capability
    token = slot.set(Some(CombinedCapability(list(capabilities)).for_agent(agent)))  # type: ignore[arg-type,unused-ignore]
    try:
        yield
    finally:
        slot.reset(token)


def start_step(run: AgentRun[Any, Any], *, run_step: int | None = None, output_retries: int | None = None) -> None:
    """Put a one-step run of the agent graph where the durable run is: at `run_step`, with `output_retries` used.

    The model activity and the output check each run pydantic-ai's graph for one step over the run's recorded
    history; the durable run's step count (what hooks read as `ctx.run_step`) and the output retries it has used
    (validators' `ctx.retry`, and when a retry is past the budget) live in the graph's state, which a fresh run
    starts at zero. `run_step` is the step the next model request makes (the graph counts it up as it starts).
    The output retries are set on the state and, when the step has its tool manager, on each output tool's count
    (pydantic-ai counts an output tool's retries per tool too).
    """
    state = run.ctx.state
    if run_step is not None:
        state.run_step = run_step - 1
    if output_retries is not None:
        state.output_retries_used = output_retries
        manager = run.ctx.deps.tool_manager
        for name, tool in (manager.tools or {}).items():
            if tool.tool_def.kind == "output" and manager.ctx is not None:
                manager.ctx.retries[name] = output_retries


def registered_hooks(hooks: Hooks[Any]) -> set[str]:
    """The hooks a `Hooks` capability has functions registered for.

    `Hooks` overrides every hook method to dispatch to its registry, so its class tells nothing.
    """
    return {name for name, entries in hooks._registry.items() if entries}


def run_capabilities(agent: Agent[Any, Any]) -> dict[str, AbstractCapability[Any]]:
    """`ctx.capabilities` as `Agent.iter` registers them, for the contexts the worker builds outside a graph run.

    A capability's toolset (`Toolset`, a local `WebSearch`) finds its owner there when it lists its tools; each
    capability is keyed by its id, or the synthetic one pydantic-ai gives a capability without one.
    """
    from pydantic_ai.agent import _build_run_capabilities

    built: dict[str, AbstractCapability[Any]] = _build_run_capabilities(agent.root_capability)
    return built


def instrumentation_settings(agent: Agent[Any, Any]) -> InstrumentationSettings | None:
    """The instrumentation `agent.run()` would use now: `agent.instrument`, else `Agent.instrument_all()`'s.

    Logfire's `instrument_pydantic_ai()` sets the latter, usually after the agents are imported, so this is read
    at each call.
    """
    settings: InstrumentationSettings | None = agent._resolve_instrumentation_settings()
    return settings


def agent_run_result(output: Any, messages: list[ModelMessage], usage: RunUsage) -> AgentRunResult[Any]:
    """An `AgentRunResult` for a durable run's end: `after_run` hooks get one, as from `agent.run()`.

    Its `output` is the decided output, `all_messages()` the run's history and `usage` its usage.
    """
    from pydantic_ai._agent_graph import GraphAgentState

    return AgentRunResult(output=output, _state=GraphAgentState(message_history=list(messages), usage=usage))


def output_types(output_spec: Any) -> list[Any]:
    """The Python types an agent's `output_type` produces (an output function's return type, a union's members)."""
    from pydantic_ai._output import types_from_output_spec

    return list(types_from_output_spec(output_spec))


@dataclass(frozen=True)
class AgentSettings:
    """What an agent was built with that pydantic-ai keeps no public reader for."""

    tool_retries: int
    """What a tool without its own `max_retries` gets: the `ctx.max_retries` its toolset reads when listing it."""
    output_retries: int
    """The output retry budget (a model selector's `ctx.max_retries`)."""
    has_output_validators: bool
    """`@agent.output_validator`s: a text answer then needs checking (the output activity)."""
    has_metadata: bool
    """`Agent(metadata=...)`, which a durable run refuses by name (`CodeModeAgent`)."""
    has_concurrency_limit: bool
    """`Agent(max_concurrency=...)`, which a durable run refuses by name (`CodeModeAgent`): its limiter would also
    hold back the worker's probes of the agent (a run's start, an answer's check) behind a slow model request."""


def agent_settings(agent: Agent[Any, Any]) -> AgentSettings:
    """The agent's settings that `CodeModeAgent` needs and pydantic-ai does not expose (`AgentSettings`)."""
    return AgentSettings(tool_retries=agent._max_tool_retries, output_retries=agent._max_output_retries,
                         has_output_validators=bool(agent._output_validators),
                         has_metadata=agent._metadata is not None,
                         has_concurrency_limit=agent._concurrency_limiter is not None)


def resolves_per_run(toolset: AbstractToolset[Any]) -> bool:
    """Whether `toolset` is an MCP server whose auth or headers are a function of the run (refused by name)."""
    return bool(getattr(toolset, "_resolves_per_run", False))


def step_run_context(run: AgentRun[Any, Any]) -> RunContext[Any]:
    """The `RunContext` `agent.run()` hands its `event_stream_handler` with a node's events, for a model step's.

    pydantic-ai builds it from the graph's context for each node it streams; `AgentRun` offers only the graph's.
    """
    from pydantic_ai._agent_graph import build_run_context

    context: RunContext[Any] = build_run_context(run.ctx)
    return context
