"""A run's history: fetch it (or its whole continue-as-new chain), save and load it as JSON.

Files are Temporal's own history JSON (`WorkflowHistory.to_json()`, what `temporal workflow show --output json`
and the UI download give) for one run, and `{"workflow_id": ..., "runs": [<history>, ...]}` for a chain.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from ._encryption import ENCRYPTION_KEYS_ENV, Encryption, EncryptionCodec, EncryptionKeyError, resolve_encryption
from ._history_payloads import decode_history, decrypt_events, encrypted_key_ids
from ._storage import env_stores, resolve_history, stores_of
from .shared._errors import CodeModeUserError, RunNotFoundError
from .shared._names import WORKFLOW_TYPE

__all__ = ["fetch_chain", "fetch_history", "histories_from_json", "histories_to_json", "read_histories",
           "resolve_stored", "write_histories"]


def _not_found(error: RPCError) -> bool:
    return error.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT)


async def fetch_history(client: Client, workflow_id: str, *, run_id: str | None = None, decrypt: bool = True
                        ) -> WorkflowHistory:
    """The history of one run of `workflow_id` (default: its latest run).

    Args:
        client: from `connect()`; its codec (the encryption keys) decodes the payloads.
        workflow_id: the run's workflow id.
        run_id: one run of the chain; default: the latest.
        decrypt: decode every payload with the client's codec, so the history reads as plaintext (what the
            debugging tools need); `False`: as the server stores it (encrypted, for an export that stays so).

    Raises:
        RunNotFoundError: no such run on the server.
        EncryptionKeyError: `decrypt` and a payload's key is not among the client's keys (the message names it).

    """
    try:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    except RPCError as e:
        if _not_found(e):
            raise RunNotFoundError(workflow_id, client.service_client.config.target_host) from e
        raise
    # Large payloads kept in a payload store are references in the history: read them back once, here, so every
    # tool reading this history sees values.
    history = await resolve_history(history, stores_of(client.data_converter) or env_stores())
    if not decrypt:
        return history
    return await decode_history(history, client.data_converter.payload_codec, namespace=client.namespace)


async def fetch_chain(client: Client, workflow_id: str, *, decrypt: bool = True) -> list[WorkflowHistory]:
    """The histories of every run of `workflow_id`'s continue-as-new chain, first to last.

    `decrypt`: as for `fetch_history`.

    Raises:
        RunNotFoundError: no such run on the server.
        EncryptionKeyError: `decrypt` and a payload's key is not among the client's keys.

    """
    latest = await fetch_history(client, workflow_id, decrypt=decrypt)
    started = latest.events[0].workflow_execution_started_event_attributes
    first = started.first_execution_run_id or latest.run_id
    if first == latest.run_id:
        return [latest]
    histories: list[WorkflowHistory] = []
    run_id: str | None = first
    while run_id:
        history = latest if run_id == latest.run_id else await fetch_history(client, workflow_id, run_id=run_id,
                                                                             decrypt=decrypt)
        histories.append(history)
        last = history.events[-1]
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last.HasField("workflow_execution_continued_as_new_event_attributes") else None)
    return histories


def histories_to_json(histories: Sequence[WorkflowHistory]) -> str:
    """One run: Temporal's history JSON; several: `{"workflow_id": ..., "runs": [...]}`."""
    if len(histories) == 1:
        return histories[0].to_json()
    return json.dumps({"workflow_id": histories[0].workflow_id,
                       "runs": [h.to_json_dict() for h in histories]}, indent=2)


def _workflow_id_of(history: dict[str, Any], default: str) -> str:
    events = history.get("events") or []
    if events:
        attributes = events[0].get("workflowExecutionStartedEventAttributes") or {}
        return str(attributes.get("workflowId") or default)
    return default


def histories_from_json(text: str, *, default_workflow_id: str = "run", encryption: Encryption = None
                        ) -> list[WorkflowHistory]:
    """The histories in a file written by `histories_to_json` (or downloaded from Temporal's CLI or UI).

    Encrypted payloads are decrypted with `encryption` (as `connect(encryption=...)` takes it; default:
    `CODEMODE_ENCRYPTION_KEYS`), so the histories read as plaintext; unencrypted ones are read as they are.

    Raises:
        CodeModeUserError: the text is not a history, or not one of a durable-codemode run.
        EncryptionKeyError: a payload is encrypted with a key not given (the message names it).

    """
    try:
        data = json.loads(text)
    except ValueError as e:
        raise CodeModeUserError(f"not a history file: not JSON ({e})") from e
    if isinstance(data, dict) and "runs" in data:
        runs, workflow_id = data["runs"], data.get("workflow_id")
    elif isinstance(data, list):
        runs, workflow_id = data, None
    else:
        runs, workflow_id = [data], None
    histories = []
    for run in runs:
        if not isinstance(run, dict) or not run.get("events"):
            raise CodeModeUserError("not a history file: expected Temporal's history JSON ({\"events\": [...]}), "
                                    "as written by `codemode history RUN_ID -o FILE`")
        wid = workflow_id or _workflow_id_of(run, default_workflow_id)
        history = WorkflowHistory.from_json(wid, run)
        kind = history.events[0].workflow_execution_started_event_attributes.workflow_type.name
        if kind != WORKFLOW_TYPE:
            raise CodeModeUserError(f"the history is of a {kind!r} workflow, not a durable-codemode run "
                                    f"({WORKFLOW_TYPE!r})")
        histories.append(_decrypted(history, encryption))
    return histories


def _decrypted(history: WorkflowHistory, encryption: Encryption) -> WorkflowHistory:
    needed = encrypted_key_ids(history)
    if not needed:
        return history
    keys = resolve_encryption(encryption)
    if keys is None:
        raise EncryptionKeyError(
            f"the history of run {history.workflow_id!r} is encrypted (key {', '.join(map(repr, sorted(needed)))}) "
            f"and no key is configured: set {ENCRYPTION_KEYS_ENV} to the key file of the workers that wrote it "
            "(docs/operations.md#encrypting-histories)", key_id=sorted(needed)[0])
    codec = EncryptionCodec(keys, subject=f"run {history.workflow_id!r}")
    decrypt_events(history.events, codec.decrypt)
    return history


async def resolve_stored(histories: Sequence[WorkflowHistory]) -> list[WorkflowHistory]:
    """Histories loaded from a file, with the payloads their references name read back and decrypted.

    A file exported as the server stores it (`temporal workflow show`, the UI) keeps references to the payload
    store (`CODEMODE_PAYLOAD_STORE`). `histories_from_json` decrypted what it held; what the store gives back was
    encrypted before it was stored, so it is decrypted here in turn (`CODEMODE_ENCRYPTION_KEYS`).

    Raises:
        CodeModeUserError: a reference names a store not configured here.
        PayloadStoreError: the store could not read a payload (missing, access refused).
        EncryptionKeyError: a stored payload is encrypted with a key not configured (the message names it).

    """
    return [_decrypted(await resolve_history(h, env_stores()), None) for h in histories]


def write_histories(path: str | Path, histories: Sequence[WorkflowHistory]) -> None:
    """Save histories to `path` (see `histories_to_json`)."""
    Path(path).write_text(histories_to_json(histories))


def read_histories(path: str | Path) -> list[WorkflowHistory]:
    """Load the histories saved in `path`.

    Raises:
        CodeModeUserError: the file is missing or is not a durable-codemode history.

    """
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as e:
        raise CodeModeUserError(f"cannot read history file {str(file)!r}: {e.strerror or e}") from e
    return histories_from_json(text, default_workflow_id=file.stem)


