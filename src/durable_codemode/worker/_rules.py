"""What an approval rule is, as a fingerprint a run records, so a deploy that changes the rule can be told.

A rule is code (`ToolOptions(approval_rule=...)`), not data: a run records only that its tool has one, and each
call's verdict (`workflow/_run`). To tell, before a deploy, that the rule an open run started with is not the one
the new code has (`codemode check-deploy`), the run also records a fingerprint of it (`ToolSpec.rule_fingerprint`):

- its code, as Python's own parse of its source (the `lambda` or `def` alone, found by position in its module, so
  an edit elsewhere on the same line does not count; a docstring does not count either), else its bytecode and
  constants when the source cannot be found;
- the plain values it reads besides its arguments: the module globals it names and the variables it closes over
  that are numbers, strings, booleans, `None`, or tuples and frozensets of them (a threshold moved to a constant
  still counts).

A rule that reads other state (a database, an object's attribute) is compared by its code only: the fingerprint
says when the code changed, not every time its answers could.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import linecache
import types
from collections.abc import Callable
from typing import Any

__all__ = ["rule_fingerprint"]

_PLAIN = (int, float, str, bool, type(None), bytes)


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_plain(v) for v in value)
    return False


def _shown(value: Any) -> Any:
    if isinstance(value, frozenset):
        return sorted(repr(v) for v in value)
    return repr(value)


@functools.lru_cache(maxsize=64)
def _module_tree(filename: str, size: int) -> ast.Module | None:
    """The parsed module `filename` (`size`: its line count, so an edited file is parsed again)."""
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:]
    return body


def _source_shape(code: types.CodeType) -> str | None:
    """The rule's own AST (arguments and body, no name, no docstring), found by position in its module."""
    lines = linecache.getlines(code.co_filename)
    if not lines:
        linecache.checkcache(code.co_filename)
        lines = linecache.getlines(code.co_filename)
    tree = _module_tree(code.co_filename, len(lines)) if lines else None
    if tree is None:
        return None
    if code.co_name == "<lambda>":
        # The lambda's body starts where its first instruction after the frame set-up points.
        starts = [(line, col) for line, _end, col, _ in code.co_positions()
                  if line is not None and col is not None and (line, col) != (code.co_firstlineno, 0)]
        if not starts:
            return None
        line, col = starts[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Lambda) and (node.body.lineno, node.body.col_offset) <= (line, col) and (
                    node.body.end_lineno or 0, node.body.end_col_offset or 0) >= (line, col) and (
                    node.lineno <= line):
                inner = [n for n in ast.walk(node.body) if isinstance(n, ast.Lambda)]
                if not any((n.body.lineno, n.body.col_offset) <= (line, col) for n in inner):
                    return ast.dump(node.args) + ast.dump(node.body)
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name and (
                node.lineno == code.co_firstlineno
                or any(d.lineno == code.co_firstlineno for d in node.decorator_list)):
            return ast.dump(node.args) + "".join(ast.dump(s) for s in _without_docstring(node.body))
    return None


def _code_shape(code: types.CodeType) -> list[Any]:
    """The bytecode and constants of `code` and of the functions it defines (when no source is found)."""
    return [code.co_code.hex(), list(code.co_names), list(code.co_varnames[: code.co_argcount]),
            [_code_shape(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]]


def rule_fingerprint(rule: Callable[..., Any]) -> str:
    """A short hash of an approval rule: its code and the plain values it reads (module docstring)."""
    parts: list[Any] = []
    target: Any = rule
    while isinstance(target, functools.partial):
        parts.append(["partial", [_shown(a) for a in target.args],
                      {k: _shown(v) for k, v in sorted(target.keywords.items())}])
        target = target.func
    target = inspect.unwrap(target)
    code = getattr(target, "__code__", None)
    if not isinstance(code, types.CodeType):
        # A callable object: its class's `__call__` (the first class of its MRO that defines one).
        call = next((vars(k)["__call__"] for k in type(target).__mro__ if "__call__" in vars(k)), None)
        code = getattr(call, "__code__", None)
        parts.append(["object", type(target).__qualname__])
    if isinstance(code, types.CodeType):
        shape = _source_shape(code)
        parts.append(["source", shape] if shape is not None else ["code", _code_shape(code)])
        module_globals = getattr(target, "__globals__", {})
        parts.append(["globals", {name: _shown(module_globals[name]) for name in sorted(set(code.co_names))
                                  if name in module_globals and _plain(module_globals[name])}])
        cells = getattr(target, "__closure__", None) or ()
        values = []
        for name, cell in zip(code.co_freevars, cells, strict=False):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if _plain(value):
                values.append([name, _shown(value)])
        parts.append(["closure", values])
    else:
        parts.append(["repr", type(target).__qualname__])
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
