"""Structured output, as in `Agent(output_type=...)`: checked durably by pydantic-ai's own output processing.

A response that may end the run goes to the output activity, which validates it against the agent's output type
and runs its output validators (which may do I/O); a rejection is pydantic-ai's retry request to the model, counted
against the agent's output retries. The client gets the output back as the agent's type.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel, ValidationInfo, field_validator
from pydantic_ai import Agent, ModelRetry, NativeOutput, PromptedOutput, RunContext, TextOutput, ToolOutput
from pydantic_ai.messages import ModelMessage, ModelRequest, RetryFeedbackPart, ToolReturnPart, UserPromptPart
from temporalio.client import Client, WorkflowFailureError
from typing_extensions import TypedDict

from durable_codemode import CodeModeAgent, SnippetLimits, run_agent, run_result, start_run, typed_result
from durable_codemode.debugging import render_trace, trace_run
from durable_codemode.shared._names import OUTPUT_ACTIVITY
from durable_codemode.testing import (
    FinalOutput,
    RunCode,
    fetch_chain_histories,
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


class Invoice(BaseModel):
    tenant: str
    total: int
    lines: list[str]


def _retry_text(messages: list[ModelMessage]) -> str:
    """What the run told the model about its last answer (pydantic-ai's retry request)."""
    request = next(m for m in reversed(messages) if isinstance(m, ModelRequest))
    texts = []
    for part in request.parts:
        if isinstance(part, (ToolReturnPart, RetryFeedbackPart, UserPromptPart)):
            texts.append(part.content if isinstance(part.content, str) else json.dumps(part.content, default=str))
    return " | ".join(texts)


async def _output_activities(handle: Any) -> int:
    count = 0
    for history in await fetch_chain_histories(handle):
        for event in history.events:
            if event.HasField("activity_task_scheduled_event_attributes"):
                count += event.activity_task_scheduled_event_attributes.activity_type.name == OUTPUT_ACTIVITY
    return count


def invoice_agent(name: str, *steps: Any, **options: Any) -> CodeModeAgent:
    """The issue's typed agent: deps with a tenant, a `BaseModel` output, a validator rejecting the first answer."""
    agent = Agent(scripted_model(*steps), name=name, deps_type=Tenant, output_type=Invoice)
    seen: list[int] = []

    @agent.tool
    def line(ctx: RunContext[Tenant], i: int) -> dict[str, Any]:
        """One invoice line of the run's tenant."""
        return {"name": f"{ctx.deps.tenant}-{i}", "amount": 10 * i}

    @agent.output_validator
    def check(ctx: RunContext[Tenant], invoice: Invoice) -> Invoice:
        seen.append(ctx.retry)
        if invoice.tenant != ctx.deps.tenant:
            raise ModelRetry(f"the invoice is for tenant {ctx.deps.tenant}, not {invoice.tenant}")
        if ctx.retry == 0:
            raise ModelRetry("check the total once more")
        return invoice

    cm = CodeModeAgent(agent, **options)
    cm.validator_retries_seen = seen  # type: ignore[attr-defined]
    return cm


GATHER = ("import asyncio\nrows = await asyncio.gather(*(line(i=i) for i in range(1, 4)))\n"
          "{'total': sum(r['amount'] for r in rows), 'lines': [r['name'] for r in rows]}")


def _invoice_from_program(tenant: str) -> Any:
    def step(messages: list[ModelMessage]) -> FinalOutput:
        found = last_result(messages)["result"]
        return FinalOutput({"tenant": tenant, **found})
    return step


async def test_a_typed_agent_answers_a_validated_model_typed_for_the_client(client: Client) -> None:
    said: list[str] = []

    def corrected(messages: list[ModelMessage]) -> FinalOutput:
        said.append(_retry_text(messages))
        return FinalOutput({"tenant": "acme", "total": 60, "lines": ["acme-1", "acme-2", "acme-3"]})

    agent = invoice_agent("so-invoice", RunCode(GATHER), _invoice_from_program("acme"), corrected)
    tq = new_task_queue()
    run_id = f"so-invoice-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, [agent], task_queue=tq):
        result = await run_agent(client, agent, "invoice", task_queue=tq, deps=Tenant("acme"), run_id=run_id)
    handle = client.get_workflow_handle(run_id)
    assert isinstance(result.output, Invoice)
    assert result.output == Invoice(tenant="acme", total=60, lines=["acme-1", "acme-2", "acme-3"])
    assert "check the total once more" in said[0]  # the validator's ModelRetry reached the model
    assert agent.validator_retries_seen == [0, 1]  # type: ignore[attr-defined]  # ctx.retry, as in agent.run()
    assert result.usage.requests == 3 and result.usage.tool_calls == 3
    assert await _output_activities(handle) == 2
    # `codemode trace` shows each check on its turn, and the output tool call is not a tool call of the run's own.
    text = render_trace(await trace_run(client, run_id))
    assert "output rejected, the model was asked again: check the total once more" in text
    assert "output accepted" in text and "final_result" not in text
    await replay(handle)


async def test_deps_usage_and_output_retries_survive_continue_as_new(client: Client) -> None:
    agent = invoice_agent("so-chain", RunCode("a = await line(i=1)"), RunCode("[a, await line(i=2)]"),
                          FinalOutput({"tenant": "initech", "total": 1, "lines": []}),
                          RunCode("b = 1"),
                          FinalOutput({"tenant": "initech", "total": 30, "lines": ["initech-1", "initech-2"]}),
                          limits=SnippetLimits(max_snippets_per_run=1))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, repl_key="so-test-key"):
        handle = await start_run(client, agent, "go", task_queue=tq, deps=Tenant("initech"))
        result = await run_result(handle, Invoice)
    assert result.continued_as_new >= 2
    assert result.output.total == 30 and result.output.tenant == "initech"
    # The first answer was rejected in one run and the count carried: the validator saw retry 1 after the chain moved.
    assert agent.validator_retries_seen == [0, 1]  # type: ignore[attr-defined]
    assert result.usage.requests == 5 and result.usage.tool_calls == 2
    await replay(handle)


