"""Compatibility data: names recorded in histories, the public API, and what the runtime relies on of pydantic-ai.

Changing a recorded name or the public API breaks old runs or users. pydantic-ai's private names are pinned one
test per function of `durable_codemode._pydantic_ai` (the one module that touches them), so a new release breaks
each pin on its own and names the function to change; its public API the runtime builds on is checked after.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload

import durable_codemode
from durable_codemode.shared import _names

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


def test_persisted_names_are_pinned() -> None:
    # Every one of these is written into histories; renaming any of them makes running workflows unreplayable.
    assert _names.WORKFLOW_TYPE == "durable-codemode.run"
    assert _names.MODEL_REQUEST_ACTIVITY == "durable-codemode.model_request"
    assert _names.DESCRIBE_AGENT_ACTIVITY == "durable-codemode.describe_agent"
    assert _names.SEAL_REPL_ACTIVITY == "durable-codemode.seal_repl"
    assert _names.OUTPUT_ACTIVITY == "durable-codemode.output"
    assert _names.RUN_ERROR_ACTIVITY == "durable-codemode.on_run_error"
    assert _names.RUN_CODE_TOOL == "run_code"
    assert _names.tool_activity_type("cart", "list_cart") == "cart.list_cart"
    assert _names.nested_call_id("call_1", 7) == "call_1.7"
    assert _names.tool_activity_id("call_1.7", "get", {"i": 3}) == "call_1.7-" + _names.call_digest("get", {"i": 3})
    # The digest in every tool call's activity id (a replay compares ids): canonical, whatever the key order, sets
    # in order; a change to it makes every open run's next replay diverge.
    assert [_names.call_digest("get", args) for args in (
        {"i": 3}, {"b": "x", "a": 1.5, "c": None, "d": True}, {"q": {"z": 1, "a": [1, {2, 1}]}, "p": (1, 2)}, {},
    )] == ["c185047189", "ef08ce6dd6", "d406090fa3", "b2d11b8c31"]
    assert _names.BATCH_ACTIVITY == "durable-codemode.tool_batch"
    # A batch's id: its first call, how many, a digest of every call's id and arguments (sets canonical).
    assert _names.batch_activity_id(["call_1.0", "call_1.1"], "get", [{"i": 0}, {"i": {2, 1}}]) == (
        "call_1.0+2-c3f13b317c")
    # Search attributes and memo keys are registered on servers and read by `codemode runs` and the UI's saved queries.
    assert (_names.AGENT_SEARCH_ATTRIBUTE, _names.STATUS_SEARCH_ATTRIBUTE) == ("CodemodeAgent", "CodemodeStatus")
    assert (_names.AGENT_MEMO, _names.STATUS_MEMO) == ("agent", "status")
    assert (_names.STATUS_RUNNING, _names.STATUS_WAITING) == ("running", "waiting")
    assert (_names.STATUS_COMPLETED, _names.STATUS_FAILED, _names.STATUS_CANCELLED) == ("completed", "failed",
                                                                                        "cancelled")
    # Approvals: update and signal names, and the update id a decision goes under (clients of every release send
    # it; the validator accepts a decision under an id of this form only if it is that approver's about that call).
    from durable_codemode.shared import _approvals, _decisions

    assert (_approvals.DECIDE_UPDATE, _approvals.DECIDE_ALL_UPDATE) == ("decide", "decide_all")
    assert (_approvals.APPROVE_SIGNAL, _approvals.DENY_SIGNAL) == ("approve", "deny")
    assert (_approvals.PENDING_APPROVALS_QUERY, _approvals.REJECTED_DECISIONS_QUERY) == (
        "pending_approvals", "rejected_decisions")
    assert _decisions.decision_update_id("call_1.7", "ana") == "call_1.7 by ana"
    assert _decisions.decision_update_id("call_1.7", None) == "call_1.7"
    # A worker asks a run for the messages and tools a model request refers to (behaviour version 4) by these.
    assert (_names.CONVERSATION_QUERY, _names.MODEL_TOOLS_QUERY) == ("durable-codemode.conversation",
                                                                     "durable-codemode.model_tools")


def test_persisted_payload_shapes_are_pinned() -> None:
    # A tool activity's input and a call's record are read back from histories recorded by older releases, and
    # written for newer ones: both shapes of each stay readable.
    from datetime import UTC, datetime

    from pydantic import TypeAdapter

    from durable_codemode import CallRecord
    from durable_codemode._converter import DATA_CONVERTER
    from durable_codemode.shared._activity_io import ToolCallInput

    converter = DATA_CONVERTER.payload_converter
    compact = converter.to_payload(ToolCallInput(args={"i": 3}))
    assert compact is not None and compact.data == b'{"args":{"i":3}}'  # the tool and call id: the activity's
    # Written by 0.1.0 (its runs are refused, but a call it scheduled may still reach a worker): the names ignored.
    old = Payload(metadata={"encoding": b"json/plain"}, data=b'{"tool":"get","args":{"i":3},"call_id":"call_1.7"}')
    assert converter.from_payload(old, ToolCallInput) == ToolCallInput(args={"i": 3})
    # Every run records the behaviour version it was started with; 0.1.0's recorded none (version 0).
    from durable_codemode.shared._types import BEHAVIOR_VERSION, OLDEST_BEHAVIOR_VERSION, RELEASES_BY_BEHAVIOR_VERSION

    assert (BEHAVIOR_VERSION, OLDEST_BEHAVIOR_VERSION) == (4, 1)
    assert RELEASES_BY_BEHAVIOR_VERSION == {0: "durable-codemode 0.1.0"}
    # From behaviour version 2, a call an approval rule gates records this marker; a replay reads it.
    from durable_codemode.shared._types import RECORDED_RULE_VERDICTS

    assert RECORDED_RULE_VERDICTS == 2
    assert _names.approval_verdict_marker(3, "call_0.1") == "durable-codemode.approval.3.call_0.1"
    assert _names.call_id_of_activity(_names.tool_activity_id("call_1-a.7", "get", {})) == "call_1-a.7"
    assert _names.tool_of_activity_type(_names.tool_activity_type("my.agent", "get")) == "get"
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    record = CallRecord(call_id="c.0", tool="get", args="{}", status="ok", result="1", started_at=at, finished_at=at)
    wire = converter.to_payload(record)
    assert wire is not None and wire.data == b'["c.0","get","{}","ok","1","2026-01-02T03:04:05.000006Z",0]'
    named = ('{"call_id":"c.0","tool":"get","args":"{}","status":"ok","result":"1",'
             '"started_at":"2026-01-02T03:04:05.000006Z","finished_at":"2026-01-02T03:04:05.000006Z"}')
    assert TypeAdapter(CallRecord).validate_json(named) == record == converter.from_payload(wire, CallRecord)
    # Workflow code builds its records without validation (`CallRecord.made`): the same record, the same bytes.
    made = CallRecord.made(call_id="c.0", tool="get", args="{}", status="ok", result="1", started_at=at,
                           finished_at=at)
    assert made == record and converter.to_payload(made) == wire
    # A record's previews are in the run's result and what the model is told: ints and None skip the serializers.
    from durable_codemode.shared._results import one_line

    assert [one_line(v) for v in (3, -2**70, None, True, 1.5, "a \n b", {"i": [1]})] == [
        "3", "-1180591620717411303424", "null", "true", "1.5", "a b", '{"i": [1]}']


def _over_a_hundred_dollars(args: dict[str, Any]) -> bool:
    """An approval rule."""
    return bool(args["cents"] > 10_000)


def test_what_deploys_are_compared_by_is_pinned() -> None:
    # A run's output fingerprint is computed by the workflow code of the release that scheduled the output check and
    # compared by the worker that runs it; a rule's fingerprint is recorded by the worker that started the run and
    # compared by `check-deploy` of a later release. Both must stay the same across releases (a rule's also depends
    # on the Python minor version: its AST dump).
    from pydantic_ai.tools import ToolDefinition

    from durable_codemode._deployments import VERSION_SEARCH_ATTRIBUTE
    from durable_codemode.shared._types import OutputSpec
    from durable_codemode.worker._rules import rule_fingerprint
    from durable_codemode.workflow._fingerprints import recorded_output

    assert recorded_output(None).fingerprint == "b0d387a0a578820f"
    city = ToolDefinition(name="final_result", kind="output", parameters_json_schema={
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    shape = recorded_output(OutputSpec(mode="tool", tools=[city], allows_text=False))
    assert (shape.fingerprint, shape.summary()) == ("1eb2b4c03d258468", "output tool final_result {city: string}")
    assert rule_fingerprint(_over_a_hundred_dollars) == "6e831de5fefcd9d0"
    # Temporal's own search attribute of a versioned run, which `codemode runs --version` reads and filters by.
    assert VERSION_SEARCH_ATTRIBUTE == "TemporalWorkerDeploymentVersion"


def test_the_tool_usage_envelope_is_pinned() -> None:
    # A tool call whose sub-agent used the model records its result in this envelope (`_tool_usage`); a replay
    # counts the usage from it, so its key and shape are history.
    from pydantic_ai.usage import RunUsage

    from durable_codemode._converter import DATA_CONVERTER
    from durable_codemode.shared._tool_usage import USAGE_KEY, split_usage, with_usage

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
    # The query a client reads a run's children from (clients and workers of a release must agree on it).
    assert _names.CHILD_RUNS_QUERY == "durable-codemode.child_runs"
    # A child_run_tool(deps=...): the activity deriving the child's deps, its id, and the tool metadata saying so.
    assert _names.CHILD_DEPS_ACTIVITY == "durable-codemode.child_deps"
    assert _names.child_deps_activity_id("call_0.2") == "call_0.2-child-deps"
    assert _names.CHILD_DEPS_METADATA == "codemode_child_deps"


def test_what_a_signed_decision_covers_is_pinned() -> None:
    # Approvers' clients and the workers must sign and verify the same bytes: a changed byte refuses every
    # decision signed by the other side's release.
    from datetime import UTC, datetime

    from durable_codemode.shared._signing import legacy_signing_payload, signing_payload

    fields: dict[str, Any] = {"namespace": "default", "run_id": "shop-1", "call_id": "call_0.1", "approved": True,
                              "note": "ok", "approver": "ana", "expires_at": datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)}
    fingerprint = _names.call_fingerprint("refund", {"order": "A", "cents": 500})
    assert fingerprint == _names.call_fingerprint("refund", {"cents": 500, "order": "A"})
    assert fingerprint.startswith(_names.call_digest("refund", {"order": "A", "cents": 500})) and len(fingerprint) == 64
    assert signing_payload(**fields, call_fingerprint=fingerprint) == (
        b'{"approved":true,"approver":"ana","call":"' + fingerprint.encode() + b'","call_id":"call_0.1",'
        b'"expires_at":"2030-01-02T03:04:05+00:00","namespace":"default","note":"ok","run_id":"shop-1"}')
    # What clients of 0.2.0 and before signed: workers recognise it, to refuse it by name.
    assert legacy_signing_payload(**fields) == (
        b'{"approved":true,"approver":"ana","call_id":"call_0.1","expires_at":"2030-01-02T03:04:05+00:00",'
        b'"namespace":"default","note":"ok","run_id":"shop-1"}')


def test_the_event_stream_names_are_pinned() -> None:
    # Subscribers of one release read runs published by another: the topics, the query, Workflow Streams' own
    # wire names we use, and every code-mode event's registered name are compatibility data.
    from durable_codemode import events
    from durable_codemode.client import _stream
    from durable_codemode.shared import _run_events
    from durable_codemode.workflow import _event_stream

    assert _names.STREAM_INFO_QUERY == "durable-codemode.stream_info"
    assert (_run_events.EVENTS_TOPIC, _run_events.model_topic(3, 2)) == ("codemode.events", "codemode.model:3:2")
    assert _run_events.model_topic_parts("codemode.model:3:2") == (3, 2)
    assert _run_events.model_topic_parts("codemode.model:3") is None
    assert _event_stream.PUBLISH_SIGNAL == "__temporal_workflow_stream_publish"
    assert _stream._POLL_QUERY == "__temporal_workflow_stream_poll"
    names = {cls.__name__: cls._registered_name for cls in vars(events).values()
             if isinstance(cls, type) and issubclass(cls, events.CodeModeEvent) and cls is not events.CodeModeEvent}
    assert names == {
        "RunStartEvent": "codemode.run_start", "ModelRequestStartEvent": "codemode.model_request",
        "ModelStreamResetEvent": "codemode.model_stream_reset", "SnippetStartEvent": "codemode.snippet_start",
        "NestedCallStartEvent": "codemode.nested_call_start", "NestedCallEndEvent": "codemode.nested_call_end",
        "PrintEvent": "codemode.print", "ApprovalWaitEvent": "codemode.approval_wait",
        "ApprovalDecidedEvent": "codemode.approval_decided", "ChildRunStartEvent": "codemode.child_run_start",
        "ChildRunEndEvent": "codemode.child_run_end", "ComputeEscalatedEvent": "codemode.compute_escalated",
        "SnippetEndEvent": "codemode.snippet_end", "RunContinuedEvent": "codemode.continued_as_new",
        "RunEndEvent": "codemode.run_end", "EventsTrimmedEvent": "codemode.events_trimmed",
    }


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


# -- pydantic-ai's private names: one pin per function of `durable_codemode._pydantic_ai` --------------------------
# Each test exercises one seam function on the installed pydantic-ai and checks the one thing the runtime relies on;
# a release that moves the private name fails that test alone, and its message names the function to change.


def _change(function: str) -> str:
    from durable_codemode._pydantic_ai import PRIVATE_NAMES

    private, public = PRIVATE_NAMES[function]
    return (f"pydantic-ai moved {private}: change durable_codemode._pydantic_ai.{function} (by feature detection, "
            f"keeping the releases already supported); the public API that would replace it: {public}")


def _scripted_agent(**options: Any) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("done")])

    return Agent(FunctionModel(answer), **options)


def test_every_private_name_has_a_pin() -> None:
    from durable_codemode import _pydantic_ai

    pinned = {name.removeprefix("test_pin_") for name in globals() if name.startswith("test_pin_")}
    assert set(_pydantic_ai.PRIVATE_NAMES) == pinned == set(_pydantic_ai.__all__) - {"PRIVATE_NAMES", "AgentSettings"}


async def test_pin_override_root_capability() -> None:
    from pydantic_ai.capabilities import Hooks

    from durable_codemode._pydantic_ai import override_root_capability

    seen: list[str] = []
    own, other = Hooks(), Hooks()
    own.on.before_run(lambda ctx: seen.append("own"))
    other.on.before_run(lambda ctx: seen.append("override"))
    agent = _scripted_agent(capabilities=[own])
    with override_root_capability(agent, [*[c for c in agent.root_capability.capabilities if c is not own], other]):
        await agent.run("go")
    await agent.run("go")
    assert seen == ["override", "own"], _change("override_root_capability")


async def test_pin_start_step() -> None:
    from pydantic_ai import ModelRequestNode
    from pydantic_ai.capabilities import Hooks
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    from durable_codemode._pydantic_ai import start_step

    seen: list[tuple[int, int]] = []
    hooks = Hooks()

    @hooks.on.before_model_request
    async def record(ctx: Any, request_context: Any) -> Any:
        seen.append((ctx.run_step, ctx.retry))
        return request_context

    agent = _scripted_agent(capabilities=[hooks], retries={"output": 5})
    async with agent.iter(None, message_history=[ModelRequest(parts=[UserPromptPart("go")])]) as run:
        node = await run.next(run.next_node)
        assert isinstance(node, ModelRequestNode)
        start_step(run, run_step=4, output_retries=2)
        await run.next(node)
    assert seen == [(4, 2)], _change("start_step")


def test_pin_registered_hooks() -> None:
    from pydantic_ai.capabilities import Hooks

    from durable_codemode._pydantic_ai import registered_hooks

    hooks = Hooks()
    hooks.on.before_tool_execute(lambda ctx, *, call, tool_def, args: args)
    assert registered_hooks(hooks) == {"before_tool_execute"}, _change("registered_hooks")


def test_pin_run_capabilities() -> None:
    from pydantic_ai.capabilities import Toolset
    from pydantic_ai.toolsets import FunctionToolset

    from durable_codemode._pydantic_ai import run_capabilities

    owned = Toolset(FunctionToolset([]))
    assert owned in run_capabilities(_scripted_agent(capabilities=[owned])).values(), _change("run_capabilities")


def test_pin_instrumentation_settings() -> None:
    from pydantic_ai.models.instrumented import InstrumentationSettings

    from durable_codemode._pydantic_ai import instrumentation_settings

    plain, instrumented = _scripted_agent(), _scripted_agent()
    settings = InstrumentationSettings()
    instrumented.instrument = settings
    assert (instrumentation_settings(plain), instrumentation_settings(instrumented)) == (None, settings), \
        _change("instrumentation_settings")


def test_pin_agent_run_result() -> None:
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
    from pydantic_ai.usage import RunUsage

    from durable_codemode._pydantic_ai import agent_run_result

    history = [ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[TextPart("ok")])]
    built = agent_run_result("ok", history, RunUsage(requests=1))
    assert (built.output, built.all_messages(), built.usage.requests) == ("ok", history, 1), \
        _change("agent_run_result")


async def test_pin_step_run_context() -> None:
    from pydantic_ai import ModelRequestNode
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    from durable_codemode._pydantic_ai import step_run_context

    agent = _scripted_agent(deps_type=str)
    async with agent.iter(None, message_history=[ModelRequest(parts=[UserPromptPart("go")])], deps="the deps") as run:
        node = await run.next(run.next_node)
        assert isinstance(node, ModelRequestNode)
        context = step_run_context(run)
    assert (context.deps, context.run_id) == ("the deps", run.run_id), _change("step_run_context")


def test_pin_output_types() -> None:
    from pydantic import BaseModel
    from pydantic_ai import NativeOutput

    from durable_codemode._pydantic_ai import output_types

    class Answer(BaseModel):
        n: int

    def to_int(text: str) -> int:
        return int(text)

    assert output_types([NativeOutput(Answer), str]) == [Answer, str] and output_types(to_int) == [int], \
        _change("output_types")


def test_pin_agent_settings() -> None:
    from durable_codemode._pydantic_ai import AgentSettings, agent_settings

    plain = _scripted_agent()
    configured = _scripted_agent(retries={"output": 4, "tools": 3}, metadata={"team": "a"}, max_concurrency=2)
    configured.output_validator(lambda output: output)
    assert (agent_settings(plain), agent_settings(configured)) == (
        AgentSettings(tool_retries=1, output_retries=1, has_output_validators=False, has_metadata=False,
                      has_concurrency_limit=False),
        AgentSettings(tool_retries=3, output_retries=4, has_output_validators=True, has_metadata=True,
                      has_concurrency_limit=True)), _change("agent_settings")


def test_pin_resolves_per_run() -> None:
    from pydantic_ai.mcp import MCPToolset

    from durable_codemode._pydantic_ai import resolves_per_run

    per_run = MCPToolset("http://localhost:9/mcp", headers=lambda ctx: {})
    fixed = MCPToolset("http://localhost:9/mcp", headers={"a": "b"})
    assert (resolves_per_run(per_run), resolves_per_run(fixed)) == (True, False), _change("resolves_per_run")


# -- pydantic-ai's public API the runtime builds on: an early warning, one concern per test ------------------------


def test_every_capability_hook_is_applied_or_refused_by_name() -> None:
    from durable_codemode.worker._capabilities import APPLIED_HOOKS, REFUSED_HOOKS, _hook_names

    unaccounted = _hook_names() - APPLIED_HOOKS - set(REFUSED_HOOKS)
    assert not unaccounted, (f"pydantic-ai has capability hooks durable-codemode neither applies nor refuses: "
                             f"{sorted(unaccounted)}; add each to APPLIED_HOOKS (where a durable run calls it) or "
                             "REFUSED_HOOKS (with why) in durable_codemode/worker/_capabilities.py")


def test_the_hook_signatures_the_masks_override_are_there() -> None:
    """`_Quiet` and the model step's `_StepCapability` override these hooks with these parameters."""
    import inspect

    from pydantic_ai.capabilities import AbstractCapability

    from durable_codemode.worker._capabilities import _Quiet
    from durable_codemode.worker._model_step import _StepCapability

    def parameters(function: Any) -> list[str]:
        if isinstance(function, property):  # `has_on_event` and the like: a property on both, or the test fails
            return ["property"]
        return list(inspect.signature(function).parameters)

    mismatched = [f"{mask.__name__}.{name}" for mask in (_Quiet, _StepCapability) for name in vars(mask)
                  if hasattr(AbstractCapability, name) and not name.startswith("_")
                  and parameters(vars(mask)[name]) != parameters(inspect.getattr_static(AbstractCapability, name))]
    assert not mismatched, f"pydantic-ai changed these hooks' parameters; change the masks' overrides: {mismatched}"


