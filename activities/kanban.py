"""The bundled kanban board: single-item CRUD tools over a board's tasks, in a SQLite store.

Like the cart, the API is shaped like a typical tracker's rather than for an agent: no bulk reassignment,
listing paginated by 50, and the team's workload is not a field anywhere, it has to be added up from the tasks.
Rebalancing a person's work ("give each of Alex's urgent tasks to whoever has the least on their plate") is
then a page-everything-then-compute job with one `update_task` per task: many round trips for a model calling
tools one at a time, one short program in code mode.

Words as the tools and the oracle use them:
- a task is **open** while its status is not `done`: `open` (not started) and `in_progress` both count;
- a person's **open points** are the sum of `points` over the tasks assigned to them that are open.

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
    "PAGE_SIZE",
    "PRIORITIES",
    "STATUSES",
    "TEAM",
    "DeletedTask",
    "KanbanStore",
    "KanbanTools",
    "Move",
    "Task",
    "TaskPage",
    "check_rebalanced",
    "is_open",
    "open_points",
    "rebalance_moves",
]


TEAM = ("Alex", "Blair", "Casey", "Devon", "Emery")
"""The fixed team: every task is assigned to one of them."""

PRIORITIES = ("low", "medium", "high", "urgent")
"""Valid priorities, lowest first."""

STATUSES = ("open", "in_progress", "done")
"""Valid statuses; a task is open (counts towards its assignee's open points) unless it is `done`."""

MAX_POINTS = 100
"""The largest estimate a task may have."""

_TITLES = (
    "Fix login redirect",
    "Write onboarding doc",
    "Migrate billing table",
    "Add CSV export",
    "Review API rate limits",
    "Upgrade TLS certificates",
    "Dark mode for settings",
    "Flaky checkout test",
    "Search result ranking",
    "Invoice PDF layout",
    "Audit log retention",
    "Mobile push opt-in",
    "Cache warmup job",
    "Password reset emails",
    "Dashboard load time",
    "Translate help center",
)

_POINTS = (1, 2, 3, 5, 8, 13)


@documented
class Task(TypedDict):
    """One task: priority low/medium/high/urgent; status open/in_progress/done (open unless done); points an int."""

    task_id: int
    """The task's id; stable for its lifetime and never reused."""

    title: str
    """What the task is."""

    assignee: str
    """Who owns it: one of the team (`list_people()`)."""

    priority: str
    """One of `low`, `medium`, `high`, `urgent`."""

    status: str
    """One of `open`, `in_progress`, `done`; the task is open (not finished) unless it is `done`."""

    points: int
    """The estimate in story points, 0 to 100."""


@documented
class TaskPage(TypedDict):
    """One page of `list_tasks`."""

    items: list[Task]
    """At most 50 tasks, ordered by `task_id`."""

    next_offset: int | None
    """The offset to pass for the next page (with the same filters); None on the last page."""

    total_tasks: int
    """How many tasks match the filters, on all pages."""


@documented
class DeletedTask(TypedDict):
    """The outcome of `delete_task`."""

    task_id: int
    """The id of the deleted task."""

    deleted: bool
    """True: the task is gone."""


@documented
class Move(TypedDict):
    """One reassignment of a rebalance: task `task_id` goes to `to`."""

    task_id: int
    """The moved task."""

    points: int
    """Its points, added to the target's open points."""

    to: str
    """Its new assignee."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    assignee TEXT NOT NULL,
    priority TEXT NOT NULL,
    status TEXT NOT NULL,
    points INTEGER NOT NULL
);
"""

_COLUMNS = "task_id, title, assignee, priority, status, points"


def _task(row: tuple[Any, ...]) -> Task:
    return Task(task_id=row[0], title=row[1], assignee=row[2], priority=row[3], status=row[4], points=row[5])


def _check_person(name: str, field: str = "assignee") -> None:
    if name not in TEAM:
        raise ValueError(f"{field} must be one of the team: {', '.join(TEAM)} (got {name!r}); see list_people()")


def _check_priority(priority: str) -> None:
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)} (got {priority!r})")


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(
            f"status must be one of {', '.join(STATUSES)} (got {status!r}); a task is open unless it is done"
        )


def _check_points(points: int) -> None:
    if not 0 <= points <= MAX_POINTS:
        raise ValueError(f"points must be between 0 and {MAX_POINTS}, got {points}")


