"""Per-run deps, as in `Agent.run(deps=...)`.

Tools in the sandbox and native tools, dynamic instructions and `prepare` functions see `ctx.deps` of their own
run; deps are checked when the run starts and carried across continue-as-new.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest
from pydantic_ai.tools import ToolDefinition
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError

from durable_codemode import (
    CodeModeAgent,
    CodeModeUserError,
    InvalidRunInputError,
    SnippetLimits,
    ToolOptions,
    start_run,
)
from durable_codemode.testing import (
    CallTool,
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
    region: str = "eu"


@dataclass
class Other:
    tenant: str


def _instructions(messages: list[ModelMessage]) -> str:
    return next(m.instructions or "" for m in reversed(messages) if isinstance(m, ModelRequest))


def tenant_agent(name: str, *steps: Any, default: Tenant | None = None, **options: Any) -> CodeModeAgent:
    """Sandbox tools and a native tool that read `ctx.deps`, dynamic instructions, and a tool `prepare` hides."""
    agent = Agent(scripted_model(*steps), name=name, deps_type=Tenant)

    @agent.instructions
    def who(ctx: RunContext[Tenant]) -> str:
        return f"You work for tenant {ctx.deps.tenant} in {ctx.deps.region}."

    @agent.tool
    def lookup(ctx: RunContext[Tenant], i: int) -> str:
        """An item of the run's tenant."""
        return f"{ctx.deps.tenant}/{ctx.deps.region}/{i}"

    @agent.tool(metadata={"codemode": {"in_sandbox": False}})
    def whoami(ctx: RunContext[Tenant]) -> str:
        """The run's tenant (a native tool the model calls directly)."""
        return ctx.deps.tenant

    async def only_in_us(ctx: RunContext[Tenant], tool: ToolDefinition) -> ToolDefinition | None:
        return tool if ctx.deps.region == "us" else None

    @agent.tool(prepare=only_in_us)
    def us_only(ctx: RunContext[Tenant]) -> str:
        """Exists only for tenants in the us region."""
        return "us"

    return CodeModeAgent(agent, deps=default, **options)


def _answer(messages: list[ModelMessage]) -> str:
    return json.dumps({"result": last_result(messages), "instructions": _instructions(messages)})


async def test_each_run_sees_its_own_deps_everywhere(client: Client) -> None:
    code = "import asyncio\nawait asyncio.gather(*(lookup(i=i) for i in range(3)))"
    agent = tenant_agent("deps-tenants", RunCode(code), CallTool("whoami", {}), RunCode("await us_only()"), _answer)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        acme = await start_run(client, "deps-tenants", "go", task_queue=tq, deps=Tenant("acme"))
        globex = await start_run(client, agent, "go", task_queue=tq, deps=Tenant("globex", region="us"))
        results = [await acme.result(), await globex.result()]
    acme_result, globex_result = results
    out = json.loads(acme_result.output)
    assert "You work for tenant acme in eu." in out["instructions"]
    assert [c.result for t in acme_result.turns for c in t.direct_calls] == ["acme"]
    snippets = [s for t in acme_result.turns for s in t.snippets]
    assert json.loads(snippets[0].result)["result"] == ["acme/eu/0", "acme/eu/1", "acme/eu/2"]
    assert json.loads(globex_result.output)["instructions"].startswith("You work for tenant globex in us.")
    globex_snippets = [s for t in globex_result.turns for s in t.snippets]
    assert json.loads(globex_snippets[0].result)["result"] == ["globex/us/0", "globex/us/1", "globex/us/2"]
    # `prepare` saw the deps: the us-only tool exists for the us tenant's program only.
    assert snippets[1].outcome == "rejected" and "us_only" in snippets[1].result
    assert globex_snippets[1].outcome == "ok" and json.loads(globex_snippets[1].result)["result"] == "us"
    await replay(acme)
    await replay(globex)


async def test_deps_survive_continue_as_new(client: Client) -> None:
    agent = tenant_agent("deps-chain", RunCode("a = await lookup(i=1)"), RunCode("[a, await lookup(i=2)]"), _answer,
                         limits=SnippetLimits(max_snippets_per_run=1))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, repl_key="deps-test-key"):  # the REPL is carried
        handle = await start_run(client, "deps-chain", "go", task_queue=tq, deps=Tenant("initech"))
        result = await handle.result()
    assert result.continued_as_new >= 1
    out = json.loads(result.output)
    assert out["result"]["result"] == ["initech/eu/1", "initech/eu/2"]
    assert "initech" in out["instructions"]
    await replay(handle)