class Refund(BaseModel):
    order: str
    amount: int


class Escalation(BaseModel):
    reason: str


class Item(TypedDict):
    sku: str
    qty: int


@dataclass
class Summary:
    skus: list[str]
    units: int


def _summarize(ctx: RunContext[None], items: list[Item]) -> Summary:
    """An output function: pydantic-ai calls it with the validated arguments; its return value is the output."""
    return Summary(skus=sorted(i["sku"] for i in items), units=sum(i["qty"] for i in items))


def _upper(text: str) -> str:
    return text.upper()


OUTPUT_CASES: list[tuple[str, Any, Any, Any]] = [
    # (case, output_type, the scripted final answer, the output the client gets)
    ("model", Refund, FinalOutput({"order": "o-1", "amount": 5}), Refund(order="o-1", amount=5)),
    ("dataclass", Summary, FinalOutput({"skus": ["a"], "units": 2}), Summary(skus=["a"], units=2)),
    ("typeddict", Item, FinalOutput({"sku": "a", "qty": 3}), {"sku": "a", "qty": 3}),
    ("scalar", int, FinalOutput(42), 42),
    ("list", list[Item], FinalOutput([{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]),
     [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]),
    ("union", [Refund, Escalation], FinalOutput({"reason": "fraud"}, tool="final_result_Escalation"),
     Escalation(reason="fraud")),
    ("str-or-model/text", str | Refund, "no refund is due", "no refund is due"),
    ("str-or-model/tool", str | Refund, FinalOutput({"order": "o-2", "amount": 7}), Refund(order="o-2", amount=7)),
    ("tool-output", ToolOutput(Refund, name="give_refund"), FinalOutput({"order": "o-3", "amount": 1}),
     Refund(order="o-3", amount=1)),
    ("native", NativeOutput(Refund), FinalOutput({"order": "o-4", "amount": 2}), Refund(order="o-4", amount=2)),
    ("prompted", PromptedOutput(Refund), FinalOutput({"order": "o-5", "amount": 3}), Refund(order="o-5", amount=3)),
    ("output-function", _summarize, FinalOutput({"items": [{"sku": "b", "qty": 1}, {"sku": "a", "qty": 4}]}),
     Summary(skus=["a", "b"], units=5)),
    ("text-function", TextOutput(_upper), "done", "DONE"),
]


@pytest.mark.parametrize(("case", "output_type", "answer", "expected"), OUTPUT_CASES, ids=[c[0] for c in OUTPUT_CASES])
async def test_every_output_type_pydantic_ai_accepts_ends_the_run_typed(
    client: Client, case: str, output_type: Any, answer: Any, expected: Any
) -> None:
    name = "so-" + case.replace("/", "-")
    # The model finishes from code mode: a program first, then the final answer.
    agent = CodeModeAgent(Agent(scripted_model(RunCode("1 + 1"), answer), name=name, output_type=output_type))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "go", task_queue=tq)
        result = await run_result(handle, agent.output_type)
    assert result.output == expected
    assert type(result.output) is type(expected)
    await replay(handle)


