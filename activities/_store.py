"""What every bundled app's store shares: a SQLite file, exactly-once mutations, and side-effect bookkeeping.

Activities are at-least-once: a tool call retried after a worker crash runs its function again. Each app's
mutating tools therefore go through `IdempotentTools.mutate`, which applies a change at most once per
`current_call().idempotency_key` and records every execution, so tests and the benchmark can assert that each
side effect happened exactly once (`execution_count`, `duplicate_effects`).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import Any, TypeVar, cast

from pydantic import ConfigDict, with_config

from durable_codemode import current_call

__all__ = ["PAGE_SIZE", "IdempotentTools", "SqliteStore", "check_offset", "documented", "read_page"]

documented = with_config(ConfigDict(use_attribute_docstrings=True))
"""Decorate a tool's result `TypedDict` with this so its field docstrings reach the schema, and so the stubs
the model reads (`unit_price_cents: int` with "5000 is $50.00" under it). pydantic-ai documents a tool's own
arguments from its docstring, but a nested `TypedDict` is described by its own config, which leaves field
docstrings out unless told."""

_R = TypeVar("_R")

PAGE_SIZE = 50
"""Rows per page of every app's list tools: small enough that one page is a short tool result."""


def check_offset(offset: int) -> None:
    """Refuse a negative page offset, saying what to pass instead."""
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, got {offset}; start at 0 and follow next_offset")


def read_page(conn: sqlite3.Connection, select: str, count: str, params: Sequence[Any],
              offset: int) -> tuple[list[Any], int | None, int]:
    """One page of `select` (ordered, without LIMIT) from `offset`: its rows, the next offset, the total.

    `count` counts the same rows with the same `params`, in the same read, so `next_offset` is `None` exactly on
    the last page.
    """
    check_offset(offset)
    rows = conn.execute(f"{select} LIMIT ? OFFSET ?", (*params, PAGE_SIZE, offset)).fetchall()
    total = int(conn.execute(count, tuple(params)).fetchone()[0])
    end = offset + len(rows)
    return rows, (end if end < total else None), total

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS effects (
    idempotency_key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    result TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tool TEXT,
    args TEXT,
    idempotency_key TEXT
);
"""


class SqliteStore:
    """One app's SQLite file. Subclasses set `SCHEMA` (their own tables) and `TABLES` (what `reset` empties)."""

    SCHEMA = ""
    """The app's `CREATE TABLE IF NOT EXISTS ...` statements."""

    TABLES: tuple[str, ...] = ()
    """The app's tables, emptied (and their id sequences restarted) by `reset`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Wrap the SQLite file at `path` (created on first use)."""
        self.path = os.fspath(path)

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A fresh connection in autocommit mode, closed on exit.

        One connection per operation: tools run in activity worker threads, and sqlite3 connections must
        not be shared across threads. Autocommit lets callers open the transaction they mean explicitly.
        """
        with closing(sqlite3.connect(self.path, isolation_level=None, timeout=30.0)) as conn:
            yield conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A connection inside a `BEGIN IMMEDIATE` transaction: committed on success, rolled back on error.

        IMMEDIATE takes the write lock up front, so two concurrent attempts of the same call cannot both
        see "no effect recorded yet" and both apply it.
        """
        with self.connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A connection inside one read transaction, so a page and its total agree while another call writes."""
        with self.connect() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def create_schema(self) -> None:
        """Create the tables if they do not exist yet."""
        with self.connect() as conn:
            # WAL lets the many short reads of concurrent tool activities proceed while one writes.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(self.SCHEMA + _BOOKKEEPING)

    def reset(self, conn: sqlite3.Connection) -> None:
        """Empty the app's tables and the bookkeeping, restarting ids, inside `conn`'s transaction (for seeding).

        Restarting the ids makes the same seed give the same ids, also after earlier inserts.
        """
        for table in (*self.TABLES, "effects", "executions"):
            conn.execute(f"DELETE FROM {table}")
        names = ", ".join("?" for _ in (*self.TABLES, "executions"))
        conn.execute(f"DELETE FROM sqlite_sequence WHERE name IN ({names})", (*self.TABLES, "executions"))

    def execution_count(self, tool: str | None = None) -> int:
        """How many times a mutating tool's side effect actually ran (all tools, or only `tool`)."""
        with self.connect() as conn:
            if tool is None:
                row = conn.execute("SELECT COUNT(*) FROM executions").fetchone()
            else:
                row = conn.execute("SELECT COUNT(*) FROM executions WHERE tool = ?", (tool,)).fetchone()
        return int(row[0])

    def duplicate_effects(self) -> int:
        """How many idempotency keys had their side effect run more than once; 0 is correct."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM (SELECT idempotency_key FROM executions"
                " WHERE idempotency_key IS NOT NULL GROUP BY idempotency_key HAVING COUNT(*) > 1)"
            ).fetchone()
        return int(row[0])


def _current_key() -> str | None:
    try:
        return current_call().idempotency_key
    except RuntimeError:
        # Called directly (a unit test, a script): no call identity, so no deduplication.
        return None


class IdempotentTools:
    """Base of an app's tool class: `mutate` runs a change at most once per idempotency key."""

    def __init__(self, store: SqliteStore) -> None:
        """Serve the tools from `store`."""
        self.store = store

    def mutate(self, tool: str, args: dict[str, Any], apply: Callable[[sqlite3.Connection], _R]) -> _R:
        """Run `apply` at most once per idempotency key, logging the execution in the same transaction.

        The change, the `executions` row and the stored result commit together, so a crash either leaves
        no trace (the retry does the work) or leaves the result (the retry returns it). `apply`'s result must
        be JSON-serializable: a retry gets it back from the `effects` table.
        """
        key = _current_key()
        args_json = json.dumps(args, sort_keys=True)
        with self.store.write() as conn:
            if key is not None:
                row = conn.execute(
                    "SELECT tool, result FROM effects WHERE idempotency_key = ?", (key,)
                ).fetchone()
                if row is not None:
                    if row[0] != tool:
                        raise RuntimeError(
                            f"idempotency key {key!r} was already used by {row[0]}, not {tool}: "
                            "call ids must be unique per call"
                        )
                    return cast(_R, json.loads(row[1]))
            result = apply(conn)
            conn.execute(
                "INSERT INTO executions (tool, args, idempotency_key) VALUES (?, ?, ?)",
                (tool, args_json, key),
            )
            if key is not None:
                conn.execute(
                    "INSERT INTO effects (idempotency_key, tool, args, result) VALUES (?, ?, ?, ?)",
                    (key, tool, args_json, json.dumps(result)),
                )
            return result
