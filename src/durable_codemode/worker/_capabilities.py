"""Which pydantic-ai capability hooks a durable run applies, and the model requests and tool calls through them.

A durable run calls each tool in its own activity, asks the model in the model activity, and checks each candidate
answer in the output activity, all on the worker. There:
- pydantic-ai's own `ToolManager` and output processing dispatch a capability's tool hooks and output hooks exactly
  as `agent.run()` does, with the call's `RunContext`;
- the model activity runs the model-request hooks (`wrap_model_request` around `before_model_request`, then
  `prepare_model_request`, the model call with `on_model_request_error`, `after_model_request`), each chained over
  the capabilities by pydantic-ai's own `CombinedCapability`, in the order `ModelRequestNode` calls them. That covers
  `ProcessHistory` (a `before_model_request` hook): the history it writes back is adopted by the run, as in
  `agent.run()`. The attempt loop is pydantic-ai's too (`RetryModelRequest`, so `ModelFallback` works);
- a capability's model settings (`Thinking`) are layered into every request's, and its instructions are resolved
  with the agent's when the run starts (`before_run` runs then too, in the describe activity);
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from pydantic_ai import Agent, AgentRunResult, RunContext
from pydantic_ai._agent_graph import MAX_MODEL_REQUEST_ATTEMPTS
from pydantic_ai._fallback import AttemptLog
from pydantic_ai._model_request_attempts import AttemptStart
from pydantic_ai._utils import Some
from pydantic_ai.capabilities import (
    AbstractCapability,
    CombinedCapability,
    Hooks,
    Instrumentation,
    ModelFallback,
    ToolSearch,
    WrapperCapability,
)
from pydantic_ai.capabilities.abstract import ModelSelector, WrapModelRequestHandler, WrapRunHandler
from pydantic_ai.exceptions import ModelRetry, RetryModelRequest, SkipModelRequest, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryFeedbackPart,
    RetryInfo,
    ToolCallPart,
    _clean_message_history,  # pinned by tests/test_compat.py
)
from pydantic_ai.models import Model, ModelRequestContext, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, CombinedToolset

__all__ = [
    "APPLIED_HOOKS",
    "REFUSED_HOOKS",
    "call_through_hooks",
    "extra_capabilities",
    "fallback_model_names",
    "has_after_run_hooks",
    "has_model_request_hooks",
    "has_prepare_tools_hooks",
    "has_run_error_hooks",
    "instrumentation_of",
    "instrumented_context",
    "instrumented_request",
    "model_selector",
    "probing",
    "registered_capabilities",
    "request_through_hooks",
    "run_after_run",
    "run_before_run",
    "run_on_run_error",
    "run_toolset",
    "send",
    "unapplied_hooks",
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
    "on_model_request_error",
})
"""Dispatched by `request_through_hooks` in the model activity, around the model call of each request."""

RUN_HOOKS = frozenset({"before_run", "after_run", "wrap_run", "on_run_error"})
"""Of these, `before_run` is called once per run, in the describe activity (`run_before_run`), `after_run` once
its output is decided, in the after-run activity (`run_after_run`), and `on_run_error` if its body fails, in the
run-error activity (`run_on_run_error`)."""

APPLIED_HOOKS = TOOL_HOOKS | OUTPUT_HOOKS | MODEL_REQUEST_HOOKS | {
    "before_run", "after_run", "on_run_error", "get_model_settings", "get_instructions", "get_toolset",
    "get_wrapper_toolset", "prepare_tools", "prepare_output_tools"}
"""`get_model_settings` (`Thinking`): its settings go between the agent's and the run's, in the model activity.
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
    "on_event": "a durable run has no event stream (it does not stream; watch it with `codemode watch`)",
    "wrap_run_event_stream": "a durable run has no event stream (it does not stream; watch it with `codemode watch`)",
    "get_toolset": "a run's tools are the agent's toolsets, recorded when it starts",
    "prefix_tools": "a run's tools are the agent's toolsets, recorded when it starts",
    "get_native_tools": "a provider tool with a local fallback (NativeOrLocalTool): which of the two a request "
                        "uses depends on its model, while a run's sandbox tools are fixed when it starts; give "
                        "native=False (the local tool) or local=False (the provider's)",
    "get_wrapper_model": "the model activity calls the run's model itself",
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
    settings = agent._resolve_instrumentation_settings()  # pinned by tests/test_compat.py
    return None if settings is None else Instrumentation(settings=settings)


