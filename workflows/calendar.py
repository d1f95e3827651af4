"""The bundled calendar agent: `activities.calendar`'s tools behind code mode, and its benchmark task.

The model is chosen as for the cart (see `workflows.cart`): the `model` argument, else `CODEMODE_MODEL` when an
OpenAI or Anthropic API key is set too, else `scripted_calendar_model()`, which plays the model's part for
`TASK_PROMPT` offline.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_ai.models.function import FunctionModel

from durable_codemode import CodeModeAgent
from durable_codemode.apps.activities.calendar import (
    CalendarStore,
    CalendarTools,
    Event,
    check_invite_responses,
    expected_responses,
)
from durable_codemode.apps.workflows.cart import model_from_env
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
    "CALENDAR_DB_ENV",
    "CALENDAR_TASK",
    "DEFAULT_CALENDAR_DB",
    "INSTRUCTIONS",
    "SCRIPTED_MODEL_NAME",
    "TASK_PROMPT",
    "CalendarInstance",
    "agents",
    "calendar_agent",
    "calendar_db_path",
    "scripted_calendar_model",
]

CALENDAR_DB_ENV = "CODEMODE_CALENDAR_DB"
"""Environment variable with the calendar's SQLite file."""

DEFAULT_CALENDAR_DB = Path("~/.local/share/durable-codemode/calendar.sqlite")
"""Where the calendar lives when `CODEMODE_CALENDAR_DB` is unset (`~` is expanded when read)."""

TASK_PROMPT = (
    "Accept each unanswered invite that is on a weekday and ends by 5pm, and decline the rest of the "
    "unanswered invites."
)
"""The benchmark task: pages of reads, then one `respond_to_invite` per unanswered invite."""

SCRIPTED_MODEL_NAME = "scripted-calendar"
"""The `model_name` of `scripted_calendar_model()`, as runs record it."""

INSTRUCTIONS = """\
You manage the user's calendar with the calendar tools, which you call from Python programs via run_code.

- Times are the user's local wall-clock time, ISO 8601 without an offset ('2026-03-06T17:00:00'); every event \
starts and ends on the same day. datetime.datetime.fromisoformat works in programs; .weekday() is 0 for Monday \
to 6 for Sunday, so weekdays are 0-4.
- "Ends by 5pm" means the end's time of day is 17:00 or earlier: ending at exactly 17:00 counts, 17:01 does not.
- my_status is the user's response: 'unanswered' means not answered yet; 'accepted', 'declined' and 'tentative' \
are answers (tentative too). Events with organizer 'me' are the user's own, not invites.
- list_events returns one page of at most 50 events. Page through everything in one program, starting at \
offset=0 and following next_offset until it is None, before changing anything: answering invites changes which \
ones match a status filter, which shifts the pages.
- There is no bulk endpoint: answer invites one call at a time, all at once with \
asyncio.gather(*(respond_to_invite(invite_id=e['event_id'], response='accepted') for e in events)).
- Do the filtering in the program and return a small summary (counts), not the raw events.
- Only change what the user asked for; leave answered invites and the user's own events alone.
- Answer in one or two sentences with the counts: how many invites you accepted and how many you declined.
"""
"""What the agent is told; written for a real model (the scripted one ignores it)."""

_SCRIPTED_PROGRAM = """\
import asyncio
import datetime

events = []
offset: int | None = 0
while offset is not None:
    page = await list_events(offset=offset)
    events.extend(page['items'])
    offset = page['next_offset']
accept = []
decline = []
for e in events:
    if e['my_status'] != 'unanswered':
        continue
    start = datetime.datetime.fromisoformat(e['start'])
    end = datetime.datetime.fromisoformat(e['end'])
    if start.weekday() < 5 and end.time() <= datetime.time(17, 0):
        accept.append(e['event_id'])
    else:
        decline.append(e['event_id'])
await asyncio.gather(
    *(respond_to_invite(invite_id=i, response='accepted') for i in accept),
    *(respond_to_invite(invite_id=i, response='declined') for i in decline),
)
{'accepted': len(accept), 'declined': len(decline), 'left_alone': len(events) - len(accept) - len(decline)}
"""


def _summary(accepted: int, declined: int, left_alone: int) -> str:
    return (
        f"Of your unanswered invites, I accepted {accepted} and declined {declined}; the other {left_alone} "
        "events were already answered or your own, and I left them alone."
    )


_answer = summary_answer("answer your invites", lambda s: _summary(s["accepted"], s["declined"], s["left_alone"]))
"""The scripted model's final answer, from what its program returned (or how it failed)."""


