"""What a program's OS calls are answered with in workflow code (sleeps aside: they wait, so the driver has them).

Clock reads answer the program's clock (`workflow.now()` as of its last wait), `os.urandom` draws from
`workflow.random()`, environment reads see only the recorded allow-list, file calls are answered from the run's own
files (`_files.RunFilesystem`) or refused when the run has none, and imports of modules Monty does not have are
refused with what a program may import instead. This module runs in workflow code.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporalio import workflow

from ._files import FILE_FUNCTIONS, RunFilesystem
from ._sandbox_types import Settled

__all__ = ["os_call_answer"]

_FILE_FUNCTIONS_MESSAGE = "run_code has no file system or network; use the tools to read and change data"
_IMPORTS_MESSAGE = (
    "run_code programs have no processes, files or network; they can import asyncio, json, re, math, datetime, "
    "time, random, collections, itertools, functools, decimal, hashlib, base64, csv, typing, and os for getenv; "
    "use the tools for everything else"
)


def os_call_answer(name: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None, *, now: datetime,
                   env: dict[str, str], files: RunFilesystem | None) -> Settled:
    """The answer to the OS call `name` (not a sleep): the same, live and on replay.

    `now` is the program's clock: `workflow.now()` as of its last wait (see `_snippet_driver`).
    """
    if name == "datetime.now":
        tz = args[0] if args else None
        value: Any = now.astimezone(tz) if tz is not None else now.replace(tzinfo=None)
        return {"return_value": value}
    if name == "date.today":
        return {"return_value": now.date()}
    if name == "time.time":
        return {"return_value": now.timestamp()}
    if name == "os.getenv":
        key = args[0] if args else None
        default = args[1] if len(args) > 1 else None
        return {"return_value": env.get(str(key), default)}
    if name == "os.environ":
        return {"return_value": dict(env)}
    if name == "os.urandom":
        n = min(int(args[0]) if args else 0, 1 << 20)
        return {"return_value": workflow.random().randbytes(n)}
    if name in ("import_stubs", "import"):
        modules = args[0] if args and isinstance(args[0], list) else list(args)
        return {"exc_type": "ModuleNotFoundError", "message": f"No module named "
                f"{', '.join(repr(m) for m in modules) or '?'}: {_IMPORTS_MESSAGE}"}
    if name in FILE_FUNCTIONS and files is not None:  # a pure function of the run's files: the same answers on replay
        return files.answer(name, args, dict(kwargs or {}))
    return {"exc_type": "PermissionError", "message": f"{name}: {_FILE_FUNCTIONS_MESSAGE}"}
