"""The bundled shopping-cart app: single-item CRUD tools over a SQLite store.

The tools are deliberately shaped like a typical real-world API rather than like something designed for an
agent: there is no bulk endpoint (removing twenty lines means twenty `remove_line` calls), listing is
paginated by 50, and money is integer cents. A task such as "remove every item over $50" is then dozens of
round trips for a model calling tools one at a time, and one short loop for a model writing a program,
which is exactly the case code mode is for. Cents keep the arithmetic exact, so a model summing or
comparing prices in its program gets the same answer as the oracle below.

The mutating tools are idempotent by `current_call().idempotency_key`: activities are at-least-once, and a
retried `remove_line` must not remove a second thing or fail because the first attempt already did it.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Any, TypeVar, cast

from pydantic_ai.toolsets import FunctionToolset
from typing_extensions import TypedDict

from durable_codemode import current_call

__all__ = [
    "PAGE_SIZE",
    "CartLine",
    "CartPage",
    "CartStore",
    "CartTools",
    "RemovedLine",
    "check_removed_over",
    "over_threshold",
]

PAGE_SIZE = 50
"""Lines per `list_cart` page."""

_R = TypeVar("_R")

_CATALOG = (
    "Espresso beans 1kg",
    "Oat milk 6-pack",
    "Ceramic pour-over dripper",
    "Burr grinder",
    "Gooseneck kettle",
    "Paper filters (100)",
    "Digital scale",
    "Travel mug",
    "Milk frother",
    "Decaf beans 500g",
    "Cold brew bottle",
    "Cast-iron skillet",
    "Chef's knife",
    "Cutting board",
    "Linen tea towels",
    "Green tea 250g",
    "Dark chocolate bar",
    "Stand mixer bowl",
    "Espresso machine descaler",
    "Barista apron",
)


class CartLine(TypedDict):
    """One line of the cart: a product, its unit price and how many of it."""

    line_id: int
    """The line's id; stable for the line's lifetime and never reused."""

    product: str
    """The product's display name."""

    unit_price_cents: int
    """The price of one unit in cents (5000 is $50.00)."""

    quantity: int
    """How many units; at least 1."""


class CartPage(TypedDict):
    """One page of `list_cart`."""

    items: list[CartLine]
    """At most 50 lines, ordered by `line_id`."""

    next_offset: int | None
    """The offset to pass for the next page; None on the last page."""

    total_lines: int
    """How many lines the whole cart has."""


class RemovedLine(TypedDict):
    """The outcome of `remove_line`."""

    line_id: int
    """The id of the removed line."""

    removed: bool
    """True: the line is gone."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS lines (
    line_id INTEGER PRIMARY KEY AUTOINCREMENT,
    product TEXT NOT NULL,
    unit_price_cents INTEGER NOT NULL,
    quantity INTEGER NOT NULL
);
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


def _line(row: tuple[Any, ...]) -> CartLine:
    return CartLine(line_id=row[0], product=row[1], unit_price_cents=row[2], quantity=row[3])


class CartStore:
    """The cart's SQLite file, plus the bookkeeping tests use to check side effects ran exactly once."""

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

    def create_schema(self) -> None:
        """Create the tables if they do not exist yet."""
        with self.connect() as conn:
            # WAL lets the many short reads of concurrent tool activities proceed while one writes.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)

    def seed(self, lines: int = 122, seed: int = 0) -> None:
        """Replace the whole store (lines, effects, executions) with `lines` deterministic cart lines.

        About a third of the prices are above $50, and there is always a line at exactly 5000 cents and one
        at 5001 so that "more than $50" has to be read as strict.

        Args:
            lines: How many lines to create; at least 2 (for the two boundary prices).
            seed: The `random.Random` seed; the same seed gives the same cart.

        """
        if lines < 2:
            raise ValueError(f"lines must be at least 2 (for the 5000/5001 boundary lines), got {lines}")
        rng = random.Random(seed)
        prices = [
            rng.randint(5001, 24_999) if rng.random() < 1 / 3 else rng.randint(199, 4_999)
            for _ in range(lines)
        ]
        at_5000, at_5001 = rng.sample(range(lines), 2)
        prices[at_5000] = 5000
        prices[at_5001] = 5001
        rows = [
            (n, f"{rng.choice(_CATALOG)} #{n}", price, rng.randint(1, 5))
            for n, price in enumerate(prices, start=1)
        ]
        self.create_schema()
        with self.write() as conn:
            conn.execute("DELETE FROM lines")
            conn.execute("DELETE FROM effects")
            conn.execute("DELETE FROM executions")
            # Restart the ids so the same seed gives the same line ids, also after earlier adds.
            conn.execute("DELETE FROM sqlite_sequence WHERE name IN ('lines', 'executions')")
            conn.executemany(
                "INSERT INTO lines (line_id, product, unit_price_cents, quantity) VALUES (?, ?, ?, ?)", rows
            )

    def all_lines(self) -> list[CartLine]:
        """Every line, ordered by `line_id`."""
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT line_id, product, unit_price_cents, quantity FROM lines ORDER BY line_id"
            ).fetchall()
        return [_line(row) for row in rows]

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


