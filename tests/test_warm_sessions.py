"""A snippet that starts a fresh REPL takes a sandbox session warmed while its model request was in flight.

A session's first type check costs ~15 ms (the checker loads the builtins' stubs); the run draws the snippet's
seed before the request (`Repl.reserve_session`), so the pool can check a session out with it
and warm its checker meanwhile (`_pool.SandboxPool.prewarm_session`). A warm session must behave exactly as a
cold one: the replay, which warms none, checks that, down to the seeded `random` values the program passes to its tools.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from temporalio.client import Client

from durable_codemode.testing import RunCode, last_result
from durable_codemode.worker import _pool

from ._agents import Effects, items_agent
from ._runs import run_to_end

SEEDED = """
import random
picks = [random.randint(0, 1_000_000) for _ in range(3)]
values = [await get(i=p % 97) for p in picks]
[picks, values]
"""


def _warming_threads_done() -> None:
    """Wait for the pool's warming threads: a dropped session that was still warming is closed by its thread."""
    for thread in threading.enumerate():
        if thread.name == _pool.WARMING_THREAD:
            thread.join(timeout=10)


async def _run(client: Client, *steps: Any, effects: Effects | None = None) -> Any:
    # The replay takes cold sessions, with the same seeds: a warm session that differed would diverge there.
    result, _ = await run_to_end(client, items_agent(f"agent{os.urandom(3).hex()}", *steps, effects=effects))
    return result


async def test_a_fresh_snippet_runs_in_the_session_warmed_during_its_model_request(client: Client) -> None:
    warming_at_request: list[int] = []

    def first_turn(messages: Any) -> RunCode:
        # The model activity runs in this process, while the workflow task that asked for it has ended.
        warming_at_request.append(_pool.POOL.warm_sessions()[0])
        # A session still waiting for its process when the snippet checks out is not waited for (the snippet takes
        # a cold one): on a cold machine the pool's first process can take longer than this request. Wait for it.
        _warming_threads_done()
        return RunCode(SEEDED)

    _, claimed_before = _pool.POOL.warm_sessions()
    effects = Effects()
    result = await _run(client, first_turn, lambda m: repr(last_result(m)), effects=effects)
    picks, values = eval(result.output)["result"]
    assert warming_at_request == [1]
    assert _pool.POOL.warm_sessions() == (0, claimed_before + 1)
    # The program's seeded draws reached the tools, and the replay (cold sessions) drew the same ones.
    assert [arg for tool, arg in effects.calls] == [p % 97 for p in picks]
    assert values == [(p % 97) * 10 for p in picks]


async def test_a_later_snippet_loads_its_repl_and_warms_nothing(client: Client) -> None:
    warming: list[int] = []

    def turn(code: str) -> Any:
        def respond(messages: Any) -> RunCode:
            warming.append(_pool.POOL.warm_sessions()[0])
            return RunCode(code)
        return respond

    result = await _run(client, turn("x = await get(i=2)"), turn("x + 1"), lambda m: repr(last_result(m)))
    assert eval(result.output)["result"] == 21  # the second snippet loaded the REPL the first left
    assert warming == [1, 0]  # the second request's snippet would load a dump: no session is warmed for it


async def test_a_session_warmed_for_a_snippet_that_never_comes_is_given_back(client: Client) -> None:
    _, claimed_before = _pool.POOL.warm_sessions()
    result = await _run(client, "no code needed")
    assert result.output == "no code needed"
    _warming_threads_done()
    assert _pool.POOL.warm_sessions() == (0, claimed_before)
    assert _pool.POOL.held_sessions() == 0  # the hold place the warm session took is free again


async def test_the_sessions_a_run_gives_back_all_end(client: Client) -> None:
    # Sessions are ended off the workflow thread (`_pool.SandboxPool.session`); none may be left hanging, or the pool
    # would never shut down when idle (`close_if_idle` waits for them).
    result = await _run(client, RunCode("x = await get(i=3)"), RunCode("x * 2"), lambda m: repr(last_result(m)))
    assert eval(result.output)["result"] == 60
    assert _pool.POOL.wait_given_back(timeout=10)
    assert _pool.POOL.live_sessions() == 0
