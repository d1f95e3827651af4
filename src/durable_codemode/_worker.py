"""Connecting to Temporal and serving agents: the data converter, the workflow sandbox, the worker.

Every client and worker of durable-codemode must use the same data converter (pydantic's), or the run's input
and result cannot be decoded; `connect()` and `create_worker()` set it, and so does `CodeModePlugin` for
people who build their own `Client`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from ._activities import CodeModeActivities
from ._agent import CodeModeAgent
from ._errors import CodeModeUserError
from ._pool import PoolSettings, configure_pool
from ._sandbox import close_repls
from ._workflow import CodeModeRunWorkflow

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "CodeModePlugin",
    "connect",
    "create_worker",
    "temporal_address",
    "workflow_runner",
]

DEFAULT_TASK_QUEUE = "durable-codemode"
"""The task queue runs go to unless told otherwise (also the bundled worker's)."""

_PASSTHROUGH = (
    # Our own workflow-side code is deterministic by review (and a lint test); passing it through keeps one
    # Monty pool per worker process instead of one per workflow sandbox.
    "durable_codemode",
    # The sandbox driver: a native extension whose pool is process-wide; a lazy import inside workflow code
    # fails and the task retries forever.
    "pydantic_monty",
    # Message and tool-definition types decoded in workflow code; pure data, re-importing them per run costs
    # hundreds of milliseconds.
    "pydantic_ai",
    "pydantic_graph",
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    # pydantic_ai imports these at module import time (HTTP clients for providers, its async backend).
    "httpx",
    "httpcore",
    "anyio",
    "sniffio",
    "opentelemetry",
    "logfire_api",
    "genai_prices",
    "griffe",
)


def temporal_address() -> str:
    """`TEMPORAL_ADDRESS` from the environment, else `localhost:7233`."""
    return os.environ.get("TEMPORAL_ADDRESS", "localhost:7233")


def workflow_runner() -> SandboxedWorkflowRunner:
    """Temporal's workflow sandbox, with the modules the run's workflow code needs passed through."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*_PASSTHROUGH)
    )


class CodeModePlugin(SimplePlugin):
    """Sets the data converter on a `Client` (and the sandbox on a `Worker`) for durable-codemode runs.

    Example:
        ```python
        client = await Client.connect("localhost:7233", plugins=[CodeModePlugin()])
        ```

    """

    def __init__(self) -> None:
        super().__init__("durable-codemode", data_converter=pydantic_data_converter,
                         workflow_runner=workflow_runner())


async def connect(address: str | None = None, *, namespace: str | None = None, **kwargs: Any) -> Client:
    """A client for durable-codemode runs.

    Args:
        address: `host:port`; defaults to `TEMPORAL_ADDRESS`, else `localhost:7233`.
        namespace: defaults to `TEMPORAL_NAMESPACE`, else `default`.
        kwargs: passed to `Client.connect` (e.g. `tls`, `api_key`).

    Raises:
        CodeModeUserError: the server cannot be reached; the message names the address and how to start one.

    """
    target = address or temporal_address()
    try:
        return await Client.connect(
            target,
            namespace=namespace or os.environ.get("TEMPORAL_NAMESPACE", "default"),
            data_converter=pydantic_data_converter,
            **kwargs,
        )
    except (RuntimeError, ValueError) as e:  # unreachable / refused, or a malformed address
        raise CodeModeUserError(
            f"cannot reach a Temporal server at {target} ({e}). Start one with `codemode dev` (embedded dev "
            "server and worker), or set TEMPORAL_ADDRESS to your server's host:port."
        ) from e


def create_worker(
    client: Client,
    agents: Sequence[CodeModeAgent],
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    pool: PoolSettings | None = None,
    **worker_options: Any,
) -> Worker:
    """A worker serving `agents`: the run workflow and its activities, with the Monty pool sized by `pool`.

    Args:
        client: from `connect()` (or a client built with `CodeModePlugin`).
        agents: the agents runs on `task_queue` may name.
        task_queue: where runs for these agents are sent.
        pool: Monty pool sizing for this process (first configuration wins once the pool is running).
        worker_options: passed to `temporalio.worker.Worker` (e.g. `max_cached_workflows`).

    Raises:
        CodeModeUserError: no agents, or two with one name.

    """
    if not agents:
        raise CodeModeUserError("create_worker needs at least one CodeModeAgent to serve")
    if client.data_converter.payload_converter_class is not pydantic_data_converter.payload_converter_class:
        raise CodeModeUserError(
            "the client does not use the pydantic data converter; create it with durable_codemode.connect() "
            "or Client.connect(..., plugins=[CodeModePlugin()])"
        )
    configure_pool(pool or PoolSettings())
    activities = CodeModeActivities(agents)
    worker_options.setdefault("sticky_queue_schedule_to_start_timeout", timedelta(seconds=3))

    @asynccontextmanager
    async def release_sandboxes_on_shutdown() -> AsyncIterator[None]:
        try:
            yield
        finally:
            close_repls(task_queue)

    plugins = [*worker_options.pop("plugins", []),
               SimplePlugin("durable-codemode-sandbox-release", run_context=release_sandboxes_on_shutdown)]
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[CodeModeRunWorkflow],
        activities=activities.all(),
        workflow_runner=workflow_runner(),
        plugins=plugins,
        **worker_options,
    )
