"""The model's view of code mode: Python stubs generated from the tools' schemas, and the `run_code` tool.

pydantic-ai's `FunctionSignature` renders a tool definition as an `async def` with `TypedDict`s for its
structured arguments and return value; the same stubs type-check the model's snippets in the sandbox, so what
the model reads and what the checker enforces cannot drift apart.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from pydantic_ai.function_signature import FunctionSignature
from pydantic_ai.tools import ToolDefinition

from ..shared._config import SnippetLimits
from ..shared._files import FILES_ROOT, FilesSpec
from ..shared._names import RUN_CODE_TOOL
from ._catalog import SEARCH_LIMIT_DEFAULT, SEARCH_LIMIT_MAX

__all__ = [
    "CATALOG_PRELUDE",
    "FILES_PRELUDE",
    "TYPE_CHECK_PRELUDE",
    "deferred_section",
    "estimate_tokens",
    "index_section",
    "render_stubs",
    "render_tool_stubs",
    "run_code_tool_definition",
    "stubs_of",
    "tool_summary",
]

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
CATALOG_PRELUDE = f"""
def search_tools(query: str, limit: int = {SEARCH_LIMIT_DEFAULT}) -> list[dict[str, str]]: ...
def describe_tool(name: str) -> str: ...
"""
"""The stubs of the two catalog functions (`_catalog`), type-checked in runs whose description carries the
index (`AgentSpec.catalog`). Plain `def`s: workflow code answers them at once, so a program calls them without
`await`. Appended after the tools' stubs, which import what the annotations need."""

SUMMARY_MAX_CHARS = 100
"""The longest summary of a tool (the first line of its docstring) in the index and in `search_tools` results."""

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
    return render_tool_stubs(tools)[0]


def render_tool_stubs(tools: Sequence[ToolDefinition]) -> tuple[str, list[tuple[list[str], str]]]:
    """The stubs of `tools` (as `render_stubs`), and each tool's own: the type definitions it uses, and its `def`.

    Both come from one resolution of clashing type names, so a type in a tool's own stub has the name the type
    checker knows it by (e.g. `get_user_Address`).
    """
    signatures = [t.function_signature for t in tools]
    conflicting = FunctionSignature.get_conflicting_type_names(signatures)
    functions = [t.render_signature("...", is_async=True, conflicting_type_names=conflicting) for t in tools]
    parts = [_STUB_HEADER, *FunctionSignature.render_type_definitions(signatures, conflicting), *functions]
    own = [(FunctionSignature.render_type_definitions([signature], conflicting), function)
           for signature, function in zip(signatures, functions, strict=True)]
    return "\n\n".join(parts) + "\n", own


def stubs_of(own: Sequence[tuple[list[str], str]]) -> str:
    """The stubs of some of the tools `render_tool_stubs` rendered, from their own stubs: each type once.

    So a part of a catalog reads the type names the type checker knows (from the stubs of all of them).
    """
    definitions = list(dict.fromkeys(d for definitions, _function in own for d in definitions))
    return "\n\n".join([_STUB_HEADER, *definitions, *(function for _definitions, function in own)]) + "\n"


def estimate_tokens(text: str) -> int:
    """Roughly how many tokens `text` takes for a model: characters / 4 (the usual ratio for English and code)."""
    return (len(text) + 3) // 4


def tool_summary(tool: ToolDefinition) -> str:
    """The first line of `tool`'s docstring, at most `SUMMARY_MAX_CHARS` characters (`''` without a docstring)."""
    line = next((ln.strip() for ln in (tool.description or "").splitlines() if ln.strip()), "")
    return line if len(line) <= SUMMARY_MAX_CHARS else line[: SUMMARY_MAX_CHARS - 1].rstrip() + "\u2026"


def _index_lines(index: Sequence[tuple[str, str]], *, summaries: bool) -> str:
    if summaries:
        return "\n".join(f"- {name}: {summary}" if summary else f"- {name}" for name, summary in index)
    return textwrap.fill(", ".join(name for name, _summary in index), width=120, break_long_words=False,
                         break_on_hyphens=False)


def index_section(index: Sequence[tuple[str, str]], *, summaries: bool = True) -> str:
    """The tools part of the `run_code` description for a large catalog: the index and the catalog functions.

    `summaries`: one line per tool, its name and the first line of its docstring; else only the names, comma
    separated (for catalogs whose index with summaries would itself be over the budget).
    """
    listed = ("so each line below is a tool's name and the first line of its docstring" if summaries else
              "so only their names are listed below (search_tools gives each one's summary)")
    return f"""\
The tools: there are {len(index)}, too many to show in full, {listed}. Two plain functions (call them without \
`await`) tell you more:
- `search_tools(query: str, limit: int = {SEARCH_LIMIT_DEFAULT}) -> list[dict[str, str]]`: the tools whose \
names, docstrings and parameters best match the words of `query`, best first, as \
`{{"name": ..., "summary": ...}}`; at most {SEARCH_LIMIT_MAX} (`limit`).
- `describe_tool(name: str) -> str`: the tool's full stub (its signature, docstring and argument and result \
types); an unknown name raises KeyError naming close matches.
Every tool below can be called as an async function, and calls are type-checked against the full stubs: print \
`describe_tool(name)` for the tools you need in one run_code call, then call them in the next.
{_index_lines(index, summaries=summaries)}
"""


def deferred_section(deferred: int, *, shown: bool) -> str:
    """The tools part of the `run_code` description that tells of `deferred` tools it does not show.

    For tools with pydantic-ai's `defer_loading=True` (in a run that shows the others' stubs): as pydantic-ai's
    `ToolSearch` hides them from the model until a search finds them, the description names none of them, and
    programs find them with the catalog functions, answered from the run's recorded catalog of its tools.
    `shown`: whether the description lists other tools' stubs before this section.
    """
    plural = "s are" if deferred != 1 else " is"
    return f"""\
{deferred} {'more ' if shown else ''}tool{plural} not listed here. Two plain functions (call them without \
`await`) find them:
- `search_tools(query: str, limit: int = {SEARCH_LIMIT_DEFAULT}) -> list[dict[str, str]]`: the tools whose \
names, docstrings and parameters best match the words of `query`, best first, as \
`{{"name": ..., "summary": ...}}`; at most {SEARCH_LIMIT_MAX} (`limit`).
- `describe_tool(name: str) -> str`: a tool's full stub; an unknown name raises KeyError naming close matches.
A tool they find is called as an async function, with keyword arguments and `await`, type-checked against its \
stub: print `describe_tool(name)` in one run_code call, then call the tool in the next.
"""


def run_code_tool_definition(stubs: str, limits: SnippetLimits, index: str | None = None, *,
                             files: FilesSpec | None = None, deferred: str | None = None) -> ToolDefinition:
    """The `run_code` tool: its description teaches the sandbox and lists the tools (and the files).

    As stubs; or, for a large catalog (`CatalogSettings`), as its `index` (`index_section`). `deferred`
    (`deferred_section`) follows the stubs when some tools are only found by search (`defer_loading=True`).
    """
    tools = f"The tools:\n```python\n{stubs}```\n" if index is None else index
    if deferred is not None:  # after the stubs of the tools it shows, if any
        tools = (tools if stubs else "") + deferred
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

{tools}"""
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
