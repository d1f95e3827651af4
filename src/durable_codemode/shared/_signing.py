"""Signed approval decisions: who sent a decision is proven by an Ed25519 signature, not by the name it carries.

An approver holds a private key (`client/_signer.ApprovalSigner`, a JSON key file made by `codemode keygen`);
workers hold the public keys (`ApproverKeyring`). A decision is signed over everything that makes it this
decision: the namespace, the run (workflow id), the call and a fingerprint of its tool and arguments as the
approver saw them, approve or deny, the note, the approver and an expiry. So a signature cannot be replayed for
another call, another run or after it expires, a decision signed by one person cannot claim to be another's, and
a decision made on arguments someone made up is refused by the run that holds the real ones. Shared by clients
(the payload they sign) and workflow code (verify, in the update validator, which a replay never runs again: a
replayed run never needs the keys).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ._decisions import approver_name_problem
from ._errors import CodeModeUserError

__all__ = ["ApproverKey", "ApproverKeyring", "b64", "legacy_signing_payload", "signing_payload", "unb64"]


def signing_payload(*, namespace: str, run_id: str, call_id: str, approved: bool, note: str | None,
                    approver: str, expires_at: datetime, call_fingerprint: str) -> bytes:
    """The bytes a decision's signature covers: canonical JSON, the same on every client and worker.

    `call_fingerprint`: `_names.call_fingerprint(tool, arguments)` of the call as the approver saw it listed, so a
    decision made on other arguments than the call holds (a list someone forged) is refused by the run.
    """
    return json.dumps({
        "namespace": namespace, "run_id": run_id, "call_id": call_id, "approved": approved, "note": note,
        "approver": approver, "expires_at": expires_at.isoformat(), "call": call_fingerprint,
    }, sort_keys=True, separators=(",", ":")).encode()


def legacy_signing_payload(*, namespace: str, run_id: str, call_id: str, approved: bool, note: str | None,
                           approver: str, expires_at: datetime) -> bytes:
    """What clients of 0.2.0 and before signed: no fingerprint of the call. Workers refuse such signatures by name."""
    return json.dumps({
        "namespace": namespace, "run_id": run_id, "call_id": call_id, "approved": approved, "note": note,
        "approver": approver, "expires_at": expires_at.isoformat(),
    }, sort_keys=True, separators=(",", ":")).encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise CodeModeUserError(f"{what} is not base64: {e}") from e


@dataclass(frozen=True)
class ApproverKey:
    """One approver's public key, as a worker holds it."""

    approver: str
    public_key: Ed25519PublicKey


class ApproverKeyring:
    """The public keys a worker verifies decisions with, by key id.

    Built from a mapping `{key_id: {"approver": name, "public_key": base64 raw key}}` (what `public_entry` gives),
    or from a JSON file holding that mapping.
    """

    def __init__(self, keys: Mapping[str, ApproverKey]) -> None:
        self._keys = dict(keys)

    @classmethod
    def of(cls, source: ApproverKeyring | Mapping[str, Any] | str | os.PathLike[str]) -> ApproverKeyring:
        """A keyring from a keyring, a mapping of entries, or the path of a JSON file of entries.

        Raises:
            CodeModeUserError: the file cannot be read, or an entry is malformed (the message names it).

        """
        if isinstance(source, ApproverKeyring):
            return source
        if isinstance(source, Mapping):
            entries, where = source, "approver_keys"
        else:
            try:
                entries, where = json.loads(Path(source).read_text()), str(source)
            except OSError as e:
                raise CodeModeUserError(f"cannot read the approver keys {str(source)!r}: {e.strerror or e}") from e
            except ValueError as e:
                raise CodeModeUserError(f"the approver keys {str(source)!r} are not JSON: {e}") from e
        if not isinstance(entries, Mapping):
            raise CodeModeUserError(f"the approver keys {where!r} must map key ids to entries (what `codemode "
                                    f"keygen` prints), got a JSON {type(entries).__name__}")
        keys: dict[str, ApproverKey] = {}
        for key_id, entry in dict(entries).items():
            if isinstance(entry, ApproverKey):
                keys[key_id] = entry
                continue
            try:
                raw = unb64(str(entry["public_key"]), f"the public key of {key_id!r} in {where}")
                keys[key_id] = ApproverKey(approver=str(entry["approver"]),
                                           public_key=Ed25519PublicKey.from_public_bytes(raw))
            except (KeyError, TypeError, ValueError) as e:
                raise CodeModeUserError(
                    f"entry {key_id!r} of {where} is not an approver key: it needs 'approver' and 'public_key' "
                    f"(what `codemode keygen` prints): {e}") from e
        for key_id, key in keys.items():
            problem = approver_name_problem(key.approver)
            if problem:
                raise CodeModeUserError(f"entry {key_id!r} of {where}: the approver's name {problem} (decisions "
                                        "naming it would be refused); make the key again with a plain name")
        return cls(keys)

    @classmethod
    def of_files(cls, paths: Iterable[str | os.PathLike[str]]) -> ApproverKeyring:
        """One keyring of the entries of several JSON files (e.g. one `codemode keygen` output per approver).

        Raises:
            CodeModeUserError: a file cannot be read or is malformed, or two files give one key id different keys.

        """
        keys: dict[str, ApproverKey] = {}
        for path in paths:
            for key_id, key in cls.of(path)._keys.items():
                known = keys.get(key_id)
                if known is not None and (known.approver, known.public_key.public_bytes_raw()) != (
                        key.approver, key.public_key.public_bytes_raw()):
                    raise CodeModeUserError(f"key id {key_id!r} is given two different keys (the second in "
                                            f"{str(path)!r}): each key needs its own id")
                keys[key_id] = key
        return cls(keys)

    def key_ids(self) -> list[str]:
        """The ids of the keys this keyring holds, sorted."""
        return sorted(self._keys)

    def approvers(self) -> list[str]:
        """The approvers whose keys this keyring holds, sorted."""
        return sorted({key.approver for key in self._keys.values()})

    def __bool__(self) -> bool:
        return bool(self._keys)

    def verify(self, key_id: str | None, signature: str | None, payload: bytes, approver: str | None) -> str | None:
        """Why the signature does not prove `approver` sent `payload`, or `None` when it does."""
        if not key_id or not signature:
            return "the decision is not signed: sign it with the approver's key (codemode approve --key FILE, " \
                   "or decide(..., signer=ApprovalSigner.load(FILE)))"
        key = self._keys.get(key_id)
        if key is None:
            return f"key {key_id!r} is not one of this worker's approver keys"
        if approver != key.approver:
            return f"key {key_id!r} is {key.approver!r}'s, but the decision says it is {approver!r}'s"
        try:
            key.public_key.verify(base64.b64decode(signature), payload)
        except (InvalidSignature, ValueError):
            return (f"the signature does not match the decision under key {key_id!r} (forged, or signed for another "
                    "call, run or note, or for other arguments than the call holds: list the calls again and decide "
                    "on what they hold)")
        return None
