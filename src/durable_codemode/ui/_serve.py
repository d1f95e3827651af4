"""Serving the web page: uvicorn on loopback, a fresh session token, its address printed."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import socket
from collections.abc import Callable

import uvicorn
from temporalio.client import Client

from ..shared._errors import CodeModeUserError
from ._app import UIAccess, ui_app

__all__ = ["DEFAULT_UI_PORT", "is_loopback", "serve_ui"]

DEFAULT_UI_PORT = 8181
"""Where `codemode ui` (and `codemode dev`) serve the page unless told otherwise."""


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve_ui(client: Client, *, host: str = "127.0.0.1", port: int = DEFAULT_UI_PORT,
                   access: UIAccess | None = None, allow_remote: bool = False, token: str | None = None,
                   announce: Callable[[str], None] = print, ready: asyncio.Event | None = None) -> None:
    """Serve the page (`ui_app`) until cancelled; `announce` gets the address to open, with its token.

    Args:
        client: from `durable_codemode.connect()`.
        host: the address to bind; anything but loopback needs `allow_remote` (the page decides as `access`).
        port: the port (0: any free one; the announced address says which).
        access: who decisions are made as; `None`: read-only.
        allow_remote: bind beyond loopback (then put the page behind TLS: the token travels in every request).
        token: the session token (default: a fresh random one).
        announce: how the address is told (default: printed).
        ready: set once the server listens.

    Raises:
        CodeModeUserError: a host beyond loopback without `allow_remote`, or a port taken.

    """
    if not is_loopback(host) and not allow_remote:
        raise CodeModeUserError(f"the page decides approvals as {access.name if access else 'nobody'}: it binds "
                                f"to loopback only; to serve it on {host!r} pass --allow-remote (allow_remote=True), "
                                "and put it behind TLS")
    token = token or secrets.token_urlsafe(24)
    if port == 0:
        port = _free_port(host)
    else:  # (uvicorn exits the process when it cannot bind: asked first, so the caller gets an error)
        try:
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
        except OSError as e:
            raise CodeModeUserError(f"the page cannot be served on {host}:{port}: {e.strerror or e} (another "
                                    "program has the port? choose another)") from e
    names = (f"{host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}") if not allow_remote else ()
    config = uvicorn.Config(ui_app(client, token=token, access=access, hosts=names), host=host, port=port,
                            log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise CodeModeUserError(f"the page could not be served on {host}:{port} (is the port taken? --port)")
        await asyncio.sleep(0.02)
    announce(f"http://{host}:{port}/?token={token}")
    if ready is not None:
        ready.set()
    try:
        await asyncio.shield(task)  # (a cancelled uvicorn leaves its socket open and connections hanging)
    finally:
        server.should_exit = True  # a graceful stop: the socket closes, open connections are answered or closed
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
