"""The bundled calendar app: single-item CRUD tools over a SQLite store of events and invites.

Shaped like a typical calendar API rather than like something designed for an agent: listing is paginated by
50, there is no bulk endpoint (answering thirty invites is thirty `respond_to_invite` calls), and times are ISO
8601 strings. Times are **naive local wall-clock time** (`2026-03-06T17:00:00`, the calendar owner's time zone,
no offset) and every event starts and ends on the same day, so "ends by 5pm" is a comparison of the end's time
of day with 17:00, and the weekday is the start's date's weekday; `datetime.datetime.fromisoformat` and
`.weekday()` work in the sandbox.

Events are either the owner's own (organizer `me`, always `accepted`) or invites from someone else, which carry
the owner's response: `unanswered`, `accepted`, `declined` or `tentative`.

The mutating tools are idempotent by `current_call().idempotency_key` (see `activities._store`).
"""

from __future__ import annotations

import datetime
import random
import sqlite3
from typing import Any, Literal, cast

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
    "ME",
    "PAGE_SIZE",
    "RESPONSES",
    "STATUSES",
    "CalendarStore",
    "CalendarTools",
    "DeletedEvent",
    "Event",
    "EventPage",
    "Status",
    "check_invite_responses",
    "ends_by_5pm_on_a_weekday",
    "expected_responses",
]


ME = "me"
"""The organizer of the calendar owner's own events."""

Status = Literal["unanswered", "accepted", "declined", "tentative"]
"""The owner's response to an event."""

STATUSES: tuple[Status, ...] = ("unanswered", "accepted", "declined", "tentative")
"""Every `my_status` value."""

RESPONSES: tuple[Status, ...] = ("accepted", "declined", "tentative")
"""What `respond_to_invite` accepts (an answer cannot be taken back to `unanswered`)."""

_FIRST_DAY = datetime.date(2026, 3, 2)
"""A Monday; the seeded events fall in the four weeks from it."""

_DAYS = 28

_TITLES = (
    "Sprint planning",
    "1:1",
    "Design review",
    "Customer call",
    "Budget sync",
    "Hiring panel",
    "Team lunch",
    "Architecture deep dive",
    "Quarterly review",
    "Vendor demo",
    "Retro",
    "Offsite prep",
    "Coffee chat",
    "Incident review",
    "Roadmap workshop",
)

_ORGANIZERS = (
    "ana@example.com",
    "bo@example.com",
    "chen@example.com",
    "dara@example.com",
    "eli@example.com",
    "fatima@example.com",
)


@documented
class Event(TypedDict):
    """One calendar event: the owner's own, or an invite from someone else."""

    event_id: int
    """The event's id; stable for its lifetime and never reused."""

    title: str
    """What the event is."""

    start: str
    """When it starts: local wall-clock time, ISO 8601 without an offset (`2026-03-06T16:00:00`)."""

    end: str
    """When it ends, in the same form; always later than `start`, and on the same day."""

    organizer: str
    """Who organizes it: an email address for an invite, `me` for the owner's own events."""

    my_status: Status
    """The owner's response: `unanswered` (not answered yet), `accepted`, `declined` or `tentative`; own events
    are always `accepted`."""


@documented
class EventPage(TypedDict):
    """One page of `list_events`."""

    items: list[Event]
    """At most 50 events, ordered by start time (then by id)."""

    next_offset: int | None
    """The offset to pass for the next page; None on the last page."""

    total_events: int
    """How many events match the listing (all of them, or those with the `status` asked for)."""


@documented
class DeletedEvent(TypedDict):
    """The outcome of `delete_event`."""

    event_id: int
    """The id of the deleted event."""

    deleted: bool
    """True: the event is gone."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    start TEXT NOT NULL,
    "end" TEXT NOT NULL,
    organizer TEXT NOT NULL,
    my_status TEXT NOT NULL
);
"""

_COLUMNS = 'event_id, title, start, "end", organizer, my_status'


def _event(row: tuple[Any, ...]) -> Event:
    return Event(event_id=row[0], title=row[1], start=row[2], end=row[3], organizer=row[4],
                 my_status=cast(Status, row[5]))


def _not_found(event_id: int) -> KeyError:
    return KeyError(f"no event {event_id}; list_events() shows the event ids")


