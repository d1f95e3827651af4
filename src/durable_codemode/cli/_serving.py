"""`codemode dev` and `codemode worker` (and `python worker.py`): serving the bundled agents."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from pydantic_ai.models import Model
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError

from .._bundled import bundled_apps
from .._deployments import version_label
from .._outcome import EXIT_OK
from ..client._connect import configured_address, connect
from ..client._devserver import start_dev_server
from ..shared._errors import CodeModeUserError
from ..shared._names import DEFAULT_TASK_QUEUE
from ..shared._signing import ApproverKeyring
from ..ui import UIAccess, serve_ui
from ..worker._agent import CodeModeAgent
from ..worker._approvers import APPROVER_DIRECTORY_ENV, APPROVER_KEYS_ENV
from ..worker._worker import DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT, create_worker
from ._output import ADDRESS_ENV, say, server_address

DEV_SERVER_DB = Path("~/.local/share/durable-codemode/dev-server.sqlite")
"""Where `codemode dev`, `codemode worker` and `worker.py` keep an embedded server's runs (`~` expanded)."""


def _bundled_agents() -> list[CodeModeAgent]:
    # Imported here, not at module level: `codemode run` needs neither the apps nor their stores (creating
    # an app's agent seeds its database), and the library stays importable without the bundled apps.
    with bundled_apps("serving the bundled agents"):
        from ..apps import workflows

    return workflows.agents()


def model_label(agent: CodeModeAgent) -> str:
    with bundled_apps("the bundled agents' model"):
        from ..apps.workflows import cart

    model = agent.agent.model
    name = model.model_name if isinstance(model, Model) else str(model)
    if name == cart.SCRIPTED_MODEL_NAME:
        return (f"{name} (a scripted model playing the model's part, offline; set {cart.MODEL_ENV} and "
                "OPENAI_API_KEY or ANTHROPIC_API_KEY to use a real one)")
    return name


@dataclass(frozen=True)
class ApproverSettings:
    """The approvers a bundled worker knows: their public key files and the group directory (flags or env)."""

    key_files: tuple[str, ...] = ()
    """`--approver-keys` (repeatable), else `CODEMODE_APPROVER_KEYS` (paths separated by `os.pathsep`)."""
    directory: str | None = None
    """`--approver-directory`, else `CODEMODE_APPROVER_DIRECTORY`."""

    @classmethod
    def of(cls, key_files: Sequence[str] | None = None, directory: str | None = None) -> ApproverSettings:
        """The settings from the flags given, the environment for those not given."""
        env_keys = [p for p in os.environ.get(APPROVER_KEYS_ENV, "").split(os.pathsep) if p]
        return cls(key_files=tuple(key_files or env_keys),
                   directory=directory or os.environ.get(APPROVER_DIRECTORY_ENV) or None)

    def keyring(self) -> ApproverKeyring:
        """The keys of every file (`CodeModeUserError`, naming the file, if one cannot be read)."""
        return ApproverKeyring.of_files(self.key_files)


