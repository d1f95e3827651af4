"""The shopping-cart app's tools: CRUD behaviour, pagination, validation, idempotency and the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai import RunContext
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from durable_codemode import ToolCallContext
from durable_codemode.apps.activities.cart import PAGE_SIZE, CartStore, CartTools, check_removed_over, over_threshold
from durable_codemode.worker._context import bind_call


@pytest.fixture
def store(tmp_path: Path) -> CartStore:
    store = CartStore(tmp_path / "cart.db")
    store.create_schema()
    store.seed()
    return store


@pytest.fixture
def tools(store: CartStore) -> CartTools:
    return CartTools(store)


def _call(call_id: str, tool: str, attempt: int = 1) -> ToolCallContext:
    return ToolCallContext(workflow_id="wf", call_id=call_id, tool=tool, attempt=attempt)


def test_seed_is_deterministic(tmp_path: Path) -> None:
    a, b, c = (CartStore(tmp_path / f"{name}.db") for name in "abc")
    a.seed(seed=0)
    b.seed(seed=0)
    c.seed(seed=1)
    lines = a.all_lines()
    assert len(lines) == 122
    assert [line["line_id"] for line in lines] == list(range(1, 123))
    assert lines == b.all_lines()
    assert lines != c.all_lines()


def test_seed_price_distribution(store: CartStore) -> None:
    lines = store.all_lines()
    prices = [line["unit_price_cents"] for line in lines]
    assert 5000 in prices and 5001 in prices
    assert all(199 <= p <= 24_999 for p in prices)
    assert all(1 <= line["quantity"] <= 5 for line in lines)
    over = len(over_threshold(lines))
    assert 0.2 * len(lines) < over < 0.5 * len(lines)
    assert all("#" in line["product"] for line in lines)


def test_reseed_replaces_everything(store: CartStore, tools: CartTools) -> None:
    original = store.all_lines()
    tools.add_line("Extra", 100)
    tools.remove_line(1)
    assert store.execution_count() == 2
    store.seed()
    assert store.all_lines() == original
    assert store.execution_count() == 0


def test_pagination(tools: CartTools) -> None:
    pages = []
    offset: int | None = 0
    while offset is not None:
        page = tools.list_cart(offset)
        pages.append(page)
        offset = page["next_offset"]
    assert [len(p["items"]) for p in pages] == [PAGE_SIZE, PAGE_SIZE, 22]
    assert [p["next_offset"] for p in pages] == [50, 100, None]
    assert all(p["total_lines"] == 122 for p in pages)
    ids = [line["line_id"] for p in pages for line in p["items"]]
    assert ids == sorted(ids) and len(set(ids)) == 122
    assert tools.list_cart(500) == {"items": [], "next_offset": None, "total_lines": 122}


def test_negative_offset_rejected(tools: CartTools) -> None:
    with pytest.raises(ValueError, match="offset must be 0 or more"):
        tools.list_cart(-1)


def test_get_line(tools: CartTools, store: CartStore) -> None:
    assert tools.get_line(7) == store.all_lines()[6]
    with pytest.raises(KeyError, match=r"no cart line 999; list_cart\(\) shows the line ids"):
        tools.get_line(999)


def test_add_line_validation(tools: CartTools) -> None:
    with pytest.raises(ValueError, match="product must not be empty"):
        tools.add_line("  ", 100)
    with pytest.raises(ValueError, match="unit_price_cents must be 0 or more"):
        tools.add_line("Mug", -1)
    with pytest.raises(ValueError, match="quantity must be 1 or more"):
        tools.add_line("Mug", 100, quantity=0)


def test_add_and_update(tools: CartTools, store: CartStore) -> None:
    added = tools.add_line("Mug", 1299, quantity=2)
    assert added == {"line_id": 123, "product": "Mug", "unit_price_cents": 1299, "quantity": 2}
    assert tools.get_line(123) == added
    updated = tools.update_quantity(123, 4)
    assert updated == {**added, "quantity": 4}
    with pytest.raises(ValueError, match="use remove_line to remove a line"):
        tools.update_quantity(123, 0)
    with pytest.raises(KeyError, match="no cart line 999"):
        tools.update_quantity(999, 1)
    # A failed mutation leaves no execution behind.
    assert store.execution_count() == 2


def test_line_ids_are_not_reused(tools: CartTools) -> None:
    tools.remove_line(122)
    assert tools.add_line("Mug", 100)["line_id"] == 123


def test_money_is_exact(tools: CartTools, store: CartStore) -> None:
    before = sum(line["unit_price_cents"] * line["quantity"] for line in store.all_lines())
    tools.add_line("Penny sweets", 1, quantity=3)
    tools.add_line("Dime bag", 10)
    after = sum(line["unit_price_cents"] * line["quantity"] for line in store.all_lines())
    assert after - before == 13
    assert all(isinstance(line["unit_price_cents"], int) for line in store.all_lines())


def test_remove_then_get(tools: CartTools) -> None:
    assert tools.remove_line(5) == {"line_id": 5, "removed": True}
    with pytest.raises(KeyError, match="no cart line 5"):
        tools.get_line(5)
    with pytest.raises(KeyError, match="no cart line 5"):
        tools.remove_line(5)
    assert tools.list_cart()["total_lines"] == 121


def test_retry_with_same_key_runs_once(tools: CartTools, store: CartStore) -> None:
    with bind_call(_call("c1.0", "remove_line", attempt=1)):
        first = tools.remove_line(3)
    # The retry of the same call: the line is already gone, but it must not fail or remove anything else.
    with bind_call(_call("c1.0", "remove_line", attempt=2)):
        second = tools.remove_line(3)
    assert first == second == {"line_id": 3, "removed": True}
    assert store.execution_count("remove_line") == 1
    assert store.duplicate_effects() == 0
    assert len(store.all_lines()) == 121


def test_retry_of_add_and_update_runs_once(tools: CartTools, store: CartStore) -> None:
    for attempt in (1, 2, 3):
        with bind_call(_call("c2.0", "add_line", attempt)):
            added = tools.add_line("Mug", 500)
        with bind_call(_call("c2.1", "update_quantity", attempt)):
            updated = tools.update_quantity(added["line_id"], 3)
        assert added["line_id"] == 123 and updated["quantity"] == 3
    assert store.execution_count("add_line") == 1
    assert store.execution_count("update_quantity") == 1
    assert store.duplicate_effects() == 0
    assert len(store.all_lines()) == 123


def test_different_keys_are_different_calls(tools: CartTools, store: CartStore) -> None:
    with bind_call(_call("c1.0", "remove_line")):
        tools.remove_line(1)
    with bind_call(_call("c1.1", "remove_line")):
        tools.remove_line(2)
    assert store.execution_count("remove_line") == 2


def test_no_key_no_dedup(tools: CartTools, store: CartStore) -> None:
    tools.remove_line(1)
    tools.remove_line(2)
    assert store.execution_count() == 2
    assert store.execution_count("remove_line") == 2
    assert store.execution_count("add_line") == 0
    assert store.duplicate_effects() == 0


def test_oracle_accepts_correct_end_state(tools: CartTools, store: CartStore) -> None:
    before = store.all_lines()
    doomed = over_threshold(before)
    assert all(line["unit_price_cents"] > 5000 for line in doomed)
    assert not any(line["unit_price_cents"] == 5000 for line in doomed)
    assert check_removed_over(store, before)  # nothing removed yet: wrong
    for line in doomed:
        tools.remove_line(line["line_id"])
    assert check_removed_over(store, before) == []


def test_oracle_reports_problems(tools: CartTools, store: CartStore) -> None:
    before = store.all_lines()
    doomed = over_threshold(before)
    at_5000 = next(line for line in before if line["unit_price_cents"] == 5000)
    for line in doomed[1:]:
        tools.remove_line(line["line_id"])
    tools.remove_line(at_5000["line_id"])
    problems = check_removed_over(store, before)
    assert len(problems) == 2
    assert f"line {doomed[0]['line_id']} " in problems[0] or f"line {doomed[0]['line_id']} " in problems[1]
    assert any("is still in the cart" in p for p in problems)
    assert any(f"line {at_5000['line_id']} " in p and "was removed" in p for p in problems)


def test_oracle_reports_changes_and_additions(tools: CartTools, store: CartStore) -> None:
    before = store.all_lines()
    for line in over_threshold(before):
        tools.remove_line(line["line_id"])
    keep = next(line for line in before if line["unit_price_cents"] <= 5000)
    tools.update_quantity(keep["line_id"], keep["quantity"] % 5 + 1)
    tools.add_line("Extra", 100)
    problems = check_removed_over(store, before)
    assert len(problems) == 2
    assert any("changed" in p for p in problems)
    assert any("was added" in p for p in problems)


async def test_toolset_exposes_the_five_tools(tools: CartTools) -> None:
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    defs = await tools.toolset().get_tools(ctx)
    assert set(defs) == {"list_cart", "get_line", "add_line", "update_quantity", "remove_line"}
    add = defs["add_line"].tool_def
    props = add.parameters_json_schema["properties"]
    assert set(props) == {"product", "unit_price_cents", "quantity"}
    # The Args: sections reach the model as parameter descriptions.
    assert "cents" in props["unit_price_cents"]["description"]
    assert add.parameters_json_schema["required"] == ["product", "unit_price_cents"]
