"""Which pydantic-ai capability hooks a durable run applies, where, and the tool calls and run hooks through them.

A durable run calls each tool in its own activity, asks the model in the model activity, and checks each candidate
answer in the output activity, all on the worker. There:
- pydantic-ai's own `ToolManager` and output processing dispatch a capability's tool hooks and output hooks exactly
  as `agent.run()` does, with the call's `RunContext`;
- the model activity makes each model request through pydantic-ai's own agent graph, for one step
  (`_model_step`): the model-request hooks, `compact_history`, the attempt loop `ModelFallback` drives and a
  capability's model wrapper all run as in `agent.run()`, and `ProcessHistory`'s rewritten history is adopted by
  the run;
- a capability's model settings (`Thinking`) are layered into every request's (by that step), and its
  instructions are resolved with the agent's when the run starts (`before_run` runs then too, in describe);
- pydantic-ai's `Instrumentation` (an agent's own, or the one `agent.instrument` / `Agent.instrument_all()` inject,
  which is how Logfire's `instrument_pydantic_ai()` switches it on) makes its model-request, tool and
  output-function spans in the activities that do that work. It is the worker's concern, not the run's: it is read
  at every call (instrumentation is often switched on after the agents are built) and never changes what a run
  records. Its agent-run span (`wrap_run`) is not made: a durable run outlives any one worker, and its span is the
  workflow's (`create_worker(tracing=True)`), under which the activities' spans, and so these, hang.

The rest belongs to pydantic-ai's run loop, which a durable run does not drive (`REFUSED_HOOKS` says why for each);
a capability with one of those is refused by name, never silently dropped.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pydantic_ai.capabilities
from pydantic_ai import Agent, AgentRunResult, RunContext
from pydantic_ai.capabilities import (
    AbstractCapability,
    CombinedCapability,
    Hooks,
    Instrumentation,
    ToolSearch,
    WrapperCapability,
)
from pydantic_ai.capabilities.abstract import ModelSelector, WrapModelRequestHandler, WrapRunHandler
from pydantic_ai.messages import AgentStreamEvent, ModelResponse, ToolCallPart
from pydantic_ai.models import Model, ModelRequestContext
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, CombinedToolset

from .._pydantic_ai import instrumentation_settings, override_root_capability, registered_hooks, run_capabilities

__all__ = [
    "APPLIED_HOOKS",
    "EVENT_STREAM_HOOKS",
    "REFUSED_HOOKS",
    "CapabilityUse",
    "RunHooksMasked",
    "call_through_hooks",
    "extra_capabilities",
    "fallback_model_names",
    "has_model_request_hooks",
    "instrumentation_of",
    "instrumented_context",
    "model_selector",
    "probing",
    "registered_capabilities",
    "run_after_run",
    "run_before_run",
    "run_on_run_error",
    "run_toolset",
    "unapplied_hooks",
    "unsupported_model_wrappers",
    "unsupported_tool_search",
    "wraps_toolsets",
]

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

MODEL_REQUEST_HOOKS = frozenset({
    "before_model_request", "prepare_model_request", "after_model_request", "wrap_model_request",
    "on_model_request_error", "compact_history",
})
"""Dispatched by pydantic-ai's graph in the model activity (`_model_step`), around each request's model call.
(`compact_history` is new after 2.68, in 2.78; where it does not exist, no capability has it.)"""

RUN_HOOKS = frozenset({"before_run", "after_run", "wrap_run", "on_run_error"})
"""Of these, `before_run` is called once per run, in the describe activity (`run_before_run`), `after_run` once
its output is decided, in the after-run activity (`run_after_run`), and `on_run_error` if its body fails, in the
run-error activity (`run_on_run_error`)."""

EVENT_STREAM_HOOKS = frozenset({"on_event", "wrap_run_event_stream"})
"""Applied by pydantic-ai's graph to the model step's event stream, in the model activity: the model's parts and
deltas (pydantic-ai streams the request for them, as in `agent.run()`, so the model must stream). A durable run's
tool events (`FunctionToolCallEvent`, a program's nested calls) are published by its workflow, so they do not pass
through these hooks; `durable_codemode.stream_events` delivers them."""

APPLIED_HOOKS = TOOL_HOOKS | OUTPUT_HOOKS | MODEL_REQUEST_HOOKS | EVENT_STREAM_HOOKS | {
    "before_run", "after_run", "on_run_error", "get_model_settings", "get_instructions", "get_toolset",
    "get_wrapper_toolset", "prepare_tools", "prepare_output_tools", "get_wrapper_model"}
"""`get_model_settings` (`Thinking`): its settings go between the agent's and the run's, in the model activity.
`get_wrapper_model` (a model wrapper; `ModelFallback` acts through it in 2.78): the model step's model is wrapped, as
in `agent.run()` (but `BatchModelRequests`, refused by name: `unsupported_model_wrappers`).
`get_instructions`: resolved with the agent's own instructions when the run starts (describe), and recorded.
`prepare_tools` / `prepare_output_tools`: called once, when the run starts (describe), with the run's prompt and
deps, as a tool's own `prepare` is: the tools they leave (and their definitions as they changed them) are the ones
the run records, offers and checks programs against. A run's tools are fixed from its start, so they are not
called again at later steps.
`get_wrapper_toolset` (`SetToolMetadata`, `IncludeToolReturnSchemas`): the run's tools are read through the wrapped
toolset when it starts, and each call goes through it in its activity (`run_toolset`)."""


_OUR_LOOP = "a durable run's loop is its workflow, not pydantic-ai's agent graph"
REFUSED_HOOKS: dict[str, str] = {
    "wrap_run": f"{_OUR_LOOP}: nothing on one worker spans a run that may outlive it (continue-as-new, approvals)",
    "before_node_run": f"{_OUR_LOOP}: there are no graph nodes to observe",
    "after_node_run": f"{_OUR_LOOP}: there are no graph nodes to observe",
    "wrap_node_run": f"{_OUR_LOOP}: there are no graph nodes to wrap or redirect",
    "on_node_run_error": f"{_OUR_LOOP}: there are no graph nodes to recover",
    "get_toolset": "a run's tools are the agent's toolsets, recorded when it starts",
    "prefix_tools": "a run's tools are the agent's toolsets, recorded when it starts",
    "get_native_tools": "a provider tool with a local fallback (NativeOrLocalTool): which of the two a request "
                        "uses depends on its model, while a run's sandbox tools are fixed when it starts; give "
                        "native=False (the local tool) or local=False (the provider's)",
    "get_model": "a durable run's model is the agent's, start_run(model=...)'s, or one a selector picks for each "
                 "step (SelectModel): a capability that is the model itself is not applied; give the agent a model "
                 "of its own (ModelFallback then falls back from it)",
    "resolve_model_id": "the run's model is the agent's or start_run(model=...)",
    "handle_deferred_tool_calls": "a durable run pauses a call for approval itself (ToolOptions(requires_approval))",
    "get_default_run_id": "a durable run's id is its workflow id",
    "get_default_conversation_id": "a durable run's id is its workflow id",
    "get_run_clock": "a durable run's clock is its workflow's (workflow.now())",
    "get_run_start_time": "a durable run's clock is its workflow's (workflow.now())",
    "get_workspace": "a durable run has no pydantic-ai workspace (give programs files: CodeModeAgent(files=...))",
}
"""Hooks a durable run does not call, each with the reason (the refusal at `CodeModeAgent(...)` quotes it)."""

_NOT_HOOKS = frozenset({
    "apply", "combine", "for_agent", "for_run", "from_spec", "get_ordering", "get_serialization_name",
    "get_description", "has_on_event", "has_resolve_model_id", "has_wrap_node_run", "has_wrap_run_event_stream",
    "listens_to", "replace_occurrence", "visit_and_replace", "with_authority",
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
        return registered_hooks(capability)
    if isinstance(capability, WrapperCapability):  # e.g. `PrefixTools`: what it adds, and what it wraps does
        return {name for name in _hook_names()
                if getattr(type(capability), name, None) not in (getattr(AbstractCapability, name),
                                                                 getattr(WrapperCapability, name, None))
                } | _hooks_of(capability.wrapped)
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
    """The capabilities `agent` was given, beyond the ones every agent has and its `Instrumentation`.

    `Instrumentation` is left out because it belongs to the worker, not to the run (`instrumentation_of`): whether
    a worker traces must not change what a run records (`AgentSpec`'s hook flags are computed from these).
    """
    return [c for c in _capabilities(agent) if type(c) not in _built_in() and type(c) is not Instrumentation]


def instrumentation_of(agent: Agent[Any, Any]) -> Instrumentation | None:
    """The `Instrumentation` that `agent.run()` would apply now: the agent's own, else the injected one, else none.

    As `Agent.iter` resolves it: an explicit capability wins, else `agent.instrument`, else
    `Agent.instrument_all()`'s default (what Logfire's `instrument_pydantic_ai()` sets). Read at each call, not
    when the `CodeModeAgent` is built, since instrumentation is usually switched on at process start, after the
    agents are imported.
    """
    for capability in _capabilities(agent):
        if type(capability) is Instrumentation:  # a subclass may add hooks: it stays in `extra_capabilities`
            return capability
    settings = instrumentation_settings(agent)
    return None if settings is None else Instrumentation(settings=settings)


def registered_capabilities(agent: Agent[Any, Any]) -> dict[str, AbstractCapability[Any]]:
    """`ctx.capabilities` as `Agent.iter` registers them: every capability of the agent under its id.

    A capability's toolset (`Toolset`, a local `WebSearch`, ...) finds its owner there when it lists its tools.
    """
    return run_capabilities(agent)


def instrumented_context(ctx: RunContext[Any], instrumentation: Instrumentation | None) -> RunContext[Any]:
    """`ctx` with the tracer and content flag pydantic-ai gives an instrumented run's context.

    As `Agent.iter` sets them (`_set_run_context_instrumentation`), so tools and hooks that trace through
    `ctx.tracer` do.
    """
    if instrumentation is None:
        return ctx
    settings = instrumentation.settings
    return replace(ctx, tracer=settings.tracer, trace_include_content=settings.include_content,
                   instrumentation_version=settings.version)


def unapplied_hooks(agent: Agent[Any, Any]) -> list[str]:
    """`Type.hook (why)` for each hook of a capability of `agent` that a durable run would not call.

    `get_model` counts only when it contributes a model: `ModelFallback` on an agent with a model of its own
    contributes none (it falls back from the agent's), and works; on an agent without one it would be the model.
    """
    return [f"{type(capability).__name__}.{hook} ({REFUSED_HOOKS.get(hook, _OUR_LOOP)})"
            for capability in extra_capabilities(agent)
            for hook in sorted(_hooks_of(capability) - APPLIED_HOOKS)
            if _contributes(capability, hook)]


def unsupported_tool_search(agent: Agent[Any, Any]) -> list[str]:
    """What of pydantic-ai's tool search `agent` asks for that a durable run does not do, by name.

    A deferred tool (`defer_loading=True`) is found by programs in the sandbox, with `search_tools` over the run's
    recorded catalog of them; pydantic-ai's `ToolSearch` does not run. So a `ToolSearch` configured otherwise than
    the one every agent has (a strategy, a search function, its own descriptions) would be ignored, and a
    capability loaded on demand (`defer_loading=True` on the capability, `load_capability`) would never load: a
    run's tools are fixed when it starts.
    """
    found = []
    for capability in _capabilities(agent):
        if isinstance(capability, ToolSearch) and capability != ToolSearch():
            found.append(f"{capability!r} (a durable run's programs find deferred tools with search_tools in the "
                         "sandbox, over the run's recorded catalog: drop the ToolSearch, or give ToolSearch() "
                         "with no settings)")
        if capability.defer_loading is True:
            found.append(f"{type(capability).__name__}(defer_loading=True) (a durable run's tools are fixed when it "
                         "starts, so a capability loaded on demand never would be: drop defer_loading=True and its "
                         "tools are the run's from its start)")
    return found


def unsupported_model_wrappers(agent: Agent[Any, Any]) -> list[str]:
    """The model wrappers of `agent` a durable run refuses by name (other `get_wrapper_model`s are applied).

    `BatchModelRequests` sends each request through its provider's batch API, where a result can take up to a day:
    far past a model activity's timeout, and a durable run's requests are each their own activity anyway.
    """
    return [f"{type(capability).__name__} (a batched request can wait up to a day for its provider's batch, far "
            "past a model activity's 5-minute timeout; a durable run makes each request in an activity of its own: "
            "drop it, or run the agent with agent.run())"
            for capability in extra_capabilities(agent) if type(capability).__name__ == "BatchModelRequests"]


def _contributes(capability: AbstractCapability[Any], hook: str) -> bool:
    """Whether `capability`'s override of `hook` gives the run something (else it is harmless to leave uncalled)."""
    if hook == "get_model":  # a per-step selector (`SelectModel`) is applied in the model activity (`model_selector`)
        contribution = capability.get_model()
        return contribution is not None and not _is_selector(contribution)
    if hook == "get_native_tools":  # the provider's tools alone are sent with every request (`AgentSpec`)
        return bool(capability.get_native_tools()) and capability.get_toolset() is not None
    return True


_MODEL_FALLBACK: type[AbstractCapability[Any]] | None = getattr(pydantic_ai.capabilities, "ModelFallback", None)
"""pydantic-ai's `ModelFallback` capability, or None on a release without it (before 2.68): no agent holds one there."""


def fallback_model_names(agent: Agent[Any, Any]) -> list[str]:
    """The models given by name to `agent`'s `ModelFallback` capabilities (the worker checks they can be built)."""
    if _MODEL_FALLBACK is None:
        return []
    return [model for capability in extra_capabilities(agent) if isinstance(capability, _MODEL_FALLBACK)
            for model in getattr(capability, "models", ()) if isinstance(model, str)]


@dataclass(frozen=True)
class CapabilityUse:
    """Where `agent`'s own capabilities act in a durable run, read once when its `CodeModeAgent` is built."""

    tool_hooks: bool
    """Tool calls go through pydantic-ai's `ToolManager` (any capability of its own may have tool hooks)."""
    model_request_hooks: bool
    """Model requests tell the hooks the run's step and usage, and may retry or rewrite (`AgentSpec`)."""
    model_selector: ModelSelector[Any] | None
    """The per-step model selector (`SelectModel`), if any."""
    after_run_hooks: bool
    run_error_hooks: bool
    prepares_tools: bool
    """`prepare_tools` hooks: the run takes the tools they leave, at its start."""
    wraps_toolsets: bool
    """A capability wraps the agent's toolsets (the run's tools are read, and called, through the wrapper)."""

    @classmethod
    def of(cls, agent: Agent[Any, Any]) -> CapabilityUse:
        return cls(tool_hooks=bool(extra_capabilities(agent)), model_request_hooks=has_model_request_hooks(agent),
                   model_selector=model_selector(agent), after_run_hooks=_has_hook(agent, "after_run"),
                   run_error_hooks=_has_hook(agent, "on_run_error"), prepares_tools=_has_hook(agent, "prepare_tools"),
                   wraps_toolsets=wraps_toolsets(agent))


def has_model_request_hooks(agent: Agent[Any, Any]) -> bool:
    """Whether a capability of `agent` acts around its model requests (so the model activity runs its hooks).

    A model selector (`SelectModel`) counts: it picks each step's model in the model activity.
    """
    return model_selector(agent) is not None or any(
        _hooks_of(capability) & MODEL_REQUEST_HOOKS for capability in extra_capabilities(agent))


def _is_selector(contribution: Any) -> bool:
    """Whether a capability's `get_model()` is a per-step selector (a callable), not a model or a model's name."""
    return callable(contribution) and not isinstance(contribution, Model)


def model_selector(agent: Agent[Any, Any]) -> ModelSelector[Any] | None:
    """The selector that picks the model of each of `agent`'s request steps (`SelectModel`), if it has one.

    As `Agent.iter` reads it: the capabilities' combined `get_model()` (the last one given wins), when callable.
    """
    contribution = CombinedCapability(extra_capabilities(agent)).get_model()
    return contribution if _is_selector(contribution) else None  # type: ignore[return-value]


def _has_hook(agent: Agent[Any, Any], hook: str) -> bool:
    """Whether one of `agent`'s own capabilities acts through `hook`."""
    return any(hook in _hooks_of(capability) for capability in extra_capabilities(agent))


class RunHooksMasked(WrapperCapability[Any]):
    """A capability with its once-per-run hooks masked: `before_run`, `after_run`, `wrap_run`, `on_run_error`.

    For the pydantic-ai runs the worker makes that are not the user's run: its probes (`_Quiet`) and a model
    request's one-step run (`_model_step`). Those hooks run once, where the durable run has them (the describe,
    after-run and run-error activities). Every other hook is the wrapped capability's unless a subclass masks it.
    """

    async def before_run(self, ctx: RunContext[Any]) -> None:
        return None

    async def after_run(self, ctx: RunContext[Any], *, result: Any) -> Any:
        return result

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> Any:
        return await handler()

    async def on_run_error(self, ctx: RunContext[Any], *, error: BaseException) -> Any:
        raise error


class _Quiet(RunHooksMasked):
    """A capability with its run and model-request hooks masked, for the worker's probing runs.

    Those runs (describe, the output check) are pydantic-ai runs on a `FunctionModel` that ask what it would send,
    or check a response the model already gave. The masked hooks ran once where they belong (`before_run` in
    describe, the model-request and event-stream hooks in the model activity) and must not run, rewrite the history,
    or see a probe's answer again. Every other hook (instructions, output hooks) is the wrapped capability's.
    """

    async def before_model_request(self, ctx: RunContext[Any],
                                   request_context: ModelRequestContext) -> ModelRequestContext:
        return request_context

    async def prepare_model_request(self, ctx: RunContext[Any],
                                    request_context: ModelRequestContext) -> ModelRequestContext:
        return request_context

    async def after_model_request(self, ctx: RunContext[Any], *, request_context: ModelRequestContext,
                                  response: ModelResponse) -> ModelResponse:
        return response

    async def wrap_model_request(self, ctx: RunContext[Any], *, request_context: ModelRequestContext,
                                 handler: WrapModelRequestHandler) -> ModelResponse:
        return await handler(request_context)

    # Event-stream hooks: a probe's events are not the run's (they fire on the model step's, `EVENT_STREAM_HOOKS`),
    # and a capability that listens would make pydantic-ai stream the probe's `FunctionModel`, which cannot.

    @property
    def has_on_event(self) -> bool:
        return False

    @property
    def has_wrap_run_event_stream(self) -> bool:
        return False

    def listens_to(self, event: AgentStreamEvent) -> bool:
        return False

    async def on_event(self, ctx: RunContext[Any], *, event: AgentStreamEvent) -> None:
        return None

    async def wrap_run_event_stream(self, ctx: RunContext[Any], *,
                                    stream: AsyncIterable[AgentStreamEvent]) -> AsyncIterable[AgentStreamEvent]:
        async for event in stream:
            yield event

    async def on_model_request_error(self, ctx: RunContext[Any], *, request_context: ModelRequestContext,
                                     error: Exception) -> ModelResponse:
        raise error

    def get_wrapper_model(self, model: Model) -> Model | None:
        return None  # a probe's model is the worker's: a fallback chain around it would catch the probe's end

    async def compact_history(self, ctx: RunContext[Any], request: Any) -> Any:
        return None  # a hook after 2.68 (2.78): a probe compacts nothing (the model step does, for the run)


class _QuietInstrumentation(Instrumentation):
    """`Instrumentation` without its run and model-request spans, for the worker's probing runs.

    A probe is not a run of the user's and its model is the worker's `FunctionModel`: an "agent run" span and a
    "chat function" span for it would be noise beside the real request's span from the model activity. The
    output-function span stays, since the output check is where an output function runs.
    """

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> Any:
        return await handler()

    async def wrap_model_request(self, ctx: RunContext[Any], *, request_context: ModelRequestContext,
                                 handler: WrapModelRequestHandler) -> ModelResponse:
        return await handler(request_context)


class _Prepared(_Quiet):
    """`_Quiet`, and its tool preparation masked too: for the output check (the run's tools were prepared once)."""

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        return tool_defs

    async def prepare_output_tools(self, ctx: RunContext[Any],
                                   tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        return tool_defs


_MASKED = RUN_HOOKS | MODEL_REQUEST_HOOKS | EVENT_STREAM_HOOKS
_PREPARE_HOOKS = frozenset({"prepare_tools", "prepare_output_tools"})


@contextmanager
def probing(agent: Agent[Any, Any], *, preparing: bool = False) -> Iterator[None]:
    """Within: `agent`'s runs (in this task) call none of its run or model-request hooks, and make no such spans.

    The hooks are masked by `_Quiet`, the spans by `_QuietInstrumentation` (which also stops pydantic-ai injecting
    its own `Instrumentation`). `preparing`: the probe is the run's start, where its tools are prepared (describe);
    otherwise `prepare_tools` / `prepare_output_tools` are masked as well (`_Prepared`).

    The override is scoped to this task (`override_root_capability`), so concurrent activities on the worker, and
    `agent.run()` elsewhere in the process, are untouched.
    """
    masking = _MASKED if preparing else _MASKED | _PREPARE_HOOKS
    mask = _Quiet if preparing else _Prepared
    masked = [c for c in extra_capabilities(agent) if _hooks_of(c) & masking]
    instrumentation = instrumentation_of(agent)
    if not masked and instrumentation is None:
        yield
        return
    layers: list[AbstractCapability[Any]] = [
        mask(c) if c in masked else c for c in _capabilities(agent) if type(c) is not Instrumentation]
    if instrumentation is not None:
        layers.insert(0, _QuietInstrumentation(settings=instrumentation.settings))
    with override_root_capability(agent, layers):
        yield


async def run_before_run(agent: Agent[Any, Any], ctx: RunContext[Any]) -> None:
    """Call the capabilities' `before_run` hooks once, at the start of a durable run (in describe)."""
    if _has_hook(agent, "before_run"):
        await (await _own(agent).for_run(ctx)).before_run(ctx)


async def run_after_run(agent: Agent[Any, Any], ctx: RunContext[Any], result: AgentRunResult[Any]) -> Any:
    """Call the capabilities' `after_run` hooks on a run's result, as `agent.run()` does; the output they return."""
    return (await (await _own(agent).for_run(ctx)).after_run(ctx, result=result)).output


async def run_on_run_error(agent: Agent[Any, Any], ctx: RunContext[Any], error: BaseException) -> Any:
    """Call the capabilities' `on_run_error` hooks on a run's failure, as `agent.run()` does; the recovered output.

    What they raise propagates (the error itself, to let the run fail); a result they return recovers the run.
    """
    return (await (await _own(agent).for_run(ctx)).on_run_error(ctx, error=error)).output


def _own(agent: Agent[Any, Any]) -> CombinedCapability[Any]:
    """The capabilities `agent` was given, chained by pydantic-ai, its `Instrumentation` (if any now) outermost.

    Its own ones (what every agent has) serve its agent graph's state; `Agent.iter` puts `Instrumentation` first.
    """
    instrumentation = instrumentation_of(agent)
    return CombinedCapability([*([instrumentation] if instrumentation else []), *extra_capabilities(agent)])


def wraps_toolsets(agent: Agent[Any, Any]) -> bool:
    """Whether a capability of `agent` wraps its toolsets (`SetToolMetadata`, `IncludeToolReturnSchemas`, ...)."""
    return _has_hook(agent, "get_wrapper_toolset")


async def run_toolset(agent: Agent[Any, Any], ctx: RunContext[Any]) -> AbstractToolset[Any]:
    """`agent`'s tools as `Agent.iter` assembles them for a run: dynamic toolsets built, capability wrappers on.

    The wrappers are its own capabilities' (`get_wrapper_toolset`, the last one outermost, as pydantic-ai chains
    them); the ones every agent has are left out, as everywhere a durable run reads the capabilities.
    """
    toolset: AbstractToolset[Any] = await CombinedToolset(agent.toolsets).for_run(ctx)
    if wraps_toolsets(agent):
        toolset = CombinedCapability(extra_capabilities(agent)).get_wrapper_toolset(toolset) or toolset
    return toolset


async def call_through_hooks(agent: Agent[Any, Any], ctx: RunContext[Any], tool_name: str,
                             args: dict[str, Any]) -> Any:
    """Call `tool_name` as `agent.run()` would from a tool call part: validated, with every tool hook around it.

    The durable run has already decided the call may run (an approval, if it needed one, was given in workflow
    code), so it goes in approved. Validation errors and `ModelRetry` propagate raw, for the activity to classify.
    """
    # A deferred tool (`defer_loading=True`) is callable once discovered: the program found it in the sandbox (its
    # call was type-checked against its stub), which pydantic-ai cannot see in a history of its own.
    ctx = replace(ctx, discovered_tool_names={*ctx.discovered_tool_names, tool_name})  # pinned by test_compat
    instrumentation = instrumentation_of(agent)
    capability: AbstractCapability[Any] = agent.root_capability
    if instrumentation is not None and instrumentation not in _capabilities(agent):
        capability = CombinedCapability([instrumentation, capability])  # as `Agent.iter` injects it, outermost
    root = await capability.for_run(ctx)
    manager = await ToolManager(toolset=await run_toolset(agent, ctx), root_capability=root).for_run_step(ctx)
    return await manager.handle_call(ToolCallPart(tool_name, args, tool_call_id=ctx.tool_call_id or ""),
                                     approved=True, wrap_validation_errors=False)