def registered_capabilities(agent: Agent[Any, Any]) -> dict[str, AbstractCapability[Any]]:
    """`ctx.capabilities` as `Agent.iter` registers them: every capability of the agent under its id.

    A capability's toolset (`Toolset`, a local `WebSearch`, ...) finds its owner there when it lists its tools.
    """
    from pydantic_ai.agent import _build_run_capabilities  # pinned by tests/test_compat.py

    return _build_run_capabilities(agent.root_capability)


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


def _contributes(capability: AbstractCapability[Any], hook: str) -> bool:
    """Whether `capability`'s override of `hook` gives the run something (else it is harmless to leave uncalled)."""
    if hook == "get_model":  # a per-step selector (`SelectModel`) is applied in the model activity (`model_selector`)
        contribution = capability.get_model()
        return contribution is not None and not _is_selector(contribution)
    if hook == "get_native_tools":  # the provider's tools alone are sent with every request (`AgentSpec`)
        return bool(capability.get_native_tools()) and capability.get_toolset() is not None
    return True


def fallback_model_names(agent: Agent[Any, Any]) -> list[str]:
    """The models given by name to `agent`'s `ModelFallback` capabilities (the worker checks they can be built)."""
    return [model for capability in extra_capabilities(agent) if isinstance(capability, ModelFallback)
            for model in capability.models if isinstance(model, str)]


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


def has_prepare_tools_hooks(agent: Agent[Any, Any]) -> bool:
    """Whether a capability of `agent` prepares its function tools (the run takes the prepared ones at its start)."""
    return _has_hook(agent, "prepare_tools")


def has_run_error_hooks(agent: Agent[Any, Any]) -> bool:
    """Whether a capability of `agent` has an `on_run_error` hook (run failures go through the run-error activity)."""
    return _has_hook(agent, "on_run_error")


def has_after_run_hooks(agent: Agent[Any, Any]) -> bool:
    """Whether a capability of `agent` has an `after_run` hook (its runs' outputs go through the after-run activity)."""
    return _has_hook(agent, "after_run")


class _Quiet(WrapperCapability[Any]):
    """A capability with its run and model-request hooks masked, for the worker's probing runs.

    Those runs (describe, the output check) are pydantic-ai runs on a `FunctionModel` that ask what it would send,
    or check a response the model already gave. The masked hooks ran once where they belong (`before_run` in
    describe, the model-request hooks in the model activity) and must not run, rewrite the history, or see a
    probe's answer again. Every other hook (instructions, output hooks) is the wrapped capability's.
    """

    async def before_run(self, ctx: RunContext[Any]) -> None:
        return None

    async def after_run(self, ctx: RunContext[Any], *, result: Any) -> Any:
        return result

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> Any:
        return await handler()

    async def on_run_error(self, ctx: RunContext[Any], *, error: BaseException) -> Any:
        raise error

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

    async def on_model_request_error(self, ctx: RunContext[Any], *, request_context: ModelRequestContext,
                                     error: Exception) -> ModelResponse:
        raise error


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


_MASKED = RUN_HOOKS | MODEL_REQUEST_HOOKS
_PREPARE_HOOKS = frozenset({"prepare_tools", "prepare_output_tools"})


