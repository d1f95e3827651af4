"""`codemode history`, `trace` and `replay`: debugging a run from its history."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from temporalio.service import RPCError

from .._history_fetch import fetch_chain, fetch_history, histories_to_json, read_histories
from .._outcome import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from ..client._connect import connect
from ..history._capture import quiet_replays
from ..history._read import trace_histories, trace_run
from ..history._replay import load_agents, render_replay, render_replay_table, replay_histories, replay_recent
from ..history._trace import render_trace, trace_json
from ..shared._errors import CodeModeUserError
from ._output import err, say, say_json, tree_width


def load_worker(module: str | None) -> None:
    if module:
        names = load_agents(module)
        say(f"agents from {module}: {', '.join(names)}", out=sys.stderr)


async def history_command(args: argparse.Namespace) -> int:
    client = await connect()
    histories = (await fetch_chain(client, args.run_id, decrypt=args.decrypt) if args.chain
                 else [await fetch_history(client, args.run_id, decrypt=args.decrypt)])
    started = histories[0].events[0].workflow_execution_started_event_attributes
    if not args.chain and started.continued_execution_run_id:
        err(f"note: run {args.run_id} continued as new from an earlier run; this is its latest run only "
             "(--chain exports every run of the chain)")
    text = histories_to_json(histories)
    if args.output is None:
        say_json(text)
        return EXIT_OK
    try:
        Path(args.output).write_text(text)
    except OSError as e:
        raise CodeModeUserError(f"cannot write {args.output!r}: {e.strerror or e}") from e
    events = sum(len(h.events) for h in histories)
    runs = f"{len(histories)} runs" if len(histories) > 1 else "1 run"
    say(f"wrote the history of {args.run_id} ({runs}, {events} events) to {args.output}; replay it with "
         f"`codemode replay --history {args.output}`")
    return EXIT_OK


def _one_source(args: argparse.Namespace, *, allow_all: bool = False) -> None:
    given = [bool(args.run_id), bool(args.history), bool(getattr(args, "all", False))]
    if sum(given) != 1:
        choices = "RUN_ID, --history FILE" + (" or --all" if allow_all else "")
        raise CodeModeUserError(f"name exactly one run to read: {choices}")


async def replay_command(args: argparse.Namespace) -> int:
    _one_source(args, allow_all=True)
    load_worker(args.worker)
    with quiet_replays() as runtime:
        if args.all:
            client = await connect()
            try:
                replays = await replay_recent(client, since=args.since, query=args.query, limit=args.limit,
                                              runtime=runtime)
            except RPCError as e:
                raise CodeModeUserError(f"the server rejected the run listing: {e.message} (check --query: it "
                                        "is a Temporal visibility query, e.g. \"TaskQueue = 'cart'\")") from e
            say(render_replay_table(replays))
            verdicts = {r.verdict for r in replays}
            # A divergence is the worse news; runs left unreplayed for want of --worker are a usage error (2).
            return EXIT_FAILED if "diverged" in verdicts else EXIT_USAGE if "not_replayed" in verdicts else EXIT_OK
        if args.history:
            histories = read_histories(args.history)
        else:
            histories = await fetch_chain(await connect(), args.run_id)
        report = await replay_histories(histories, runtime=runtime)
    say(render_replay(report))
    if report.needs_agents:
        return EXIT_USAGE
    return EXIT_OK if report.ok else EXIT_FAILED


async def trace_command(args: argparse.Namespace) -> int:
    _one_source(args)
    load_worker(args.worker)
    with quiet_replays() as runtime:
        if args.history:
            trace = await trace_histories(read_histories(args.history), replay=not args.no_replay, runtime=runtime)
        else:
            trace = await trace_run(await connect(), args.run_id, replay=not args.no_replay, runtime=runtime)
    if args.json:
        say_json(trace_json(trace))
    else:
        say(render_trace(trace, width=tree_width()))
    return EXIT_OK
