"""The inventory's benchmark task: its oracle, and the task end to end at N = 20 in both modes, replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from durable_codemode.apps.activities.inventory import InventoryTools, Item, plan_cost_cents, reorder_plan
from durable_codemode.apps.workflows.cart import format_cents
from durable_codemode.apps.workflows.inventory import INVENTORY_TASK, InventoryInstance
from durable_codemode.apps.workflows.tasks import Mode

from ._tasks import run_graded


def _item(item_id: int, on_hand: int, threshold: int, cost: int) -> Item:
    return Item(item_id=item_id, sku=f"SKU-{item_id}", name=f"i{item_id}", on_hand=on_hand,
                reorder_threshold=threshold, unit_cost_cents=cost)


def test_plan_is_strict_and_tops_up_to_twice_the_threshold() -> None:
    items = [_item(1, 0, 10, 250), _item(2, 10, 10, 100), _item(3, 9, 10, 333), _item(4, 50, 10, 1)]
    assert reorder_plan(items) == {1: 20, 3: 11}
    assert plan_cost_cents(items) == 20 * 250 + 11 * 333


def _apply(instance: InventoryInstance) -> None:
    tools = InventoryTools(instance.store)
    for item_id, quantity in reorder_plan(instance.before).items():
        tools.create_order(item_id, quantity)


def _reply(instance: InventoryInstance, cents_off: int = 0) -> str:
    cost = plan_cost_cents(instance.before) + cents_off
    return f"Placed {len(reorder_plan(instance.before))} orders costing {format_cents(cost)}."


def test_oracle_passes_on_the_right_end_state(tmp_path: Path) -> None:
    instance = INVENTORY_TASK.setup(tmp_path, 20)
    assert isinstance(instance, InventoryInstance)
    _apply(instance)
    assert instance.check(_reply(instance)) == []


def test_oracle_fails_on_wrong_orders_and_wrong_numbers(tmp_path: Path) -> None:
    instance = INVENTORY_TASK.setup(tmp_path, 20)
    assert isinstance(instance, InventoryInstance)
    plan = reorder_plan(instance.before)
    assert any("was not reordered" in p for p in instance.check(_reply(instance)))
    _apply(instance)
    assert any("total cost" in p for p in instance.check(_reply(instance, cents_off=1)))
    assert any("orders placed" in p for p in instance.check("Placed 999 orders costing $0.01."))
    tools = InventoryTools(instance.store)
    at_threshold = next(i for i in instance.before if i["on_hand"] == i["reorder_threshold"])
    tools.create_order(at_threshold["item_id"], 5)
    first = next(iter(plan))
    tools.create_order(first, 1)
    problems = instance.check(_reply(instance))
    assert len(problems) == 2
    assert any(f"item {at_threshold['item_id']} " in p and "not under its threshold" in p for p in problems)
    assert any(f"item {first} " in p and "ordered 2 times" in p for p in problems)


def test_oracle_fails_on_a_wrong_quantity_a_cancelled_order_and_a_changed_item(tmp_path: Path) -> None:
    instance = INVENTORY_TASK.setup(tmp_path, 20)
    assert isinstance(instance, InventoryInstance)
    tools = InventoryTools(instance.store)
    (first, q1), (second, q2), *rest = reorder_plan(instance.before).items()
    tools.create_order(first, q1 + 1)
    tools.cancel_order(tools.create_order(second, q2)["order_id"])
    for item_id, quantity in rest:
        tools.create_order(item_id, quantity)
    tools.update_item(instance.before[-1]["item_id"], on_hand=instance.before[-1]["on_hand"] + 1)
    problems = instance.check(_reply(instance))
    assert len(problems) == 3
    assert any(f"item {first} " in p and f"should be ordered {q1} units" in p for p in problems)
    assert any(f"item {second} " in p and "cancelled" in p for p in problems)
    assert any("changed" in p for p in problems)


@pytest.mark.parametrize("mode", ["on", "off"])
async def test_inventory_task_at_20_in_both_modes(client: Client, tmp_path: Path, mode: Mode) -> None:
    instance = INVENTORY_TASK.setup(tmp_path, 20)
    assert isinstance(instance, InventoryInstance)
    assert instance.agent(mode).name == "inventory"
    await run_graded(client, instance, mode)
    assert instance.store.execution_count("create_order") == len(reorder_plan(instance.before))
