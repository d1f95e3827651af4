"""`CodeModeAgent`: a `pydantic_ai.Agent` made durable, and the activity bodies that serve it on a worker.

The agent stays an ordinary pydantic-ai agent (model, instructions, tools declared with `@agent.tool_plain`,
`Tool(...)` or a `FunctionToolset`); this wrapper adds what the durable run needs to know: which tools the
sandbox may call, their activity options, the snippet limits, and the environment the sandbox may read.
"""

from __future__ import annotations

import functools
import inspect
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any, TypeVar, Union, cast

from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError
from pydantic_ai import Agent, AgentRunResult, CallToolsNode, DeferredToolRequests, PendingModelResponse, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters, ModelSelectionContext, infer_model
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.native_tools import AbstractNativeTool
from pydantic_ai.profiles import ModelProfile
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RunUsage
from pydantic_graph import End
from temporalio import activity

from .._approvals import RecordedApproverPolicy
from .._catalog import CATALOG_FUNCTIONS
from .._config import CatalogSettings, SnippetLimits, ToolOptions
from .._errors import CodeModeUserError, GuardrailError
from .._files import RunFiles
from .._models import build_model
from .._names import CHILD_RUN_METADATA, RUN_CODE_TOOL, tool_activity_type
from .._pydantic_ai import (
    agent_run_result,
    agent_settings,
    output_types,
    resolves_per_run,
    start_step,
)
from .._results import jsonable
from .._stubs import (
    deferred_section,
    estimate_tokens,
    index_section,
    render_tool_stubs,
    run_code_tool_definition,
    stubs_of,
    tool_summary,
)
from .._types import AgentSpec, CatalogEntry, DynamicPrompt, ModelStep, OutputSpec, OutputVerdict, ToolCatalog, ToolSpec
from ._approvers import ApprovalAuthority
from ._capabilities import (
    call_through_hooks,
    extra_capabilities,
    fallback_model_names,
    has_after_run_hooks,
    has_model_request_hooks,
    has_prepare_tools_hooks,
    has_run_error_hooks,
    instrumentation_of,
    instrumented_context,
    model_selector,
    probing,
    registered_capabilities,
    run_after_run,
    run_before_run,
    run_on_run_error,
    run_toolset,
    unapplied_hooks,
    unsupported_model_wrappers,
    unsupported_tool_search,
    wraps_toolsets,
)
from ._files import files_spec
from ._mcp import as_received, mcp_toolsets, reconnect_lost, schema_digest
from ._model_step import model_step

__all__ = ["CodeModeAgent", "ToolSelector", "not_data_message"]

AgentDepsT = TypeVar("AgentDepsT")
"""The wrapped agent's `deps_type`: what a `deps_factory` must build."""
RunDepsT = TypeVar("RunDepsT")
"""What a run records for a `deps_factory` (`run_deps_type`)."""


def _unsupported(agent: Agent[Any, Any]) -> list[str]:
    """What `agent` declares that a durable run would not apply, by name (refused, never silently dropped)."""
    found = [f"capability hooks: {'; '.join(unapplied)} (a durable run applies a capability's tool, output and "
             "model-request hooks, ProcessHistory among them)" for unapplied in [unapplied_hooks(agent)] if unapplied]
    found.extend(_unsupported_toolsets(agent))
    found.extend(unsupported_tool_search(agent))
    found.extend(unsupported_model_wrappers(agent))
    if agent.model is None and model_selector(agent) is not None:
        found.append("a model selector (SelectModel) on an agent without a model of its own (a durable run builds "
                     "the agent's model when it starts, and its selector starts from it: give the agent a model, "
                     "which the selector's first ctx.model is)")
    settings = agent_settings(agent)
    if settings.has_concurrency_limit:
        found.append("max_concurrency (it bounds agent.run() calls in one process; durable runs are bounded by "
                      "their worker: create_worker(max_concurrent_workflow_tasks=...))")
    if settings.has_metadata:
        found.append("metadata (attached to agent.run() results and spans; a durable run's own spans come from "
                      "create_worker(tracing=True))")
    kinds = output_types(agent.output_type)
    if DeferredToolRequests in kinds:
        found.append("DeferredToolRequests in its output_type (a durable run pauses a call for approval itself: "
                      "use ToolOptions(requires_approval=True) instead)")
    if PendingModelResponse in kinds:
        found.append("PendingModelResponse in its output_type (background model responses)")
    return found


def _unsupported_toolsets(agent: Agent[Any, Any]) -> list[str]:
    """The toolsets of `agent` whose tools would change under a recorded run, or that connect per run."""
    leaves: list[AbstractToolset[Any]] = []
    for toolset in agent.toolsets:
        toolset.apply(leaves.append)
    found = []
    for toolset in leaves:
        name = getattr(toolset, "toolset_func", None)
        if isinstance(toolset, DynamicToolset) and toolset.per_run_step:
            found.append(
                f"a dynamic toolset ({getattr(name, '__name__', toolset.label)}) rebuilt at every run step (a run's "
                "tools are recorded once, when it starts, and its programs are checked against them): declare it "
                "with per_run_step=False (`@agent.toolset(per_run_step=False)`, `DynamicToolset(..., "
                "per_run_step=False)`), so it is built from each run's context (its deps) when the run starts")
        if resolves_per_run(toolset):  # an MCPToolset's (mcp is optional)
            found.append(
                f"an MCP server ({toolset.label}) whose auth or headers are a function of the run (a durable run's "
                "calls share the worker's connection to the server): give it fixed auth and headers")
    return found


_PROBE_PROFILE = ModelProfile(supports_tools=True, supports_json_schema_output=True, supports_json_object_output=True)
"""The profile of the `FunctionModel`s that ask pydantic-ai about the agent: one that takes every output mode, so
the agent's own `NativeOutput` is not refused by the probe (the run's real model decides for itself)."""


class _RawProbeModel(FunctionModel):
    """The describe probe's model: it sees the history as the run has it, not as rendered for a model.

    `Model.prepare_messages` renders parts for sending (an appending system prompt as its `<pyai:context>`
    element); the run records the parts themselves, and pydantic-ai renders them at each request (the model step).
    """

    def prepare_messages(self, messages: list[ModelMessage],
                         model_request_parameters: ModelRequestParameters | None = None) -> list[ModelMessage]:
        return messages


