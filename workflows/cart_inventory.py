"""A long-horizon job across two apps: check the cart against the warehouse, fix it, and reorder what ran out.

`cart-inventory.stock-check` (`CART_INVENTORY_TASK`): a cart of N lines (60-500), each naming an inventory item
by its SKU, over an inventory of 1.5 N items. The job reads both apps in full, then changes both: it removes
the cart lines whose item is out of stock, cuts the lines that want more than is on hand, and places one
purchase order per removed line. Each step needs what the earlier ones read from the other app, and the oracle
recomputes the exact end state of both stores from the seed.

The agent is named after the task's apps (`cart-inventory`) and has both apps' tools.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.models import Model

from durable_codemode import CodeModeAgent
from durable_codemode.apps.activities.cart import CartLine, CartStore, CartTools
from durable_codemode.apps.activities.inventory import InventoryStore, InventoryTools, Item
from durable_codemode.apps.workflows.cart import cart_db_path, format_cents, model_from_env
from durable_codemode.apps.workflows.long import LONG_LIMITS, LONG_SIZES
from durable_codemode.apps.workflows.tasks import (
    Call,
    Mode,
    Seen,
    Task,
    as_json,
    numbers_in,
    summary_answer,
    tool_calling_model,
)
from durable_codemode.testing import RunCode, scripted_model

__all__ = ["AGENT_NAME", "CART_INVENTORY_TASK", "INSTRUCTIONS", "StockCheckInstance", "agents"]

AGENT_NAME = "cart-inventory"
"""The agent with both apps' tools."""

INSTRUCTIONS = """\
You manage the user's shopping cart and the warehouse's stock with the cart and inventory tools, which you call \
from Python programs via run_code.

- Each cart line's product ends with its inventory item's SKU in parentheses: "Hex bolt M6 #3 (SKU-00003)".
- Money is integer cents (unit_price_cents=5000 is $50.00); a line's cost is unit_price_cents * quantity, an \
order's cost quantity * unit_cost_cents. Do money arithmetic with integers.
- list_cart, list_items and list_orders return pages of at most 50: page through with next_offset until it is \
None, in one program. Never assume one page is all.
- There is no bulk endpoint: one call per line, item or order; independent calls can run together with \
asyncio.gather(...).
- Return a small summary from the program (counts and cent totals), not the raw records.
- Only change what the user asked for. Answer in one or two sentences, money as dollars and cents ($1,234.56).
"""
"""What the agent is told; written for a real model (the scripted ones ignore it)."""

PROMPT = (
    "Check my cart against the warehouse. 1. Remove every cart line whose item has 0 units on hand. 2. Every "
    "other line that wants more units than its item has on hand: reduce its quantity to the units on hand. "
    "3. For each line you removed, place one purchase order for its item, for the line's quantity plus the "
    "item's reorder threshold. 4. Tell me how many lines you removed, how many you reduced, how many orders you "
    "placed, what the orders cost in total, and the cart's total now."
)

_PROGRAM = """\
import asyncio

lines = []
offset: int | None = 0
while offset is not None:
    page = await list_cart(offset=offset)
    lines.extend(page['items'])
    offset = page['next_offset']
items = {}
offset = 0
while offset is not None:
    page = await list_items(offset=offset)
    for item in page['items']:
        items[item['sku']] = item
    offset = page['next_offset']
removed, reduced, orders = [], [], []
for line in lines:
    item = items[line['product'].rsplit('(', 1)[1].rstrip(')')]
    if item['on_hand'] == 0:
        removed.append(line)
        orders.append((item, line['quantity'] + item['reorder_threshold']))
    elif line['quantity'] > item['on_hand']:
        reduced.append((line, item['on_hand']))
        line['quantity'] = item['on_hand']
await asyncio.gather(
    *(remove_line(line_id=l['line_id']) for l in removed),
    *(update_quantity(line_id=l['line_id'], quantity=q) for l, q in reduced),
)
placed = await asyncio.gather(*(create_order(item_id=i['item_id'], quantity=q) for i, q in orders))
gone = {l['line_id'] for l in removed}
kept = [l for l in lines if l['line_id'] not in gone]
{
    'removed': len(removed),
    'reduced': len(reduced),
    'orders': len(orders),
    'orders_cents': sum(o['total_cents'] for o in placed),
    'cart_cents': sum(l['unit_price_cents'] * l['quantity'] for l in kept),
}
"""


def _sku(line: CartLine) -> str:
    return line["product"].rsplit("(", 1)[1].rstrip(")")


def _reply(removed: int, reduced: int, orders: int, orders_cents: int, cart_cents: int) -> str:
    return (f"Removed {removed} lines whose items are out of stock and reduced {reduced} lines to what is on hand; "
            f"placed {orders} purchase orders costing {format_cents(orders_cents)}; the cart now totals "
            f"{format_cents(cart_cents)}.")


