"""What the commands print: every line through `printable`, so no run text can drive the terminal."""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

from temporalio.client import Client

from ..shared._results import printable

ADDRESS_ENV = "TEMPORAL_ADDRESS"


def err(message: str) -> None:
    # One line: an error may quote a run's text (a call id, a failure), whose newlines must not start lines of ours.
    print(f"codemode: {printable(message)}", file=sys.stderr, flush=True)


def say(message: str = "", *, out: TextIO | None = None) -> None:
    """Print `message`, its lines the command's own; what a terminal would act on is escaped (`printable`).

    Untrusted values in a line (names, notes, call ids, code) go through `printable` before they are put in it,
    so their own newlines are escaped too; this catches whatever else a line holds.
    """
    print(printable(message, lines=True), file=out or sys.stdout, flush=True)


def say_json(text: str, *, out: TextIO | None = None) -> None:
    """Print a JSON document, still valid JSON with the same value, with nothing a terminal would act on."""
    print(printable(text, json=True), file=out or sys.stdout, flush=True)


def tree_width() -> int:
    # Piped output (tests, logs) gets the fallback; never wider than a tree is pleasant to read.
    return min(shutil.get_terminal_size((100, 24)).columns, 140)


def server_address(client: Client) -> str:
    return client.service_client.config.target_host