@contextmanager
def probing(agent: Agent[Any, Any], *, preparing: bool = False) -> Iterator[None]:
    """Within: `agent`'s runs (in this task) call none of its run or model-request hooks, and make no such spans.

    The hooks are masked by `_Quiet`, the spans by `_QuietInstrumentation` (which also stops pydantic-ai injecting
    its own `Instrumentation`). `preparing`: the probe is the run's start, where its tools are prepared (describe);
    otherwise `prepare_tools` / `prepare_output_tools` are masked as well (`_Prepared`).

    Uses the override slot `Agent.override(spec=...)` sets (a `ContextVar`, so concurrent activities on the
    worker, and `agent.run()` elsewhere in the process, are untouched).
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
    quiet = CombinedCapability(layers)
    token = agent._override_root_capability.set(Some(quiet))  # pinned by tests/test_compat.py
    try:
        yield
    finally:
        agent._override_root_capability.reset(token)


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


def prepared_history(model: Model, messages: list[ModelMessage],
                     parameters: ModelRequestParameters) -> list[ModelMessage]:
    """The history as pydantic-ai's agent graph hands it to `model` (`ModelRequestNode._prepare_attempt`).

    The graph cleans the history (consecutive requests merged, a dangling tool call answered) and runs
    `Model.prepare_messages`, which renders what adapters cannot: a `RetryFeedbackPart` (every output retry a
    durable run asks for) becomes the fenced user text providers are sent, an appending system prompt its
    `<pyai:context>` element. A provider's adapter refuses the raw parts with "`RetryFeedbackPart` cannot be
    rendered by this model" (only `FunctionModel` accepts them). The run's recorded history is not changed.
    """
    cleaned = _clean_message_history(list(messages), repair_last_response=True)  # pinned by tests/test_compat.py
    prepared = model.prepare_messages(cleaned, parameters)
    return _clean_message_history(prepared, repair_last_response=True) if prepared is not cleaned else prepared


async def send(model: Model, messages: list[ModelMessage], settings: ModelSettings | None,
               parameters: ModelRequestParameters) -> ModelResponse:
    """`model.request(...)` on the history as pydantic-ai's agent graph hands it to a model (`prepared_history`)."""
    return await model.request(prepared_history(model, messages, parameters), settings, parameters)


async def instrumented_request(agent: Agent[Any, Any], ctx: RunContext[Any],
                               request_context: ModelRequestContext) -> ModelResponse:
    """One model request of an agent without model-request hooks, inside its `Instrumentation`'s span if any."""
    async def handler(request: ModelRequestContext) -> ModelResponse:
        return await send(request.model, request.messages, request.model_settings, request.model_request_parameters)

    instrumentation = instrumentation_of(agent)
    if instrumentation is None:
        return await handler(request_context)
    root = await instrumentation.for_run(ctx)
    return await root.wrap_model_request(ctx, request_context=request_context, handler=handler)


async def request_through_hooks(agent: Agent[Any, Any], ctx: RunContext[Any], request_context: ModelRequestContext,
                                resolve_model: Callable[[str], Model]) -> tuple[ModelResponse | None,
                                                                                ModelRequest | None]:
    """Make one model request with every model-request hook of `agent` around it, as `ModelRequestNode` does.

    `ctx.messages` is the run's history (a hook such as `ProcessHistory` may rewrite it in place, for the caller
    to adopt). Returns the response, or (a hook raised `ModelRetry`) the response kept for context, if the model
    was called, and the retry request pydantic-ai would send next. `SkipModelRequest`'s response is the response.
    `RetryModelRequest` from `prepare_model_request`, `on_model_request_error` or `after_model_request` makes
    another attempt (`_attempts`), on the model it names (`resolve_model` builds one given as a string), as
    `ModelFallback` asks. Errors of the model call that no hook recovers propagate raw (the activity classifies
    them), a `FallbackExceptionGroup` when a fallback chain ran out of models.
    """
    root = await _own(agent).for_run(ctx)
    kept: list[ModelResponse] = []

    async def handler(request: ModelRequestContext) -> ModelResponse:
        request = await root.before_model_request(ctx, request)
        return await _attempts(root, ctx, request, resolve_model, kept)

    try:
        try:
            return await root.wrap_model_request(ctx, request_context=request_context, handler=handler), None
        except RetryModelRequest as e:
            raise UserError(_RETRY_OUTSIDE_ATTEMPTS) from e
    except SkipModelRequest as e:
        return e.response, None
    except ModelRetry as e:
        # As `_build_retry_node`: the model is asked again with the hook's message; what it said stays in history.
        return (kept[-1] if kept else None), ModelRequest(
            parts=[RetryFeedbackPart(content=e.message, retry=RetryInfo("model_retry"))])