class _Probed(Exception):
    """Ends a probing run of the agent at the model request it was started for (its work is done by then)."""

    def __init__(self, messages: list[ModelMessage], info: AgentInfo) -> None:
        super().__init__("probe")
        self.messages, self.info = messages, info


def _output_spec(agent: Agent[Any, Any], info: AgentInfo) -> OutputSpec | None:
    """The agent's output as a run records it (`None`: `str` and no validators: the text is the answer).

    Read from the request pydantic-ai would send (the describe probe's): its output tools as the capabilities
    prepared them, its output mode and what else it allows.
    """
    if agent.output_type is str and not agent_settings(agent).has_output_validators:
        return None
    parameters = info.model_request_parameters
    return OutputSpec(mode=parameters.output_mode, tools=list(info.output_tools), object_def=parameters.output_object,
                      prompted_template=parameters.prompted_output_template or None,
                      allows_text=parameters.allow_text_output, allows_image=parameters.allow_image_output,
                      structured_text=parameters.output_mode in ("native", "prompted"),
                      end_strategy=agent.end_strategy)


def _last_prompt(messages: list[ModelMessage]) -> Any:
    """The run's latest user prompt (`ctx.prompt`), as pydantic-ai keeps it for the run."""
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    return part.content
    return None


_MARK = "durable-codemode: the output tool's return"


def _closing(result: AgentRunResult[Any]) -> dict[str, Any]:
    """What ends a run's messages after its output (`OutputVerdict.closing`, `.output_tool`), as pydantic-ai left it.

    pydantic-ai answers an output tool's call with a last request (`'Final result processed.'`); which output tool
    gave the output is found with its own public `all_messages(output_tool_return_content=...)`.
    """
    last = result.all_messages()[-1]
    if not isinstance(last, ModelRequest):
        return {}
    try:
        marked = result.all_messages(output_tool_return_content=_MARK)[-1]
    except (ValueError, LookupError):  # no output tool gave the output
        return {"closing": last}
    tool = next((p.tool_name for p in marked.parts if isinstance(p, ToolReturnPart) and p.content == _MARK), None)
    return {"closing": last, "output_tool": tool}


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def not_data_message(agent: str, kind: Any, error: Exception) -> str:
    """Why `kind` (a deps type) cannot be rebuilt from what a run records, naming the fields that are not data."""
    try:
        hints = typing.get_type_hints(kind)
    except Exception:  # an unresolvable annotation: name no field
        hints = {}
    bad: dict[str, str] = {}
    for field_name, hint in hints.items():
        try:
            _adapter(hint)
        except PydanticSchemaGenerationError:
            bad[field_name] = getattr(hint, "__qualname__", str(hint))
    cause = str(error).splitlines()[0]
    name = getattr(kind, "__qualname__", str(kind))
    if not bad:
        what = "it holds something that is not data"
        way = "a deps_factory that builds its deps on the worker"
    else:
        what = (f"its field{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} "
                f"hold{'s' if len(bad) == 1 else ''} a live resource, not data")
        built = ", ".join(f"{n}=run[{n!r}]" if n not in bad else f"{n}=<the worker's {bad[n]}>" for n in hints)
        way = f"a deps_factory that builds them on the worker, CodeModeAgent(agent, deps_factory=lambda run: " \
              f"{getattr(kind, '__name__', name)}({built}))"
    return (f"the deps of agent {agent!r} ({name}) cannot be rebuilt from what a run records: {what} ({cause}). A "
            f"run records its deps in its history, so only ids and settings; give the agent {way}, with the "
            "connections and clients the worker holds (docs/agents.md#deps-that-hold-connections)")


def _qualified_name(kind: Any) -> str | None:
    """`module.QualName` of a class (what `start_run` records of a deps value), `None` for other types."""
    if not isinstance(kind, type):
        return None
    return f"{kind.__module__}.{kind.__qualname__}"


def _provider_tools(tools: Sequence[AbstractNativeTool]) -> list[AbstractNativeTool]:
    """The provider tools a run records (`AgentSpec.native_tools`), from the probe's request: not tool search.

    pydantic-ai's `ToolSearch` adds an optional `ToolSearchTool` to a request whenever a tool is deferred
    (`defer_loading=True`); a durable run finds its deferred tools in the sandbox instead (`_deferred_catalog`),
    so it is left out. One a capability asks for outright (not optional) would search tools the run never sends
    the provider: refused, with the fix.
    """
    for tool in tools:
        if _is_tool_search(tool) and not tool.optional:
            raise CodeModeUserError(
                "a capability asks for the provider's own tool search (ToolSearchTool, not optional): a durable run "
                "sends the provider no deferred tools to search, since programs find them with search_tools in the "
                "sandbox; drop the ToolSearchTool (or the strategy of your ToolSearch capability)")
    return [tool for tool in tools if not _is_tool_search(tool)]


def _is_tool_search(tool: AbstractNativeTool) -> bool:
    """Whether `tool` is pydantic-ai's `ToolSearchTool` (which it does not export: told by its public `kind`)."""
    return tool.kind == "tool_search"


def _built_or_none(name: str) -> Model | None:
    """The model called `name` (a model string, as a response's `model_id` may be), or `None` if none can be built."""
    try:
        return build_model(name, subject="a model selector's previous model", whose="it", otherwise="")
    except (CodeModeUserError, ValueError, ImportError):  # e.g. `function:...`: a model object's id, not a name
        return None


def _catalog_of(tools: Sequence[ToolDefinition], own_stubs: Sequence[tuple[list[str], str]]) -> ToolCatalog:
    """The recorded catalog of `tools`, from their own stubs (`render_tool_stubs`), each type definition once."""
    types: dict[str, int] = {}
    entries = [CatalogEntry(name=tool.name, summary=tool_summary(tool), function=function,
                            types=[types.setdefault(t, len(types)) for t in definitions])
               for tool, (definitions, function) in zip(tools, own_stubs, strict=True)]
    return ToolCatalog(entries=entries, types=list(types))


ToolSelector = Sequence[str] | Callable[[ToolDefinition], bool]
"""Which tools the sandbox may call: a list of names, or a predicate on the tool definition."""