def _plan(lines: list[CartLine], items: list[Item]) -> tuple[list[CartLine], dict[int, int], dict[int, int]]:
    """The cart after the job, the reductions `{line_id: quantity}` and the orders `{item_id: quantity}`."""
    by_sku = {item["sku"]: item for item in items}
    after: list[CartLine] = []
    reduced: dict[int, int] = {}
    orders: dict[int, int] = {}
    for line in lines:
        item = by_sku[_sku(line)]
        if item["on_hand"] == 0:
            orders[item["item_id"]] = line["quantity"] + item["reorder_threshold"]
            continue
        if line["quantity"] > item["on_hand"]:
            reduced[line["line_id"]] = item["on_hand"]
            line = CartLine(line_id=line["line_id"], product=line["product"],
                            unit_price_cents=line["unit_price_cents"], quantity=item["on_hand"])
        after.append(line)
    return after, reduced, orders


def _seed(cart: CartStore, inventory: InventoryStore, n: int) -> None:
    """An inventory of 1.5 N items and a cart of N lines, one per distinct item, some wanting more than is there.

    There is always a line whose item has exactly the units it wants (not to be reduced) and one whose item has
    none (to be removed), so "more than on hand" has to be read as strict.
    """
    inventory.seed(items=n + n // 2, seed=n)
    rng = random.Random(n)
    items = rng.sample(inventory.all_items(), n)
    quantities = [rng.randint(1, 12) for _ in items]
    exact = next((i for i, item in enumerate(items) if 1 <= item["on_hand"] <= 12), None)
    if exact is not None:
        quantities[exact] = items[exact]["on_hand"]
    if not any(item["on_hand"] == 0 for item in items) and len(items) > 1:
        # Some N draw no out-of-stock item (N=5 did, and `codemode bench --n 5,20` failed on it): make one, the
        # first line's other than the exact one, so every N >= 2 has a line to remove. N that drew one are unchanged.
        zero = next(i for i in range(len(items)) if i != exact)
        with inventory.write() as conn:
            conn.execute("UPDATE items SET on_hand = 0 WHERE item_id = ?", (items[zero]["item_id"],))
        items[zero] = {**items[zero], "on_hand": 0}
    if not any(item["on_hand"] == 0 for item in items):
        raise ValueError(f"the cart of N={n} lines needs at least 2 lines (one to remove, one to keep)")
    rows = [(line_id, f"{item['name']} ({item['sku']})", item["unit_cost_cents"] * 3 // 2, quantity)
            for line_id, (item, quantity) in enumerate(zip(items, quantities, strict=True), start=1)]
    cart.create_schema()
    with cart.write() as conn:
        cart.reset(conn)
        conn.executemany("INSERT INTO lines (line_id, product, unit_price_cents, quantity) VALUES (?, ?, ?, ?)", rows)


def stock_check_agent(
    cart: CartStore, inventory: InventoryStore, model: Model | str, *, code_mode: bool = True
) -> CodeModeAgent:
    """The `cart-inventory` agent: both apps' tools over these two stores."""
    agent = Agent(model, name=AGENT_NAME, instructions=INSTRUCTIONS,
                  toolsets=[CartTools(cart).toolset(), InventoryTools(inventory).toolset()])
    return CodeModeAgent(agent, code_mode=code_mode, limits=LONG_LIMITS)


_answer = summary_answer("finish the stock check", lambda s: _reply(s["removed"], s["reduced"], s["orders"],
                                                                   s["orders_cents"], s["cart_cents"]))
"""The scripted code-mode model's final answer."""


class StockCheckInstance:
    """`cart-inventory.stock-check` at N cart lines (see `workflows.tasks.Instance`)."""

    def __init__(self, workdir: Path, n: int) -> None:
        """Seed both apps in `workdir`."""
        self.cart = CartStore(workdir / "cart.sqlite")
        self.inventory = InventoryStore(workdir / "inventory.sqlite")
        _seed(self.cart, self.inventory, n)
        self.lines_before = self.cart.all_lines()
        self.items_before = self.inventory.all_items()
        self.prompt = PROMPT

    def _policy(self, seen: list[Seen]) -> list[Call] | str:
        """Page through the cart and the items side by side, then make every change at once, then answer."""
        calls: list[Call] = []
        pages: dict[str, list[Any]] = {}
        for tool in ("list_cart", "list_items"):
            pages[tool] = [s.result for s in seen if s.tool == tool and s.ok]
            if not pages[tool]:
                calls.append(Call(tool, {"offset": 0}))
            elif pages[tool][-1]["next_offset"] is not None:
                calls.append(Call(tool, {"offset": pages[tool][-1]["next_offset"]}))
        if calls:
            return calls
        lines: list[CartLine] = [line for page in pages["list_cart"] for line in page["items"]]
        items: list[Item] = [item for page in pages["list_items"] for item in page["items"]]
        after, reduced, orders = _plan(lines, items)
        kept = {line["line_id"] for line in after}
        wanted = (
            [Call("remove_line", {"line_id": line["line_id"]}) for line in lines if line["line_id"] not in kept]
            + [Call("update_quantity", {"line_id": i, "quantity": q}) for i, q in reduced.items()]
            + [Call("create_order", {"item_id": i, "quantity": q}) for i, q in orders.items()]
        )
        made = {(s.tool, as_json(s.args)) for s in seen}
        todo = [call for call in wanted if (call.tool, as_json(call.args)) not in made]
        if todo:
            return todo
        by_id = {item["item_id"]: item for item in items}
        orders_cents = sum(q * by_id[i]["unit_cost_cents"] for i, q in orders.items())
        cart_cents = sum(line["unit_price_cents"] * line["quantity"] for line in after)
        return _reply(len(lines) - len(after), len(reduced), len(orders), orders_cents, cart_cents)

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        """The `cart-inventory` agent; scripted for `mode` when `model` is None."""
        if model is None:
            model = (scripted_model(RunCode(_PROGRAM), _answer, name="scripted-cart-inventory")
                     if mode == "on" else
                     tool_calling_model(self._policy, name="scripted-tool-calling-cart-inventory"))
        return stock_check_agent(self.cart, self.inventory, model, code_mode=mode == "on")

    def check(self, reply: str) -> list[str]:
        """Both stores are exactly as the job leaves them, and the reply states the five numbers."""
        after, reduced, orders = _plan(self.lines_before, self.items_before)
        problems: list[str] = []
        expected = {line["line_id"]: line for line in after}
        got = {line["line_id"]: line for line in self.cart.all_lines()}
        for line_id in sorted(expected.keys() | got.keys()):
            want, have = expected.get(line_id), got.get(line_id)
            if want == have:
                continue
            if have is None:
                problems.append(f"cart line {line_id} was removed but should be {as_json(want)}")
            elif want is None:
                problems.append(f"cart line {line_id} should have been removed (or was added): {as_json(have)}")
            else:
                problems.append(f"cart line {line_id} is {as_json(have)}, expected {as_json(want)}")
        if self.inventory.all_items() != self.items_before:
            problems.append("inventory items changed; the job changes only the cart and places orders")
        placed = [(o["item_id"], o["quantity"], o["status"]) for o in self.inventory.all_orders()]
        if sorted(placed) != sorted((i, q, "open") for i, q in orders.items()):
            problems.append(f"orders placed {as_json(sorted(placed))}, expected {as_json(sorted(orders.items()))} "
                            "(item_id, quantity), each open")
        by_id = {item["item_id"]: item for item in self.items_before}
        orders_cents = sum(q * by_id[i]["unit_cost_cents"] for i, q in orders.items())
        cart_cents = sum(line["unit_price_cents"] * line["quantity"] for line in after)
        numbers = numbers_in(reply)
        for label, value in (
            ("lines removed", str(len(self.lines_before) - len(after))), ("lines reduced", str(len(reduced))),
            ("orders placed", str(len(orders))), ("the orders' cost", format_cents(orders_cents)[1:]),
            ("the cart's total", format_cents(cart_cents)[1:]),
        ):
            if value.replace(",", "") not in numbers:
                problems.append(f"the reply does not state {label} ({value}): {reply!r}")
        return problems

    def duplicate_effects(self) -> int:
        """Side effects that ran more than once, in either store."""
        return self.cart.duplicate_effects() + self.inventory.duplicate_effects()


def agents() -> list[CodeModeAgent]:
    """The `cart-inventory` agent over the cart's and the inventory's default stores, for the bundled worker."""
    from durable_codemode.apps.workflows.inventory import inventory_db_path

    cart, inventory = CartStore(cart_db_path()), InventoryStore(inventory_db_path())
    for store in (cart, inventory):
        Path(store.path).parent.mkdir(parents=True, exist_ok=True)
        store.create_schema()
    # No scripted model can play a real one for any prompt over two apps: offline, the agent says so and
    # changes nothing (`codemode bench` runs this task with its own scripted models).
    offline = scripted_model(f"The {AGENT_NAME} agent needs a real model: set CODEMODE_MODEL (e.g. openai:gpt-5) "
                             "and its API key, or pass --model to `codemode run`.", name="scripted-no-model")
    return [stock_check_agent(cart, inventory, model_from_env() or offline)]


CART_INVENTORY_TASK = Task(
    name="cart-inventory.stock-check",
    apps=("cart", "inventory"),
    kind="long",
    sizes=LONG_SIZES,
    setup=StockCheckInstance,
    description="remove cart lines out of stock, cut lines to what is on hand, reorder what ran out",
)
