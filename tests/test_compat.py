"""Names recorded in histories and the public API are compatibility data: changing one breaks old runs or users."""

from __future__ import annotations

import dataclasses

import pytest

import durable_codemode
from durable_codemode import _names


def test_persisted_names_are_pinned() -> None:
    # Every one of these is written into histories; renaming any of them makes running workflows unreplayable.
    assert _names.WORKFLOW_TYPE == "durable-codemode.run"
    assert _names.MODEL_REQUEST_ACTIVITY == "durable-codemode.model_request"
    assert _names.DESCRIBE_AGENT_ACTIVITY == "durable-codemode.describe_agent"
    assert _names.SEAL_REPL_ACTIVITY == "durable-codemode.seal_repl"
    assert _names.OUTPUT_ACTIVITY == "durable-codemode.output"
    assert _names.RUN_ERROR_ACTIVITY == "durable-codemode.on_run_error"
    assert _names.SANDBOX_GUARDS_PATCH == "durable-codemode.sandbox-guards"
    assert _names.RUN_CODE_TOOL == "run_code"
    assert _names.tool_activity_type("cart", "list_cart") == "cart.list_cart"
    assert _names.nested_call_id("call_1", 7) == "call_1.7"
    assert _names.tool_activity_id("call_1.7", "get", {"i": 3}) == "call_1.7-" + _names.call_digest("get", {"i": 3})
    assert _names.BATCH_ACTIVITY == "durable-codemode.tool_batch"
    # A batch's id: its first call, how many, a digest of every call's id and arguments (sets canonical).
    assert _names.batch_activity_id(["call_1.0", "call_1.1"], "get", [{"i": 0}, {"i": {2, 1}}]) == (
        "call_1.0+2-c3f13b317c")
    # Search attributes and memo keys are registered on servers and read by `codemode runs` and the UI's saved queries.
    assert (_names.AGENT_SEARCH_ATTRIBUTE, _names.STATUS_SEARCH_ATTRIBUTE) == ("CodemodeAgent", "CodemodeStatus")
    assert (_names.AGENT_MEMO, _names.STATUS_MEMO) == ("agent", "status")
    assert (_names.STATUS_RUNNING, _names.STATUS_WAITING) == ("running", "waiting")


def test_persisted_payload_shapes_are_pinned() -> None:
    # A tool activity's input and a call's record are read back from histories recorded by older releases, and
    # written for newer ones: both shapes of each stay readable.
    from datetime import UTC, datetime

    from pydantic import TypeAdapter

    from durable_codemode import CallRecord
    from durable_codemode._converter import DATA_CONVERTER
    from durable_codemode._types import ToolCallInput

    converter = DATA_CONVERTER.payload_converter
    compact = converter.to_payload(ToolCallInput(args={"i": 3}))
    assert compact is not None and compact.data == b'{"args":{"i":3}}'  # AgentSpec.compact_tool_calls
    old = converter.to_payload(ToolCallInput(tool="get", args={"i": 3}, call_id="call_1.7"))
    assert old is not None and old.data == b'{"tool":"get","args":{"i":3},"call_id":"call_1.7"}'
    assert converter.from_payload(old, ToolCallInput) == ToolCallInput(tool="get", args={"i": 3}, call_id="call_1.7")
    assert _names.call_id_of_activity(_names.tool_activity_id("call_1-a.7", "get", {})) == "call_1-a.7"
    assert _names.tool_of_activity_type(_names.tool_activity_type("my.agent", "get")) == "get"
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    record = CallRecord(call_id="c.0", tool="get", args="{}", status="ok", result="1", started_at=at, finished_at=at)
    wire = converter.to_payload(record)
    assert wire is not None and wire.data == b'["c.0","get","{}","ok","1","2026-01-02T03:04:05.000006Z",0]'
    named = ('{"call_id":"c.0","tool":"get","args":"{}","status":"ok","result":"1",'
             '"started_at":"2026-01-02T03:04:05.000006Z","finished_at":"2026-01-02T03:04:05.000006Z"}')
    assert TypeAdapter(CallRecord).validate_json(named) == record == converter.from_payload(wire, CallRecord)


