"""`codemode check-deploy` and `codemode move`: what a deploy would break in open runs; moving a run."""

from __future__ import annotations

import argparse

from temporalio.service import RPCError

from .._deployments import parse_version, version_label
from .._history_fetch import fetch_chain, fetch_history
from .._outcome import EXIT_FAILED, EXIT_OK
from ..client._connect import connect
from ..client._deploys import move_run
from ..history._capture import quiet_replays
from ..history._deploy_check import (
    DeployCheck,
    check_deploy,
    check_history,
    findings_json,
    render_deploy_check,
)
from ..history._replay import import_agents, render_replay, replay_histories
from ..shared._errors import CodeModeUserError
from ._output import say, say_json
from ._serving import ApproverSettings


def _keys(args: argparse.Namespace) -> ApproverSettings:
    return ApproverSettings.of(args.approver_keys, args.approver_directory)


async def check_deploy_command(args: argparse.Namespace) -> int:
    agents = import_agents(args.worker)
    approvers = _keys(args)
    keyring = approvers.keyring() if approvers.key_files else None
    client = await connect()
    try:
        check = await check_deploy(client, agents, query=args.query, limit=args.limit, keyring=keyring)
    except RPCError as e:
        raise CodeModeUserError(f"the server rejected the run listing: {e.message} (check --query: it is a Temporal "
                                "visibility query, e.g. \"TaskQueue = 'ops'\")") from e
    if args.json:
        say_json(findings_json(check))
    else:
        say(render_deploy_check(check, module=args.worker))
        if keyring is None:
            say("approver keys: not checked (give --approver-keys FILE as the new workers will have them, or set "
                "CODEMODE_APPROVER_KEYS)")
        say("this compares the runs' recorded agents with the new code; `codemode replay --all --worker MODULE` "
            "checks that the workflow code replays them")
    return EXIT_OK if check.ok else EXIT_FAILED


async def move_command(args: argparse.Namespace) -> int:
    to = parse_version(args.to)
    agents = import_agents(args.worker)
    client = await connect()
    if not args.force:
        approvers = _keys(args)
        keyring = approvers.keyring() if approvers.key_files else None
        run = await check_history(await fetch_history(client, args.run_id), agents, keyring=keyring)
        if run.breaks:
            say(render_deploy_check(DeployCheck(agents=[a.name for a in agents], runs=[run]), module=args.worker))
            say(f"not moved: the code of {args.worker} would break run {args.run_id} (--force moves it anyway)")
            return EXIT_FAILED
        with quiet_replays() as runtime:
            report = await replay_histories(await fetch_chain(client, args.run_id), runtime=runtime)
        if not report.ok:
            say(render_replay(report))
            say(f"not moved: run {args.run_id} does not replay with this release's workflow code and {args.worker} "
                "(--force moves it anyway)")
            return EXIT_FAILED
    await move_run(client, args.run_id, to)
    say(f"moved run {args.run_id} to {version_label(to)}: its next workflow task goes to that version's workers"
        + ("" if args.force else f" (its recorded agent fits {args.worker}, and it replays)"))
    return EXIT_OK

