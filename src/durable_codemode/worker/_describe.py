"""What a run records when it starts (`AgentSpec`): the describe activity's body, step by step.

A run is told everything about its agent once, at its start, and replays from that record: the instructions and
system prompts, the tool definitions the model is offered (`run_code` with the sandbox tools' stubs, and the direct
tools), each tool's activity options and approvers, the output spec, the provider tools, the limits and the
environment the sandbox may read. The steps, in order:

1. `before_run` hooks, with the run's prompt and deps (a guardrail ends the run here, before anything else);
2. the probe: pydantic-ai asked what it would send the model (instructions, system prompts, prepared tools,
   output tools, provider tools), with the run's deps;
3. the run's tools, as the agent's capabilities prepared them;
4. each tool's spec (sandbox or direct, options, approval, approvers, child runs);
5. what the model is offered: `run_code` with the stubs, or a catalog for a large or deferred set of tools.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, SystemPromptPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.native_tools import AbstractNativeTool
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from .._pydantic_ai import agent_settings
from ..shared._approvals import RecordedApproverPolicy
from ..shared._config import ToolOptions
from ..shared._errors import CodeModeUserError, GuardrailError
from ..shared._names import CHILD_DEPS_METADATA, CHILD_RUN_METADATA, tool_activity_type
from ..shared._types import BEHAVIOR_VERSION, AgentSpec, CatalogEntry, DynamicPrompt, OutputSpec, ToolCatalog, ToolSpec
from ..workflow._stubs import (
    deferred_section,
    estimate_tokens,
    index_section,
    render_tool_stubs,
    run_code_tool_definition,
    stubs_of,
    tool_summary,
)
from ._approvers import ApprovalAuthority
from ._capabilities import probing, run_before_run
from ._files import files_spec
from ._mcp import as_received, mcp_toolsets, schema_digest
from ._probe import PROBE_PROFILE, Probed, RawProbeModel
from ._rules import rule_fingerprint

if TYPE_CHECKING:
    from ._agent import CodeModeAgent

__all__ = ["describe_for_check", "describe_run"]

Tools = dict[str, tuple[AbstractToolset[Any], ToolsetTool[Any]]]


async def describe_run(durable: CodeModeAgent, raw_deps: Any = None, *, deps_type: str | None = None,
                       model: str | None = None, authority: ApprovalAuthority | None = None,
                       instructions: str | None = None, prompt: str | None = None) -> AgentSpec:
    """The spec a run of `durable` records at its start (the describe activity; tests read it to see a run's spec).

    Dynamic instructions and tools' `prepare` functions see the run's deps. The run's model (`model`, else the
    agent's) is built first, so one that cannot work fails the run before any model request. With the worker's
    approval `authority`, tools' approver policies are recorded with their groups resolved, and a run whose calls
    could never be approved on this worker is refused. The run's own `instructions` are added to the agent's, as
    `Agent.run(instructions=...)` adds them.

    Raises:
        GuardrailError: a `before_run` hook raised (its exception is the cause).
        CodeModeUserError: the run's model cannot work here, or a tool's options contradict each other.

    """
    chosen = durable.resolve_model(model)
    deps = await durable.build_deps(raw_deps, type_name=deps_type)
    await _start(durable, chosen, deps, prompt)
    return await _spec_of(durable, deps, given=raw_deps is not None, authority=authority, instructions=instructions,
                          prompt=prompt)


async def describe_for_check(durable: CodeModeAgent, raw_deps: Any = None, *, deps_type: str | None = None,
                             instructions: str | None = None, prompt: str | None = None
                             ) -> tuple[AgentSpec, str | None]:
    """The spec a run with this input would record on a worker of `durable`, for `codemode check-deploy`.

    As `describe_run`, but nothing of the run's start happens (no `before_run` hook, no model built: the checking
    machine may hold no provider key) and no approval authority is asked (keys are checked on their own). The run's
    deps are built as the worker would build them (a `deps_factory` runs); when they cannot be built here, the spec is
    described with the agent's default deps, and the second value says why.
    """
    note = None
    try:
        deps = await durable.build_deps(raw_deps, type_name=deps_type)
        given = raw_deps is not None
    except Exception as e:  # a deps_factory that needs the worker's environment: compare without the run's deps
        note = f"the run's deps could not be built here ({type(e).__name__}: {e}); compared with the default deps"
        deps, given = durable.deps, False
    return await _spec_of(durable, deps, given=given, authority=None, instructions=instructions,
                          prompt=prompt), note


async def _spec_of(durable: CodeModeAgent, deps: Any, *, given: bool, authority: ApprovalAuthority | None,
                   instructions: str | None, prompt: str | None) -> AgentSpec:
    """Steps 2 to 5 of describing a run (the module docstring), with its deps built."""
    probe = await _probe(durable.agent, deps, prompt, instructions)
    tools = await _run_tools(durable, probe.info, deps, given=given)
    specs, sandbox_defs, native_defs = _tool_specs(durable, tools, authority)
    stubs, model_tools, files, catalog = _offered(durable, sandbox_defs, native_defs)
    uses = durable.capability_use
    own = durable.agent.model
    return AgentSpec(
        agent=durable.name,
        model_name=own.model_name if isinstance(own, Model) else str(own),
        instructions=probe.info.instructions,
        system_prompts=probe.system_prompts,
        dynamic_prompts=probe.dynamic_prompts,
        code_mode=durable.code_mode,
        model_tools=model_tools,
        tools=specs,
        stubs=stubs,
        limits=durable.limits,
        env={k: os.environ[k] for k in durable.env_allowlist if k in os.environ},
        behavior_version=BEHAVIOR_VERSION,
        model_request_hooks=uses.model_request_hooks,
        after_run_hooks=uses.after_run_hooks, run_error_hooks=uses.run_error_hooks,
        signed_approvals=authority is not None and not authority.unsigned,
        output=_output_spec(durable.agent, probe.info),
        native_tools=_provider_tools(probe.info.model_request_parameters.native_tools),
        files=files,
        catalog=catalog,
        stream=durable.stream,
    )


async def _start(durable: CodeModeAgent, model: Model, deps: Any, prompt: str | None) -> None:
    """Step 1: the capabilities' `before_run` hooks, once, before any model request or tool call.

    This is the run's start, so a guardrail that raises ends the run here (and once: a continued run does not
    describe again).
    """
    try:
        await run_before_run(durable.agent, replace(durable.run_context(deps=deps), model=model, prompt=prompt,
                                                    run_step=0))
    except Exception as e:
        raise GuardrailError(f"a before_run hook of agent {durable.name!r} stopped the run before it started: "
                             f"{type(e).__name__}: {e}") from e


@dataclass
class _Probe:
    """What pydantic-ai would send the model at the run's first request."""

    info: AgentInfo
    system_prompts: list[str]
    dynamic_prompts: list[DynamicPrompt]


