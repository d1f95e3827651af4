"""pydantic-ai capabilities on a durable run: tool hooks and output hooks fire where `agent.run()` fires them.

Each tool call, from a program or made by the model directly, runs in its activity through pydantic-ai's own
`ToolManager`, so a capability's tool hooks see the call with its `RunContext` (the run's deps, the nested call's
id); each candidate answer goes through pydantic-ai's output processing, with the output hooks. Hooks of
pydantic-ai's run loop, which a durable run does not drive, are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.capabilities import AbstractCapability, Hooks
from temporalio.client import Client

from durable_codemode import CodeModeAgent, CodeModeUserError, run_result, start_run
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


PROGRAM = """\
import asyncio
units = await asyncio.gather(stock(sku="ab"), stock(sku="abc"))
try:
    await stock(sku="forbidden")
except Exception as e:
    blocked = str(e)
[units, blocked]"""


async def test_tool_hooks_fire_for_sandbox_and_native_calls_with_the_calls_context(client: Client) -> None:
    log: list[tuple[str, ...]] = []
    agent = hooked_agent("cap-tools", RunCode(PROGRAM), CallTool("whoami"), lambda m: str(last_result(m)), log=log)
    cm = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        handle = await start_run(client, cm, "stock?", task_queue=tq, deps=Tenant("acme"))
        result = await handle.result()
    snippet = result.turns[0].snippets[0]
    # after_tool_execute doubled each result; before_tool_execute blocked one call, which the program caught.
    assert '"result": [[4, 6], "sku \'forbidden\' is off limits for this agent"]' in snippet.result
    assert result.output == "acme"
    before = sorted(entry[1:4] for entry in log if entry[0] == "before")
    assert before == [("stock", "acme", "call_0.0"), ("stock", "acme", "call_0.1"), ("stock", "acme", "call_0.2"),
                      ("whoami", "acme", "call_1")]
    await replay(handle)


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
    cm = CodeModeAgent(agent)
    tq = new_task_queue()
    async with running_worker(client, [cm], task_queue=tq):
        handle = await start_run(client, cm, "stock?", task_queue=tq)
        result = await run_result(handle, Stock)
    assert result.output == Stock(units=30) and seen == [0, 3]
    await replay(handle)


class _RunLogger(AbstractCapability[Any]):
    async def before_run(self, ctx: RunContext[Any]) -> None:
        pass


def test_hooks_of_the_run_loop_are_refused_by_name() -> None:
    hooks = Hooks()

    @hooks.on.before_model_request
    async def log(ctx: RunContext[None], request_context: Any) -> Any:
        return request_context

    with pytest.raises(CodeModeUserError, match=r"'cap-refused' declares capability hooks \(Hooks: before_model_req"):
        CodeModeAgent(Agent("test", name="cap-refused", capabilities=[hooks]))
    with pytest.raises(CodeModeUserError, match=r"_RunLogger: before_run"):
        CodeModeAgent(Agent("test", name="cap-refused", capabilities=[_RunLogger()]))