async def _serve(client: Client, agents: Sequence[CodeModeAgent], task_queue: str, *, local: bool,
                 approvers: ApproverSettings | None = None, deployment: WorkerDeploymentVersion | None = None,
                 graceful_shutdown: timedelta = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT) -> None:
    """Serve `agents` until Ctrl-C or SIGTERM, then shut the worker down gracefully.

    `local`: the server is the embedded dev server, so approvals need no signature (local development) unless
    `approvers` gives keys: then decisions must be signed by one of them, as on any other server.

    A graceful shutdown lets the tool calls in flight finish (within `graceful_shutdown`), so none runs again on
    the next worker, and releases the worker's sticky queue at once; a killed worker leaves its runs stalled for the
    sticky timeout, and its calls in flight run again elsewhere. `deployment`: serve as that Worker Deployment
    version (runs pinned to the version that started them). The handlers stay installed until the event loop
    closes, so a second signal (a terminal sends Ctrl-C to the whole process group; `timeout` signals the child and
    the group) cannot interrupt the shutdown or the embedded server's stop halfway.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    names = ", ".join(a.name for a in agents)
    approvers = approvers or ApproverSettings()
    keyring = approvers.keyring()
    unsigned = local and not keyring
    async with create_worker(client, agents, task_queue=task_queue, unsigned_approvals=unsigned,
                             approver_keys=keyring, approver_directory=approvers.directory, deployment=deployment,
                             graceful_shutdown_timeout=graceful_shutdown):
        version = f" as version {version_label(deployment)}" if deployment is not None else ""
        say(f"worker: serving {names} on task queue {task_queue!r}{version}; Ctrl-C stops it")
        if keyring:
            group = f", groups from {approvers.directory}" if approvers.directory else ""
            say(f"approvals: signed decisions only, by {', '.join(keyring.approvers())} ({len(keyring.key_ids())} "
                 f"keys from {', '.join(approvers.key_files)}{group})")
        elif unsigned:
            say(f"approvals: unsigned decisions accepted (local dev server); --approver-keys FILE (or "
                 f"{APPROVER_KEYS_ENV}) requires signed ones")
        await stop.wait()
        say(f"worker: stopping (tool calls in flight get up to {graceful_shutdown.total_seconds():g} s to finish)")
    say("worker: stopped")


def _how_to_run(address: str, task_queue: str) -> None:
    queue = "" if task_queue == DEFAULT_TASK_QUEUE else f" --task-queue {task_queue}"
    say("start a run from another terminal:\n"
         f"  {ADDRESS_ENV}={address} codemode run cart 'Remove everything in my cart that costs more than "
         f"$50 a piece.'{queue}")  # single quotes: in double ones, the shell would turn $50 into 0


@asynccontextmanager
async def _embedded_server(
    db_file: Path, *, port: int | None = None, ui: bool = False
) -> AsyncIterator[Client]:
    db_file = db_file.expanduser()
    db_file.parent.mkdir(parents=True, exist_ok=True)
    async with await start_dev_server(db_file=db_file, port=port, ui=ui) as env:
        yield env.client


async def serve_bundled_agents(*, task_queue: str = DEFAULT_TASK_QUEUE,
                               approvers: ApproverSettings | None = None,
                               deployment: WorkerDeploymentVersion | None = None,
                               graceful_shutdown: timedelta = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT) -> int:
    """Serve the bundled agents until Ctrl-C: on the configured server if any, else on an embedded dev server.

    The configured server is `TEMPORAL_ADDRESS`, or the address of the Temporal client profile (`_connect`).
    `approvers`: the approvers' keys and directory; default: `CODEMODE_APPROVER_KEYS` and
    `CODEMODE_APPROVER_DIRECTORY` (`ApproverSettings.of()`). With keys, decisions must be signed by one of them;
    without, only an embedded server accepts unsigned ones (a configured server refuses runs that need approval).
    `deployment`: serve as that Worker Deployment version; `graceful_shutdown`: how long tool calls in flight get to
    finish once the worker is told to stop.

    The one implementation behind `python worker.py` and `codemode worker`. The embedded server persists to
    `DEV_SERVER_DB`, so runs started against it survive a restart of the worker.

    Raises:
        CodeModeUserError: the configured server is unreachable, or an agent is misconfigured.

    """
    approvers = approvers or ApproverSettings.of()
    approvers.keyring()  # a bad key file is an error before anything starts
    agents = _bundled_agents()
    if configured_address():
        client = await connect()
        say(f"connected to {server_address(client)} ({ADDRESS_ENV} or the Temporal profile)")
        await _serve(client, agents, task_queue, local=False, approvers=approvers, deployment=deployment,
                     graceful_shutdown=graceful_shutdown)
        return EXIT_OK
    async with _embedded_server(DEV_SERVER_DB) as client:
        address = server_address(client)
        say(f"embedded Temporal dev server at {address} ({ADDRESS_ENV} and the Temporal profile name no "
             f"server), runs kept in {DEV_SERVER_DB.expanduser()}")
        _how_to_run(address, task_queue)
        await _serve(client, agents, task_queue, local=True, approvers=approvers, deployment=deployment,
                     graceful_shutdown=graceful_shutdown)
    return EXIT_OK


DEFAULT_DEV_PORT = 7233
"""`codemode dev`'s port when none is given (Temporal's own default)."""

APP_DB_ENVS = ("CODEMODE_CART_DB", "CODEMODE_CALENDAR_DB", "CODEMODE_CHAT_DB", "CODEMODE_KANBAN_DB",
               "CODEMODE_INVENTORY_DB")
"""The variables naming the bundled apps' SQLite stores (each app reads its own; `workflows/<app>.py`)."""


