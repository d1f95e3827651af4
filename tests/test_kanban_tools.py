"""The kanban board's tools: CRUD behaviour, filtered pagination, validation, idempotency and the seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai import RunContext
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from durable_codemode.apps.activities.kanban import (
    PAGE_SIZE,
    PRIORITIES,
    STATUSES,
    TEAM,
    KanbanStore,
    KanbanTools,
    TaskPage,
    open_points,
)
from durable_codemode.testing import tool_call_context


@pytest.fixture
def store(tmp_path: Path) -> KanbanStore:
    store = KanbanStore(tmp_path / "kanban.db")
    store.seed()
    return store


@pytest.fixture
def tools(store: KanbanStore) -> KanbanTools:
    return KanbanTools(store)


def _pages(tools: KanbanTools, **filters: str) -> list[TaskPage]:
    pages = []
    offset: int | None = 0
    while offset is not None:
        page = tools.list_tasks(offset, **filters)
        pages.append(page)
        offset = page["next_offset"]
    return pages


def test_seed_is_deterministic(tmp_path: Path) -> None:
    a, b, c = (KanbanStore(tmp_path / f"{name}.db") for name in "abc")
    a.seed(seed=0)
    b.seed(seed=0)
    c.seed(seed=1)
    tasks = a.all_tasks()
    assert [t["task_id"] for t in tasks] == list(range(1, 121))
    assert tasks == b.all_tasks()
    assert tasks != c.all_tasks()


def test_seed_shape(store: KanbanStore) -> None:
    tasks = store.all_tasks()
    assert {t["assignee"] for t in tasks} == set(TEAM)
    assert {t["priority"] for t in tasks} == set(PRIORITIES)
    assert {t["status"] for t in tasks} == set(STATUSES)
    loads = open_points(tasks)
    assert loads["Alex"] == max(loads.values())  # the overloaded one
    assert any(t["assignee"] == "Alex" and t["priority"] == "urgent" and t["status"] != "done" for t in tasks)
    for n in (1, 5):
        small = KanbanStore(store.path + f".{n}")
        small.seed(tasks=n, seed=n)
        assert any(t["assignee"] == "Alex" and t["priority"] == "urgent" for t in small.all_tasks())


def test_pagination(tools: KanbanTools) -> None:
    pages = _pages(tools)
    assert [len(p["items"]) for p in pages] == [PAGE_SIZE, PAGE_SIZE, 20]
    assert [p["next_offset"] for p in pages] == [50, 100, None]
    assert all(p["total_tasks"] == 120 for p in pages)
    ids = [t["task_id"] for p in pages for t in p["items"]]
    assert ids == list(range(1, 121))
    assert tools.list_tasks(500) == {"items": [], "next_offset": None, "total_tasks": 120}


def test_filtered_pagination(tools: KanbanTools, store: KanbanStore) -> None:
    alex = [t for t in store.all_tasks() if t["assignee"] == "Alex"]
    assert len(alex) > PAGE_SIZE  # the filter itself spans pages
    pages = _pages(tools, assignee="Alex")
    assert [t for p in pages for t in p["items"]] == alex
    assert pages[0]["total_tasks"] == len(alex) and pages[0]["next_offset"] == PAGE_SIZE
    done = [t for t in alex if t["status"] == "done"]
    assert [t for p in _pages(tools, assignee="Alex", status="done") for t in p["items"]] == done


def test_filter_validation(tools: KanbanTools) -> None:
    with pytest.raises(ValueError, match="offset must be 0 or more"):
        tools.list_tasks(-1)
    with pytest.raises(ValueError, match="assignee must be one of the team: Alex, Blair, Casey, Devon, Emery"):
        tools.list_tasks(assignee="alex")
    with pytest.raises(ValueError, match="status must be one of open, in_progress, done"):
        tools.list_tasks(status="todo")


def test_get_task(tools: KanbanTools, store: KanbanStore) -> None:
    assert tools.get_task(7) == store.all_tasks()[6]
    with pytest.raises(KeyError, match=r"no task 999; list_tasks\(\) shows the task ids"):
        tools.get_task(999)


def test_list_people(tools: KanbanTools) -> None:
    assert tools.list_people() == ["Alex", "Blair", "Casey", "Devon", "Emery"]


def test_create_update_delete(tools: KanbanTools, store: KanbanStore) -> None:
    created = tools.create_task("Ship it", "Casey", priority="urgent", points=8)
    assert created == {"task_id": 121, "title": "Ship it", "assignee": "Casey", "priority": "urgent",
                       "status": "open", "points": 8}
    moved = tools.update_task(121, assignee="Devon", status="in_progress")
    assert moved == {**created, "assignee": "Devon", "status": "in_progress"}
    assert tools.update_task(121, priority="low", points=0) == {**moved, "priority": "low", "points": 0}
    assert tools.delete_task(121) == {"task_id": 121, "deleted": True}
    with pytest.raises(KeyError, match="no task 121"):
        tools.get_task(121)
    with pytest.raises(KeyError, match="no task 121"):
        tools.update_task(121, points=1)
    with pytest.raises(KeyError, match="no task 121"):
        tools.delete_task(121)
    assert tools.create_task("Next", "Alex")["task_id"] == 122  # ids are never reused
    assert store.execution_count() == 5  # failed mutations leave no execution behind


def test_update_validation(tools: KanbanTools, store: KanbanStore) -> None:
    before = tools.get_task(1)
    with pytest.raises(ValueError, match="priority must be one of low, medium, high, urgent"):
        tools.update_task(1, priority="critical")
    with pytest.raises(ValueError, match="status must be one of open, in_progress, done"):
        tools.update_task(1, status="closed")
    with pytest.raises(ValueError, match=r"one of the team: Alex, Blair, Casey, Devon, Emery \(got 'Zoe'\)"):
        tools.update_task(1, assignee="Zoe")
    with pytest.raises(ValueError, match="points must be between 0 and 100"):
        tools.update_task(1, points=-1)
    with pytest.raises(ValueError, match="give at least one of assignee, status, priority, points"):
        tools.update_task(1)
    # A bad field fails the whole call: nothing of a partly valid update is applied.
    with pytest.raises(ValueError, match="priority"):
        tools.update_task(1, assignee="Blair", priority="p0")
    assert tools.get_task(1) == before
    assert store.execution_count() == 0


def test_create_validation(tools: KanbanTools) -> None:
    with pytest.raises(ValueError, match="title must not be empty"):
        tools.create_task(" ", "Alex")
    with pytest.raises(ValueError, match="assignee must be one of the team"):
        tools.create_task("x", "Nobody")
    with pytest.raises(ValueError, match="priority must be one of"):
        tools.create_task("x", "Alex", priority="HIGH")


def test_retry_with_same_key_runs_once(tools: KanbanTools, store: KanbanStore) -> None:
    for attempt in (1, 2, 3):
        with tool_call_context(call_id="c1.0", tool="create_task", attempt=attempt):
            created = tools.create_task("Once", "Emery", points=3)
        with tool_call_context(call_id="c1.1", tool="update_task", attempt=attempt):
            updated = tools.update_task(created["task_id"], assignee="Blair")
        with tool_call_context(call_id="c1.2", tool="delete_task", attempt=attempt):
            # The retry of a delete must not fail because the first attempt already deleted it.
            deleted = tools.delete_task(5)
        assert created["task_id"] == 121 and updated["assignee"] == "Blair" and deleted["deleted"]
    assert store.execution_count("create_task") == 1
    assert store.execution_count("update_task") == 1
    assert store.execution_count("delete_task") == 1
    assert store.duplicate_effects() == 0
    assert len(store.all_tasks()) == 120


def test_different_keys_are_different_calls(tools: KanbanTools, store: KanbanStore) -> None:
    with tool_call_context(call_id="c1.0", tool="update_task"):
        tools.update_task(1, points=5)
    with tool_call_context(call_id="c1.1", tool="update_task"):
        tools.update_task(1, points=8)
    assert tools.get_task(1)["points"] == 8
    assert store.execution_count("update_task") == 2


async def test_toolset_exposes_the_six_tools(tools: KanbanTools) -> None:
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    defs = await tools.toolset().get_tools(ctx)
    assert set(defs) == {"list_people", "list_tasks", "get_task", "create_task", "update_task", "delete_task"}
    update = defs["update_task"].tool_def.parameters_json_schema
    assert update["required"] == ["task_id"]
    assert "urgent" in update["properties"]["priority"]["description"]