def test_the_agent_override_and_iter_parameters_the_model_step_passes_are_there() -> None:
    import inspect

    from pydantic_ai import Agent

    missing = ({"toolsets", "tools", "native_tools", "instructions"} - set(inspect.signature(Agent.override).parameters)
               ) | ({"message_history", "model", "deps", "model_settings", "usage", "run_id", "conversation_id"}
                    - set(inspect.signature(Agent.iter).parameters))
    assert not missing, f"worker/_model_step.py passes these, which pydantic-ai no longer takes: {missing}"


async def test_the_words_the_run_loop_copies_from_pydantic_ai_are_its_words() -> None:
    """`workflow/_loop.NOT_RUN` is pydantic-ai's answer to a function call that the output ended first.

    Read from what `agent.run()` answers such a call with, so a release that rewords it fails here.
    """
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from durable_codemode.workflow._loop import NOT_RUN

    class Answer(BaseModel):
        n: int

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("final_result", {"n": 1}, tool_call_id="o"),
                                    ToolCallPart("lookup", {}, tool_call_id="f")])

    agent = Agent(FunctionModel(answer), output_type=Answer, end_strategy="early")
    agent.tool_plain(name="lookup")(lambda: "looked up")
    last = (await agent.run("go")).all_messages()[-1]
    assert isinstance(last, ModelRequest)
    said = {p.tool_call_id: p.content for p in last.parts if isinstance(p, ToolReturnPart)}
    assert said.get("f") == NOT_RUN, (f"pydantic-ai now answers a call the output ended first with {said.get('f')!r}; "
                                      "set NOT_RUN in durable_codemode/workflow/_loop.py to it (new runs only: "
                                      "recorded runs keep what they recorded)")


