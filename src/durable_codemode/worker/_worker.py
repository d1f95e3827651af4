"""Serving agents: the data converter, the workflow runner, the worker (connecting is `_connect`).

Every client and worker of durable-codemode must use the same data converter (pydantic's), or the run's input
and result cannot be decoded; `connect()` and `create_worker()` set it, and so does `CodeModePlugin` for
people who build their own `Client`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig, WorkflowRunner

from .._converter import DATA_CONVERTER, is_compatible, warm_up
from .._deployments import current_version, parse_version, version_label
from .._encryption import Encryption, EncryptionKeys, resolve_encryption
from .._otel import client_interceptors, has_tracing_interceptor
from .._storage import with_encryption
from ..shared._errors import CodeModeUserError
from ..shared._names import DEFAULT_TASK_QUEUE
from ..shared._signing import ApproverKeyring
from ..workflow._approval_state import serve, serve_keyring
from ..workflow._run import CodeModeRunWorkflow, PinnedCodeModeRunWorkflow
from ..workflow._sandbox import close_repls
from ._activities import CodeModeActivities
from ._agent import CodeModeAgent
from ._approvers import ApprovalAuthority, ApproverDirectory, DirectorySource
from ._mcp import McpServers
from ._pool import POOL, PoolSettings, check_sandbox_binary
from ._seal import repl_key_from_env
from ._span_exports import WorkerSpans
from ._span_settling import SpanRecordingRunner, settle_all, settle_spans
from ._task_timing import TaskTimingRunner
from ._tracing import worker_interceptors
from ._waiting_runs import start_check

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.messages import AgentStreamEvent, ModelResponse

    from ..shared._activity_io import ModelRequestInput, ToolCallInput
    from ..shared._approvals import ApprovalDecision, BatchDecision
    from ..shared._carry import SealRequest, SealResult
    from ..shared._conversation import ConversationRange
    from ..shared._records import RunResult
    from ..shared._types import AgentSpec, RunInput

__all__ = [
    "DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT",
    "DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS",
    "CodeModePlugin",
    "create_worker",
    "workflow_runner",
]

logger = logging.getLogger(__name__)


DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS = 4
"""Workflow tasks a worker runs at once, unless `max_concurrent_workflow_tasks` (or a `tuner`) is given.

Workflow activations are Python under one GIL, and each must yield within Temporal's 2 s deadlock limit
(TMPRL1101). Temporal's default (100 at once, on 500 threads) splits the CPU between all of them: a fresh worker
that takes over 30 runs from a killed one replays all 30 at once, each replay got a thirtieth of the CPU and
passed 2 s, every task failed and was retried the same way, and the runs never finished (`tests/test_chaos.py`).
With 4, the other tasks wait on the server's queue instead and each replay finishes in its own time.

Sized again for a fleet of runs waiting for people (`bench/paused_fleet.py`, 1,000 runs started and paused on 2
CPUs): queries and decisions take a slot too, yet more slots did not answer them sooner. At load 3-4, 2, 4 and 8
slots paused all in 55-61 s, and a query's p50 was 70, 125 and 184 ms (max 3.3, 0.7, 2.2 s). At load 8-12 (other
work on the machine), 8 slots took 88 s and 4 took 105 s, a gap within what the load itself varied, with as many
queries past their timeout (185 and 220 of thousands). So 4 stays. A query that waits past its timeout now says
the worker was busy (`WorkerBusyError`), not missing."""

DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT = timedelta(seconds=30)
"""How long a stopping worker (SIGTERM, Ctrl-C, the end of `async with worker`) lets its in-flight activities finish.

Temporal's default is 0: a tool call running when its worker was told to stop was cancelled and run again by
another worker, so a routine restart repeated its effect (measured: a deposit running during a SIGTERM ran twice,
once on each worker). With 30 s, long enough for a typical tool call, the call finishes and its result is
recorded, and the worker exits. A call still running after it is cancelled and retried elsewhere, as is one lost
with a killed worker: tools with side effects must honour `current_call().idempotency_key` for those."""

_PAYLOAD_TYPES = (RunInput, RunResult, AgentSpec, ModelResponse, ToolCallInput, ModelRequestInput, SealRequest,
                  SealResult, ApprovalDecision, BatchDecision, AgentStreamEvent, ConversationRange)
"""The types a worker's workflows and activities decode, warmed before it polls (`_converter.warm_up`).

