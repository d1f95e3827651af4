"""A filesystem per run: its configuration (`RunFiles`) and the forms it is recorded and carried in.

Programs read and write files with `pathlib.Path` and the `open` builtin under `FILES_ROOT`. The files are
plain data in workflow state (`workflow/_files.py` answers each file call from it), so what one snippet writes
the next reads, and a replay, given the same answers, rebuilds them exactly. They belong to the run, not to its REPL: a
`restart` keeps them, and they are carried across continue-as-new (`CarriedFiles`).

The author may seed a read-only folder from the worker's disk (`RunFiles.seed_from`): it is read by the
describe activity when the run starts and recorded in the spec (`FilesSpec.seed`), never read by workflow code.
"""

from __future__ import annotations

import base64
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import CodeModeUserError

__all__ = ["FILES_ROOT", "CarriedFiles", "FilesSpec", "RunFiles", "decode_contents", "encode_contents"]

FILES_ROOT = "/files"
"""Where a run's files live in the sandbox, and each snippet's working directory (relative paths start here)."""

DEFAULT_MAX_BYTES = 1024 * 1024
"""Total size of a run's files by default: 1 MiB, seeded files included."""

CARRY_WITHOUT_STORE_BYTES = 512 * 1024
"""Bytes of files (seeded and written) a run may record and carry across continue-as-new without a payload store:
base64 makes them a third larger, and they share Temporal's 2 MiB payload limit with the conversation. Over it,
the workers need a payload store (`CODEMODE_PAYLOAD_STORE`): a bigger seed is refused when the run starts, and
written files past it are not carried (the model is told)."""


@dataclass(frozen=True, kw_only=True)
class RunFiles:
    """Give the agent's programs a filesystem of their own, per run: `pathlib.Path` and `open` under `/files`.

    Programs often need scratch space that outlives one `run_code` call (a CSV built in one snippet, filtered
    in the next) or reference files the author supplies (a price list, templates). Keeping those in variables
    is lost on `restart` and cannot be read with ordinary file code; a real disk would not replay. These files
    are in-memory data of the run: deterministic, replayed exactly, carried across continue-as-new.

    Example:
        ```python
        CodeModeAgent(agent, files=RunFiles(max_bytes=2_000_000, seed_from=Path("reference")))
        ```

    In the program, relative paths start at `/files`; `/files/seed/...` holds the seeded folder, read-only.
    Paths outside `/files` raise `PermissionError`, a write past `max_bytes` raises `OSError`.

    """

    max_bytes: int = DEFAULT_MAX_BYTES
    """The most the run's files may hold in all (bytes of content, seeded files included). Without a payload store
    on the workers, a run records at most 512 KiB of seeded files, and carries its files across continue-as-new
    only while they hold at most 512 KiB in all (`CARRY_WITHOUT_STORE_BYTES`)."""

    seed_from: Path | None = None
    """A folder on the worker whose files (recursively) the run starts with, read-only, under `seed_at`. Read
    when each run starts and recorded in its history, so later edits to the folder never change a run."""

    seed_at: str = "seed"
    """Where under `/files` the seeded folder appears (a relative path)."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            problems.append(f"max_bytes must be a positive int (bytes), got {self.max_bytes!r}")
        if self.seed_from is not None and not isinstance(self.seed_from, Path):
            object.__setattr__(self, "seed_from", Path(self.seed_from))
        at = self.seed_at
        if not at or at.startswith("/") or posixpath.normpath(at) != at or at.split("/")[0] == "..":
            problems.append(f"seed_at must be a plain relative path under {FILES_ROOT} such as 'seed' or "
                            f"'docs/ref', got {at!r}")
        if problems:
            raise CodeModeUserError("RunFiles: " + "; ".join(problems))

    @property
    def seed_root(self) -> str:
        """The seeded folder's path in the sandbox."""
        return f"{FILES_ROOT}/{self.seed_at}"


@dataclass(kw_only=True)
class FilesSpec:
    """A run's filesystem as it records it when it starts (`AgentSpec.files`)."""

    max_bytes: int
    seed_root: str | None = None
    """The read-only seeded folder's path in the sandbox; `None`: nothing was seeded."""
    seed: dict[str, str] = field(default_factory=dict)
    """The seeded files, by path in the sandbox, content base64 (`encode_contents`)."""

    @property
    def seeded_bytes(self) -> int:
        """Bytes of content of the seeded files."""
        return sum(len(data) for data in decode_contents(self.seed).values())


@dataclass(kw_only=True)
class CarriedFiles:
    """A run's written files in transit between two runs of a continue-as-new chain (seeded ones are in the spec)."""

    files: dict[str, str] = field(default_factory=dict)
    """By path in the sandbox, content base64."""
    dirs: list[str] = field(default_factory=list)
    """Directories the programs made (empty ones included)."""


def encode_contents(files: dict[str, bytes]) -> dict[str, str]:
    """File contents as base64 text, for JSON payloads."""
    return {path: base64.b64encode(data).decode() for path, data in files.items()}


def decode_contents(files: dict[str, str]) -> dict[str, bytes]:
    """The contents `encode_contents` wrote."""
    return {path: base64.b64decode(text) for path, text in files.items()}
