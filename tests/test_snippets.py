"""What a snippet can do and what it gets back: errors, REPL state, clock, sleep, env, limits."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from durable_codemode import RunResult, SnippetLimits, start_run
from durable_codemode.testing import RunCode, child_processes, last_result, new_task_queue, replay, running_worker

from ._agents import Effects, items_agent
from ._runs import run_to_end


async def run(client: Client, *steps: Any, effects: Effects | None = None,
              **agent_options: Any) -> tuple[RunResult, WorkflowHandle[Any, RunResult]]:
    return await run_to_end(client, items_agent(f"agent{os.urandom(3).hex()}", *steps, effects=effects,
                                                **agent_options))


def echo(messages: Any) -> str:
    """A final answer that shows the test what the last run_code returned."""
    return repr(last_result(messages))


async def test_tool_error_is_catchable_with_its_type(client: Client) -> None:
    code = """
out = []
for kind in ["value", "permission", "custom"]:
    try:
        await fail(kind=kind)
    except ValueError as e:
        out.append(f"ValueError:{e}")
    except PermissionError as e:
        out.append(f"PermissionError:{e}")
    except RuntimeError as e:
        out.append(f"RuntimeError:{e}")
try:
    await get(i=-1)
except KeyError as e:
    out.append(f"KeyError:{e}")
out
"""
    result, _ = await run(client, RunCode(code), echo)
    assert eval(result.output)["result"] == [
        "ValueError:bad value", "PermissionError:nope", "RuntimeError:_CustomError: custom trouble",
        "KeyError:'no item -1'",  # str() of a KeyError quotes its message, as in CPython
    ]
    assert [c.status for c in result.nested_calls] == ["error"] * 4


async def test_uncaught_tool_error_reaches_the_model(client: Client) -> None:
    result, _ = await run(client, RunCode("x = await get(i=2)\nprint('before', x)\nawait fail(kind='value')"), echo)
    seen = eval(result.output)
    assert seen["error"] == "ValueError: bad value"
    assert "line 3" in seen["traceback"]
    assert seen["printed"] == "before 20\n"


async def test_repl_state_persists_and_restart_clears_it(client: Client) -> None:
    result, _ = await run(
        client,
        RunCode("import math\ndef double(x):\n    return 2 * x\nbase = await get(i=4)"),
        RunCode("double(base) + math.floor(1.5)"),
        RunCode("base", restart=True),
        echo,
    )
    snippets = [s for t in result.turns for s in t.snippets]
    assert [s.outcome for s in snippets] == ["ok", "ok", "rejected"]  # `base` is unknown after restart
    assert snippets[1].result == '{"result": 81}'
    assert "base" in result.output


async def test_empty_result_and_printed_text(client: Client) -> None:
    result, _ = await run(client, RunCode("x = 1"), RunCode("print('hello')"), echo)
    snippets = [s for t in result.turns for s in t.snippets]
    assert snippets[0].result == "{}"
    assert eval(result.output) == {"printed": "hello\n"}


async def test_output_is_bounded_with_a_note(client: Client) -> None:
    limits = SnippetLimits(max_output_bytes=2000)
    result, _ = await run(client, RunCode("'x' * 50000"), echo, limits=limits)
    seen = eval(result.output)
    assert "result" not in seen
    assert len(seen["result_truncated"]) < 2000
    assert "2,000-byte limit" in seen["note"]


async def test_clock_is_workflow_time_and_sleep_is_a_durable_timer(client: Client) -> None:
    code = """