async def test_the_agents_default_deps_serve_runs_that_pass_none(client: Client) -> None:
    agent = tenant_agent("deps-default", RunCode("await lookup(i=7)"), _answer, default=Tenant("fallback"))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "deps-default", "go", task_queue=tq)
        result = await handle.result()
    assert json.loads(result.output)["result"]["result"] == "fallback/eu/7"
    await replay(handle)


async def test_deps_of_another_type_are_refused_naming_both_types(client: Client) -> None:
    agent = tenant_agent("deps-wrong", RunCode("await lookup(i=1)"), _answer)
    tq = new_task_queue()
    # Given the agent, the client refuses before anything starts.
    with pytest.raises(InvalidRunInputError, match=r"deps of type \S*test_deps\.Tenant .*of type \S*test_deps\.Other"):
        await start_run(client, agent, "go", task_queue=tq, deps=Other("acme"))
    # Given only its name, the run fails at its first step, with the same message and no retry.
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "deps-wrong", "go", task_queue=tq, deps=Other("acme"))
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "test_deps.Tenant" in str(failed.value.cause.cause) and "test_deps.Other" in str(failed.value.cause.cause)
    await replay(handle)


async def test_deps_that_cannot_be_serialized_or_are_too_large_start_nothing(client: Client) -> None:
    with pytest.raises(InvalidRunInputError, match=r"cannot be serialized.*dataclass, a pydantic BaseModel"):
        await start_run(client, "deps-any", "go", task_queue=new_task_queue(), deps=threading.Lock())
    with pytest.raises(InvalidRunInputError, match=r"bytes as JSON, over 65,536"):
        await start_run(client, "deps-any", "go", task_queue=new_task_queue(), deps={"blob": "x" * 70_000})


