"""Large tool catalogs: past `CatalogSettings`, the description carries an index of the tools.

Programs find and read the rest with `search_tools` / `describe_tool`, answered in workflow code from the run's
recorded catalog; every tool is still called and type-checked as before.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic_ai import Agent
from temporalio.client import Client, WorkflowHandle

from bench.catalog import EXPECTED, catalog_agent, task_steps
from durable_codemode import CatalogSettings, CodeModeAgent, CodeModeUserError, RunResult, SnippetLimits
from durable_codemode.shared._compute_wire import decode_answer, encode_answer
from durable_codemode.shared._types import AgentSpec
from durable_codemode.testing import RunCode, last_result, scripted_model
from durable_codemode.worker._describe import describe_run
from durable_codemode.workflow._catalog import SEARCH_LIMIT_MAX, CatalogIndex
from durable_codemode.workflow._stubs import estimate_tokens, run_code_tool_definition

from ._agents import items_agent
from ._runs import run_to_end


def _name() -> str:
    return f"catalog{os.urandom(3).hex()}"


def _description(spec: AgentSpec) -> str:
    return spec.model_tools[0].description or ""


def echo(messages: Any) -> str:
    """A final answer that shows the test what the last run_code returned."""
    return repr(last_result(messages))


async def run(client: Client, agent: CodeModeAgent) -> tuple[RunResult, WorkflowHandle[Any, RunResult]]:
    return await run_to_end(client, agent)


async def _catalog_run(client: Client, *steps: Any, n_tools: int = 300,
                       catalog: CatalogSettings | None = None, **options: Any) -> RunResult:
    agent = catalog_agent(scripted_model(*steps), name=_name(), n_tools=n_tools, catalog=catalog)
    if options:
        agent.limits = SnippetLimits(**options)
    result, _ = await run(client, agent)
    return result


# -- the description ------------------------------------------------------------------------------------------


async def test_a_large_catalog_sends_an_index_and_keeps_every_stub_for_the_type_checker() -> None:
    every = await describe_run(catalog_agent(scripted_model("x"), catalog=CatalogSettings(mode="stubs")))
    spec = await describe_run(catalog_agent(scripted_model("x")))
    described, full = _description(spec), _description(every)
    assert spec.catalog is not None and len(spec.catalog.entries) == 300 and every.catalog is None
    assert spec.stubs == every.stubs and spec.stubs.count("async def ") == 300  # the checker knows every tool
    assert "async def create_refund" not in described and "class Refund" not in described
    assert all(e.name in described for e in spec.catalog.entries)  # every tool is named
    assert "search_tools(query: str, limit: int = 10)" in described and "describe_tool(name: str)" in described
    # 300 lines with summaries would be over the 4,000-token budget themselves: names only.
    assert "Create a refund and return it" not in described
    assert estimate_tokens(described) < 0.1 * estimate_tokens(full)
    # Each type definition is recorded once, so the spec of a 300-tool agent stays under 512 KiB.
    assert len(spec.catalog.types) == 60


async def test_a_catalog_whose_index_fits_the_budget_lists_each_tool_with_its_summary() -> None:
    spec = await describe_run(catalog_agent(scripted_model("x"), n_tools=50))  # over 40 tools
    described = _description(spec)
    assert spec.catalog is not None
    assert "- create_invoice: Create an invoice and return it with its new id." in described
    assert "- get_account: Get one account by its id." in described
    assert described.count("\n- ") >= 50


async def test_small_agents_keep_every_stub_in_the_description() -> None:
    agent = items_agent(_name(), "done")
    spec = await describe_run(agent)
    assert spec.catalog is None
    assert spec.model_tools[0] == run_code_tool_definition(spec.stubs, agent.limits)
    assert "```python" in _description(spec) and "search_tools" not in _description(spec)


@pytest.mark.parametrize(("n_tools", "settings", "indexed"), [
    (40, CatalogSettings(max_stub_tokens=100_000), False),  # at the default tool bound
    (41, CatalogSettings(max_stub_tokens=100_000), True),  # past it
    (30, None, False),  # ~3,000 tokens of stubs
    (40, None, True),  # ~4,100: past the default token bound
    (12, CatalogSettings(max_tools=10), True),
    (12, CatalogSettings(max_stub_tokens=500), True),  # 12 stubs are ~1,300 tokens
    (12, CatalogSettings(max_stub_tokens=2000), False),
    (300, CatalogSettings(mode="stubs"), False),
    (3, CatalogSettings(mode="index"), True),
])
async def test_the_budget_is_configurable(n_tools: int, settings: CatalogSettings | None, indexed: bool) -> None:
    spec = await describe_run(catalog_agent(scripted_model("x"), n_tools=n_tools, catalog=settings))
    assert (spec.catalog is not None) == indexed
    assert ("```python" not in _description(spec)) == indexed


def test_invalid_catalog_settings_are_refused_by_name() -> None:
    with pytest.raises(CodeModeUserError, match=r"invalid CatalogSettings: max_tools must be at least 1, got 0; "
                                                r"mode must be 'auto', 'index' or 'stubs', got 'all'"):
        CatalogSettings(max_tools=0, mode="all")  # type: ignore[arg-type]


@pytest.mark.parametrize("taken", ["search_tools", "describe_tool"])
async def test_a_tool_named_like_a_catalog_function_is_refused(taken: str) -> None:
    agent = Agent(scripted_model("x"), name="clash")
    agent.tool_plain(name=taken)(lambda query: query)
    with pytest.raises(CodeModeUserError, match=rf"'clash' has a tool named '{taken}', the name of a function "
                                                r"programs use to search a large tool catalog.*rename the tool, or "
                                                r"keep every stub .*CatalogSettings\(mode='stubs'\)"):
        await CodeModeAgent(agent).tools()
    # Allowed where programs never get the catalog functions.
    assert taken in await CodeModeAgent(agent, catalog=CatalogSettings(mode="stubs")).tools()
    assert taken in await CodeModeAgent(agent, code_mode=False).tools()


# -- search and describe, as workflow code answers them ---------------------------------------------------------


async def test_search_ranks_by_name_then_summary_then_stub_with_ties_by_name() -> None:
    spec = await describe_run(catalog_agent(scripted_model("x")))
    assert spec.catalog is not None
    index = CatalogIndex(spec.catalog)
    assert [h["name"] for h in index.search("archive contracts", 3)] == [
        "archive_contract", "delete_contract", "archive_account"]  # a word in the name, its plural folded
    assert index.search("refund", 2) == [  # ten tools have it in their name: by name
        {"name": "archive_refund",
         "summary": "Archive a refund: it is kept, but hidden from `list_refunds` by default."},
        {"name": "count_refunds", "summary": "Count refunds with a status, optionally only one owner's."}]
    assert index.search("xyzzy plugh") == []
    assert len(index.search("get", 100)) == SEARCH_LIMIT_MAX
    assert [h["name"] for h in index.search("CSV")][:2] == ["export_accounts", "export_alerts"]  # in the summary
    # What a program unchecked by the type checker gets for bad arguments (after a REPL variable was rebound).
    assert index.answer("search_tools", [3], {})["message"].startswith("search_tools(query=...) takes a string")
    assert index.answer("describe_tool", [], {"nme": "x"}) == {
        "exc_type": "TypeError", "message": "describe_tool() got an unexpected keyword argument 'nme'; it takes name"}
    answer = index.answer("search_tools", ["archive contract"], {"limit": 1})
    assert decode_answer(encode_answer(answer)) == answer  # what the compute activity would give again


async def test_search_and_describe_in_a_program(client: Client) -> None:
    code = """