def dev_paths(db: str | None, port: int) -> tuple[Path, Path | None]:
    """Where a `codemode dev` server keeps its runs, and where the bundled apps keep their stores (`None`: default).

    The default server (no `--db`, port 7233) keeps both where they always were, under `~/.local/share/
    durable-codemode/`. Any other server gets its own: runs in `--db FILE` (default `dev-server-<port>.sqlite`
    for another port, since two servers on one SQLite file would trample each other) and the apps' stores in the
    folder beside it, `<FILE without .sqlite>-apps/`. So two dev servers never share a cart or a calendar.
    """
    if db is None and port == DEFAULT_DEV_PORT:
        return DEV_SERVER_DB.expanduser(), None
    server_db = Path(db) if db else DEV_SERVER_DB.with_name(f"dev-server-{port}.sqlite")
    server_db = server_db.expanduser()
    return server_db, server_db.with_name(f"{server_db.stem}-apps")


def _use_app_stores(folder: Path) -> list[str]:
    """Point every bundled app's store not already set by its variable into `folder`; the variables set."""
    chosen = []
    for env in APP_DB_ENVS:
        if not os.environ.get(env):
            app = env.removeprefix("CODEMODE_").removesuffix("_DB").lower()
            os.environ[env] = str(folder / f"{app}.sqlite")
            chosen.append(env)
    return chosen


async def dev_command(args: argparse.Namespace) -> int:
    db, apps = dev_paths(args.db, args.port)
    approvers = ApproverSettings.of(args.approver_keys, args.approver_directory)
    approvers.keyring()  # a bad key file is an error before the server starts
    if apps is not None:
        apps.mkdir(parents=True, exist_ok=True)
        _use_app_stores(apps)  # before the agents are made: making an app's agent seeds its store
    agents = _bundled_agents()
    async with _embedded_server(db, port=args.port, ui=args.ui) as client:
        address = server_address(client)
        where = f"; the bundled apps' stores in {apps}" if apps is not None else ""
        say(f"Temporal dev server at {address}, runs kept in {db}{where}")
        if args.ui:
            say(f"Temporal's web UI at http://127.0.0.1:{args.port + 1000}")
        page = None if args.no_page else await _page(client, args.page_port, approvers)
        _how_to_run(address, DEFAULT_TASK_QUEUE)
        try:
            await _serve(client, agents, DEFAULT_TASK_QUEUE, local=True, approvers=approvers)
        finally:
            if page is not None:
                page.cancel()
    return EXIT_OK


async def _page(client: Client, port: int, approvers: ApproverSettings) -> asyncio.Task[None] | None:
    """Serve codemode's page beside the dev server (its address printed), or say why it is not served."""
    # The dev server takes unsigned decisions (unless keys are given): the page decides as $USER then.
    access = UIAccess() if approvers.key_files else UIAccess(approver=os.environ.get("USER") or "dev")
    ready = asyncio.Event()
    page = asyncio.create_task(serve_ui(client, port=port, access=access, ready=ready, announce=lambda url: say(
        f"codemode's page (watch runs, decide approvals, as {access.name or 'read-only'}): {url}")))
    listening = asyncio.create_task(ready.wait())
    await asyncio.wait({page, listening}, return_when=asyncio.FIRST_COMPLETED)
    listening.cancel()
    if page.done():  # it could not start (the port is taken): the server and worker go on without it
        error = page.exception()
        say(f"codemode's page is not served: {error} (--page-port PORT, or --no-page)")
        return None
    return page


async def worker_command(args: argparse.Namespace) -> int:
    if (args.deployment is None) != (args.build_id is None):
        raise CodeModeUserError("--deployment and --build-id go together: give both to serve as a Worker Deployment "
                                "version (e.g. --deployment ops --build-id 2026-12-06), or neither")
    deployment = (WorkerDeploymentVersion(deployment_name=args.deployment, build_id=args.build_id)
                  if args.deployment is not None else None)
    return await serve_bundled_agents(task_queue=args.task_queue, approvers=ApproverSettings.of(
        args.approver_keys, args.approver_directory), deployment=deployment,
        graceful_shutdown=args.graceful_shutdown)


async def no_worker_polls(client: Client, task_queue: str) -> bool:
    """Whether no worker has polled `task_queue` lately (best effort: `False` when the server cannot say)."""
    try:
        response = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        ))
    except RPCError:
        return False
    return not response.pollers
