"""Durable delegation: a tool that runs another `CodeModeAgent` as a child run (`child_run_tool`).

The child is a run of its own (its history replays on its own), started by the parent's call; its output answers
the call, its usage counts in the parent's, its calls waiting for a person are listed by the parent's
`pending_approvals`, and its failure is an exception the parent's program may catch. The same tool under plain
`agent.run()` delegates as pydantic-ai does, with the same requests counted.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import ModelHTTPError, UsageLimitExceeded
from pydantic_ai.usage import UsageLimits
from pydantic_core import to_jsonable_python
from temporalio.client import Client, WorkflowUpdateFailedError

from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    ToolOptions,
    add_child_run_tool,
    child_run_tool,
    decide,
    pending_approvals,
    rejected_decisions,
    run_agent,
    start_run,
    wait_for_approvals,
)
from durable_codemode.debugging import render_trace, trace_run
from durable_codemode.shared._approvals import ChildApprovals, PendingApproval
from durable_codemode.shared._names import CHILD_APPROVALS_SIGNAL, child_run_id
from durable_codemode.testing import (
    CallTool,
    FinalOutput,
    RunCode,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
    user_prompt,
)

from .test_approval_authorization import KEYRING, KEYS
from .test_debugging import address, codemode


class Flight(BaseModel):
    number: str
    price: int


def extraction(name: str, *, approval: bool = False) -> CodeModeAgent:
    """The sub-agent: reads flights out of its prompt (with `approval`, after a call that waits for a person)."""

    def read(messages: Any) -> Any:
        words = user_prompt(messages).split()
        if not all(":" in w for w in words):  # a model error no retry can help: the child run fails at once
            raise ModelHTTPError(400, "extractor", "the prompt holds no flights")
        return FinalOutput([{"number": w.split(":")[0], "price": int(w.split(":")[1])} for w in words])

    steps: list[Any] = [RunCode("await log_request(what='extract')"), read] if approval else [read]
    agent = Agent(scripted_model(*steps), name=name, output_type=list[Flight])

    @agent.tool_plain
    def log_request(what: str) -> str:
        """Record the request (needs a person's approval)."""
        return f"logged {what}"

    return CodeModeAgent(agent, tool_options={"log_request": ToolOptions(requires_approval=approval)})


def search(name: str, child: CodeModeAgent, code: str) -> Agent[None, str]:
    agent = Agent(scripted_model(RunCode(code), lambda m: f"cheapest: {last_result(m).get('result')}"), name=name,
                  tools=[child_run_tool(child, description="Extract every flight from a page of text.")])
    return agent


def plain_search(name: str, child: CodeModeAgent) -> Agent[None, str]:
    """The same parent for `agent.run()`, whose model calls the tool directly (there is no run_code there)."""

    def cheapest(messages: Any) -> str:
        flights = to_jsonable_python(last_result(messages))
        return f"cheapest: {min(flights, key=lambda f: f['price'])['number']}"

    call = CallTool(f"ask_{child.name}", {"prompt": "AK123:350 LA101:250 AK456:370"})
    return Agent(scripted_model(call, cheapest), name=name, tools=[child_run_tool(child)])


PROGRAM = ("flights = await ask_{child}(prompt='AK123:350 LA101:250 AK456:370')\n"
           "min(flights, key=lambda f: f['price'])['number']")


async def test_a_child_run_answers_the_call_and_its_usage_counts(client: Client) -> None:
    suffix = os.urandom(3).hex()
    child = extraction(f"extract{suffix}")
    parent = CodeModeAgent(search(f"search{suffix}", child, PROGRAM.format(child=f"extract{suffix}")))
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq):
        handle = await start_run(client, parent, "Find the cheapest flight", task_queue=tq)
        result = await handle.result()
    assert result.output == "cheapest: LA101"
    assert (result.usage.requests, result.usage.tool_calls) == (2 + 1, 1)  # the parent's two, the child's one
    (call,) = result.nested_calls
    assert call.status == "ok" and "LA101" in call.result
    # The child is a run of its own, under an id made of the parent's and the call's; both histories replay.
    child_handle = client.get_workflow_handle_for(CodeModeRunWorkflow.run, child_run_id(handle.id, call.call_id))
    child_result = await child_handle.result()
    assert [f["number"] for f in child_result.output] == ["AK123", "LA101", "AK456"]
    await replay(handle)
    await replay(child_handle)
    trace = await trace_run(client, handle.id)
    (traced,) = trace.nested_calls
    assert traced.status == "ok" and traced.child_run_id == child_handle.id and "LA101" in (traced.result or "")
    # `codemode trace` draws the child run under the call that started it.
    drawing = render_trace(trace)
    assert f"child run {child_handle.id} (agent extract{suffix}): completed" in drawing, drawing
    assert drawing.index("ask_extract") < drawing.index(f"child run {child_handle.id}")

    # `codemode watch` shows the call that started the child run, and its answer.
    rc, out, err = await codemode("watch", handle.id, address=address(client))
    assert rc == 0, (out, err)
    assert f'  ▸ {call.call_id} ask_extract{suffix}(prompt="AK123:350 LA101:250 AK456:370")' in out.splitlines()
    assert any(line.startswith(f"  ✓ {call.call_id} ask_extract{suffix}(") and "LA101" in line
               for line in out.splitlines()), out

    # The same parent under agent.run(): pydantic-ai's delegation, the same requests and tool calls counted.
    plain = await plain_search(f"search{suffix}", child).run("Find the cheapest flight")
    assert plain.output == result.output
    assert (plain.usage.requests, plain.usage.tool_calls) == (result.usage.requests, result.usage.tool_calls)