_METADATA_KEY = "codemode"
"""Per-tool options in a tool's pydantic-ai metadata: `metadata={'codemode': ToolOptions(...)}` (or a dict of
`ToolOptions` fields)."""


class CodeModeAgent:
    """A pydantic-ai agent that runs durably on Temporal, its tools called from `run_code` programs.

    Example:
        ```python
        class Cart(BaseModel):
            lines: int
            total_cents: int

        agent = Agent("openai:gpt-5", name="cart", instructions="You manage the user's cart.", output_type=Cart)

        @agent.tool_plain
        def list_cart(offset: int = 0) -> list[dict[str, int]]: ...  # a page of the cart's lines

        cart = CodeModeAgent(agent, limits=SnippetLimits(max_tool_calls=200))
        ```

    """

    def __init__(
        self,
        agent: Agent[AgentDepsT, Any],
        *,
        name: str | None = None,
        code_mode: bool = True,
        sandbox_tools: ToolSelector | None = None,
        tool_options: Mapping[str, ToolOptions] | None = None,
        default_tool_options: ToolOptions | None = None,
        limits: SnippetLimits | None = None,
        env_allowlist: Sequence[str] = (),
        deps: Any = None,
        deps_factory: Callable[[RunDepsT], AgentDepsT] | None = None,
        run_deps_type: type[RunDepsT] | None = None,
        files: RunFiles | None = None,
        catalog: CatalogSettings | None = None,
    ) -> None:
        """Wrap `agent`.

        Args:
            agent: The pydantic-ai agent: any `output_type` and output validators (checked durably, by the output
                activity), its deps type, instructions, tools and toolsets.
            name: The name runs use to pick this agent; defaults to `agent.name`. Part of every tool's activity
                type (`<name>.<tool>`), so keep it stable across deploys.
            code_mode: `False` turns code mode off: the model calls every tool directly (each call an activity).
            sandbox_tools: Which tools programs may call; the rest stay native (the model calls them directly).
                `None` (the default): all of them. A tool's own `in_sandbox` option wins over this.
            tool_options: Activity options per tool name, over `default_tool_options` and under nothing; a
                tool's `metadata={'codemode': ...}` is used when it has no entry here.
            default_tool_options: Options for tools with none of their own.
            limits: Bounds on each snippet and on the run; recorded when a run starts.
            env_allowlist: Environment variables the sandbox may read (`os.getenv`); their values are read on
                the worker when a run starts and recorded. Every other variable reads as unset.
            deps: The default deps (`ctx.deps` of tools, instructions and `prepare` functions) for runs started
                without `start_run(deps=...)`.
            deps_factory: Builds the agent's own `deps_type` on the worker, for deps that hold live resources (a
                connection, a client): called with what the run recorded (`start_run(deps=...)`: ids and
                settings; `None` when the run gave none) in every activity that needs `ctx.deps`, so it must be
                cheap: hand out resources the worker holds (opened before `create_worker`), do not open new ones.
                Only the recorded part is ever in the run's history. Exclusive with `deps`.
            run_deps_type: What a run records for `deps_factory`: the factory gets it validated as this type (a
                dataclass, `BaseModel`, `TypedDict`; `X | None` lets runs give none), and `start_run` given this
                `CodeModeAgent` checks it before anything starts. `None` (the default): the factory gets the
                recorded value as JSON (a dict for a dataclass or model), or `None`.
            files: A filesystem per run for the programs (`pathlib`, `open()` under `/files`), optionally seeded
                read-only from a folder on the worker; `None` (the default): programs have no files.
            catalog: When the sandbox tools are too many for the `run_code` description to carry every stub (by
                default past 40 tools or ~4,000 tokens of stubs): it then lists one line per tool, and programs
                call `search_tools(query)` and `describe_tool(name)` (see `CatalogSettings`). Decided when a run
                starts, and recorded.

        Raises:
            CodeModeUserError: on an agent without a name; capabilities with hooks of pydantic-ai's run loop
                other than tool, output and model-request hooks (each named, with why); `max_concurrency` or
                `metadata`; `DeferredToolRequests` output;
                or options for a tool name that does not exist, or a tool named `run_code`, `search_tools` or
                `describe_tool` (checked when the worker starts).

        """
        resolved = name or agent.name
        if not resolved:
            raise CodeModeUserError("the agent has no name: pass `Agent(..., name='cart')` or "
                                    "`CodeModeAgent(agent, name='cart')`; runs pick their agent by name")
        unsupported = _unsupported(agent)
        if unsupported:
            raise CodeModeUserError(
                f"agent {resolved!r} declares {' and '.join(unsupported)}, which a durable run does not apply yet "
                "(its run loop is durable-codemode's own, not pydantic-ai's): remove them from the agent, or run "
                "it with agent.run()")
        self.agent = agent
        self.name = resolved
        self.code_mode = code_mode
        self._selector = sandbox_tools
        self._tool_options = dict(tool_options or {})
        self._default_options = default_tool_options or ToolOptions()
        self.limits = limits or SnippetLimits()
        self.env_allowlist = tuple(env_allowlist)
        if deps_factory is not None and deps is not None:
            raise CodeModeUserError(
                f"agent {resolved!r} is given both deps and a deps_factory: the factory builds every run's deps "
                "(also for runs that give none: it gets None), so drop deps=")
        if run_deps_type is not None and deps_factory is None:
            raise CodeModeUserError(
                f"agent {resolved!r} is given run_deps_type without a deps_factory: run_deps_type is what a run "
                "records for the factory to build the agent's deps from; without one, runs record the agent's own "
                "deps_type")
        self.deps = deps
        self._deps_factory: Callable[[Any], Any] | None = deps_factory
        self._run_deps_type: Any = run_deps_type
        self.files = files
        self.catalog = catalog or CatalogSettings()
        self._hooked = bool(extra_capabilities(agent))
        """Whether tool calls go through the agent's capabilities' tool hooks (pydantic-ai's `ToolManager`)."""
        self._model_hooked = has_model_request_hooks(agent)
        """Whether a model request's hooks need the run's step and usage, and may retry or rewrite (`request`)."""
        self._model_selector = model_selector(agent)
        self._selected_models: dict[str, Model] = {}  # what the selector picked, by `model_id`, on this worker
        self._after_run_hooked = has_after_run_hooks(agent)
        self._run_error_hooked = has_run_error_hooks(agent)
        self._prepares_tools = has_prepare_tools_hooks(agent)
        self._wraps_toolsets = wraps_toolsets(agent)
        self._tools: dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]] | None = None

    def __repr__(self) -> str:
        return f"CodeModeAgent(name={self.name!r}, code_mode={self.code_mode})"

    # -- tools ------------------------------------------------------------------------------------------------

    @property
    def output_type(self) -> Any:
        """The type of this agent's output, for a client to rebuild a run's JSON output as (`run_agent`).

        pydantic-ai's output types of the agent's `output_type` (an output function's return type, a union of
        its members); `str` for a text agent.
        """
        kinds = output_types(self.agent.output_type)
        return kinds[0] if len(kinds) == 1 else Union[tuple(kinds)]  # noqa: UP007 (a union built at runtime)

    @property
    def deps_type(self) -> Any:
        """The agent's `deps_type` (pydantic-ai's default, `NoneType`, when it declares none)."""
        return self.agent.deps_type

    @property
    def run_deps_type(self) -> Any:
        """What a run records as its deps: `deps_type`; with a `deps_factory`, `run_deps_type` (else `Any`)."""
        if self._deps_factory is not None:
            return Any if self._run_deps_type is None else self._run_deps_type
        return self.deps_type

    def run_deps(self, raw: Any, *, type_name: str | None = None) -> Any:
        """A run's deps as its tools see them: `raw` (what the data converter decoded) rebuilt as `deps_type`.

        `None` means the run gave none: the `CodeModeAgent(deps=...)` default. An agent without a `deps_type`
        gets the value as decoded (plain JSON). With a `deps_factory`, the factory builds them from `raw`
        (`recorded_deps`), here on the worker.

        Raises:
            CodeModeUserError: the deps are of another type than the one a run records, do not validate as it (the
                message names both), or the `deps_factory` raised.

        """
        factory = self._deps_factory
        if factory is None:
            return self.deps if raw is None else self.recorded_deps(raw, type_name=type_name)
        recorded = self.recorded_deps(raw, type_name=type_name)
        try:
            return factory(recorded)
        except Exception as e:
            raise CodeModeUserError(f"the deps_factory of agent {self.name!r} failed for the run's deps {raw!r}: "
                                    f"{type(e).__name__}: {e}") from e

    def recorded_deps(self, raw: Any, *, type_name: str | None = None) -> Any:
        """What a run recorded as its deps, checked and rebuilt as `run_deps_type` (no `deps_factory` called).

        `start_run` checks a run's deps with it before anything starts, when it is given the `CodeModeAgent`.

        Raises:
            CodeModeUserError: as `run_deps`, or the type cannot be rebuilt from data at all (a field holds a
                connection or client): the message names the field and says to give the agent a `deps_factory`.

        """
        expected = self.run_deps_type
        if expected is type(None) or expected is Any or (raw is None and self._deps_factory is None):
            return raw
        wanted = _qualified_name(expected)
        whose = "its run_deps_type" if self._deps_factory is not None else "its deps_type"
        if type_name is not None and wanted is not None and type_name != wanted:
            raise CodeModeUserError(
                f"agent {self.name!r} takes deps of type {wanted} ({whose}), but the run was started with "
                f"deps of type {type_name}: pass a {getattr(expected, '__name__', wanted)} as start_run(deps=...)")
        try:
            adapter = _adapter(expected)
        except PydanticSchemaGenerationError as e:
            raise CodeModeUserError(not_data_message(self.name, expected, e)) from e
        try:
            return adapter.validate_python(raw)
        except ValidationError as e:
            raise CodeModeUserError(
                f"the run's deps do not validate as {wanted or expected!r}, {whose} of agent {self.name!r}: "
                f"{e.error_count()} error(s), first: {e.errors()[0]['msg']} at {e.errors()[0]['loc']}") from e

    @property
    def builds_deps(self) -> bool:
        """Whether every run's deps are built on the worker (`deps_factory`), even a run that recorded none."""
        return self._deps_factory is not None

    def _run_context(self, *, tool_name: str | None = None, call_id: str | None = None,
                     attempt: int = 1, max_retries: int | None = None, deps: Any = None) -> RunContext[Any]:
        """The `RunContext` pydantic-ai would give a tool, a `prepare` function or a hook of this run, on the worker.

        `max_retries`: the tool's own budget (`ToolsetTool.max_retries`) for a tool call; elsewhere the agent's
        tool budget, which a toolset listing its tools gives those without one of their own.
        """
        model = self.agent.model
        run_id = activity.info().workflow_id if activity.in_activity() else None  # the durable run's id
        ctx = RunContext(
            deps=self.deps if deps is None else deps,
            model=model if isinstance(model, Model) else infer_model(model or "test"),
            usage=RunUsage(),
            agent=self.agent,
            tool_name=tool_name,
            tool_call_id=call_id,
            retry=attempt - 1,
            retries={tool_name: attempt - 1} if tool_name else {},
            max_retries=agent_settings(self.agent).tool_retries if max_retries is None else max_retries,
            run_id=run_id, conversation_id=run_id,  # a durable run is one conversation, continued as new or not
            capabilities=registered_capabilities(self.agent),
        )
        validation = self.agent.validation_context
        return replace(ctx, validation_context=validation(ctx) if callable(validation) else validation)

    async def tools(
        self, ctx: RunContext[Any] | None = None
    ) -> dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]]:
        """The agent's tools by name, with the toolset that runs each.

        With a run's context (its deps), as that run sees them: `prepare` functions may depend on the deps. Without,
        with the default deps, read once per worker.
        """
        if ctx is not None:
            return await self._read_tools(ctx)
        if mcp_toolsets(self.agent.toolsets):
            # Not cached here: an MCP server's tool list may change while the worker runs (the toolset keeps it
            # until the server says it changed, or it reconnects), and a new run must record the new one.
            return await self._read_tools(self._run_context())
        if self._tools is None:
            self._tools = await self._read_tools(self._run_context())
        return self._tools

    async def _read_tools(self, ctx: RunContext[Any]) -> dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]]:
        found: dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]] = {}
        # Each toolset on its own (a call goes to the one that has the tool), unless a capability wraps them all.
        toolsets = [await run_toolset(self.agent, ctx)] if self._wraps_toolsets else [
            await toolset.for_run(ctx) for toolset in self.agent.toolsets]  # a dynamic toolset is built for the run
        for toolset in toolsets:
            for tool_name, tool in (await toolset.get_tools(ctx)).items():
                if mcp_toolsets([tool.toolset]):  # stubs and native calls describe the value a call returns
                    tool = replace(tool, tool_def=as_received(tool.tool_def))
                found[tool_name] = (toolset, tool)
        if RUN_CODE_TOOL in found and self.code_mode:
            raise CodeModeUserError(f"agent {self.name!r} has a tool named {RUN_CODE_TOOL!r}, the name code "
                                    "mode gives its own tool: rename it")
        private = sorted(name for name, (_, tool) in found.items()
                         if name.startswith("_") and self._in_sandbox(tool.tool_def, self.options_for(tool.tool_def)))
        if private:
            raise CodeModeUserError(
                f"agent {self.name!r} has sandbox tools whose names start with '_' ({', '.join(private)}): programs "
                "cannot call them, since the sandbox's type checker takes such names for private ones. Rename them "
                "(`Tool(fn, name=...)`), or make them native tools (ToolOptions(in_sandbox=False))")
        taken = sorted(CATALOG_FUNCTIONS & set(found)) if self.code_mode and self.catalog.mode != "stubs" else []
        if taken:
            raise CodeModeUserError(
                f"agent {self.name!r} has a tool named {taken[0]!r}, the name of a function programs use to search "
                "a large tool catalog (`CatalogSettings`): rename the tool, or keep every stub in the run_code "
                "description with CodeModeAgent(catalog=CatalogSettings(mode='stubs'))")
        unknown = sorted(set(self._tool_options) - set(found))
        if unknown:
            raise CodeModeUserError(f"tool_options of agent {self.name!r} name tools it does not have: "
                                    f"{unknown}; its tools are {sorted(found)}")
        return found

    def options_for(self, tool: ToolDefinition) -> ToolOptions:
        """The options of `tool`: its `tool_options` entry, else its metadata, else the defaults."""
        if tool.name in self._tool_options:
            return self._tool_options[tool.name]
        meta = (tool.metadata or {}).get(_METADATA_KEY)
        if (isinstance(meta, ToolOptions) and meta.approval_rule is not None) or (
                isinstance(meta, Mapping) and meta.get("approval_rule") is not None):
            raise CodeModeUserError(
                f"tool {tool.name!r} sets approval_rule in its metadata; workflow code must find the rule without "
                "reading the tools, so give it in CodeModeAgent(tool_options={...: ToolOptions(approval_rule=...)})"
            )
        if isinstance(meta, ToolOptions):
            return meta
        if isinstance(meta, Mapping):
            try:
                return replace(self._default_options, **meta)
            except TypeError as e:
                raise CodeModeUserError(
                    f"metadata['{_METADATA_KEY}'] of tool {tool.name!r} is not valid ToolOptions: {e}; valid keys: "
                    f"{sorted(asdict(self._default_options))}"
                ) from e
        return self._default_options

    def approval_rule_for(self, tool: str) -> Callable[[dict[str, Any]], bool] | None:
        """The approval rule of `tool`: from `tool_options`, else `default_tool_options` (not from metadata)."""
        return (self._tool_options.get(tool) or self._default_options).approval_rule

    def _in_sandbox(self, tool: ToolDefinition, options: ToolOptions) -> bool:
        if not self.code_mode:
            return False
        if options.in_sandbox is not None:
            return options.in_sandbox
        if self._selector is None:
            return True
        if callable(self._selector):
            return bool(self._selector(tool))
        return tool.name in self._selector

    # -- activity bodies --------------------------------------------------------------------------------------

    async def describe(self, raw_deps: Any = None, *, deps_type: str | None = None,
                       model: str | None = None, authority: ApprovalAuthority | None = None,
                       instructions: str | None = None, prompt: str | None = None) -> AgentSpec:
        """The spec a run records at its start: instructions, tool definitions, stubs, limits, environment.

        Dynamic instructions and tools' `prepare` functions see the run's deps (`run_deps`). The run's model
        (`model`, else the agent's) is built first, so one that cannot work fails the run before any model request.
        With the worker's approval `authority`, tools' approver policies are recorded with their groups resolved,
        and a run whose calls could never be approved on this worker is refused. The run's own `instructions` are
        added to the agent's, as `Agent.run(instructions=...)` adds them.

        The capabilities' `before_run` hooks run here, first, with the run's prompt and deps: this is the run's
        start, before any model request or tool call, so a guardrail that raises ends the run there (and once:
        a continued run does not describe again).

        Raises:
            GuardrailError: a `before_run` hook raised (its exception is the cause).

        """
        chosen = self.resolve_model(model)
        deps = self.run_deps(raw_deps, type_name=deps_type)
        try:
            await run_before_run(self.agent, replace(self._run_context(deps=deps), model=chosen, prompt=prompt,
                                                     run_step=0))
        except Exception as e:
            raise GuardrailError(f"a before_run hook of agent {self.name!r} stopped the run before it started: "
                                 f"{type(e).__name__}: {e}") from e

        def capture(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            raise _Probed(messages, info)

        # Asking pydantic-ai what it would send the model resolves static and dynamic instructions (and system
        # prompts, static and from `@agent.system_prompt` functions, with the run's deps) and the output tools
        # exactly as an ordinary run does, using its public API (`probing` masks the run and model-request hooks,
        # which run once, where they belong, through a private override slot pinned by tests/test_compat.py).
        try:
            with probing(self.agent, preparing=True):
                await self.agent.run(prompt or "", model=_RawProbeModel(capture, profile=_PROBE_PROFILE), deps=deps,
                                     instructions=instructions)
            raise AssertionError("the probing run ended without a model request")
        except _Probed as probed:
            info = probed.info
            system_parts = [part for message in probed.messages if isinstance(message, ModelRequest)
                            for part in message.parts if isinstance(part, SystemPromptPart)]
            system_prompts = [part.content for part in system_parts]
            dynamic_prompts = [DynamicPrompt(index=i, ref=part.dynamic_ref, context_id=part.context_id)
                               for i, part in enumerate(system_parts) if part.dynamic_ref]
        tools = (await self.tools(self._run_context(deps=deps)) if raw_deps is not None or self.builds_deps
                 else await self.tools())
        if self._prepares_tools:  # the probe's request went through them: keep the tools they left, as they left them
            # The request's parameters, not `info.function_tools`: those leave out the deferred tools
            # (`defer_loading=True`), which `ToolSearch` hides from the model only after the hooks prepared them.
            prepared = {d.name: d for d in info.model_request_parameters.function_tools}
            tools = {name: (toolset, replace(tool, tool_def=as_received(prepared[name]) if mcp_toolsets([tool.toolset])
                                             else prepared[name]))
                     for name, (toolset, tool) in tools.items() if name in prepared}
        specs: list[ToolSpec] = []
        sandbox_defs: list[ToolDefinition] = []
        native_defs: list[ToolDefinition] = []
        for tool_name, (_toolset, tool) in tools.items():
            options = self.options_for(tool.tool_def)
            in_sandbox = self._in_sandbox(tool.tool_def, options)
            if tool.tool_def.defer_loading and not in_sandbox:
                raise CodeModeUserError(
                    f"tool {tool_name!r} of agent {self.name!r} has defer_loading=True but is offered to the model "
                    "directly (not in the sandbox): a durable run offers its direct tools from its start and has no "
                    "tool search for them; let programs call it (they find deferred tools with search_tools), or "
                    "drop defer_loading=True")
            (sandbox_defs if in_sandbox else native_defs).append(tool.tool_def)
            requires_approval = options.requires_approval or tool.tool_def.kind == "unapproved"
            if options.batch and requires_approval:
                raise CodeModeUserError(
                    f"tool {tool_name!r} of agent {self.name!r} has ToolOptions(batch=True) but needs approval "
                    "(pydantic-ai's requires_approval=True on the tool): a call waiting for a person cannot share a "
                    "batch with calls that run at once; drop batch=True for it, or its requires_approval")
            specs.append(ToolSpec(name=tool_name, activity_type=tool_activity_type(self.name, tool_name),
                                  in_sandbox=in_sandbox, timeout=options.timeout,
                                  retry_policy=options.retry_policy, local=options.local,
                                  requires_approval=requires_approval,
                                  approval_rule=options.approval_rule is not None,
                                  approval_timeout=options.approval_timeout,
                                  heartbeat_timeout=options.heartbeat_timeout,
                                  approvers=self._approvers(tool_name, options, authority,
                                                            requires_approval or options.approval_rule is not None),
                                  max_retries=tool.max_retries, batch=options.batch and in_sandbox,
                                  schema_digest=schema_digest(tool.tool_def) if mcp_toolsets([tool.toolset]) else None,
                                  child_run=self._child_run(tool.tool_def, options)))
        stubs, own_stubs = render_tool_stubs(sandbox_defs)
        files = files_spec(self.name, self.files) if self.files is not None and self.code_mode else None
        catalog = index = deferred = None
        shown_stubs = stubs
        if self.code_mode and self.catalog.wants_index(tools=len(sandbox_defs), stub_tokens=estimate_tokens(stubs)):
            catalog = _catalog_of(sandbox_defs, own_stubs)
            pairs = [(e.name, e.summary) for e in catalog.entries]
            index = index_section(pairs)
            if estimate_tokens(index) > self.catalog.max_stub_tokens:  # even the index is over budget: names only
                index = index_section(pairs, summaries=False)
        elif any(d.defer_loading for d in sandbox_defs):
            catalog, shown_stubs, deferred = self._deferred_catalog(sandbox_defs, own_stubs)
        model_tools = ([run_code_tool_definition(shown_stubs, self.limits, index, files=files, deferred=deferred)]
                       if self.code_mode else []) + native_defs
        own = self.agent.model
        return AgentSpec(
            agent=self.name,
            model_name=own.model_name if isinstance(own, Model) else str(own),
            instructions=info.instructions,
            system_prompts=system_prompts,
            dynamic_prompts=dynamic_prompts,
            code_mode=self.code_mode,
            model_tools=model_tools,
            tools=specs,
            stubs=stubs,
            limits=self.limits,
            env={k: os.environ[k] for k in self.env_allowlist if k in os.environ},
            sandbox_guards=True,
            compute_escalation=True,
            records_type_check_rejections=True, seeds_before_model_request=self.code_mode,
            model_request_hooks=self._model_hooked, counts_failed_attempts=True,
            after_run_hooks=self._after_run_hooked, run_error_hooks=self._run_error_hooked,
            signed_approvals=authority is not None and not authority.unsigned,
            output=_output_spec(self.agent, info),
            native_tools=_provider_tools(info.model_request_parameters.native_tools),
            files=files,
            catalog=catalog,
        )

    def _deferred_catalog(self, tools: Sequence[ToolDefinition], own_stubs: Sequence[tuple[list[str], str]]
                          ) -> tuple[ToolCatalog, str, str]:
        """The catalog of `tools`, the stubs of those not deferred (`defer_loading=True`), and the section on them.

        pydantic-ai's `ToolSearch` hides a deferred tool from the model until a search finds it. Here the
        `run_code` description shows the other tools' stubs and only says how many are hidden, and programs find
        them with `search_tools` / `describe_tool`, answered from the recorded catalog as for a large one (which
        holds every tool, so `describe_tool` knows the shown ones too). The type checker knows every tool's stub,
        so a found tool is called like any other.
        """
        if self.catalog.mode == "stubs":
            names = ", ".join(repr(t.name) for t in tools if t.defer_loading)
            raise CodeModeUserError(
                f"agent {self.name!r} has tools with defer_loading=True ({names}), but its "
                "CatalogSettings(mode='stubs') shows every tool's stub in the run_code description: drop "
                "defer_loading=True from them, or the mode='stubs' (then programs find them with search_tools)")
        shown = [own for tool, own in zip(tools, own_stubs, strict=True) if not tool.defer_loading]
        hidden = len(tools) - len(shown)
        return (_catalog_of(tools, own_stubs), stubs_of(shown) if shown else "",
                deferred_section(hidden, shown=bool(shown)))

    def _child_run(self, tool: ToolDefinition, options: ToolOptions) -> str | None:
        """The agent a `child_run_tool` starts as a child run, as a run records it (`ToolSpec.child_run`)."""
        child = (tool.metadata or {}).get(CHILD_RUN_METADATA)
        if child is None:
            return None
        if options.local or options.batch:
            raise CodeModeUserError(
                f"tool {tool.name!r} of agent {self.name!r} runs agent {child!r} as a child run, which is a workflow, "
                "not an activity: drop ToolOptions(local=True) / batch=True for it")
        return str(child)

    def _approvers(self, tool: str, options: ToolOptions, authority: ApprovalAuthority | None,
                   gated: bool) -> RecordedApproverPolicy | None:
        """The approver policy `tool`'s calls are decided under, as the run records it (groups resolved now)."""
        if options.approvers is not None and not gated:
            raise CodeModeUserError(f"tool {tool!r} of agent {self.name!r} names approvers, but its calls need no "
                                    "approval: set requires_approval=True or an approval_rule in its ToolOptions")
        if authority is None or not gated:
            return None
        authority.check_can_decide(self.name)
        return authority.directory.resolve(options.approvers) if options.approvers is not None else None

    def check_model(self) -> None:
        """Build the agent's model if it is a string, so one that cannot work stops the worker from starting.

        pydantic-ai builds a model given as a string when the agent is built, unless `defer_model_check=True`;
        this is that check, on the worker (where the key must be), not in every process importing the agent. The
        models a `ModelFallback` names are checked too: a fallback that cannot work would fail only once needed.

        Raises:
            CodeModeUserError: the provider's API key is not set here, the model is unknown, or its provider's
                package is not installed (the message names the variable or the package).

        """
        model = self.agent.model
        if isinstance(model, str):
            build_model(model, subject=f"agent {self.name!r}", whose="its model",
                        otherwise="give the agent another model (every run then uses start_run(model=...))")
        for name in fallback_model_names(self.agent):
            self._fallback_model(name)

    def resolve_model(self, override: str | None) -> Model:
        """The model for a request: the run's model string if it has one, else the agent's model.

        Raises:
            CodeModeUserError: no model at all, or one that cannot work here (`check_model`): not retried.

        """
        chosen = override or self.agent.model
        if chosen is None:
            raise CodeModeUserError(f"agent {self.name!r} has no model: pass one to Agent(...) or start the run "
                                    "with a model string (e.g. `--model openai:gpt-5`)")
        if isinstance(chosen, Model):
            return chosen
        return build_model(chosen, subject=f"agent {self.name!r}", whose="the run's model" if override else "its model",
                           otherwise="start the run with another model (start_run(model=...), codemode run --model)")

    def _fallback_model(self, name: str) -> Model:
        """The model a capability's `RetryModelRequest` names (`ModelFallback`'s next candidate), built here."""
        return build_model(name, subject=f"agent {self.name!r}", whose="a fallback model",
                           otherwise="give the capability a model that works on this worker")

    async def request(self, override: str | None, messages: list[ModelMessage], tools: list[ToolDefinition], *,
                      deps: Any = None, model_settings: Mapping[str, Any] | None = None,
                      output: OutputSpec | None = None, native_tools: Sequence[AbstractNativeTool] = (),
                      hooked: bool = False, usage: RunUsage | None = None, run_step: int | None = None,
                      output_retries: int = 0) -> ModelStep:
        """The run's next model request, made by pydantic-ai's own graph for one step (`_model_step.model_step`).

        With the recorded tool definitions, output tools, provider tools and instructions; the run's deps and model
        settings (layered over the agent's and its capabilities' by pydantic-ai). `hooked` runs told a model-request
        hook the run's step, usage and output retries (`AgentSpec.model_request_hooks`); others need none. A model
        selector (`SelectModel`) picks the step's model first, unless the run has a model of its own (as
        `Agent.run(model=...)`), in this activity, so a replay never asks it again.
        """
        model = self.resolve_model(override)
        history = list(messages)
        run_deps = self.run_deps(deps)
        if self._model_selector is not None and override is None:
            model = await self._selected_model(model, history, run_deps, run_step or 1, output_retries,
                                               usage or RunUsage())
        return await model_step(
            self.agent, extra_capabilities(self.agent), model=model, messages=history, tools=tools,
            native_tools=native_tools, output=output, deps=run_deps,
            model_settings=cast(ModelSettings, dict(model_settings)) if model_settings else None,
            usage=usage if hooked else None, run_step=run_step if hooked else None,
            output_retries=output_retries, run_id=activity.info().workflow_id if activity.in_activity() else None,
            instrumentation=instrumentation.settings if (instrumentation := instrumentation_of(self.agent)) else None)

    async def _selected_model(self, default: Model, history: list[ModelMessage], deps: Any, run_step: int,
                              output_retries: int, usage: RunUsage) -> Model:
        """The model a selector (`SelectModel`) picks for this step.

        It gets pydantic-ai's `ModelSelectionContext`: on the first step the agent's model, then the one that
        answered the step before, as the last response recorded it (`model_id`): one this worker's selector picked,
        or one built again from its name, else (picked as an object on another worker) the agent's. It runs in
        the model activity, so what it picked is the recorded response's, and a replay never asks it again. A name
        is built here, with the same key checks as the agent's model (a missing key fails the run, not retried).
        """
        assert self._model_selector is not None
        previous = next((m for m in reversed(history) if isinstance(m, ModelResponse)), None)
        lower = default
        if previous is not None and previous.model_id and previous.model_id != default.model_id:
            lower = self._selected_models.get(previous.model_id) or _built_or_none(previous.model_id) or default
        selection = self._model_selector(ModelSelectionContext(
            agent=self.agent, deps=deps, model=lower, run_step=run_step, prompt=_last_prompt(history),
            messages=list(history), usage=usage, retry=output_retries,
            max_retries=agent_settings(self.agent).output_retries,
            run_id=activity.info().workflow_id if activity.in_activity() else None))
        if inspect.isawaitable(selection):
            selection = await selection
        if isinstance(selection, Model):
            self._selected_models[selection.model_id] = selection
            return selection
        return build_model(selection, subject=f"agent {self.name!r}", whose="the model its SelectModel picked",
                           otherwise="have the selector pick a model that works on this worker")

    async def check_output(self, messages: list[ModelMessage], response: ModelResponse, *, retries: int,
                           deps: Any = None, model_settings: Mapping[str, Any] | None = None) -> OutputVerdict:
        """Check `response` as pydantic-ai's own run would: the output type, output functions, output validators.

        The agent runs for one step on a model that answers `response`: pydantic-ai validates it (and runs the
        validators, which may do I/O: this is an activity) and either ends with the output, or asks the model again
        with its retry request, which is what we return. The run's retry count is set first, so validators see the
        durable run's `ctx.retry`, and a rejection past the budget raises pydantic-ai's `UnexpectedModelBehavior`.
        """
        asked = 0

        def answer(history: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            nonlocal asked
            asked += 1
            if asked == 1:
                return response
            raise _Probed(history, info)

        model = FunctionModel(answer, profile=_PROBE_PROFILE)
        try:
            with probing(self.agent):
                async with self.agent.iter(message_history=messages, model=model, deps=self.run_deps(deps),
                                           model_settings=cast(ModelSettings | None, model_settings)) as run:
                    start_step(run, output_retries=retries)
                    node: Any = run.next_node
                    while not isinstance(node, End):
                        if isinstance(node, CallToolsNode):  # its tool manager is the step's: count on it too
                            start_step(run, output_retries=retries)
                        node = await run.next(node)
        except _Probed as probed:
            last = probed.messages[-1]
            assert isinstance(last, ModelRequest), "pydantic-ai asked again without a request"
            return OutputVerdict(retry=last)
        assert run.result is not None
        return OutputVerdict(output=jsonable(run.result.output), **_closing(run.result))

    async def after_run(self, override: str | None, messages: list[ModelMessage], output: Any, usage: RunUsage, *,
                        deps: Any = None) -> Any:
        """The run's output (JSON) after the capabilities' `after_run` hooks, which may replace it.

        They get what `agent.run()` gives them: the run's context (deps, history, usage, model) and an
        `AgentRunResult` whose `output` is the decided output rebuilt as the agent's output type, whose
        `all_messages()` is the run's history and whose `usage` its usage.
        """
        ctx = self._ending_context(override, messages, usage, deps)
        typed = _adapter(self.output_type).validate_python(output)
        return jsonable(await run_after_run(self.agent, ctx, agent_run_result(typed, messages, usage)))

    async def on_run_error(self, override: str | None, messages: list[ModelMessage], usage: RunUsage,
                           error: BaseException, *, deps: Any = None) -> Any:
        """The output (JSON) with which the capabilities' `on_run_error` hooks recover a failed run.

        They get what `agent.run()` gives them: the run's context (deps, history, usage, model) and the error
        (`run_failure`). What they raise propagates; `error` itself when none of them recovers the run.
        """
        return jsonable(await run_on_run_error(self.agent, self._ending_context(override, messages, usage, deps),
                                               error))

    def _ending_context(self, override: str | None, messages: list[ModelMessage], usage: RunUsage,
                        deps: Any) -> RunContext[Any]:
        """The `RunContext` a run's end hooks get (`after_run`, `on_run_error`): deps, history, usage, model."""
        return replace(self._run_context(deps=self.run_deps(deps)), model=self.resolve_model(override),
                       messages=list(messages), usage=usage, prompt=_last_prompt(messages))

    async def call_tool(self, tool_name: str, args: dict[str, Any], *, call_id: str, attempt: int,
                        deps: Any = None, recorded_schema: str | None = None, usage: RunUsage | None = None) -> Any:
        """Validate `args` and run the tool; its exceptions propagate unchanged (the caller classifies them).

        `recorded_schema`: the MCP tool's `schema_digest` as the run recorded it, when it did. `usage`: the tool's
        `ctx.usage`, which holds afterwards what the tool added (a sub-agent run with `usage=ctx.usage`), for the
        run to count (`_tool_usage`); pydantic-ai's own count of this call is left out, the run counted it.

        Raises:
            KeyError: the agent has no tool called `tool_name`.
            TypeError: an MCP tool's schemas are not the ones the run recorded (the call is not made).
            ValueError: the arguments do not match the tool's schema (a pydantic `ValidationError`).

        """
        run_deps = self.run_deps(deps)
        try:
            tools = (await self.tools(self._run_context(deps=run_deps)) if deps is not None or self.builds_deps
                     else await self.tools())
        except Exception as e:
            reconnect_lost(self.agent.toolsets, e, subject=f"the tools of agent {self.name!r}")
            raise
        if tool_name not in tools:
            if mcp_toolsets(self.agent.toolsets):
                raise KeyError(
                    f"agent {self.name!r} has no tool {tool_name!r} now, though it had when the run started: the "
                    f"tool list of its MCP servers changed since (its tools now: {sorted(tools)}). Runs started "
                    "from now on see the new list; this run's programs were checked against the old one")
            raise KeyError(f"agent {self.name!r} has no tool {tool_name!r}")
        toolset, tool = tools[tool_name]
        if recorded_schema is not None and schema_digest(tool.tool_def) != recorded_schema:
            raise TypeError(
                f"MCP tool {tool_name!r} of agent {self.name!r} changed since the run started: its server now "
                "describes other arguments or another result than the stub this run's programs were checked "
                "against, so the call was not made. Runs started from now on see the new schema; start a new run "
                "to use it")
        ctx = self._run_context(tool_name=tool_name, call_id=call_id, attempt=attempt, max_retries=tool.max_retries,
                                deps=run_deps)
        if usage is not None:
            ctx = replace(ctx, usage=usage)
        instrumentation = instrumentation_of(self.agent)
        try:
            if self._hooked or instrumentation is not None:
                ctx = instrumented_context(ctx, instrumentation)
                result = jsonable(await call_through_hooks(self.agent, ctx, tool_name, args))
                if usage is not None and usage.tool_calls:  # pydantic-ai's ToolManager counted this call itself
                    usage.tool_calls -= 1
                return result
            validated = tool.args_validator.validate_python(args, context=ctx.validation_context)
            return jsonable(await toolset.call_tool(tool_name, validated, ctx, tool))
        except Exception as e:
            reconnect_lost([tool.toolset], e, subject=f"{tool_name}() of agent {self.name!r}")
            raise