async def test_codemode_run_takes_deps_as_json(client: Client) -> None:
    agent = tenant_agent("deps-cli", RunCode("await lookup(i=3)"), _answer)
    tq = new_task_queue()
    env = dict(os.environ, TEMPORAL_ADDRESS=client.service_client.config.target_host)
    async with running_worker(client, [agent], task_queue=tq):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "durable_codemode.cli", "run", "deps-cli", "go", "--task-queue", tq, "--json",
            "--deps-json", '{"tenant": "hooli", "region": "us"}', env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert json.loads(json.loads(out)["output"])["result"]["result"] == "hooli/us/3"
    bad = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durable_codemode.cli", "run", "deps-cli", "go", "--deps-json", "{tenant", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, bad_err = await bad.communicate()
    assert bad.returncode == 2 and "--deps-json is not JSON" in bad_err.decode()


# -- deps that hold connections: the run records ids, the worker builds the agent's own deps_type -----------------


@dataclass
class Bank:
    """pydantic-ai's usual deps: ids beside a live connection (bank_support's `SupportDependencies`)."""

    customer_id: int
    db: sqlite3.Connection


@dataclass
class Customer:
    customer_id: int


def _bank_db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE customers(id, name, balance)")
    db.executemany("INSERT INTO customers VALUES (?, ?, ?)", [(123, "John", 123.45), (7, "Ana", 9.5)])
    return db


def bank_agent(name: str, *steps: Any) -> Agent[Bank, str]:
    agent = Agent(scripted_model(*steps), name=name, deps_type=Bank)

    @agent.instructions
    async def customer_name(ctx: RunContext[Bank]) -> str:
        (row,) = ctx.deps.db.execute("SELECT name FROM customers WHERE id=?", (ctx.deps.customer_id,))
        return f"The customer's name is {row[0]!r}"

    @agent.tool
    async def balance(ctx: RunContext[Bank]) -> str:
        """The customer's balance."""
        (row,) = ctx.deps.db.execute("SELECT balance FROM customers WHERE id=?", (ctx.deps.customer_id,))
        return f"${row[0]:.2f}"

    return agent


async def test_a_deps_factory_builds_the_agents_deps_with_the_workers_connection_per_run(client: Client) -> None:
    db = _bank_db()
    agent = bank_agent("deps-bank", RunCode("await balance()"), _answer)
    bank = CodeModeAgent(agent, deps_factory=lambda run: Bank(customer_id=run["customer_id"], db=db))
    tq = new_task_queue()
    async with running_worker(client, [bank], task_queue=tq):
        john = await start_run(client, bank, "balance?", task_queue=tq, deps={"customer_id": 123})
        ana = await start_run(client, "deps-bank", "balance?", task_queue=tq, deps={"customer_id": 7})
        results = [await john.result(), await ana.result()]
    (john_out, ana_out) = (json.loads(r.output) for r in results)
    assert john_out["result"]["result"] == "$123.45" and "'John'" in john_out["instructions"]
    assert ana_out["result"]["result"] == "$9.50" and "'Ana'" in ana_out["instructions"]
    # Only what the run gave is in its history: the run's input and every activity carry the ids, not a connection.
    history = await john.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    assert json.loads(started.input.payloads[0].data)["deps"] == {"customer_id": 123}
    await replay(john)
    await replay(ana)


async def test_a_deps_factory_gets_its_run_deps_type_checked_before_anything_starts(client: Client) -> None:
    db = _bank_db()
    agent = bank_agent("deps-typed", RunCode("await balance()"), _answer)

    def build(run: Customer) -> Bank:
        return Bank(customer_id=run.customer_id, db=db)

    bank = CodeModeAgent(agent, deps_factory=build, run_deps_type=Customer)
    tq = new_task_queue()
    with pytest.raises(InvalidRunInputError, match=r"of type \S*test_deps\.Customer \(its run_deps_type\).*\S*Tenant"):
        await start_run(client, bank, "go", task_queue=tq, deps=Tenant("acme"))
    with pytest.raises(InvalidRunInputError, match=r"do not validate as \S*Customer"):
        await start_run(client, bank, "go", task_queue=tq, deps={"customer": 1})
    async with running_worker(client, [bank], task_queue=tq):
        result, handle = await _ended(client, "deps-typed", tq, deps=Customer(7))
        assert json.loads(result.output)["result"]["result"] == "$9.50"
        # A run that gives none: the factory would get None, which is not a Customer.
        nothing = await start_run(client, "deps-typed", "go", task_queue=tq)
        with pytest.raises(WorkflowFailureError) as failed:
            await nothing.result()
    assert "do not validate as" in str(failed.value.cause.cause) and "Customer" in str(failed.value.cause.cause)
    await replay(handle)


async def _ended(client: Client, agent: str, tq: str, **options: Any) -> tuple[Any, Any]:
    handle = await start_run(client, agent, "go", task_queue=tq, **options)
    return await handle.result(), handle


async def test_deps_holding_a_connection_are_refused_naming_the_field_and_the_way(client: Client) -> None:
    db = _bank_db()
    agent = bank_agent("deps-live", RunCode("await balance()"), _answer)
    tq = new_task_queue()
    with pytest.raises(InvalidRunInputError) as refused:
        await start_run(client, "deps-live", "go", task_queue=tq, deps=Bank(customer_id=123, db=db))
    message = str(refused.value)
    assert "field 'db' (Connection) is a live resource" in message
    assert "deps_factory=lambda run: Bank(customer_id=run['customer_id'], db=<the worker's Connection>)" in message
    assert "deps={'customer_id': 123}" in message
    # The ids alone, into the agent's unedited deps_type: refused by name (not pydantic's schema error), on the
    # client given the agent, and by the worker given only its name (at the run's first step, not retried).
    plain = CodeModeAgent(agent)
    with pytest.raises(InvalidRunInputError) as rebuilt:
        await start_run(client, plain, "go", task_queue=tq, deps={"customer_id": 123})
    assert "(Bank) cannot be rebuilt from what a run records: its field 'db' holds a live" in str(rebuilt.value)
    assert "lambda run: Bank(customer_id=run['customer_id'], db=<the worker's Connection>)" in str(rebuilt.value)
    async with running_worker(client, [plain], task_queue=tq):
        handle = await start_run(client, "deps-live", "go", task_queue=tq, deps={"customer_id": 123})
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "field 'db'" in str(failed.value.cause.cause) and "deps_factory" in str(failed.value.cause.cause)
    await replay(handle)


def test_a_deps_factory_is_refused_beside_default_deps_and_run_deps_type_needs_one() -> None:
    agent = bank_agent("deps-both", "done")
    with pytest.raises(CodeModeUserError, match="both deps and a deps_factory"):
        CodeModeAgent(agent, deps=Bank(1, _bank_db()), deps_factory=lambda run: Bank(1, _bank_db()))
    with pytest.raises(CodeModeUserError, match="run_deps_type without a deps_factory"):
        CodeModeAgent(agent, run_deps_type=Customer)


async def test_a_failing_deps_factory_fails_the_run_naming_the_agent(client: Client) -> None:
    agent = bank_agent("deps-broken", RunCode("await balance()"), _answer)
    bank = CodeModeAgent(agent, deps_factory=lambda run: Bank(customer_id=run["customer_id"], db=_bank_db()))
    tq = new_task_queue()
    async with running_worker(client, [bank], task_queue=tq):
        handle = await start_run(client, "deps-broken", "go", task_queue=tq, deps={"id": 1})
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "the deps_factory of agent 'deps-broken' failed" in str(failed.value.cause.cause)
    assert "KeyError" in str(failed.value.cause.cause)
    await replay(handle)


# -- a deps_factory's faults: its type checked, its errors classified, built once per activity, off the loop ------


def _factory_calls() -> tuple[list[tuple[str, str, int]], Any]:
    """A list that records (activity type, activity id, attempt) of every call of the factory made with it."""
    calls: list[tuple[str, str, int]] = []

    def note() -> None:
        info = activity.info()
        calls.append((info.activity_type, info.activity_id, info.attempt))

    return calls, note


async def test_a_deps_factory_of_the_wrong_type_fails_the_run_at_once_naming_it_and_both_types(client: Client) -> None:
    calls, note = _factory_calls()

    def build_a_dict(run: Any) -> Any:
        note()
        return {"customer_id": run["customer_id"]}  # not a Bank: its instructions would read ctx.deps.db

    agent = bank_agent("deps-wrong-type", RunCode("await balance()"), _answer)
    bank = CodeModeAgent(agent, deps_factory=build_a_dict)
    tq = new_task_queue()
    async with running_worker(client, [bank], task_queue=tq):
        handle = await start_run(client, "deps-wrong-type", "go", task_queue=tq, deps={"customer_id": 7})
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    message = str(failed.value.cause.cause)
    assert "the deps_factory of agent 'deps-wrong-type'" in message, message
    assert "test_deps.test_a_deps_factory_of_the_wrong_type_fails_the_run_at_once_naming_it_and_both_types." \
           "<locals>.build_a_dict" in message
    assert "returned a dict, not a Bank (the agent's deps_type)" in message, message
    assert failed.value.cause.cause.type == "DepsFactoryError"
    assert len(calls) == 1, calls  # final: the run's start is not tried again
    await replay(handle)


async def test_a_deps_factorys_transient_error_is_retried_like_the_activitys_own(client: Client) -> None:
    calls, note = _factory_calls()
    db = _bank_db()
    failed_in: set[str] = set()

    def build(run: Any) -> Bank:
        note()
        kind = activity.info().activity_type
        if kind not in failed_in and kind != "durable-codemode.describe_agent":  # once in each other activity
            failed_in.add(kind)
            raise ConnectionError(f"the pool is reconnecting ({kind})")
        return Bank(customer_id=run["customer_id"], db=db)

    agent = bank_agent("deps-flaky", RunCode("await balance()"), _answer)
    bank = CodeModeAgent(agent, deps_factory=build)
    tq = new_task_queue()
    async with running_worker(client, [bank], task_queue=tq):
        handle = await start_run(client, "deps-flaky", "go", task_queue=tq, deps={"customer_id": 123})
        result = await handle.result()
    # The model request and the tool call each failed once, and each went on at its next attempt.
    assert json.loads(result.output)["result"]["result"] == "$123.45"
    assert failed_in == {"durable-codemode.model_request", "deps-flaky.balance"}
    retried = {(kind, attempt) for kind, _, attempt in calls if attempt > 1}
    assert retried == {("durable-codemode.model_request", 2), ("deps-flaky.balance", 2)}, calls
    await replay(handle)


async def test_a_deps_factorys_final_error_in_a_tool_call_names_the_factory(client: Client) -> None:
    db = _bank_db()  # opened by the worker (a plain factory runs in a thread: sqlite3 keeps a connection to one)

    def build(run: Any) -> Bank:
        if activity.info().activity_type == "deps-final.balance":
            raise LookupError("no such customer in this region")
        return Bank(customer_id=run["customer_id"], db=db)

    code = "try:\n    r = await balance()\nexcept Exception as e:\n    r = str(e)\nr"
    agent = bank_agent("deps-final", RunCode(code), _answer)
    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent, deps_factory=build)], task_queue=tq):
        handle = await start_run(client, "deps-final", "go", task_queue=tq, deps={"customer_id": 123})
        result = await handle.result()
    seen = json.loads(result.output)["result"]["result"]
    assert "DepsFactoryError: the deps_factory of agent 'deps-final' failed" in seen, seen
    assert "LookupError: no such customer in this region" in seen and "test_deps." in seen, seen
    history = await handle.fetch_history()
    tries = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
             and e.activity_task_started_event_attributes.attempt > 1]
    assert not tries  # final: not retried
    await replay(handle)


