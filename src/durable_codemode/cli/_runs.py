"""`codemode run`, `watch` and `runs`: starting a run, following it, listing recent ones."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from .._outcome import EXIT_FAILED, EXIT_OK, EXIT_WAITING, run_failure_reason
from ..client._connect import connect
from ..client._listing import list_runs
from ..client._runs import start_run, validate_run_input
from ..client._stream import streams
from ..client._watch import WatchOutcome, watch_run
from ..client._watch_stream import watch_stream
from ..history._trace import render_tree
from ..shared._errors import CodeModeUserError
from ..shared._records import NAMED_RECORDS, RunResult
from ..shared._results import answer_text, printable
from ._output import err, say, say_json, server_address, tree_width
from ._serving import no_worker_polls


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


async def start_command(args: argparse.Namespace) -> int:
    messages = _read_messages(args.messages)
    validate_run_input(args.agent, args.prompt, messages)  # before connecting: a bad input never needs a server
    deps = _read_deps(args.deps_json)
    client = await connect()
    try:
        handle = await start_run(client, args.agent, args.prompt, task_queue=args.task_queue,
                                 model=args.model, message_history=messages, deps=deps,
                                 started_by=args.started_by or os.environ.get("USER"),
                                 instructions=args.instructions, stream=True if args.follow else None)
    except RPCError as e:
        raise CodeModeUserError(
            f"the server at {server_address(client)} refused to start the run: {e.message}"
        ) from e
    # With --json, stdout carries only the result, so the progress lines go to stderr.
    progress = sys.stderr if args.json else sys.stdout
    say(f"run {handle.id} started on task queue {args.task_queue!r}", out=progress)
    if await no_worker_polls(client, args.task_queue):
        err(f"warning: no worker is polling task queue {args.task_queue!r}; the run waits until one does "
             "(start one with `codemode worker` or `python worker.py`)")
    if args.follow:
        return await _follow(client, handle.id, handle.result_run_id, json_output=args.json)
    try:
        result = await handle.result()
    except WorkflowFailureError as e:
        err(f"run {handle.id} failed: {run_failure_reason(e)}")
        return EXIT_FAILED
    except asyncio.CancelledError:
        err(f"stopped waiting; run {handle.id} goes on (`temporal workflow show -w {handle.id}` shows it)")
        raise
    _print_result(result, json_output=args.json)
    return EXIT_OK


def _print_result(result: RunResult[Any], *, json_output: bool) -> None:
    if json_output:
        say_json(TypeAdapter(RunResult[Any]).dump_json(result, indent=2, context=NAMED_RECORDS).decode())
    else:
        say(f"\nanswer: {answer_text(result.output)}\n")
        say(render_tree(result, width=tree_width()))


async def _follow(client: Client, workflow_id: str, run_id: str | None, *, json_output: bool) -> int:
    """Show a run live (`watch_command`), then its answer and tree, or what it waits for and how to decide it.

    From the run's event stream when it streams (every `codemode run --follow` does); else from its history.
    """
    out = sys.stderr if json_output else sys.stdout
    try:
        if await streams(client, workflow_id, timeout=timedelta(seconds=2)):
            outcome: WatchOutcome = await watch_stream(client, workflow_id, out=out)
        else:
            outcome = await watch_run(client, workflow_id, run_id=run_id, out=out)
    except asyncio.CancelledError:
        err(f"stopped watching; run {workflow_id} goes on (`codemode watch {workflow_id}` picks it up again)")
        raise
    if outcome.state == "completed" and outcome.result is not None:
        _print_result(outcome.result, json_output=json_output)
        return EXIT_OK
    if outcome.state == "waiting":
        say(f"run {workflow_id} waits for approval of {len(outcome.pending)} call(s); decide with:")
        for p in outcome.pending:
            run, call = printable(p.run_id or workflow_id), printable(p.call_id)  # a child's call: on the child
            say(f"  codemode approve {run} {call}    # or: codemode deny {run} {call} --note ...")
        say(f"then follow it again: codemode watch {workflow_id}")
        return EXIT_WAITING
    err(f"run {workflow_id} {outcome.state}" + (f": {outcome.failure}" if outcome.failure else ""))
    return EXIT_FAILED


async def watch_command(args: argparse.Namespace) -> int:
    client = await connect()
    return await _follow(client, args.run_id, None, json_output=False)


async def runs_command(args: argparse.Namespace) -> int:
    client = await connect()
    try:
        runs = await list_runs(client, agent=args.agent, status=args.status, query=args.query, limit=args.limit,
                               version=args.version)
    except RPCError as e:
        raise CodeModeUserError(f"the server at {server_address(client)} cannot list runs: {e.message}") from e
    if not runs:
        say("no runs" + (f" of agent {args.agent!r}" if args.agent else "")
             + (f" with status {args.status}" if args.status else "")
             + (f" on version {args.version}" if args.version else ""))
        return EXIT_OK
    versioned = any(r.version for r in runs)  # the column only where some run is on a Worker Deployment version
    rows = [("run", "agent", "state", *(("version",) if versioned else ()), "started", "took")]
    for r in runs:
        state = r.state + (f" ({r.pending_approvals})" if r.pending_approvals else "")
        if r.state == "running" and r.pending_approvals is None and not r.status_recorded:
            state += " (no worker answered)"
        took = f"{(r.closed_at - r.started_at).total_seconds():.1f} s" if r.closed_at else ""
        rows.append((printable(r.workflow_id), printable(r.agent or "?"), state,
                     *((printable(r.version or "-"),) if versioned else ()),
                     r.started_at.strftime("%Y-%m-%d %H:%M:%S"), took))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        say("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return EXIT_OK