async def test_a_child_runs_approvals_are_listed_by_its_parent(client: Client) -> None:
    suffix = os.urandom(3).hex()
    child = extraction(f"extractok{suffix}", approval=True)
    parent = CodeModeAgent(search(f"searchok{suffix}", child, PROGRAM.format(child=f"extractok{suffix}")))
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, parent, "Find the cheapest flight", task_queue=tq)
        async with asyncio.timeout(30):
            while not (waiting := await pending_approvals(client, handle.id)):
                await asyncio.sleep(0.05)
        (call,) = waiting
        assert call.tool == "log_request" and call.run_id == child_run_id(handle.id, "call_0.0")
        # Deciding it on the parent says where it waits, and the parent lists the refusal (issue 42, item 3);
        # deciding it there lets both runs go on.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await decide(client, handle.id, call.call_id, approved=True, approver="ana")
        assert f"it may wait in this run's child run {call.run_id!r}" in str(refused.value.cause)
        (rejected,) = await rejected_decisions(client, handle.id)
        assert rejected.call_id == call.call_id and rejected.approver == "ana"
        assert f"child run {call.run_id!r}" in rejected.reason
        await decide(client, call.run_id, call.call_id, approved=True, approver="ana")
        result = await handle.result()
        assert await pending_approvals(client, handle.id) == []
    assert result.output == "cheapest: LA101"
    await replay(handle)
    await replay(client.get_workflow_handle(call.run_id))


async def test_a_failed_child_run_is_an_exception_in_the_program(client: Client) -> None:
    suffix = os.urandom(3).hex()
    child = extraction(f"extractbad{suffix}")
    code = ("try:\n    await ask_extractbad{s}(prompt='not a flight')\nexcept Exception as e:\n    r = str(e)\nr"
            ).replace("{s}", suffix)
    parent = CodeModeAgent(search(f"searchbad{suffix}", child, code))
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq):
        handle = await start_run(client, parent, "Find the cheapest flight", task_queue=tq)
        result = await handle.result()
    assert f"the extractbad{suffix} run" in result.output and "the prompt holds no flights" in result.output
    await replay(handle)


# -- attacks and faults on a parent's listing of its children's calls (issue 42, items 1 and 2) ----------------------


def gated(name: str, steps: Any, *, child: CodeModeAgent | None = None) -> CodeModeAgent:
    """An agent with `pay(x)`, a call a person must approve, and `ask_<child>` when given a child."""
    agent = Agent(scripted_model(*steps), name=name,
                  tools=[child_run_tool(child)] if child is not None else [])

    @agent.tool_plain(requires_approval=True)
    def pay(x: int) -> str:
        """Pay `x`."""
        PAID.append((name, x))
        return f"paid {x}"

    return CodeModeAgent(agent)


PAID: list[tuple[str, int]] = []


