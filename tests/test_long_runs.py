"""Long runs: the REPL survives continue-as-new when sealed with the worker's key, and is refused otherwise."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from temporalio.client import Client

from durable_codemode import RunResult, SnippetLimits, start_run
from durable_codemode._converter import DATA_CONVERTER
from durable_codemode.shared._types import RunInput
from durable_codemode.testing import RunCode, fetch_chain_histories, new_task_queue, replay, running_worker
from durable_codemode.worker._seal import monty_version, seal

from ._agents import items_agent

KEY = b"test-key-" + os.urandom(8).hex().encode()


def user_notes(messages: Any) -> list[str]:
    return [p.content for p in messages[-1].parts if getattr(p, "part_kind", "") == "user-prompt"]


def answer_with_notes(messages: Any) -> str:
    """The final answer: what the last snippet returned and every note the runtime added for the model."""
    notes = [p.content for m in messages[1:] for p in getattr(m, "parts", [])
             if getattr(p, "part_kind", "") == "user-prompt"]
    return repr({"last": [p.content for p in messages[-1].parts if getattr(p, "part_kind", "") == "tool-return"],
                 "notes": notes})


async def test_variables_survive_several_continue_as_new_boundaries(client: Client) -> None:
    steps = [RunCode("x = 1\ndef double(v):\n    return 2 * v\nseen = [await get(i=1)]")]
    steps += [RunCode(f"x += 1\nseen.append(await get(i={i}))") for i in range(2, 8)]
    steps += [RunCode("{'x': x, 'seen': seen, 'double': double(x)}"), answer_with_notes]
    name = f"long{os.urandom(3).hex()}"
    agent = items_agent(name, *steps, limits=SnippetLimits(max_snippets_per_run=2))
    task_queue = new_task_queue()
    async with running_worker(client, [agent], task_queue=task_queue, repl_key=KEY):
        handle = await start_run(client, name, "go", task_queue=task_queue)
        result: RunResult = await handle.result()
    await replay(handle)
    assert result.continued_as_new == 4  # 8 snippets, 2 per run
    reply = eval(result.output)
    assert reply["last"][0]["result"] == {"x": 7, "seen": [10, 20, 30, 40, 50, 60, 70], "double": 14}
    assert reply["notes"] == []  # nothing was lost, so nothing to tell the model
    assert all(s.outcome == "ok" for t in result.turns for s in t.snippets)


async def _first_continuation(client: Client, name: str, task_queue: str) -> RunInput:
    """Run `x = 41` then hit the snippet cap; return the input the next run was started with."""
    handle = await start_run(client, name, "go", task_queue=task_queue)
    await handle.result()
    first = (await fetch_chain_histories(handle))[0]
    payloads = first.events[-1].workflow_execution_continued_as_new_event_attributes.input.payloads
    (run_input,) = DATA_CONVERTER.payload_converter.from_payloads(list(payloads), [RunInput])
    assert isinstance(run_input, RunInput) and run_input.continuation and run_input.continuation.repl
    return run_input


async def _resume(client: Client, task_queue: str, run_input: RunInput) -> RunResult:
    """Start a workflow from a (tampered) continue-as-new input, as anyone with a client could."""
    from durable_codemode import CodeModeRunWorkflow

    handle = await client.start_workflow(CodeModeRunWorkflow.run, run_input, id=f"forged-{os.urandom(4).hex()}",
                                         task_queue=task_queue)
    result = await handle.result()
    await replay(handle)
    return result


async def test_a_dump_with_a_bad_seal_or_another_monty_version_is_refused(client: Client) -> None:
    steps = [RunCode("x = 41"), RunCode("x"), RunCode("x + 1"), answer_with_notes]
    name = f"forge{os.urandom(3).hex()}"
    agent = items_agent(name, *steps, limits=SnippetLimits(max_snippets_per_run=2))
    task_queue = new_task_queue()
    async with running_worker(client, [agent], task_queue=task_queue, repl_key=KEY):
        honest = await _first_continuation(client, name, task_queue)
        carried = honest.continuation.repl  # type: ignore[union-attr]
        assert carried is not None

        def forged(**changes: Any) -> RunInput:
            assert honest.continuation is not None
            cont = dataclasses.replace(honest.continuation, repl=dataclasses.replace(carried, **changes))
            return dataclasses.replace(honest, continuation=cont)

        as_is = eval((await _resume(client, task_queue, forged())).output)
        bad_seal = eval((await _resume(client, task_queue, forged(seal="0" * 64))).output)
        old = "0.0.1"
        other_version = eval((await _resume(client, task_queue, forged(
            monty_version=old, seal=seal(KEY, carried.digest, old)))).output)

    assert as_is["last"][0]["result"] == 42 and as_is["notes"] == []  # the honest dump loads
    for refused, why in ((bad_seal, "its seal does not check out"),
                         (other_version, f"written by pydantic-monty {old}; this worker runs {monty_version()}")):
        assert "`x` used when not defined" in str(refused["last"][0])  # the REPL started fresh
        assert why in refused["notes"][0] and "REPL was restarted" in refused["notes"][0]


async def test_without_a_key_or_over_the_size_limit_the_repl_restarts_with_a_note(client: Client) -> None:
    for options, limits, why in (
        ({}, SnippetLimits(max_snippets_per_run=1), "set CODEMODE_REPL_KEY"),
        ({"repl_key": KEY}, SnippetLimits(max_snippets_per_run=1, max_carried_repl_bytes=16),
         "over SnippetLimits.max_carried_repl_bytes (16)"),
    ):
        name = f"nokey{os.urandom(3).hex()}"
        agent = items_agent(name, RunCode("x = 1"), lambda m: RunCode(repr(user_notes(m))), answer_with_notes,
                            limits=limits)
        task_queue = new_task_queue()
        async with running_worker(client, [agent], task_queue=task_queue, **options):
            handle = await start_run(client, name, "go", task_queue=task_queue)
            result = await handle.result()
        await replay(handle)
        notes = eval(result.output)["last"][0]["result"]
        assert len(notes) == 1 and why in notes[0] and "REPL was restarted" in notes[0]


def test_long_run_summaries_drop_the_oldest_call_records_to_fit() -> None:
    from datetime import UTC, datetime

    from durable_codemode import CallRecord, SnippetRecord, TurnRecord
    from durable_codemode.shared._records import bound_turns

    now = datetime.now(UTC)

    def snippet(k: int, calls: int) -> SnippetRecord:
        return SnippetRecord(call_id=f"call_{k}", code="...", outcome="ok", result="{}", calls=[
            CallRecord(call_id=f"call_{k}.{n}", tool="store", args="x" * 200, status="ok", result="y" * 200,
                       started_at=now, finished_at=now) for n in range(calls)])

    turns = [TurnRecord(index=k, text="", snippets=[snippet(k, 500)]) for k in range(25)]
    bound_turns(turns)
    kept = [len(t.snippets[0].calls) for t in turns]
    assert kept[-1] == 500 and kept[0] == 0  # the newest detail stays, the oldest goes first
    assert all(t.snippets[0].omitted_calls + len(t.snippets[0].calls) == 500 for t in turns)  # counted, not lost
    size = len(DATA_CONVERTER.payload_converter.to_payloads([turns])[0].data)
    assert size < 1024 * 1024  # comfortably under Temporal's 2 MiB payload limit (25 x 500 calls were ~7 MB)


async def test_model_requests_do_not_carry_the_nested_call_log(client: Client) -> None:
    from temporalio.api.enums.v1 import EventType

    code = "import asyncio\nvalues = await asyncio.gather(*(get(i=i) for i in range({n})))\nsum(values)"
    sizes = {}
    for n in (10, 300):
        name = f"size{os.urandom(3).hex()}"
        agent = items_agent(name, RunCode(code.format(n=n)), lambda m: "done",
                            limits=SnippetLimits(max_tool_calls=500))
        task_queue = new_task_queue()
        async with running_worker(client, [agent], task_queue=task_queue):
            handle = await start_run(client, name, "go", task_queue=task_queue)
            await handle.result()
        await replay(handle)
        history = await handle.fetch_history()
        model_inputs = [e.activity_task_scheduled_event_attributes for e in history.events
                        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                        and e.activity_task_scheduled_event_attributes.activity_type.name.endswith("model_request")]
        sizes[n] = model_inputs[-1].input.ByteSize()
    # The second model turn sees the conversation (prompt, program, its small result), not 300 call records.
    assert sizes[300] - sizes[10] < 200, sizes
