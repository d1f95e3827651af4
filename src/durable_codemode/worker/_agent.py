"""`CodeModeAgent`: a `pydantic_ai.Agent` made durable, and the activity bodies that serve it on a worker.

The agent stays an ordinary pydantic-ai agent (model, instructions, tools declared with `@agent.tool_plain`,
`Tool(...)` or a `FunctionToolset`); this wrapper adds what the durable run needs to know: which tools the
sandbox may call, their activity options, the snippet limits, and the environment the sandbox may read.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any, cast

from pydantic import TypeAdapter, ValidationError
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, SystemPromptPart, TextPart
from pydantic_ai.models import Model, ModelRequestParameters, infer_model
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.settings import ModelSettings, merge_model_settings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RunUsage

from .._config import SnippetLimits, ToolOptions
from .._errors import CodeModeUserError
from .._models import build_model
from .._names import RUN_CODE_TOOL, tool_activity_type
from .._results import jsonable
from .._stubs import render_stubs, run_code_tool_definition
from .._types import AgentSpec, ToolSpec

__all__ = ["CodeModeAgent", "ToolSelector"]


@functools.cache
def _built_in_capabilities() -> frozenset[type[Any]]:
    """The capability types every pydantic-ai agent has by default (what `Agent(model)` alone carries)."""
    return frozenset(type(c) for c in _capabilities(Agent("test")))


def _capabilities(agent: Agent[Any, Any]) -> list[Any]:
    root = agent.root_capability
    return list(getattr(root, "capabilities", [root]))


def _unsupported(agent: Agent[Any, Any]) -> list[str]:
    """What `agent` declares that a durable run would not apply, by name (refused, never silently dropped)."""
    found = [f"capabilities ({', '.join(type(c).__name__ for c in extra)})"
             for extra in [[c for c in _capabilities(agent) if type(c) not in _built_in_capabilities()]] if extra]
    if agent._output_validators:  # pinned by tests/test_compat.py
        found.append(f"output validators ({len(agent._output_validators)})")
    return found


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def _qualified_name(kind: Any) -> str | None:
    """`module.QualName` of a class (what `start_run` records of a deps value), `None` for other types."""
    if not isinstance(kind, type):
        return None
    return f"{kind.__module__}.{kind.__qualname__}"


ToolSelector = Sequence[str] | Callable[[ToolDefinition], bool]
"""Which tools the sandbox may call: a list of names, or a predicate on the tool definition."""

_METADATA_KEY = "codemode"
"""Per-tool options in a tool's pydantic-ai metadata: `metadata={'codemode': ToolOptions(...)}` (or a dict of
`ToolOptions` fields)."""


class CodeModeAgent:
    """A pydantic-ai agent that runs durably on Temporal, its tools called from `run_code` programs.

    Example:
        ```python
        agent = Agent("openai:gpt-5", name="cart", instructions="You manage the user's cart.")

        @agent.tool_plain
        def list_cart(offset: int = 0) -> CartPage: ...

        cart = CodeModeAgent(agent, limits=SnippetLimits(max_tool_calls=200))
        ```

    """

    def __init__(
        self,
        agent: Agent[Any, Any],
        *,
        name: str | None = None,
        code_mode: bool = True,
        sandbox_tools: ToolSelector | None = None,
        tool_options: Mapping[str, ToolOptions] | None = None,
        default_tool_options: ToolOptions | None = None,
        limits: SnippetLimits | None = None,
        env_allowlist: Sequence[str] = (),
        deps: Any = None,
    ) -> None:
        """Wrap `agent`.

        Args:
            agent: The pydantic-ai agent. Its output type must be `str` (structured output is not supported yet).
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

        Raises:
            CodeModeUserError: on an agent without a name, an unsupported output type, capabilities or output
                validators (not applied by a durable run yet), or options for a tool name that does not exist
                (checked when the worker starts).

        """
        resolved = name or agent.name
        if not resolved:
            raise CodeModeUserError("the agent has no name: pass `Agent(..., name='cart')` or "
                                    "`CodeModeAgent(agent, name='cart')`; runs pick their agent by name")
        if agent.output_type is not str:
            raise CodeModeUserError(
                f"agent {resolved!r} has output type {agent.output_type!r}; durable-codemode supports `str` output "
                "only for now: have the model answer in text (or return JSON from a final run_code call)"
            )
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
        self.deps = deps
        self._tools: dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]] | None = None

    def __repr__(self) -> str:
        return f"CodeModeAgent(name={self.name!r}, code_mode={self.code_mode})"

    # -- tools ------------------------------------------------------------------------------------------------

    @property
    def deps_type(self) -> Any:
        """The agent's `deps_type` (pydantic-ai's default, `NoneType`, when it declares none)."""
        return self.agent.deps_type

    def run_deps(self, raw: Any, *, type_name: str | None = None) -> Any:
        """A run's deps as its tools see them: `raw` (what the data converter decoded) rebuilt as `deps_type`.

        `None` means the run gave none: the `CodeModeAgent(deps=...)` default. An agent without a `deps_type`
        gets the value as decoded (plain JSON).

        Raises:
            CodeModeUserError: the deps are of another type than the agent's `deps_type`, or do not validate as
                it (the message names both).

        """
        if raw is None:
            return self.deps
        expected = self.deps_type
        if expected is type(None) or expected is Any:
            return raw
        wanted = _qualified_name(expected)
        if type_name is not None and wanted is not None and type_name != wanted:
            raise CodeModeUserError(
                f"agent {self.name!r} takes deps of type {wanted} (its deps_type), but the run was started with "
                f"deps of type {type_name}: pass a {getattr(expected, '__name__', wanted)} as start_run(deps=...)")
        try:
            return _adapter(expected).validate_python(raw)
        except ValidationError as e:
            raise CodeModeUserError(
                f"the run's deps do not validate as {wanted or expected!r}, the deps_type of agent {self.name!r}: "
                f"{e.error_count()} error(s), first: {e.errors()[0]['msg']} at {e.errors()[0]['loc']}") from e

    def _run_context(self, *, tool_name: str | None = None, call_id: str | None = None,
                     attempt: int = 1, deps: Any = None) -> RunContext[Any]:
        model = self.agent.model
        return RunContext(
            deps=self.deps if deps is None else deps,
            model=model if isinstance(model, Model) else infer_model(model or "test"),
            usage=RunUsage(),
            tool_name=tool_name,
            tool_call_id=call_id,
            retry=attempt - 1,
        )

    async def tools(
        self, ctx: RunContext[Any] | None = None
    ) -> dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]]:
        """The agent's tools by name, with the toolset that runs each.

        With a run's context (its deps), as that run sees them: `prepare` functions may depend on the deps. Without,
        with the default deps, read once per worker.
        """
        if ctx is not None:
            return await self._read_tools(ctx)
        if self._tools is None:
            self._tools = await self._read_tools(self._run_context())
        return self._tools

    async def _read_tools(self, ctx: RunContext[Any]) -> dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]]:
        found: dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]] = {}
        for toolset in self.agent.toolsets:
            for tool_name, tool in (await toolset.get_tools(ctx)).items():
                found[tool_name] = (toolset, tool)
        if RUN_CODE_TOOL in found and self.code_mode:
            raise CodeModeUserError(f"agent {self.name!r} has a tool named {RUN_CODE_TOOL!r}, the name code "
                                    "mode gives its own tool: rename it")
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
                       model: str | None = None) -> AgentSpec:
        """The spec a run records at its start: instructions, tool definitions, stubs, limits, environment.

        Dynamic instructions and tools' `prepare` functions see the run's deps (`run_deps`). The run's model
        (`model`, else the agent's) is built first, so one that cannot work fails the run before any model request.
        """
        self.resolve_model(model)
        deps = self.run_deps(raw_deps, type_name=deps_type)
        captured: dict[str, Any] = {}

        def capture(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            captured["instructions"] = info.instructions
            captured["system_prompts"] = [part.content for message in messages if isinstance(message, ModelRequest)
                                          for part in message.parts if isinstance(part, SystemPromptPart)]
            captured["model_settings"] = info.model_settings
            return ModelResponse(parts=[TextPart("(describing the agent)")])

        # Asking pydantic-ai what it would send the model resolves static and dynamic instructions (and system
        # prompts, static and from `@agent.system_prompt` functions, with the run's deps) exactly as
        # an ordinary run does, using only its public API.
        await self.agent.run("", model=FunctionModel(capture), deps=deps)
        tools = await self.tools(self._run_context(deps=deps)) if raw_deps is not None else await self.tools()
        specs: list[ToolSpec] = []
        sandbox_defs: list[ToolDefinition] = []
        native_defs: list[ToolDefinition] = []
        for tool_name, (_toolset, tool) in tools.items():
            options = self.options_for(tool.tool_def)
            in_sandbox = self._in_sandbox(tool.tool_def, options)
            (sandbox_defs if in_sandbox else native_defs).append(tool.tool_def)
            specs.append(ToolSpec(name=tool_name, activity_type=tool_activity_type(self.name, tool_name),
                                  in_sandbox=in_sandbox, timeout=options.timeout,
                                  retry_policy=options.retry_policy, local=options.local,
                                  requires_approval=options.requires_approval or tool.tool_def.kind == "unapproved",
                                  approval_rule=options.approval_rule is not None,
                                  approval_timeout=options.approval_timeout,
                                  heartbeat_timeout=options.heartbeat_timeout))
        stubs = render_stubs(sandbox_defs)
        model_tools = ([run_code_tool_definition(stubs, self.limits)] if self.code_mode else []) + native_defs
        own = self.agent.model
        return AgentSpec(
            agent=self.name,
            model_name=own.model_name if isinstance(own, Model) else str(own),
            instructions=captured.get("instructions"),
            system_prompts=captured.get("system_prompts", []),
            code_mode=self.code_mode,
            model_tools=model_tools,
            tools=specs,
            stubs=stubs,
            limits=self.limits,
            env={k: os.environ[k] for k in self.env_allowlist if k in os.environ},
            sandbox_guards=True,
            compute_escalation=True,
        )

    def check_model(self) -> None:
        """Build the agent's model if it is a string, so one that cannot work stops the worker from starting.

        pydantic-ai builds a model given as a string when the agent is built, unless `defer_model_check=True`;
        this is that check, on the worker (where the key must be), not in every process importing the agent.

        Raises:
            CodeModeUserError: the provider's API key is not set here, the model is unknown, or its provider's
                package is not installed (the message names the variable or the package).

        """
        model = self.agent.model
        if isinstance(model, str):
            build_model(model, subject=f"agent {self.name!r}", whose="its model",
                        otherwise="give the agent another model (every run then uses start_run(model=...))")

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

    async def request(self, override: str | None, messages: list[ModelMessage], tools: list[ToolDefinition], *,
                      deps: Any = None, model_settings: Mapping[str, Any] | None = None) -> ModelResponse:
        """One model request with the recorded tool definitions (`deps`, `model_settings`: the run's, as recorded).

        The run's model settings go over the agent's, merged as `Agent.run(model_settings=...)` merges them.
        """
        model = self.resolve_model(override)
        params = ModelRequestParameters(function_tools=tools, allow_text_output=True)
        settings = self.agent.model_settings
        if callable(settings):  # per-run settings from a function of the run context
            settings = settings(self._run_context(deps=self.run_deps(deps)))
        if model_settings:
            settings = merge_model_settings(settings, cast(ModelSettings, dict(model_settings)))
        return await model.request(messages, settings, params)

    async def call_tool(self, tool_name: str, args: dict[str, Any], *, call_id: str, attempt: int,
                        deps: Any = None) -> Any:
        """Validate `args` and run the tool; its exceptions propagate unchanged (the caller classifies them).

        Raises:
            KeyError: the agent has no tool called `tool_name`.
            ValueError: the arguments do not match the tool's schema (a pydantic `ValidationError`).

        """
        run_deps = self.run_deps(deps)
        tools = await self.tools(self._run_context(deps=run_deps)) if deps is not None else await self.tools()
        if tool_name not in tools:
            raise KeyError(f"agent {self.name!r} has no tool {tool_name!r}")
        toolset, tool = tools[tool_name]
        ctx = self._run_context(tool_name=tool_name, call_id=call_id, attempt=attempt, deps=run_deps)
        validated = tool.args_validator.validate_python(args)
        return jsonable(await toolset.call_tool(tool_name, validated, ctx, tool))