def _parse_time(name: str, value: str) -> datetime.datetime:
    """A tool argument as a naive local datetime, or a ValueError that shows the expected form."""
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{name} must be an ISO 8601 local time such as 2026-03-06T16:00:00, got {value!r}"
        ) from None
    if parsed.tzinfo is not None:
        raise ValueError(
            f"{name} must be local wall-clock time without an offset (e.g. 2026-03-06T16:00:00), got {value!r}"
        )
    return parsed.replace(microsecond=0)


def _check_span(start: datetime.datetime, end: datetime.datetime) -> None:
    if end <= start:
        raise ValueError(f"end ({end.isoformat()}) must be later than start ({start.isoformat()})")
    if end.date() != start.date():
        raise ValueError(
            f"an event must start and end on the same day, got {start.isoformat()} to {end.isoformat()}; "
            "create one event per day"
        )


def ends_by_5pm_on_a_weekday(event: Event) -> bool:
    """Whether `event` is on Monday to Friday and ends at 17:00 or earlier (17:00 counts, 17:01 does not)."""
    start = datetime.datetime.fromisoformat(event["start"])
    end = datetime.datetime.fromisoformat(event["end"])
    return start.weekday() < 5 and end.time() <= datetime.time(17, 0)


class CalendarStore(SqliteStore):
    """The calendar's SQLite file, plus the bookkeeping tests use to check side effects ran exactly once."""

    SCHEMA = _SCHEMA
    TABLES = ("events",)

    def seed(self, events: int = 120, seed: int = 0) -> None:
        """Replace the whole store (events, effects, executions) with `events` deterministic events.

        About 10% are the owner's own events, about a quarter of the invites are already answered, the rest
        are unanswered; about 2 in 7 fall on a weekend. Five events are always there so that "accept the
        unanswered weekday invites that end by 5pm" cannot be done by a lax reading: an unanswered Friday
        invite ending at exactly 17:00 (accept), an unanswered weekday invite ending at 17:01 (decline), an
        unanswered Sunday morning invite (decline), and a tentative and a declined weekday-morning invite
        (answered already: leave alone).

        Args:
            events: How many events to create; at least 5 (for the five boundary events).
            seed: The `random.Random` seed; the same seed gives the same calendar.

        """
        if events < 5:
            raise ValueError(f"events must be at least 5 (for the five boundary events), got {events}")
        rng = random.Random(seed)
        rows: list[tuple[str, datetime.datetime, datetime.datetime, str, str]] = []
        for _ in range(events):
            day = _FIRST_DAY + datetime.timedelta(days=rng.randrange(_DAYS))
            start = datetime.datetime.combine(day, datetime.time(rng.randint(8, 18), rng.choice((0, 15, 30, 45))))
            end = start + datetime.timedelta(minutes=rng.choice((15, 30, 45, 60, 90, 120)))
            roll = rng.random()
            if roll < 0.1:
                organizer, status = ME, "accepted"
            else:
                organizer = rng.choice(_ORGANIZERS)
                status = rng.choice(RESPONSES) if roll < 0.32 else "unanswered"
            rows.append((rng.choice(_TITLES), start, end, organizer, status))

        def at(week: int, weekday: int, hour: int, minute: int) -> datetime.datetime:
            day = _FIRST_DAY + datetime.timedelta(days=7 * week + weekday)
            return datetime.datetime.combine(day, datetime.time(hour, minute))

        # (title, weekday (0 = Monday), start, end, status); the week is random.
        boundary = [
            ("Friday wrap-up", 4, (16, 0), (17, 0), "unanswered"),
            ("Late sync", rng.randrange(5), (16, 31), (17, 1), "unanswered"),
            ("Sunday brunch", 6, (10, 0), (11, 30), "unanswered"),
            ("Maybe standup", rng.randrange(5), (9, 30), (9, 45), "tentative"),
            ("Skipped kickoff", rng.randrange(5), (10, 0), (11, 0), "declined"),
        ]
        for index, (title, weekday, begins, ends, status) in zip(rng.sample(range(events), 5), boundary, strict=True):
            week = rng.randrange(4)
            rows[index] = (title, at(week, weekday, *begins), at(week, weekday, *ends), rng.choice(_ORGANIZERS),
                           status)
        rows.sort(key=lambda row: row[1])
        self.create_schema()
        with self.write() as conn:
            self.reset(conn)
            conn.executemany(
                f"INSERT INTO events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (n, f"{title} #{n}", start.isoformat(), end.isoformat(), organizer, status)
                    for n, (title, start, end, organizer, status) in enumerate(rows, start=1)
                ],
            )

    def all_events(self) -> list[Event]:
        """Every event, ordered by id."""
        with self.connect() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM events ORDER BY event_id").fetchall()
        return [_event(row) for row in rows]


