"""Carrying a run's REPL across continue-as-new: a Monty session dump, sealed with the worker's key.

A long run continues as new between model turns (Temporal suggests it, or the run hit its snippet cap). Its
REPL's variables travel in the continue-as-new input as a Monty session dump. A dump is code and data that a
sandbox process will load, and anyone who can start a workflow can put bytes in that input, so a dump is only
loaded if it carries a valid seal: an HMAC-SHA256, under the worker's key, of the dump's digest and the Monty
version that wrote it. A dump that fails the check, or was written by another Monty version, is refused and the
REPL starts fresh, with a note telling the model.

Sealing and checking run in a local activity (`SEAL_REPL_ACTIVITY`, `worker/_seal.py`), not in workflow code:
the key stays on the workers, the outcome is recorded in the history, and a replay needs neither the key nor the
same Monty version to reach the same decision.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

__all__ = ["CarriedRepl", "SealRequest", "SealResult", "carry_refused_note", "digest"]

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
    """The REPL's type checker no longer knows every name (see `_type_check.real_type_errors`)."""

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
