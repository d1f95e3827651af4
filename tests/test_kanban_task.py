"""The board's benchmark task: its oracle, and the task end to end at N = 20 in both modes, replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from durable_codemode.apps.activities.kanban import KanbanTools, Task, open_points, rebalance_moves
from durable_codemode.apps.workflows.kanban import KANBAN_TASK, KanbanInstance
from durable_codemode.apps.workflows.tasks import Mode

from ._tasks import run_graded


def _task(task_id: int, assignee: str, points: int, priority: str = "high", status: str = "open") -> Task:
    return Task(task_id=task_id, title=f"t{task_id}", assignee=assignee, priority=priority, status=status,
                points=points)


def test_moves_recompute_the_target_after_each_move() -> None:
    tasks = [
        _task(1, "Alex", 5),
        _task(2, "Alex", 3, priority="urgent", status="in_progress"),
        _task(3, "Alex", 8, priority="medium"),  # not urgent or high: stays
        _task(4, "Alex", 2, status="done"),  # not open: stays
        _task(5, "Blair", 4),
        _task(6, "Casey", 4),
        _task(7, "Devon", 9),
        _task(8, "Emery", 6),
        _task(9, "Emery", 20, status="done"),  # done work does not count towards a load
        _task(10, "Alex", 1, priority="urgent"),
    ]
    assert open_points(tasks) == {"Alex": 17, "Blair": 4, "Casey": 4, "Devon": 9, "Emery": 6}
    # Blair and Casey tie at 4: Blair (first by name) takes task 1 (9), then Casey has the fewest (4),
    # then Casey (7) vs Emery (6): Emery.
    assert [(m["task_id"], m["to"]) for m in rebalance_moves(tasks)] == [(1, "Blair"), (2, "Casey"), (10, "Emery")]


def _apply(instance: KanbanInstance) -> None:
    tools = KanbanTools(instance.store)
    for move in instance.moves:
        tools.update_task(move["task_id"], assignee=move["to"])


def _reply(instance: KanbanInstance) -> str:
    points = sum(move["points"] for move in instance.moves)
    return f"Moved {len(instance.moves)} tasks ({points} points)."


def test_oracle_passes_on_the_right_end_state(tmp_path: Path) -> None:
    instance = KANBAN_TASK.setup(tmp_path, 20)
    assert isinstance(instance, KanbanInstance) and instance.moves
    _apply(instance)
    assert instance.check(_reply(instance)) == []


def test_oracle_fails_on_untouched_board_wrong_target_and_wrong_numbers(tmp_path: Path) -> None:
    instance = KANBAN_TASK.setup(tmp_path, 20)
    assert isinstance(instance, KanbanInstance)
    assert any("should have gone to" in p for p in instance.check(_reply(instance)))
    _apply(instance)
    first = instance.moves[0]
    wrong = next(name for name in ("Blair", "Casey") if name != first["to"])
    KanbanTools(instance.store).update_task(first["task_id"], assignee=wrong)
    problems = instance.check(_reply(instance))
    assert problems == [p for p in problems if f"task {first['task_id']} " in p] and len(problems) == 1
    KanbanTools(instance.store).update_task(first["task_id"], assignee=first["to"])
    assert any("tasks moved" in p for p in instance.check("Moved 99 tasks (12345 points)."))
    points = sum(move["points"] for move in instance.moves)
    assert any("points moved" in p for p in instance.check(f"Moved {len(instance.moves)} tasks ({points + 1} points)."))


def test_oracle_fails_on_other_changes(tmp_path: Path) -> None:
    instance = KANBAN_TASK.setup(tmp_path, 20)
    assert isinstance(instance, KanbanInstance)
    _apply(instance)
    tools = KanbanTools(instance.store)
    untouched = next(t for t in instance.before if t["task_id"] not in {m["task_id"] for m in instance.moves})
    tools.update_task(untouched["task_id"], points=untouched["points"] + 1)
    tools.create_task("Extra", "Blair")
    problems = instance.check(_reply(instance))
    assert len(problems) == 2
    assert any(f"task {untouched['task_id']} " in p for p in problems) and any("was added" in p for p in problems)


@pytest.mark.parametrize("mode", ["on", "off"])
async def test_kanban_task_at_20_in_both_modes(client: Client, tmp_path: Path, mode: Mode) -> None:
    instance = KANBAN_TASK.setup(tmp_path, 20)
    assert isinstance(instance, KanbanInstance)
    assert instance.agent(mode).name == "kanban"
    await run_graded(client, instance, mode)
    assert instance.store.execution_count("update_task") == len(instance.moves)
