"""Deferred tools (pydantic-ai's `defer_loading=True`): hidden from the model, found by programs in the sandbox.

pydantic-ai's `ToolSearch` hides a deferred tool until a search finds it. A durable run does the same in code
mode: the `run_code` description shows the other tools' stubs and says how many are hidden, and programs find
them with `search_tools` / `describe_tool`, answered in workflow code from the run's recorded catalog. What a
durable run cannot do with tool search (a configured `ToolSearch`, a capability loaded on demand, a deferred tool
offered to the model directly) is refused by name.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.capabilities import Hooks, PrepareTools, ToolSearch, Toolset
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import FunctionToolset
from temporalio.client import Client

from durable_codemode import CatalogSettings, CodeModeAgent, CodeModeUserError, start_run
from durable_codemode.shared._types import AgentSpec
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.worker._describe import describe_run

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


def get_forecast(city: str, days: int = 3) -> list[str]:
    """The weather forecast for a city, one line a day."""
    return [f"{city}: sunny, day {d + 1}" for d in range(days)]


def get_time(city: str) -> str:
    """The local time in a city."""
    return f"12:00 in {city}"


def weather_agent(*steps: Any, **options: Any) -> Agent[None, str]:
    return Agent(scripted_model(*steps), name=f"deferred{os.urandom(3).hex()}",
                 tools=[Tool(get_forecast, defer_loading=True), get_time], **options)


def _description(spec: AgentSpec) -> str:
    return spec.model_tools[0].description or ""


async def test_a_deferred_tool_is_left_out_of_the_description_and_the_type_checker_knows_it() -> None:
    spec = await describe_run(CodeModeAgent(weather_agent("x")))
    described = _description(spec)
    assert "async def get_time(*, city: str) -> str:" in described
    assert "get_forecast" not in described and "weather forecast" not in described
    assert "1 more tool is not listed here" in described and "search_tools(query: str" in described
    assert "async def get_forecast(*, city: str, days: int = 3) -> list[str]:" in spec.stubs  # type-checked
    assert spec.catalog is not None and [e.name for e in spec.catalog.entries] == ["get_forecast", "get_time"]
    # pydantic-ai's ToolSearch would have added its provider tool to every request: the sandbox searches instead.
    assert spec.native_tools == []


async def test_a_program_finds_a_deferred_tool_and_calls_it(client: Client) -> None:
    find = 'found = search_tools("forecast weather")\n[found[0]["name"], describe_tool("get_forecast").splitlines()[0]]'
    call = 'await get_forecast(city="Oslo", days=2)'
    hooks, seen = Hooks(), []

    @hooks.on.before_tool_execute
    async def audit(ctx: RunContext[None], *, call: Any, tool_def: Any, args: dict[str, Any]) -> dict[str, Any]:
        seen.append(call.tool_name)
        return args

    agent = CodeModeAgent(weather_agent(RunCode(find), RunCode(call), lambda m: repr(last_result(m)),
                                        capabilities=[hooks]))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent, "Oslo's weather?", task_queue=tq)
        result = await handle.result()
    await replay(handle)
    first, second = [s for t in result.turns for s in t.snippets]
    assert first.outcome == second.outcome == "ok" and '"get_forecast"' in first.result
    assert "async def get_forecast(*, city: str, days: int = 3) -> list[str]:" in first.result
    assert eval(result.output)["result"] == ["Oslo: sunny, day 1", "Oslo: sunny, day 2"]
    assert [(c.tool, c.status) for c in result.nested_calls] == [("get_forecast", "ok")]
    assert seen == ["get_forecast"]  # through pydantic-ai's ToolManager, which ran it though it was never revealed


async def test_only_deferred_tools_gives_no_empty_stub_block() -> None:
    agent = Agent(scripted_model("x"), name="deferred-all", tools=[Tool(get_forecast, defer_loading=True)])
    described = _description(await describe_run(CodeModeAgent(agent)))
    assert "```python" not in described and "1 tool is not listed here" in described


async def test_prepare_tools_see_a_deferred_tool_and_shape_it_as_in_agent_run() -> None:
    seen: list[list[str]] = []

    async def shape(ctx: RunContext[None], defs: list[ToolDefinition]) -> list[ToolDefinition]:
        seen.append([d.name for d in defs])
        return [replace(d, description="Tomorrow's weather.") if d.name == "get_forecast" else d for d in defs]

    spec = await describe_run(CodeModeAgent(weather_agent("x", capabilities=[PrepareTools(shape)])))
    assert [t.name for t in spec.tools] == ["get_forecast", "get_time"]
    assert seen == [["get_forecast", "get_time"]]  # as in agent.run(): ToolSearch hides it only after them
    assert spec.catalog is not None and spec.catalog.entries[0].summary == "Tomorrow's weather."
    assert "get_forecast" not in _description(spec)  # still deferred

    async def drop(ctx: RunContext[None], defs: list[ToolDefinition]) -> list[ToolDefinition]:
        return [d for d in defs if d.name != "get_forecast"]

    spec = await describe_run(CodeModeAgent(weather_agent("x", capabilities=[PrepareTools(drop)])))
    assert [t.name for t in spec.tools] == ["get_time"] and spec.catalog is None


async def test_catalog_mode_stubs_and_a_deferred_tool_are_refused_together() -> None:
    agent = CodeModeAgent(weather_agent("x"), catalog=CatalogSettings(mode="stubs"))
    with pytest.raises(CodeModeUserError, match=r"tools with defer_loading=True \('get_forecast'\), but its "
                                                r"CatalogSettings\(mode='stubs'\) shows every tool's stub"):
        await describe_run(agent)


async def test_a_deferred_tool_offered_to_the_model_directly_is_refused() -> None:
    agent = Agent(scripted_model("x"), name="deferred-direct",
                  tools=[Tool(get_forecast, defer_loading=True, metadata={"codemode": {"in_sandbox": False}})])
    with pytest.raises(CodeModeUserError, match=r"tool 'get_forecast' of agent 'deferred-direct' has "
                                                r"defer_loading=True but is offered to the model directly"):
        await describe_run(CodeModeAgent(agent))


def test_a_configured_tool_search_and_a_capability_loaded_on_demand_are_refused() -> None:
    with pytest.raises(CodeModeUserError, match=r"ToolSearch\(.*strategy='keywords'.*\) \(a durable run's programs "
                                                r"find deferred tools with search_tools"):
        CodeModeAgent(weather_agent("x", capabilities=[ToolSearch(strategy="keywords")]))
    on_demand = Toolset(FunctionToolset([get_time]), id="clock", description="Clocks.", defer_loading=True)
    with pytest.raises(CodeModeUserError, match=r"Toolset\(defer_loading=True\) \(a durable run's tools are fixed"):
        CodeModeAgent(Agent(scripted_model("x"), name="deferred-cap", capabilities=[on_demand]))
    CodeModeAgent(weather_agent("x", capabilities=[ToolSearch()]))  # the one every agent has: accepted