async def test_an_invalid_answer_is_a_retry_prompt_and_past_the_budget_the_run_fails_unretried(client: Client) -> None:
    said: list[str] = []

    def again(messages: list[ModelMessage]) -> FinalOutput:
        said.append(_retry_text(messages))
        return FinalOutput({"order": "o-1", "amount": "lots"})

    agent = CodeModeAgent(Agent(scripted_model(FinalOutput({"order": "o-1"}), again, again), name="so-invalid",
                                output_type=Refund, retries={"output": 1}))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "go", task_queue=tq)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "amount" in said[0] and "Field required" in said[0]  # pydantic's validation errors, sent to the model
    cause = failed.value.cause
    assert "Exceeded maximum output retries (1)" in str(cause) and getattr(cause, "non_retryable", False)
    await replay(handle)


async def test_a_validator_without_context_may_do_io_and_a_text_agent_is_validated_too(
    client: Client, tmp_path: Any
) -> None:
    banned = tmp_path / "banned.txt"
    banned.write_text("refund\n")  # read by the validator on the worker, per answer: I/O in an activity

    agent = Agent(scripted_model("we will refund you", "we will look into it"), name="so-text")

    @agent.output_validator
    def no_promises(answer: str) -> str:
        for word in banned.read_text().split():
            if word in answer:
                raise ModelRetry(f"do not promise a {word}")
        return answer

    cm = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        handle = await start_run(client, cm, "help", task_queue=tq)
        result = await handle.result()
    assert result.output == "we will look into it"
    assert result.usage.requests == 2
    await replay(handle)


@pytest.mark.parametrize("strategy", ["early", "graceful"])
async def test_an_answer_beside_a_program_follows_the_end_strategy(client: Client, strategy: str) -> None:
    both = [RunCode("x = 7\nx"), FinalOutput({"order": "o-9", "amount": 9})]
    agent = CodeModeAgent(Agent(scripted_model(both), name=f"so-{strategy}", output_type=Refund,
                                end_strategy=strategy))  # type: ignore[arg-type]
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "go", task_queue=tq)
        result = typed_result(await handle.result(), Refund)
    assert result.output == Refund(order="o-9", amount=9)
    snippets = [s for t in result.turns for s in t.snippets]
    # early: the run ends at the output and the program never runs; graceful: the program runs first.
    assert [s.outcome for s in snippets] == ([] if strategy == "early" else ["ok"])
    await replay(handle)


class Order(BaseModel):
    qty: int

    @field_validator("qty")
    @classmethod
    def within_the_limit(cls, qty: int, info: ValidationInfo) -> int:
        limit = (info.context or {}).get("max_qty")
        if limit is not None and qty > limit:
            raise ValueError(f"at most {limit} per order")
        return qty


async def test_the_agents_validation_context_applies_to_tool_arguments_and_to_the_output(client: Client) -> None:
    program = ("try:\n    await place(qty=9)\nexcept ValueError as e:\n    refused = str(e)\n"
               "[await place(qty=2), refused]")

    def answer(messages: list[ModelMessage]) -> FinalOutput:
        return FinalOutput({"qty": 7}) if "refused" not in _retry_text(messages) else FinalOutput({"qty": 3})

    agent = Agent(scripted_model(RunCode(program), answer, FinalOutput({"qty": 3})), name="so-context",
                  output_type=Order, validation_context=lambda ctx: {"max_qty": ctx.deps["max_qty"]})

    @agent.tool_plain
    def place(order: Order) -> str:
        """Place an order."""
        return f"placed {order.qty}"

    cm = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        handle = await start_run(client, cm, "order", task_queue=tq, deps={"max_qty": 5})
        result = await run_result(handle, Order)
    snippet = result.turns[0].snippets[0]
    assert "placed 2" in snippet.result and "at most 5 per order" in snippet.result  # the tool's arguments
    assert result.output == Order(qty=3) and result.usage.requests == 3  # qty 7 was rejected with the context
    await replay(handle)


async def test_a_retry_reaches_the_model_rendered_as_a_provider_is_sent_it(client: Client) -> None:
    # A provider's adapter refuses pydantic-ai's raw retry part ("`RetryFeedbackPart` cannot be rendered by this
    # model"), so the history must go through `Model.prepare_messages`, as agent.run() sends it; FunctionModel
    # alone would accept the raw part, so this model refuses it as the adapters do.
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    told: list[str] = []

    def strict(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]
        assert not [p for p in parts if isinstance(p, RetryFeedbackPart)], "an unrendered retry reached the model"
        if len(messages) == 1:
            return ModelResponse(parts=[])  # neither text nor a tool call: the run asks again
        told.extend(str(p.content) for p in parts[1:] if isinstance(p, UserPromptPart))
        return ModelResponse(parts=[TextPart("done")])

    cm = CodeModeAgent(Agent(FunctionModel(strict), name="so-rendered"))
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        handle = await start_run(client, cm, "go", task_queue=tq)
        assert (await handle.result()).output == "done"
    assert len(told) == 1 and "neither text nor a tool call" in told[0]  # as the user text a provider is sent
    await replay(handle)
