"""The bundled inventory app: items with stock levels and reorder thresholds, and purchase orders, over SQLite.

The API is a typical stock system's: items are listed 50 per page, there is no "reorder everything low" endpoint
(each purchase order is one `create_order`), and money is integer cents. "Reorder every item under its threshold"
is then a page-everything, filter and one-call-per-item job, with arithmetic on quantities and costs that the
oracle checks to the cent.

Words as the tools and the oracle use them:
- an item is **below its threshold** when `on_hand < reorder_threshold`, strictly: an item exactly at its
  threshold does not need reordering;
- placing an order does not change `on_hand` (stock arrives later); an order is `open` until it is cancelled;
- the seed places no orders, so no item starts with one on the way (see `check_reordered` for what the
  scaling task then expects).

The mutating tools are idempotent by `current_call().idempotency_key` (see `activities._store`).
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

from pydantic_ai.toolsets import FunctionToolset
from typing_extensions import TypedDict

from durable_codemode.apps.activities._store import (
    PAGE_SIZE,
    IdempotentTools,
    SqliteStore,
    check_offset,
    documented,
    read_page,
)

__all__ = [
    "ORDER_STATUSES",
    "PAGE_SIZE",
    "DeletedItem",
    "InventoryStore",
    "InventoryTools",
    "Item",
    "ItemPage",
    "Order",
    "OrderPage",
    "check_reordered",
    "plan_cost_cents",
    "reorder_plan",
]


ORDER_STATUSES = ("open", "cancelled")
"""An order is `open` from `create_order` until `cancel_order`."""

_PRODUCTS = (
    "Hex bolt M6",
    "Wood screw 4x40",
    "Cable tie 200mm",
    "Hinge brass 75mm",
    "Drawer slide 450mm",
    "LED strip 5m",
    "Wall plug 8mm",
    "Sandpaper P120",
    "Masking tape 25mm",
    "Wood glue 500ml",
    "Safety gloves L",
    "Drill bit 6mm",
    "Shelf bracket",
    "Door handle steel",
    "Silicone sealant",
    "Paint roller 9in",
)


@documented
class Item(TypedDict):
    """One stocked item; it is below its threshold when on_hand < reorder_threshold; unit cost in cents."""

    item_id: int
    """The item's id; stable for its lifetime and never reused."""

    sku: str
    """The stock-keeping unit code, unique (e.g. `SKU-00042`)."""

    name: str
    """The item's display name."""

    on_hand: int
    """Units in stock now; 0 or more. Orders do not change it (stock arrives later)."""

    reorder_threshold: int
    """Reorder when `on_hand` is strictly below this; an item exactly at its threshold is fine."""

    unit_cost_cents: int
    """What one unit costs to buy, in cents (1250 is $12.50)."""


@documented
class ItemPage(TypedDict):
    """One page of `list_items`."""

    items: list[Item]
    """At most 50 items, ordered by `item_id`."""

    next_offset: int | None
    """The offset to pass for the next page; None on the last page."""

    total_items: int
    """How many items there are, on all pages."""


@documented
class Order(TypedDict):
    """One purchase order: quantity units of one item; total_cents = quantity * unit_cost_cents; open or cancelled."""

    order_id: int
    """The order's id; never reused."""

    item_id: int
    """The ordered item."""

    sku: str
    """The ordered item's SKU."""

    quantity: int
    """Units ordered; 1 or more."""

    unit_cost_cents: int
    """The item's unit cost when ordered, in cents."""

    total_cents: int
    """`quantity * unit_cost_cents`: what the order costs, in cents."""

    status: str
    """`open`, or `cancelled`."""


@documented
class OrderPage(TypedDict):
    """One page of `list_orders`."""

    items: list[Order]
    """At most 50 orders, ordered by `order_id`."""

    next_offset: int | None
    """The offset to pass for the next page (with the same filter); None on the last page."""

    total_orders: int
    """How many orders match, on all pages."""


@documented
class DeletedItem(TypedDict):
    """The outcome of `delete_item`."""

    item_id: int
    """The id of the deleted item."""

    deleted: bool
    """True: the item is gone."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    item_id INTEGER PRIMARY KEY AUTOINCREMENT,
    sku TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    on_hand INTEGER NOT NULL,
    reorder_threshold INTEGER NOT NULL,
    unit_cost_cents INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS orders (
    order_id INTEGER PRIMARY KEY AUTOINCREMENT,
    item_id INTEGER NOT NULL,
    sku TEXT NOT NULL,
    quantity INTEGER NOT NULL,
    unit_cost_cents INTEGER NOT NULL,
    status TEXT NOT NULL
);
"""

