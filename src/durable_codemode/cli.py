"""The `codemode` command line: the offline demo, a dev server with a worker, a worker, and starting runs.

```
codemode demo [--lines 122]                      the cart agent end to end, offline, on an in-memory server
codemode dev [--db FILE] [--port 7233] [--ui]    a persistent dev server plus a worker, until Ctrl-C
codemode worker [--task-queue Q]                 a worker for the bundled agents (TEMPORAL_ADDRESS/embedded)
    dev, worker: [--approver-keys FILE]... [--approver-directory FILE]   signed approvals (or the env vars
                 CODEMODE_APPROVER_KEYS, CODEMODE_APPROVER_DIRECTORY)
codemode run AGENT "prompt" [--model M] [--json] start a run on TEMPORAL_ADDRESS and print its result
codemode run AGENT "prompt" --follow              ... showing model turns and nested calls as they happen
codemode watch RUN_ID                            follow a run live until it ends or waits for approval
codemode runs [--agent A] [--status S]           recent runs and their state (waiting for approval, ...)
codemode history RUN_ID [-o FILE] [--chain]      export a run's history as JSON
codemode trace RUN_ID | --history FILE [--json]  the run as a tree: turns, snippets, calls, approvals
codemode replay RUN_ID | --history FILE | --all  replay offline; on a divergence, where and why (exit 1)
codemode approvals RUN_ID / approve / deny / audit / keygen    approvals: list, decide, the trail, a signing key
codemode bench [--apps A] [--n 5,20] [--mode on,off] [--model M] [--json F] [--plot F.png]
                                                 code mode vs tool calling on the bundled tasks, graded
```

Exit codes: 0 done; 1 the run failed (or the demo's end state is wrong); 2 the command was used wrongly or the
server cannot be reached (also: `replay` of a run that needs `--worker MODULE`, a decision sent to a closed run);
3 (`watch`, `run --follow`) the run waits for approval; 130 interrupted.

What the commands print (all but `bench`'s tables and a bug's traceback) passes through `_results.printable`:
names, notes, call ids, program source, arguments and results that came from a run or from whoever can reach the
server cannot drive the terminal.

`main()` leaves with `os._exit` after flushing: a short script whose last act is a Temporal call can abort at
interpreter exit (`PyGILState_Release`, exit 134), which would turn a clean run into a crash report. Because
`os._exit` skips `atexit`, everything that needs stopping (servers, workers, the Monty pool) is stopped first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TextIO

from pydantic import TypeAdapter
from pydantic_ai.models import Model
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from . import _pool
from ._approvals import ApprovalRecord, PendingApproval, RejectedDecision
from ._bundled import bundled_apps
from ._errors import CodeModeError, CodeModeUserError, DecisionConflictError
from ._outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, EXIT_WAITING, run_failure_reason
from ._results import answer_text, code_lines, preview, printable
from ._signing import ApproverKeyring
from ._types import NAMED_RECORDS, RunResult
from .benchmark import add_bench_command
from .client._connect import configured_address
from .client._devserver import start_dev_server
from .client._listing import RUN_STATES, list_runs
from .client._operations import (
    decide,
    decide_all,
    pending_approvals,
    rejected_decisions,
    start_run,
    validate_run_input,
)
from .client._signer import KEY_ENV, ApprovalSigner, generate_approver_key
from .client._watch import WatchOutcome, watch_run
from .history._capture import quiet_replays
from .history._fetch import fetch_chain, fetch_history, histories_to_json, read_histories
from .history._read import trace_histories, trace_run
from .history._replay import load_agents, render_replay, render_replay_table, replay_histories, replay_recent
from .history._trace import render_trace, render_tree, trace_json
from .worker._agent import CodeModeAgent
from .worker._approvers import APPROVER_DIRECTORY_ENV, APPROVER_KEYS_ENV
from .worker._worker import DEFAULT_TASK_QUEUE, connect, create_worker

__all__ = [
    "DEV_SERVER_DB",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_WAITING",
    "exit_process",
    "main",
    "run_cli",
    "run_command",
    "serve_bundled_agents",
]

DEV_SERVER_DB = Path("~/.local/share/durable-codemode/dev-server.sqlite")
"""Where `codemode dev`, `codemode worker` and `worker.py` keep an embedded server's runs (`~` expanded)."""

_ADDRESS_ENV = "TEMPORAL_ADDRESS"


def _err(message: str) -> None:
    # One line: an error may quote a run's text (a call id, a failure), whose newlines must not start lines of ours.
    print(f"codemode: {printable(message)}", file=sys.stderr, flush=True)


def _say(message: str = "", *, out: TextIO | None = None) -> None:
    """Print `message`, its lines the command's own; what a terminal would act on is escaped (`printable`).

    Untrusted values in a line (names, notes, call ids, code) go through `printable` before they are put in it,
    so their own newlines are escaped too; this catches whatever else a line holds.
    """
    print(printable(message, lines=True), file=out or sys.stdout, flush=True)


def _say_json(text: str, *, out: TextIO | None = None) -> None:
    """Print a JSON document, still valid JSON with the same value, with nothing a terminal would act on."""
    print(printable(text, json=True), file=out or sys.stdout, flush=True)


