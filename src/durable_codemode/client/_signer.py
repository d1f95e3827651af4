"""An approver's signing key, on the client: signs decisions so the run can tell who sent them (`_signing`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..shared._decisions import MAX_KEY_ID_CHARS, approver_name_problem
from ..shared._errors import CodeModeUserError
from ..shared._results import printable
from ..shared._signing import b64, unb64

__all__ = ["KEY_ENV", "ApprovalSigner", "generate_approver_key"]

KEY_ENV = "CODEMODE_APPROVER_KEY"
"""The path of the approver's key file, for `codemode approve` / `deny` without `--key`."""


@dataclass(frozen=True)
class ApprovalSigner:
    """An approver's private key: signs decisions as `approver`, under `key_id`.

    Keep the key file private (it is written with mode 0600); give workers its public half (`public_entry`).
    """

    approver: str
    key_id: str
    private_key: Ed25519PrivateKey

    def sign(self, payload: bytes) -> str:
        """The base64 signature of `payload`."""
        return b64(self.private_key.sign(payload))

    def public_entry(self) -> dict[str, str]:
        """The public half, as an entry of the workers' keyring (`{key_id: entry}`): approver and public key."""
        raw = self.private_key.public_key().public_bytes_raw()
        return {"approver": self.approver, "public_key": b64(raw)}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key file (mode 0600)."""
        data = {"approver": self.approver, "key_id": self.key_id,
                "private_key": b64(self.private_key.private_bytes_raw())}
        target = Path(path)
        target.write_text(json.dumps(data, indent=2) + "\n")
        target.chmod(0o600)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> ApprovalSigner:
        """Read a key file written by `save` / `codemode keygen`; default: the file `CODEMODE_APPROVER_KEY` names.

        Raises:
            CodeModeUserError: no path and no `CODEMODE_APPROVER_KEY`, or the file is missing or malformed.

        """
        chosen = path if path is not None else os.environ.get(KEY_ENV)
        if not chosen:
            raise CodeModeUserError(f"no approver key: pass --key FILE (or signer=) or set {KEY_ENV} to the key file "
                                    "`codemode keygen` wrote")
        try:
            data = json.loads(Path(chosen).read_text())
            if isinstance(data, dict) and "private_key" not in data and any(
                    isinstance(v, dict) and "public_key" in v for v in data.values()):
                raise CodeModeUserError(
                    f"{chosen!r} holds public keys (an approver keys file, for the workers' --approver-keys / "
                    "create_worker(approver_keys=...)), not a private one: sign with the file `codemode keygen NAME "
                    "-o FILE` wrote to FILE")
            missing = [k for k in ("approver", "key_id", "private_key") if not isinstance(data, dict) or k not in data]
            if missing:
                raise CodeModeUserError(
                    f"{chosen!r} is not an approver key file: it has no {', '.join(repr(m) for m in missing)} "
                    "(sign with the file `codemode keygen NAME -o FILE` wrote to FILE)")
            return cls(approver=str(data["approver"]), key_id=str(data["key_id"]),
                       private_key=Ed25519PrivateKey.from_private_bytes(
                           unb64(str(data["private_key"]), f"the private key in {chosen}")))
        except OSError as e:
            raise CodeModeUserError(f"cannot read the approver key {chosen!r}: {e.strerror or e}") from e
        except (ValueError, KeyError, TypeError) as e:
            raise CodeModeUserError(f"{chosen!r} is not an approver key file (from `codemode keygen`): {e}") from e


def generate_approver_key(approver: str, key_id: str | None = None) -> ApprovalSigner:
    """A new Ed25519 key for `approver` (key id default: `<approver>-<8 hex digits>`)."""
    problem = approver_name_problem(approver)
    if problem:
        raise CodeModeUserError(f"an approver key needs the approver's name, as policies name them: the name "
                                f"{problem}")
    key_id = key_id or f"{approver}-{os.urandom(4).hex()}"
    if not key_id.strip() or len(key_id) > MAX_KEY_ID_CHARS or printable(key_id) != key_id:
        raise CodeModeUserError(f"the key id {key_id!r} must be 1 to {MAX_KEY_ID_CHARS} printable characters")
    return ApprovalSigner(approver=approver, key_id=key_id, private_key=Ed25519PrivateKey.generate())