async def _probe(agent: Agent[Any, Any], deps: Any, prompt: str | None, instructions: str | None) -> _Probe:
    """Step 2: ask pydantic-ai what it would send the model, with the run's deps.

    That resolves static and dynamic instructions (and system prompts, static and from `@agent.system_prompt`
    functions) and the output tools exactly as an ordinary run does, through its public API (`probing` masks the
    run and model-request hooks, which run once, where they belong).
    """
    def capture(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise Probed(messages, info)

    try:
        with probing(agent, preparing=True):
            await agent.run(prompt or "", model=RawProbeModel(capture, profile=PROBE_PROFILE), deps=deps,
                            instructions=instructions)
    except Probed as probed:
        system_parts = [part for message in probed.messages if isinstance(message, ModelRequest)
                        for part in message.parts if isinstance(part, SystemPromptPart)]
        return _Probe(info=probed.info, system_prompts=[part.content for part in system_parts],
                      dynamic_prompts=[DynamicPrompt(index=i, ref=part.dynamic_ref,
                                                     context_id=getattr(part, "context_id", None))  # 2.68+
                                       for i, part in enumerate(system_parts) if part.dynamic_ref])
    raise AssertionError("the probing run ended without a model request")


async def _run_tools(durable: CodeModeAgent, info: AgentInfo, deps: Any, *, given: bool) -> Tools:
    """Step 3: the run's tools; read with the run's deps when it has some of its own (`prepare` may use them).

    With `prepare_tools` hooks, the tools they left in the probe's request, as they left them: the request's
    parameters, not `info.function_tools`, which leave out the deferred tools (`defer_loading=True`) that
    `ToolSearch` hides from the model only after the hooks prepared them.
    """
    tools = (await durable.tools(durable.run_context(deps=deps)) if given or durable.builds_deps
             else await durable.tools())
    if not durable.capability_use.prepares_tools:
        return tools
    prepared = {d.name: d for d in info.model_request_parameters.function_tools}
    return {name: (toolset, replace(tool, tool_def=as_received(prepared[name]) if mcp_toolsets([tool.toolset])
                                    else prepared[name]))
            for name, (toolset, tool) in tools.items() if name in prepared}


def _tool_specs(durable: CodeModeAgent, tools: Tools, authority: ApprovalAuthority | None
                ) -> tuple[list[ToolSpec], list[ToolDefinition], list[ToolDefinition]]:
    """Step 4: each tool's spec, and the definitions of the sandbox tools and of the direct ones."""
    specs: list[ToolSpec] = []
    sandbox_defs: list[ToolDefinition] = []
    native_defs: list[ToolDefinition] = []
    for tool_name, (_toolset, tool) in tools.items():
        options = durable.options_for(tool.tool_def)
        in_sandbox = durable.in_sandbox(tool.tool_def, options)
        if tool.tool_def.defer_loading and not in_sandbox:
            raise CodeModeUserError(
                f"tool {tool_name!r} of agent {durable.name!r} has defer_loading=True but is offered to the model "
                "directly (not in the sandbox): a durable run offers its direct tools from its start and has no "
                "tool search for them; let programs call it (they find deferred tools with search_tools), or "
                "drop defer_loading=True")
        (sandbox_defs if in_sandbox else native_defs).append(tool.tool_def)
        requires_approval = options.requires_approval or tool.tool_def.kind == "unapproved"
        if options.batch and requires_approval:
            raise CodeModeUserError(
                f"tool {tool_name!r} of agent {durable.name!r} has ToolOptions(batch=True) but needs approval "
                "(pydantic-ai's requires_approval=True on the tool): a call waiting for a person cannot share a "
                "batch with calls that run at once; drop batch=True for it, or its requires_approval")
        specs.append(ToolSpec(name=tool_name, activity_type=tool_activity_type(durable.name, tool_name),
                              in_sandbox=in_sandbox, timeout=options.timeout,
                              retry_policy=options.retry_policy, local=options.local,
                              requires_approval=requires_approval,
                              approval_rule=options.approval_rule is not None,
                              rule_fingerprint=(rule_fingerprint(options.approval_rule)
                                                if options.approval_rule is not None else None),
                              approval_timeout=options.approval_timeout,
                              heartbeat_timeout=options.heartbeat_timeout,
                              approvers=_approvers(durable.name, tool_name, options, authority,
                                                   requires_approval or options.approval_rule is not None),
                              max_retries=tool.max_retries, batch=options.batch and in_sandbox,
                              schema_digest=schema_digest(tool.tool_def) if mcp_toolsets([tool.toolset]) else None,
                              child_run=_child_run(durable.name, tool.tool_def, options),
                              child_deps=bool((tool.tool_def.metadata or {}).get(CHILD_DEPS_METADATA))))
    return specs, sandbox_defs, native_defs


def _offered(durable: CodeModeAgent, sandbox_defs: list[ToolDefinition], native_defs: list[ToolDefinition]
             ) -> tuple[str, list[ToolDefinition], Any, ToolCatalog | None]:
    """Step 5: the stubs, the tool definitions the model is offered, the run's files and its tool catalog.

    `run_code` carries every sandbox tool's stub, or, past the catalog's budget, an index and the catalog
    programs search (`search_tools`); deferred tools (`defer_loading=True`) are in the catalog only.
    """
    stubs, own_stubs = render_tool_stubs(sandbox_defs)
    files = files_spec(durable.name, durable.files) if durable.files is not None and durable.code_mode else None
    catalog = index = deferred = None
    shown_stubs = stubs
    settings = durable.catalog
    if durable.code_mode and settings.wants_index(tools=len(sandbox_defs), stub_tokens=estimate_tokens(stubs)):
        catalog = _catalog_of(sandbox_defs, own_stubs)
        pairs = [(e.name, e.summary) for e in catalog.entries]
        index = index_section(pairs)
        if estimate_tokens(index) > settings.max_stub_tokens:  # even the index is over budget: names only
            index = index_section(pairs, summaries=False)
    elif any(d.defer_loading for d in sandbox_defs):
        catalog, shown_stubs, deferred = _deferred_catalog(durable, sandbox_defs, own_stubs)
    model_tools = ([run_code_tool_definition(shown_stubs, durable.limits, index, files=files, deferred=deferred)]
                   if durable.code_mode else []) + native_defs
    return stubs, model_tools, files, catalog


def _catalog_of(tools: Sequence[ToolDefinition], own_stubs: Sequence[tuple[list[str], str]]) -> ToolCatalog:
    """The recorded catalog of `tools`, from their own stubs (`render_tool_stubs`), each type definition once."""
    types: dict[str, int] = {}
    entries = [CatalogEntry(name=tool.name, summary=tool_summary(tool), function=function,
                            types=[types.setdefault(t, len(types)) for t in definitions])
               for tool, (definitions, function) in zip(tools, own_stubs, strict=True)]
    return ToolCatalog(entries=entries, types=list(types))


def _deferred_catalog(durable: CodeModeAgent, tools: Sequence[ToolDefinition],
                      own_stubs: Sequence[tuple[list[str], str]]) -> tuple[ToolCatalog, str, str]:
    """The catalog of `tools`, the stubs of those not deferred (`defer_loading=True`), and the section on them.

    pydantic-ai's `ToolSearch` hides a deferred tool from the model until a search finds it. Here the `run_code`
    description shows the other tools' stubs and only says how many are hidden, and programs find them with
    `search_tools` / `describe_tool`, answered from the recorded catalog as for a large one (which holds every
    tool, so `describe_tool` knows the shown ones too). The type checker knows every tool's stub, so a found tool
    is called like any other.
    """
    if durable.catalog.mode == "stubs":
        names = ", ".join(repr(t.name) for t in tools if t.defer_loading)
        raise CodeModeUserError(
            f"agent {durable.name!r} has tools with defer_loading=True ({names}), but its "
            "CatalogSettings(mode='stubs') shows every tool's stub in the run_code description: drop "
            "defer_loading=True from them, or the mode='stubs' (then programs find them with search_tools)")
    shown = [own for tool, own in zip(tools, own_stubs, strict=True) if not tool.defer_loading]
    hidden = len(tools) - len(shown)
    return (_catalog_of(tools, own_stubs), stubs_of(shown) if shown else "",
            deferred_section(hidden, shown=bool(shown)))


def _child_run(agent: str, tool: ToolDefinition, options: ToolOptions) -> str | None:
    """The agent a `child_run_tool` starts as a child run, as a run records it (`ToolSpec.child_run`)."""
    child = (tool.metadata or {}).get(CHILD_RUN_METADATA)
    if child is None:
        return None
    if options.local or options.batch:
        raise CodeModeUserError(
            f"tool {tool.name!r} of agent {agent!r} runs agent {child!r} as a child run, which is a workflow, "
            "not an activity: drop ToolOptions(local=True) / batch=True for it")
    return str(child)


def _approvers(agent: str, tool: str, options: ToolOptions, authority: ApprovalAuthority | None,
               gated: bool) -> RecordedApproverPolicy | None:
    """The approver policy `tool`'s calls are decided under, as the run records it (groups resolved now)."""
    if options.approvers is not None and not gated:
        raise CodeModeUserError(f"tool {tool!r} of agent {agent!r} names approvers, but its calls need no "
                                "approval: set requires_approval=True or an approval_rule in its ToolOptions")
    if authority is None or not gated:
        return None
    authority.check_can_decide(agent)
    return authority.directory.resolve(options.approvers) if options.approvers is not None else None


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
