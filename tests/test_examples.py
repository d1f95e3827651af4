"""pydantic-ai's own examples, made durable (examples/): each run as its `main` runs it, against the real dev server.

Only the model is swapped, for a scripted pydantic-ai `FunctionModel` that writes `run_code` programs (and the
same script calling the tools directly drives `agent.run()`, the baseline). Every run an example's `main` makes is
recorded (its `run_agent` is wrapped), replayed with Temporal's `Replayer`, and its usage compared with the
baseline's: requests and tool calls are the same, so is the output; tokens are the scripted model's estimates of
two different conversations (code mode's `run_code` description and programs), printed for docs/examples.md.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import os
import re
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.usage import RunUsage
from pydantic_core import to_jsonable_python
from temporalio.client import Client

from durable_codemode import RunFailedError, RunResult
from durable_codemode import run_agent as durable_run_agent
from durable_codemode.testing import CallTool, FinalOutput, RunCode, last_result, replay, scripted_model, user_prompt

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)

NAMES = ("bank_support", "sql_gen", "weather_agent", "flight_booking", "rag")


@pytest.fixture(scope="module")
def examples() -> dict[str, ModuleType]:
    """The example modules; their agents name OpenAI models, which pydantic-ai builds (with a key) on import."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "sk-unused: every example's model is swapped for a scripted one")
        return {name: importlib.import_module(f"examples.{name}") for name in NAMES}


class Runs:
    """Every durable run an example's `main` makes, recorded by wrapping its `run_agent`."""

    def __init__(self) -> None:
        self.results: list[RunResult[Any]] = []

    async def run_agent(self, *args: Any, **kwargs: Any) -> RunResult[Any]:
        result = await durable_run_agent(*args, **kwargs)
        self.results.append(result)
        return result

    async def replay_all(self, client: Client) -> None:
        for result in self.results:
            assert result.run_id is not None
            await replay(client.get_workflow_handle(result.run_id))

    @property
    def usage(self) -> RunUsage:
        total = RunUsage()
        for result in self.results:
            total.incr(result.usage)
        return total


def _record(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str = "run_agent") -> Runs:
    runs = Runs()
    monkeypatch.setattr(module, name, runs.run_agent)
    return runs


def _same_usage(example: str, durable: RunUsage, plain: RunUsage) -> None:
    print(f"\n{example}: durable requests={durable.requests} tool_calls={durable.tool_calls} "
          f"input_tokens={durable.input_tokens} output_tokens={durable.output_tokens} | agent.run() "
          f"requests={plain.requests} tool_calls={plain.tool_calls} input_tokens={plain.input_tokens} "
          f"output_tokens={plain.output_tokens}")
    assert (durable.requests, durable.tool_calls) == (plain.requests, plain.tool_calls), example


def _scripted(*agents: Agent[Any, Any], step: Callable[[list[ModelMessage]], Any]) -> None:
    """Swap each agent's model for a scripted one answering every turn with `step`."""
    for agent in agents:
        agent.model = scripted_model(*([step] * 10))


def _returned(messages: list[ModelMessage]) -> bool:
    """Whether the run's last request answers a tool call (so the model has the tool's result)."""
    last = messages[-1]
    return isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts)


def _result(messages: list[ModelMessage], index: int = 0) -> Any:
    """The last tool result as data: a program's value (code mode), or the tool's own return (agent.run())."""
    value = to_jsonable_python(last_result(messages, index))
    return value["result"] if isinstance(value, dict) and "result" in value else value


def _instructions(messages: list[ModelMessage]) -> str:
    return next(m.instructions or "" for m in reversed(messages) if isinstance(m, ModelRequest) and m.instructions)


# -- bank_support: deps holding a connection, built on the worker -------------------------------------------------


def bank_step(code_mode: bool) -> Callable[[list[ModelMessage]], Any]:
    def step(messages: list[ModelMessage]) -> Any:
        name = re.search(r"name is '(\w+)'", _instructions(messages))
        assert name, "the dynamic instructions did not read the customer's name through the worker's connection"
        if user_prompt(messages) != "What is my balance?":
            return FinalOutput({"support_advice": f"{name[1]}, we are blocking your card.", "block_card": True,
                                "risk": 8})
        if not _returned(messages):
            return RunCode("await customer_balance()") if code_mode else CallTool("customer_balance")
        return FinalOutput({"support_advice": f"Hello {name[1]}, your balance is {_result(messages)}.",
                            "block_card": False, "risk": 1})

    return step


