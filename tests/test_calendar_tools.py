"""The calendar app's tools: CRUD behaviour, pagination, validation, idempotency, the seed and the oracle."""

from __future__ import annotations

import datetime
from collections import Counter
from pathlib import Path

import pytest
from pydantic_ai import RunContext
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from durable_codemode.apps.activities.calendar import (
    ME,
    PAGE_SIZE,
    CalendarStore,
    CalendarTools,
    check_invite_responses,
    ends_by_5pm_on_a_weekday,
    expected_responses,
)
from durable_codemode.testing import tool_call_context


@pytest.fixture
def store(tmp_path: Path) -> CalendarStore:
    store = CalendarStore(tmp_path / "calendar.db")
    store.seed()
    return store


@pytest.fixture
def tools(store: CalendarStore) -> CalendarTools:
    return CalendarTools(store)


def _invite(store: CalendarStore, status: str = "unanswered") -> int:
    return next(e["event_id"] for e in store.all_events() if e["organizer"] != ME and e["my_status"] == status)


def test_seed_is_deterministic(tmp_path: Path) -> None:
    a, b, c = (CalendarStore(tmp_path / f"{name}.db") for name in "abc")
    a.seed(seed=0)
    b.seed(seed=0)
    c.seed(seed=1)
    events = a.all_events()
    assert len(events) == 120
    assert [e["event_id"] for e in events] == list(range(1, 121))
    assert events == b.all_events()
    assert events != c.all_events()


@pytest.mark.parametrize("n", [5, 20, 200])
def test_seed_has_the_boundary_events(tmp_path: Path, n: int) -> None:
    store = CalendarStore(tmp_path / "c.db")
    store.seed(events=n, seed=n)
    events = store.all_events()
    assert len(events) == n
    unanswered = [e for e in events if e["my_status"] == "unanswered"]
    at_five = [e for e in unanswered if e["end"].endswith("T17:00:00")]
    assert any(ends_by_5pm_on_a_weekday(e) for e in at_five)
    late = [e for e in unanswered if e["end"].endswith("T17:01:00")]
    assert late and not any(ends_by_5pm_on_a_weekday(e) for e in late)
    weekend = [e for e in unanswered if datetime.date.fromisoformat(e["start"][:10]).weekday() >= 5]
    assert any(e["end"][11:] <= "17:00:00" for e in weekend)  # declined although it ends early
    statuses = Counter(e["my_status"] for e in events if e["organizer"] != ME)
    assert statuses["tentative"] >= 1 and statuses["declined"] >= 1
    for e in events:
        start, end = datetime.datetime.fromisoformat(e["start"]), datetime.datetime.fromisoformat(e["end"])
        assert start < end and start.date() == end.date() and start.tzinfo is None
        assert e["organizer"] != ME or e["my_status"] == "accepted"


def test_seed_mix(store: CalendarStore) -> None:
    events = store.all_events()
    expected = Counter(expected_responses(events).values())
    assert expected["accepted"] > 10 and expected["declined"] > 10
    assert 0 < sum(e["organizer"] == ME for e in events) < 30
    assert 10 < sum(e["my_status"] != "unanswered" for e in events) < 60


def test_pagination(tools: CalendarTools) -> None:
    pages = []
    offset: int | None = 0
    while offset is not None:
        page = tools.list_events(offset)
        pages.append(page)
        offset = page["next_offset"]
    assert [len(p["items"]) for p in pages] == [PAGE_SIZE, PAGE_SIZE, 20]
    assert [p["next_offset"] for p in pages] == [50, 100, None]
    assert all(p["total_events"] == 120 for p in pages)
    listed = [e for p in pages for e in p["items"]]
    assert [(e["start"], e["event_id"]) for e in listed] == sorted((e["start"], e["event_id"]) for e in listed)
    assert len({e["event_id"] for e in listed}) == 120
    assert tools.list_events(500) == {"items": [], "next_offset": None, "total_events": 120}