def _tree_width() -> int:
    # Piped output (tests, logs) gets the fallback; never wider than a tree is pleasant to read.
    return min(shutil.get_terminal_size((100, 24)).columns, 140)


def _address(client: Client) -> str:
    return client.service_client.config.target_host


def _bundled_agents() -> list[CodeModeAgent]:
    # Imported here, not at module level: `codemode run` needs neither the apps nor their stores (creating
    # an app's agent seeds its database), and the library stays importable without the bundled apps.
    with bundled_apps("serving the bundled agents"):
        from .apps import workflows

    return workflows.agents()


def _model_label(agent: CodeModeAgent) -> str:
    with bundled_apps("the bundled agents' model"):
        from .apps.workflows import cart

    model = agent.agent.model
    name = model.model_name if isinstance(model, Model) else str(model)
    if name == cart.SCRIPTED_MODEL_NAME:
        return (f"{name} (a scripted model playing the model's part, offline; set {cart.MODEL_ENV} and "
                "OPENAI_API_KEY or ANTHROPIC_API_KEY to use a real one)")
    return name


# -- serving ------------------------------------------------------------------------------------------------


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
                 approvers: ApproverSettings | None = None) -> None:
    """Serve `agents` until Ctrl-C or SIGTERM, then shut the worker down gracefully.

    `local`: the server is the embedded dev server, so approvals need no signature (local development) unless
    `approvers` gives keys: then decisions must be signed by one of them, as on any other server.

    A graceful shutdown releases the worker's sticky queue at once; a killed worker leaves its runs stalled
    for the sticky timeout. The handlers stay installed until the event loop closes, so a second signal
    (a terminal sends Ctrl-C to the whole process group; `timeout` signals the child and the group) cannot
    interrupt the shutdown or the embedded server's stop halfway.
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
                             approver_keys=keyring, approver_directory=approvers.directory):
        _say(f"worker: serving {names} on task queue {task_queue!r}; Ctrl-C stops it")
        if keyring:
            group = f", groups from {approvers.directory}" if approvers.directory else ""
            _say(f"approvals: signed decisions only, by {', '.join(keyring.approvers())} ({len(keyring.key_ids())} "
                 f"keys from {', '.join(approvers.key_files)}{group})")
        elif unsigned:
            _say(f"approvals: unsigned decisions accepted (local dev server); --approver-keys FILE (or "
                 f"{APPROVER_KEYS_ENV}) requires signed ones")
        await stop.wait()
        _say("worker: stopping")
    _say("worker: stopped")


def _how_to_run(address: str, task_queue: str) -> None:
    queue = "" if task_queue == DEFAULT_TASK_QUEUE else f" --task-queue {task_queue}"
    _say("start a run from another terminal:\n"
         f'  {_ADDRESS_ENV}={address} codemode run cart "Remove everything in my cart that costs more than '
         f'$50 a piece."{queue}')


@asynccontextmanager
async def _embedded_server(
    db_file: Path, *, port: int | None = None, ui: bool = False
) -> AsyncIterator[Client]:
    db_file = db_file.expanduser()
    db_file.parent.mkdir(parents=True, exist_ok=True)
    async with await start_dev_server(db_file=db_file, port=port, ui=ui) as env:
        yield env.client


async def serve_bundled_agents(*, task_queue: str = DEFAULT_TASK_QUEUE,
                               approvers: ApproverSettings | None = None) -> int:
    """Serve the bundled agents until Ctrl-C: on the configured server if any, else on an embedded dev server.

    The configured server is `TEMPORAL_ADDRESS`, or the address of the Temporal client profile (`_connect`).
    `approvers`: the approvers' keys and directory; default: `CODEMODE_APPROVER_KEYS` and
    `CODEMODE_APPROVER_DIRECTORY` (`ApproverSettings.of()`). With keys, decisions must be signed by one of them;
    without, only an embedded server accepts unsigned ones (a configured server refuses runs that need approval).

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
        _say(f"connected to {_address(client)} ({_ADDRESS_ENV} or the Temporal profile)")
        await _serve(client, agents, task_queue, local=False, approvers=approvers)
        return EXIT_OK
    async with _embedded_server(DEV_SERVER_DB) as client:
        address = _address(client)
        _say(f"embedded Temporal dev server at {address} ({_ADDRESS_ENV} and the Temporal profile name no "
             f"server), runs kept in {DEV_SERVER_DB.expanduser()}")
        _how_to_run(address, task_queue)
        await _serve(client, agents, task_queue, local=True, approvers=approvers)
    return EXIT_OK


# -- commands -----------------------------------------------------------------------------------------------


async def _demo(args: argparse.Namespace) -> int:
    with bundled_apps("codemode demo"):
        from .apps.workflows import cart

    started = time.monotonic()
    saved_db_env = os.environ.get(cart.CART_DB_ENV)
    with tempfile.TemporaryDirectory(prefix="codemode-demo-") as tmp:
        db = Path(tmp) / "cart.sqlite"
        # For anything in this process that looks the cart up by name; restored when the demo ends.
        os.environ[cart.CART_DB_ENV] = str(db)
        try:
            return await _demo_with_cart(db, args.lines, started)
        finally:
            if saved_db_env is None:
                os.environ.pop(cart.CART_DB_ENV, None)
            else:
                os.environ[cart.CART_DB_ENV] = saved_db_env


