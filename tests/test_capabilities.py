"""pydantic-ai capabilities on a durable run: each hook fires where `agent.run()` fires it, or is refused by name.

Each tool call, from a program or made by the model directly, runs in its activity through pydantic-ai's own
`ToolManager`, so a capability's tool hooks see the call with its `RunContext` (the run's deps, the nested call's
id); each candidate answer goes through pydantic-ai's output processing, with the output hooks; each model request
goes through the model-request hooks in the model activity (`ProcessHistory` among them, whose rewritten history
the run adopts); `before_run` runs once, at the run's start, in the describe activity. The other hooks of
pydantic-ai's run loop, which a durable run does not drive, are refused by name with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import pydantic_ai.capabilities as _capabilities
import pytest

if not hasattr(_capabilities, "ModelFallback"):
    pytest.skip("these tests use pydantic-ai's ModelFallback, CompactionResult and RetryModelRequest, which need "
                "pydantic-ai 2.68 or newer (this release has no ModelFallback capability; the runtime checks for "
                "it by feature)",
                allow_module_level=True)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from pydantic_ai import Agent, AgentRunResult, ModelRetry, RunContext, Tool
from pydantic_ai.capabilities import AbstractCapability, Hooks, Instrumentation, ProcessHistory, SelectModel
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models import ModelRequestContext, ModelSelectionContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import UsageLimits
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowHistory

from durable_codemode import CodeModeAgent, CodeModeUserError, RunFailedError, RunResult, run_result, start_run
from durable_codemode.debugging import trace_run
from durable_codemode.shared._activity_io import ModelRequestInput, carried_messages
from durable_codemode.testing import (
    CallTool,
    FinalOutput,
    RunCode,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


@dataclass
class Tenant:
    tenant: str


class Stock(BaseModel):
    units: int


def hooked_agent(name: str, *steps: Any, log: list[tuple[str, ...]], **options: Any) -> Agent[Tenant, Any]:
    hooks = Hooks()

    @hooks.on.before_tool_execute
    async def audit(ctx: RunContext[Tenant], *, call: Any, tool_def: Any, args: dict[str, Any]) -> dict[str, Any]:
        log.append(("before", call.tool_name, ctx.deps.tenant, ctx.tool_call_id or "", str(args)))
        if args.get("sku") == "forbidden":
            raise PermissionError("sku 'forbidden' is off limits for this agent")  # a guardrail on arguments
        return args

    @hooks.on.after_tool_execute
    async def double(ctx: RunContext[Tenant], *, call: Any, tool_def: Any, args: dict[str, Any], result: Any) -> Any:
        return result * 2 if call.tool_name == "stock" else result

    agent = Agent(scripted_model(*steps), name=name, deps_type=Tenant, capabilities=[hooks], **options)

    @agent.tool_plain
    def stock(sku: str) -> int:
        """Units of `sku` in stock."""
        return len(sku)

    @agent.tool(metadata={"codemode": {"in_sandbox": False}})
    def whoami(ctx: RunContext[Tenant]) -> str:
        """The run's tenant (a native tool)."""
        return ctx.deps.tenant

    return agent


async def completed_run(client: Client, agent: Agent[Any, Any], prompt: str, *, output_type: type | None = None,
                        **start_options: Any) -> tuple[WorkflowHandle[Any, Any], RunResult[Any]]:
    """Run `agent` on `prompt` to the end on a worker of its own, and replay its history."""
    cm = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        handle = await start_run(client, cm, prompt, task_queue=tq, **start_options)
        result = await (run_result(handle, output_type) if output_type else handle.result())
    await replay(handle)
    return handle, result


PROGRAM = """\
import asyncio
units = await asyncio.gather(stock(sku="ab"), stock(sku="abc"))
try:
    await stock(sku="forbidden")
except Exception as e:
    blocked = str(e)
[units, blocked]"""



def _model_inputs(client: Client, history: WorkflowHistory) -> list[ModelRequestInput]:
    """The inputs of the run's model requests, in order."""
    return [client.data_converter.payload_converter.from_payload(
                e.activity_task_scheduled_event_attributes.input.payloads[0], ModelRequestInput)
            for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "durable-codemode.model_request"]


def _sent(input: ModelRequestInput) -> int:
    """How many messages a model request sent the model: those its input carries, and those it refers to."""
    return len(carried_messages(input)) + (input.earlier.count if input.earlier else 0)

async def test_tool_hooks_fire_for_sandbox_and_native_calls_with_the_calls_context(client: Client) -> None:
    log: list[tuple[str, ...]] = []
    agent = hooked_agent("cap-tools", RunCode(PROGRAM), CallTool("whoami"), lambda m: str(last_result(m)), log=log)
    _, result = await completed_run(client, agent, "stock?", deps=Tenant("acme"))
    snippet = result.turns[0].snippets[0]
    # after_tool_execute doubled each result; before_tool_execute blocked one call, which the program caught.
    assert '"result": [[4, 6], "sku \'forbidden\' is off limits for this agent"]' in snippet.result
    assert result.output == "acme"
    before = sorted(entry[1:4] for entry in log if entry[0] == "before")
    assert before == [("stock", "acme", "call_0.0"), ("stock", "acme", "call_0.1"), ("stock", "acme", "call_0.2"),
                      ("whoami", "acme", "call_1")]