def test_status_filter(tools: CalendarTools, store: CalendarStore) -> None:
    unanswered = [e for e in store.all_events() if e["my_status"] == "unanswered"]
    first = tools.list_events(status="unanswered")
    assert first["total_events"] == len(unanswered)
    assert all(e["my_status"] == "unanswered" for e in first["items"])
    tools.respond_to_invite(first["items"][0]["event_id"], "accepted")
    assert tools.list_events(status="unanswered")["total_events"] == len(unanswered) - 1
    with pytest.raises(ValueError, match="status must be one of unanswered, accepted, declined, tentative"):
        tools.list_events(status="pending")
    with pytest.raises(ValueError, match="offset must be 0 or more"):
        tools.list_events(-1)


def test_get_event(tools: CalendarTools, store: CalendarStore) -> None:
    assert tools.get_event(7) == store.all_events()[6]
    with pytest.raises(KeyError, match=r"no event 999; list_events\(\) shows the event ids"):
        tools.get_event(999)


def test_respond_validates_the_response(tools: CalendarTools, store: CalendarStore) -> None:
    invite = _invite(store)
    with pytest.raises(ValueError, match="response must be one of accepted, declined, tentative, got 'accept'"):
        tools.respond_to_invite(invite, "accept")
    with pytest.raises(ValueError, match="response must be one of"):
        tools.respond_to_invite(invite, "unanswered")
    with pytest.raises(KeyError, match=r"no event 999; list_events\(\) shows the event ids"):
        tools.respond_to_invite(999, "accepted")
    own = next(e["event_id"] for e in store.all_events() if e["organizer"] == ME)
    with pytest.raises(ValueError, match="your own event"):
        tools.respond_to_invite(own, "declined")
    assert store.execution_count() == 0
    assert tools.respond_to_invite(invite, "tentative")["my_status"] == "tentative"
    assert tools.get_event(invite)["my_status"] == "tentative"


def test_create_update_delete(tools: CalendarTools, store: CalendarStore) -> None:
    created = tools.create_event("Dentist", "2026-03-10T08:00", "2026-03-10T08:45:00")
    assert created == {"event_id": 121, "title": "Dentist", "start": "2026-03-10T08:00:00",
                       "end": "2026-03-10T08:45:00", "organizer": ME, "my_status": "accepted"}
    moved = tools.update_event(121, start="2026-03-10T09:00:00", end="2026-03-10T09:45:00")
    assert moved == {**created, "start": "2026-03-10T09:00:00", "end": "2026-03-10T09:45:00"}
    assert tools.update_event(121, title="Dentist (moved)")["title"] == "Dentist (moved)"
    assert tools.delete_event(121) == {"event_id": 121, "deleted": True}
    with pytest.raises(KeyError, match="no event 121"):
        tools.get_event(121)
    with pytest.raises(KeyError, match="no event 121"):
        tools.delete_event(121)
    assert tools.create_event("Gym", "2026-03-11T07:00:00", "2026-03-11T08:00:00")["event_id"] == 122
    assert store.execution_count() == 5


def test_time_validation(tools: CalendarTools, store: CalendarStore) -> None:
    with pytest.raises(ValueError, match="start must be an ISO 8601 local time such as 2026-03-06T16:00:00"):
        tools.create_event("X", "tomorrow 9am", "2026-03-10T10:00:00")
    with pytest.raises(ValueError, match="without an offset"):
        tools.create_event("X", "2026-03-10T09:00:00+01:00", "2026-03-10T10:00:00")
    with pytest.raises(ValueError, match="must be later than start"):
        tools.create_event("X", "2026-03-10T10:00:00", "2026-03-10T10:00:00")
    with pytest.raises(ValueError, match="same day"):
        tools.create_event("X", "2026-03-10T22:00:00", "2026-03-11T01:00:00")
    with pytest.raises(ValueError, match="title must not be empty"):
        tools.create_event(" ", "2026-03-10T09:00:00", "2026-03-10T10:00:00")
    with pytest.raises(ValueError, match="give at least one of title, start, end"):
        tools.update_event(1)
    own = next(e for e in store.all_events() if e["organizer"] == ME)
    with pytest.raises(ValueError, match="must be later than start"):
        tools.update_event(own["event_id"], end=own["start"])
    with pytest.raises(PermissionError, match=r"only your own events .* answer an invite with respond_to_invite"):
        tools.update_event(_invite(store), title="Mine now")
    assert store.execution_count() == 0