def test_the_recorded_tools_are_a_toolset_pydantic_ai_offers() -> None:
    """`RecordedTools` builds `ToolsetTool`s with these fields (the model step offers them as recorded)."""
    import dataclasses

    from pydantic_ai.toolsets.abstract import ToolsetTool

    assert {"toolset", "tool_def", "max_retries", "args_validator"} <= {f.name for f in dataclasses.fields(ToolsetTool)}


def test_the_run_context_fields_the_worker_sets_are_there() -> None:
    from pydantic_ai import RunContext

    fields = {f.name for f in dataclasses.fields(RunContext)}
    missing = {"deps", "model", "usage", "agent", "tool_name", "tool_call_id", "retry", "retries", "max_retries",
               "run_id", "conversation_id", "capabilities", "validation_context", "discovered_tool_names", "tracer",
               "trace_include_content", "instrumentation_version", "messages", "prompt", "run_step",
               "model_settings"} - fields
    assert not missing, f"CodeModeAgent.run_context and instrumented_context set these RunContext fields: {missing}"


def test_the_model_selection_context_the_selector_gets_is_there() -> None:
    from pydantic_ai.models import ModelSelectionContext
    from pydantic_ai.usage import RunUsage

    ctx = ModelSelectionContext(agent=_scripted_agent(), deps=None, model=None, run_step=2, prompt="go", messages=[],
                                usage=RunUsage(), retry=1, max_retries=3, run_id="wf")
    assert (ctx.run_step, ctx.retry, ctx.max_retries, ctx.run_id) == (2, 1, 3, "wf")


