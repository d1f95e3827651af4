"""The bundled kanban agent: `activities.kanban`'s tools behind code mode, and the board's benchmark task.

The model is chosen as for the cart (`workflows.cart`): the `model` argument, else `CODEMODE_MODEL` when an
OpenAI or Anthropic API key is set too, else `scripted_kanban_model()`, which plays the model's part offline.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_ai.models.function import FunctionModel

from durable_codemode import CodeModeAgent
from durable_codemode.apps.activities.kanban import KanbanStore, KanbanTools, Task, check_rebalanced, rebalance_moves
from durable_codemode.apps.workflows.cart import model_from_env
from durable_codemode.apps.workflows.tasks import (
    SCALING_SIZES,
    Call,
    Mode,
    Seen,
    numbers_in,
    summary_answer,
    tool_calling_model,
)
from durable_codemode.apps.workflows.tasks import Task as BenchTask
from durable_codemode.testing import RunCode, scripted_model

__all__ = [
    "DEFAULT_KANBAN_DB",
    "INSTRUCTIONS",
    "KANBAN_DB_ENV",
    "KANBAN_TASK",
    "REBALANCE_PROMPT",
    "SCRIPTED_MODEL_NAME",
    "KanbanInstance",
    "agents",
    "kanban_agent",
    "kanban_db_path",
    "scripted_kanban_model",
]

KANBAN_DB_ENV = "CODEMODE_KANBAN_DB"
"""Environment variable with the board's SQLite file."""

DEFAULT_KANBAN_DB = Path("~/.local/share/durable-codemode/kanban.sqlite")
"""Where the board lives when `CODEMODE_KANBAN_DB` is unset (`~` is expanded when read)."""

SCRIPTED_MODEL_NAME = "scripted-kanban"
"""The `model_name` of `scripted_kanban_model()`, as runs record it."""

REBALANCE_PROMPT = (
    "Alex is overloaded. Take Alex's open tasks (status open or in_progress, i.e. not done) that are urgent or "
    "high priority, in order of task id, and reassign each one to the teammate with the fewest open points at "
    "that moment. A person's open points are the sum of the points of their tasks that are not done, counting "
    "the tasks already moved to them; on a tie, pick the name that comes first alphabetically; never pick Alex. "
    "Then tell me how many tasks you moved and how many points they carry in total."
)
"""The scaling task: the target of each move depends on the moves before it."""

INSTRUCTIONS = """\
You manage the team's kanban board with the board tools, which you call from Python programs via run_code.

- The team is list_people(); every task belongs to one of them. Priorities: low, medium, high, urgent. \
Statuses: open, in_progress, done. A task is open unless its status is done (in_progress is open too). \
A person's open points are the sum of `points` over their open tasks.
- list_tasks returns one page of at most 50 tasks (optionally filtered by assignee or by one exact status). \
To see everything, page through it in one program: start at offset=0 and call again with next_offset until it \
is None. Read everything you need before changing anything: reassigning tasks while paging through a filtered \
list shifts the pages.
- There is no bulk endpoint: change tasks one update_task call at a time; independent calls can run together \
with asyncio.gather(...).
- Workload is not stored anywhere: add it up from the tasks in the program, and when one change affects the \
next decision (e.g. "whoever has the least work"), update your running totals after each decision.
- Return a small summary from the program (counts, point totals, who got what), not the raw tasks.
- Only change what the user asked for. If the request is ambiguous, ask before changing anything.
- Answer in one or two sentences: what changed (how many tasks, how many points) and to whom.
"""
"""What the agent is told; written for a real model (the scripted one ignores it)."""

_SCRIPTED_PROGRAM = """\
import asyncio

people = await list_people()
tasks = []
offset: int | None = 0
while offset is not None:
    page = await list_tasks(offset=offset)
    tasks.extend(page['items'])
    offset = page['next_offset']
load = {p: 0 for p in people if p != 'Alex'}
for t in tasks:
    if t['status'] != 'done' and t['assignee'] in load:
        load[t['assignee']] += t['points']
moves = []
for t in tasks:
    if t['assignee'] == 'Alex' and t['status'] != 'done' and t['priority'] in ('urgent', 'high'):
        target = min(sorted(load), key=lambda p: load[p])
        load[target] += t['points']
        moves.append((t['task_id'], t['points'], target))
await asyncio.gather(*(update_task(task_id=task_id, assignee=to) for task_id, _, to in moves))
received = {}
for _, _, to in moves:
    received[to] = received.get(to, 0) + 1
{'moved': len(moves), 'points': sum(points for _, points, _ in moves), 'received': received}
"""


def _summary(moved: int, points: int, received: dict[str, int]) -> str:
    shares = ", ".join(f"{count} to {name}" for name, count in sorted(received.items()))
    return (
        f"Moved {moved} of Alex's urgent and high-priority open tasks ({points} points in total)"
        + (f": {shares}." if shares else ".")
    )


_answer = summary_answer("rebalance the board", lambda s: _summary(s["moved"], s["points"], s["received"]))
"""The scripted model's final answer, from what its program returned (or how it failed)."""