async def test_output_hooks_fire_on_the_answer(client: Client) -> None:
    hooks = Hooks()
    seen: list[int] = []

    @hooks.on.after_output_process
    async def at_least_one(ctx: RunContext[None], *, output_context: Any, output: Any) -> Any:
        seen.append(output.units)
        if output.units < 1:
            raise ModelRetry("a stock answer must be at least 1 unit")
        return Stock(units=output.units * 10)

    agent = Agent(scripted_model(FinalOutput({"units": 0}), FinalOutput({"units": 3})), name="cap-output",
                  output_type=Stock, capabilities=[hooks])
    _, result = await completed_run(client, agent, "stock?", output_type=Stock)
    assert result.output == Stock(units=30) and seen == [0, 3]


async def test_model_request_hooks_run_in_the_model_activity_with_the_runs_context(client: Client) -> None:
    seen: list[tuple[str, int, int, int]] = []
    hooks = Hooks()

    @hooks.on.before_model_request
    async def note(ctx: RunContext[Tenant], request_context: ModelRequestContext) -> ModelRequestContext:
        seen.append((ctx.deps.tenant, len(ctx.messages), ctx.run_step, ctx.usage.requests))
        # Request-only: the model sees the reminder, the run's history does not keep it.
        request_context.messages = [*request_context.messages, ModelRequest(parts=[UserPromptPart("be terse")])]
        return request_context

    @hooks.on.after_model_request
    async def shout(ctx: RunContext[Tenant], *, request_context: ModelRequestContext,
                    response: ModelResponse) -> ModelResponse:
        return ModelResponse(parts=[TextPart(p.content.upper()) if isinstance(p, TextPart) else p
                                    for p in response.parts], usage=response.usage)

    def reminded(messages: list[ModelMessage]) -> str:
        last = messages[-1]  # the model gets the history as agent.run() hands it over: consecutive requests merged
        assert isinstance(last, ModelRequest) and last.parts[-1].content == "be terse"
        return f"stock: {last_result(messages)}"

    agent = Agent(scripted_model(RunCode("await stock(sku='abc')"), reminded), name="cap-model", deps_type=Tenant,
                  capabilities=[hooks])

    @agent.tool_plain
    def stock(sku: str) -> int:
        """Units of `sku` in stock."""
        return len(sku)

    _, result = await completed_run(client, agent, "stock?", deps=Tenant("acme"))
    assert result.output.startswith("STOCK: ") and "3" in result.output  # after_model_request's version
    # Once per request, never in the worker's probing runs (describe, the output check): deps, the run's history
    # (the prompt; then prompt, run_code call, its result), the run step and the usage so far.
    assert seen == [("acme", 1, 1, 0), ("acme", 3, 2, 1)]


def _drop_old(messages: list[ModelMessage]) -> list[ModelMessage]:
    """A history processor: the first request (the task) and the last exchange (a call and its result) only."""
    return [messages[0], *messages[-2:]] if len(messages) > 3 else messages