import datetime, time, asyncio
t0 = time.time()
time.sleep(1)
await asyncio.sleep(0.5)
t1 = time.time()
[datetime.datetime.now().isoformat(), t0, t1, datetime.date.today().isoformat()]
"""
    result, handle = await run(client, RunCode(code), echo)
    now_iso, t0, t1, today = eval(result.output)["result"]
    history = await handle.fetch_history()
    task_times = {e.event_time.ToDatetime(tzinfo=UTC).timestamp()
                  for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED}
    # The clock is the workflow's: the start time of the workflow task that read it.
    assert min(abs(t0 - t) for t in task_times) < 1e-5 and min(abs(t1 - t) for t in task_times) < 1e-5
    assert t1 - t0 >= 1.5
    assert abs(datetime.fromisoformat(now_iso).replace(tzinfo=UTC).timestamp() - t1) < 1e-5
    assert today == datetime.fromtimestamp(t1, UTC).date().isoformat()
    timers = [e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
              for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert timers == [1.0, 0.5]


async def test_env_allowlist_files_refused_random_seeded(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEMODE_TEST_REGION", "eu-west")
    monkeypatch.setenv("CODEMODE_TEST_SECRET", "hunter2")
    code = """
import os, random
from pathlib import Path
try:
    Path('/etc/passwd').read_text()
    files = 'read'
except PermissionError as e:
    files = str(e)
[os.getenv('CODEMODE_TEST_REGION'), os.getenv('CODEMODE_TEST_SECRET'), os.getenv('HOME', 'unset'), files,
 random.random()]
"""
    result, _ = await run(client, RunCode(code), echo, env_allowlist=("CODEMODE_TEST_REGION",))
    region, secret, home, files, _rnd = eval(result.output)["result"]
    assert (region, secret, home) == ("eu-west", None, "unset")
    assert "no file system" in files


async def test_syntax_error_goes_back_to_the_model_which_retries(client: Client) -> None:
    effects = Effects()
    result, _ = await run(client, RunCode("for i in range(3) print(i)"),
                          lambda m: RunCode(f"# retry after: {str(last_result(m))[:40]!r}\nawait get(i=1)"),
                          echo, effects=effects)
    first, second = [s for t in result.turns for s in t.snippets]
    assert (first.outcome == "rejected" and "SyntaxError" in first.result) or "syntax" in first.result
    assert second.outcome == "ok"
    assert eval(result.output) == {"result": 10}
    assert effects.calls == [("get", 1)]


async def test_undeclared_name_never_reaches_the_host(client: Client) -> None:
    effects = Effects()
    result, handle = await run(client, RunCode("await delete_everything(confirm=True)"), echo, effects=effects)
    assert "delete_everything" in result.output and "not defined" in result.output
    assert effects.calls == []
    history = await handle.fetch_history()
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert scheduled == ["durable-codemode.model_request"] * 2  # no tool activity at all


async def test_gather_schedules_all_calls_in_one_workflow_task(client: Client) -> None:
    code = "import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range(200)))\nsum(r)"
    result, handle = await run(client, RunCode(code), echo)
    assert eval(result.output) == {"result": sum(i * 10 for i in range(200))}
    history = await handle.fetch_history()
    kinds = [e.event_type for e in history.events]
    scheduled = [i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert len(scheduled) == 200 + 2  # + two model turns
    tool_block = scheduled[1:-1]
    assert tool_block == list(range(tool_block[0], tool_block[0] + 200))  # one contiguous batch of commands
    ids = [history.events[i].activity_task_scheduled_event_attributes.activity_id for i in tool_block]
    assert [i.split("-")[0] for i in ids] == [f"call_0.{n}" for n in range(200)]


async def test_tool_call_limit(client: Client) -> None:
    code = """
done = 0
for i in range(5):
    try:
        await get(i=i)
        done += 1
    except RuntimeError as e:
        err = str(e)