async def test_bank_support(client: Client, examples: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    bank = examples["bank_support"]
    runs = _record(monkeypatch, bank)
    _scripted(bank.support_agent, step=bank_step(code_mode=True))
    await bank.main(client)
    await runs.replay_all(client)

    _scripted(bank.support_agent, step=bank_step(code_mode=False))
    plain, usage = [], RunUsage()
    with sqlite3.connect(":memory:") as con:
        con.execute("CREATE TABLE customers(id, name, balance)")
        con.execute("INSERT INTO customers VALUES (123, 'John', 123.45)")
        deps = bank.SupportDependencies(customer_id=123, db=bank.DatabaseConn(sqlite_conn=con))
        for prompt in ("What is my balance?", "I just lost my card!"):
            plain.append((await bank.support_agent.run(prompt, deps=deps, usage=usage)).output)
    assert [r.output for r in runs.results] == plain
    assert plain[0].support_advice == "Hello John, your balance is $123.45." and plain[1].block_card
    _same_usage("bank_support", runs.usage, usage)


# -- sql_gen: an output validator that checks the SQL on the worker's SQLite connection ------------------------------


def _retries(messages: list[ModelMessage]) -> list[Any]:
    """What the run asked the model to retry, with why (pydantic-ai's retried tool returns)."""
    return [p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart) and p.outcome == "retried"]


def sql_step(messages: list[ModelMessage]) -> Any:
    table = "nowhere" if "nowhere" in user_prompt(messages) or not _retries(messages) else "records"
    return FinalOutput({"sql_query": f"SELECT * FROM {table} WHERE level = 'error'", "explanation": "error records"},
                       tool="final_result_Success")


