"""The long-horizon tasks end to end on the real dev server: graded by their oracles, no effect twice, replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from durable_codemode.apps.workflows.cart_inventory import CART_INVENTORY_TASK, StockCheckInstance
from durable_codemode.apps.workflows.long import LONG_CART_TASK, CapAndBudgetInstance
from durable_codemode.apps.workflows.tasks import Mode, Task

from ._tasks import run_graded


async def _run(client: Client, task: Task, tmp_path: Path, n: int, mode: Mode) -> tuple[object, str, int]:
    instance = task.setup(tmp_path, n)
    result = await run_graded(client, instance, mode)
    return instance, result.output, len(result.nested_calls) + len(result.direct_calls)


@pytest.mark.parametrize(("n", "mode"), [(60, "on"), (500, "on"), (60, "off")])
async def test_cap_and_budget(client: Client, tmp_path: Path, n: int, mode: Mode) -> None:
    instance, _, calls = await _run(client, LONG_CART_TASK, tmp_path, n, mode)
    assert isinstance(instance, CapAndBudgetInstance)
    capped = sum(line["quantity"] > 3 for line in instance.before)
    removed = n - len(instance.store.all_lines())
    assert capped > 0 and removed > 0  # both steps had work to do, or the test proves little
    assert calls == -(-n // 50) + capped + removed  # every page once, every change once, nothing else


def test_cap_and_budget_oracle_catches_a_skipped_step_and_wrong_numbers(tmp_path: Path) -> None:
    instance = LONG_CART_TASK.setup(tmp_path, 60)
    assert isinstance(instance, CapAndBudgetInstance)
    problems = instance.check("Done: 0 lines capped, 0 removed.")
    assert any("should have been removed" in p for p in problems)
    assert any("is {" in p and "expected" in p for p in problems)  # a quantity over the cap was left
    assert any("does not state the total" in p for p in problems)


@pytest.mark.parametrize(("n", "mode"), [(60, "on"), (200, "on"), (60, "off")])
async def test_stock_check_across_cart_and_inventory(client: Client, tmp_path: Path, n: int, mode: Mode) -> None:
    instance, _, calls = await _run(client, CART_INVENTORY_TASK, tmp_path, n, mode)
    assert isinstance(instance, StockCheckInstance)
    on_hand = {f"({item['sku']})": item["on_hand"] for item in instance.items_before}
    wants = [(line["quantity"], on_hand[line["product"].rsplit(" ", 1)[1]]) for line in instance.lines_before]
    removed = sum(have == 0 for _, have in wants)
    reduced = sum(0 < have < want for want, have in wants)
    assert removed > 0 and reduced > 0 and any(want == have for want, have in wants)  # every case is seeded
    orders = instance.inventory.all_orders()
    assert len(orders) == removed and len(instance.cart.all_lines()) == n - removed
    pages = -(-n // 50) + -(-(n + n // 2) // 50)
    assert calls == pages + 2 * removed + reduced  # both apps paged once; each change made once


def test_stock_check_oracle_catches_missing_orders_and_wrong_numbers(tmp_path: Path) -> None:
    instance = CART_INVENTORY_TASK.setup(tmp_path, 60)
    assert isinstance(instance, StockCheckInstance)
    problems = instance.check("Removed 0 lines and reduced 0; placed 0 orders costing $0.00.")
    assert any("should have been removed" in p for p in problems)
    assert any(p.startswith("orders placed []") for p in problems)
    assert any("does not state the cart's total" in p for p in problems)


def test_the_cross_app_agent_has_both_apps_tools(tmp_path: Path) -> None:
    agent = CART_INVENTORY_TASK.setup(tmp_path, 60).agent("on")
    assert agent.name == "cart-inventory"
    tools = {t.name for toolset in agent.agent.toolsets for t in getattr(toolset, "tools", {}).values()}
    assert {"list_cart", "remove_line", "update_quantity", "list_items", "create_order"} <= tools
