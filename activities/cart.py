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

import random
import sqlite3
from typing import Any

from pydantic_ai.toolsets import FunctionToolset
from typing_extensions import TypedDict

from durable_codemode.apps.activities._store import PAGE_SIZE, IdempotentTools, SqliteStore, documented, read_page

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


@documented
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


@documented
class CartPage(TypedDict):
    """One page of `list_cart`."""

    items: list[CartLine]
    """At most 50 lines, ordered by `line_id`."""

    next_offset: int | None
    """The offset to pass for the next page; None on the last page."""

    total_lines: int
    """How many lines the whole cart has."""


@documented
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
"""


def _line(row: tuple[Any, ...]) -> CartLine:
    return CartLine(line_id=row[0], product=row[1], unit_price_cents=row[2], quantity=row[3])


class CartStore(SqliteStore):
    """The cart's SQLite file, plus the bookkeeping tests use to check side effects ran exactly once."""

    SCHEMA = _SCHEMA
    TABLES = ("lines",)

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
            self.reset(conn)
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


class CartTools(IdempotentTools):
    """The cart's tools, bound to one store; `toolset()` hands them to an agent."""

    store: CartStore

    def __init__(self, store: CartStore) -> None:
        """Serve the tools from `store`."""
        super().__init__(store)

    def toolset(self) -> FunctionToolset[None]:
        """The five tools as a pydantic-ai toolset."""
        return FunctionToolset(
            [self.list_cart, self.get_line, self.add_line, self.update_quantity, self.remove_line]
        )

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
        with self.store.read() as conn:
            rows, next_offset, total = read_page(
                conn, "SELECT line_id, product, unit_price_cents, quantity FROM lines ORDER BY line_id",
                "SELECT COUNT(*) FROM lines", (), offset)
        return CartPage(items=[_line(row) for row in rows], next_offset=next_offset, total_lines=total)

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
        return self.mutate("add_line", args, apply)

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

        return self.mutate("update_quantity", {"line_id": line_id, "quantity": quantity}, apply)

    def remove_line(self, line_id: int) -> RemovedLine:
        """Remove one line from the cart.

        Args:
            line_id: The line's id, as shown by `list_cart`.

        """

        def apply(conn: sqlite3.Connection) -> RemovedLine:
            if conn.execute("DELETE FROM lines WHERE line_id = ?", (line_id,)).rowcount == 0:
                raise KeyError(f"no cart line {line_id}; list_cart() shows the line ids")
            return RemovedLine(line_id=line_id, removed=True)

        return self.mutate("remove_line", {"line_id": line_id}, apply)


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