def scripted_calendar_model() -> FunctionModel:
    """A scripted model that plays the model's part for `TASK_PROMPT`, offline.

    Turn 1 is one `run_code` program that pages through `list_events`, decides each unanswered invite and
    answers them all concurrently, returning counts; turn 2 is the answer built from those counts. It answers
    every prompt this way; everything else in the run (Temporal, Monty, the tool activities, SQLite) is real.
    """
    return scripted_model(RunCode(_SCRIPTED_PROGRAM), _answer, name=SCRIPTED_MODEL_NAME)


def calendar_db_path() -> Path:
    """The calendar's SQLite file: `CODEMODE_CALENDAR_DB` if set, else `DEFAULT_CALENDAR_DB`."""
    return Path(os.environ.get(CALENDAR_DB_ENV) or DEFAULT_CALENDAR_DB).expanduser()


def calendar_agent(store: CalendarStore, *, model: Model | str | None = None) -> CodeModeAgent:
    """The calendar agent over `store`.

    Args:
        store: The calendar it manages; its tools read and change this SQLite file.
        model: A pydantic-ai model or model string; `None`: `CODEMODE_MODEL` if an API key is set too,
            else `scripted_calendar_model()`.

    """
    chosen: Model | str = model or model_from_env() or scripted_calendar_model()
    agent = Agent(chosen, name="calendar", instructions=INSTRUCTIONS, toolsets=[CalendarTools(store).toolset()])
    return CodeModeAgent(agent)


def agents() -> list[CodeModeAgent]:
    """The calendar agent over `calendar_db_path()`, seeded with 120 events if the file is new."""
    path = calendar_db_path()
    store = CalendarStore(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        store.seed(events=120)
    return [calendar_agent(store)]


# -- the benchmark task ------------------------------------------------------------------------------------------


def _tool_calling_policy(seen: list[Seen]) -> list[Call] | str:
    """Page through the whole calendar first (answering while paging could shift pages), then answer each."""
    pages = [s.result for s in seen if s.tool == "list_events" and s.ok]
    if not pages:
        return [Call("list_events", {"offset": 0})]
    if pages[-1]["next_offset"] is not None:
        return [Call("list_events", {"offset": pages[-1]["next_offset"]})]
    events = [event for page in pages for event in page["items"]]
    unanswered = [event for event in events if event["my_status"] == "unanswered"]
    # Read as a model calling tools directly would: the date's weekday, and the end's time of day as text.
    decision = {
        event["event_id"]: "accepted"
        if datetime.date.fromisoformat(event["start"][:10]).weekday() < 5 and event["end"][11:] <= "17:00:00"
        else "declined"
        for event in unanswered
    }
    done = {s.args["invite_id"] for s in seen if s.tool == "respond_to_invite"}
    todo = [Call("respond_to_invite", {"invite_id": i, "response": r}) for i, r in decision.items() if i not in done]
    if todo:
        return todo
    accepted = sum(r == "accepted" for r in decision.values())
    return _summary(accepted, len(decision) - accepted, len(events) - len(decision))


class CalendarInstance:
    """`calendar.answer-invites` at one N, the number of events (see `workflows.tasks.Instance`)."""

    def __init__(self, workdir: Path, n: int) -> None:
        """Seed a calendar of `n` events in `workdir`."""
        self.store = CalendarStore(workdir / "calendar.sqlite")
        self.store.seed(events=n, seed=n)
        self.before: list[Event] = self.store.all_events()
        self.prompt = TASK_PROMPT

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        """The calendar agent; scripted for `mode` when `model` is None."""
        scripted: Model = (
            scripted_calendar_model() if mode == "on"
            else tool_calling_model(_tool_calling_policy, name="scripted-tool-calling-calendar")
        )
        agent = Agent(model or scripted, name="calendar", instructions=INSTRUCTIONS,
                      toolsets=[CalendarTools(self.store).toolset()])
        return CodeModeAgent(agent, code_mode=mode == "on")

    def check(self, reply: str) -> list[str]:
        """The end state is right, and the reply states how many invites were accepted and declined."""
        problems = check_invite_responses(self.store, self.before)
        expected = list(expected_responses(self.before).values())
        numbers = numbers_in(reply)
        for label, count in (("invites accepted", expected.count("accepted")),
                             ("invites declined", expected.count("declined"))):
            if str(count) not in numbers:
                problems.append(f"the reply does not state the {label} ({count}): {reply!r}")
        return problems

    def duplicate_effects(self) -> int:
        """Side effects that ran more than once."""
        return self.store.duplicate_effects()


CALENDAR_TASK = Task(
    name="calendar.answer-invites",
    apps=("calendar",),
    kind="scaling",
    sizes=SCALING_SIZES,
    setup=CalendarInstance,
    description="accept each unanswered weekday invite that ends by 5pm, decline the other unanswered ones",
)
"""The calendar's scaling task."""