async def test_deps_are_built_once_per_activity_a_batch_included(client: Client) -> None:
    calls, note = _factory_calls()
    db = _bank_db()

    def build(run: Any) -> Bank:
        note()
        return Bank(customer_id=run["customer_id"], db=db)

    agent = bank_agent("deps-once", RunCode("import asyncio\nawait asyncio.gather(*(read(i=i) for i in range(5)))"),
                       _answer)

    @agent.tool
    async def read(ctx: RunContext[Bank], i: int) -> str:
        """Item `i` of the customer."""
        return f"{ctx.deps.customer_id}/{i}"

    bank = CodeModeAgent(agent, deps_factory=build, tool_options={"read": ToolOptions(batch=True)})
    tq = new_task_queue()
    async with running_worker(client, [bank], task_queue=tq):
        handle = await start_run(client, "deps-once", "go", task_queue=tq, deps={"customer_id": 7})
        result = await handle.result()
    assert json.loads(result.output)["result"]["result"] == [f"7/{i}" for i in range(5)]
    per_activity = Counter((kind, activity_id, attempt) for kind, activity_id, attempt in calls)
    assert set(per_activity.values()) == {1}, per_activity
    # The run's start, each model request (pydantic-ai's step hands the deps on), one batch of five calls.
    assert Counter(kind for kind, _, _ in calls) == {"durable-codemode.describe_agent": 1,
                                                      "durable-codemode.model_request": 2,
                                                      "durable-codemode.tool_batch": 1}
    await replay(handle)


