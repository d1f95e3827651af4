"""Claim-check for large payloads: Temporal's external payload storage, with a local store and an S3 store.

A tool result of a few MB (a report, a page of raw records), a long conversation or a big REPL dump would pass
Temporal's 2 MiB payload limit and fail the call or the workflow task. With a payload store configured, every
payload over a threshold (256 KiB by default) is written to the store and the history holds only a reference
(Temporal's `ExternalStorage`, applied by the data converter on clients, workers and replayers alike). The
workflow code sees the full values, so nothing else changes.

Where `CODEMODE_PAYLOAD_STORE` (or `connect(payload_store=...)`, `data_converter(store=...)`) puts them:

- a directory: `LocalPayloadStore`, content-addressed files. Enough for one machine, a shared volume, or debugging,
  where an exported history plus the directory replays offline.
- `s3://bucket/prefix`: `S3PayloadStore` (`_s3_store`), Temporal's `S3StorageDriver` on a bucket every host of a
  cluster reads, with the AWS settings from the environment (`AWS_ENDPOINT_URL` for an S3-compatible server).
- in Python, any Temporal `StorageDriver`: a plain `temporalio.contrib.aws.s3driver.S3StorageDriver` (its
  references and `S3PayloadStore`'s are the same, and either reads the other's), `temporalio.contrib.gcp.gcsdriver`.

Encryption (`CODEMODE_ENCRYPTION_KEYS`) comes first: a stored payload is ciphertext before it leaves the process.
A store that cannot read or write a payload fails the workflow task or activity that needed it, which Temporal
retries; the run itself does not fail for it (docs/operations.md#s3-for-a-cluster).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.api.sdk.v1.external_storage_pb2 import ExternalStorageReference
from temporalio.client import WorkflowHistory
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    ExternalStorage,
    JSONProtoPayloadConverter,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from ._converter import DATA_CONVERTER
from ._encryption import EncryptionCodec, EncryptionKeys, resolve_encryption
from ._history_payloads import payload_fields
from ._s3_store import S3_DRIVER_NAME, PayloadNotFoundError, PayloadStoreError, S3PayloadStore
from .shared._errors import CodeModeUserError

__all__ = ["DEFAULT_PAYLOAD_THRESHOLD", "PAYLOAD_STORE_ENV", "LocalPayloadStore", "data_converter",
           "env_stores", "resolve_history", "store_from_env", "stores_of", "with_encryption"]

PAYLOAD_STORE_ENV = "CODEMODE_PAYLOAD_STORE"
"""A directory (`LocalPayloadStore`) or `s3://bucket/prefix` (`S3PayloadStore`); the same on every client, worker and
replayer of the namespace."""

DEFAULT_PAYLOAD_THRESHOLD = 256 * 1024
"""Payloads at least this big (bytes, encoded) go to the store; smaller ones stay in the history."""


class LocalPayloadStore(StorageDriver):
    """Payloads as files named by their SHA-256 in `directory`; a retrieved payload is checked against its name."""

    def __init__(self, directory: str | os.PathLike[str], *, name: str = "durable-codemode-local") -> None:
        """Store payloads under `directory` (created if missing).

        Args:
            directory: Where payload files go. Every process that reads these histories needs it.
            name: The driver name written into each reference; keep it stable, or old references will not resolve.

        """
        self.directory = Path(directory).expanduser()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._name = name

    def name(self) -> str:
        """The driver name recorded in references."""
        return self._name

    def type(self) -> str:
        """A stable type name for this driver."""
        return "durable-codemode.local-file"

    def _path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a payload reference of this store: {digest!r}")
        return self.directory / digest[:2] / digest

    def _write(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self._path(digest)
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            # Write then rename: a reader never sees half a payload, and two writers of one payload agree.
            fd, tmp = tempfile.mkstemp(dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        return digest

    def _read(self, digest: str) -> bytes:
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise PayloadNotFoundError(
                f"payload {digest} is not in the payload store {self.directory}: point {PAYLOAD_STORE_ENV} (or "
                "LocalPayloadStore) at the directory the run's workers wrote to"
            ) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise PayloadStoreError(f"payload file {path} does not match its digest: the store is corrupt; restore "
                                    "the file from a backup, or from another directory the run's workers wrote to")
        return data

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        """Write each payload; the claim is its SHA-256."""
        digests = await asyncio.to_thread(lambda: [self._write(p.SerializeToString()) for p in payloads])
        return [StorageDriverClaim(claim_data={"sha256": d}) for d in digests]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        """Read each claimed payload back."""
        blobs = await asyncio.to_thread(lambda: [self._read(c.claim_data["sha256"]) for c in claims])
        return [Payload.FromString(b) for b in blobs]


def data_converter(
    store: StorageDriver | None = None, *, threshold: int = DEFAULT_PAYLOAD_THRESHOLD,
    encryption: EncryptionKeys | str | os.PathLike[str] | None = None,
) -> DataConverter:
    """The durable-codemode data converter, offloading payloads of `threshold` bytes or more to `store`.

    Args:
        store: where large payloads go; `None`: every payload in the history.
        threshold: the size (bytes, after encryption) from which a payload goes to `store`.
        encryption: encrypt every payload (and failure messages) with these keys: `EncryptionKeys`, a key file or
            inline `id:base64key` entries (docs/operations.md#encrypting-histories). `None`: no encryption (this
            builder reads no environment; `connect()` and `create_worker()` read `CODEMODE_ENCRYPTION_KEYS`).

    Temporal encrypts first and then offloads, so a stored payload is encrypted before it leaves the process.
    `store=None, encryption=None`: the plain converter (`DATA_CONVERTER`).

    Raises:
        CodeModeUserError: a negative threshold, or keys that do not load.

    """
    keys = resolve_encryption(encryption or False)
    if store is None and keys is None:
        return DATA_CONVERTER
    if threshold < 0:
        raise CodeModeUserError(f"the payload threshold must be 0 or more bytes, got {threshold}")
    converter = DATA_CONVERTER if keys is None else with_encryption(DATA_CONVERTER, keys)
    if store is None:
        return converter
    return dataclasses.replace(
        converter, external_storage=ExternalStorage(drivers=[store], payload_size_threshold=threshold)
    )


def with_encryption(converter: DataConverter, keys: EncryptionKeys) -> DataConverter:
    """`converter` encrypting with `keys`: our codec, and failures' messages and stack traces encrypted too.

    Temporal's `DefaultFailureConverterWithEncodedAttributes` moves them into an encoded payload: a tool's error
    message may quote its arguments, and would otherwise stay plaintext in the history.
    """
    return dataclasses.replace(converter, payload_codec=EncryptionCodec(keys),
                               failure_converter_class=DefaultFailureConverterWithEncodedAttributes)


def store_from_env() -> StorageDriver | None:
    """The store `CODEMODE_PAYLOAD_STORE` names (`None` when it is unset).

    `s3://bucket/prefix`: an `S3PayloadStore` (the AWS settings from the environment); anything else: a
    `LocalPayloadStore` of that directory.

    Raises:
        CodeModeUserError: a URL of another scheme, or an s3:// URL without a bucket (named, with what to write),
            or an s3:// URL where aioboto3 is not installed.

    """
    value = os.environ.get(PAYLOAD_STORE_ENV, "").strip()
    if not value:
        return None
    if "://" in value:
        return S3PayloadStore.from_url(value)
    return LocalPayloadStore(value)


_REFERENCE_TYPE = ExternalStorageReference.DESCRIPTOR.full_name.encode()


async def resolve_history(history: WorkflowHistory, drivers: Sequence[StorageDriver]) -> WorkflowHistory:
    """Replace every external-storage reference in `history` by the payload it names (in place; returns it).

    The debugging tools read payloads straight from histories; after this they see the values, not references,
    and a resolved history replays without a store. One `retrieve` call per store for the whole history (an S3
    store opens one client for it).

    Raises:
        CodeModeUserError: a reference names a store not among `drivers` (the message says what to configure).
        PayloadStoreError: a store could not read a payload (`PayloadNotFoundError`, `PayloadStoreAccessError`).

    """
    by_name = {d.name(): d for d in drivers}
    converter = JSONProtoPayloadConverter()
    wanted: dict[str, list[tuple[Payload, StorageDriverClaim]]] = {}
    for event in history.events:
        for payload in payload_fields(event):
            if payload.metadata.get("messageType") != _REFERENCE_TYPE:
                continue
            ref = converter.from_payload(payload, ExternalStorageReference)
            if ref.driver_name not in by_name:
                where = ("to s3://BUCKET/PREFIX, with the AWS settings, for the S3 bucket"
                         if ref.driver_name == S3_DRIVER_NAME else "to the directory")
                raise CodeModeUserError(
                    f"the history refers to payloads in the store {ref.driver_name!r}, which is not configured here: "
                    f"set {PAYLOAD_STORE_ENV} {where} the run's workers wrote to (docs/operations.md#s3-for-a-cluster)"
                )
            claim = StorageDriverClaim(claim_data=dict(ref.claim_data))
            wanted.setdefault(ref.driver_name, []).append((payload, claim))
    for name, items in wanted.items():
        stored = await by_name[name].retrieve(StorageDriverRetrieveContext(), [claim for _, claim in items])
        for (payload, _), value in zip(items, stored, strict=True):
            payload.CopyFrom(value)
    return history


def env_stores() -> list[StorageDriver]:
    """The payload store `CODEMODE_PAYLOAD_STORE` names, as a list (empty when unset)."""
    store = store_from_env()
    return [store] if store else []


def stores_of(converter: DataConverter) -> list[StorageDriver]:
    """The payload stores a data converter reads from."""
    return list(converter.external_storage.drivers) if converter.external_storage else []
