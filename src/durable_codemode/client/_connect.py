"""Connecting a client: where the server is and how to authenticate, from Temporal's own configuration.

Settings come from `temporalio.envconfig`, the same sources the `temporal` CLI and every Temporal SDK read, so
a machine set up for one is set up for all: the environment (`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`,
`TEMPORAL_API_KEY`, `TEMPORAL_TLS`, `TEMPORAL_TLS_CLIENT_CERT_PATH`, `TEMPORAL_TLS_CLIENT_KEY_PATH`,
`TEMPORAL_TLS_SERVER_CA_CERT_PATH`, `TEMPORAL_TLS_SERVER_NAME`, `TEMPORAL_GRPC_META_*`) over a profile
(`TEMPORAL_PROFILE`, default `default`) of the TOML file `TEMPORAL_CONFIG_FILE` (default
`~/.config/temporalio/temporal.toml`), over `localhost:7233` and namespace `default`. Arguments passed in code win
over all of them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client
from temporalio.converter import StorageDriver
from temporalio.envconfig import ClientConfig, ClientConnectConfig

from .._encryption import Encryption, resolve_encryption
from .._otel import client_interceptors
from .._storage import data_converter, store_from_env
from ..shared._errors import CodeModeUserError

__all__ = ["CONNECT_TIMEOUT_SECONDS", "DEFAULT_ADDRESS", "DEFAULT_NAMESPACE", "configured_address", "connect",
           "connect_failure_reason", "connect_settings"]

DEFAULT_ADDRESS = "localhost:7233"
"""Where a client connects when neither code, environment nor profile names a server."""

DEFAULT_NAMESPACE = "default"
"""The namespace used when none is configured (the dev server's and the compose file's)."""

CONNECT_TIMEOUT_SECONDS = 10.0
"""How long `connect()` waits for the server before giving up."""


def _load(profile: str | None) -> ClientConnectConfig:
    try:
        return ClientConfig.load_client_connect_config(profile)
    except FileNotFoundError as e:  # a TLS certificate or key path that names no file
        raise CodeModeUserError(
            f"a TLS file in the Temporal client configuration does not exist: {e.filename} (check "
            "TEMPORAL_TLS_*_PATH, or the tls section of your profile in TEMPORAL_CONFIG_FILE)") from e
    except Exception as e:  # temporalio's ConfigError (unknown profile, malformed TOML) and OSError
        raise CodeModeUserError(
            f"cannot load the Temporal client configuration: {e} (check TEMPORAL_PROFILE and "
            "TEMPORAL_CONFIG_FILE, default ~/.config/temporalio/temporal.toml)") from e


def configured_address(profile: str | None = None) -> str | None:
    """The server address the environment or the profile names, or `None` when neither does.

    Raises:
        CodeModeUserError: the configuration cannot be loaded (the message says which setting to fix).

    """
    return _load(profile).get("target_host")


def connect_settings(
    address: str | None = None, namespace: str | None = None, *, profile: str | None = None,
) -> ClientConnectConfig:
    """The keyword arguments for `Client.connect`: arguments, then environment, then profile, then defaults.

    Raises:
        CodeModeUserError: the configuration cannot be loaded (the message says which setting to fix).

    """
    settings = _load(profile)
    settings["target_host"] = address or settings.get("target_host") or DEFAULT_ADDRESS
    settings["namespace"] = namespace or settings.get("namespace") or DEFAULT_NAMESPACE
    return settings


async def connect(
    address: str | None = None, *, namespace: str | None = None, profile: str | None = None,
    payload_store: StorageDriver | None = None, encryption: Encryption = None, tracing: bool = False,
    **kwargs: Any,
) -> Client:
    """A client for durable-codemode runs, configured as the `temporal` CLI is (see the module docstring).

    Args:
        address: `host:port`; defaults to `TEMPORAL_ADDRESS`, then the profile's `address`, then `localhost:7233`.
        namespace: defaults to `TEMPORAL_NAMESPACE`, then the profile's `namespace`, then `default`.
        profile: the profile of the TOML configuration file; defaults to `TEMPORAL_PROFILE`, then `default`.
        payload_store: where payloads over 256 KiB go instead of the history (a `LocalPayloadStore`, or any
            Temporal `StorageDriver` such as S3's); defaults to `CODEMODE_PAYLOAD_STORE`, else none. Workers
            built on this client use it too; every client, worker and replayer of these runs needs the same.
        encryption: encrypt every payload this client and its workers write, and decrypt what they read: keys
            (`EncryptionKeys`), a key file, or inline `id:base64key` entries; the first key encrypts. `None`
            (default): `CODEMODE_ENCRYPTION_KEYS`, else no encryption; `False`: none, whatever the environment says.
            See docs/operations.md#encrypting-histories.
        tracing: add Temporal's OpenTelemetry interceptor: runs started inside a span are traced under it, and
            workers created from this client trace their runs. Needs `opentelemetry-sdk`.
        kwargs: passed to `Client.connect`, over the configured settings (e.g. `tls`, `api_key`, `rpc_metadata`).

    Raises:
        CodeModeUserError: the configuration cannot be loaded (Temporal's, or the encryption keys), or the server
            cannot be reached; the message names the address and what to do.

    """
    converter = data_converter(payload_store or store_from_env(), encryption=resolve_encryption(encryption))
    settings: dict[str, Any] = {**connect_settings(address, namespace, profile=profile), **kwargs}
    if tracing:
        settings["interceptors"] = [*settings.get("interceptors", ()), *client_interceptors()]
    target = settings["target_host"]
    try:
        # Bounded: an address that drops packets would otherwise keep a command waiting on the TCP connect.
        return await asyncio.wait_for(
            Client.connect(**settings, data_converter=converter),
            CONNECT_TIMEOUT_SECONDS)
    except (RuntimeError, ValueError, TimeoutError) as e:  # unreachable / refused, or a malformed address
        raise CodeModeUserError(
            f"cannot reach a Temporal server at {target} ({connect_failure_reason(e)}). Start one with `codemode "
            "dev` (embedded dev server and worker), or set TEMPORAL_ADDRESS to your server's host:port."
        ) from e


_REASONS = (
    ("Connection refused", "connection refused: nothing listens on that port"),
    ("dns error", "the host name does not resolve"),
    ("invalid target URL", "not a host:port address"),
    ("grpc-status header missing", "something answers there, but it is not a Temporal server"),
    ("Namespace", "the namespace does not exist (TEMPORAL_NAMESPACE)"),
    ("InvalidContentType", "TLS was asked for, but the server speaks plaintext: unset TEMPORAL_TLS (an API key "
                           "turns TLS on too)"),
    ("certificate", "the TLS handshake failed: check TEMPORAL_TLS_SERVER_CA_CERT_PATH and TEMPORAL_TLS_SERVER_NAME"),
    ("Unauthenticated", "the server refused the credentials: check TEMPORAL_API_KEY or the client certificate"),
)


def connect_failure_reason(error: BaseException) -> str:
    """A short reason for a failed connect, from the client's long transport error."""
    if isinstance(error, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT_SECONDS:g} s"
    text = str(error)
    for needle, reason in _REASONS:
        if needle.lower() in text.lower():
            return reason
    return text if len(text) <= 200 else text[:199] + "…"
