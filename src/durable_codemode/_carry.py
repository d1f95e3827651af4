"""Carrying a run's REPL across continue-as-new: a Monty session dump, sealed with the worker's key.

A long run continues as new between model turns (Temporal suggests it, or the run hit its snippet cap). Its
REPL's variables travel in the continue-as-new input as a Monty session dump. A dump is code and data that a
sandbox process will load, and anyone who can start a workflow can put bytes in that input, so a dump is only
loaded if it carries a valid seal: an HMAC-SHA256, under the worker's key, of the dump's digest and the Monty
version that wrote it. A dump that fails the check, or was written by another Monty version, is refused and the
REPL starts fresh, with a note telling the model.

Sealing and checking run in a local activity (`SEAL_REPL_ACTIVITY`), not in workflow code: the key stays on the
workers, the outcome is recorded in the history, and a replay needs neither the key nor the same Monty version
to reach the same decision.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from importlib.metadata import version

__all__ = [
    "REPL_KEY_ENV",
    "CarriedRepl",
    "SealRequest",
    "SealResult",
    "carry_refused_note",
    "monty_version",
    "repl_key_from_env",
    "seal",
]

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


@dataclass(kw_only=True)
class CarriedRepl:
    """A REPL in transit between two runs of a continue-as-new chain."""

    state: str
    """The Monty session dump, base64."""
    digest: str
    """SHA-256 of the dump (hex)."""
    monty_version: str
    """The pydantic-monty version that wrote it."""
    seal: str
    """`seal(key, digest, monty_version)` under the key of the worker that wrote it."""
    lenient_names: bool = False
    """The REPL's type checker no longer knows every name (see `_sandbox._real_type_errors`)."""

    @classmethod
    def of(cls, state: bytes, *, written_by: str, sealed: str, lenient_names: bool) -> CarriedRepl:
        """Wrap a dump and its seal."""
        return cls(state=base64.b64encode(state).decode(), digest=digest(state), monty_version=written_by,
                   seal=sealed, lenient_names=lenient_names)

    def dump(self) -> bytes:
        """The Monty session dump."""
        return base64.b64decode(self.state)


def digest(state: bytes) -> str:
    """SHA-256 of a dump (hex)."""
    return hashlib.sha256(state).hexdigest()


@dataclass(kw_only=True)
class SealRequest:
    """Input of the seal activity."""

    digest: str
    written_by: str | None = None
    """The Monty version that wrote the dump; `None`: this worker's (sealing a dump this process just made)."""


@dataclass(kw_only=True)
class SealResult:
    """Output of the seal activity."""

    seal: str | None
    """`None`: this worker has no REPL key, so REPLs are not carried."""
    monty_version: str
    """The worker's pydantic-monty version."""


def carry_refused_note(reason: str) -> str:
    """The model's note when a carried REPL is refused or cannot be carried."""
    return (
        f"[durable-codemode] This long run continued in a fresh workflow run and the run_code REPL was restarted "
        f"({reason}), so variables, imports and functions from earlier run_code calls are gone. Everything the "
        "tools did still holds."
    )
