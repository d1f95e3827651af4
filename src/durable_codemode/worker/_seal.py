"""The worker's half of carrying a REPL: its key, and the seal (an HMAC) it puts on a dump.

Only workers hold the key (`CODEMODE_REPL_KEY`); the seal activity runs here and its outcome is recorded, so
workflow code and replays never see the key (`durable_codemode.shared._carry` says why a dump is sealed).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from importlib.metadata import version

__all__ = ["REPL_KEY_ENV", "monty_version", "repl_key_from_env", "seal"]

REPL_KEY_ENV = "CODEMODE_REPL_KEY"
"""The worker's REPL key (any string; 32+ random characters). Every worker of a task queue needs the same one."""


def repl_key_from_env() -> bytes | None:
    """`CODEMODE_REPL_KEY` as bytes, or `None` when unset or empty."""
    value = os.environ.get(REPL_KEY_ENV, "")
    return value.encode() if value else None


def monty_version() -> str:
    """The installed pydantic-monty version: a dump loads only into the version that wrote it."""
    return version("pydantic-monty")


def seal(key: bytes, digest: str, written_by: str) -> str:
    """The seal of a dump: HMAC-SHA256 under `key` of the Monty version and the dump's SHA-256."""
    return hmac.new(key, f"durable-codemode repl v1\n{written_by}\n{digest}".encode(), hashlib.sha256).hexdigest()
