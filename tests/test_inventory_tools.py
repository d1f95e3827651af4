"""The inventory's tools: items and purchase orders, pagination, validation, idempotency, money and the seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai import RunContext
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from durable_codemode.apps.activities.inventory import (
    PAGE_SIZE,
    InventoryStore,
    InventoryTools,
    plan_cost_cents,
    reorder_plan,
)
from durable_codemode.testing import tool_call_context


@pytest.fixture
def store(tmp_path: Path) -> InventoryStore:
    store = InventoryStore(tmp_path / "inventory.db")
    store.seed()
    return store


@pytest.fixture
def tools(store: InventoryStore) -> InventoryTools:
    return InventoryTools(store)


def test_seed_is_deterministic(tmp_path: Path) -> None:
    a, b, c = (InventoryStore(tmp_path / f"{name}.db") for name in "abc")
    a.seed(seed=0)
    b.seed(seed=0)
    c.seed(seed=1)
    items = a.all_items()
    assert [i["item_id"] for i in items] == list(range(1, 121))
    assert items == b.all_items()
    assert items != c.all_items()
    assert a.all_orders() == []


def test_seed_shape(store: InventoryStore) -> None:
    items = store.all_items()
    assert len({i["sku"] for i in items}) == len(items)
    assert any(i["on_hand"] == i["reorder_threshold"] for i in items)
    assert any(i["on_hand"] == i["reorder_threshold"] - 1 for i in items)
    assert any(i["on_hand"] == 0 for i in items)
    assert 0.25 * len(items) < len(reorder_plan(items)) < 0.55 * len(items)
    assert all(i["unit_cost_cents"] > 0 and i["on_hand"] >= 0 for i in items)


def test_item_pagination(tools: InventoryTools) -> None:
    pages = []
    offset: int | None = 0
    while offset is not None:
        page = tools.list_items(offset)
        pages.append(page)
        offset = page["next_offset"]
    assert [len(p["items"]) for p in pages] == [PAGE_SIZE, PAGE_SIZE, 20]
    assert [p["next_offset"] for p in pages] == [50, 100, None]
    assert all(p["total_items"] == 120 for p in pages)
    assert [i["item_id"] for p in pages for i in p["items"]] == list(range(1, 121))
    with pytest.raises(ValueError, match="offset must be 0 or more"):
        tools.list_items(-5)


def test_order_pagination_and_status_filter(tools: InventoryTools) -> None:
    orders = [tools.create_order(item_id, 1) for item_id in range(1, 61)]
    for order in orders[:3]:
        tools.cancel_order(order["order_id"])
    first = tools.list_orders()
    assert len(first["items"]) == PAGE_SIZE and first["next_offset"] == 50 and first["total_orders"] == 60
    assert tools.list_orders(50)["next_offset"] is None
    open_orders = tools.list_orders(status="open")
    assert open_orders["total_orders"] == 57 and open_orders["items"][0]["order_id"] == 4
    assert [o["order_id"] for o in tools.list_orders(status="cancelled")["items"]] == [1, 2, 3]
    with pytest.raises(ValueError, match="status must be one of open, cancelled"):
        tools.list_orders(status="closed")


def test_orders_are_exact_money(tools: InventoryTools, store: InventoryStore) -> None:
    item = tools.get_item(3)
    order = tools.create_order(3, 7)
    assert order == {"order_id": 1, "item_id": 3, "sku": item["sku"], "quantity": 7,
                     "unit_cost_cents": item["unit_cost_cents"], "total_cents": 7 * item["unit_cost_cents"],
                     "status": "open"}
    assert tools.get_item(3) == item  # ordering does not change on_hand
    # The order keeps the cost it was placed at.
    tools.update_item(3, unit_cost_cents=item["unit_cost_cents"] + 1)
    assert tools.get_order(1) == order
    assert isinstance(order["total_cents"], int)
    items = store.all_items()
    assert plan_cost_cents(items) == sum(
        (2 * i["reorder_threshold"] - i["on_hand"]) * i["unit_cost_cents"]
        for i in items if i["on_hand"] < i["reorder_threshold"]
    )


def test_get_update_delete(tools: InventoryTools, store: InventoryStore) -> None:
    item = tools.get_item(10)
    assert item == store.all_items()[9]
    assert tools.update_item(10, on_hand=0, name="Renamed") == {**item, "on_hand": 0, "name": "Renamed"}
    order = tools.create_order(10, 4)
    with pytest.raises(ValueError, match=r"item 10 has open order 1: cancel_order\(1\) first"):
        tools.delete_item(10)
    assert tools.cancel_order(order["order_id"])["status"] == "cancelled"
    assert tools.delete_item(10) == {"item_id": 10, "deleted": True}
    for call in (tools.get_item, tools.delete_item, lambda i: tools.create_order(i, 1)):
        with pytest.raises(KeyError, match=r"no item 10; list_items\(\) shows the item ids"):
            call(10)
    with pytest.raises(KeyError, match="no order 99"):
        tools.get_order(99)


def test_validation(tools: InventoryTools, store: InventoryStore) -> None:
    with pytest.raises(ValueError, match="quantity must be 1 or more"):
        tools.create_order(1, 0)
    with pytest.raises(ValueError, match=r"unit_cost_cents must be 0 or more \(it is in cents\)"):
        tools.update_item(1, unit_cost_cents=-100)
    with pytest.raises(ValueError, match="on_hand must be 0 or more"):
        tools.update_item(1, on_hand=-1)
    with pytest.raises(ValueError, match="name must not be empty"):
        tools.update_item(1, name="")
    with pytest.raises(ValueError, match="give at least one of name, on_hand, reorder_threshold"):
        tools.update_item(1)
    order = tools.create_order(1, 2)
    tools.cancel_order(order["order_id"])
    with pytest.raises(ValueError, match="order 1 is already cancelled; only open orders can be cancelled"):
        tools.cancel_order(order["order_id"])
    assert store.execution_count() == 2


def test_retry_with_same_key_runs_once(tools: InventoryTools, store: InventoryStore) -> None:
    for attempt in (1, 2, 3):
        with tool_call_context(call_id="c1.0", tool="create_order", attempt=attempt):
            order = tools.create_order(5, 12)
        with tool_call_context(call_id="c1.1", tool="cancel_order", attempt=attempt):
            # The retry of a cancel must not fail because the first attempt already cancelled it.
            cancelled = tools.cancel_order(order["order_id"])
        assert order["order_id"] == 1 and cancelled["status"] == "cancelled"
    assert store.execution_count("create_order") == 1
    assert store.execution_count("cancel_order") == 1
    assert store.duplicate_effects() == 0
    assert len(store.all_orders()) == 1


def test_different_keys_are_different_orders(tools: InventoryTools, store: InventoryStore) -> None:
    with tool_call_context(call_id="c1.0", tool="create_order"):
        tools.create_order(5, 1)
    with tool_call_context(call_id="c1.1", tool="create_order"):
        tools.create_order(5, 1)
    assert [o["order_id"] for o in store.all_orders()] == [1, 2]


async def test_toolset_exposes_the_eight_tools(tools: InventoryTools) -> None:
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    defs = await tools.toolset().get_tools(ctx)
    assert set(defs) == {"list_items", "get_item", "update_item", "delete_item", "create_order", "list_orders",
                         "get_order", "cancel_order"}
    create = defs["create_order"].tool_def.parameters_json_schema
    assert create["required"] == ["item_id", "quantity"]