class KanbanStore(SqliteStore):
    """The board's SQLite file, plus the bookkeeping tests use to check side effects ran exactly once."""

    SCHEMA = _SCHEMA
    TABLES = ("tasks",)

    def seed(self, tasks: int = 120, seed: int = 0) -> None:
        """Replace the whole store with `tasks` deterministic tasks.

        Alex owns about 40% of them (the overloaded one), the others share the rest; about a third are done,
        so "open" has to be read as "not done" rather than counted over every task. At least one of Alex's
        tasks is an open urgent one, so a rebalance always has something to move.

        Args:
            tasks: How many tasks to create; at least 1.
            seed: The `random.Random` seed; the same seed gives the same board.

        """
        if tasks < 1:
            raise ValueError(f"tasks must be at least 1, got {tasks}")
        rng = random.Random(seed)
        rows = []
        for n in range(1, tasks + 1):
            assignee = "Alex" if rng.random() < 0.4 else rng.choice(TEAM[1:])
            priority = rng.choices(PRIORITIES, weights=(3, 4, 3, 2))[0]
            status = rng.choices(STATUSES, weights=(4, 2, 3))[0]
            rows.append([n, f"{rng.choice(_TITLES)} #{n}", assignee, priority, status, rng.choice(_POINTS)])
        if not any(r[2] == "Alex" and r[3] == "urgent" and r[4] != "done" for r in rows):
            rows[rng.randrange(tasks)][2:5] = ["Alex", "urgent", "open"]
        self.create_schema()
        with self.write() as conn:
            self.reset(conn)
            conn.executemany(f"INSERT INTO tasks ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", rows)

    def all_tasks(self) -> list[Task]:
        """Every task, ordered by `task_id`."""
        with self.connect() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM tasks ORDER BY task_id").fetchall()
        return [_task(row) for row in rows]


class KanbanTools(IdempotentTools):
    """The board's tools, bound to one store; `toolset()` hands them to an agent."""

    store: KanbanStore

    def __init__(self, store: KanbanStore) -> None:
        """Serve the tools from `store`."""
        super().__init__(store)

    def toolset(self) -> FunctionToolset[None]:
        """The six tools as a pydantic-ai toolset."""
        return FunctionToolset(
            [self.list_people, self.list_tasks, self.get_task, self.create_task, self.update_task, self.delete_task]
        )

    @staticmethod
    def _fetch(conn: sqlite3.Connection, task_id: int) -> Task:
        row = conn.execute(f"SELECT {_COLUMNS} FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if row is None:
            raise KeyError(f"no task {task_id}; list_tasks() shows the task ids")
        return _task(row)

    def list_people(self) -> list[str]:
        """The team's names, in alphabetical order: the only valid assignees."""
        return list(TEAM)

    def list_tasks(self, offset: int = 0, assignee: str | None = None, status: str | None = None) -> TaskPage:
        """List one page of the board's tasks, ordered by task id, optionally only one person's or one status.

        A page has at most 50 tasks; to see them all, call again with `next_offset` (and the same filters) until
        it is None. Open tasks are those with status `open` or `in_progress`: filter by each, or list all.

        Args:
            offset: How many matching tasks to skip; 0 for the first page, then the previous page's `next_offset`.
            assignee: Only this person's tasks (one of `list_people()`); None: everyone's.
            status: Only tasks with this exact status (`open`, `in_progress` or `done`); None: any status.

        """
        check_offset(offset)
        where: list[str] = []
        params: list[Any] = []
        if assignee is not None:
            _check_person(assignee)
            where.append("assignee = ?")
            params.append(assignee)
        if status is not None:
            _check_status(status)
            where.append("status = ?")
            params.append(status)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self.store.read() as conn:
            rows, next_offset, total = read_page(
                conn, f"SELECT {_COLUMNS} FROM tasks{clause} ORDER BY task_id",
                f"SELECT COUNT(*) FROM tasks{clause}", params, offset)
        return TaskPage(items=[_task(row) for row in rows], next_offset=next_offset, total_tasks=total)

    def get_task(self, task_id: int) -> Task:
        """Get one task by its id.

        Args:
            task_id: The task's id, as shown by `list_tasks`.

        """
        with self.store.connect() as conn:
            return self._fetch(conn, task_id)

    def create_task(
        self, title: str, assignee: str, priority: str = "medium", points: int = 1, status: str = "open"
    ) -> Task:
        """Create a task and return it, with its new task id.

        Args:
            title: What the task is; must not be empty.
            assignee: Who owns it: one of `list_people()`.
            priority: `low`, `medium`, `high` or `urgent`.
            points: The estimate in story points, 0 to 100.
            status: `open`, `in_progress` or `done`.

        """
        if not title.strip():
            raise ValueError("title must not be empty")
        _check_person(assignee)
        _check_priority(priority)
        _check_points(points)
        _check_status(status)

        def apply(conn: sqlite3.Connection) -> Task:
            cursor = conn.execute(
                "INSERT INTO tasks (title, assignee, priority, status, points) VALUES (?, ?, ?, ?, ?)",
                (title, assignee, priority, status, points),
            )
            assert cursor.lastrowid is not None
            return self._fetch(conn, cursor.lastrowid)

        args = {"title": title, "assignee": assignee, "priority": priority, "points": points, "status": status}
        return self.mutate("create_task", args, apply)

    def update_task(
        self,
        task_id: int,
        assignee: str | None = None,
        status: str | None = None,
        priority: str | None = None,
        points: int | None = None,
    ) -> Task:
        """Change one task's assignee, status, priority and/or points, and return the updated task.

        Only the fields given change; give at least one.

        Args:
            task_id: The task's id, as shown by `list_tasks`.
            assignee: The new owner: one of `list_people()`.
            status: The new status: `open`, `in_progress` or `done`.
            priority: The new priority: `low`, `medium`, `high` or `urgent`.
            points: The new estimate in story points, 0 to 100.

        """
        changes: dict[str, Any] = {}
        if assignee is not None:
            _check_person(assignee)
            changes["assignee"] = assignee
        if status is not None:
            _check_status(status)
            changes["status"] = status
        if priority is not None:
            _check_priority(priority)
            changes["priority"] = priority
        if points is not None:
            _check_points(points)
            changes["points"] = points
        if not changes:
            raise ValueError("nothing to change: give at least one of assignee, status, priority, points")

        def apply(conn: sqlite3.Connection) -> Task:
            assignments = ", ".join(f"{column} = ?" for column in changes)
            cursor = conn.execute(
                f"UPDATE tasks SET {assignments} WHERE task_id = ?", (*changes.values(), task_id)
            )
            if cursor.rowcount == 0:
                raise KeyError(f"no task {task_id}; list_tasks() shows the task ids")
            return self._fetch(conn, task_id)

        return self.mutate("update_task", {"task_id": task_id, **changes}, apply)

    def delete_task(self, task_id: int) -> DeletedTask:
        """Delete one task from the board (to finish a task, set its status to done instead).

        Args:
            task_id: The task's id, as shown by `list_tasks`.

        """

        def apply(conn: sqlite3.Connection) -> DeletedTask:
            if conn.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,)).rowcount == 0:
                raise KeyError(f"no task {task_id}; list_tasks() shows the task ids")
            return DeletedTask(task_id=task_id, deleted=True)

        return self.mutate("delete_task", {"task_id": task_id}, apply)


