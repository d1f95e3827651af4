"""`codemode approvals`, `approve`, `deny`, `audit` and `keygen`: deciding paused calls, and the trail."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
from pathlib import Path

from pydantic import TypeAdapter
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from .._encryption import ENCRYPTION_KEYS_ENV, EncryptionKeys
from .._history_fetch import fetch_chain
from .._outcome import EXIT_FAILED, EXIT_OK
from ..client._connect import connect
from ..client._deciding import decide, decide_all, pending_approvals, rejected_decisions
from ..client._signer import KEY_ENV, ApprovalSigner, generate_approver_key
from ..history._capture import quiet_replays
from ..history._read import trace_histories
from ..shared._approvals import ApprovalRecord, PendingApproval, RejectedDecision, decided_by
from ..shared._errors import CodeModeError, CodeModeUserError, DecisionConflictError
from ..shared._results import call_arguments, code_lines, preview, printable
from ._history import load_worker
from ._output import err, say, say_json


async def approvals_command(args: argparse.Namespace) -> int:
    client = await connect()
    try:
        pending = await pending_approvals(client, args.run_id)
    except RPCError as e:
        raise CodeModeUserError(f"cannot query run {args.run_id!r}: {e.message}") from e
    if args.json:
        say_json(TypeAdapter(list[PendingApproval]).dump_json(pending, indent=2).decode())
        return EXIT_OK
    if not pending:
        say(f"run {printable(args.run_id)}: no call is waiting for approval")
        return EXIT_OK
    say(f"{'call id':<14} {'tool':<18} {'waiting since':<20} {'line':>4}  arguments")
    for p in pending:
        since = p.requested_at.strftime("%Y-%m-%d %H:%M:%S")
        say(f"{printable(p.call_id):<14} {printable(p.tool):<18} {since:<20} {p.line:>4}  "
             f"{printable(call_arguments(p.args, 60))}")
        if p.run_id:
            say(f"{'':<14} {'':<18} waits in child run {printable(p.run_id)}: decide it there")
        if p.code:
            lines = code_lines(p.code)
            line = lines[p.line - 1].strip() if 0 < p.line <= len(lines) else ""
            say(f"{'':<14} {'':<18} code: {printable(preview(line, 70))}")
    return EXIT_OK


async def _decide(args: argparse.Namespace, *, approved: bool) -> int:
    # The key first: a wrong key file is said before (and without) reaching a server.
    signer = ApprovalSigner.load(args.key) if args.key or os.environ.get(KEY_ENV) else None
    client = await connect()
    approver = args.approver or (signer.approver if signer else os.environ.get("USER"))
    elsewhere: list[PendingApproval] = []
    try:
        if args.all:
            decided = await decide_all(client, args.run_id, approved=approved, note=args.note, approver=approver,
                                       signer=signer)
            records, elsewhere = list(decided), decided.elsewhere
        elif args.call_id:
            records = [await decide(client, args.run_id, args.call_id, approved=approved, note=args.note,
                                    approver=approver, signer=signer)]
        else:
            raise CodeModeUserError("name the call to decide (see `codemode approvals RUN_ID`), or pass --all")
    except WorkflowUpdateFailedError as e:
        err(f"not recorded: {e.cause.message if isinstance(e.cause, ApplicationError) else e.cause or e}")
        return EXIT_FAILED
    except DecisionConflictError as e:
        err(str(e))
        return EXIT_FAILED
    except RPCError as e:
        raise CodeModeUserError(f"cannot reach run {args.run_id!r}: {e.message}") from e
    for record in records:
        verb = "approved" if record.approved else "denied"
        by = f" by {printable(record.approver)}" if record.approver else ""
        counted = "" if record.settled else " (counted; the call needs more approvals)"
        say(f"{verb} {printable(record.call_id)} {printable(record.tool)}("
             f"{printable(call_arguments(record.args, 60))}){by}{counted}")
    command = "approve" if approved else "deny"
    for p in elsewhere:  # a child run's calls: decided on the child, not through its parent
        child = p.run_id or ""
        say(f"not decided here: {printable(p.call_id)} {printable(p.tool)}({printable(call_arguments(p.args, 60))}) "
            f"waits in child run {printable(child)}: codemode {command} {shlex.quote(printable(child))} "
            f"{shlex.quote(printable(p.call_id))} (or --all there)")
    return EXIT_OK


async def keygen_command(args: argparse.Namespace) -> int:
    if args.encryption:
        return encryption_keygen(args)
    if not args.approver:
        raise CodeModeUserError("keygen needs the APPROVER whose signing key to make (or --encryption for a key that "
                                "encrypts run payloads)")
    target = Path(args.output)
    if target.exists():
        raise CodeModeUserError(f"{args.output!r} exists; choose another file (an approver key is never "
                                "overwritten)")
    signer = generate_approver_key(args.approver, args.key_id)
    try:
        signer.save(target)
    except OSError as e:
        raise CodeModeUserError(f"cannot write {args.output!r}: {e.strerror or e}") from e
    err(f"wrote {signer.approver}'s private key {signer.key_id} to {args.output}; keep it private. Add this entry "
         "to the workers' approver keys file (create_worker(approver_keys=FILE)):")
    say(json.dumps({signer.key_id: signer.public_entry()}, indent=2))
    return EXIT_OK


def encryption_keygen(args: argparse.Namespace) -> int:
    """`codemode keygen --encryption -o FILE`: a new key entry in a new file, readable by its owner only."""
    if args.approver:
        raise CodeModeUserError(f"an encryption key belongs to no approver: drop {args.approver!r}, or drop "
                                "--encryption for an approver's signing key")
    entry = EncryptionKeys.new_entry(args.key_id)
    key_id = entry.partition(":")[0]
    try:
        # Created with mode 0600 (never readable by others, not even for a moment), and never over a file.
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CodeModeUserError(f"{args.output!r} exists; choose another file (a key file is never overwritten: to "
                                "rotate, add the new key's line to it by hand, as docs/operations.md says)") from None
    except OSError as e:
        raise CodeModeUserError(f"cannot write {args.output!r}: {e.strerror or e}") from e
    with os.fdopen(fd, "w") as f:
        f.write(f"# durable-codemode payload encryption keys: the first encrypts, every one decrypts\n{entry}\n")
    err(f"wrote encryption key {key_id} to {args.output} (mode 0600); keep it private and back it up: without it, "
        "runs encrypted with it cannot be read or finished.")
    say(f"Use it on every client, worker and codemode command:  export {ENCRYPTION_KEYS_ENV}={args.output}\n"
        f"To rotate to it from a current key file: first add this line after the current key on every host; once "
        f"all have it, move it first (it then encrypts). Keep the old key listed while runs or histories use it.")
    return EXIT_OK


async def audit_command(args: argparse.Namespace) -> int:
    client = await connect()
    histories = await fetch_chain(client, args.run_id)
    # A closed run's result holds its whole trail: read it from the history, without replaying any workflow code
    # (which would need the agents' approval rules). An open run is replayed, quietly, for its signals' decisions.
    trace = await trace_histories(histories, replay=False)
    if trace.status == "running":
        load_worker(args.worker)
        with quiet_replays() as runtime:
            trace = await trace_histories(histories, replay=True, runtime=runtime)
        for note in trace.notes:
            err(f"note: {note}")
    records = trace.audit
    rejected: list[RejectedDecision] = []
    if trace.status == "running":
        with contextlib.suppress(CodeModeError, RPCError):
            rejected = await rejected_decisions(client, args.run_id)
    if args.json:
        say_json(json.dumps({"run_id": args.run_id, "status": trace.status, "decisions": TypeAdapter(
            list[ApprovalRecord]).dump_python(records, mode="json"), "rejected": TypeAdapter(
            list[RejectedDecision]).dump_python(rejected, mode="json")}, indent=2, ensure_ascii=False))
        return EXIT_OK
    if not records and not rejected:
        say(f"run {printable(args.run_id)}: no approval decision")
        return EXIT_OK
    for r in records:
        verb = ("approved" if r.approved else "denied") + ("" if r.settled else " (counted; not yet enough)")
        signed = f"signed with {printable(r.key_id or '?')}" if r.signed else "UNSIGNED"
        say(f"{r.decided_at:%Y-%m-%d %H:%M:%S}  {printable(r.call_id):<12} {printable(r.tool)}  {verb} by "
             f"{printable(decided_by(r.approver, r.via))}  {signed}  via {r.via}"
             + (f"  policy: {printable(r.policy)}" if r.policy else "")
             + (f"  args {printable(r.args_digest)}" if r.args_digest else "")
             + (f"  note: {printable(r.note)}" if r.note else ""))
    for x in rejected:
        say(f"{x.at:%Y-%m-%d %H:%M:%S}  {printable(x.call_id):<12} REFUSED {'approval' if x.approved else 'denial'} "
             f"by {printable(x.approver or '?')}: {printable(x.reason)}")
    return EXIT_OK


async def approve_command(args: argparse.Namespace) -> int:
    return await _decide(args, approved=True)


async def deny_command(args: argparse.Namespace) -> int:
    return await _decide(args, approved=False)
