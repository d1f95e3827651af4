"""Encrypted payloads: AES-256-GCM in a Temporal `PayloadCodec`, keyed by `CODEMODE_ENCRYPTION_KEYS`.

A run's history holds everything the run saw (prompt, model messages, tool arguments and results, approval notes).
With keys configured, every payload a client, worker or replayer of ours writes is encrypted before it leaves the
process, so the Temporal server (self-hosted or Cloud) stores ciphertext only:

- The plaintext is the whole serialized `Payload` (its data and its own metadata, such as `encoding`), so the
  metadata is authenticated and restored exactly.
- The outer payload's metadata holds `encoding: binary/encrypted` and the key id (`encryption-key-id`). The key id is
  also the AEAD's associated data: a payload whose key id was swapped does not decrypt.
- Each payload gets a fresh random 12-byte nonce (AES-GCM is safe for ~2^32 messages per key with random nonces:
  rotate keys long before that).
- The first key encrypts, every listed key decrypts: rotation is "put the new key first, keep the old ones listed
  until no open run and no history you still read needs them".
- A payload that is not encrypted passes through `decode` unchanged: histories recorded before encryption was turned
  on (and `tests/histories`) still replay and read with keys configured.

A payload encrypted under a key this process does not hold is refused with `EncryptionKeyError`, naming the key id
and the run; on a worker that fails the workflow task (retried by Temporal until a worker with the key takes it),
never the run. Ciphertext that was altered or truncated is refused with `EncryptionError`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
import secrets
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    ActivitySerializationContext,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)

from .shared._errors import CodeModeUserError

__all__ = [
    "ENCRYPTED_ENCODING",
    "ENCRYPTION_KEYS_ENV",
    "KEY_ID_METADATA",
    "Encryption",
    "EncryptionCodec",
    "EncryptionError",
    "EncryptionKeyError",
    "EncryptionKeys",
    "is_encrypted",
    "resolve_encryption",
]

ENCRYPTION_KEYS_ENV = "CODEMODE_ENCRYPTION_KEYS"
"""A key file's path, or inline `id:base64key` entries (commas or newlines between them); the first key encrypts."""

ENCRYPTED_ENCODING = b"binary/encrypted"
"""The `encoding` of an encrypted payload (Temporal's convention, which the UI and codec servers recognize)."""

KEY_ID_METADATA = "encryption-key-id"
"""The metadata key naming the key a payload was encrypted with (recorded in histories: never rename it)."""

_AAD_PREFIX = b"durable-codemode/aes-256-gcm/"
"""Associated data: this prefix and the key id. Recorded in every ciphertext: never change it."""

_NONCE_BYTES = 12
_TAG_BYTES = 16
_KEY_BYTES = 32
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DOCS = "docs/operations.md#encrypting-histories"


class EncryptionError(CodeModeUserError):
    """A payload that claims to be encrypted does not decrypt: altered or truncated ciphertext, or the wrong key."""