async def test_sql_gen(client: Client, examples: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    sql = examples["sql_gen"]
    runs = _record(monkeypatch, sql)
    prompt = "show me logs with level 'error'"
    monkeypatch.setattr("sys.argv", ["sql_gen", prompt])
    _scripted(sql.agent, step=sql_step)
    await sql.main(client)
    await runs.replay_all(client)
    (result,) = runs.results
    # The output validator ran EXPLAIN on the worker's SQLite connection: the table that is not there was retried.
    assert _retries(result.all_messages()) == ["Invalid query: no such table: nowhere"]
    async with sql.database_connect(":memory:") as conn:
        plain = await sql.agent.run(prompt, deps=sql.Deps(conn))
    assert result.output == plain.output == sql.Success(sql_query="SELECT * FROM records WHERE level = 'error'",
                                                         explanation="error records")
    _same_usage("sql_gen", runs.usage, plain.usage)

    # A query SQLite cannot explain: the validator's ModelRetry, past the agent's output retries (1) as in agent.run(),
    # which run_agent raises as agent.run() does (pydantic-ai's UnexpectedModelBehavior, with the run's id).
    monkeypatch.setattr("sys.argv", ["sql_gen", "logs from nowhere"])
    with pytest.raises(UnexpectedModelBehavior, match=r"Exceeded maximum output retries \(1\)") as failed:
        await sql.main(client)
    async with sql.database_connect(":memory:") as conn:
        with pytest.raises(UnexpectedModelBehavior, match=r"Exceeded maximum output retries \(1\)"):
            await sql.agent.run("logs from nowhere", deps=sql.Deps(conn))
    assert isinstance(failed.value, RunFailedError) and failed.value.run_id


# -- weather_agent: the worker's HTTP client, answered from local data --------------------------------------------


WEATHER_PROGRAM = """\
import asyncio
places = ['London', 'Wiltshire']
where = await asyncio.gather(*(get_lat_lng(location_description=p) for p in places))
weather = await asyncio.gather(*(get_weather(lat=w['lat'], lng=w['lng']) for w in where))
[w['description'] + ', ' + w['temperature'] for w in weather]"""


def weather_step(code_mode: bool) -> Callable[[list[ModelMessage]], Any]:
    def step(messages: list[ModelMessage]) -> Any:
        calls = sum(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts)
        if code_mode and not calls:
            return RunCode(WEATHER_PROGRAM)
        if not code_mode and calls == 0:
            return [CallTool("get_lat_lng", {"location_description": p}) for p in ("London", "Wiltshire")]
        if not code_mode and calls == 2:
            return [CallTool("get_weather", _result(messages, i)) for i in (0, 1)]
        weather = _result(messages) if code_mode else [
            f"{w['description']}, {w['temperature']}" for w in (_result(messages, i) for i in (0, 1))]
        return f"London: {weather[0]}; Wiltshire: {weather[1]}."

    return step


async def test_weather_agent(client: Client, examples: dict[str, ModuleType],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    weather = examples["weather_agent"]
    runs = _record(monkeypatch, weather)
    _scripted(weather.weather_agent, step=weather_step(code_mode=True))
    await weather.main(client)
    await runs.replay_all(client)

    _scripted(weather.weather_agent, step=weather_step(code_mode=False))
    async with weather.AsyncClient(transport=weather.LOCAL_ENDPOINTS) as http:
        plain = await weather.weather_agent.run("What is the weather like in London and in Wiltshire?",
                                                deps=weather.Deps(client=http))
    (result,) = runs.results
    assert result.output == plain.output == "London: Sunny, 20 °C; Wiltshire: Light rain, 20 °C."
    # One program gathers the four calls: one model request fewer than calling the tools two by two.
    assert (result.usage.requests, plain.usage.requests) == (2, 3)
    assert result.usage.tool_calls == plain.usage.tool_calls == 4
    print(f"\nweather_agent: durable requests=2 tool_calls=4 input_tokens={result.usage.input_tokens} "
          f"output_tokens={result.usage.output_tokens} | agent.run() requests=3 tool_calls=4 "
          f"input_tokens={plain.usage.input_tokens} output_tokens={plain.usage.output_tokens}")


# -- flight_booking: delegation with usage=ctx.usage, a conversation continued with all_messages() and usage -------


def _flights(text: str) -> list[dict[str, Any]]:
    """The flights of the page, as the extraction agent's model reads them."""
    found = []
    for block in text.strip().split("\n\n"):
        number = re.search(r"Flight (\S+)", block)
        price = re.search(r"\$(\d+)", block)
        codes = re.findall(r"\((\w{3})\)", block)
        day = re.search(r"Date: (\w+ \d+, \d+)", block)
        assert number and price and day and len(codes) == 2
        found.append({"flight_number": number[1], "price": int(price[1]), "origin": codes[0],
                      "destination": codes[1],
                      "date": datetime.datetime.strptime(day[1], "%B %d, %Y").date().isoformat()})
    return found


def extraction_step(messages: list[ModelMessage]) -> Any:
    return FinalOutput(_flights(user_prompt(messages)))


def search_step(code_mode: bool, page: str) -> Callable[[list[ModelMessage]], Any]:
    def step(messages: list[ModelMessage]) -> Any:
        declined = sum(isinstance(p, ToolReturnPart) and p.content == "Please suggest another flight"
                       for m in messages if isinstance(m, ModelRequest) for p in m.parts)
        retried = bool(_retries(messages[-1:]))
        if declined:  # the user wants another: the cheaper one was turned down
            number = "SFO-AK123"
        elif retried:  # the validator said the destination was wrong
            number = "NYC-LA101"
        elif not _returned(messages):
            return RunCode("await extract_flights()") if code_mode else CallTool("extract_flights")
        else:
            number = "SFO-AK456"  # to Fairbanks: the output validator asks for another
        flight = next(f for f in _flights(page) if f["flight_number"] == number)
        return FinalOutput(flight, tool="final_result_FlightDetails")

    return step


def seat_step(messages: list[ModelMessage]) -> Any:
    answer = user_prompt([m for m in messages if isinstance(m, ModelRequest)][-1:])
    if "row" in answer:
        return FinalOutput({"row": 1, "seat": "A"}, tool="final_result_SeatPreference")
    return FinalOutput({}, tool="final_result_Failed")


ANSWERS = ["search", "buy", "somewhere nice", "row 1, window"]
"""What the user types at the example's prompts: another flight, then buy it; a seat it cannot read, then one."""


async def test_flight_booking(client: Client, examples: dict[str, ModuleType],
                              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    flights = examples["flight_booking"]
    runs = _record(monkeypatch, flights)
    answers = iter(ANSWERS)
    monkeypatch.setattr(flights.Prompt, "ask", lambda *args, **kwargs: next(answers))
    flights.extraction_agent.model = scripted_model(extraction_step)
    flights.seat_preference_agent.model = scripted_model(seat_step, seat_step)
    _scripted(flights.search_agent, step=search_step(code_mode=True, page=flights.flights_web_page))
    await flights.main(client)
    await runs.replay_all(client)
    assert "Purchasing flight" in capsys.readouterr().out
    bought = [r.output for r in runs.results]
    assert [type(o).__name__ for o in bought] == ["FlightDetails", "FlightDetails", "Failed", "SeatPreference"]
    assert [bought[0].flight_number, bought[1].flight_number] == ["NYC-LA101", "SFO-AK123"]

    # pydantic-ai's own loop (the example's `main` as it was, with agent.run()), on the same script and answers.
    _scripted(flights.search_agent, step=search_step(code_mode=False, page=flights.flights_web_page))
    answers = iter(ANSWERS)
    deps = flights.Deps(web_page_text=flights.flights_web_page, req_origin="SFO", req_destination="ANC",
                        req_date=datetime.date(2025, 1, 10))
    usage, history, plain = RunUsage(), None, []
    while True:
        result = await flights.search_agent.run("Find me a flight", deps=deps, usage=usage, message_history=history,
                                                usage_limits=flights.usage_limits)
        plain.append(result.output)
        if next(answers) == "buy":
            break
        history = result.all_messages(output_tool_return_content="Please suggest another flight")
    history = None
    while True:
        seat = await flights.seat_preference_agent.run(next(answers), message_history=history, usage=usage,
                                                       usage_limits=flights.usage_limits)
        plain.append(seat.output)
        if isinstance(seat.output, flights.SeatPreference):
            break
        history = seat.all_messages()
    assert bought == plain
    # run_agent counted into the example's one RunUsage, as agent.run() does: the last run holds the total.
    assert all(r.usage is runs.results[0].usage for r in runs.results)
    _same_usage("flight_booking", runs.results[-1].usage, usage)
    assert usage.requests == 7  # search: extract, its sub-agent, a rejected offer, an offer; again; two seat runs


# -- rag: the worker's SQLite search DB and embeddings client, from local data --------------------------------------


def rag_step(code_mode: bool) -> Callable[[list[ModelMessage]], Any]:
    def step(messages: list[ModelMessage]) -> Any:
        if not _returned(messages):
            query = {"search_query": "configure logfire with FastAPI"}
            return RunCode(f"await retrieve(search_query={query['search_query']!r})") if code_mode else CallTool(
                "retrieve", query)
        first = str(_result(messages)).split("\n")[0]
        return f"See the section {first.lstrip('# ')}."

    return step


async def test_rag(client: Client, examples: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch,
                   tmp_path: Path) -> None:
    rag = examples["rag"]
    monkeypatch.setattr(rag, "DATABASE", str(tmp_path / "rag.sqlite"))
    runs = _record(monkeypatch, rag, "run_durable_agent")
    await rag.build_search_db()
    _scripted(rag.agent, step=rag_step(code_mode=True))
    question = "How do I configure logfire to work with FastAPI?"
    await rag.run_agent(question, client)
    await runs.replay_all(client)

    _scripted(rag.agent, step=rag_step(code_mode=False))
    async with rag.database_connect() as pool:
        plain = await rag.agent.run(question, deps=rag.Deps(openai=rag.local_openai(), pool=pool))
    (result,) = runs.results
    # The local embeddings ranked the FastAPI section first, in the worker's SQLite search DB.
    assert result.output == plain.output == "See the section FastAPI."
    _same_usage("rag", result.usage, plain.usage)


# -- the README's walkthrough --------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def test_the_readmes_walkthrough_is_examples_walkthrough_py() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\n", readme.index("## Make your own agent durable")) + len("```python\n")
    assert readme[start:readme.index("```\n", start)] == (ROOT / "examples" / "walkthrough.py").read_text()


@pytest.mark.timeout(120)
async def test_the_walkthrough_runs_as_written_without_a_key() -> None:
    """`python examples/walkthrough.py` in a fresh process, as the README says: no server, no key, no network."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OPENAI_", "ANTHROPIC_"))}
    proc = await asyncio.create_subprocess_exec(sys.executable, "examples/walkthrough.py", cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out.decode().splitlines()[-2:] == ["Removed 50 lines.", "2 model requests, 51 tool calls, each an activity"]