def test_retry_with_the_same_key_runs_once(tools: CalendarTools, store: CalendarStore) -> None:
    invite = _invite(store)
    for attempt in (1, 2, 3):
        with tool_call_context(call_id="call_0.0", tool="respond_to_invite", attempt=attempt):
            assert tools.respond_to_invite(invite, "declined")["my_status"] == "declined"
        with tool_call_context(call_id="call_0.1", tool="create_event", attempt=attempt):
            assert tools.create_event("Focus", "2026-03-12T13:00:00", "2026-03-12T15:00:00")["event_id"] == 121
        with tool_call_context(call_id="call_0.2", tool="delete_event", attempt=attempt):
            assert tools.delete_event(1) == {"event_id": 1, "deleted": True}
    assert store.execution_count("respond_to_invite") == 1
    assert store.execution_count("create_event") == 1
    assert store.execution_count("delete_event") == 1
    assert store.duplicate_effects() == 0
    assert len(store.all_events()) == 120


def test_different_keys_are_different_calls(tools: CalendarTools, store: CalendarStore) -> None:
    invite = _invite(store)
    with tool_call_context(call_id="call_0.0"):
        tools.respond_to_invite(invite, "declined")
    with tool_call_context(call_id="call_0.1"):
        tools.respond_to_invite(invite, "accepted")
    assert store.execution_count("respond_to_invite") == 2
    assert tools.get_event(invite)["my_status"] == "accepted"


def test_rule_boundaries() -> None:
    def event(start: str, end: str) -> bool:
        return ends_by_5pm_on_a_weekday({"event_id": 1, "title": "t", "start": start, "end": end,
                                         "organizer": "a@example.com", "my_status": "unanswered"})

    assert event("2026-03-06T16:00:00", "2026-03-06T17:00:00")  # a Friday, ending at 17:00 exactly
    assert not event("2026-03-06T16:31:00", "2026-03-06T17:01:00")
    assert not event("2026-03-07T09:00:00", "2026-03-07T10:00:00")  # a Saturday
    assert not event("2026-03-08T09:00:00", "2026-03-08T10:00:00")  # a Sunday
    assert event("2026-03-02T08:00:00", "2026-03-02T08:15:00")  # a Monday


def test_oracle(tools: CalendarTools, store: CalendarStore) -> None:
    before = store.all_events()
    expected = expected_responses(before)
    assert check_invite_responses(store, before)  # nothing answered yet: wrong
    for event_id, response in expected.items():
        tools.respond_to_invite(event_id, response)
    assert check_invite_responses(store, before) == []
    own = next(e for e in before if e["organizer"] == ME)
    tools.update_event(own["event_id"], title="Renamed")
    tools.delete_event(before[-1]["event_id"])
    tools.create_event("Extra", "2026-03-12T13:00:00", "2026-03-12T14:00:00")
    problems = check_invite_responses(store, before)
    assert len(problems) == 3
    assert any(f"event {own['event_id']} " in p and "changed" in p for p in problems)
    assert any(f"event {before[-1]['event_id']} " in p and "was deleted" in p for p in problems)
    assert any("was created" in p for p in problems)


async def test_toolset_exposes_the_six_tools(tools: CalendarTools) -> None:
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    defs = await tools.toolset().get_tools(ctx)
    assert set(defs) == {"list_events", "get_event", "create_event", "update_event", "delete_event",
                         "respond_to_invite"}
    respond = defs["respond_to_invite"].tool_def
    props = respond.parameters_json_schema["properties"]
    assert set(props) == {"invite_id", "response"}
    assert "tentative" in props["response"]["description"]
    assert "without an offset" in defs["create_event"].tool_def.parameters_json_schema["properties"]["start"][
        "description"]