def is_open(task: Task) -> bool:
    """Whether `task` counts as open: its status is anything but `done`."""
    return task["status"] != "done"


def open_points(tasks: list[Task]) -> dict[str, int]:
    """Each team member's open points (0 for someone with no open task)."""
    loads = dict.fromkeys(TEAM, 0)
    for task in tasks:
        if is_open(task):
            loads[task["assignee"]] += task["points"]
    return loads


def rebalance_moves(
    tasks: list[Task], source: str = "Alex", priorities: tuple[str, ...] = ("urgent", "high")
) -> list[Move]:
    """The moves of "give each of `source`'s open tasks of `priorities`, by id, to whoever has the fewest open points".

    The target is chosen again before each move, with the earlier moves counted: the teammate (never `source`)
    with the fewest open points, the alphabetically first name on a tie.
    """
    loads = {name: points for name, points in open_points(tasks).items() if name != source}
    moves: list[Move] = []
    for task in sorted(tasks, key=lambda t: t["task_id"]):
        if task["assignee"] == source and is_open(task) and task["priority"] in priorities:
            target = min(sorted(loads), key=lambda name: loads[name])
            loads[target] += task["points"]
            moves.append(Move(task_id=task["task_id"], points=task["points"], to=target))
    return moves


def check_rebalanced(store: KanbanStore, before: list[Task], moves: list[Move]) -> list[str]:
    """Check the end state of a rebalance against `moves`; an empty list means correct.

    Correct means: each moved task of `before` now belongs to its move's target with nothing else changed,
    every other task is unchanged, and no task was added or deleted.
    """
    after = {task["task_id"]: task for task in store.all_tasks()}
    targets = {move["task_id"]: move["to"] for move in moves}
    problems: list[str] = []
    for task in before:
        now = after.get(task["task_id"])
        label = f"task {task['task_id']} ({task['assignee']}, {task['priority']}, {task['status']})"
        expected = {**task, "assignee": targets.get(task["task_id"], task["assignee"])}
        if now is None:
            problems.append(f"{label} was deleted")
        elif now != expected:
            if task["task_id"] in targets and now["assignee"] != expected["assignee"]:
                problems.append(f"{label} should have gone to {expected['assignee']} but is {now['assignee']}'s")
            else:
                problems.append(f"{label} should be {expected} but is {now}")
    before_ids = {task["task_id"] for task in before}
    for task_id, task in after.items():
        if task_id not in before_ids:
            problems.append(f"task {task_id} ({task['title']}) was added")
    return problems
