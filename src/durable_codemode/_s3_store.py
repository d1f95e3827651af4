"""S3 as the payload store of a cluster: Temporal's own `S3StorageDriver`, configured from `s3://bucket/prefix`.

`CODEMODE_PAYLOAD_STORE=s3://bucket/prefix` gives every client, worker, replayer and `codemode` command of ours an
`S3PayloadStore`: payloads of 256 KiB or more go to that bucket, under that prefix, and the history keeps a
reference. The rest comes from the usual AWS settings, read by boto3 when the store opens a client: credentials
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`, an instance or task role), the
region (`AWS_DEFAULT_REGION`, else `AWS_REGION`) and, for an S3-compatible server (MinIO, moto, R2),
`AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`).

What is Temporal's and what is ours:

- Keys, claims and the content check are `temporalio.contrib.aws.s3driver.S3StorageDriver`'s, unchanged, over
  Temporal's aioboto3 adapter: an object is `<prefix>/v0/ns/<namespace>/wt/<workflow type>/wi/<workflow id>/ri/<run
  id>/d/sha256/<digest>`, written once (a `HeadObject` first) and checked against its digest when read. A
  reference names its bucket and its whole key, so any process with read access resolves it, including a plain
  `S3StorageDriver` of the same name (`aws.s3driver`), whatever prefix it was given.
- Ours: the prefix (the driver has none: we add it to the keys it writes), an aioboto3 client opened for each
  store or retrieve call and closed after it (no client outlives its event loop, none crosses a fork, none is left
  for the garbage collector to close), and named errors: `PayloadNotFoundError` (the object is gone),
  `PayloadStoreAccessError` (credentials refused or missing), `PayloadStoreError` (anything else), each naming
  the object, the endpoint and what to do.

An error fails what needed the payload, which Temporal retries: a workflow task forever (the run waits until the
store answers), an activity within its retry policy. aioboto3 is the optional extra `s3`
(`pip install 'durable-codemode[s3]'`); without it, building the store says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

from temporalio.api.common.v1 import Payload
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.converter import (
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from .shared._errors import CodeModeUserError

if TYPE_CHECKING:
    import aioboto3
    from types_aiobotocore_s3.client import S3Client

__all__ = ["S3_DRIVER_NAME", "S3_URL_SCHEME", "PayloadNotFoundError", "PayloadStoreAccessError", "PayloadStoreError",
           "S3PayloadStore", "parse_s3_url"]

S3_URL_SCHEME = "s3"
"""`CODEMODE_PAYLOAD_STORE` naming an S3 bucket starts with `s3://`; anything else is a local directory."""

S3_DRIVER_NAME = "aws.s3driver"
"""The driver name in every reference (`S3StorageDriver`'s default): readers of a reference need a driver so named."""

_DOCS = "docs/operations.md#s3-for-a-cluster"
_INSTALL = "pip install 'durable-codemode[s3]'"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""S3's rule for bucket names (3-63 lowercase letters, digits, dots and hyphens)."""
_RETRIED = "the workflow task or activity that needs it fails and Temporal retries it"
_DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
           "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "InvalidClientTokenId"}
"""S3 error codes meaning the credentials were refused (a `HeadObject` refused carries only its status, `403`)."""


class PayloadStoreError(CodeModeUserError):
    """A payload store could not store or read a payload; the message names the object, the cause and the fix.

    It fails what needed the payload, never the run by itself: a workflow task is retried by Temporal until the
    store answers (the run waits), an activity within its retry policy; a client call raises it.
    """


class PayloadNotFoundError(PayloadStoreError):
    """A history refers to a payload its store does not hold: deleted (a lifecycle rule?), or another store.

    Put the object back (or point the process at the store the run's workers wrote to) and the retried workflow
    task goes on where it stopped.
    """


class PayloadStoreAccessError(PayloadStoreError):
    """The store refused the credentials, or found none: fix them and the retried task or activity goes on."""


def parse_s3_url(url: str) -> tuple[str, str]:
    """`(bucket, prefix)` of `s3://bucket/prefix` (the prefix without slashes at its ends; `""` for none).

    Raises:
        CodeModeUserError: another scheme, no bucket, a bucket name S3 refuses, or a query or fragment.

    """
    parts = urlsplit(url.strip())
    shown = f"CODEMODE_PAYLOAD_STORE={url!r}"
    if parts.scheme != S3_URL_SCHEME:
        raise CodeModeUserError(
            f"{shown} is neither a local directory nor an s3:// URL: payload stores are a directory on this host "
            f"(a path) or an S3 bucket (s3://bucket/prefix) ({_DOCS})")
    if not parts.netloc:
        raise CodeModeUserError(f"{shown} names no bucket: write s3://BUCKET or s3://BUCKET/PREFIX ({_DOCS})")
    if not _BUCKET.fullmatch(parts.netloc):
        raise CodeModeUserError(
            f"{shown}: {parts.netloc!r} is not an S3 bucket name (3 to 63 lowercase letters, digits, dots and "
            f"hyphens, starting and ending with a letter or a digit); write s3://BUCKET/PREFIX ({_DOCS})")
    if parts.query or parts.fragment:
        raise CodeModeUserError(f"{shown} has a query or a fragment, which an s3:// URL does not take: the endpoint, "
                                f"region and credentials come from the AWS settings (AWS_ENDPOINT_URL, ...; {_DOCS})")
    return parts.netloc, parts.path.strip("/")


class S3PayloadStore(StorageDriver):
    """Large payloads in an S3 bucket (or an S3-compatible server), shared by every host of a cluster.

    Temporal's `S3StorageDriver` does the work (keys, claims, content checks); this adds a key prefix, opens its
    aioboto3 client per call, and names its errors (`PayloadNotFoundError`, `PayloadStoreAccessError`).

    Example:
        ```python
        store = S3PayloadStore.from_url("s3://acme-temporal/codemode")  # AWS settings from the environment
        client = await connect(payload_store=store)  # workers built on this client use it too
        ```

    """

    def __init__(self, bucket: str, *, prefix: str = "", endpoint_url: str | None = None,
                 region: str | None = None, session: aioboto3.Session | None = None,
                 driver_name: str = S3_DRIVER_NAME, max_payload_size: int = 50 * 1024 * 1024) -> None:
        """Store payloads in `bucket` under `prefix`.

        Args:
            bucket: an existing bucket (the store does not create it).
            prefix: the start of every key written (slashes at its ends are dropped); `""`: none. Readers need not
                know it: each reference holds its whole key.
            endpoint_url: an S3-compatible server's URL; `None`: `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` if
                set, else AWS's own endpoint for the region.
            region: `None`: `AWS_DEFAULT_REGION`, else `AWS_REGION`, else the AWS configuration file's.
            session: the aioboto3 session whose credentials sign the requests; `None`: one made on first use, with
                boto3's usual credential chain (the environment, `AWS_PROFILE`, an instance or task role).
            driver_name: the name written into references; keep `aws.s3driver` (the `S3StorageDriver` default)
                unless several stores are configured at once.
            max_payload_size: the largest payload (bytes) the store takes; 50 MiB by default.

        Raises:
            CodeModeUserError: aioboto3 is not installed (the message says how to install it), or the bucket name
                is not one S3 takes.

        """
        try:
            import aioboto3  # noqa: F401  (checked now, so a missing extra is told when the store is built)
            from temporalio.contrib.aws.s3driver.aioboto3 import new_aioboto3_client  # noqa: F401
        except ImportError as e:
            raise CodeModeUserError(
                f"the S3 payload store (s3://{bucket}) needs aioboto3, which is not installed here ({e}): "
                f"{_INSTALL}") from e
        if not _BUCKET.fullmatch(bucket):
            raise CodeModeUserError(f"{bucket!r} is not an S3 bucket name (3 to 63 lowercase letters, digits, dots "
                                    f"and hyphens) ({_DOCS})")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self._session = session
        self._driver_name = driver_name
        self._max_payload_size = max_payload_size

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3PayloadStore:
        """The store `s3://bucket/prefix` names; `options` as for the constructor.

        Raises:
            CodeModeUserError: a malformed URL (named, with what to write), or aioboto3 is missing.

        """
        bucket, prefix = parse_s3_url(url)
        return cls(bucket, prefix=prefix, **options)

    def __repr__(self) -> str:
        where = f", endpoint_url={self.endpoint_url!r}" if self.endpoint_url else ""
        return f"S3PayloadStore('s3://{self.bucket}/{self.prefix}'{where})"

    def name(self) -> str:
        """The driver name recorded in references."""
        return self._driver_name

    def type(self) -> str:
        """`S3StorageDriver`'s type: references written here and by it are the same."""
        return "aws.s3driver"

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        """Write each payload (unless already there) and claim it by bucket and whole key.

        Raises:
            PayloadStoreAccessError: the credentials were refused or missing.
            PayloadStoreError: the bucket is missing, the server unreachable, a payload over `max_payload_size`.

        """
        async with self._objects() as objects:
            try:
                claims = await self._driver(objects).store(context, payloads)
            except (RuntimeError, ValueError) as e:
                _raise_named(e, "store")
        # The driver wrote under `prefix` (`_Objects` adds it); the claims say where, so readers need no prefix.
        return [StorageDriverClaim(claim_data={**c.claim_data, "key": objects.full_key(c.claim_data["key"])})
                for c in claims]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        """Read each claimed payload back, checked against its SHA-256.

        Raises:
            PayloadNotFoundError: an object is not in its bucket.
            PayloadStoreAccessError: the credentials were refused or missing.
            PayloadStoreError: anything else (an unreachable server, an object that does not match its digest).

        """
        async with self._objects() as objects:
            try:
                return await self._driver(objects).retrieve(context, claims)
            except (RuntimeError, ValueError) as e:
                _raise_named(e, "retrieve")

    def _driver(self, objects: _Objects) -> S3StorageDriver:
        return S3StorageDriver(client=objects, bucket=self.bucket, driver_name=self._driver_name,
                               max_payload_size=self._max_payload_size)

    @asynccontextmanager
    async def _objects(self) -> AsyncIterator[_Objects]:
        """An aioboto3 client for one call, closed after it (opening one costs ~45 ms of CPU, measured quiet)."""
        import aioboto3
        from temporalio.contrib.aws.s3driver.aioboto3 import new_aioboto3_client

        if self._session is None:
            self._session = aioboto3.Session()
        region = self.region or os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or None
        async with self._session.client("s3", endpoint_url=self.endpoint_url, region_name=region) as s3:
            yield _Objects(new_aioboto3_client(s3), s3, self.prefix)


class _Objects(S3StorageDriverClient):
    """Temporal's aioboto3 adapter, writing under a prefix and naming each failure with its object and endpoint.

    Writes (`put_object`, `object_exists`) take the driver's key and add the prefix; reads (`get_object`) take the
    whole key a claim holds (`S3PayloadStore.store` rewrites the claims), so a reference is read the same way
    whatever prefix the reader was given.
    """

    def __init__(self, inner: S3StorageDriverClient, s3: S3Client, prefix: str) -> None:
        self._inner = inner
        self._endpoint = s3.meta.endpoint_url
        self._prefix = prefix

    def full_key(self, key: str) -> str:
        return f"{self._prefix}/{key}" if self._prefix else key

    def describe(self) -> dict[str, str]:
        return {**self._inner.describe(), "endpoint": self._endpoint}

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        full = self.full_key(key)
        try:
            await self._inner.put_object(bucket=bucket, key=full, data=data)
        except Exception as e:
            raise _named(e, "write", bucket, full, self._endpoint) from e

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        full = self.full_key(key)
        try:
            return await self._inner.object_exists(bucket=bucket, key=full)
        except Exception as e:
            raise _named(e, "write", bucket, full, self._endpoint) from e

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        try:
            return await self._inner.get_object(bucket=bucket, key=key)
        except Exception as e:
            raise _named(e, "read", bucket, key, self._endpoint) from e


def _raise_named(error: RuntimeError | ValueError, call: str) -> NoReturn:
    """Raise the named error `_Objects` gave (the driver wraps it in a `RuntimeError`), else a `PayloadStoreError`."""
    cause = error.__cause__
    if isinstance(cause, PayloadStoreError):
        raise cause from cause.__cause__
    # The driver's own refusals: a payload over its size limit (store), an object not matching its digest (read).
    raise PayloadStoreError(f"the S3 payload store could not {call} a payload: {error}") from error


def _named(error: Exception, action: str, bucket: str, key: str, endpoint: str) -> PayloadStoreError:
    """The named error for `error`, raised by S3 (or botocore) while trying to `action` s3://bucket/key."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, PartialCredentialsError

    where = f"s3://{bucket}/{key} (at {endpoint})"
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        code = str(details.get("Code", "?"))
        said = f"{code}: {details.get('Message') or 'no message'}"
        if code in ("NoSuchKey", "404") and action == "read":
            return PayloadNotFoundError(
                f"payload {where} is not in the payload store ({said}): it was deleted (by a lifecycle rule that "
                "expires objects while runs or histories still refer to them?), or this process reads another "
                "store than the run's workers wrote to. Put the object back, or point CODEMODE_PAYLOAD_STORE and "
                f"AWS_ENDPOINT_URL at the store the run used; meanwhile {_RETRIED} ({_DOCS})")
        if code == "NoSuchBucket":
            return PayloadStoreError(
                f"cannot {action} payload {where}: the bucket {bucket!r} does not exist ({said}). Create it (the store "
                f"does not), or fix the bucket in CODEMODE_PAYLOAD_STORE; meanwhile {_RETRIED} ({_DOCS})")
        if code in _DENIED:
            bare = " (a refused HeadObject says only 403: without s3:ListBucket, S3 answers 403 for a missing object)"
            return PayloadStoreAccessError(
                f"the S3 payload store refused to let this process {action} payload {where} ({said}"
                f"{bare if code == '403' else ''}): check the credentials (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, or AWS_PROFILE) and that they allow s3:GetObject, "
                f"s3:PutObject and s3:ListBucket on bucket {bucket!r}; meanwhile {_RETRIED} ({_DOCS})")
        return PayloadStoreError(f"cannot {action} payload {where}: S3 answered {said}; meanwhile {_RETRIED}")
    if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        return PayloadStoreAccessError(
            f"cannot {action} payload {where}: no AWS credentials found ({error}). Set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or give the host a role); meanwhile {_RETRIED} ({_DOCS})")
    if isinstance(error, EndpointConnectionError):
        return PayloadStoreError(
            f"cannot {action} payload {where}: the S3 endpoint does not answer ({error}). Check AWS_ENDPOINT_URL "
            f"(an S3-compatible server) or the region and the network; meanwhile {_RETRIED}")
    return PayloadStoreError(f"cannot {action} payload {where}: {type(error).__name__}: {error}; meanwhile {_RETRIED}")
