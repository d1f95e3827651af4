"""The model's view of code mode: Python stubs generated from the tools' schemas, and the `run_code` tool.

pydantic-ai's `FunctionSignature` renders a tool definition as an `async def` with `TypedDict`s for its
structured arguments and return value; the same stubs type-check the model's snippets in the sandbox, so what
the model reads and what the checker enforces cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_ai.function_signature import FunctionSignature
from pydantic_ai.tools import ToolDefinition

from ._config import SnippetLimits
from ._files import FILES_ROOT, FilesSpec
from ._names import RUN_CODE_TOOL

__all__ = ["FILES_PRELUDE", "TYPE_CHECK_PRELUDE", "render_stubs", "run_code_tool_definition"]

TYPE_CHECK_PRELUDE = """\
class PermissionError(OSError): ...
class FileNotFoundError(OSError): ...
class FileExistsError(OSError): ...
class ImportError(Exception): ...
class UnicodeDecodeError(ValueError): ...
"""
"""Builtin exceptions the sandbox raises at run time but its type checker (pydantic-monty 1.4.0) does not know:
without these, `except PermissionError:` (how a program catches a denied call) is rejected as an unresolved
name. Type checking only; the model never sees them."""

FILES_PRELUDE = """\
from typing import Any
def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any: ...  # determinism: ok (a stub)
"""
"""The `open` builtin for the type checker, in runs with files (`RunFiles`): pydantic-monty 1.4.0 runs it, but
its checker does not know the name. Only those runs get it, so older runs type-check their snippets as they did."""

_STUB_HEADER = "from typing import Any, Literal, NotRequired, TypedDict\n"

_RUN_CODE_SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "Python code to run. The last expression is the result."},
        "restart": {
            "type": "boolean",
            "default": False,
            "description": "Start a fresh REPL first: every variable, import and function defined so far is gone.",
        },
    },
    "required": ["code"],
    "additionalProperties": False,
}


def render_stubs(tools: Sequence[ToolDefinition]) -> str:
    """Stubs for `tools`: each type definition once, then one `async def` per tool with its docstring."""
    signatures = [t.function_signature for t in tools]
    conflicting = FunctionSignature.get_conflicting_type_names(signatures)
    parts = [_STUB_HEADER]
    parts += FunctionSignature.render_type_definitions(signatures, conflicting)
    parts += [
        t.render_signature("...", is_async=True, conflicting_type_names=conflicting) for t in tools
    ]
    return "\n\n".join(parts) + "\n"


def run_code_tool_definition(stubs: str, limits: SnippetLimits, *, files: FilesSpec | None = None) -> ToolDefinition:
    """The `run_code` tool: its description teaches the sandbox and lists the tools as stubs (and the files)."""
    files_line = "" if files is None else _files_line(files)
    unavailable = "network" if files is not None else "files, network"
    description = f"""\
Run a short Python program in a sandbox and get back its result. Use it to call the tools below: loop over \
pages, filter, compute, and call many tools at once with `asyncio.gather`, so that only the small final \
result comes back to you.

How it works:
- The tools are async functions: call them with keyword arguments and `await` them; \
`await asyncio.gather(*(get_x(id=i) for i in ids))` runs calls concurrently.
- This is a REPL: variables, imports and functions persist across `run_code` calls; `restart=true` starts fresh.
- The value of the last expression is returned, with anything you `print`; at most \
{limits.max_output_bytes // 1024} KiB, so return what you need (counts, ids, a summary), not raw data.
- A tool that fails raises an exception (ValueError, KeyError, PermissionError, ...) you can catch with \
try/except.
- Limits per program: {limits.max_tool_calls} tool calls, {limits.max_feed_seconds:g} s of compute, \
{limits.max_memory_bytes // (1024 * 1024)} MiB of memory.
- It is a subset of Python: functions, `async def`, comprehensions, f-strings, try/except, match, \
dataclasses, classes without inheritance. Modules: asyncio, json, re, math, datetime, collections, itertools, \
functools, decimal, hashlib, base64, csv, random, time. Not available: {unavailable}, other imports, class \
inheritance (so no custom exceptions), generators, `del`, `@property`, `async with`/`async for`, \
`asyncio.create_task`, `gather(return_exceptions=...)`.
{files_line}- The code is type-checked against the stubs first; a type or syntax error comes back to you to fix.

The tools:
```python
{stubs}```
"""
    return ToolDefinition(
        name=RUN_CODE_TOOL,
        description=description,
        parameters_json_schema=_RUN_CODE_SCHEMA,
    )


def _files_line(files: FilesSpec) -> str:
    n = len(files.seed)
    seeded = (f" {files.seed_root} holds {n} file{'s' if n != 1 else ''} given to you, read-only."
              if files.seed_root else "")
    return (f"- Files: this run has its own files under {FILES_ROOT} (the working directory): `pathlib.Path` "
            "(read_text, write_text, read_bytes, write_bytes, exists, iterdir, glob, mkdir, unlink, stat) and "
            f"the `open` builtin in modes r, w, a (and rb, wb, ab). They persist across run_code calls, also after "
            f"restart; at most {files.max_bytes:,} bytes in all.{seeded}\n")
