"""`CodeModeAgent`: a `pydantic_ai.Agent` made durable: the user's configuration of it, checked when it is built.

The agent stays an ordinary pydantic-ai agent (model, instructions, tools declared with `@agent.tool_plain`,
`Tool(...)` or a `FunctionToolset`); this wrapper adds what the durable run needs to know: which tools the
sandbox may call, their activity options, the snippet limits, the environment the sandbox may read, and how a
run's deps are built on the worker. What pydantic-ai does not apply in a durable run is refused here, by name.

The activities that serve it each have a module of their own: `_describe` (a run's start), `_model_requests`,
`_tool_calls` and `_run_outcome` (the output check, the end hooks).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any, TypeVar, Union

from pydantic import PydanticSchemaGenerationError, ValidationError
from pydantic_ai import Agent, DeferredToolRequests, PendingModelResponse, RunContext
from pydantic_ai.models import Model, infer_model
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RunUsage
from temporalio import activity

from .._models import build_model
from .._pydantic_ai import (
    agent_settings,
    output_types,
    resolves_per_run,
)
from ..shared._config import CatalogSettings, SnippetLimits, ToolOptions
from ..shared._errors import CodeModeUserError, DepsFactoryError, TransientToolError
from ..shared._files import RunFiles
from ..shared._names import RUN_CODE_TOOL
from ..shared._results import clip
from ..shared._run_events import EventStreamSettings
from ..workflow._catalog import CATALOG_FUNCTIONS
from ._capabilities import (
    CapabilityUse,
    fallback_model_names,
    model_selector,
    registered_capabilities,
    run_toolset,
    unapplied_hooks,
    unsupported_model_wrappers,
    unsupported_tool_search,
)
from ._deps import (
    TRANSIENT_DEPS_ERRORS,
    CallDeps,
    callable_name,
    not_data_message,
    not_deps_type,
    qualified_name,
    type_adapter,
    type_label,
)
from ._mcp import as_received, mcp_toolsets

__all__ = ["CodeModeAgent", "ToolSelector"]

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
        stream: bool | EventStreamSettings = False,
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
                settings; `None` when the run gave none) once in each activity that may read `ctx.deps` (the
                run's start, each model request, each tool call or batch, the output check), so it must be cheap:
                hand out resources the worker holds (opened before `create_worker`), do not open new ones. An
                `async def` factory is awaited, a plain one runs in a worker thread; it must return a `deps_type`
                (checked); its transient errors (`ConnectionError`, `TransientToolError`) are retried with the
                activity, others are final (`DepsFactoryError`). Only the recorded part is ever in the run's
                history. Exclusive with `deps`.
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
            stream: Whether the agent's runs stream their events live (`durable_codemode.stream_events`: the
                model's tokens, each nested call as it starts and ends, prints, approvals, child runs), and how
                (`EventStreamSettings`; `True`: the defaults). A run may say otherwise (`start_run(stream=...)`).
                Recorded when a run starts. Off, a run costs nothing for it; on, a model request adds a signal
                (one history event) per batch interval while the model streams (docs/streaming.md).

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
        if not isinstance(stream, (bool, EventStreamSettings)):
            raise CodeModeUserError(f"agent {resolved!r}: stream must be True, False or EventStreamSettings(...), got "
                                    f"{type(stream).__name__}")
        self.stream: EventStreamSettings | None = (
            stream if isinstance(stream, EventStreamSettings) else EventStreamSettings() if stream else None)
        """How the agent's runs stream their events (`None`: they do not, unless a run asks)."""
        self.capability_use = CapabilityUse.of(agent)
        """Where the agent's own capabilities act in a durable run (read once: the worker's activities consult it)."""
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

    async def build_deps(self, raw: Any, *, type_name: str | None = None) -> Any:
        """A run's deps as its tools see them: `raw` (what the data converter decoded) rebuilt as `deps_type`.

        Called at most once per activity (the caller hands the result to everything the activity runs). `None`
        means the run gave none: the `CodeModeAgent(deps=...)` default. An agent without a `deps_type` gets the
        value as decoded (plain JSON). With a `deps_factory`, the factory builds them from `raw`
        (`recorded_deps`), here on the worker: an `async def` factory is awaited; a plain one runs in a worker
        thread, as pydantic-ai runs a plain tool, so a slow one holds up no other run on the worker. What it
        returns must be an instance of the agent's `deps_type`.

        Raises:
            CodeModeUserError: the deps are of another type than the one a run records, do not validate as it (the
                message names both), or the `deps_factory` failed for good or returned another type than the
                agent's `deps_type` (`DepsFactoryError`, naming the factory): the activity is not retried.
            TransientToolError: the `deps_factory` raised a transient error (`ConnectionError`,
                `TransientToolError`): the activity is retried as for its own transient failures.

        """
        factory = self._deps_factory
        if factory is None:
            return self.deps if raw is None else self.recorded_deps(raw, type_name=type_name)
        recorded = self.recorded_deps(raw, type_name=type_name)
        named = callable_name(factory)
        try:
            if inspect.iscoroutinefunction(factory):
                built = await factory(recorded)
            else:
                built = await asyncio.to_thread(factory, recorded)
                if inspect.isawaitable(built):  # a callable object or partial whose __call__ is async
                    built = await built
        except TRANSIENT_DEPS_ERRORS as e:
            raise TransientToolError(
                f"the deps_factory of agent {self.name!r} ({named}) failed for the run's deps "
                f"{clip(repr(raw), 200)} with a transient error, {type(e).__name__}: {e}; the step is tried "
                "again") from e
        except Exception as e:
            raise DepsFactoryError(
                f"the deps_factory of agent {self.name!r} failed for the run's deps {clip(repr(raw), 200)}: "
                f"{type(e).__name__}: {e} (the factory: {named}); fix the factory, or raise TransientToolError "
                "from it for a failure worth retrying") from e
        problem = not_deps_type(built, self.deps_type)
        if problem is not None:
            raise DepsFactoryError(
                f"the deps_factory of agent {self.name!r} ({named}) returned {problem}: it must build the agent's "
                f"deps_type, e.g. return {type_label(self.deps_type)}(...) built from what the run recorded")
        return built

    async def deps_for_calls(self, raw: Any) -> CallDeps:
        """A run's deps for its tool calls (`build_deps`), built once for all the calls of one activity (a batch)."""
        return CallDeps(value=await self.build_deps(raw), own=raw is not None or self.builds_deps)

    def recorded_deps(self, raw: Any, *, type_name: str | None = None) -> Any:
        """What a run recorded as its deps, checked and rebuilt as `run_deps_type` (no `deps_factory` called).

        `start_run` checks a run's deps with it before anything starts, when it is given the `CodeModeAgent`.

        Raises:
            CodeModeUserError: as `build_deps`, or the type cannot be rebuilt from data at all (a field holds a
                connection or client): the message names the field and says to give the agent a `deps_factory`.

        """
        expected = self.run_deps_type
        if expected is type(None) or expected is Any or (raw is None and self._deps_factory is None):
            return raw
        wanted = qualified_name(expected)
        whose = "its run_deps_type" if self._deps_factory is not None else "its deps_type"
        if type_name is not None and wanted is not None and type_name != wanted:
            raise CodeModeUserError(
                f"agent {self.name!r} takes deps of type {wanted} ({whose}), but the run was started with "
                f"deps of type {type_name}: pass a {getattr(expected, '__name__', wanted)} as start_run(deps=...)")
        try:
            adapter = type_adapter(expected)
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

    def run_context(self, *, tool_name: str | None = None, call_id: str | None = None,
                     attempt: int = 1, max_retries: int | None = None, deps: Any = None,
                     usage: RunUsage | None = None) -> RunContext[Any]:
        """The `RunContext` pydantic-ai would give a tool, a `prepare` function or a hook of this run, on the worker.

        `max_retries`: the tool's own budget (`ToolsetTool.max_retries`) for a tool call; elsewhere the agent's
        tool budget, which a toolset listing its tools gives those without one of their own. `usage`: the
        context's `ctx.usage` (`None`: a fresh one).

        Built in one go, once per tool call: a `dataclasses.replace` of a `RunContext` runs its `__init__` hooks
        again, so each one cost about as much as the context (measured per tool call on these machines).
        """
        model = self.agent.model
        run_id = activity.info().workflow_id if activity.in_activity() else None  # the durable run's id
        validation = self.agent.validation_context
        ctx = RunContext(
            deps=self.deps if deps is None else deps,
            model=model if isinstance(model, Model) else infer_model(model or "test"),
            usage=RunUsage() if usage is None else usage,
            agent=self.agent,
            tool_name=tool_name,
            tool_call_id=call_id,
            retry=attempt - 1,
            retries={tool_name: attempt - 1} if tool_name else {},
            max_retries=agent_settings(self.agent).tool_retries if max_retries is None else max_retries,
            run_id=run_id, conversation_id=run_id,  # a durable run is one conversation, continued as new or not
            capabilities=registered_capabilities(self.agent),
            validation_context=None if callable(validation) else validation,
        )
        if callable(validation):  # it reads the context it belongs to
            ctx = replace(ctx, validation_context=validation(ctx))
        return ctx

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
            return await self._read_tools(self.run_context())
        if self._tools is None:
            self._tools = await self._read_tools(self.run_context())
        return self._tools

    def forget_tools(self) -> None:
        """Read the agent's tools again next time (a tool was added to it: `add_child_run_tool`)."""
        self._tools = None

    async def _read_tools(self, ctx: RunContext[Any]) -> dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]]:
        found: dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]] = {}
        # Each toolset on its own (a call goes to the one that has the tool), unless a capability wraps them all.
        toolsets = [await run_toolset(self.agent, ctx)] if self.capability_use.wraps_toolsets else [
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
                         if name.startswith("_") and self.in_sandbox(tool.tool_def, self.options_for(tool.tool_def)))
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

    def in_sandbox(self, tool: ToolDefinition, options: ToolOptions) -> bool:
        """Whether programs call `tool` (else the model calls it directly): its options, then `sandbox_tools`."""
        if not self.code_mode:
            return False
        if options.in_sandbox is not None:
            return options.in_sandbox
        if self._selector is None:
            return True
        if callable(self._selector):
            return bool(self._selector(tool))
        return tool.name in self._selector

    # -- the models runs use -------------------------------------------------------------------------------

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
