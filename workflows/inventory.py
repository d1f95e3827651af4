"""The bundled inventory agent: `activities.inventory`'s tools behind code mode, and its benchmark task.

The model is chosen as for the cart (`workflows.cart`): the `model` argument, else `CODEMODE_MODEL` when an
OpenAI or Anthropic API key is set too, else `scripted_inventory_model()`, which plays the model's part offline.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_ai.models.function import FunctionModel

from durable_codemode import CodeModeAgent
from durable_codemode.apps.activities.inventory import (
    InventoryStore,
    InventoryTools,
    Item,
    check_reordered,
    plan_cost_cents,
    reorder_plan,
)
from durable_codemode.apps.workflows.cart import format_cents, model_from_env
from durable_codemode.apps.workflows.tasks import (
    SCALING_SIZES,
    Call,
    Mode,
    Seen,
    Task,
    numbers_in,
    summary_answer,
    tool_calling_model,
)
from durable_codemode.testing import RunCode, scripted_model

__all__ = [
    "DEFAULT_INVENTORY_DB",
    "INSTRUCTIONS",
    "INVENTORY_DB_ENV",
    "INVENTORY_TASK",
    "REORDER_PROMPT",
    "SCRIPTED_MODEL_NAME",
    "InventoryInstance",
    "agents",
    "inventory_agent",
    "inventory_db_path",
    "scripted_inventory_model",
]

INVENTORY_DB_ENV = "CODEMODE_INVENTORY_DB"
"""Environment variable with the inventory's SQLite file."""

DEFAULT_INVENTORY_DB = Path("~/.local/share/durable-codemode/inventory.sqlite")
"""Where the inventory lives when `CODEMODE_INVENTORY_DB` is unset (`~` is expanded when read)."""

SCRIPTED_MODEL_NAME = "scripted-inventory"
"""The `model_name` of `scripted_inventory_model()`, as runs record it."""

REORDER_PROMPT = (
    "Reorder every item that is below its reorder threshold (on hand strictly less than the threshold; an item "
    "exactly at its threshold is fine): place one purchase order per such item, for enough units to bring it to "
    "twice its threshold (2 x threshold - on hand). Then tell me how many orders you placed and what they cost "
    "in total."
)
"""The scaling task: one order per low item, with exact quantities and an exact total."""

INSTRUCTIONS = """\
You manage the warehouse's stock with the inventory tools, which you call from Python programs via run_code.

- Money is integer cents: unit_cost_cents=1250 is $12.50; an order's cost is quantity * unit_cost_cents \
(create_order returns it as total_cents). Do money arithmetic with integers.
- An item is below its threshold when on_hand < reorder_threshold, strictly; an item exactly at its threshold \
is not low. Placing an order does not change on_hand.
- list_items (and list_orders) return one page of at most 50. To see everything, page through it in one \
program: start at offset=0 and call again with next_offset until it is None. Never assume one page is all.
- There is no bulk endpoint: one create_order per item; independent calls can run together with \
asyncio.gather(...).
- If an item already has an open order (list_orders(status='open')), tell the user instead of ordering it \
again.
- Return a small summary from the program (counts, units, cent totals), not the raw items.
- Only change what the user asked for. If the request is ambiguous, ask before changing anything.
- Answer in one or two sentences: what you ordered (how many orders, how many units) and what it costs, with \
money written as dollars and cents ($1,234.56).
"""
"""What the agent is told; written for a real model (the scripted one ignores it)."""

_SCRIPTED_PROGRAM = """\
import asyncio

items = []
offset: int | None = 0
while offset is not None:
    page = await list_items(offset=offset)
    items.extend(page['items'])
    offset = page['next_offset']
low = [i for i in items if i['on_hand'] < i['reorder_threshold']]
orders = await asyncio.gather(*(
    create_order(item_id=i['item_id'], quantity=2 * i['reorder_threshold'] - i['on_hand']) for i in low
))
{
    'orders': len(orders),
    'units': sum(o['quantity'] for o in orders),
    'total_cents': sum(o['total_cents'] for o in orders),
    'items_checked': len(items),
}
"""


def _summary(orders: int, units: int, total_cents: int) -> str:
    return (
        f"Placed {orders} purchase orders ({units} units) for the items under their reorder threshold, "
        f"costing {format_cents(total_cents)} in total."
    )


_answer = summary_answer("reorder", lambda s: _summary(s["orders"], s["units"], s["total_cents"]))
"""The scripted model's final answer, from what its program returned (or how it failed)."""