async def test_a_forged_list_of_a_childs_calls_shows_nothing_and_a_decision_on_it_is_refused(client: Client) -> None:
    suffix = os.urandom(3).hex()
    child = gated(f"payee{suffix}", [RunCode("await pay(x=7)"), "child done"])
    parent = gated(f"payer{suffix}", [RunCode(f"await ask_payee{suffix}(prompt='pay 7')"), "parent done"],
                   child=child)
    other = gated(f"other{suffix}", [RunCode("await pay(x=999)"), "other done"])
    tq = new_task_queue()
    ana = KEYS["ana"]
    async with running_worker(client, [parent, child, other], task_queue=tq, approver_keys=KEYRING):
        victim = await start_run(client, other, "go", task_queue=tq)
        handle = await start_run(client, parent, "go", task_queue=tq)
        await wait_for_approvals(client, victim.id)
        (real,) = await wait_for_approvals(client, handle.id)
        child_id = child_run_id(handle.id, "call_0.0")
        assert (real.run_id, real.call_id, real.args) == (child_id, "call_0.0", {"x": 7})
        # Anyone can signal the parent: a list naming the other run's call with made-up arguments, then one saying
        # the real child waits on nothing, then one giving the real child's call other arguments.
        now = datetime.now(UTC)
        fake = PendingApproval(call_id="call_0.0", tool="pay", args={"x": 1}, code="", line=1, requested_at=now)
        for news in (ChildApprovals(run_id=victim.id, pending=[replace(fake, run_id=victim.id)]),
                     ChildApprovals(run_id=child_id, pending=[]),
                     ChildApprovals(run_id=child_id, pending=[replace(fake, run_id=child_id)])):
            await handle.signal(CHILD_APPROVALS_SIGNAL, news)
        await handle.query(CodeModeRunWorkflow.pending_approvals)  # the signals are in
        # The parent's list is read from its children themselves: the real call, its real arguments, nothing else.
        assert await pending_approvals(client, handle.id) == [real]
        # A decision signed on what a forged list showed (the other run's call, x=1) is refused by the run that
        # holds the real call (x=999), which never runs.
        seen = replace(fake, run_id=victim.id)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await decide(client, victim.id, "call_0.0", approved=True, signer=ana, seen=seen)
        assert "for other arguments than the call holds" in str(refused.value.cause)
        # Signed on what the real list shows, each goes on.
        await decide(client, real.run_id or "", real.call_id, approved=True, signer=ana, seen=real)
        (victims,) = await pending_approvals(client, victim.id)
        await decide(client, victim.id, victims.call_id, approved=False, signer=ana, seen=victims)
        assert (await handle.result()).output == "parent done"
        assert (await victim.result()).output == "other done"
    assert (f"payee{suffix}", 7) in PAID and (f"other{suffix}", 999) not in PAID
    for run in (handle, victim, client.get_workflow_handle(child_id)):
        await replay(run)


async def test_approving_all_of_a_parent_decides_its_own_calls_and_names_its_childrens(client: Client,
                                                                                         tmp_path: Any) -> None:
    suffix = os.urandom(3).hex()
    child = gated(f"kid{suffix}", [RunCode("await pay(x=5)"), "kid done"])
    both = f"import asyncio\nawait asyncio.gather(ask_kid{suffix}(prompt='pay 5'), pay(x=50))"
    parent = gated(f"mom{suffix}", [RunCode(both), "mom done"], child=child)
    key = tmp_path / "ana.json"
    KEYS["ana"].save(key)
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq, approver_keys=KEYRING):
        handle = await start_run(client, parent, "go", task_queue=tq)
        waiting = await wait_for_approvals(client, handle.id, count=2)
        child_id = child_run_id(handle.id, "call_0.0")
        assert {(p.run_id, p.call_id) for p in waiting} == {(None, "call_0.1"), (child_id, "call_0.0")}
        rc, out, err = await codemode("approve", handle.id, "--all", "--key", str(key), address=address(client))
        assert rc == 0, (out, err)
        lines = out.splitlines()
        assert any(line.startswith("approved call_0.1 pay(x=50) by ana") for line in lines), out
        assert (f"not decided here: call_0.0 pay(x=5) waits in child run {child_id}: codemode approve {child_id} "
                "call_0.0 (or --all there)") in lines, out
        (left,) = await pending_approvals(client, handle.id)
        assert (left.run_id, left.call_id) == (child_id, "call_0.0")  # the child's call still waits
        rc, out, err = await codemode("approve", child_id, "--all", "--key", str(key), address=address(client))
        assert rc == 0 and "approved call_0.0 pay(x=5) by ana" in out, (out, err)
        assert (await handle.result()).output == "mom done"
    for run in (handle, client.get_workflow_handle(child_id)):
        await replay(run)


# -- child runs as users write sub-agents: deps from the parent's, bound by the parent's limits (issue 42, item 6) ----


@dataclass
class Tenant:
    tenant: str


@dataclass
class Books:
    """The child's deps: what its run records, and a ledger the worker holds (built by its deps_factory)."""

    tenant: str
    ledger: dict[str, int]


LEDGER = {"acme": 120, "globex": 7}