[done, err]
"""
    result, _ = await run(client, RunCode(code), echo, limits=SnippetLimits(max_tool_calls=3))
    done, err = eval(result.output)["result"]
    assert done == 3 and "tool call limit" in err


async def test_snippet_cap_continues_as_new_and_tells_the_model(client: Client) -> None:
    def notes(messages: Any) -> RunCode:
        seen = [p.content for p in messages[-1].parts if getattr(p, "part_kind", "") == "user-prompt"]
        return RunCode(repr(seen))

    result, _ = await run(client, RunCode("a = 1"), RunCode("a + 1"), notes, RunCode("a"), echo,
                          limits=SnippetLimits(max_snippets_per_run=2))
    assert result.continued_as_new == 2  # after snippets 2 and 4, each at the next model turn
    snippets = [s for t in result.turns for s in t.snippets]
    assert [s.outcome for s in snippets] == ["ok", "ok", "ok", "rejected"]  # `a` is gone in the new run
    assert "REPL was restarted" in snippets[2].result
    assert "`a` used when not defined" in result.output


async def test_calls_cut_short_by_an_exception_are_recorded_as_cancelled(client: Client) -> None:
    code = "import asyncio\nawait asyncio.gather(slow(seconds=3), fail(kind='value'), get(i=1))"
    result, _ = await run(client, RunCode(code), echo)
    assert eval(result.output)["error"] == "ValueError: bad value"
    calls = result.nested_calls
    assert [c.call_id for c in calls] == ["call_0.0", "call_0.1", "call_0.2"]  # in call order
    assert [c.tool for c in calls] == ["slow", "fail", "get"]
    assert calls[0].status == "cancelled" and "may still have run" in calls[0].result
    assert calls[1].status == "error"


def _kill_sandbox_processes() -> int:
    """SIGKILL this process's `monty` sandbox workers (what an OOM killer or a segfault would do)."""
    import signal

    pids = child_processes()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return len(pids)


CRASH_THEN_COMPUTE = "await crash()\nfor i in range(1_000_000):\n    x = x + i\n'unreachable'"
"""A program that computes after `crash()`, while `_kill_sandbox_processes_when_the_program_runs` strikes."""


def _kill_sandbox_processes_when_the_program_runs() -> int:
    """From a thread: kill this process's sandbox processes as soon as a session is checked out again.

    A program waiting on a tool holds no sandbox process (it is a dump meanwhile), so a tool cannot kill the one
    running it; this kills the one the program is loaded into next, while it computes (`CRASH_THEN_COMPUTE`).
    """
    import threading
    import time

    from durable_codemode.worker._pool import POOL

    def kill_when_held() -> None:
        deadline = time.monotonic() + 10
        while POOL.live_sessions() == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        _kill_sandbox_processes()

    threading.Thread(target=kill_when_held, daemon=True).start()
    return 0


async def test_a_sandbox_killed_mid_program_goes_on_in_the_compute_activity(client: Client) -> None:
    from pydantic_ai import Agent

    from durable_codemode import CodeModeAgent
    from durable_codemode.testing import scripted_model

    agent = Agent(scripted_model(RunCode("x = 1\n" + CRASH_THEN_COMPUTE), RunCode("[x, 2 + 2]"), echo),
                  name="crashy")

    @agent.tool_plain
    def crash() -> int:
        """Kill the sandbox process running the program, once the program runs again."""
        return _kill_sandbox_processes_when_the_program_runs()

    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent)], task_queue=tq):
        handle = await start_run(client, "crashy", "go", task_queue=tq)
        result = await handle.result()
    # The process died under the program (as under an OOM killer): the workflow task recorded that this stretch
    # comes from the compute activity, which computed it again from the program's last dump. So the program
    # finished, the REPL kept its variables, and the history replays: a replay reads the outcome, not the kill.
    await replay(handle)
    first, _ = [s for t in result.turns for s in t.snippets]
    assert first.outcome == "ok" and eval(first.result) == {"result": "unreachable"}
    assert [c.tool for c in first.calls] == ["crash"]  # the call ran once; the compute activity does not re-run it
    assert eval(result.output)["result"] == [1 + sum(range(1_000_000)), 4]
    assert result.continued_as_new == 0
    history = await handle.fetch_history()
    assert [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED].count("durable-codemode.compute") == 1


async def test_memory_and_recursion_limits_are_clear_errors(client: Client) -> None:
    limits = SnippetLimits(max_memory_bytes=16 * 1024 * 1024, max_recursion_depth=50)
    result, _ = await run(
        client,
        RunCode("x = 'a' * (64 * 1024 * 1024)\nlen(x)"),
        lambda m: RunCode(f"first = {last_result(m)['error']!r}\ndef f(n):\n    return f(n + 1)\nf(0)"),
        echo, limits=limits,
    )
    snippets = [s for t in result.turns for s in t.snippets]
    assert [s.outcome for s in snippets] == ["error", "error"]
    assert "MemoryError" in snippets[0].result
    assert "RecursionError" in eval(result.output)["error"]


