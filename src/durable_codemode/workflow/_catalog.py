"""A large tool catalog, searched from inside the sandbox: `search_tools(query)` and `describe_tool(name)`.

When an agent's sandbox tools pass its `CatalogSettings`, the `run_code` description lists one line per tool
instead of every stub, and programs ask for the rest. Workflow code answers both functions from the catalog the
run recorded when it started (`AgentSpec.catalog`): no activity, no I/O, nothing read from the worker's current
tools, so a replay gets the same answers, and the ranking below is a pure function of the recorded entries and
the query (ties broken by name, never by a hash or set order).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..shared._types import CatalogEntry, ToolCatalog

__all__ = [
    "CATALOG_FUNCTIONS",
    "SEARCH_LIMIT_DEFAULT",
    "SEARCH_LIMIT_MAX",
    "CatalogIndex",
]

SEARCH_TOOLS = "search_tools"
DESCRIBE_TOOL = "describe_tool"
CATALOG_FUNCTIONS = frozenset({SEARCH_TOOLS, DESCRIBE_TOOL})
"""The sandbox functions of a large catalog: no tool of a code-mode agent may have these names."""

SEARCH_LIMIT_DEFAULT = 10
"""Tools one `search_tools` call returns when the program gives no `limit`."""

SEARCH_LIMIT_MAX = 25
"""The most tools one `search_tools` call returns (a larger `limit` is capped): a search is for finding a few."""

_NAME_WEIGHT, _SUMMARY_WEIGHT, _STUB_WEIGHT = 3, 2, 1
"""Score of a query word found in a tool's name, else in its summary, else anywhere in its stub."""

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD = re.compile(r"[a-z0-9]+")


def _stem(word: str) -> str:
    """A crude plural fold (`invoices` → `invoice`, not `address`), so a query matches either form."""
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _words(text: str) -> set[str]:
    """The words of `text`, lower-cased and folded: `get_invoiceLines` → {get, invoice, line}."""
    return {_stem(w) for w in _WORD.findall(_CAMEL.sub(r"\1 \2", text).lower())}


@dataclass(frozen=True)
class _Indexed:
    entry: CatalogEntry
    name_words: frozenset[str]
    summary_words: frozenset[str]
    stub_words: frozenset[str]

    def score(self, query: set[str]) -> int:
        return sum(_NAME_WEIGHT if w in self.name_words else _SUMMARY_WEIGHT if w in self.summary_words
                   else _STUB_WEIGHT if w in self.stub_words else 0 for w in query)


class CatalogIndex:
    """The recorded catalog of one run, ready to answer the sandbox's catalog functions (built once per REPL)."""

    def __init__(self, catalog: ToolCatalog) -> None:
        self._catalog = catalog
        self._entries = {e.name: e for e in catalog.entries}
        self._indexed = [_Indexed(e, frozenset(_words(e.name)), frozenset(_words(e.summary)),
                                  frozenset(_words(catalog.stub(e)))) for e in catalog.entries]

    def search(self, query: str, limit: int = SEARCH_LIMIT_DEFAULT) -> list[dict[str, str]]:
        """The tools best matching the words of `query`, best first (ties by name), at most `limit` (capped).

        Each query word scores 3 in a tool's name, else 2 in its summary, else 1 anywhere in its stub (parameter
        names, result fields, the rest of the docstring); tools that match no word are left out.
        """
        wanted = _words(query)
        scored = [(-item.score(wanted), item.entry.name, item.entry) for item in self._indexed]
        best = sorted(s for s in scored if s[0] < 0)[: max(0, min(limit, SEARCH_LIMIT_MAX))]
        return [{"name": entry.name, "summary": entry.summary} for _score, _name, entry in best]

    def describe(self, name: str) -> str | None:
        """The full stub of the tool called `name`, or `None` if there is none."""
        entry = self._entries.get(name)
        return self._catalog.stub(entry) if entry is not None else None

    def close_matches(self, name: str) -> list[str]:
        """Tool names that look like `name` (a typo, another word order), best first: for an error message."""
        close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.6)
        return close or [hit["name"] for hit in self.search(name, 3)]

    def answer(self, function: str, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The Monty answer to a call of a catalog function: `{'return_value': ...}` or an exception to raise."""
        if function == SEARCH_TOOLS:
            return self._answer_search(args, kwargs)
        return self._answer_describe(args, kwargs)

    def _answer_search(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = _bind(SEARCH_TOOLS, ("query", "limit"), args, kwargs)
        if isinstance(bound, str):
            return _type_error(bound)
        query, limit = bound.get("query"), bound.get("limit", SEARCH_LIMIT_DEFAULT)
        if not isinstance(query, str):
            return _type_error(f"search_tools(query=...) takes a string of words, e.g. search_tools('refund "
                               f"order'); got {type(query).__name__}")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            return _type_error(f"search_tools(limit=...) takes a whole number from 1 to {SEARCH_LIMIT_MAX}; "
                               f"got {limit!r}")
        return {"return_value": self.search(query, limit)}

    def _answer_describe(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = _bind(DESCRIBE_TOOL, ("name",), args, kwargs)
        if isinstance(bound, str):
            return _type_error(bound)
        name = bound.get("name")
        if not isinstance(name, str):
            return _type_error(f"describe_tool(name=...) takes a tool's name as a string, e.g. "
                               f"describe_tool('get_order'); got {type(name).__name__}")
        stub = self.describe(name)
        if stub is not None:
            return {"return_value": stub}
        close = self.close_matches(name)
        hint = f"close matches: {', '.join(repr(c) for c in close)}" if close else "no tool has a similar name"
        return {"exc_type": "KeyError", "message": f"describe_tool({name!r}): the agent has no tool named "
                f"{name!r} ({hint}); search_tools(query) finds tools by what they do"}


def _bind(function: str, params: tuple[str, ...], args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any] | str:
    """`args` and `kwargs` by parameter name, or why they do not fit `params` (the first one is required)."""
    if len(args) > len(params):
        return f"{function}() takes at most {len(params)} arguments ({', '.join(params)}); got {len(args)}"
    bound = dict(zip(params, args, strict=False))
    for key, value in kwargs.items():
        if key not in params:
            return f"{function}() got an unexpected keyword argument {key!r}; it takes {', '.join(params)}"
        if key in bound:
            return f"{function}() got multiple values for argument {key!r}"
        bound[key] = value
    if params[0] not in bound:
        return f"{function}() missing required argument {params[0]!r}"
    return bound


def _type_error(message: str) -> dict[str, Any]:
    return {"exc_type": "TypeError", "message": message}