def scripted_inventory_model() -> FunctionModel:
    """A scripted model that plays the model's part for `REORDER_PROMPT`, offline.

    Turn 1 is one `run_code` program that pages through every item, places one order per item strictly under
    its threshold concurrently and returns counts and the cent total; turn 2 is the answer built from it.
    Everything else in the run is real.
    """
    return scripted_model(RunCode(_SCRIPTED_PROGRAM), _answer, name=SCRIPTED_MODEL_NAME)


def inventory_db_path() -> Path:
    """The inventory's SQLite file: `CODEMODE_INVENTORY_DB` if set, else `DEFAULT_INVENTORY_DB`."""
    return Path(os.environ.get(INVENTORY_DB_ENV) or DEFAULT_INVENTORY_DB).expanduser()


def inventory_agent(
    store: InventoryStore, *, model: Model | str | None = None, code_mode: bool = True
) -> CodeModeAgent:
    """The inventory agent (named `inventory`) over `store`.

    Args:
        store: The inventory it manages; its tools read and change this SQLite file.
        model: A pydantic-ai model or model string; `None`: `CODEMODE_MODEL` if an API key is set too,
            else `scripted_inventory_model()`.
        code_mode: False: every tool is a direct tool call (the benchmark's "tool calling" mode).

    """
    chosen: Model | str = model or model_from_env() or scripted_inventory_model()
    agent = Agent(chosen, name="inventory", instructions=INSTRUCTIONS, toolsets=[InventoryTools(store).toolset()])
    return CodeModeAgent(agent, code_mode=code_mode)


def agents() -> list[CodeModeAgent]:
    """The inventory agent over `inventory_db_path()`, seeded with 120 items if the file is new."""
    path = inventory_db_path()
    store = InventoryStore(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        store.seed(items=120)
    return [inventory_agent(store)]


# -- the benchmark task ------------------------------------------------------------------------------------------


def _tool_calling_policy(seen: list[Seen]) -> list[Call] | str:
    """Page through every item first, then order each low item once (in batches), then answer from the orders."""
    pages = [s.result for s in seen if s.tool == "list_items" and s.ok]
    if not pages:
        return [Call("list_items", {"offset": 0})]
    if pages[-1]["next_offset"] is not None:
        return [Call("list_items", {"offset": pages[-1]["next_offset"]})]
    items: list[Item] = [item for page in pages for item in page["items"]]
    ordered = {s.args["item_id"] for s in seen if s.tool == "create_order"}
    todo = [
        Call("create_order", {"item_id": item["item_id"], "quantity": 2 * item["reorder_threshold"] - item["on_hand"]})
        for item in items
        if item["on_hand"] < item["reorder_threshold"] and item["item_id"] not in ordered
    ]
    if todo:
        return todo
    orders = [s.result for s in seen if s.tool == "create_order" and s.ok]
    return _summary(len(orders), sum(o["quantity"] for o in orders), sum(o["total_cents"] for o in orders))


class InventoryInstance:
    """`inventory.reorder-low` at one N (see `workflows.tasks.Instance`)."""

    def __init__(self, workdir: Path, n: int) -> None:
        """Seed an inventory of `n` items (and no orders) in `workdir`."""
        self.store = InventoryStore(workdir / "inventory.sqlite")
        self.store.seed(items=n, seed=n)
        self.before = self.store.all_items()
        self.orders_before = self.store.all_orders()
        self.prompt = REORDER_PROMPT

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        """The inventory agent; scripted for `mode` when `model` is None."""
        scripted: Model = (
            scripted_inventory_model() if mode == "on"
            else tool_calling_model(_tool_calling_policy, name="scripted-tool-calling-inventory")
        )
        return inventory_agent(self.store, model=model or scripted, code_mode=mode == "on")

    def check(self, reply: str) -> list[str]:
        """Exactly the right orders were placed, nothing else changed, and the reply states the count and cost."""
        problems = check_reordered(self.store, self.before, self.orders_before)
        numbers = numbers_in(reply)
        count = len(reorder_plan(self.before))
        cost = format_cents(plan_cost_cents(self.before))[1:].replace(",", "")
        for label, expected in (("orders placed", str(count)), ("their total cost", cost)):
            if expected not in numbers:
                problems.append(f"the reply does not state {label} ({expected}): {reply!r}")
        return problems

    def duplicate_effects(self) -> int:
        """Side effects that ran more than once."""
        return self.store.duplicate_effects()


INVENTORY_TASK = Task(
    name="inventory.reorder-low",
    apps=("inventory",),
    kind="scaling",
    sizes=SCALING_SIZES,
    setup=InventoryInstance,
    description="order every item under its threshold up to twice the threshold; report orders and total cost",
)
"""The inventory's scaling task."""