_ITEM_COLUMNS = "item_id, sku, name, on_hand, reorder_threshold, unit_cost_cents"
_ORDER_COLUMNS = "order_id, item_id, sku, quantity, unit_cost_cents, status"


def _item(row: tuple[Any, ...]) -> Item:
    return Item(
        item_id=row[0], sku=row[1], name=row[2], on_hand=row[3], reorder_threshold=row[4], unit_cost_cents=row[5]
    )


def _order(row: tuple[Any, ...]) -> Order:
    return Order(
        order_id=row[0], item_id=row[1], sku=row[2], quantity=row[3], unit_cost_cents=row[4],
        total_cents=row[3] * row[4], status=row[5],
    )


def _not_negative(name: str, value: int, unit: str = "") -> None:
    if value < 0:
        raise ValueError(f"{name} must be 0 or more{unit}, got {value}")


class InventoryStore(SqliteStore):
    """The inventory's SQLite file, plus the bookkeeping tests use to check side effects ran exactly once."""

    SCHEMA = _SCHEMA
    TABLES = ("items", "orders")

    def seed(self, items: int = 120, seed: int = 0) -> None:
        """Replace the whole store with `items` deterministic items and no orders.

        About 40% of the items are below their threshold (some at 0), and there is always one item exactly at
        its threshold and one a single unit under it, so "under the threshold" has to be read as strict.

        Args:
            items: How many items to create; at least 2 (for the two boundary items).
            seed: The `random.Random` seed; the same seed gives the same inventory.

        """
        if items < 2:
            raise ValueError(f"items must be at least 2 (for the two boundary items), got {items}")
        rng = random.Random(seed)
        rows: list[list[Any]] = []
        for n in range(1, items + 1):
            threshold = rng.randint(5, 60)
            roll = rng.random()
            on_hand = (
                0 if roll < 0.1 else rng.randint(1, threshold - 1) if roll < 0.4 else rng.randint(threshold, 200)
            )
            cost = rng.randint(15, 9_999) if rng.random() < 0.8 else rng.randint(10_000, 45_000)
            rows.append([n, f"SKU-{n:05d}", f"{rng.choice(_PRODUCTS)} #{n}", on_hand, threshold, cost])
        at, under = rng.sample(range(items), 2)
        rows[at][3] = rows[at][4]
        rows[under][3] = rows[under][4] - 1
        self.create_schema()
        with self.write() as conn:
            self.reset(conn)
            conn.executemany(f"INSERT INTO items ({_ITEM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", rows)

    def all_items(self) -> list[Item]:
        """Every item, ordered by `item_id`."""
        with self.connect() as conn:
            rows = conn.execute(f"SELECT {_ITEM_COLUMNS} FROM items ORDER BY item_id").fetchall()
        return [_item(row) for row in rows]

    def all_orders(self) -> list[Order]:
        """Every order, ordered by `order_id`."""
        with self.connect() as conn:
            rows = conn.execute(f"SELECT {_ORDER_COLUMNS} FROM orders ORDER BY order_id").fetchall()
        return [_order(row) for row in rows]