async def test_tool_metadata_keeps_a_tool_native(client: Client) -> None:
    from pydantic_ai import Agent

    from durable_codemode import CodeModeAgent
    from durable_codemode.testing import CallTool, scripted_model

    agent = Agent(scripted_model([CallTool("ping", {}), RunCode("await pong()")],
                                 lambda m: repr([last_result(m, 0), last_result(m, 1)])), name="meta")

    @agent.tool_plain(metadata={"codemode": {"in_sandbox": False}})
    def ping() -> str:
        """Native: the model calls it directly."""
        return "ping!"

    @agent.tool_plain
    def pong() -> str:
        """In the sandbox."""
        return "pong!"

    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent)], task_queue=tq):
        handle = await start_run(client, "meta", "go", task_queue=tq)
        result = await handle.result()
    await replay(handle)
    assert eval(result.output) == ["ping!", {"result": "pong!"}]
    assert [c.tool for c in result.direct_calls] == ["ping"]
    assert [c.tool for c in result.nested_calls] == ["pong"]


async def test_a_run_keeps_its_process_while_the_model_thinks_only_within_the_hold_budget(client: Client) -> None:
    from durable_codemode.worker import _pool

    seen: list[tuple[int, int]] = []

    def second_turn(messages: Any) -> RunCode:
        # The model activity runs in this process while the run waits for it.
        seen.append((_pool.POOL.live_sessions(), _pool.POOL.held_sessions()))
        return RunCode("x + 1")  # the REPL's state survives, kept or released

    # A place of the hold budget is free: the run keeps its session, and the next snippet is fed to it.
    result, _ = await run(client, RunCode("x = await get(i=4)"), second_turn, echo)
    assert seen == [(1, 1)]
    assert eval(result.output) == {"result": 41}
    assert (_pool.POOL.live_sessions(), _pool.POOL.held_sessions()) == (0, 0)  # given back when the run ended

    # Every place taken (by other runs' waits): the REPL waits as a dump, and no process is held.
    budget = 0
    while _pool.POOL.try_hold():
        budget += 1
    try:
        seen.clear()
        result, _ = await run(client, RunCode("x = await get(i=4)"), second_turn, echo)
    finally:
        for _ in range(budget):
            _pool.POOL.release_hold()
    assert budget > 0 and seen == [(0, budget)]
    assert eval(result.output) == {"result": 41}


async def test_later_snippets_may_rebind_earlier_variables(client: Client) -> None:
    # Monty's checker types `x = 1` as Literal[1] for later snippets; rebinding is ordinary REPL use.
    steps = [RunCode("x = 1\nname = 'a'"), RunCode("nope = await get(i=missing)"), RunCode("x += 1\nname = 3\ny = 5"),
             RunCode("x = x + y\n[x, name]"), echo]
    result, _ = await run(client, *steps)
    snippets = [s for t in result.turns for s in t.snippets]
    assert [s.outcome for s in snippets] == ["ok", "rejected", "ok", "ok"]
    assert "`missing` used when not defined" in snippets[1].result  # unknown names are still caught up front
    assert eval(result.output)["result"] == [7, 3]


async def test_a_call_that_finishes_while_the_program_awaits_another(client: Client) -> None:
    # `get` is started first and finishes while the program waits on `slow` alone: the program wakes for what it
    # awaits, still gets the earlier call's result when it awaits it, and the run replays.
    code = "early = get(i=1)\nlate = await slow(seconds=0.5)\n[await early, late]"
    result, _ = await run(client, RunCode(code), echo)
    assert eval(result.output)["result"] == [10, "slow done"]
    assert [(c.tool, c.status) for c in result.nested_calls] == [("get", "ok"), ("slow", "ok")]