`AgentStreamEvent`: the run checks each model-stream item it is sent (`workflow._event_stream`); built cold in
that signal's workflow task, its adapter took past Temporal's 2 s deadlock limit on a loaded machine."""


def _workflow_task_slots(worker_options: dict[str, Any], pool: PoolSettings) -> int:
    """The worker's workflow task slots: `max_concurrent_workflow_tasks`, by default 4, or the pool's size if smaller.

    One slot per sandbox process is the rule of `PoolSettings`; a worker given more is refused, since under load
    its workflow tasks would fail waiting for a process. A custom `tuner` is taken as given (its slot count is
    not known here): keep its workflow slots at most `PoolSettings.max_processes`.
    """
    if "tuner" in worker_options:
        return 0
    slots = worker_options.setdefault("max_concurrent_workflow_tasks",
                                      min(DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS, pool.max_processes))
    if slots > pool.max_processes:
        raise CodeModeUserError(
            f"max_concurrent_workflow_tasks={slots} is more than the {pool.max_processes} processes of this "
            "process's Monty pool (a pool already running keeps its size): a workflow task would then wait for a "
            "sandbox process, blocking its thread, and fail under load. Pass "
            f"pool=PoolSettings(max_processes={slots}), or max_concurrent_workflow_tasks={pool.max_processes} or "
            "less (the default)"
        )
    return int(slots)


def workflow_runner() -> WorkflowRunner:
    """The runner of the run workflow: Temporal's unsandboxed runner.

    Temporal's sandbox re-imports a workflow's modules per run and intercepts non-deterministic calls, but it
    can protect nothing here: the run workflow's modules must be passed through the sandbox anyway (one Monty
    pool per process, and pydantic-ai's types), and passed-through code is neither re-imported nor intercepted.
    What the sandbox still cost was measured: ~11 sandbox crossings per nested call, so gather-200 ran 1.25x the
    floor and replayed in 350 ms sandboxed, against 0.94x and 141 ms unsandboxed. Determinism of the workflow-side
    modules is enforced instead by review and `tests/test_determinism_lint.py`. Pass `workflow_runner=` to
    `create_worker` to choose another runner.
    """
    return UnsandboxedWorkflowRunner()


class CodeModePlugin(SimplePlugin):
    """Sets the data converter on a `Client` (or a `Worker`) for durable-codemode runs.

    Args:
        tracing: also add Temporal's OpenTelemetry interceptor, so a run started inside a span is traced under it
            and workers built from this client trace their runs (see docs/observability.md).
        encryption: encrypt payloads with these keys, as `connect(encryption=...)` takes them; `None` (default):
            `CODEMODE_ENCRYPTION_KEYS`, else a codec the client already has, else none.

    Example:
        ```python
        client = await Client.connect("localhost:7233", plugins=[CodeModePlugin()])
        ```

    """

    def __init__(self, *, tracing: bool = False, encryption: Encryption = None) -> None:
        keys = resolve_encryption(encryption)
        super().__init__("durable-codemode", data_converter=lambda existing: _our_converter(existing, keys),
                         interceptors=client_interceptors() if tracing else None)


def _our_converter(existing: DataConverter | None, keys: EncryptionKeys | None) -> DataConverter:
    """Our payload converter over `existing`, then encrypting with `keys` if given.

    `existing` keeps its codec, failure converter and payload store: a client that `create_worker(encryption=...)`
    re-keyed keeps its keys when its plugins are applied again.
    """
    if existing is None or existing is DataConverter.default:
        converter = DATA_CONVERTER
    elif existing.payload_converter_class is DATA_CONVERTER.payload_converter_class:  # ours already
        converter = existing
    else:
        converter = dataclasses.replace(existing, payload_converter_class=DATA_CONVERTER.payload_converter_class)
    return converter if keys is None else with_encryption(converter, keys)


def _encrypting_client(client: Client, encryption: Encryption) -> Client:
    """`client`, or a client of the same connection whose converter encrypts with the keys `encryption` names.

    `None`: a client that has a codec keeps it; one without gets `CODEMODE_ENCRYPTION_KEYS` if that is set, so a
    worker built on a client of the user's own encrypts as every other process of ours does. `False`: as it is.
    """
    if encryption is False or (encryption is None and client.data_converter.payload_codec is not None):
        return client
    keys = resolve_encryption(encryption)
    if keys is None:
        return client
    config = client.config()
    config["data_converter"] = with_encryption(client.data_converter, keys)
    return Client(**config)


IDLE_LOOK_SECONDS = 1.0
"""How often a worker looks whether its sandbox pool went idle, while it is in use (`stop_idle_sandboxes`)."""


async def stop_idle_sandboxes(idle_seconds: float | None) -> None:
    """While a worker runs: stop the process's sandbox processes `idle_seconds` after the pool was last used.

    While the pool is in use it looks every `IDLE_LOOK_SECONDS` (a lock and a clock read); once idle, it sleeps
    until the idle time is up, so the processes exit within a second of it, not one to two periods after (as when
    it looked once a period).
    """
    if idle_seconds is None:
        return
    while True:
        idle = POOL.idle_for()
        if idle is None:
            await asyncio.sleep(min(idle_seconds, IDLE_LOOK_SECONDS))
        elif idle < idle_seconds:
            await asyncio.sleep(idle_seconds - idle)
        elif await asyncio.to_thread(POOL.close_if_idle, idle_seconds):  # stopping waits for the processes to exit
            logger.info("no sandbox session for %g s: the Monty pool's processes were stopped; the next program "
                        "starts them again", idle_seconds)
        else:
            await asyncio.sleep(min(idle_seconds, IDLE_LOOK_SECONDS))  # used again meanwhile: look again later


def _deployment(deployment: WorkerDeploymentVersion | str | None, options: dict[str, Any]
                ) -> WorkerDeploymentVersion | None:
    """The worker's deployment version, set in `options` as Temporal's `deployment_config` (pinned by default)."""
    if deployment is None:
        config = options.get("deployment_config")
        return config.version if isinstance(config, WorkerDeploymentConfig) and config.use_worker_versioning else None
    if "deployment_config" in options:
        raise CodeModeUserError("create_worker got both deployment= and deployment_config=: give one (deployment= "
                                "sets Temporal's WorkerDeploymentConfig with worker versioning on)")
    version = parse_version(deployment) if isinstance(deployment, str) else deployment
    options["deployment_config"] = WorkerDeploymentConfig(version=version, use_worker_versioning=True)
    return version


async def _tell_whether_current(client: Client, version: WorkerDeploymentVersion) -> None:
    """Log, once the worker starts, whether new runs come to its version, and how to make it current if not."""
    try:
        current = await current_version(client, version.deployment_name)
    except Exception as e:  # best effort: the worker serves its runs either way
        logger.info("could not read deployment %r's current version: %s", version.deployment_name, e)
        return
    if current == version:
        logger.info("worker deployment %s is the current version: new runs come here", version_label(version))
        return
    now = f"the current version is {version_label(current)}" if current else "no version of it is current yet"
    logger.warning(
        "this worker is version %s of worker deployment %r, and %s: new runs go %s, and this worker serves the runs "
        "pinned to its version (and runs moved to it). Once its workers poll, make it current with `temporal worker "
        "deployment set-current-version --deployment-name %s --build-id %s` (docs/operations.md)",
        version_label(version), version.deployment_name, now,
        f"to {version_label(current)}" if current else "nowhere until one is", version.deployment_name,
        version.build_id)


def create_worker(
    client: Client,
    agents: Sequence[CodeModeAgent],
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    pool: PoolSettings | None = None,
    tracing: bool | None = None,
    repl_key: bytes | str | None = None,
    approver_keys: ApproverKeyring | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    approver_directory: DirectorySource | None = None,
    unsigned_approvals: bool = False,
    graceful_shutdown_timeout: timedelta = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT,
    deployment: WorkerDeploymentVersion | str | None = None,
    encryption: Encryption = None,
    **worker_options: Any,
) -> Worker:
    """A worker serving `agents`: the run workflow and its activities, with the Monty pool sized by `pool`.

    Args:
        client: from `connect()` (or a client built with `CodeModePlugin`).
        agents: the agents runs on `task_queue` may name.
        task_queue: where runs for these agents are sent.
        pool: Monty pool sizing for this process (first configuration wins once the pool is running). The worker's
            `max_concurrent_workflow_tasks` defaults to its `max_processes`, and may not exceed it (`PoolSettings`
            says why).
        repl_key: the key that seals a run's REPL when the run continues as new, so its variables survive; every
            worker of the task queue needs the same key. Default: `CODEMODE_REPL_KEY`; with neither, REPLs are
            not carried (the model is told the REPL restarted).
        approver_keys: the approvers' public keys, which decisions must be signed with: a mapping
            `{key_id: {"approver": name, "public_key": base64}}` (what `codemode keygen` prints), or a JSON file of
            it. A decision is accepted only with a valid, unexpired signature by the key of the approver it names.
        approver_directory: the members of the groups that `ApproverPolicy` names (`group:finance`): a mapping, a
            function of the group name, or a JSON file; read when a run starts, and recorded with it.
            As it starts, the worker reads the runs waiting for approval on its task queue and logs a warning for
            each whose approvers it holds no key for (which run, which tool, which keys: `_waiting_runs`).
        unsigned_approvals: for local development only: decisions need no signature (each record says it was not
            signed). Without it or `approver_keys`, a run with calls that need approval fails at its first step.
        graceful_shutdown_timeout: how long the worker, once told to stop, lets its in-flight activities (tool
            calls, model requests) finish before it cancels them; default 30 s
            (`DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT`), Temporal's own default being 0. A call that finishes in time is
            recorded and never runs again; one cut off is retried on another worker (idempotency keys).
        deployment: run this worker as a version of a Temporal Worker Deployment: a `WorkerDeploymentVersion`, or
            `"NAME:BUILD_ID"`. Runs are pinned to the version whose workers started them (the run workflow is
            `PINNED`), and new runs go to the deployment's current version, which you set once the new version's
            workers poll (`temporal worker deployment set-current-version`); the deploy procedure is in
            docs/operations.md. The worker logs, as it starts, when it is not the current version. `None`
            (default): an unversioned worker, every worker of the task queue interchangeable.
        tracing: OpenTelemetry spans for every run, model request, snippet, nested call and tool attempt (see
            docs/observability.md). `None` (default): on when the client carries Temporal's
            OpenTelemetry interceptor (`connect(tracing=True)`). Needs `opentelemetry-sdk` and the replay-safe
            tracer provider of `temporalio.contrib.opentelemetry.create_tracer_provider()` set globally.
        encryption: the keys this worker encrypts and decrypts payloads with (keys, a key file, or inline
            `id:base64key` entries: docs/operations.md#encrypting-histories); the worker then uses a client of the
            same connection with that codec. `None` (default): the client's codec if it has one, else
            `CODEMODE_ENCRYPTION_KEYS`, else none; `False`: the client's converter as it is. A worker missing a
            run's key fails that run's workflow tasks (each names the key), and the run waits for a worker with it.
        worker_options: passed to `temporalio.worker.Worker` (e.g. `max_cached_workflows`,
            `max_concurrent_activities`). Defaults set here: `sticky_queue_schedule_to_start_timeout` 3 s (a
            killed worker's runs move on after that, not 10 s) and `max_concurrent_workflow_tasks`
            `DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS` (4) or the pool's size if smaller; more than the pool's size
            is refused.

    Raises:
        CodeModeUserError: no agents, or two with one name; a `deployment` beside a `deployment_config`, or one
            that is not `NAME:BUILD_ID`; an agent whose model string cannot work here (its
            provider's API key is not set: the message names the variable); more workflow task slots than sandbox
            processes; tracing without the SDK or a replay-safe provider; no `monty` binary to run sandboxes;
            encryption keys that do not load.

    """
    if not agents:
        raise CodeModeUserError("create_worker needs at least one CodeModeAgent to serve")
    if not is_compatible(client.data_converter):
        raise CodeModeUserError(
            "the client does not use the pydantic data converter; create it with durable_codemode.connect() "
            "or Client.connect(..., plugins=[CodeModePlugin()])"
        )
    client = _encrypting_client(client, encryption)
    for agent in agents:
        agent.check_model()
    check_sandbox_binary()
    settings = POOL.configure(pool or PoolSettings())
    slots = _workflow_task_slots(worker_options, settings)
    warm_up(client.data_converter, _PAYLOAD_TYPES)
    key = repl_key.encode() if isinstance(repl_key, str) else repl_key
    keyring = ApproverKeyring.of(approver_keys) if approver_keys is not None else ApproverKeyring({})
    authority = ApprovalAuthority(directory=ApproverDirectory(approver_directory), keyring=keyring,
                                  unsigned=unsigned_approvals)
    activities = CodeModeActivities(agents, repl_key=key or repl_key_from_env(),
                                    payload_store=client.data_converter.external_storage is not None,
                                    authority=authority)
    serve_keyring(task_queue, keyring)
    for agent in agents:
        serve(agent)
    version = _deployment(deployment, worker_options)
    worker_options.setdefault("sticky_queue_schedule_to_start_timeout", timedelta(seconds=3))
    worker_options.setdefault("workflow_runner", workflow_runner())
    # The compute budget counts from each activation's start (`workflow._task_clock`).
    worker_options["workflow_runner"] = TaskTimingRunner(worker_options["workflow_runner"])

    mcp_servers = McpServers([agent.agent for agent in agents])
    if tracing is None:
        tracing = has_tracing_interceptor(client.config(active_config=True)["interceptors"])
    spans: WorkerSpans | None = None
    if tracing:
        worker_options["interceptors"] = [*worker_options.get("interceptors", ()), *worker_interceptors(client)]
        # Each workflow-side span is exported once, by this worker once the server recorded its task (`_span_exports`).
        spans = WorkerSpans()
        worker_options["workflow_runner"] = SpanRecordingRunner(worker_options["workflow_runner"], spans)

    @asynccontextmanager
    async def release_sandboxes_on_shutdown() -> AsyncIterator[None]:
        in_process = POOL.reserve_task_slots(slots)
        if in_process > settings.max_processes:
            logger.warning(
                "the code-mode workers of this process have %d workflow task slots and its Monty pool %d "
                "processes: under load, workflow tasks may wait for a sandbox process and fail "
                "(SandboxUnavailableError) until one is free. Give the workers fewer "
                "max_concurrent_workflow_tasks or the pool more PoolSettings.max_processes.",
                in_process, settings.max_processes)
        shrink = asyncio.create_task(stop_idle_sandboxes(settings.idle_shutdown_seconds),
                                     name="durable-codemode idle sandbox shutdown")
        told = asyncio.create_task(_tell_whether_current(client, version), name="durable-codemode version check") \
            if version is not None else None
        keys = start_check(client, task_queue, keyring, version)
        settling = None if spans is None else asyncio.create_task(
            settle_spans(client, spans), name="durable-codemode span settling")
        try:
            async with mcp_servers.serving():  # each stdio server started once, and stopped with the worker
                yield
        finally:
            shrink.cancel()
            if told is not None:
                told.cancel()
            keys.cancel()
            POOL.reserve_task_slots(-slots)
            close_repls(task_queue)
            if settling is not None and spans is not None:
                settling.cancel()
                await settle_all(client, spans)  # its runs' last spans: no next activation will export them

    plugins = [*worker_options.pop("plugins", []),
               SimplePlugin("durable-codemode-sandbox-release", run_context=release_sandboxes_on_shutdown)]
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[CodeModeRunWorkflow if version is None else PinnedCodeModeRunWorkflow],
        activities=activities.all(),
        plugins=plugins,
        graceful_shutdown_timeout=graceful_shutdown_timeout,
        **worker_options,
    )
    if spans is not None:  # as the server records this worker's task completions
        spans.identity = worker.config().get("identity") or client.identity
    return worker