def test_the_tool_usage_envelope_is_pinned() -> None:
    # A tool call whose sub-agent used the model records its result in this envelope (`_tool_usage`); a replay
    # counts the usage from it, so its key and shape are history.
    from pydantic_ai.usage import RunUsage

    from durable_codemode._converter import DATA_CONVERTER
    from durable_codemode._tool_usage import USAGE_KEY, split_usage, with_usage

    assert USAGE_KEY == "durable_codemode.tool_usage"
    wire = DATA_CONVERTER.payload_converter.to_payload(with_usage({"a": 1}, RunUsage(requests=1, input_tokens=9)))
    assert wire is not None
    assert wire.data == b'{"durable_codemode.tool_usage":{"input_tokens":9,"requests":1},"value":{"a":1}}'
    read = DATA_CONVERTER.payload_converter.from_payload(wire)
    assert split_usage(read) == ({"a": 1}, RunUsage(requests=1, input_tokens=9))


def test_the_child_run_names_are_pinned() -> None:
    # A child run's id, the signal it sends its parent and the tool metadata naming its agent are history.
    assert _names.child_run_id("search-1", "call_0.2") == "search-1/call_0.2"
    assert _names.CHILD_APPROVALS_SIGNAL == "durable-codemode.child_approvals"
    assert _names.CHILD_RUN_METADATA == "codemode_child_run"


def test_call_digest_is_canonical_and_sensitive() -> None:
    digest = _names.call_digest("get", {"ids": {3, 1, 2}, "b": 1, "a": [1, 2]})
    assert digest == _names.call_digest("get", {"a": [1, 2], "b": 1, "ids": {2, 3, 1}})  # key and set order
    assert digest == "2552a97831"  # the same on every worker, whatever PYTHONHASHSEED says
    assert digest != _names.call_digest("get", {"ids": {3, 1}, "b": 1, "a": [1, 2]})
    assert digest != _names.call_digest("list", {"ids": {3, 1, 2}, "b": 1, "a": [1, 2]})


def test_public_api() -> None:
    assert sorted(durable_codemode.__all__) == sorted(
        name for name in dir(durable_codemode) if not name.startswith("_") and name not in {
            "annotations", "testing", "cli",
        } and not isinstance(getattr(durable_codemode, name), type(durable_codemode))
    )
    for name in durable_codemode.__all__:
        assert getattr(durable_codemode, name) is not None


def test_the_pydantic_ai_surface_we_read_is_there() -> None:
    """The pydantic-ai attributes `CodeModeAgent` reads (one private), so an upgrade that moves them fails here."""
    from dataclasses import dataclass

    from pydantic_ai import Agent
    from pydantic_ai.capabilities import Hooks

    @dataclass
    class Deps:
        tenant: str

    plain = Agent("test", deps_type=Deps)
    assert plain.deps_type is Deps
    assert plain._output_validators == []
    assert plain._max_tool_retries == 1 and Agent("test", retries=3)._max_tool_retries == 3
    assert plain._concurrency_limiter is None and plain._metadata is None and plain._validation_context is None
    assert Agent("test", validation_context={"unit": "cents"})._validation_context == {"unit": "cents"}
    built_in = {type(c) for c in plain.root_capability.capabilities}  # type: ignore[attr-defined]
    hooks = Hooks()
    hooked = Agent("test", capabilities=[hooks])
    assert {type(c) for c in hooked.root_capability.capabilities} - built_in == {Hooks}  # type: ignore[attr-defined]

    @hooks.on.before_tool_execute
    async def log(ctx, *, call, tool_def, args):  # type: ignore[no-untyped-def]
        return args

    assert [k for k, v in hooks._registry.items() if v] == ["before_tool_execute"]  # what _capabilities reads