async def test_tool_search_is_told_by_its_public_kind() -> None:
    """`_provider_tools` leaves out pydantic-ai's optional `ToolSearchTool` (not exported) by its `kind`."""
    from pydantic_ai import Agent, Tool
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    seen: list[AgentInfo] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        return ModelResponse(parts=[TextPart("done")])

    def hidden() -> str:
        return "x"

    await Agent(FunctionModel(model), tools=[Tool(hidden, defer_loading=True)]).run("go")
    parameters = seen[0].model_request_parameters
    assert [t.name for t in parameters.function_tools] == ["hidden"] and seen[0].function_tools == []
    assert [(t.kind, t.optional) for t in parameters.native_tools] == [("tool_search", True)]


def test_system_prompt_parts_keep_their_ref() -> None:
    from pydantic_ai.messages import SystemPromptPart

    if "context_id" not in SystemPromptPart.__dataclass_fields__:
        pytest.skip("SystemPromptPart.context_id (for on_change='append') needs pydantic-ai 2.68 or newer; this "
                    "release has neither, and the runtime builds its parts without it")

    part = SystemPromptPart("x", dynamic_ref="f", context_id="system_prompt:f")
    assert (part.dynamic_ref, part.context_id) == ("f", "system_prompt:f")


def test_every_agent_option_is_applied_or_refused() -> None:
    """A new `Agent(...)` option in a pydantic-ai release fails here until it is applied or refused by name."""
    import inspect

    from pydantic_ai import Agent

    known = {
        "model", "output_type", "instructions", "system_prompt", "deps_type", "name", "description",
        "model_settings", "retries", "validation_context", "end_strategy", "tools", "toolsets", "capabilities",
        "defer_model_check", "tool_timeout",  # applied (docs/agents.md, "Bring your pydantic-ai agent")
        "metadata", "max_concurrency",  # refused by name (CodeModeAgent)
    }
    new = set(inspect.signature(Agent.__init__).parameters) - known - {"self"}
    assert not new, (f"pydantic-ai's Agent takes options durable-codemode does not know: {sorted(new)}; apply each "
                     "(and document it in docs/agents.md) or refuse it by name in worker/_agent.py's _unsupported")


