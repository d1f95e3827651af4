"""The model activity's body: the run's next model request, with the model a selector picks for its step.

The request itself is pydantic-ai's own graph step (`_model_step`); this module chooses its model (the run's, the
agent's, or a `SelectModel` selector's pick) and hands it what the run recorded.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from pydantic_ai.messages import AgentStreamEvent, ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelSelectionContext
from pydantic_ai.native_tools import AbstractNativeTool
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RunUsage
from temporalio import activity

from .._models import build_model
from .._pydantic_ai import agent_settings
from ..shared._activity_io import ModelStep, ModelStreamTarget
from ..shared._errors import CodeModeUserError
from ..shared._types import OutputSpec
from ._capabilities import extra_capabilities, instrumentation_of
from ._model_step import model_step
from ._model_stream import ModelStreamPublisher
from ._probe import last_prompt

if TYPE_CHECKING:
    from ._agent import CodeModeAgent

__all__ = ["request_model"]

_SELECTED: weakref.WeakKeyDictionary[CodeModeAgent, dict[str, Model]] = weakref.WeakKeyDictionary()
"""What each agent's selector picked as a model object on this worker, by `model_id`: the next step's selector
gets it back as `ctx.model` (a model object cannot be rebuilt from its id)."""


def _run_id() -> str | None:
    return activity.info().workflow_id if activity.in_activity() else None


async def request_model(durable: CodeModeAgent, override: str | None, messages: list[ModelMessage],
                        tools: list[ToolDefinition], *, deps: Any = None,
                        model_settings: Mapping[str, Any] | None = None, output: OutputSpec | None = None,
                        native_tools: Sequence[AbstractNativeTool] = (), hooked: bool = False,
                        usage: RunUsage | None = None, run_step: int | None = None,
                        output_retries: int = 0, stream: ModelStreamTarget | None = None) -> ModelStep:
    """The run's next model request, made by pydantic-ai's own graph for one step (`_model_step.model_step`).

    With the recorded tool definitions, output tools, provider tools and instructions; the run's deps and model
    settings (layered over the agent's and its capabilities' by pydantic-ai). `hooked` runs tell a model-request
    hook the run's step, usage and output retries (`AgentSpec.model_request_hooks`); others need none. A model
    selector (`SelectModel`) picks the step's model first, unless the run has a model of its own (as
    `Agent.run(model=...)`), here in the activity, so a replay never asks it again.

    `stream`: the run streams its events, so the model's stream goes to it (`_model_stream`) as the model makes it.
    The agent's own `event_stream_handler` gets the step's events (the request streamed for it) either way.
    """
    model = durable.resolve_model(override)
    history = list(messages)
    run_deps = await durable.build_deps(deps)
    if durable.capability_use.model_selector is not None and override is None:
        model = await _selected_model(durable, model, history, run_deps, run_step or 1, output_retries,
                                      usage or RunUsage())
    instrumentation = instrumentation_of(durable.agent)

    async def step(events: Callable[[AgentStreamEvent], None] | None) -> ModelStep:
        return await model_step(
            durable.agent, extra_capabilities(durable.agent), model=model, messages=history, tools=tools,
            native_tools=native_tools, output=output, deps=run_deps,
            model_settings=cast(ModelSettings, dict(model_settings)) if model_settings else None,
            usage=usage if hooked else None, run_step=run_step if hooked else None,
            output_retries=output_retries, run_id=_run_id(),
            instrumentation=instrumentation.settings if instrumentation else None, events=events,
            event_stream_handler=durable.agent.event_stream_handler)

    if stream is None or not activity.in_activity():
        return await step(None)
    async with ModelStreamPublisher(stream) as publisher:
        return await step(publisher.publish)


async def _selected_model(durable: CodeModeAgent, default: Model, history: list[ModelMessage], deps: Any,
                          run_step: int, output_retries: int, usage: RunUsage) -> Model:
    """The model a selector (`SelectModel`) picks for this step.

    It gets pydantic-ai's `ModelSelectionContext`: on the first step the agent's model, then the one that answered
    the step before, as the last response recorded it (`model_id`): one this worker's selector picked, or one built
    again from its name, else (picked as an object on another worker) the agent's. A name is built here, with the
    same key checks as the agent's model (a missing key fails the run, not retried).
    """
    selector = durable.capability_use.model_selector
    assert selector is not None
    picked = _SELECTED.setdefault(durable, {})
    previous = next((m for m in reversed(history) if isinstance(m, ModelResponse)), None)
    lower = default
    if previous is not None and previous.model_id and previous.model_id != default.model_id:
        lower = picked.get(previous.model_id) or _built_or_none(previous.model_id) or default
    selection = selector(ModelSelectionContext(
        agent=durable.agent, deps=deps, model=lower, run_step=run_step, prompt=last_prompt(history),
        messages=list(history), usage=usage, retry=output_retries,
        max_retries=agent_settings(durable.agent).output_retries, run_id=_run_id()))
    if inspect.isawaitable(selection):
        selection = await selection
    if isinstance(selection, Model):
        picked[selection.model_id] = selection
        return selection
    return build_model(selection, subject=f"agent {durable.name!r}", whose="the model its SelectModel picked",
                       otherwise="have the selector pick a model that works on this worker")


def _built_or_none(name: str) -> Model | None:
    """The model called `name` (a model string, as a response's `model_id` may be), or `None` if none can be built."""
    try:
        return build_model(name, subject="a model selector's previous model", whose="it", otherwise="")
    except (CodeModeUserError, ValueError, ImportError):  # e.g. `function:...`: a model object's id, not a name
        return None
