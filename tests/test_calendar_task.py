"""The calendar's benchmark task end to end at N = 20, in both modes, graded by its oracle and replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from durable_codemode.apps.activities.calendar import CalendarStore, CalendarTools, expected_responses
from durable_codemode.apps.workflows.calendar import CALENDAR_DB_ENV, CALENDAR_TASK, CalendarInstance, agents
from durable_codemode.apps.workflows.tasks import Mode

from ._tasks import run_graded


@pytest.mark.parametrize("mode", ["on", "off"])
async def test_calendar_task_at_20_in_both_modes(client: Client, tmp_path: Path, mode: Mode) -> None:
    instance = CALENDAR_TASK.setup(tmp_path, 20)
    assert instance.agent(mode).name == "calendar"
    await run_graded(client, instance, mode)
    expected = expected_responses(instance.before)
    assert instance.store.execution_count("respond_to_invite") == len(expected)
    assert instance.store.execution_count() == len(expected)


def _answer_all(instance: CalendarInstance) -> dict[int, str]:
    expected = expected_responses(instance.before)
    tools = CalendarTools(instance.store)
    for event_id, response in expected.items():
        tools.respond_to_invite(event_id, response)
    return expected


def test_oracle_passes_on_the_right_end_state_and_reply(tmp_path: Path) -> None:
    instance = CalendarInstance(tmp_path, 20)
    expected = list(_answer_all(instance).values())
    reply = f"Accepted {expected.count('accepted')} invites and declined {expected.count('declined')}."
    assert instance.check(reply) == []


def test_oracle_fails_on_a_reply_with_wrong_numbers(tmp_path: Path) -> None:
    instance = CalendarInstance(tmp_path, 20)
    expected = list(_answer_all(instance).values())
    accepted, declined = expected.count("accepted"), expected.count("declined")
    problems = instance.check(f"Accepted {accepted + declined + 1} invites and declined none.")
    assert len(problems) == 2
    assert any(f"invites accepted ({accepted})" in p for p in problems)
    assert any(f"invites declined ({declined})" in p for p in problems)


def test_oracle_fails_on_a_wrong_end_state(tmp_path: Path) -> None:
    instance = CalendarInstance(tmp_path, 20)
    expected = _answer_all(instance)
    tools = CalendarTools(instance.store)
    # The boundary invites read laxly: 17:01 taken for "by 5pm", and an already-tentative invite re-answered.
    late = next(e for e in instance.before if e["end"].endswith("17:01:00"))
    tentative = next(e for e in instance.before if e["my_status"] == "tentative")
    tools.respond_to_invite(late["event_id"], "accepted")
    tools.respond_to_invite(tentative["event_id"], "accepted")
    answers = list(expected.values())
    reply = f"Accepted {answers.count('accepted')} and declined {answers.count('declined')}."
    problems = instance.check(reply)
    assert len(problems) == 2
    assert any(f"event {late['event_id']} " in p and "should be declined, but is accepted" in p for p in problems)
    assert any(f"event {tentative['event_id']} " in p and "already tentative" in p for p in problems)


def test_oracle_fails_when_nothing_was_done(tmp_path: Path) -> None:
    instance = CALENDAR_TASK.setup(tmp_path, 20)
    problems = instance.check("Accepted 0 invites and declined 0.")
    assert sum("should be" in p for p in problems) == len(expected_responses(instance.before))


def test_agents_serve_the_calendar_from_the_env_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sub" / "calendar.sqlite"
    monkeypatch.setenv(CALENDAR_DB_ENV, str(path))
    [agent] = agents()
    assert agent.name == "calendar" and path.exists()
    store = CalendarStore(path)
    assert len(store.all_events()) == 120
    CalendarTools(store).delete_event(1)
    agents()  # an existing calendar is served as it is, never reseeded
    assert len(store.all_events()) == 119