class InventoryTools(IdempotentTools):
    """The inventory's tools, bound to one store; `toolset()` hands them to an agent."""

    store: InventoryStore

    def __init__(self, store: InventoryStore) -> None:
        """Serve the tools from `store`."""
        super().__init__(store)

    def toolset(self) -> FunctionToolset[None]:
        """The eight tools as a pydantic-ai toolset."""
        return FunctionToolset([
            self.list_items, self.get_item, self.update_item, self.delete_item,
            self.create_order, self.list_orders, self.get_order, self.cancel_order,
        ])

    @staticmethod
    def _fetch_item(conn: sqlite3.Connection, item_id: int) -> Item:
        row = conn.execute(f"SELECT {_ITEM_COLUMNS} FROM items WHERE item_id = ?", (item_id,)).fetchone()
        if row is None:
            raise KeyError(f"no item {item_id}; list_items() shows the item ids")
        return _item(row)

    @staticmethod
    def _fetch_order(conn: sqlite3.Connection, order_id: int) -> Order:
        row = conn.execute(f"SELECT {_ORDER_COLUMNS} FROM orders WHERE order_id = ?", (order_id,)).fetchone()
        if row is None:
            raise KeyError(f"no order {order_id}; list_orders() shows the order ids")
        return _order(row)

    def list_items(self, offset: int = 0) -> ItemPage:
        """List one page of the items, ordered by item id.

        A page has at most 50 items; to see them all, call again with `next_offset` until it is None.

        Args:
            offset: How many items to skip; 0 for the first page, then the previous page's `next_offset`.

        """
        with self.store.read() as conn:
            rows, next_offset, total = read_page(
                conn, f"SELECT {_ITEM_COLUMNS} FROM items ORDER BY item_id", "SELECT COUNT(*) FROM items", (), offset)
        return ItemPage(items=[_item(row) for row in rows], next_offset=next_offset, total_items=total)

    def get_item(self, item_id: int) -> Item:
        """Get one item by its id.

        Args:
            item_id: The item's id, as shown by `list_items`.

        """
        with self.store.connect() as conn:
            return self._fetch_item(conn, item_id)

    def update_item(
        self,
        item_id: int,
        name: str | None = None,
        on_hand: int | None = None,
        reorder_threshold: int | None = None,
        unit_cost_cents: int | None = None,
    ) -> Item:
        """Change one item's name, stock count, threshold and/or unit cost, and return the updated item.

        Only the fields given change; give at least one. Open orders keep the unit cost they were placed at.

        Args:
            item_id: The item's id, as shown by `list_items`.
            name: The new display name; must not be empty.
            on_hand: The counted stock, 0 or more.
            reorder_threshold: The new threshold, 0 or more.
            unit_cost_cents: The new unit cost in cents (e.g. 1250 for $12.50), 0 or more.

        """
        changes: dict[str, Any] = {}
        if name is not None:
            if not name.strip():
                raise ValueError("name must not be empty")
            changes["name"] = name
        for column, value, unit in (
            ("on_hand", on_hand, ""),
            ("reorder_threshold", reorder_threshold, ""),
            ("unit_cost_cents", unit_cost_cents, " (it is in cents)"),
        ):
            if value is not None:
                _not_negative(column, value, unit)
                changes[column] = value
        if not changes:
            raise ValueError(
                "nothing to change: give at least one of name, on_hand, reorder_threshold, unit_cost_cents"
            )

        def apply(conn: sqlite3.Connection) -> Item:
            assignments = ", ".join(f"{column} = ?" for column in changes)
            cursor = conn.execute(f"UPDATE items SET {assignments} WHERE item_id = ?", (*changes.values(), item_id))
            if cursor.rowcount == 0:
                raise KeyError(f"no item {item_id}; list_items() shows the item ids")
            return self._fetch_item(conn, item_id)

        return self.mutate("update_item", {"item_id": item_id, **changes}, apply)

    def delete_item(self, item_id: int) -> DeletedItem:
        """Delete one item; refused while it has an open order (cancel that first).

        Args:
            item_id: The item's id, as shown by `list_items`.

        """

        def apply(conn: sqlite3.Connection) -> DeletedItem:
            self._fetch_item(conn, item_id)
            row = conn.execute(
                "SELECT order_id FROM orders WHERE item_id = ? AND status = 'open' ORDER BY order_id", (item_id,)
            ).fetchone()
            if row is not None:
                raise ValueError(f"item {item_id} has open order {row[0]}: cancel_order({row[0]}) first")
            conn.execute("DELETE FROM items WHERE item_id = ?", (item_id,))
            return DeletedItem(item_id=item_id, deleted=True)

        return self.mutate("delete_item", {"item_id": item_id}, apply)

    def create_order(self, item_id: int, quantity: int) -> Order:
        """Place a purchase order for `quantity` units of one item, at its current unit cost; return the order.

        The order is open until cancelled; it does not change the item's `on_hand`.

        Args:
            item_id: The item's id, as shown by `list_items`.
            quantity: Units to order; 1 or more.

        """
        if quantity < 1:
            raise ValueError(f"quantity must be 1 or more, got {quantity}")

        def apply(conn: sqlite3.Connection) -> Order:
            item = self._fetch_item(conn, item_id)
            cursor = conn.execute(
                "INSERT INTO orders (item_id, sku, quantity, unit_cost_cents, status) VALUES (?, ?, ?, ?, 'open')",
                (item_id, item["sku"], quantity, item["unit_cost_cents"]),
            )
            assert cursor.lastrowid is not None
            return self._fetch_order(conn, cursor.lastrowid)

        return self.mutate("create_order", {"item_id": item_id, "quantity": quantity}, apply)

    def list_orders(self, offset: int = 0, status: str | None = None) -> OrderPage:
        """List one page of the purchase orders, ordered by order id, optionally only `open` or `cancelled` ones.

        Args:
            offset: How many matching orders to skip; 0 for the first page, then the previous page's `next_offset`.
            status: `open` or `cancelled`; None: every order.

        """
        check_offset(offset)
        clause = ""
        params: tuple[str, ...] = ()
        if status is not None:
            if status not in ORDER_STATUSES:
                raise ValueError(f"status must be one of {', '.join(ORDER_STATUSES)} (got {status!r}), or None")
            clause, params = " WHERE status = ?", (status,)
        with self.store.read() as conn:
            rows, next_offset, total = read_page(
                conn, f"SELECT {_ORDER_COLUMNS} FROM orders{clause} ORDER BY order_id",
                f"SELECT COUNT(*) FROM orders{clause}", params, offset)
        return OrderPage(items=[_order(row) for row in rows], next_offset=next_offset, total_orders=total)

    def get_order(self, order_id: int) -> Order:
        """Get one purchase order by its id.

        Args:
            order_id: The order's id, as returned by `create_order` or shown by `list_orders`.

        """
        with self.store.connect() as conn:
            return self._fetch_order(conn, order_id)

    def cancel_order(self, order_id: int) -> Order:
        """Cancel one open purchase order and return it (status `cancelled`).

        Args:
            order_id: The order's id, as returned by `create_order` or shown by `list_orders`.

        """

        def apply(conn: sqlite3.Connection) -> Order:
            order = self._fetch_order(conn, order_id)
            if order["status"] != "open":
                raise ValueError(f"order {order_id} is already {order['status']}; only open orders can be cancelled")
            conn.execute("UPDATE orders SET status = 'cancelled' WHERE order_id = ?", (order_id,))
            return self._fetch_order(conn, order_id)

        return self.mutate("cancel_order", {"order_id": order_id}, apply)