async def _demo_with_cart(db: Path, lines: int, started: float) -> int:
    """The demo proper; `started` is when the command began, for the wall time it reports."""
    with bundled_apps("codemode demo"):
        from .apps.activities.cart import PAGE_SIZE, CartStore, check_removed_over, over_threshold
        from .apps.workflows import cart

    store = CartStore(db)
    store.seed(lines=lines)
    before = store.all_lines()
    over = over_threshold(before)
    agent = cart.cart_agent(store)
    _say("durable-codemode demo: the cart agent on an embedded Temporal dev server (in memory)")
    _say(f"  cart    {db} ({len(before)} lines, {len(over)} over $50, pages of {PAGE_SIZE})")
    _say(f"  model   {_model_label(agent)}")
    _say(f"  prompt  {cart.DEMO_PROMPT}")
    async with await start_dev_server() as env:
        client = env.client
        task_queue = f"demo-{uuid.uuid4().hex[:10]}"
        _say(f"  server  {_address(client)}, task queue {task_queue}")
        async with create_worker(client, [agent], task_queue=task_queue):
            handle = await start_run(client, agent.name, cart.DEMO_PROMPT, task_queue=task_queue)
            _say(f"run {handle.id} started")
            run_started = time.monotonic()
            try:
                result = await handle.result()
            except WorkflowFailureError as e:
                _err(f"run {handle.id} failed: {run_failure_reason(e)}")
                return EXIT_FAILED
            run_seconds = time.monotonic() - run_started
    _say(f"\nanswer: {answer_text(result.output)}\n")
    _say(render_tree(result, width=_tree_width()))
    problems = check_removed_over(store, before)
    duplicates = store.duplicate_effects()
    if duplicates:
        problems.append(f"{duplicates} tool calls ran their side effect more than once")
    _say()
    if problems:
        _say(f"end state: {len(problems)} problems")
        for problem in problems:
            _say(f"  - {problem}")
    else:
        removed = store.execution_count("remove_line")
        _say(f"end state: correct ({len(over)} lines over $50 removed, {len(before) - len(over)} kept, "
             f"{removed} removals, none repeated)")
    usage = result.usage
    _say(f"time: {run_seconds:.2f} s for the run, {time.monotonic() - started:.2f} s in all "
         "(with server start and stop)")
    _say(f"usage: {usage.requests} model requests, {usage.input_tokens} input tokens, "
         f"{usage.output_tokens} output tokens")
    return EXIT_FAILED if problems else EXIT_OK


async def _dev(args: argparse.Namespace) -> int:
    db = Path(args.db) if args.db else DEV_SERVER_DB
    approvers = ApproverSettings.of(args.approver_keys, args.approver_directory)
    approvers.keyring()  # a bad key file is an error before the server starts
    agents = _bundled_agents()
    async with _embedded_server(db, port=args.port, ui=args.ui) as client:
        address = _address(client)
        _say(f"Temporal dev server at {address}, runs kept in {db.expanduser()}")
        if args.ui:
            _say(f"web UI at http://127.0.0.1:{args.port + 1000}")
        _how_to_run(address, DEFAULT_TASK_QUEUE)
        await _serve(client, agents, DEFAULT_TASK_QUEUE, local=True, approvers=approvers)
    return EXIT_OK


async def _worker(args: argparse.Namespace) -> int:
    return await serve_bundled_agents(task_queue=args.task_queue, approvers=ApproverSettings.of(
        args.approver_keys, args.approver_directory))


async def _no_worker_polls(client: Client, task_queue: str) -> bool:
    """Whether no worker has polled `task_queue` lately (best effort: `False` when the server cannot say)."""
    try:
        response = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        ))
    except RPCError:
        return False
    return not response.pollers


def _read_messages(path: str | None) -> list[Any]:
    """The `--messages` file: a JSON list of pydantic-ai messages (checked by `start_run` before anything starts)."""
    if path is None:
        return []
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise CodeModeUserError(f"cannot read the messages file {path!r}: {e.strerror or e}") from e
    except ValueError as e:
        raise CodeModeUserError(f"the messages file {path!r} is not JSON ({e}); it must hold a JSON list of "
                                "pydantic-ai messages, e.g. from result.all_messages_json()") from e
    if not isinstance(data, list):
        raise CodeModeUserError(f"the messages file {path!r} holds a JSON {type(data).__name__}, not a list of "
                                "pydantic-ai messages")
    return data