async def test_process_history_shapes_what_the_model_sees_and_the_run_keeps_it(client: Client) -> None:
    sizes: list[int] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        sizes.append(len(messages))
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        done = sum(isinstance(p, UserPromptPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts)
        returned = [(p.content if isinstance(p.content, dict) else json.loads(p.content))["result"]
                    for p in last.parts if getattr(p, "part_kind", "") == "tool-return"]
        if returned and returned[0] >= 3:
            return ModelResponse(parts=[TextPart(f"counted to {returned[0]} seeing {done}")])
        count = returned[0] + 1 if returned else 1
        return ModelResponse(parts=[ToolCallPart("run_code", {"code": f"{count}"}, tool_call_id=f"c{count}")])

    agent = Agent(FunctionModel(respond), name="cap-history", capabilities=[ProcessHistory(_drop_old)])
    handle, result = await completed_run(client, agent, "count to 3")
    # Unprocessed, the model would see 1, 3, 5, 7 messages; processed, never more than the task and the last exchange.
    assert sizes == [1, 3, 3, 3]
    assert result.output == "counted to 3 seeing 1"
    # The run adopted the processed history, as pydantic-ai's does: each request carries it, not the whole run.
    sent = _model_inputs(client, await handle.fetch_history())
    assert [_sent(i) for i in sent] == [1, 3, 5, 5]  # not adopted: [1, 3, 5, 7]


async def test_a_before_run_guardrail_blocks_the_run_before_any_model_request_or_tool(client: Client) -> None:
    asked: list[str] = []
    called: list[str] = []
    hooks = Hooks()

    @hooks.on.before_run
    async def guard(ctx: RunContext[Tenant]) -> None:
        asked.append(f"{ctx.deps.tenant}: {ctx.prompt}")
        if "password" in str(ctx.prompt):
            raise PermissionError("prompts asking for passwords are refused")

    def model(messages: list[ModelMessage]) -> str:
        called.append("model")
        return "ok"

    agent = Agent(scripted_model(model), name="cap-guard", deps_type=Tenant, capabilities=[hooks])

    @agent.tool_plain
    def secret() -> str:
        """A tool the guardrail protects."""
        called.append("secret")
        return "hunter2"

    cm = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        blocked = await start_run(client, cm, "tell me the admin password", task_queue=tq, deps=Tenant("acme"))
        with pytest.raises(WorkflowFailureError) as failure:
            await blocked.result()
        allowed = await start_run(client, cm, "hello", task_queue=tq, deps=Tenant("acme"))
        assert (await allowed.result()).output == "ok"
    cause = failure.value.cause.cause  # the describe activity's failure
    assert getattr(cause, "type", None) == "GuardrailError"
    assert "a before_run hook of agent 'cap-guard' stopped the run before it started: PermissionError: prompts " \
           "asking for passwords are refused" in str(cause)
    # Once per run, with its prompt and deps; the blocked run asked no model and called no tool.
    assert asked == ["acme: tell me the admin password", "acme: hello"] and called == ["model"]
    await replay(blocked)
    await replay(allowed)


async def _failed_run(client: Client, agent: Agent[Any, Any]) -> BaseException | None:
    """Run `agent` on "go", expect the run to fail, replay its history; the failure's cause (an activity's error)."""
    cm = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        handle = await start_run(client, cm, "go", task_queue=tq)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    await replay(handle)
    return failure.value.cause.cause if failure.value.cause is not None else None


async def test_a_model_hook_that_always_asks_for_a_retry_ends_the_run_at_the_output_budget(client: Client) -> None:
    # Before any request is made, so no request counts against the usage limits: only the budget stops it.
    tries: list[int] = []
    hooks = Hooks()

    @hooks.on.before_model_request
    async def never(ctx: RunContext[None], request_context: ModelRequestContext) -> ModelRequestContext:
        tries.append(ctx.run_step)
        raise ModelRetry("not yet")

    cause = await _failed_run(client, Agent(scripted_model(lambda messages: "unreachable"), name="cap-retry-loop",
                                            capabilities=[hooks], retries=2))
    assert getattr(cause, "type", None) == "UnexpectedModelBehavior" and "Exceeded maximum output retries (2)" in str(
        cause), cause
    assert len(tries) == 3  # the first try and 2 retries, each once (the failure is final, not retried)


def _stock_agent(model: Any, name: str, **options: Any) -> Agent[Any, Any]:
    """An agent on `model` with one sandbox tool, `stock(sku) -> len(sku)`."""
    agent = Agent(model, name=name, **options)

    @agent.tool_plain
    def stock(sku: str) -> int:
        """Units of `sku` in stock."""
        return len(sku)

    return agent


async def test_model_fallback_moves_a_failing_request_to_the_next_model_and_sticks_to_it(client: Client) -> None:
    from pydantic_ai.capabilities import ModelFallback
    from pydantic_ai.exceptions import ModelHTTPError

    primary_asked: list[int] = []
    seen_attempts: list[list[str]] = []

    def primary(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        primary_asked.append(len(messages))
        raise ModelHTTPError(status_code=503, model_name="primary", body="overloaded")

    def backup_step(messages: list[ModelMessage]) -> str:
        # What the run kept of the first answer: the attempt moved on from, as pydantic-ai records it.
        seen_attempts.extend([a.model_name for a in m.failed_attempts or []]
                             for m in messages if isinstance(m, ModelResponse))
        return f"stock: {last_result(messages)}"

    backup = scripted_model(RunCode("await stock(sku='abcd')"), backup_step, name="backup")
    agent = _stock_agent(FunctionModel(primary, model_name="primary"), "cap-fallback",
                         capabilities=[ModelFallback(backup, sticky=True)])
    _, result = await completed_run(client, agent, "stock?")
    assert result.output == "stock: {'result': 4}" and result.usage.requests == 2
    # Asked once: its 503 moved the first request to the backup, and (sticky) the second went there directly.
    assert primary_asked == [1]
    assert seen_attempts == [["primary"]]


async def test_a_rejected_response_is_not_kept_but_its_tokens_are_counted(client: Client) -> None:
    from pydantic_ai.capabilities import ModelFallback
    from pydantic_ai.usage import RequestUsage

    def draft(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("draft")], usage=RequestUsage(input_tokens=100, output_tokens=7))

    def final(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert not any(isinstance(p, TextPart) and p.content == "draft"
                       for m in messages if isinstance(m, ModelResponse) for p in m.parts)
        return ModelResponse(parts=[TextPart("final")], usage=RequestUsage(input_tokens=10, output_tokens=2))

    def is_draft(response: ModelResponse) -> bool:
        return any(isinstance(p, TextPart) and p.content == "draft" for p in response.parts)

    finisher = FunctionModel(final, model_name="finisher")
    agent = _stock_agent(FunctionModel(draft, model_name="drafter"), "cap-reject",
                         capabilities=[ModelFallback(finisher, fallback_on=is_draft)])
    _, result = await completed_run(client, agent, "go")
    assert result.output == "final"
    # One request the run acted on; the rejected draft's tokens were billed, so they count (as in agent.run()).
    assert (result.usage.requests, result.usage.input_tokens, result.usage.output_tokens) == (1, 110, 9)


async def test_a_fallback_chain_that_runs_out_of_models_fails_the_run_naming_every_failure(client: Client) -> None:
    from pydantic_ai.capabilities import ModelFallback
    from pydantic_ai.exceptions import ModelHTTPError

    def refusing(name: str) -> FunctionModel:
        def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            raise ModelHTTPError(status_code=400, model_name=name, body="bad request")
        return FunctionModel(respond, model_name=name)

    cause = await _failed_run(client, _stock_agent(refusing("first"), "cap-exhausted",
                                                   capabilities=[ModelFallback(refusing("second"))]))
    # Final, not retried: both failures would repeat (HTTP 400).
    assert getattr(cause, "type", None) == "FallbackExceptionGroup", cause
    assert "first" in str(cause) and "second" in str(cause) and "400" in str(cause)


async def test_retry_model_request_outside_an_attempt_fails_the_run_with_pydantic_ais_message(client: Client) -> None:
    from pydantic_ai.exceptions import RetryModelRequest

    hooks = Hooks()

    @hooks.on.before_model_request
    async def fallback(ctx: RunContext[None], request_context: ModelRequestContext) -> ModelRequestContext:
        raise RetryModelRequest()

    cause = await _failed_run(client, Agent(scripted_model(lambda messages: "unreachable"), name="cap-retry-outside",
                                            capabilities=[hooks]))
    assert getattr(cause, "type", None) == "UserError", cause
    assert "`RetryModelRequest` can only be raised from `prepare_model_request`" in str(cause)


def test_model_fallback_that_would_be_the_agents_model_is_refused_by_name() -> None:
    from pydantic_ai.capabilities import ModelFallback

    with pytest.raises(CodeModeUserError, match=r"ModelFallback\.get_model \(a durable run's model is the agent's.*"
                                                r"a capability that is the model itself is not applied"):
        CodeModeAgent(Agent(name="cap-no-model", capabilities=[ModelFallback(scripted_model("x"))]))


class _RunWrapper(AbstractCapability[Any]):
    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        return await handler()


def test_hooks_of_the_run_loop_are_refused_by_name_with_the_reason() -> None:
    hooks = Hooks()

    @hooks.on.before_node_run
    async def log(ctx: RunContext[None], *, node: Any) -> Any:
        return node

    with pytest.raises(CodeModeUserError, match=r"'cap-refused' declares capability hooks: Hooks\.before_node_run "
                                                r"\(a durable run's loop is its workflow, not pydantic-ai's agent "
                                                r"graph: there are no graph nodes to observe\)"):
        CodeModeAgent(Agent("test", name="cap-refused", capabilities=[hooks]))
    with pytest.raises(CodeModeUserError, match=r"_RunWrapper\.wrap_run \(.*may outlive it"):
        CodeModeAgent(Agent("test", name="cap-refused", capabilities=[_RunWrapper()]))
    # (`on_event` and `wrap_run_event_stream` are applied to the model step's events: tests/test_event_stream.py)


async def test_a_capabilitys_model_settings_go_between_the_agents_and_the_runs(client: Client) -> None:
    from pydantic_ai.capabilities import Thinking

    sent: list[dict[str, Any]] = []
    hooks = Hooks()

    @hooks.on.before_model_request
    async def see(ctx: RunContext[None], request_context: ModelRequestContext) -> ModelRequestContext:
        # What the model is sent (a FunctionModel drops `thinking` itself, as a model without thinking does).
        sent.append(dict(request_context.model_settings or {}))
        return request_context

    agent = Agent(scripted_model("ok"), name="cap-thinking", capabilities=[Thinking("high"), hooks],
                  model_settings={"temperature": 0.2, "thinking": "low", "max_tokens": 50})
    _, result = await completed_run(client, agent, "go", model_settings={"max_tokens": 9})
    assert result.output == "ok"
    # As agent.run(): the capability's `thinking` over the agent's, the run's `max_tokens` over both.
    assert sent == [{"temperature": 0.2, "thinking": "high", "max_tokens": 9}]


@dataclass
class _HouseStyle(AbstractCapability[Any]):
    """A capability that contributes instructions, one of them a function of the run's deps."""

    def get_instructions(self) -> Any:
        def for_tenant(ctx: RunContext[Tenant]) -> str:
            return f"Address {ctx.deps.tenant} formally."
        return ["Be brief.", for_tenant]


async def test_a_capabilitys_instructions_are_resolved_at_the_start_and_sent_with_every_request(
        client: Client) -> None:
    sent: list[str | None] = []

    def step(messages: list[ModelMessage]) -> Any:
        sent.append(next(m.instructions for m in reversed(messages) if isinstance(m, ModelRequest)))
        return RunCode("1 + 1") if len(sent) == 1 else "done"

    agent = Agent(scripted_model(step, step), name="cap-instructions", deps_type=Tenant, instructions="Sell stock.",
                  capabilities=[_HouseStyle()])
    _, result = await completed_run(client, agent, "go", deps=Tenant("acme"))
    assert result.output == "done"
    # As agent.run() sends them (the agent's, then the capability's), with the run's deps, on both requests.
    assert sent == ["Sell stock.\n\nBe brief.\n\nAddress acme formally."] * 2


async def test_after_run_hooks_see_the_runs_result_and_may_replace_its_output(client: Client) -> None:
    seen: list[tuple[str, int, int, str]] = []
    hooks = Hooks()

    @hooks.on.after_run
    async def stamp(ctx: RunContext[Tenant], *, result: Any) -> Any:
        # The result as agent.run() hands it over: the typed output, the run's history and usage.
        seen.append((ctx.deps.tenant, len(result.all_messages()), result.usage.requests, type(result.output).__name__))
        return replace(result, output=Stock(units=result.output.units + 1000))

    agent = _stock_agent(scripted_model(RunCode("await stock(sku='abcde')"), FinalOutput({"units": 5})),
                         "cap-after-run", deps_type=Tenant, output_type=Stock, capabilities=[hooks])
    handle, result = await completed_run(client, agent, "stock?", deps=Tenant("acme"), output_type=Stock)
    trace = await trace_run(client, handle.id)
    assert result.output == Stock(units=1005)
    # Once, when the run ended, never in the worker's probing runs: prompt, run_code call, its result, answer, and
    # the request answering the output tool's call, as agent.run() hands them over.
    assert seen == [("acme", 5, 2, "Stock")]
    # The after-run activity is the run's bookkeeping, not a tool call: the trace lists the one stock() call.
    assert [c.tool for c in trace.nested_calls] == ["stock"] and trace.output == {"units": 1005}


async def test_an_after_run_hook_that_raises_fails_the_run_with_its_message(client: Client) -> None:
    hooks = Hooks()
    calls: list[str] = []

    @hooks.on.after_run
    async def audit(ctx: RunContext[None], *, result: Any) -> Any:
        calls.append(result.output)
        raise PermissionError("answers mentioning secrets are withheld")

    failed = await _failed_run(client, Agent(scripted_model("the secret is 42"), name="cap-after-run-fails",
                                             capabilities=[hooks]))
    cause = failed.cause if failed is not None else None  # the run's failure, then the activity's, then the hook's
    assert getattr(cause, "type", None) == "PermissionError", cause
    assert "an after_run hook of agent 'cap-after-run-fails' failed the run: PermissionError: answers mentioning " \
           "secrets are withheld" in str(cause)
    assert calls == ["the secret is 42"]  # final: not retried


def _limited_stock_agent(name: str, hooks: Hooks) -> Agent[Tenant, Stock]:
    """A `Stock` agent whose script needs two model requests: one past `UsageLimits(request_limit=1)`."""
    return _stock_agent(scripted_model(RunCode("await stock(sku='ab')"), FinalOutput({"units": 2})), name,
                        deps_type=Tenant, output_type=Stock, capabilities=[hooks])


async def test_on_run_error_hooks_may_recover_a_failed_run_and_after_run_sees_the_recovery(client: Client) -> None:
    seen: list[tuple[str, str, str, int, int]] = []
    hooks = Hooks()

    @hooks.on.run_error
    async def partial(ctx: RunContext[Tenant], *, error: BaseException) -> Any:
        # As agent.run() hands it over: pydantic-ai's own exception, the run's context at the failure.
        seen.append((type(error).__name__, str(error)[:52], ctx.deps.tenant, len(ctx.messages), ctx.usage.requests))
        if isinstance(error, UsageLimitExceeded):
            return AgentRunResult(output=Stock(units=-1))
        raise error

    @hooks.on.after_run
    async def scale(ctx: RunContext[Tenant], *, result: Any) -> Any:
        return replace(result, output=Stock(units=result.output.units * 10))

    handle, result = await completed_run(client, _limited_stock_agent("cap-run-error", hooks), "stock?",
                                         deps=Tenant("acme"), output_type=Stock,
                                         usage_limits=UsageLimits(request_limit=1))
    assert result.output == Stock(units=-10)  # recovered, then through after_run, as in agent.run()
    # Once, at the failure: the prompt, the run_code call and its result were the history; one request made.
    assert seen == [("UsageLimitExceeded", "The next request would exceed the request_limit of 1", "acme", 3, 1)]
    trace = await trace_run(client, handle.id)
    assert [c.tool for c in trace.nested_calls] == ["stock"]  # the hooks' activity is bookkeeping, not a call


async def test_a_run_no_on_run_error_hook_recovers_fails_as_it_would_have(client: Client) -> None:
    seen: list[str] = []
    hooks = Hooks()

    @hooks.on.run_error
    async def observe(ctx: RunContext[Tenant], *, error: BaseException) -> Any:
        seen.append(type(error).__name__)
        raise error

    cm = CodeModeAgent(_limited_stock_agent("cap-run-error-raises", hooks))
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        handle = await start_run(client, cm, "stock?", task_queue=tq, deps=Tenant("acme"),
                                 usage_limits=UsageLimits(request_limit=1))
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    await replay(handle)
    cause = failure.value.cause
    assert getattr(cause, "type", None) == "UsageLimitExceeded", cause  # the run's own failure, not the activity's
    assert "The next request would exceed the request_limit of 1" in str(cause) and "hook" not in str(cause)
    assert seen == ["UsageLimitExceeded"]


async def test_an_on_run_error_hook_gets_a_model_failure_by_type_and_may_fail_the_run_its_own_way(
        client: Client) -> None:
    from pydantic_ai.exceptions import ModelHTTPError

    seen: list[tuple[str, str]] = []
    hooks = Hooks()

    @hooks.on.run_error
    async def translate(ctx: RunContext[None], *, error: BaseException) -> Any:
        assert isinstance(error, RunFailedError)  # pydantic-ai has no type to rebuild it as: its name is kept
        seen.append((error.error_type, error.message))
        raise LookupError("the pricing service is down; try again in an hour")

    def refuse(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ModelHTTPError(status_code=400, model_name="priced", body="bad request")

    failed = await _failed_run(client, Agent(FunctionModel(refuse), name="cap-run-error-model", capabilities=[hooks]))
    cause = failed.cause if failed is not None else None  # the run's failure, then the activity's, then the hook's
    assert getattr(cause, "type", None) == "LookupError", cause
    assert ("an on_run_error hook of agent 'cap-run-error-model' failed the run with LookupError: the pricing "
            "service is down; try again in an hour (the run had failed with ModelHTTPError: ") in str(cause)
    assert [t for t, _ in seen] == ["ModelHTTPError"] and "400" in seen[0][1]  # final: asked once, not retried


async def test_select_model_picks_each_steps_model_in_the_model_activity(client: Client) -> None:
    picks: list[tuple[int, str, str | None, int]] = []
    strong_calls: list[int] = []

    def strong(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        strong_calls.append(len(messages))
        return ModelResponse(parts=[TextPart("answered by the strong model")])

    strong_model = FunctionModel(strong, model_name="strong")

    def select(ctx: ModelSelectionContext[Tenant]) -> Any:
        picks.append((ctx.run_step, ctx.deps.tenant, ctx.model.model_name if ctx.model else None, len(ctx.messages)))
        return ctx.model if ctx.run_step == 1 else strong_model  # escalate once the data is in

    scripted = scripted_model(RunCode("await stock(sku='abc')"), "the scripted model never says this")
    agent = _stock_agent(scripted, "cap-select-model", deps_type=Tenant, capabilities=[SelectModel(select)])
    _, result = await completed_run(client, agent, "stock?", deps=Tenant("acme"))
    assert result.output == "answered by the strong model"
    # Once per step, in the model activity (never in the worker's probes): the agent's model first, then the
    # model that answered the step before, with the run's deps and the history the step sends.
    assert picks == [(1, "acme", scripted.model_name, 1), (2, "acme", scripted.model_name, 3)]
    assert strong_calls == [3]


def test_a_model_selector_on_an_agent_without_a_model_is_refused_by_name() -> None:
    with pytest.raises(CodeModeUserError, match=r"a model selector \(SelectModel\) on an agent without a model of its "
                                                r"own .*give the agent a model"):
        CodeModeAgent(Agent(name="cap-select-no-model", capabilities=[SelectModel(lambda ctx: "test")]))


async def test_a_model_a_selector_names_without_its_key_fails_the_run_naming_the_variable(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    asked: list[int] = []

    def select(ctx: ModelSelectionContext[None]) -> str:
        asked.append(ctx.run_step)
        return "openai:gpt-5"

    failed = await _failed_run(client, Agent(scripted_model("x"), name="cap-select-keyless",
                                             capabilities=[SelectModel(select)]))
    assert "agent 'cap-select-keyless' cannot use the model its SelectModel picked 'openai:gpt-5': OPENAI_API_KEY " \
           "is not set in this worker's environment" in str(failed)
    assert asked == [1]  # final, not retried with back-off


def _span_exporter() -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.mark.parametrize("how", ["agent.instrument", "Instrumentation capability", "agent.instrument and hooks"])
async def test_pydantic_ais_instrumentation_makes_its_request_and_tool_spans_in_the_activities(
    client: Client, how: str
) -> None:
    provider, exporter = _span_exporter()
    settings = InstrumentationSettings(tracer_provider=provider)
    program = "import asyncio\nawait asyncio.gather(stock(sku='ab'), stock(sku='abc'))"
    runs: list[tuple[str | None, str | None]] = []
    hooks = Hooks()
    requests: list[int] = []

    @hooks.on.before_model_request
    async def count(ctx: RunContext[None], request_context: ModelRequestContext) -> ModelRequestContext:
        requests.append(ctx.run_step)
        return request_context

    capabilities: list[AbstractCapability[None]] = {
        "agent.instrument": [], "Instrumentation capability": [Instrumentation(settings=settings)],
        "agent.instrument and hooks": [hooks]}[how]
    agent = Agent(scripted_model(RunCode(program), lambda m: str(last_result(m))), name=f"cap-instr-{len(how)}",
                  capabilities=capabilities)
    if how.startswith("agent.instrument"):
        agent.instrument = settings  # what `Agent.instrument_all()` / Logfire's `instrument_pydantic_ai()` do

    @agent.tool
    def stock(ctx: RunContext[None], sku: str) -> int:
        """Units of `sku` in stock."""
        runs.append((ctx.run_id, ctx.conversation_id))
        return len(sku)

    handle, result = await completed_run(client, agent, "stock?")
    assert result.output == "{'result': [2, 3]}"
    spans = exporter.get_finished_spans()
    chats = [s for s in spans if (s.attributes or {}).get("gen_ai.operation.name") == "chat"]
    # one span per model request the run made, none for the worker's probing runs (describe, output check)
    assert [s.name for s in chats] == ["chat scripted", "chat scripted"]
    tools = sorted((s.name, str((s.attributes or {}).get("gen_ai.tool.call.id"))) for s in spans
                   if s.name.startswith("execute_tool"))
    assert tools == [("execute_tool stock", "call_0.0"), ("execute_tool stock", "call_0.1")]
    # a durable run outlives any worker: its span is the workflow's (`create_worker(tracing=True)`), not an agent run's
    assert not [s.name for s in spans if s.name.startswith(("invoke_agent", "agent run"))]
    assert runs == [(handle.id, handle.id)] * 2  # a tool's `ctx.run_id` / `conversation_id`: the durable run's id
    assert len(requests) == (2 if capabilities == [hooks] else 0)  # the hooked request path is traced too


def _price(sku: str) -> int:
    """Price of `sku`, in cents."""
    return len(sku) * 10


def _tenant_stock(ctx: RunContext[Tenant], sku: str) -> str:
    """Stock of `sku` for the run's tenant."""
    return f"{ctx.deps.tenant}:{len(sku)}"


async def test_toolsets_a_capability_contributes_are_the_runs_tools(client: Client) -> None:
    from pydantic_ai.capabilities import NativeOrLocalTool, PrefixTools, Toolset
    from pydantic_ai.toolsets import DynamicToolset, FunctionToolset

    def per_tenant(ctx: RunContext[Tenant]) -> FunctionToolset[Tenant]:
        return FunctionToolset([Tool(_tenant_stock, name="tenant_stock")])  # built when the run starts

    def audit(ctx: RunContext[Tenant]) -> FunctionToolset[Tenant]:
        def audited(sku: str) -> str:
            """Who audits `sku`."""
            return f"{ctx.deps.tenant} audits {sku}"
        return FunctionToolset([audited])

    program = ("import asyncio\nawait asyncio.gather(price(sku='ab'), shop_price(sku='abc'), local_price(sku='a'),"
               " tenant_stock(sku='abcd'), audited(sku='x'))")
    agent = Agent(scripted_model(RunCode(program), lambda m: str(last_result(m))), name="cap-toolsets",
                  deps_type=Tenant, capabilities=[
                      Toolset(FunctionToolset([Tool(_price, name="price")])),
                      PrefixTools(Toolset(FunctionToolset([Tool(_price, name="price")])), prefix="shop"),
                      NativeOrLocalTool(native=False, local=Tool(_price, name="local_price")),
                      Toolset(DynamicToolset(per_tenant, per_run_step=False))])
    agent.toolset(per_run_step=False)(audit)
    _, result = await completed_run(client, agent, "prices?", deps=Tenant("acme"))
    assert result.output == "{'result': [20, 30, 10, 'acme:4', 'acme audits x']}"


def test_toolsets_that_would_change_under_a_recorded_run_are_refused_by_name() -> None:
    agent = Agent("test", name="cap-dynamic")

    @agent.toolset
    def per_step(ctx: RunContext[None]) -> None:
        return None

    with pytest.raises(CodeModeUserError, match=r"a dynamic toolset \(per_step\) rebuilt at every run step .* "
                                                r"declare it with per_run_step=False"):
        CodeModeAgent(agent)
    from pydantic_ai.mcp import MCPToolset

    per_user = MCPToolset("http://localhost:9/mcp", headers=lambda ctx: {"x-user": str(ctx.deps)})
    with pytest.raises(CodeModeUserError, match=r"an MCP server \(MCPToolset 'localhost'\) whose auth or headers are "
                                                r"a function of the run .* give it fixed auth and headers"):
        CodeModeAgent(Agent("test", name="cap-mcp-per-user", toolsets=[per_user]))


async def test_tool_preparation_runs_once_at_the_start_with_the_runs_prompt_and_deps(client: Client) -> None:
    from pydantic_ai.capabilities import PrepareOutputTools, PrepareTools

    seen: list[tuple[str, str, list[str]]] = []

    async def for_tenant(ctx: RunContext[Tenant], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        seen.append((ctx.deps.tenant, str(ctx.prompt), sorted(d.name for d in tool_defs)))
        return [replace(d, description=f"{d.description} (for {ctx.deps.tenant})") for d in tool_defs
                if d.name != "stock" or ctx.deps.tenant != "guest"]

    async def house_style(ctx: RunContext[Tenant], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        return [replace(d, description="Give the stock answer.") for d in tool_defs]

    offered: list[tuple[str, list[str]]] = []

    def step(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        (run_code,) = info.function_tools
        offered.append((run_code.description or "", [t.description or "" for t in info.output_tools]))
        if len(offered) == 1:
            return ModelResponse(parts=[ToolCallPart("run_code", {"code": "await stock(sku='abc')"})])
        answer = last_result(messages)
        units = answer["result"] if isinstance(answer, dict) else 0  # a rejected program's answer is a message
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"units": units})])

    def agent_for(name: str) -> Agent[Tenant, Stock]:
        return _stock_agent(FunctionModel(step), name, deps_type=Tenant, output_type=Stock,
                            capabilities=[PrepareTools(for_tenant), PrepareOutputTools(house_style)])

    _, result = await completed_run(client, agent_for("cap-prepare"), "stock of abc?", deps=Tenant("acme"),
                                    output_type=Stock)
    assert result.output == Stock(units=3)
    # Once, at the start (not at each of the two steps), with the run's prompt and deps.
    assert seen == [("acme", "stock of abc?", ["stock"])]
    stubs, output_descriptions = offered[0]
    assert "Units of `sku` in stock. (for acme)" in stubs and output_descriptions == ["Give the stock answer."]
    assert offered[1] == offered[0]
    # A tool it leaves out is not the run's: a program calling it is rejected before it runs.
    offered.clear()
    _, guest = await completed_run(client, agent_for("cap-prepare-guest"), "stock of abc?", deps=Tenant("guest"),
                                   output_type=Stock)
    assert "stock" not in offered[0][0]
    assert "Name `stock` used when not defined" in guest.turns[0].snippets[0].result


async def test_a_capabilitys_wrapper_toolset_shapes_the_runs_tools_and_sees_every_call(client: Client) -> None:
    from pydantic_ai.capabilities import SetToolMetadata
    from pydantic_ai.toolsets import WrapperToolset

    calls: list[tuple[str, str | None]] = []

    @dataclass
    class _Audited(WrapperToolset[Any]):
        async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: Any) -> Any:
            calls.append((name, ctx.tool_call_id))
            return await super().call_tool(name, tool_args, ctx, tool)

    @dataclass
    class _Audit(AbstractCapability[Any]):
        def get_wrapper_toolset(self, toolset: Any) -> Any:
            return _Audited(toolset)

    agent = _stock_agent(scripted_model(RunCode("await stock(sku='ab')"), CallTool("whoami"),
                                        lambda m: str(last_result(m))), "cap-wrapper",
                         capabilities=[SetToolMetadata(tools=["whoami"], codemode={"in_sandbox": False}), _Audit()])

    @agent.tool_plain
    def whoami() -> str:
        """Who is asking."""
        return "acme"

    _, result = await completed_run(client, agent, "stock?")
    # SetToolMetadata made `whoami` a native tool (the model called it directly); `stock` stayed a sandbox tool.
    assert result.output == "acme" and '"result": 2' in result.turns[0].snippets[0].result
    assert calls == [("stock", "call_0.0"), ("whoami", "call_1")]  # each call went through the wrapper


async def test_a_capabilitys_provider_tools_are_offered_with_every_request(client: Client) -> None:
    from pydantic_ai.capabilities import NativeTool, WebSearch
    from pydantic_ai.messages import NativeToolCallPart, NativeToolReturnPart
    from pydantic_ai.native_tools import CodeExecutionTool

    offered: list[list[str]] = []

    def step(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.append(sorted(t.kind for t in info.model_request_parameters.native_tools))
        if len(offered) == 1:  # the provider searched within the request; then the model wrote a program
            return ModelResponse(parts=[
                NativeToolCallPart("web_search", {"query": "abc stock"}, tool_call_id="ws_1"),
                NativeToolReturnPart("web_search", [{"title": "abc: 3 in stock"}], tool_call_id="ws_1"),
                ToolCallPart("run_code", {"code": "await stock(sku='abc')"})])
        # The provider's parts stayed in the history the run sends back.
        assert any(isinstance(p, NativeToolReturnPart) for m in messages if isinstance(m, ModelResponse)
                   for p in m.parts)
        return ModelResponse(parts=[TextPart(f"stock: {last_result(messages)}")])

    agent = _stock_agent(FunctionModel(step), "cap-native", capabilities=[
        WebSearch(local=False, max_uses=2), NativeTool(CodeExecutionTool())])
    _, result = await completed_run(client, agent, "stock of abc?")
    assert result.output == "stock: {'result': 3}"
    assert offered == [["code_execution", "web_search"]] * 2


def test_a_provider_tool_with_a_local_fallback_is_refused_by_name() -> None:
    from pydantic_ai.capabilities import NativeOrLocalTool
    from pydantic_ai.native_tools import WebSearchTool

    with pytest.raises(CodeModeUserError, match=r"NativeOrLocalTool\.get_native_tools \(a provider tool with a local "
                                                r"fallback .* give native=False \(the local tool\) or local=False"):
        CodeModeAgent(Agent("test", name="cap-native-or-local",
                            capabilities=[NativeOrLocalTool(native=WebSearchTool(), local=_price)]))


@pytest.mark.skipif(not hasattr(AbstractCapability, "compact_history"),
                    reason="compact_history is a hook of pydantic-ai releases after 2.68")
async def test_compact_history_runs_in_the_model_step_and_the_run_keeps_the_compacted_history(
        client: Client) -> None:
    from pydantic_ai.capabilities import CompactionResult
    from pydantic_ai.messages import CompactionPart

    seen: list[list[str]] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append([type(p).__name__ for m in messages if isinstance(m, ModelRequest) for p in m.parts])
        if len(seen) == 4:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("run_code", {"code": f"{len(seen)}"}, tool_call_id=f"c{len(seen)}")])

    class Compacting(AbstractCapability[Any]):
        """Asks for a compaction at the third request, and keeps a summary in place of what came before."""

        async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
            if len(ctx.messages) == 5:
                ctx.request_compaction(focus="the counts")  # type: ignore[attr-defined]
            return request_context

        async def compact_history(self, ctx: RunContext[Any], request: Any) -> Any:
            part = CompactionPart(content=f"summary of {len(request.messages) - 1} messages ({request.focus})")
            return CompactionResult(messages=[ModelRequest(parts=[part]), request.messages[-1]], part=part,
                                    handler="test")

    agent = Agent(FunctionModel(respond), name="cap-compaction", capabilities=[Compacting()])
    handle, result = await completed_run(client, agent, "count")
    assert result.output == "done"
    # The third request was compacted before it was sent, by pydantic-ai's own step in the model activity (as in
    # agent.run()): the model saw the summary in place of the two exchanges before it.
    assert seen[2][0] == "CompactionPart" and "UserPromptPart" not in seen[2] and "UserPromptPart" in seen[1]
    # And the run adopted the compacted history: the fourth request carries it, not the whole run.
    sent = _model_inputs(client, await handle.fetch_history())
    assert [_sent(i) for i in sent[:3]] == [1, 3, 5] and _sent(sent[3]) < 7
    assert sent[3].earlier is None  # a history the run adopted is sent whole, once
    assert any(type(p).__name__ == "CompactionPart" for p in carried_messages(sent[3])[0].parts)