class CalendarTools(IdempotentTools):
    """The calendar's tools, bound to one store; `toolset()` hands them to an agent."""

    store: CalendarStore

    def __init__(self, store: CalendarStore) -> None:
        """Serve the tools from `store`."""
        super().__init__(store)

    def toolset(self) -> FunctionToolset[None]:
        """The six tools as a pydantic-ai toolset."""
        return FunctionToolset([
            self.list_events, self.get_event, self.create_event, self.update_event, self.delete_event,
            self.respond_to_invite,
        ])

    @staticmethod
    def _fetch(conn: sqlite3.Connection, event_id: int) -> Event:
        row = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE event_id = ?", (event_id,)).fetchone()
        if row is None:
            raise _not_found(event_id)
        return _event(row)

    def list_events(self, offset: int = 0, status: str | None = None) -> EventPage:
        """List one page of events, ordered by start time.

        A page has at most 50 events; to see them all, call again with `next_offset` until it is None.
        Answering invites changes which ones match a `status` filter, so page through everything before
        answering (or list without a filter).

        Args:
            offset: How many events to skip; 0 for the first page, then the previous page's `next_offset`.
            status: Only events whose `my_status` is this (`unanswered`, `accepted`, `declined`, `tentative`);
                None for all events.

        """
        check_offset(offset)
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)} (or None for all), got {status!r}")
        where, params = ("WHERE my_status = ?", (status,)) if status is not None else ("", ())
        with self.store.read() as conn:
            rows, next_offset, total = read_page(
                conn, f"SELECT {_COLUMNS} FROM events {where} ORDER BY start, event_id",
                f"SELECT COUNT(*) FROM events {where}", params, offset)
        return EventPage(items=[_event(row) for row in rows], next_offset=next_offset, total_events=total)

    def get_event(self, event_id: int) -> Event:
        """Get one event by its id.

        Args:
            event_id: The event's id, as shown by `list_events`.

        """
        with self.store.connect() as conn:
            return self._fetch(conn, event_id)

    def create_event(self, title: str, start: str, end: str) -> Event:
        """Create one of the owner's own events (organizer `me`, status `accepted`) and return it with its id.

        Args:
            title: What the event is; must not be empty.
            start: Local wall-clock start, ISO 8601 without an offset, e.g. `2026-03-06T16:00:00`.
            end: Local wall-clock end in the same form; later than `start`, on the same day.

        """
        if not title.strip():
            raise ValueError("title must not be empty")
        begins, ends = _parse_time("start", start), _parse_time("end", end)
        _check_span(begins, ends)

        def apply(conn: sqlite3.Connection) -> Event:
            cursor = conn.execute(
                f"INSERT INTO events ({_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, 'accepted')",
                (title, begins.isoformat(), ends.isoformat(), ME),
            )
            assert cursor.lastrowid is not None
            return self._fetch(conn, cursor.lastrowid)

        return self.mutate("create_event", {"title": title, "start": start, "end": end}, apply)

    def update_event(
        self, event_id: int, title: str | None = None, start: str | None = None, end: str | None = None
    ) -> Event:
        """Change the title or times of one of the owner's own events and return it; None keeps a field.

        Invites belong to their organizer: answer them with `respond_to_invite` instead.

        Args:
            event_id: The event's id, as shown by `list_events`; its organizer must be `me`.
            title: The new title, or None to keep it.
            start: The new local start (ISO 8601, no offset), or None to keep it.
            end: The new local end, or None to keep it; the result must still end after it starts, same day.

        """
        if title is None and start is None and end is None:
            raise ValueError("give at least one of title, start, end to change")
        if title is not None and not title.strip():
            raise ValueError("title must not be empty")
        new_start = _parse_time("start", start) if start is not None else None
        new_end = _parse_time("end", end) if end is not None else None

        def apply(conn: sqlite3.Connection) -> Event:
            event = self._fetch(conn, event_id)
            if event["organizer"] != ME:
                raise PermissionError(
                    f"event {event_id} is organized by {event['organizer']}; only your own events (organizer "
                    "'me') can be changed; answer an invite with respond_to_invite"
                )
            begins = new_start or datetime.datetime.fromisoformat(event["start"])
            ends = new_end or datetime.datetime.fromisoformat(event["end"])
            _check_span(begins, ends)
            conn.execute(
                'UPDATE events SET title = ?, start = ?, "end" = ? WHERE event_id = ?',
                (title if title is not None else event["title"], begins.isoformat(), ends.isoformat(), event_id),
            )
            return self._fetch(conn, event_id)

        args = {"event_id": event_id, "title": title, "start": start, "end": end}
        return self.mutate("update_event", args, apply)

    def delete_event(self, event_id: int) -> DeletedEvent:
        """Delete one event from the calendar (an own event, or an invite you no longer want to see).

        Args:
            event_id: The event's id, as shown by `list_events`.

        """

        def apply(conn: sqlite3.Connection) -> DeletedEvent:
            if conn.execute("DELETE FROM events WHERE event_id = ?", (event_id,)).rowcount == 0:
                raise _not_found(event_id)
            return DeletedEvent(event_id=event_id, deleted=True)

        return self.mutate("delete_event", {"event_id": event_id}, apply)

    def respond_to_invite(self, invite_id: int, response: str) -> Event:
        """Answer one invite and return it with its new `my_status`.

        Args:
            invite_id: The invite's `event_id`, as shown by `list_events`; its organizer must not be `me`.
            response: `accepted`, `declined` or `tentative`.

        """
        if response not in RESPONSES:
            raise ValueError(f"response must be one of {', '.join(RESPONSES)}, got {response!r}")

        def apply(conn: sqlite3.Connection) -> Event:
            event = self._fetch(conn, invite_id)
            if event["organizer"] == ME:
                raise ValueError(
                    f"event {invite_id} is your own event (organizer 'me'), not an invite; nothing to answer"
                )
            conn.execute("UPDATE events SET my_status = ? WHERE event_id = ?", (response, invite_id))
            return self._fetch(conn, invite_id)

        return self.mutate("respond_to_invite", {"invite_id": invite_id, "response": response}, apply)