_RETRY_OUTSIDE_ATTEMPTS = (  # pydantic-ai's words (`_outside_attempts`)
    "`RetryModelRequest` can only be raised from `prepare_model_request`, `on_model_request_error` or "
    "`after_model_request`: `before_model_request` and `wrap_model_request` run once per request step, "
    "before any attempt. To use another model for the whole step, set `request_context.model` instead.")


async def _attempts(root: AbstractCapability[Any], ctx: RunContext[Any], request: ModelRequestContext,
                    resolve_model: Callable[[str], Model], kept: list[ModelResponse]) -> ModelResponse:
    """Attempt `request` until a response is accepted, as pydantic-ai's `ModelRequestNode._request_attempts`.

    Each attempt starts from what `before_model_request` made (so one never inherits another model's preparation),
    runs `prepare_model_request`, calls the model, and hands the error to `on_model_request_error` or the response
    to `after_model_request`; any of the three may raise `RetryModelRequest` for another attempt. The attempts
    moved on from are recorded on the answer (`ModelResponse.failed_attempts`, with `model_id` what
    `ModelFallback(sticky=True)` reads back) with their usage, which the run counts. The latest response the model
    gave goes into `kept`.
    """
    messages, settings, parameters = list(request.messages), request.model_settings, request.model_request_parameters
    failed = AttemptLog()  # pinned by tests/test_compat.py
    while True:
        kept.clear()  # each attempt's response state starts empty, as pydantic-ai's
        request.messages, request.model_settings = list(messages), settings
        request.model_request_parameters = parameters
        try:
            prepared = await root.prepare_model_request(ctx, request)
        except RetryModelRequest as retry:
            _next_attempt(request, retry, resolve_model)
            continue
        # Like pydantic-ai, keep the object outer `wrap_model_request` hooks hold, with what a hook returned.
        request.model, request.messages = prepared.model, list(prepared.messages)
        request.model_settings, request.model_request_parameters = prepared.model_settings or None, \
            prepared.model_request_parameters
        request.model_id = prepared.model_id
        # As the graph, before the call (not one of its errors): the hooks after it see what the model was handed.
        request.messages = prepared_history(request.model, request.messages, request.model_request_parameters)
        start = AttemptStart()  # pinned by tests/test_compat.py
        outcome: Exception | ModelResponse
        try:
            outcome = response = await request.model.request(request.messages, request.model_settings,
                                                             request.model_request_parameters)
        except (ModelRetry, SkipModelRequest, RetryModelRequest):
            raise
        except Exception as e:
            outcome = e
            try:
                response = await root.on_model_request_error(ctx, request_context=request, error=e)
            except RetryModelRequest as retry:
                _next_attempt(request, retry, resolve_model, failed=(failed, e, start))
                continue
        # Which of the run's models answered, as pydantic-ai records it (`ModelFallback(sticky=True)` reads it).
        serving = request.model_id or request.model.model_id
        kept.append(response := failed.attach(response))
        response.model_id = response.model_id or serving
        try:
            accepted = await root.after_model_request(ctx, request_context=request, response=response)
        except RetryModelRequest as retry:
            _next_attempt(request, retry, resolve_model, failed=(failed, outcome, start))
            continue
        accepted.model_id = accepted.model_id or serving
        return accepted


def _next_attempt(request: ModelRequestContext, retry: RetryModelRequest, resolve_model: Callable[[str], Model], *,
                  failed: tuple[AttemptLog, Exception | ModelResponse, AttemptStart] | None = None) -> None:
    """Move `request` on to its next attempt, in place, as `ModelRequestNode._start_next_attempt` does.

    `failed` is the log, failure and start of an attempt that got as far as the model, to record it as moved on
    from (an attempt `prepare_model_request` retried never reached a model).
    """
    if failed is not None:
        log, failure, start = failed
        log.record(request.model, failure, start, parent=None, tracer=None)
    if request.attempt >= MAX_MODEL_REQUEST_ATTEMPTS:
        raise UserError(f"Model request was attempted more than the maximum of {MAX_MODEL_REQUEST_ATTEMPTS} times: "
                        "a capability is raising `RetryModelRequest` without making progress.") from retry
    if isinstance(retry.model, Model):
        request.model, request.model_id = retry.model, None
    elif retry.model is not None:
        request.model, request.model_id = resolve_model(retry.model), retry.model
    request.attempt += 1


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