found = search_tools("create refund", limit=2)
also = search_tools(query="count incidents")
stub = describe_tool("create_refund")
[found, also[0], stub.splitlines()[0], "async def create_refund(*, name: str" in stub, len(search_tools("get", 99))]
"""
    result = await _catalog_run(client, RunCode(code), echo)
    found, also, first_line, has_def, capped = eval(result.output)["result"]
    assert found == [{"name": "create_refund", "summary": "Create a refund and return it with its new id."},
                     {"name": "archive_refund",
                      "summary": "Archive a refund: it is kept, but hidden from `list_refunds` by default."}]
    assert also["name"] == "count_incidents"
    assert first_line == "class Refund(TypedDict):" and has_def  # the type it returns, then the tool
    assert capped == SEARCH_LIMIT_MAX
    assert result.nested_calls == []  # answered in workflow code: no activity


async def test_an_unknown_tool_name_is_a_key_error_naming_close_matches(client: Client) -> None:
    code = """
out = []
for name in ["get_refnd", "zzzz"]:
    try:
        describe_tool(name)
    except KeyError as e:
        out.append(str(e))
out
"""
    result = await _catalog_run(client, RunCode('search_tools(3)'), RunCode(code), echo)
    rejected = result.turns[0].snippets[0]
    assert rejected.outcome == "rejected" and "Argument to function `search_tools` is incorrect" in rejected.result
    typo, nothing = eval(result.output)["result"]
    assert "describe_tool('get_refnd'): the agent has no tool named 'get_refnd' (close matches: 'get_refund'" in typo
    assert "search_tools(query) finds tools by what they do" in typo
    assert "no tool has a similar name" in nothing


async def test_a_tool_whose_stub_is_not_in_the_description_is_type_checked_and_runs(client: Client) -> None:
    wrong = 'await create_refund(name=1250, owner="alex@example.com")'  # an int for a str: the full stub says so
    right = 'r = await create_refund(name="Refund 1", owner="alex@example.com", amount_cents=1250)\nr["amount_cents"]'
    result = await _catalog_run(client, RunCode(wrong), RunCode(right), echo)
    first, second = [s for t in result.turns for s in t.snippets]
    assert first.outcome == "rejected" and "invalid-argument-type" in first.result
    assert second.outcome == "ok" and eval(result.output)["result"] == 1250
    assert [c.tool for c in result.nested_calls] == ["create_refund"]


async def test_the_catalog_functions_are_awaited_by_mistake_or_missing_in_small_agents(client: Client) -> None:
    awaited = await _catalog_run(client, RunCode('await search_tools("refund")'), echo)
    assert [s.outcome for t in awaited.turns for s in t.snippets] == ["rejected"]  # the stub is a plain def
    small, _ = await run(client, items_agent(_name(), RunCode('search_tools("x")'), echo))
    snippet = small.turns[0].snippets[0]
    assert snippet.outcome == "rejected" and "search_tools" in snippet.result  # no such function here


async def test_the_scripted_task_finds_describes_and_calls_three_tools(client: Client) -> None:
    result = await _catalog_run(client, *task_steps(index=True))
    assert sorted(c.tool for c in result.nested_calls) == EXPECTED
    assert eval(result.output) == {"refund": "refund_99999", "archived": "archived", "open_incidents": 42}
    assert result.usage.requests == 3


async def test_catalog_answers_are_given_again_when_the_program_goes_on_in_the_compute_activity(
        client: Client) -> None:
    # 3 s of compute after two catalog answers: the stretch goes on in the compute activity, from the snippet's
    # start, which must get the same answers again (recorded inline, never asked of a worker's tools).
    code = """
hit = search_tools("create refund", limit=1)[0]["name"]
first = describe_tool(hit).splitlines()[0]
n = 0
for i in range(15_000_000):
    n = (n + i * i) % 1_000_003
r = await create_refund(name=first, owner="alex@example.com")
[hit, first, n, r["name"]]
"""
    result = await _catalog_run(client, RunCode(code), echo)
    snippet = result.turns[0].snippets[0]
    assert snippet.outcome == "ok" and snippet.computed_seconds is not None and snippet.computed_seconds > 1
    hit, first, _n, name = eval(result.output)["result"]
    assert (hit, first, name) == ("create_refund", "class Refund(TypedDict):", "class Refund(TypedDict):")