class EncryptionKeyError(EncryptionError):
    """A payload was encrypted with a key this process does not hold; `key_id` names it."""

    def __init__(self, message: str, *, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


@dataclasses.dataclass(frozen=True)
class EncryptionKeys:
    """AES-256 keys by id, in order: the first encrypts, all of them decrypt.

    Example:
        ```python
        keys = EncryptionKeys.parse("k2:" + EncryptionKeys.new_key() + ",k1:" + EncryptionKeys.new_key())
        assert keys.current == "k2" and keys.ids == ("k2", "k1")
        ```

    """

    keys: tuple[tuple[str, bytes], ...]
    """`(key id, 32-byte key)` pairs; the first encrypts."""

    def __post_init__(self) -> None:
        if not self.keys:
            raise CodeModeUserError(f"encryption needs at least one key (`codemode keygen --encryption`; {_DOCS})")
        seen: set[str] = set()
        for key_id, key in self.keys:
            if not _KEY_ID.fullmatch(key_id):
                raise CodeModeUserError(
                    f"the encryption key id {key_id!r} must be 1 to 64 letters, digits, '.', '_' or '-' (starting "
                    "with a letter or digit): it is written in every payload's metadata")
            if key_id in seen:
                raise CodeModeUserError(f"the encryption key id {key_id!r} is listed twice: give each key its own id")
            seen.add(key_id)
            if len(key) != _KEY_BYTES:
                raise CodeModeUserError(
                    f"the encryption key {key_id!r} is {len(key)} bytes; AES-256 needs 32 (make one with "
                    "`codemode keygen --encryption`)")

    @property
    def current(self) -> str:
        """The id of the key new payloads are encrypted with."""
        return self.keys[0][0]

    @property
    def ids(self) -> tuple[str, ...]:
        """Every key id, the encrypting one first."""
        return tuple(key_id for key_id, _ in self.keys)

    @staticmethod
    def new_key() -> str:
        """A fresh random 32-byte key, base64 (for an entry `id:key`)."""
        return base64.b64encode(secrets.token_bytes(_KEY_BYTES)).decode()

    @staticmethod
    def new_entry(key_id: str | None = None) -> str:
        """A new key entry `id:base64key` (default id: `k<date>-<6 hex digits>`), checked as `parse` checks it."""
        key_id = key_id or f"k{datetime.now(UTC):%Y%m%d}-{secrets.token_hex(3)}"
        entry = f"{key_id}:{EncryptionKeys.new_key()}"
        EncryptionKeys.parse(entry)
        return entry

    @classmethod
    def parse(cls, text: str, *, source: str = "the encryption keys") -> EncryptionKeys:
        """Keys from `id:base64key` entries separated by commas or newlines; blank lines and `#` comments skipped.

        Raises:
            CodeModeUserError: an entry is malformed, a key is not 32 bytes of base64, or an id repeats.

        """
        keys: list[tuple[str, bytes]] = []
        for raw in re.split(r"[,\n]", text):
            entry = raw.split("#", 1)[0].strip()
            if not entry:
                continue
            key_id, sep, encoded = entry.partition(":")
            if not sep:
                raise CodeModeUserError(f"{source}: the entry {_shown(entry)!r} is not `id:base64key` ({_DOCS})")
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise CodeModeUserError(f"{source}: the key {key_id.strip()!r} is not base64 ({_DOCS})") from None
            keys.append((key_id.strip(), key))
        if not keys:
            raise CodeModeUserError(f"{source} list no key (`codemode keygen --encryption` writes one; {_DOCS})")
        return cls(tuple(keys))

    @classmethod
    def load(cls, setting: str | os.PathLike[str], *, source: str = "the encryption keys") -> EncryptionKeys:
        """Keys from a setting as `CODEMODE_ENCRYPTION_KEYS` holds it: a file's path, or inline entries.

        A path object, or a string naming an existing file, is read as a key file; otherwise a string with `:` is
        taken as inline entries (`source` names where it came from in errors).

        Raises:
            CodeModeUserError: no such file, an unreadable one, or malformed entries (the message says which).

        """
        text = os.fspath(setting).strip()
        if not isinstance(setting, os.PathLike) and ":" in text and not _is_file(text):
            return cls.parse(text, source=source)
        path = Path(text).expanduser()
        try:
            content = path.read_text()
        except OSError as e:
            raise CodeModeUserError(f"cannot read the encryption key file {str(path)!r}: {e.strerror or e} (set "
                                    f"{ENCRYPTION_KEYS_ENV} to a key file or to `id:base64key` entries)") from e
        return cls.parse(content, source=f"the encryption key file {str(path)!r}")

    @classmethod
    def from_env(cls) -> EncryptionKeys | None:
        """The keys `CODEMODE_ENCRYPTION_KEYS` gives, or `None` when it is unset or empty."""
        setting = os.environ.get(ENCRYPTION_KEYS_ENV, "").strip()
        return cls.load(setting, source=ENCRYPTION_KEYS_ENV) if setting else None

    def __repr__(self) -> str:  # never the key material
        return f"EncryptionKeys(ids={self.ids!r})"


Encryption = EncryptionKeys | str | os.PathLike[str] | bool | None
"""What `encryption=` takes: keys, a key file or inline entries, `None` (`CODEMODE_ENCRYPTION_KEYS`, else off) or
`False` (off, whatever the environment says). `True` means "from the environment, and it must be set"."""


def resolve_encryption(encryption: Encryption) -> EncryptionKeys | None:
    """The keys an `encryption=` argument means (see `Encryption`).

    Raises:
        CodeModeUserError: `True` with `CODEMODE_ENCRYPTION_KEYS` unset, or keys that do not load.

    """
    if encryption is False:
        return None
    if encryption is None or encryption is True:
        keys = EncryptionKeys.from_env()
        if keys is None and encryption is True:
            raise CodeModeUserError(f"encryption=True needs {ENCRYPTION_KEYS_ENV} (a key file, or `id:base64key` "
                                    "entries): `codemode keygen --encryption` writes a key")
        return keys
    if isinstance(encryption, EncryptionKeys):
        return encryption
    return EncryptionKeys.load(encryption)


def _is_file(text: str) -> bool:
    try:
        return Path(text).expanduser().is_file()
    except (OSError, ValueError):  # a name too long for a path (inline keys), or a NUL byte
        return False


def _shown(entry: str) -> str:
    """An entry for an error message, without its key material."""
    key_id, sep, _ = entry.partition(":")
    return f"{key_id}:…" if sep else (entry[:12] + "…" if len(entry) > 12 else entry)


def is_encrypted(payload: Payload) -> bool:
    """Whether `payload` is one of ours (or any `binary/encrypted` payload)."""
    return payload.metadata.get("encoding") == ENCRYPTED_ENCODING


class EncryptionCodec(PayloadCodec, WithSerializationContext):
    """Temporal `PayloadCodec`: AES-256-GCM with `keys` (the first encrypts, every one decrypts).

    Use it through `durable_codemode.connect(encryption=...)`, `data_converter(encryption=...)` or
    `CODEMODE_ENCRYPTION_KEYS`, which also set Temporal's failure converter so failure messages are encrypted too.

    Example:
        ```python
        codec = EncryptionCodec(EncryptionKeys.parse("k1:" + EncryptionKeys.new_key()))
        (sealed,) = codec.encrypt([Payload(metadata={"encoding": b"json/plain"}, data=b'"secret"')])
        assert b"secret" not in sealed.SerializeToString()
        assert codec.decrypt([sealed])[0].data == b'"secret"'
        ```

    """

    def __init__(self, keys: EncryptionKeys, *, subject: str | None = None) -> None:
        """Encrypt with `keys.current`, decrypt with any of `keys`; `subject` names the run in errors."""
        self.keys = keys
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys}
        self._subject = subject

    def with_context(self, context: SerializationContext) -> EncryptionCodec:
        """The same codec, naming the run (and activity) its payloads belong to in its errors."""
        subject: str | None = None
        if isinstance(context, WorkflowSerializationContext):
            subject = f"run {context.workflow_id!r}"
        elif isinstance(context, ActivitySerializationContext) and context.workflow_id:
            subject = f"activity {context.activity_type or '?'} of run {context.workflow_id!r}"
        if subject is None or subject == self._subject:
            return self
        copy = EncryptionCodec.__new__(EncryptionCodec)
        copy.keys, copy._ciphers, copy._subject = self.keys, self._ciphers, subject
        return copy

    def encrypt(self, payloads: Iterable[Payload]) -> list[Payload]:
        """Each payload sealed with the current key (synchronous: AES-GCM on a payload takes microseconds)."""
        key_id = self.keys.current
        cipher = self._ciphers[key_id]
        aad = _AAD_PREFIX + key_id.encode()
        sealed = []
        for payload in payloads:
            nonce = os.urandom(_NONCE_BYTES)
            data = nonce + cipher.encrypt(nonce, payload.SerializeToString(), aad)
            sealed.append(Payload(metadata={"encoding": ENCRYPTED_ENCODING, KEY_ID_METADATA: key_id.encode()},
                                  data=data))
        return sealed

    def decrypt(self, payloads: Iterable[Payload]) -> list[Payload]:
        """Each encrypted payload opened; any other payload as it is.

        Raises:
            EncryptionKeyError: a payload's key is not among `keys` (the message names it and what to do).
            EncryptionError: a payload's ciphertext was altered or truncated, or its key id is missing.

        """
        return [self._open(p) if is_encrypted(p) else p for p in payloads]

    def _where(self) -> str:
        return f" ({self._subject})" if self._subject else ""

    def _open(self, payload: Payload) -> Payload:
        raw_id = payload.metadata.get(KEY_ID_METADATA)
        if not raw_id:
            raise EncryptionError(f"an encrypted payload{self._where()} names no key ({KEY_ID_METADATA} is missing "
                                  "from its metadata): it was not written by durable-codemode's codec")
        key_id = raw_id.decode(errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise EncryptionKeyError(
                f"a payload{self._where()} is encrypted with key {key_id!r}, which this process does not hold "
                f"(it holds {', '.join(map(repr, self.keys.ids))}): add key {key_id!r} to {ENCRYPTION_KEYS_ENV} (or "
                f"encryption=) after the current key. Keep retired keys listed while runs or histories use them; "
                f"see {_DOCS}", key_id=key_id)
        data = payload.data
        if len(data) < _NONCE_BYTES + _TAG_BYTES:
            raise EncryptionError(f"an encrypted payload{self._where()} (key {key_id!r}) is truncated: "
                                  f"{len(data)} bytes, less than a nonce and a tag")
        try:
            plain = cipher.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], _AAD_PREFIX + raw_id)
        except InvalidTag:
            raise EncryptionError(
                f"an encrypted payload{self._where()} does not decrypt with key {key_id!r}: its ciphertext was "
                f"altered or truncated, or the key {key_id!r} listed here is not the one it was written with "
                "(check the key material of that id on every host)") from None
        try:
            return Payload.FromString(plain)
        except DecodeError:  # (authenticated, so only a writer of another format could cause it)
            raise EncryptionError(f"an encrypted payload{self._where()} decrypts to no Temporal payload") from None

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """See `encrypt`."""
        return self.encrypt(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """See `decrypt`."""
        return self.decrypt(payloads)

    def __repr__(self) -> str:
        return f"EncryptionCodec(ids={self.keys.ids!r})"

