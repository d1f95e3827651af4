"""One model request of a durable run, made by pydantic-ai's own agent graph in the model activity.

A durable run's loop is its workflow, but each of its model requests is the step `agent.run()` would make: the
model activity runs pydantic-ai's graph for exactly one model-request step over the run's recorded history, and
stops before the graph would call any tool. So everything pydantic-ai does around a request, in each release we
support, happens as in `agent.run()`: the history cleaned and rendered for the model (`Model.prepare_messages`),
the capabilities' model settings layered, the model-request hooks in their order (`wrap_model_request` around
`before_model_request`, each attempt's `prepare_model_request`, `on_model_request_error`, `after_model_request`,
`compact_history`), the attempt loop that `ModelFallback` drives (by `RetryModelRequest`, or by wrapping the
model), `ProcessHistory`'s rewrite, the instrumentation's request span.

What the run recorded when it started stays as recorded; the step is told, not asked:
- the tools offered are the recorded definitions (`run_code`, the direct tools), through `RecordedTools`, and the
  provider tools the recorded ones: a capability's `prepare_tools`, wrapper toolsets, toolsets and provider tools
  acted once, when the run started (`describe`), and are masked here (`_StepCapability`);
- the instructions are the ones recorded (pydantic-ai resolves them again at each request; a durable run, once);
- the output offered is the recorded one: its (prepared) output tools, and when a deploy changed the agent's
  output since, the recorded output parameters whole (`_RecordedOutput`);
- the step number and the output retries used are the durable run's (`start_step`), as are the usage so far and
  the run id, so hooks see the `RunContext` they would in `agent.run()`;
- `dynamic=True` system prompts are not valued again (the run values them once, at its start).
The run-lifecycle hooks (`before_run`, `after_run`, `wrap_run`, `on_run_error`) run once per durable run in their
own activities, and are masked here; so is the instrumentation's agent-run span (the run's span is the workflow's).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from pydantic_ai import Agent, CallToolsNode, ModelRequestNode, RunContext
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.capabilities import AbstractCapability, Instrumentation
from pydantic_ai.capabilities.abstract import WrapRunHandler
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    PartEndEvent,
    PartStartEvent,
    SystemPromptPart,
)
from pydantic_ai.models import Model, ModelRequestContext
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.native_tools import AbstractNativeTool
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RunUsage
from pydantic_core import SchemaValidator, core_schema
from pydantic_graph import End

from .._pydantic_ai import override_root_capability, start_step, step_run_context
from ..shared._activity_io import ModelStep
from ..shared._types import OutputSpec
from ..workflow._fingerprints import OutputShape, recorded_output
from ._capabilities import RunHooksMasked

__all__ = ["RecordedTools", "can_stream", "model_step"]

_ANY_ARGUMENTS = SchemaValidator(core_schema.any_schema())
"""The recorded tools are offered, never called here: their arguments are checked where they run."""


class RecordedTools(AbstractToolset[Any]):
    """The tool definitions a run recorded when it started, offered to the model exactly as recorded.

    Never called: the graph step stops before the tools run (program calls and direct calls are activities).
    """

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        self._definitions = list(definitions)

    @property
    def id(self) -> str | None:
        return "durable-codemode:recorded-tools"

    @property
    def label(self) -> str:
        return "the run's recorded tools"

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {d.name: ToolsetTool(toolset=self, tool_def=d, max_retries=0, args_validator=_ANY_ARGUMENTS)
                for d in self._definitions}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        raise RuntimeError(f"tool {name!r} was called inside a model step: a durable run calls its tools in "
                           "their own activities (this is a bug in durable-codemode)")


class _StepCapability(RunHooksMasked):
    """One of the agent's capabilities, for a model step: what acts once per run or at the run's start is masked.

    Every model-request hook, model setting and model wrapper is the capability's own.
    """

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        return tool_defs

    async def prepare_output_tools(self, ctx: RunContext[Any],
                                   tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        return tool_defs

    def get_toolset(self) -> Any:
        return None

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        return None

    def get_native_tools(self) -> Sequence[Any]:
        return []

    def get_instructions(self) -> Any:
        return None


class _RecordedOutput(AbstractCapability[Any]):
    """Offers the model the output the run recorded, whatever the agent's output is now.

    The output tools are the recorded (prepared) definitions, by name, as the agent's `prepare_output_tools` left
    them at the run's start. When a deploy changed the agent's output since (another output type, a renamed field,
    structured output added or dropped: `_fingerprints.OutputShape`), the request's output parameters are the
    recorded ones whole: a run that recorded a `str` output is offered no output tool, and one that recorded
    `final_result` is offered it as it was, never the new agent's (its answer is then checked, and refused by name
    if the new output rejects it, by the output activity). When nothing changed, the request is pydantic-ai's own.
    """

    def __init__(self, output: OutputSpec | None) -> None:
        super().__init__()
        self._output = output
        self._tools = {t.name: t for t in output.tools} if output is not None else {}
        self._current: list[ToolDefinition] = []
        """The agent's own output tools for this step, before they are narrowed to the recorded ones."""

    async def prepare_output_tools(self, ctx: RunContext[Any],
                                   tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        self._current = list(tool_defs)
        if not self._tools:  # as runs recorded before: the agent's, or none (the request is overridden if changed)
            return tool_defs
        return [self._tools.get(t.name, t) for t in tool_defs if t.name in self._tools]

    async def before_model_request(self, ctx: RunContext[Any], request_context: ModelRequestContext
                                   ) -> ModelRequestContext:
        params = request_context.model_request_parameters
        recorded = recorded_output(self._output)
        now = OutputShape.of(self._current, params.output_object, allows_text=params.allow_text_output,
                             allows_image=params.allow_image_output)
        if now.fingerprint == recorded.fingerprint:
            return request_context
        out = self._output
        mode: Any = out.mode if out is not None else "text"
        template: str | Literal[False] | None = out.prompted_template if out is not None else None
        if template is None and mode == params.output_mode:
            template = params.prompted_output_template
        request_context.model_request_parameters = replace(
            params, output_mode=mode, output_tools=list(out.tools) if out is not None else [],
            output_object=out.object_def if out is not None else None, prompted_output_template=template,
            allow_text_output=out.allows_text if out is not None else True,
            allow_image_output=out.allows_image if out is not None else False)
        return request_context


class _StepInstrumentation(Instrumentation):
    """The agent's instrumentation without its agent-run span: one step is not a run (the workflow's span is)."""

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> Any:
        return await handler()


def _step_capabilities(agent: Agent[Any, Any], own: Sequence[AbstractCapability[Any]], output: OutputSpec | None,
                       instrumentation: InstrumentationSettings | None) -> list[AbstractCapability[Any]]:
    """The capabilities a model step runs with: the agent's, its own ones masked (`_StepCapability`)."""
    layers: list[AbstractCapability[Any]] = []
    if instrumentation is not None:
        layers.append(_StepInstrumentation(settings=instrumentation))
    layers.extend(_StepCapability(c) if any(c is o for o in own) else c
                  for c in agent.root_capability.capabilities if type(c) is not Instrumentation)
    layers.append(_RecordedOutput(output))
    return layers


def _for_graph(messages: list[ModelMessage], run_id: str | None) -> tuple[list[ModelMessage], dict[int, ModelMessage]]:
    """The run's history as the graph step takes it, and each message changed for it, by the copy's `id()`.

    Two things are taken off: a system prompt's `dynamic_ref` (pydantic-ai values such a prompt again whenever a
    run starts from a history; a durable run values it once, at its start) and this run's id on the messages the
    run's earlier steps made (pydantic-ai refuses a run whose id is already in its history: each step is a run of
    the graph, all under the durable run's id). A history the step gives back has the originals put back.
    """
    out: list[ModelMessage] = []
    originals: dict[int, ModelMessage] = {}
    for message in messages:
        copy = message
        if run_id is not None and message.run_id == run_id:
            copy = replace(copy, run_id=None)
        if isinstance(copy, ModelRequest) and any(isinstance(p, SystemPromptPart) and p.dynamic_ref
                                                  for p in copy.parts):
            copy = replace(copy, parts=[replace(p, dynamic_ref=None) if isinstance(p, SystemPromptPart) else p
                                        for p in copy.parts])
        if copy is not message:
            originals[id(copy)] = message
        out.append(copy)
    return out, originals


def _requests_merged(messages: list[ModelMessage]) -> list[tuple[ModelMessage, bool]]:
    """`messages` with consecutive requests merged into one, as the graph keeps a history (and whether merged).

    A conversation continued after an output tool's answer has two requests in a row (the one answering the output
    tool, which `RunResult.all_messages()` ends with, then the new prompt): pydantic-ai sends them, and keeps
    them, as one. That is its own cleaning of the history, not a hook rewriting it.
    """
    out: list[tuple[ModelMessage, bool]] = []
    for message in messages:
        if out and isinstance(message, ModelRequest) and isinstance(out[-1][0], ModelRequest):
            out[-1] = (replace(out[-1][0], parts=[*out[-1][0].parts, *message.parts]), True)
        else:
            out.append((message, False))
    return out


def _same_history(before: list[ModelMessage], after: list[ModelMessage]) -> bool:
    """Whether the graph kept the history it was given.

    The request it sends is stamped, and a request it merged from several is its own: those are compared by their
    parts; every other message must be the one it was given.
    """
    merged = _requests_merged(before)
    if len(merged) != len(after) or not merged:
        return len(merged) == len(after)
    if not (isinstance(merged[-1][0], ModelRequest) and isinstance(after[-1], ModelRequest)):
        return False
    last = len(after) - 1
    return all(
        list(mine.parts) == list(theirs.parts) if (was_merged or i == last) and isinstance(mine, ModelRequest)
        and isinstance(theirs, ModelRequest) else mine == theirs
        for i, ((mine, was_merged), theirs) in enumerate(zip(merged, after, strict=True)))


async def model_step(agent: Agent[Any, Any], own: Sequence[AbstractCapability[Any]], *, model: Model,
                     messages: list[ModelMessage], tools: Sequence[ToolDefinition],
                     native_tools: Sequence[AbstractNativeTool], output: OutputSpec | None, deps: Any,
                     model_settings: ModelSettings | None, usage: RunUsage | None, run_step: int | None,
                     output_retries: int, run_id: str | None,
                     instrumentation: InstrumentationSettings | None,
                     events: Callable[[AgentStreamEvent], None] | None = None,
                     event_stream_handler: EventStreamHandler[Any] | None = None) -> ModelStep:
    """Make the run's next model request through pydantic-ai's graph, for one step; what it did, as data.

    Args:
        agent: the pydantic-ai agent.
        own: the capabilities the agent was given (masked for the step; the built-in ones are not).
        model: the request's model (the run's, or the one its selector picked): given, so no selector runs here.
        messages: the run's history, ending with the request to send.
        tools: the recorded tool definitions the model is offered.
        native_tools: the recorded provider tools.
        output: the recorded output spec (its output tools are offered as recorded).
        deps: the run's deps, as the agent's `deps_type`.
        model_settings: the run's own model settings (the graph layers the agent's and capabilities' under them).
        usage: the run's usage before this request (the hooks' `ctx.usage`); `None`: none is told.
        run_step: the request's step in the run, from 1; `None`: the graph's own count.
        output_retries: the output retries the run has used.
        run_id: the durable run's id (`ctx.run_id`, and the response's).
        instrumentation: the worker's instrumentation settings for the agent, or `None`.
        events: takes each event of the model's stream, when the run streams its events: the request is then
            streamed (as `agent.run()` streams a node for its `event_stream_handler`), or, for a model that cannot
            stream (a `FunctionModel` without a `stream_function`), made whole, and its parts given as
            `PartStartEvent` / `PartEndEvent` pairs once it answers.
        event_stream_handler: the agent's own `Agent(event_stream_handler=...)`, given the model step's events as
            `agent.run()` gives it a model-request node's (the run's tool events happen in its workflow).

    Returns:
        The response the run goes on with; or, when a hook raised `ModelRetry`, the retry request (with the
        response it rejected, kept for context, if the model was called); and the history, when the step
        rewrote it (`ProcessHistory`, a compaction).

    Raises:
        Whatever the model or a hook raised that no hook recovered (the activity classifies it): a
        `ModelHTTPError`, a `FallbackExceptionGroup`, pydantic-ai's `UserError`, or `UnexpectedModelBehavior`
        for a hook's retry past the output budget.

    """
    history, originals = _for_graph(list(messages), run_id)
    last = history[-1] if history else None
    if not isinstance(last, ModelRequest):
        raise RuntimeError("a model step's history must end with the request to send (a bug in durable-codemode)")
    layers = _step_capabilities(agent, own, output, instrumentation)
    with override_root_capability(agent, layers), agent.override(
            toolsets=[RecordedTools(tools)], tools=[], native_tools=list(native_tools),
            instructions=last.instructions):
        async with agent.iter(None, message_history=history, model=model, deps=deps, model_settings=model_settings,
                              usage=replace(usage) if usage is not None else None, run_id=run_id,
                              conversation_id=run_id) as run:
            first = run.next_node
            node = await run.next(first) if not isinstance(first, End) else first
            if not isinstance(node, ModelRequestNode):
                raise RuntimeError(f"pydantic-ai went to {type(node).__name__} before the model request: a bug in "
                                   "durable-codemode (the run's history ends with a request)")
            start_step(run, run_step=run_step, output_retries=output_retries)
            streamed = (events is not None or event_stream_handler is not None) and can_stream(model)
            if streamed:
                async with node.stream(run.ctx) as stream:
                    told = _told(stream, events)
                    if event_stream_handler is not None:
                        await event_stream_handler(step_run_context(run), told)
                    async for _ in told:  # what the handler left unread still reaches `events`
                        pass
            after = await run.next(node)
            graph_history = run.all_messages()
    retry: ModelRequest | None = None
    response: ModelResponse | None = None
    if isinstance(after, CallToolsNode):
        response = after.model_response
    elif isinstance(after, ModelRequestNode):  # a hook's `ModelRetry`: the graph asks again with its feedback
        retry = after.request
    else:
        raise RuntimeError(f"pydantic-ai went to {type(after).__name__} after the model request (a bug in "
                           "durable-codemode)")
    if graph_history and isinstance(graph_history[-1], ModelResponse):
        kept = graph_history.pop()
        if response is None:
            assert isinstance(kept, ModelResponse)
            response = kept  # the response a `ModelRetry` rejected, kept in history for context
    rewritten = None if _same_history(history, graph_history) else [originals.get(id(m), m) for m in graph_history]
    if events is not None and not streamed and response is not None:
        for index, part in enumerate(response.parts):
            events(PartStartEvent(index=index, part=part))
            events(PartEndEvent(index=index, part=part))
    return ModelStep(response=response, retry=retry, messages=rewritten)


def can_stream(model: Model) -> bool:
    """Whether `model` streams its requests: pydantic-ai's check, and a `FunctionModel` needs a `stream_function`.

    Wrappers (`FallbackModel`, instrumentation, capabilities' model wrappers) stream when every model they wrap
    does.
    """
    if isinstance(model, FunctionModel):
        return model.stream_function is not None
    if isinstance(model, FallbackModel):
        return all(can_stream(m) for m in model.models)
    if isinstance(model, WrapperModel):
        return can_stream(model.wrapped)
    return type(model).request_stream is not Model.request_stream


async def _told(stream: AsyncIterable[AgentStreamEvent],
                events: Callable[[AgentStreamEvent], None] | None) -> AsyncIterator[AgentStreamEvent]:
    """`stream`, each event given to `events` as it passes."""
    async for event in stream:
        if events is not None:
            events(event)
        yield event