def test_the_encrypted_payload_format_is_pinned() -> None:
    # Histories hold payloads sealed by earlier releases: this one must open them. The format: metadata `encoding:
    # binary/encrypted` and `encryption-key-id`, data = 12-byte nonce + AES-256-GCM(serialized Payload), with
    # associated data "durable-codemode/aes-256-gcm/" + key id.
    import base64

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from durable_codemode import EncryptionCodec, EncryptionKeys
    from durable_codemode._encryption import ENCRYPTED_ENCODING, ENCRYPTION_KEYS_ENV, KEY_ID_METADATA

    assert (ENCRYPTED_ENCODING, KEY_ID_METADATA, ENCRYPTION_KEYS_ENV) == (
        b"binary/encrypted", "encryption-key-id", "CODEMODE_ENCRYPTION_KEYS")
    key, nonce = bytes(range(32)), bytes(range(12))
    inner = Payload(metadata={"encoding": b"json/plain"}, data=b'"pinned"')
    sealed = Payload(metadata={"encoding": b"binary/encrypted", "encryption-key-id": b"k1"},
                     data=nonce + AESGCM(key).encrypt(nonce, inner.SerializeToString(),
                                                      b"durable-codemode/aes-256-gcm/k1"))
    codec = EncryptionCodec(EncryptionKeys.parse("k1:" + base64.b64encode(key).decode()))
    assert codec.decrypt([sealed]) == [inner]