async def test_the_pydantic_ai_output_surface_we_read_is_there() -> None:
    """What `CodeModeAgent` reads of pydantic-ai's output processing (private names), so an upgrade fails here."""
    from pydantic import BaseModel
    from pydantic_ai import Agent, CallToolsNode, NativeOutput, PromptedOutput
    from pydantic_ai._output import types_from_output_spec
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, UserPromptPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_graph import End

    class Answer(BaseModel):
        n: int

    for spec, mode in [(Answer, "auto"), (NativeOutput(Answer), "native"), (PromptedOutput(Answer), "prompted")]:
        schema = Agent("test", output_type=spec)._output_schema
        assert schema.mode == mode
        assert schema.object_def is not None and isinstance(schema.allows_text, bool)
        assert isinstance(schema.allows_image, bool) and not schema.allows_deferred_tools
        assert not schema.allows_pending_model_response
    assert isinstance(Agent("test", output_type=PromptedOutput(Answer))._output_schema.template, str | None)
    assert types_from_output_spec([Answer, str]) == [Answer, str]

    # A probe run's state and step tool manager: the output retry count is set on both before the step runs.
    def answer(messages: list[object], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"n": 1})])

    agent = Agent(FunctionModel(answer), output_type=Answer)
    async with agent.iter(message_history=[ModelRequest(parts=[UserPromptPart("hi")])]) as run:
        assert run.ctx.state.output_retries_used == 0
        node = run.next_node
        while not isinstance(node, End):
            if isinstance(node, CallToolsNode):
                manager = run.ctx.deps.tool_manager
                assert manager.tools is not None and manager.ctx is not None
                assert {t.tool_def.kind for t in manager.tools.values()} == {"output"}
                assert isinstance(manager.ctx.retries, dict)
            node = await run.next(node)
    assert run.result is not None and run.result.output == Answer(n=1)


def test_the_output_retry_budget_we_read_is_there() -> None:
    """`request_step` caps a model hook's retries with the agent's output budget (a private attribute)."""
    from pydantic_ai import Agent

    assert Agent("test", retries={"output": 4})._max_output_retries == 4
    assert Agent("test", retries=2)._max_output_retries == 2