def expected_responses(before: list[Event]) -> dict[int, Status]:
    """What "accept each unanswered weekday invite that ends by 5pm, decline the rest" answers, by event id."""
    return {
        event["event_id"]: "accepted" if ends_by_5pm_on_a_weekday(event) else "declined"
        for event in before
        if event["my_status"] == "unanswered"
    }


def check_invite_responses(store: CalendarStore, before: list[Event]) -> list[str]:
    """Check the end state of the invite task; an empty list means correct.

    Correct means: every invite of `before` that was unanswered is now `accepted` if it is on a weekday and
    ends by 17:00, `declined` otherwise, and is otherwise unchanged; every other event is unchanged; no event
    was created or deleted.
    """
    expected = expected_responses(before)
    after = {event["event_id"]: event for event in store.all_events()}
    problems: list[str] = []
    for event in before:
        event_id = event["event_id"]
        now = after.get(event_id)
        label = f"event {event_id} ({event['title']}, {event['start']} to {event['end'][11:16]})"
        if now is None:
            problems.append(f"{label} was deleted")
            continue
        want: dict[str, Any] = {**event, "my_status": expected.get(event_id, event["my_status"])}
        if now == want:
            continue
        if event_id in expected and now["my_status"] != want["my_status"]:
            problems.append(f"{label} was unanswered and should be {want['my_status']}, but is {now['my_status']}")
        elif event_id not in expected and now["my_status"] != event["my_status"]:
            problems.append(
                f"{label} was already {event['my_status']} and should be left alone, but is {now['my_status']}"
            )
        else:
            problems.append(f"{label} changed: {event} -> {now}")
    before_ids = {event["event_id"] for event in before}
    for event_id, event in after.items():
        if event_id not in before_ids:
            problems.append(f"event {event_id} ({event['title']}) was created")
    return problems
