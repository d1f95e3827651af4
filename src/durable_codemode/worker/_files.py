"""Reading the folder an agent's author seeds each run's files from (`RunFiles.seed_from`), on the worker.

It runs in the describe activity when a run starts, and what it read is recorded in the run's spec
(`FilesSpec.seed`): workflow code never touches the disk, and a replay, or a later edit of the folder, cannot
change what the run's programs saw.
"""

from __future__ import annotations

from pathlib import Path

from ..shared._errors import CodeModeUserError
from ..shared._files import FilesSpec, RunFiles, encode_contents

__all__ = ["files_spec"]


def files_spec(agent: str, files: RunFiles) -> FilesSpec:
    """The run's filesystem as recorded: its limit, and the seeded folder's files (read now).

    Raises:
        CodeModeUserError: the seed folder is missing or not a folder, or its files are over `max_bytes` (the
            run fails at its first step, not retried).

    """
    if files.seed_from is None:
        return FilesSpec(max_bytes=files.max_bytes)
    folder = files.seed_from
    if not folder.is_dir():
        raise CodeModeUserError(f"agent {agent!r}: RunFiles(seed_from={str(folder)!r}) is not a folder on this worker "
                                f"(cwd {Path.cwd()}); point seed_from at an existing folder, or drop it")
    seed: dict[str, bytes] = {}
    total = 0
    # Regular files only, links not followed out of the folder: the seed is what the author put there.
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        data = path.read_bytes()
        total += len(data)
        if total > files.max_bytes:
            raise CodeModeUserError(
                f"agent {agent!r}: the seed folder {str(folder)!r} holds more than RunFiles.max_bytes "
                f"({files.max_bytes:,} bytes) of files (reached at {str(path.relative_to(folder))!r}); raise max_bytes "
                "or seed fewer files")
        seed[f"{files.seed_root}/{path.relative_to(folder).as_posix()}"] = data
    return FilesSpec(max_bytes=files.max_bytes, seed_root=files.seed_root, seed=encode_contents(seed))