def test_the_pydantic_ai_model_resolution_we_read_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_models` knows providers by name without building one, and reads a missing key's variable from the message."""
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.models import infer_model, parse_model_id
    from pydantic_ai.providers import infer_provider_class

    from durable_codemode._models import _KEY_VARIABLE

    assert parse_model_id("openai:gpt-5") == ("openai", "gpt-5")
    assert parse_model_id("gpt-5") == (None, "gpt-5")
    infer_provider_class("anthropic")
    with pytest.raises(ValueError):
        infer_provider_class("nosuchprovider")
    for model, variable in [("openai:gpt-5", "OPENAI_API_KEY"), ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY")]:
        monkeypatch.delenv(variable, raising=False)
        with pytest.raises(UserError) as missing:
            infer_model(model)
        found = _KEY_VARIABLE.search(str(missing.value))
        assert found is not None and found.group(1) == variable, str(missing.value)
    with pytest.raises(UserError, match=r"^Unknown model: nosuchprovider:x"):
        infer_model("nosuchprovider:x")  # before any provider is built: `unknown_model` calls it for this message


def test_the_pydantic_monty_surface_we_read_is_there() -> None:
    # Private in pydantic-monty: `check_sandbox_binary` resolves the binary the way Monty's pools do, and the
    # limits that dumps keep (so new runs' sessions carry `max_compute_seconds`) are in `checkout(limits=...)`.
    import inspect

    from pydantic_monty import Monty, ResourceLimits
    from pydantic_monty._binary import find_monty_binary

    assert callable(find_monty_binary)
    assert {"max_turn_duration_secs", "max_feed_duration_secs", "max_memory"} <= set(ResourceLimits.__annotations__)
    assert "request_timeout" in inspect.signature(Monty).parameters


async def test_the_pydantic_ai_capability_surface_we_call_is_there() -> None:
    """What `_capabilities` calls to run hooks where `agent.run()` runs them (private names pinned).

    An upgrade that moves one fails here instead of silently skipping a hook.
    """
    import inspect
    from contextvars import ContextVar

    from pydantic_ai import Agent
    from pydantic_ai._utils import Some
    from pydantic_ai.capabilities import (
        AbstractCapability,
        CombinedCapability,
        Hooks,
        ProcessHistory,
        WrapperCapability,
    )
    from pydantic_ai.exceptions import SkipModelRequest
    from pydantic_ai.messages import RetryFeedbackPart, RetryInfo
    from pydantic_ai.models import ModelRequestContext

    from durable_codemode.worker._capabilities import APPLIED_HOOKS, REFUSED_HOOKS, _hook_names

    # Every hook of AbstractCapability is either applied or refused with a reason (a new hook fails here).
    unaccounted = _hook_names() - APPLIED_HOOKS - set(REFUSED_HOOKS)
    assert not unaccounted, sorted(unaccounted)
    # The hook signatures `request_through_hooks` and `_Quiet` call and override.
    signatures = {name: list(inspect.signature(getattr(AbstractCapability, name)).parameters) for name in (
        "before_model_request", "prepare_model_request", "after_model_request", "wrap_model_request",
        "on_model_request_error", "before_run", "after_run", "wrap_run", "on_run_error")}
    assert signatures == {
        "before_model_request": ["self", "ctx", "request_context"],
        "prepare_model_request": ["self", "ctx", "request_context"],
        "after_model_request": ["self", "ctx", "request_context", "response"],
        "wrap_model_request": ["self", "ctx", "request_context", "handler"],
        "on_model_request_error": ["self", "ctx", "request_context", "error"],
        "before_run": ["self", "ctx"],
        "after_run": ["self", "ctx", "result"],
        "wrap_run": ["self", "ctx", "handler"],
        "on_run_error": ["self", "ctx", "error"],
    }
    assert [f for f in ("model", "messages", "model_settings", "model_request_parameters")
            if f not in ModelRequestContext.__dataclass_fields__] == []
    assert SkipModelRequest.__init__ is not Exception.__init__ and RetryFeedbackPart and RetryInfo
    assert issubclass(ProcessHistory, AbstractCapability) and "before_model_request" in vars(ProcessHistory)
    # The override slot `probing` sets (private): a ContextVar of `Some(CombinedCapability)` that runs read.
    agent = Agent("test", capabilities=[Hooks()])
    assert isinstance(agent._override_root_capability, ContextVar)
    assert agent._effective_root_capability() is agent.root_capability  # type: ignore[attr-defined]
    quiet = CombinedCapability(list(agent.root_capability.capabilities))
    token = agent._override_root_capability.set(Some(quiet))
    assert agent._effective_root_capability() is quiet  # type: ignore[attr-defined]
    agent._override_root_capability.reset(token)
    assert WrapperCapability.__dataclass_fields__["wrapped"]
    # The attempt loop `_attempts` mirrors (private): its cap and pydantic-ai's record of the attempts moved on from.
    from pydantic_ai._agent_graph import MAX_MODEL_REQUEST_ATTEMPTS
    from pydantic_ai._fallback import AttemptLog
    from pydantic_ai._model_request_attempts import AttemptStart
    from pydantic_ai.capabilities import ModelFallback
    from pydantic_ai.exceptions import FallbackExceptionGroup, RetryModelRequest
    from pydantic_ai.messages import ModelResponse, TextPart

    assert isinstance(MAX_MODEL_REQUEST_ATTEMPTS, int) and MAX_MODEL_REQUEST_ATTEMPTS > 1
    assert list(inspect.signature(AttemptLog.record).parameters)[:6] == [
        "self", "model", "failure", "start", "parent", "tracer"]
    log = AttemptLog()
    log.record(Agent("test").model, RuntimeError("down"), AttemptStart(), parent=None, tracer=None)  # type: ignore[arg-type]
    answered = log.attach(ModelResponse(parts=[TextPart("ok")]))
    assert [(a.outcome, a.error) for a in answered.failed_attempts or []] == [("error", "RuntimeError: down")]
    assert {"attempt", "model_id"} <= set(ModelRequestContext.__dataclass_fields__)
    assert RetryModelRequest("test").model == "test" and issubclass(FallbackExceptionGroup, ExceptionGroup)
    # The capabilities' model settings `_settings` layers between the agent's and the run's (private).
    from pydantic_ai.capabilities import Thinking
    assert Agent("test", capabilities=[Thinking("high")])._cap_model_settings == {"thinking": "high"}
    # The result `CodeModeAgent.after_run` builds for after_run hooks (private state).
    from pydantic_ai import AgentRunResult
    from pydantic_ai._agent_graph import GraphAgentState
    from pydantic_ai.messages import ModelRequest, UserPromptPart
    from pydantic_ai.usage import RunUsage
    history = [ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[TextPart("ok")])]
    built = AgentRunResult(output="ok", _state=GraphAgentState(message_history=history, usage=RunUsage(requests=1)))
    assert (built.output, built.all_messages(), built.usage.requests) == ("ok", history, 1)
    assert ModelFallback("test").models == ["test"] and ModelFallback("test").for_agent(agent).get_model() is None


async def test_the_pydantic_ai_instrumentation_surface_we_call_is_there() -> None:
    import inspect
    from dataclasses import fields

    from pydantic_ai import Agent, RunContext
    from pydantic_ai.capabilities import AbstractCapability, Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings

    # `instrumentation_of` reads what `Agent.iter` resolves (private): the agent's `instrument`, else the default.
    agent = Agent("test")
    assert agent._resolve_instrumentation_settings() is None
    settings = InstrumentationSettings()
    agent.instrument = settings
    assert agent._resolve_instrumentation_settings() is settings
    agent.instrument = True
    assert isinstance(agent._resolve_instrumentation_settings(), InstrumentationSettings)
    # `instrumented_context` copies these settings onto the run context, as `Agent.iter` does.
    assert {"tracer", "include_content", "version"} <= set(vars(settings))
    assert {"tracer", "trace_include_content", "instrumentation_version", "run_id"} <= {
        f.name for f in fields(RunContext)}
    # The capability: built from settings, bound per run by `for_run`, spans made by its model-request and run hooks.
    instrumentation = Instrumentation(settings=settings)
    assert "for_run" in vars(Instrumentation) and inspect.iscoroutinefunction(Instrumentation.for_run)
    for hook in ("wrap_run", "wrap_model_request", "wrap_tool_execute"):
        assert getattr(Instrumentation, hook) is not getattr(AbstractCapability, hook), hook
    assert instrumentation.settings is settings


async def test_the_pydantic_ai_toolset_surface_we_read_is_there() -> None:
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.agent import _build_run_capabilities
    from pydantic_ai.capabilities import Toolset, WrapperCapability
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.toolsets import DynamicToolset, FunctionToolset

    # `registered_capabilities`: a capability's toolset finds its owner in `ctx.capabilities`, keyed as registered.
    owned = Toolset(FunctionToolset([]))
    agent = Agent("test", capabilities=[owned])
    assert owned in _build_run_capabilities(agent.root_capability).values()
    # `_unsupported_toolsets`: a dynamic toolset's factory and whether it is rebuilt per step; an MCP server's
    # per-run auth/headers.
    def factory(ctx: RunContext[None]) -> None:
        return None

    dynamic = DynamicToolset(factory, per_run_step=False)
    assert dynamic.toolset_func is factory and dynamic.per_run_step is False
    assert MCPToolset("http://localhost:9/mcp", headers=lambda ctx: {})._resolves_per_run is True
    assert MCPToolset("http://localhost:9/mcp", headers={"a": "b"})._resolves_per_run is False
    # `_hooks_of` tells a wrapper's own overrides from WrapperCapability's delegation.
    assert "get_toolset" in vars(WrapperCapability) and "before_tool_execute" in vars(WrapperCapability)


def test_the_pydantic_ai_native_tool_surface_we_record_is_there() -> None:
    from pydantic import TypeAdapter
    from pydantic_ai.capabilities import NativeOrLocalTool
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.native_tools import AbstractNativeTool, CodeExecutionTool, WebSearchTool

    # `AgentSpec.native_tools` is recorded in histories: each tool comes back as its own class, by its `kind`.
    adapter = TypeAdapter(list[AbstractNativeTool])
    recorded = adapter.dump_python([WebSearchTool(max_uses=2), CodeExecutionTool()], mode="json")
    assert [t["kind"] for t in recorded] == ["web_search", "code_execution"]
    assert adapter.validate_python(recorded) == [WebSearchTool(max_uses=2), CodeExecutionTool()]
    assert ModelRequestParameters(native_tools=[WebSearchTool()]).native_tools == [WebSearchTool()]
    # `_contributes`: a provider tool with a local fallback has a toolset; one without has none.
    assert NativeOrLocalTool(native=WebSearchTool(), local=False).get_toolset() is None


async def test_the_pydantic_ai_tool_search_surface_we_read_is_there() -> None:
    from pydantic_ai import Agent, RunContext, Tool
    from pydantic_ai.capabilities import ToolSearch
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.native_tools._tool_search import ToolSearchTool

    # `unsupported_tool_search`: the ToolSearch every agent has equals a bare one; any setting makes it differ.
    assert ToolSearch() == ToolSearch() and ToolSearch(strategy="keywords") != ToolSearch()
    # `_provider_tools`: a deferred tool makes ToolSearch add an optional ToolSearchTool to the request, and
    # `describe` reads prepared deferred tools from the request's parameters (the model's list leaves them out).
    seen: list[AgentInfo] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        return ModelResponse(parts=[TextPart("done")])

    def hidden() -> str:
        return "x"

    await Agent(FunctionModel(model), tools=[Tool(hidden, defer_loading=True)]).run("go")
    parameters = seen[0].model_request_parameters
    assert [t.name for t in parameters.function_tools] == ["hidden"] and seen[0].function_tools == []
    assert next(t for t in parameters.native_tools if isinstance(t, ToolSearchTool)).optional is True
    # `call_through_hooks`: a deferred tool is callable once its name is among the discovered ones.
    assert "discovered_tool_names" in {f.name for f in dataclasses.fields(RunContext)}


def test_the_pydantic_ai_model_selection_surface_we_call_is_there() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import CombinedCapability, SelectModel
    from pydantic_ai.models import ModelSelectionContext
    from pydantic_ai.usage import RunUsage

    # `model_selector`: SelectModel contributes its selector as its model; of several, the last one given wins.
    def first(ctx: ModelSelectionContext[None]) -> str:
        return "test"

    def last(ctx: ModelSelectionContext[None]) -> str:
        return "test"

    assert SelectModel(first).get_model() is first
    assert CombinedCapability([SelectModel(first), SelectModel(last)]).get_model() is last
    # `_selected_model` builds the context with these fields.
    agent = Agent("test")
    ctx = ModelSelectionContext(agent=agent, deps=None, model=None, run_step=2, prompt="go", messages=[],
                                usage=RunUsage(), retry=1, max_retries=3, run_id="wf")
    assert (ctx.run_step, ctx.retry, ctx.max_retries, ctx.run_id) == (2, 1, 3, "wf")
    assert isinstance(agent._max_output_retries, int)


def test_the_pydantic_ai_message_preparation_we_call_is_there() -> None:
    from pydantic_ai.messages import (
        ModelRequest,
        RetryFeedbackPart,
        RetryInfo,
        SystemPromptPart,
        UserPromptPart,
        _clean_message_history,
    )
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.models.test import TestModel

    # `send`: consecutive requests are merged, and the raw retry part becomes the user text providers are sent.
    history = [ModelRequest(parts=[UserPromptPart("go")]),
               ModelRequest(parts=[RetryFeedbackPart("try again", retry=RetryInfo("no_output"))])]
    cleaned = _clean_message_history(list(history), repair_last_response=True)
    assert len(cleaned) == 1
    prepared = TestModel().prepare_messages(cleaned, ModelRequestParameters())
    assert not [p for m in prepared if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, RetryFeedbackPart)]
    # `describe` records system prompts with their ref and context id (`DynamicPrompt`).
    part = SystemPromptPart("x", dynamic_ref="f", context_id="system_prompt:f")
    assert (part.dynamic_ref, part.context_id) == ("f", "system_prompt:f")