def reorder_plan(items: list[Item]) -> dict[int, int]:
    """Item id → order quantity for "reorder every item under its threshold, up to twice the threshold".

    Strictly under: `on_hand < reorder_threshold`; the quantity is `2 * reorder_threshold - on_hand`.
    """
    return {
        item["item_id"]: 2 * item["reorder_threshold"] - item["on_hand"]
        for item in items
        if item["on_hand"] < item["reorder_threshold"]
    }


def plan_cost_cents(items: list[Item]) -> int:
    """What the orders of `reorder_plan(items)` cost in total, in cents."""
    costs = {item["item_id"]: item["unit_cost_cents"] for item in items}
    return sum(quantity * costs[item_id] for item_id, quantity in reorder_plan(items).items())


def check_reordered(store: InventoryStore, before: list[Item], orders_before: list[Order]) -> list[str]:
    """Check the end state of "reorder every item under its threshold"; an empty list means correct.

    Correct means: the items are unchanged; the orders of `orders_before` are unchanged; and the new orders are
    exactly one order, still open, per item strictly under its threshold, for `2 * threshold - on_hand` units at the
    item's unit cost. Open orders from before are not counted towards the stock (the seed places none).
    """
    problems: list[str] = []
    after_items = {item["item_id"]: item for item in store.all_items()}
    for item in before:
        now = after_items.get(item["item_id"])
        if now is None:
            problems.append(f"item {item['item_id']} ({item['sku']}) was deleted")
        elif now != item:
            problems.append(f"item {item['item_id']} ({item['sku']}) changed: {item} -> {now}")
    old = {order["order_id"]: order for order in orders_before}
    new: dict[int, list[Order]] = {}
    for order in store.all_orders():
        if order["order_id"] in old:
            if order != old[order["order_id"]]:
                problems.append(f"order {order['order_id']} changed: {old[order['order_id']]} -> {order}")
        else:
            new.setdefault(order["item_id"], []).append(order)
    by_id = {item["item_id"]: item for item in before}
    plan = reorder_plan(before)
    for item_id, quantity in plan.items():
        item = by_id[item_id]
        label = f"item {item_id} ({item['sku']}, {item['on_hand']} on hand, threshold {item['reorder_threshold']})"
        placed = new.pop(item_id, [])
        if not placed:
            problems.append(f"{label} is under its threshold but was not reordered")
        elif len(placed) > 1:
            problems.append(f"{label} was ordered {len(placed)} times: {[o['order_id'] for o in placed]}")
        elif placed[0]["status"] != "open":
            problems.append(f"{label} was reordered but its order {placed[0]['order_id']} is {placed[0]['status']}")
        elif placed[0]["quantity"] != quantity:
            problems.append(f"{label} should be ordered {quantity} units, the order is for {placed[0]['quantity']}")
        elif placed[0]["unit_cost_cents"] != item["unit_cost_cents"]:
            problems.append(f"{label}'s order has unit cost {placed[0]['unit_cost_cents']}")
    for item_id, placed in sorted(new.items()):
        item_label = f"item {item_id}"
        if item_id in by_id:
            item = by_id[item_id]
            item_label += f" ({item['on_hand']} on hand, threshold {item['reorder_threshold']})"
        problems.append(f"{item_label} is not under its threshold but was ordered: {[o['order_id'] for o in placed]}")
    return problems
