"""The `codemode` argument parser: each subcommand, its flags and their checks, and the handler it runs."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

from .._encryption import ENCRYPTION_KEYS_ENV
from ..client._listing import RUN_STATES
from ..client._signer import KEY_ENV
from ..shared._names import DEFAULT_TASK_QUEUE
from ..ui import DEFAULT_UI_PORT
from ..ui._codec_server import CODEC_TOKEN_ENV, DEFAULT_CODEC_PORT
from ..worker._approvers import APPROVER_DIRECTORY_ENV, APPROVER_KEYS_ENV
from ._approvals import approvals_command, approve_command, audit_command, deny_command, keygen_command
from ._benchmark import add_bench_command
from ._demo import demo_command
from ._deploys import check_deploy_command, move_command
from ._history import history_command, replay_command, trace_command
from ._output import ADDRESS_ENV
from ._runs import runs_command, start_command, watch_command
from ._serving import DEFAULT_DEV_PORT, DEV_SERVER_DB, dev_command, worker_command
from ._ui import codec_server_command, ui_command


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
    demo.set_defaults(handler=demo_command)

    dev = commands.add_parser("dev", help="a persistent dev server plus a worker for the bundled agents",
                              description="Serve an embedded Temporal dev server and a worker for the "
                              "bundled agents until Ctrl-C.")
    dev.add_argument("--db", metavar="FILE",
                     help=f"SQLite file for the server's runs (default: {DEV_SERVER_DB}, or dev-server-PORT.sqlite "
                     "beside it for another --port); with --db or another --port, the bundled apps' stores go in "
                     "FILE-apps/ beside it, so two dev servers never share them")
    dev.add_argument("--port", type=_port, default=DEFAULT_DEV_PORT,
                     help=f"the server's port (default: {DEFAULT_DEV_PORT})")
    dev.add_argument("--ui", action="store_true", help="also serve Temporal's web UI, on port + 1000")
    dev.add_argument("--page-port", type=_port, default=DEFAULT_UI_PORT,
                     help=f"the port of codemode's own page to watch runs and decide approvals (default: "
                     f"{DEFAULT_UI_PORT}); its address, with its session token, is printed")
    dev.add_argument("--no-page", action="store_true", help="do not serve codemode's page")
    _approver_flags(dev)
    dev.set_defaults(handler=dev_command)

    ui = commands.add_parser("ui", help="a web page to watch runs live and decide the calls they wait on",
                             description=f"Serve a page on 127.0.0.1 to watch the runs of {ADDRESS_ENV} (default "
                             "localhost:7233) live and decide their waiting calls, as one approver (--key, "
                             "signed as `codemode approve --key` signs; or --approver, unsigned) or read-only. "
                             "It prints its address with a session token every request must carry.")
    ui.add_argument("--host", default="127.0.0.1", help="the address to bind (default: 127.0.0.1; another needs "
                    "--allow-remote)")
    ui.add_argument("--port", type=_port, default=DEFAULT_UI_PORT, help=f"the port (default: {DEFAULT_UI_PORT})")
    ui.add_argument("--key", metavar="FILE", help="decide as this approver, signing each decision with the key "
                    "file `codemode keygen` wrote, as `codemode approve --key` does")
    ui.add_argument("--approver", help="decide unsigned, as this person (only workers that take unsigned decisions, "
                    "such as codemode dev's, accept them)")
    ui.add_argument("--allow-remote", action="store_true", help="bind beyond loopback (put it behind TLS: the "
                    "token travels in every request)")
    ui.set_defaults(handler=ui_command)

    codec = commands.add_parser(
        "codec-server", help="decrypt encrypted runs for the Temporal UI and CLI (a codec server)",
        description=f"Serve Temporal's codec server protocol (POST /encode, /decode) with the keys of "
        f"{ENCRYPTION_KEYS_ENV}, so the Temporal UI (Settings > Codec Server) and `temporal --codec-endpoint` show "
        f"encrypted runs decoded. Browsers may call it only from the UI origins given; with {CODEC_TOKEN_ENV} set, "
        "every request needs `Authorization: Bearer <token>`.")
    codec.add_argument("--host", default="127.0.0.1", help="the address to bind (default: 127.0.0.1; another needs "
                       f"--allow-remote and {CODEC_TOKEN_ENV})")
    codec.add_argument("--port", type=_port, default=DEFAULT_CODEC_PORT,
                       help=f"the port (default: {DEFAULT_CODEC_PORT})")
    codec.add_argument("--origin", action="append", metavar="URL", help="a Temporal UI origin browsers may call it "
                       "from, e.g. https://temporal.example.com (repeat; default: the dev server's UI, "
                       "http://localhost:8233 and http://127.0.0.1:8233)")
    codec.add_argument("--namespace", action="append", metavar="NS", help="answer for this namespace only (repeat; "
                       "default: any)")
    codec.add_argument("--allow-remote", action="store_true", help="bind beyond loopback (with a token, behind TLS)")
    codec.set_defaults(handler=codec_server_command)

    worker = commands.add_parser("worker", help="a worker for the bundled agents",
                                 description=f"Serve the bundled agents on {ADDRESS_ENV}; when it is unset, "
                                 f"on an embedded dev server persisted to {DEV_SERVER_DB}.")
    worker.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, metavar="Q",
                        help=f"the task queue to serve (default: {DEFAULT_TASK_QUEUE})")
    worker.add_argument("--deployment", metavar="NAME", help="serve as a version of this Temporal Worker Deployment "
                        "(with --build-id): runs stay pinned to the version that started them; make a new version "
                        "current with `temporal worker deployment set-current-version` (docs/operations.md)")
    worker.add_argument("--build-id", metavar="ID", help="this worker's version within --deployment, e.g. a release "
                        "tag or commit")
    worker.add_argument("--graceful-shutdown", type=_duration, default=timedelta(seconds=30), metavar="DURATION",
                        help="once told to stop (SIGTERM, Ctrl-C), how long tool calls in flight get to finish "
                        "(default: 30s)")
    _approver_flags(worker)
    worker.set_defaults(handler=worker_command)

    run = commands.add_parser("run", help="start an agent run and print its result",
                              description=f"Start a run on {ADDRESS_ENV} (default localhost:7233), wait for "
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
    run.set_defaults(handler=start_command)

    watch = commands.add_parser("watch", help="follow a run live until it ends or waits for approval",
                                description="Show a run's model turns and nested calls as they start and finish "
                                "(a progress line for long gathers), until it completes, fails, or waits for an "
                                "approval (exit 3, with the commands that decide it).")
    watch.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    watch.set_defaults(handler=watch_command)

    approvals = commands.add_parser("approvals", help="list the calls of a run waiting for approval",
                                    description="List the tool calls of run RUN_ID that wait for a decision.")
    approvals.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    approvals.add_argument("--json", action="store_true", help="print the pending calls as JSON")
    approvals.set_defaults(handler=approvals_command)
    for name, handler, verb in (("approve", approve_command, "approve"), ("deny", deny_command, "deny")):
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

    keygen = commands.add_parser("keygen", help="make an approver's signing key, or a payload encryption key",
                                 description="Write a new Ed25519 key for APPROVER to FILE (mode 0600) and print "
                                 "its public entry, for the workers' create_worker(approver_keys=...) file. With "
                                 "--encryption: write a new AES-256 key entry (id:base64key) to FILE (mode 0600), for "
                                 f"{ENCRYPTION_KEYS_ENV} on every client, worker and codemode command.")
    keygen.add_argument("approver", metavar="APPROVER", nargs="?",
                        help="the approver's name, as approver policies name them (not with --encryption)")
    keygen.add_argument("-o", "--output", metavar="FILE", required=True, help="where to write the private key")
    keygen.add_argument("--key-id", help="the key's id (default: APPROVER-<8 hex digits>; with --encryption, "
                        "k<date>-<6 hex digits>)")
    keygen.add_argument("--encryption", action="store_true", help="a key that encrypts run payloads "
                        "(docs/operations.md#encrypting-histories) instead of an approver's signing key")
    keygen.set_defaults(handler=keygen_command)

    audit = commands.add_parser("audit", help="a run's approval audit trail",
                                description="Every approval decision of run RUN_ID (who, with which key, under "
                                "which policy, when, the note, a digest of the call's arguments), read from its "
                                "history, so also for closed runs; for an open run, also the decisions it refused "
                                "recently.")
    audit.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    audit.add_argument("--json", action="store_true", help="print the trail as JSON")
    audit.add_argument("--worker", metavar="MODULE", help="an open run is replayed for its signals' decisions: "
                       "import MODULE for the agents' approval rules (a closed run needs no replay)")
    audit.set_defaults(handler=audit_command)

    runs = commands.add_parser("runs", help="recent runs and their state",
                               description=f"List recent runs on {ADDRESS_ENV} from Temporal's visibility store: "
                               "id, agent, state (running, waiting for approval, completed, failed, "
                               "continued-as-new), start time.")
    runs.add_argument("--agent", help="only this agent's runs")
    runs.add_argument("--status", choices=RUN_STATES, help="only runs in this state ('waiting': open and "
                      "waiting for an approval; 'running': open and not waiting; 'open': either)")
    runs.add_argument("--query", metavar="Q", help="a visibility query to narrow the runs, e.g. \"TaskQueue = "
                      "'cart'\"")
    runs.add_argument("--version", metavar="NAME:BUILD_ID", help="only runs pinned to this worker deployment version "
                      "(with --status open: the runs that still need it before it is retired)")
    runs.add_argument("--limit", type=_positive, default=20, help="at most this many runs (default: 20)")
    runs.set_defaults(handler=runs_command)

    history = commands.add_parser("history", help="export a run's history as JSON",
                                  description="Print (or write to FILE) the history of run RUN_ID as Temporal's "
                                  "history JSON, which `codemode replay --history` and `trace --history` read "
                                  "offline.")
    history.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    history.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    history.add_argument("--chain", action="store_true", help="every run of the continue-as-new chain, first to "
                         "last (default: the latest run)")
    history.add_argument("--decrypt", action="store_true", help="write the payloads decrypted (default: an encrypted "
                         f"run's history stays encrypted; trace and replay read it with {ENCRYPTION_KEYS_ENV})")
    history.set_defaults(handler=history_command)

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
    trace.set_defaults(handler=trace_command)

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
    replay.set_defaults(handler=replay_command)

    check = commands.add_parser(
        "check-deploy", help="before deploying: what the new code would break in each open run",
        description="Compare every open run's recorded agent (tools and their signatures, direct tools' schemas, the "
        "output, approval rules, the approver keys its calls need) with the agents of the new code in MODULE, and "
        "say per run what would break (error) or change (warning); exit status 1 if any run would break. Replay "
        "(`codemode replay --all --worker MODULE`) stays the check of the workflow code.")
    check.add_argument("--worker", metavar="MODULE", required=True, help="the new code: a module with an agents() "
                       "function or module-level CodeModeAgent values (as for replay)")
    check.add_argument("--query", metavar="Q", help="a visibility query to narrow the open runs, e.g. \"TaskQueue = "
                       "'ops'\" or \"TemporalWorkerDeploymentVersion = 'ops:v1'\"")
    check.add_argument("--limit", type=_positive, default=500, help="at most this many runs (default: 500)")
    check.add_argument("--json", action="store_true", help="print the findings as JSON")
    _approver_flags(check)
    check.set_defaults(handler=check_deploy_command)

    move = commands.add_parser(
        "move", help="move an open run to another worker deployment version",
        description="Pin run RUN_ID to worker deployment version --to, once its recorded agent fits the agents of "
        "MODULE (the code of that version, as check-deploy compares) and its history replays with this release "
        "and MODULE; its next workflow task then goes to that version's workers. Exit 1 when a check fails.")
    move.add_argument("run_id", metavar="RUN_ID", help="the run's workflow id")
    move.add_argument("--to", required=True, metavar="NAME:BUILD_ID", help="the version to pin it to")
    move.add_argument("--worker", metavar="MODULE", required=True, help="the code of that version (its agents)")
    move.add_argument("--force", action="store_true", help="move it without the checks")
    _approver_flags(move)
    move.set_defaults(handler=move_command)

    add_bench_command(commands)
    return parser
