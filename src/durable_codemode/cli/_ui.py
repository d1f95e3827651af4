"""`codemode ui`: the web page to watch runs live and decide their waiting calls."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from .._encryption import ENCRYPTION_KEYS_ENV, EncryptionKeys
from .._outcome import EXIT_OK
from ..client._connect import connect
from ..client._signer import ApprovalSigner
from ..shared._errors import CodeModeUserError
from ..ui import UIAccess, serve_ui
from ..ui._codec_server import CODEC_TOKEN_ENV, codec_server_app, serve_codec_server
from ..ui._serve import is_loopback
from ._output import say, server_address

__all__ = ["codec_server_command", "ui_access", "ui_command"]


def ui_access(key: str | None, approver: str | None) -> UIAccess:
    """Who the page decides as: `--key FILE` (signed), `--approver NAME` (unsigned), or nobody (read-only)."""
    if key and approver:
        raise CodeModeUserError("give --key (decide as the key's approver, signed) or --approver (unsigned), not both")
    if key:
        return UIAccess(signer=ApprovalSigner.load(key))
    return UIAccess(approver=approver) if approver else UIAccess()


def describe(access: UIAccess) -> str:
    if access.signer is not None:
        return f"decisions signed as {access.signer.approver} (key {access.signer.key_id})"
    if access.approver:
        return f"decisions unsigned, as {access.approver} (workers that take unsigned decisions only)"
    return "read-only (--key FILE or --approver NAME to decide)"


async def serve_until_stopped(client: object, **options: object) -> None:
    """Serve the page until Ctrl-C or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(serve_ui(client, **options))  # type: ignore[arg-type]
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        serving.result()  # what stopped it
    serving.cancel()
    stopped.cancel()


async def ui_command(args: argparse.Namespace) -> int:
    access = ui_access(args.key, args.approver)
    client = await connect()
    say(f"codemode ui for {server_address(client)}: {describe(access)}; Ctrl-C stops it")
    await serve_until_stopped(client, host=args.host, port=args.port, access=access, allow_remote=args.allow_remote,
                              announce=lambda url: say(f"open {url}"))
    return EXIT_OK


async def codec_server_command(args: argparse.Namespace) -> int:
    keys = EncryptionKeys.from_env()
    if keys is None:
        raise CodeModeUserError(f"the codec server decrypts with {ENCRYPTION_KEYS_ENV}, which is not set: point it at "
                                "the workers' key file (docs/operations.md#encrypting-histories)")
    token = os.environ.get(CODEC_TOKEN_ENV) or None
    if not is_loopback(args.host):
        if not args.allow_remote:
            raise CodeModeUserError(f"the codec server decrypts run payloads for whoever reaches it: it binds to "
                                    f"loopback only; to serve it on {args.host!r} pass --allow-remote, set "
                                    f"{CODEC_TOKEN_ENV}, and put it behind TLS")
        if token is None:
            raise CodeModeUserError(f"beyond loopback the codec server needs a bearer token: set {CODEC_TOKEN_ENV}")
    origins = args.origin or ["http://localhost:8233", "http://127.0.0.1:8233"]
    app = codec_server_app(keys, origins=origins, token=token, namespaces=args.namespace or None)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(serve_codec_server(app, host=args.host, port=args.port, announce=lambda url: say(
        f"codec server on {url} (keys {', '.join(keys.ids)}; UI origins {', '.join(origins)}; "
        f"{'bearer token required' if token else 'no token'}). In the Temporal UI: Settings > Codec Server > "
        f"{url}; with the CLI: temporal workflow show --codec-endpoint {url} ...; Ctrl-C stops it")))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        serving.result()
    serving.cancel()
    stopped.cancel()
    return EXIT_OK