class CartTools:
    """The cart's tools, bound to one store; `toolset()` hands them to an agent."""

    def __init__(self, store: CartStore) -> None:
        """Serve the tools from `store`."""
        self.store = store

    def toolset(self) -> FunctionToolset[None]:
        """The five tools as a pydantic-ai toolset."""
        return FunctionToolset(
            [self.list_cart, self.get_line, self.add_line, self.update_quantity, self.remove_line]
        )

    def _mutate(self, tool: str, args: dict[str, Any], apply: Callable[[sqlite3.Connection], _R]) -> _R:
        """Run `apply` at most once per idempotency key, logging the execution in the same transaction.

        The change, the `executions` row and the stored result commit together, so a crash either leaves
        no trace (the retry does the work) or leaves the result (the retry returns it).
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

    @staticmethod
    def _fetch(conn: sqlite3.Connection, line_id: int) -> CartLine:
        row = conn.execute(
            "SELECT line_id, product, unit_price_cents, quantity FROM lines WHERE line_id = ?", (line_id,)
        ).fetchone()
        if row is None:
            raise KeyError(f"no cart line {line_id}; list_cart() shows the line ids")
        return _line(row)

    def list_cart(self, offset: int = 0) -> CartPage:
        """List one page of the cart's lines, ordered by line id.

        A page has at most 50 lines; to see the whole cart, call again with `next_offset` until it is None.

        Args:
            offset: How many lines to skip; 0 for the first page, then the previous page's `next_offset`.

        """
        if offset < 0:
            raise ValueError(f"offset must be 0 or more, got {offset}; start at 0 and follow next_offset")
        with self.store.connect() as conn:
            # One read transaction so the page and the total agree even while another call writes.
            conn.execute("BEGIN")
            rows = conn.execute(
                "SELECT line_id, product, unit_price_cents, quantity FROM lines ORDER BY line_id"
                " LIMIT ? OFFSET ?",
                (PAGE_SIZE, offset),
            ).fetchall()
            total = int(conn.execute("SELECT COUNT(*) FROM lines").fetchone()[0])
            conn.execute("COMMIT")
        end = offset + len(rows)
        return CartPage(
            items=[_line(row) for row in rows], next_offset=end if end < total else None, total_lines=total
        )

    def get_line(self, line_id: int) -> CartLine:
        """Get one cart line by its id.

        Args:
            line_id: The line's id, as shown by `list_cart`.

        """
        with self.store.connect() as conn:
            return self._fetch(conn, line_id)

    def add_line(self, product: str, unit_price_cents: int, quantity: int = 1) -> CartLine:
        """Add a new line to the cart and return it, with its new line id.

        Args:
            product: The product's display name; must not be empty.
            unit_price_cents: The price of one unit in cents (e.g. 1999 for $19.99); 0 or more.
            quantity: How many units; 1 or more.

        """
        if not product.strip():
            raise ValueError("product must not be empty")
        if unit_price_cents < 0:
            raise ValueError(f"unit_price_cents must be 0 or more (it is in cents), got {unit_price_cents}")
        if quantity < 1:
            raise ValueError(f"quantity must be 1 or more, got {quantity}")

        def apply(conn: sqlite3.Connection) -> CartLine:
            cursor = conn.execute(
                "INSERT INTO lines (product, unit_price_cents, quantity) VALUES (?, ?, ?)",
                (product, unit_price_cents, quantity),
            )
            assert cursor.lastrowid is not None
            return CartLine(
                line_id=cursor.lastrowid,
                product=product,
                unit_price_cents=unit_price_cents,
                quantity=quantity,
            )

        args = {"product": product, "unit_price_cents": unit_price_cents, "quantity": quantity}
        return self._mutate("add_line", args, apply)

    def update_quantity(self, line_id: int, quantity: int) -> CartLine:
        """Set the quantity of one cart line and return the updated line.

        Args:
            line_id: The line's id, as shown by `list_cart`.
            quantity: The new number of units; 1 or more (use remove_line to remove a line).

        """
        if quantity < 1:
            raise ValueError(f"quantity must be 1 or more, got {quantity}; use remove_line to remove a line")

        def apply(conn: sqlite3.Connection) -> CartLine:
            cursor = conn.execute("UPDATE lines SET quantity = ? WHERE line_id = ?", (quantity, line_id))
            if cursor.rowcount == 0:
                raise KeyError(f"no cart line {line_id}; list_cart() shows the line ids")
            return self._fetch(conn, line_id)

        return self._mutate("update_quantity", {"line_id": line_id, "quantity": quantity}, apply)

    def remove_line(self, line_id: int) -> RemovedLine:
        """Remove one line from the cart.

        Args:
            line_id: The line's id, as shown by `list_cart`.

        """

        def apply(conn: sqlite3.Connection) -> RemovedLine:
            if conn.execute("DELETE FROM lines WHERE line_id = ?", (line_id,)).rowcount == 0:
                raise KeyError(f"no cart line {line_id}; list_cart() shows the line ids")
            return RemovedLine(line_id=line_id, removed=True)

        return self._mutate("remove_line", {"line_id": line_id}, apply)


def over_threshold(lines: list[CartLine], threshold_cents: int = 5000) -> list[CartLine]:
    """The lines whose unit price is strictly more than `threshold_cents`."""
    return [line for line in lines if line["unit_price_cents"] > threshold_cents]


def check_removed_over(store: CartStore, before: list[CartLine], threshold_cents: int = 5000) -> list[str]:
    """Check the end state of "remove every line priced over the threshold"; an empty list means correct.

    Correct means: every line of `before` priced strictly over `threshold_cents` is gone, every other line
    of `before` is still there unchanged, and no line was added.
    """
    after = {line["line_id"]: line for line in store.all_lines()}
    problems: list[str] = []
    before_ids = set()
    for line in before:
        before_ids.add(line["line_id"])
        now = after.get(line["line_id"])
        label = f"line {line['line_id']} ({line['product']}, {line['unit_price_cents']} cents)"
        if line["unit_price_cents"] > threshold_cents:
            if now is not None:
                problems.append(f"{label} is over {threshold_cents} cents but is still in the cart")
        elif now is None:
            problems.append(f"{label} is not over {threshold_cents} cents but was removed")
        elif now != line:
            problems.append(f"{label} is not over {threshold_cents} cents but changed: {line} -> {now}")
    for line_id, line in after.items():
        if line_id not in before_ids:
            problems.append(f"line {line_id} ({line['product']}) was added")
    return problems