def scripted_kanban_model() -> FunctionModel:
    """A scripted model that plays the model's part for `REBALANCE_PROMPT`, offline.

    Turn 1 is one `run_code` program that reads the team and every page of tasks, computes the whole sequence
    of moves with running open-point totals, makes the `update_task` calls concurrently and returns counts;
    turn 2 is the answer built from that result. Everything else in the run is real.
    """
    return scripted_model(RunCode(_SCRIPTED_PROGRAM), _answer, name=SCRIPTED_MODEL_NAME)


def kanban_db_path() -> Path:
    """The board's SQLite file: `CODEMODE_KANBAN_DB` if set, else `DEFAULT_KANBAN_DB`."""
    return Path(os.environ.get(KANBAN_DB_ENV) or DEFAULT_KANBAN_DB).expanduser()


def kanban_agent(store: KanbanStore, *, model: Model | str | None = None, code_mode: bool = True) -> CodeModeAgent:
    """The kanban agent (named `kanban`) over `store`.

    Args:
        store: The board it manages; its tools read and change this SQLite file.
        model: A pydantic-ai model or model string; `None`: `CODEMODE_MODEL` if an API key is set too,
            else `scripted_kanban_model()`.
        code_mode: False: every tool is a direct tool call (the benchmark's "tool calling" mode).

    """
    chosen: Model | str = model or model_from_env() or scripted_kanban_model()
    agent = Agent(chosen, name="kanban", instructions=INSTRUCTIONS, toolsets=[KanbanTools(store).toolset()])
    return CodeModeAgent(agent, code_mode=code_mode)


def agents() -> list[CodeModeAgent]:
    """The kanban agent over `kanban_db_path()`, seeded with 120 tasks if the file is new."""
    path = kanban_db_path()
    store = KanbanStore(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        store.seed(tasks=120)
    return [kanban_agent(store)]


# -- the benchmark task ------------------------------------------------------------------------------------------


def _tool_calling_policy(seen: list[Seen]) -> list[Call] | str:
    """Read the team and every page first, work out every move with running totals, then make the moves.

    A model calling tools one at a time sees the same pages the program does, so it can decide the whole
    sequence before the first move and send the moves in batches (the model caps a batch at `MAX_BATCH`).
    """
    people = next((s.result for s in seen if s.tool == "list_people" and s.ok), None)
    pages = [s.result for s in seen if s.tool == "list_tasks" and s.ok]
    if people is None and not pages:
        return [Call("list_people"), Call("list_tasks", {"offset": 0})]
    if people is None:
        return [Call("list_people")]
    if pages[-1]["next_offset"] is not None:
        return [Call("list_tasks", {"offset": pages[-1]["next_offset"]})]
    tasks: list[Task] = [task for page in pages for task in page["items"]]
    load = {person: 0 for person in people if person != "Alex"}
    for task in tasks:
        if task["status"] != "done" and task["assignee"] in load:
            load[task["assignee"]] += task["points"]
    moves: list[tuple[Task, str]] = []
    for task in tasks:
        if task["assignee"] == "Alex" and task["status"] != "done" and task["priority"] in ("urgent", "high"):
            target = min(sorted(load), key=lambda person: load[person])
            load[target] += task["points"]
            moves.append((task, target))
    done = {s.args["task_id"] for s in seen if s.tool == "update_task"}
    todo = [
        Call("update_task", {"task_id": task["task_id"], "assignee": to}) for task, to in moves
        if task["task_id"] not in done
    ]
    if todo:
        return todo
    made = [s.result for s in seen if s.tool == "update_task" and s.ok]
    received: dict[str, int] = {}
    for task in made:
        received[task["assignee"]] = received.get(task["assignee"], 0) + 1
    return _summary(len(made), sum(task["points"] for task in made), received)


class KanbanInstance:
    """`kanban.rebalance-alex` at one N (see `workflows.tasks.Instance`)."""

    def __init__(self, workdir: Path, n: int) -> None:
        """Seed a board of `n` tasks in `workdir`."""
        self.store = KanbanStore(workdir / "kanban.sqlite")
        self.store.seed(tasks=n, seed=n)
        self.before = self.store.all_tasks()
        self.moves = rebalance_moves(self.before)
        self.prompt = REBALANCE_PROMPT

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        """The kanban agent; scripted for `mode` when `model` is None."""
        scripted: Model = (
            scripted_kanban_model() if mode == "on"
            else tool_calling_model(_tool_calling_policy, name="scripted-tool-calling-kanban")
        )
        return kanban_agent(self.store, model=model or scripted, code_mode=mode == "on")

    def check(self, reply: str) -> list[str]:
        """Every move went to the right person, nothing else changed, and the reply states the count and points."""
        problems = check_rebalanced(self.store, self.before, self.moves)
        numbers = numbers_in(reply)
        points = sum(move["points"] for move in self.moves)
        for label, expected in (("tasks moved", len(self.moves)), ("points moved", points)):
            if str(expected) not in numbers:
                problems.append(f"the reply does not state the {label} ({expected}): {reply!r}")
        return problems

    def duplicate_effects(self) -> int:
        """Side effects that ran more than once."""
        return self.store.duplicate_effects()


KANBAN_TASK = BenchTask(
    name="kanban.rebalance-alex",
    apps=("kanban",),
    kind="scaling",
    sizes=SCALING_SIZES,
    setup=KanbanInstance,
    description="move each of Alex's urgent/high open tasks, by id, to whoever has the fewest open points then",
)
"""The board's scaling task."""