async def test_a_slow_plain_deps_factory_holds_up_no_other_run_and_an_async_one_is_awaited(client: Client) -> None:
    db = _bank_db()

    def slow(run: Any) -> Bank:
        time.sleep(0.5)  # a blocking client library opening a session, say
        return Bank(customer_id=run["customer_id"], db=db)

    async def awaited(run: Any) -> Bank:
        await asyncio.sleep(0)
        return Bank(customer_id=run["customer_id"], db=db)

    slow_bank = CodeModeAgent(bank_agent("deps-slow", RunCode("await balance()"), _answer), deps_factory=slow)
    async_bank = CodeModeAgent(bank_agent("deps-async", RunCode("await balance()"), _answer), deps_factory=awaited)
    lags: list[float] = []

    async def watch_the_loop() -> None:  # this process's event loop runs the worker: how long is it held up?
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    tq = new_task_queue()
    async with running_worker(client, [slow_bank, async_bank], task_queue=tq):
        watcher = asyncio.create_task(watch_the_loop())
        try:
            slow_run = await start_run(client, "deps-slow", "go", task_queue=tq, deps={"customer_id": 123})
            async_run = await start_run(client, "deps-async", "go", task_queue=tq, deps={"customer_id": 7})
            results = [await slow_run.result(), await async_run.result()]
        finally:
            watcher.cancel()
    assert [json.loads(r.output)["result"]["result"] for r in results] == ["$123.45", "$9.50"]
    # Four calls of 0.5 s each ran in a thread; the loop never stopped for one of them.
    assert max(lags) < 0.4, f"the worker's event loop was held up for {max(lags):.2f} s"
    await replay(slow_run)
    await replay(async_run)