def _read_deps(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise CodeModeUserError(f"--deps-json is not JSON ({e}): give the deps as a JSON value, e.g. "
                                "--deps-json '{\"tenant\": \"acme\"}'") from e


async def _run(args: argparse.Namespace) -> int:
    messages = _read_messages(args.messages)
    validate_run_input(args.agent, args.prompt, messages)  # before connecting: a bad input never needs a server
    deps = _read_deps(args.deps_json)
    client = await connect()
    try:
        handle = await start_run(client, args.agent, args.prompt, task_queue=args.task_queue,
                                 model=args.model, message_history=messages, deps=deps,
                                 started_by=args.started_by or os.environ.get("USER"),
                                 instructions=args.instructions)
    except RPCError as e:
        raise CodeModeUserError(
            f"the server at {_address(client)} refused to start the run: {e.message}"
        ) from e
    # With --json, stdout carries only the result, so the progress lines go to stderr.
    progress = sys.stderr if args.json else sys.stdout
    _say(f"run {handle.id} started on task queue {args.task_queue!r}", out=progress)
    if await _no_worker_polls(client, args.task_queue):
        _err(f"warning: no worker is polling task queue {args.task_queue!r}; the run waits until one does "
             "(start one with `codemode worker` or `python worker.py`)")
    if args.follow:
        return await _follow(client, handle.id, handle.result_run_id, json_output=args.json)
    try:
        result = await handle.result()
    except WorkflowFailureError as e:
        _err(f"run {handle.id} failed: {run_failure_reason(e)}")
        return EXIT_FAILED
    except asyncio.CancelledError:
        _err(f"stopped waiting; run {handle.id} goes on (`temporal workflow show -w {handle.id}` shows it)")
        raise
    _print_result(result, json_output=args.json)
    return EXIT_OK


def _print_result(result: RunResult[Any], *, json_output: bool) -> None:
    if json_output:
        _say_json(TypeAdapter(RunResult[Any]).dump_json(result, indent=2, context=NAMED_RECORDS).decode())
    else:
        _say(f"\nanswer: {answer_text(result.output)}\n")
        _say(render_tree(result, width=_tree_width()))


async def _follow(client: Client, workflow_id: str, run_id: str | None, *, json_output: bool) -> int:
    """Show a run live (`_watch`), then its answer and tree, or what it waits for and how to decide it."""
    try:
        outcome: WatchOutcome = await watch_run(client, workflow_id, run_id=run_id,
                                                out=sys.stderr if json_output else sys.stdout)
    except asyncio.CancelledError:
        _err(f"stopped watching; run {workflow_id} goes on (`codemode watch {workflow_id}` picks it up again)")
        raise
    if outcome.state == "completed" and outcome.result is not None:
        _print_result(outcome.result, json_output=json_output)
        return EXIT_OK
    if outcome.state == "waiting":
        _say(f"run {workflow_id} waits for approval of {len(outcome.pending)} call(s); decide with:")
        run = printable(workflow_id)
        for p in outcome.pending:
            call = printable(p.call_id)
            _say(f"  codemode approve {run} {call}    # or: codemode deny {run} {call} --note ...")
        _say(f"then follow it again: codemode watch {workflow_id}")
        return EXIT_WAITING
    _err(f"run {workflow_id} {outcome.state}" + (f": {outcome.failure}" if outcome.failure else ""))
    return EXIT_FAILED


async def _watch(args: argparse.Namespace) -> int:
    client = await connect()
    return await _follow(client, args.run_id, None, json_output=False)


async def _approvals(args: argparse.Namespace) -> int:
    client = await connect()
    try:
        pending = await pending_approvals(client, args.run_id)
    except RPCError as e:
        raise CodeModeUserError(f"cannot query run {args.run_id!r}: {e.message}") from e
    if args.json:
        _say_json(TypeAdapter(list[PendingApproval]).dump_json(pending, indent=2).decode())
        return EXIT_OK
    if not pending:
        _say(f"run {printable(args.run_id)}: no call is waiting for approval")
        return EXIT_OK
    _say(f"{'call id':<14} {'tool':<18} {'waiting since':<20} {'line':>4}  arguments")
    for p in pending:
        since = p.requested_at.strftime("%Y-%m-%d %H:%M:%S")
        _say(f"{printable(p.call_id):<14} {printable(p.tool):<18} {since:<20} {p.line:>4}  "
             f"{printable(preview(p.args, 60))}")
        if p.code:
            lines = code_lines(p.code)
            line = lines[p.line - 1].strip() if 0 < p.line <= len(lines) else ""
            _say(f"{'':<14} {'':<18} code: {printable(preview(line, 70))}")
    return EXIT_OK


async def _decide(args: argparse.Namespace, *, approved: bool) -> int:
    client = await connect()
    signer = ApprovalSigner.load(args.key) if args.key or os.environ.get(KEY_ENV) else None
    approver = args.approver or (signer.approver if signer else os.environ.get("USER"))
    try:
        if args.all:
            records = await decide_all(client, args.run_id, approved=approved, note=args.note, approver=approver,
                                       signer=signer)
        elif args.call_id:
            records = [await decide(client, args.run_id, args.call_id, approved=approved, note=args.note,
                                    approver=approver, signer=signer)]
        else:
            raise CodeModeUserError("name the call to decide (see `codemode approvals RUN_ID`), or pass --all")
    except WorkflowUpdateFailedError as e:
        _err(f"not recorded: {e.cause.message if isinstance(e.cause, ApplicationError) else e.cause or e}")
        return EXIT_FAILED
    except DecisionConflictError as e:
        _err(str(e))
        return EXIT_FAILED
    except RPCError as e:
        raise CodeModeUserError(f"cannot reach run {args.run_id!r}: {e.message}") from e
    for record in records:
        verb = "approved" if record.approved else "denied"
        by = f" by {printable(record.approver)}" if record.approver else ""
        counted = "" if record.settled else " (counted; the call needs more approvals)"
        _say(f"{verb} {printable(record.call_id)} {printable(record.tool)}("
             f"{printable(preview(record.args, 60)[1:-1])}){by}{counted}")
    return EXIT_OK


async def _keygen(args: argparse.Namespace) -> int:
    target = Path(args.output)
    if target.exists():
        raise CodeModeUserError(f"{args.output!r} exists; choose another file (an approver key is never "
                                "overwritten)")
    signer = generate_approver_key(args.approver, args.key_id)
    try:
        signer.save(target)
    except OSError as e:
        raise CodeModeUserError(f"cannot write {args.output!r}: {e.strerror or e}") from e
    _err(f"wrote {signer.approver}'s private key {signer.key_id} to {args.output}; keep it private. Add this entry "
         "to the workers' approver keys file (create_worker(approver_keys=FILE)):")
    _say(json.dumps({signer.key_id: signer.public_entry()}, indent=2))
    return EXIT_OK


async def _audit(args: argparse.Namespace) -> int:
    client = await connect()
    histories = await fetch_chain(client, args.run_id)
    # A closed run's result holds its whole trail: read it from the history, without replaying any workflow code
    # (which would need the agents' approval rules). An open run is replayed, quietly, for its signals' decisions.
    trace = await trace_histories(histories, replay=False)
    if trace.status == "running":
        _load_worker(args.worker)
        with quiet_replays() as runtime:
            trace = await trace_histories(histories, replay=True, runtime=runtime)
        for note in trace.notes:
            _err(f"note: {note}")
    records = trace.audit
    rejected: list[RejectedDecision] = []
    if trace.status == "running":
        with contextlib.suppress(CodeModeError, RPCError):
            rejected = await rejected_decisions(client, args.run_id)
    if args.json:
        _say_json(json.dumps({"run_id": args.run_id, "status": trace.status, "decisions": TypeAdapter(
            list[ApprovalRecord]).dump_python(records, mode="json"), "rejected": TypeAdapter(
            list[RejectedDecision]).dump_python(rejected, mode="json")}, indent=2, ensure_ascii=False))
        return EXIT_OK
    if not records and not rejected:
        _say(f"run {printable(args.run_id)}: no approval decision")
        return EXIT_OK
    for r in records:
        verb = ("approved" if r.approved else "denied") + ("" if r.settled else " (counted; not yet enough)")
        signed = f"signed with {printable(r.key_id or '?')}" if r.signed else "UNSIGNED"
        _say(f"{r.decided_at:%Y-%m-%d %H:%M:%S}  {printable(r.call_id):<12} {printable(r.tool)}  {verb} by "
             f"{printable(r.approver or r.via)}  {signed}  via {r.via}"
             + (f"  policy: {printable(r.policy)}" if r.policy else "")
             + (f"  args {printable(r.args_digest)}" if r.args_digest else "")
             + (f"  note: {printable(r.note)}" if r.note else ""))
    for x in rejected:
        _say(f"{x.at:%Y-%m-%d %H:%M:%S}  {printable(x.call_id):<12} REFUSED {'approval' if x.approved else 'denial'} "
             f"by {printable(x.approver or '?')}: {printable(x.reason)}")
    return EXIT_OK


async def _approve(args: argparse.Namespace) -> int:
    return await _decide(args, approved=True)


async def _deny(args: argparse.Namespace) -> int:
    return await _decide(args, approved=False)


# -- debugging from histories ----------------------------------------------------------------------------------


def _duration(text: str) -> timedelta:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration such as 90s, 30m, 24h or 7d, got {text!r}")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[match.group(2)]
    return timedelta(**{unit: float(match.group(1))})


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def _load_worker(module: str | None) -> None:
    if module:
        names = load_agents(module)
        _say(f"agents from {module}: {', '.join(names)}", out=sys.stderr)


async def _history_cmd(args: argparse.Namespace) -> int:
    client = await connect()
    histories = (await fetch_chain(client, args.run_id) if args.chain
                 else [await fetch_history(client, args.run_id)])
    started = histories[0].events[0].workflow_execution_started_event_attributes
    if not args.chain and started.continued_execution_run_id:
        _err(f"note: run {args.run_id} continued as new from an earlier run; this is its latest run only "
             "(--chain exports every run of the chain)")
    text = histories_to_json(histories)
    if args.output is None:
        _say_json(text)
        return EXIT_OK
    try:
        Path(args.output).write_text(text)
    except OSError as e:
        raise CodeModeUserError(f"cannot write {args.output!r}: {e.strerror or e}") from e
    events = sum(len(h.events) for h in histories)
    runs = f"{len(histories)} runs" if len(histories) > 1 else "1 run"
    _say(f"wrote the history of {args.run_id} ({runs}, {events} events) to {args.output}; replay it with "
         f"`codemode replay --history {args.output}`")
    return EXIT_OK


def _one_source(args: argparse.Namespace, *, allow_all: bool = False) -> None:
    given = [bool(args.run_id), bool(args.history), bool(getattr(args, "all", False))]
    if sum(given) != 1:
        choices = "RUN_ID, --history FILE" + (" or --all" if allow_all else "")
        raise CodeModeUserError(f"name exactly one run to read: {choices}")


async def _replay_cmd(args: argparse.Namespace) -> int:
    _one_source(args, allow_all=True)
    _load_worker(args.worker)
    with quiet_replays() as runtime:
        if args.all:
            client = await connect()
            try:
                replays = await replay_recent(client, since=args.since, query=args.query, limit=args.limit,
                                              runtime=runtime)
            except RPCError as e:
                raise CodeModeUserError(f"the server rejected the run listing: {e.message} (check --query: it "
                                        "is a Temporal visibility query, e.g. \"TaskQueue = 'cart'\")") from e
            _say(render_replay_table(replays))
            verdicts = {r.verdict for r in replays}
            # A divergence is the worse news; runs left unreplayed for want of --worker are a usage error (2).
            return EXIT_FAILED if "diverged" in verdicts else EXIT_USAGE if "not_replayed" in verdicts else EXIT_OK
        if args.history:
            histories = read_histories(args.history)
        else:
            histories = await fetch_chain(await connect(), args.run_id)
        report = await replay_histories(histories, runtime=runtime)
    _say(render_replay(report))
    if report.needs_agents:
        return EXIT_USAGE
    return EXIT_OK if report.ok else EXIT_FAILED


async def _trace_cmd(args: argparse.Namespace) -> int:
    _one_source(args)
    _load_worker(args.worker)
    with quiet_replays() as runtime:
        if args.history:
            trace = await trace_histories(read_histories(args.history), replay=not args.no_replay, runtime=runtime)
        else:
            trace = await trace_run(await connect(), args.run_id, replay=not args.no_replay, runtime=runtime)
    if args.json:
        _say_json(trace_json(trace))
    else:
        _say(render_trace(trace, width=_tree_width()))
    return EXIT_OK


async def _runs_cmd(args: argparse.Namespace) -> int:
    client = await connect()
    try:
        runs = await list_runs(client, agent=args.agent, status=args.status, query=args.query, limit=args.limit)
    except RPCError as e:
        raise CodeModeUserError(f"the server at {_address(client)} cannot list runs: {e.message}") from e
    if not runs:
        _say("no runs" + (f" of agent {args.agent!r}" if args.agent else "")
             + (f" with status {args.status}" if args.status else ""))
        return EXIT_OK
    rows = [("run", "agent", "state", "started", "took")]
    for r in runs:
        state = r.state + (f" ({r.pending_approvals})" if r.pending_approvals else "")
        if r.state == "running" and r.pending_approvals is None and not r.status_recorded:
            state += " (no worker answered)"
        took = f"{(r.closed_at - r.started_at).total_seconds():.1f} s" if r.closed_at else ""
        rows.append((printable(r.workflow_id), printable(r.agent or "?"), state,
                     r.started_at.strftime("%Y-%m-%d %H:%M:%S"), took))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        _say("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return EXIT_OK


# -- argument parsing ---------------------------------------------------------------------------------------


def _cart_lines(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of cart lines, got {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"the demo cart needs at least 2 lines (its $50.00 and $50.01 "
                                         f"boundary lines), got {value}")
    return value


def _agent_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the agent name must not be empty (the bundled agent is 'cart')")
    return text


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 64535:
        raise argparse.ArgumentTypeError(f"the port must be in 1..64535 (the UI takes port + 1000), "
                                         f"got {value}")
    return value


Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def _approver_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--approver-keys", action="append", metavar="FILE",
                        help="the approvers' public keys, a JSON file as `codemode keygen` prints (repeat for "
                        f"several files; default: ${APPROVER_KEYS_ENV}, paths separated by '{os.pathsep}'). With "
                        "keys, decisions must be signed by one of them, also on the embedded server")
    parser.add_argument("--approver-directory", metavar="FILE",
                        help="approver groups, a JSON file such as {\"finance\": [\"ana\", \"bob\"]} (default: "
                        f"${APPROVER_DIRECTORY_ENV})")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; each subcommand sets `handler` to its coroutine function."""
    parser = argparse.ArgumentParser(
        prog="codemode",
        description="Code mode for LLM agents, made durable on Temporal.",
        epilog="Try `codemode demo`: no server, no API key and no network needed.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="run the cart agent end to end, offline, and check the result",
                               description="Start an in-memory dev server and a worker, seed a cart in a "
                               "temporary directory, run the cart agent, print its tree and check the cart.")
    demo.add_argument("--lines", type=_cart_lines, default=122, help="cart lines to seed (default: 122)")
    demo.set_defaults(handler=_demo)

    dev = commands.add_parser("dev", help="a persistent dev server plus a worker for the bundled agents",
                              description="Serve an embedded Temporal dev server and a worker for the "
                              "bundled agents until Ctrl-C.")
    dev.add_argument("--db", metavar="FILE",
                     help=f"SQLite file for the server's runs (default: {DEV_SERVER_DB})")
    dev.add_argument("--port", type=_port, default=7233, help="the server's port (default: 7233)")
    dev.add_argument("--ui", action="store_true", help="also serve the web UI, on port + 1000")
    _approver_flags(dev)
    dev.set_defaults(handler=_dev)

    worker = commands.add_parser("worker", help="a worker for the bundled agents",
                                 description=f"Serve the bundled agents on {_ADDRESS_ENV}; when it is unset, "
                                 f"on an embedded dev server persisted to {DEV_SERVER_DB}.")
    worker.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, metavar="Q",
                        help=f"the task queue to serve (default: {DEFAULT_TASK_QUEUE})")
    _approver_flags(worker)
    worker.set_defaults(handler=_worker)

    run = commands.add_parser("run", help="start an agent run and print its result",
                              description=f"Start a run on {_ADDRESS_ENV} (default localhost:7233), wait for "
                              "it and print the answer and the tree of model turns, snippets and tool calls.")
    run.add_argument("agent", type=_agent_name, help="the agent's name, e.g. cart")
    run.add_argument("prompt", help="what to ask the agent")
    run.add_argument("--model", help="a pydantic-ai model string for this run, e.g. openai:gpt-5")
    run.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, metavar="Q",
                     help=f"the workers' task queue (default: {DEFAULT_TASK_QUEUE})")
    run.add_argument("--json", action="store_true", help="print the RunResult as JSON instead")
    run.add_argument("--follow", action="store_true", help="show model turns and nested calls as they start and "
                     "finish; stop (exit 3) if the run waits for approval")
    run.add_argument("--messages", metavar="FILE", help="continue a conversation: a JSON list of pydantic-ai "
                     "messages (PROMPT may then be empty if the last one is a request)")
    run.add_argument("--instructions", metavar="TEXT", help="this run's own instructions, added to the agent's (as "
                     "Agent.run(instructions=...))")
    run.add_argument("--as", dest="started_by", metavar="NAME", help="who starts the run, recorded with it (default: "
                     "$USER): approver policies may refuse this person's approvals of its calls")
    run.add_argument("--deps-json", metavar="JSON", help="the run's deps as JSON (e.g. '{\"tenant\": \"acme\"}'), "
                     "rebuilt by the worker as the agent's deps_type")
    run.set_defaults(handler=_run)

    watch = commands.add_parser("watch", help="follow a run live until it ends or waits for approval",
                                description="Show a run's model turns and nested calls as they start and finish "
                                "(a progress line for long gathers), until it completes, fails, or waits for an "
                                "approval (exit 3, with the commands that decide it).")
    watch.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    watch.set_defaults(handler=_watch)

    approvals = commands.add_parser("approvals", help="list the calls of a run waiting for approval",
                                    description="List the tool calls of run RUN_ID that wait for a decision.")
    approvals.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    approvals.add_argument("--json", action="store_true", help="print the pending calls as JSON")
    approvals.set_defaults(handler=_approvals)
    for name, handler, verb in (("approve", _approve, "approve"), ("deny", _deny, "deny")):
        cmd = commands.add_parser(name, help=f"{verb} a paused call (or --all of a run's)",
                                  description=f"{verb.capitalize()} a call waiting for approval. The update id is "
                                  "'<call id> by <approver>', so repeating a decision is harmless; a different "
                                  "decision by the same approver about the same call is not recorded (exit 1).")
        cmd.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
        cmd.add_argument("call_id", metavar="CALL_ID", nargs="?", help="the call, e.g. call_0.3")
        cmd.add_argument("--all", action="store_true", help=f"{verb} every waiting call of the run")
        cmd.add_argument("--note", help="a note for the audit trail (a denial's note reaches the program)")
        cmd.add_argument("--approver", help="who decides (default: the key's approver, else $USER)")
        cmd.add_argument("--key", metavar="FILE", help=f"sign the decision with this approver key (from `codemode "
                         f"keygen`; default: ${KEY_ENV}); workers accept unsigned decisions only when their author "
                         "turned signing off")
        cmd.set_defaults(handler=handler)

    keygen = commands.add_parser("keygen", help="make an approver's signing key",
                                 description="Write a new Ed25519 key for APPROVER to FILE (mode 0600) and print "
                                 "its public entry, for the workers' create_worker(approver_keys=...) file.")
    keygen.add_argument("approver", metavar="APPROVER", help="the approver's name, as approver policies name them")
    keygen.add_argument("-o", "--output", metavar="FILE", required=True, help="where to write the private key")
    keygen.add_argument("--key-id", help="the key's id (default: APPROVER-<8 hex digits>)")
    keygen.set_defaults(handler=_keygen)

    audit = commands.add_parser("audit", help="a run's approval audit trail",
                                description="Every approval decision of run RUN_ID (who, with which key, under "
                                "which policy, when, the note, a digest of the call's arguments), read from its "
                                "history, so also for closed runs; for an open run, also the decisions it refused "
                                "recently.")
    audit.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    audit.add_argument("--json", action="store_true", help="print the trail as JSON")
    audit.add_argument("--worker", metavar="MODULE", help="an open run is replayed for its signals' decisions: "
                       "import MODULE for the agents' approval rules (a closed run needs no replay)")
    audit.set_defaults(handler=_audit)

    runs = commands.add_parser("runs", help="recent runs and their state",
                               description=f"List recent runs on {_ADDRESS_ENV} from Temporal's visibility store: "
                               "id, agent, state (running, waiting for approval, completed, failed, "
                               "continued-as-new), start time.")
    runs.add_argument("--agent", help="only this agent's runs")
    runs.add_argument("--status", choices=RUN_STATES, help="only runs in this state ('waiting': running and "
                      "waiting for an approval)")
    runs.add_argument("--query", metavar="Q", help="a visibility query to narrow the runs, e.g. \"TaskQueue = "
                      "'cart'\"")
    runs.add_argument("--limit", type=_positive, default=20, help="at most this many runs (default: 20)")
    runs.set_defaults(handler=_runs_cmd)

    history = commands.add_parser("history", help="export a run's history as JSON",
                                  description="Print (or write to FILE) the history of run RUN_ID as Temporal's "
                                  "history JSON, which `codemode replay --history` and `trace --history` read "
                                  "offline.")
    history.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    history.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    history.add_argument("--chain", action="store_true", help="every run of the continue-as-new chain, first to "
                         "last (default: the latest run)")
    history.set_defaults(handler=_history_cmd)

    trace = commands.add_parser("trace", help="a run as a tree: turns, snippets, calls, approvals",
                                description="Draw a run (running, completed, failed or continued as new) from its "
                                "history: each model turn, each snippet's code, each nested call with its "
                                "arguments, status, duration, retries and result or error, the approvals and the "
                                "output.")
    trace.add_argument("run_id", metavar="RUN_ID", nargs="?", help="the run's workflow id (its whole chain)")
    trace.add_argument("--history", metavar="FILE", help="read a history file instead of the server")
    trace.add_argument("--json", action="store_true", help="print the trace as JSON")
    trace.add_argument("--worker", metavar="MODULE", help="import MODULE for the agents' approval rules")
    trace.add_argument("--no-replay", action="store_true", help="read the history only; without the offline "
                       "replay, call lines and pending approvals are missing")
    trace.set_defaults(handler=_trace_cmd)

    replay = commands.add_parser("replay", help="replay runs offline; name any divergence",
                                 description="Replay a run's history with this version of durable-codemode, "
                                 "offline, without running any activity (no server needed with --history). On "
                                 "a divergence: the model turn, snippet, line and call, the recorded and the "
                                 "replayed call, and the likely cause; exit status 1.")
    replay.add_argument("run_id", metavar="RUN_ID", nargs="?", help="the run's workflow id (its whole chain)")
    replay.add_argument("--history", metavar="FILE", help="replay a history file (from `codemode history -o`)")
    replay.add_argument("--all", action="store_true", help="replay the server's recent runs (before deploying "
                        "a new worker)")
    replay.add_argument("--since", type=_duration, default=timedelta(hours=24), metavar="DURATION",
                        help="with --all: runs started this long ago or later (default: 24h)")
    replay.add_argument("--query", metavar="Q", help="with --all: a visibility query to narrow the runs, e.g. "
                        "\"TaskQueue = 'cart'\"")
    replay.add_argument("--limit", type=_positive, default=200, help="with --all: at most this many runs "
                        "(default: 200)")
    replay.add_argument("--worker", metavar="MODULE", help="import MODULE for the agents' approval rules (its "
                        "agents() function or module-level CodeModeAgent values)")
    replay.set_defaults(handler=_replay_cmd)

    add_bench_command(commands)
    return parser


def run_command(command: Coroutine[Any, Any, int]) -> int:
    """Run `command` on a fresh event loop and return its exit code, turning known errors into one line.

    `CodeModeUserError` (bad configuration, no server at the address) is printed and gives `EXIT_USAGE`;
    Ctrl-C before a command has set up its own handling gives `EXIT_INTERRUPTED`; a closed stdout pipe
    gives `EXIT_FAILED` without a traceback; anything else is a bug: its traceback, then `EXIT_FAILED`.
    """
    try:
        return asyncio.run(command)
    except CodeModeUserError as e:
        _err(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`codemode run ... | head`): nothing is left to tell it, and the final flush
        # must not fail again, so stdout goes to /dev/null from here on.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception:
        # A bug, not a usage error: show where, but still leave through exit_process (no abort at exit).
        traceback.print_exc()
        _err("unexpected error (the traceback above); please report it with the command you ran")
        return EXIT_FAILED


def exit_process(code: int) -> NoReturn:
    """Stop the Monty pool, flush, and leave with `os._exit(code)` (see the module docstring for why)."""
    _pool.shutdown_pool()  # atexit would do it, but os._exit skips atexit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code; unlike `main()`, safe to call from Python (and tests)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already explained by argparse)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    handler: Command = args.handler
    return run_command(handler(args))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The `codemode` entry point: run the command, then `exit_process` with its exit code."""
    exit_process(run_cli(argv))


if __name__ == "__main__":
    main()