async def test_a_child_run_gets_deps_derived_from_its_parents_and_the_tool_can_be_added_later(
        client: Client) -> None:
    suffix = os.urandom(3).hex()
    # The parent is declared first, as pydantic-ai's delegation examples declare it; its sub-agent after.
    parent_agent = Agent(scripted_model(RunCode(f"await ask_books{suffix}(prompt='balance?')"),
                                        lambda m: f"the books say {last_result(m)['result']}"),
                         name=f"front{suffix}", deps_type=Tenant)
    # Its model calls its tool directly (code mode off), so the same script serves it under agent.run() too.
    child_agent = Agent(scripted_model(CallTool("balance"), lambda m: str(last_result(m))),
                        name=f"books{suffix}", deps_type=Books)

    @child_agent.tool
    def balance(ctx: RunContext[Books]) -> int:
        """The tenant's balance."""
        return ctx.deps.ledger[ctx.deps.tenant]

    child = CodeModeAgent(child_agent, code_mode=False,
                          deps_factory=lambda run: Books(tenant=run["tenant"], ledger=LEDGER))
    seen: list[str | None] = []

    def derive(ctx: RunContext[Tenant]) -> dict[str, str]:
        seen.append(ctx.tool_call_id)
        return {"tenant": ctx.deps.tenant}

    parent = CodeModeAgent(parent_agent)
    add_child_run_tool(parent, child, deps=derive)
    tq = new_task_queue()
    async with running_worker(client, [parent, child], task_queue=tq):
        handle = await start_run(client, parent, "go", task_queue=tq, deps=Tenant("acme"))
        result = await handle.result()
    assert result.output == "the books say 120"
    assert seen == ["call_0.0"]  # derived once, in the call's own context
    child_handle = client.get_workflow_handle(child_run_id(handle.id, "call_0.0"))
    started = (await child_handle.fetch_history()).events[0].workflow_execution_started_event_attributes
    assert json.loads(started.input.payloads[0].data)["deps"] == {"tenant": "acme"}  # what the child records
    await replay(handle)
    await replay(child_handle)
    # The same tool under agent.run(): pydantic-ai's delegation, with the deps derived the same way.
    plain_parent = Agent(scripted_model(CallTool(f"ask_books{suffix}", {"prompt": "balance?"}),
                                        lambda m: f"the books say {last_result(m)}"), name="plain", deps_type=Tenant)
    add_child_run_tool(plain_parent, child, deps=derive)
    assert (await plain_parent.run("go", deps=Tenant("globex"))).output == "the books say 7"


def _counted(counter: list[str], who: str, step: Any) -> Any:
    def respond(messages: Any) -> Any:
        counter.append(who)
        return step(messages) if callable(step) else step

    return respond


@pytest.mark.parametrize(("request_limit", "completes"), [(6, False), (20, True)])
async def test_child_runs_started_together_share_what_the_parents_usage_limits_leave(
        client: Client, request_limit: int, completes: bool) -> None:
    suffix = os.urandom(3).hex()
    made: list[str] = []
    child = CodeModeAgent(Agent(scripted_model(_counted(made, "child", RunCode("1 + 1")),
                                               _counted(made, "child", "two")), name=f"leaf{suffix}"))
    gather = (f"import asyncio\nasync def one(i):\n    try:\n        return await ask_leaf{suffix}(prompt=str(i))\n"
              "    except Exception as e:\n        return str(e)\nawait asyncio.gather(*(one(i) for i in range(5)))")
    parent = CodeModeAgent(Agent(scripted_model(_counted(made, "parent", RunCode(gather)),
                                                _counted(made, "parent", lambda m: json.dumps(last_result(m)))),
                                 name=f"root{suffix}", tools=[child_run_tool(child)]))
    tq = new_task_queue()
    run_id = f"root{suffix}-run"
    async with running_worker(client, [parent, child], task_queue=tq):
        if completes:
            result = await run_agent(client, parent, "go", task_queue=tq, run_id=run_id,
                                     usage_limits=UsageLimits(request_limit=request_limit))
            assert json.loads(result.output)["result"] == ["two"] * 5
            assert result.usage.requests == len(made) == 1 + 5 * 2 + 1
        else:
            with pytest.raises(UsageLimitExceeded) as stopped:
                await run_agent(client, parent, "go", task_queue=tq, run_id=run_id,
                                usage_limits=UsageLimits(request_limit=request_limit))
            # Each child got one request of the five the parent's first left, and stopped at its second; the
            # parent counted them, and stopped before its own next one. Nothing went past the limit.
            assert made.count("child") == 5 and len(made) == request_limit
            assert "request_limit of 6" in str(stopped.value)
    await replay(client.get_workflow_handle(run_id))
    for i in range(5):
        await replay(client.get_workflow_handle(child_run_id(run_id, f"call_0.{i}")))
