"""The bundled team-chat app: channels of messages and one-level threads, single-item CRUD tools over SQLite.

Shaped like a typical chat API (Slack-like) rather than like something designed for an agent: a channel's
messages are listed 50 per page, oldest first, with thread replies in the same listing (each reply names its
thread's top message in `reply_to`); there is no bulk endpoint and no "unanswered" flag.

What the benchmark task relies on, defined once here and stated in the agent's instructions:
- a **question** is a customer's top-level message (`reply_to` is None, `author_role` `customer`) whose text
  contains `?`;
- it **mentions a refund** when its text contains `refund` in any letter case (`Refund`, `REFUNDS`,
  `refundable`); "money back" or "reimburse" without the word does not count;
- it is **answered** once its thread has a reply by someone from support (`author_role` `support`); a reply by
  another customer does not answer it. All of this is visible in `list_messages`.

The agent posts, edits and deletes as `support-bot` (role `support`) and may only edit or delete its own
messages. The mutating tools are idempotent by `current_call().idempotency_key` (see `activities._store`).
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
    "BOT",
    "CHANNELS",
    "MAX_TEXT",
    "PAGE_SIZE",
    "SUPPORT_CHANNEL",
    "Channel",
    "ChatStore",
    "ChatTools",
    "DeletedMessage",
    "Message",
    "MessagePage",
    "Role",
    "check_refund_replies",
    "is_unanswered_refund_question",
    "unanswered_refund_questions",
]


MAX_TEXT = 4000
"""The longest message text, in characters."""

BOT = "support-bot"
"""Who the agent posts as."""

SUPPORT_CHANNEL = "support"
"""Where customers ask; the seeded refund questions are here."""

CHANNELS = {
    SUPPORT_CHANNEL: "Customer questions; the support team answers in threads.",
    "general": "Company-wide chatter.",
}
"""The seeded channels and their topics."""

Role = Literal["customer", "support"]
"""Whether an author is a customer or on the support team."""

_FIRST_POST = datetime.datetime(2026, 3, 2, 8, 0)

_CUSTOMERS = ("alex", "bea", "carlos", "dee", "emeka", "farah", "gus", "hana", "ivan", "jules")
_SUPPORT = ("maria", "tom")

# Every template is unambiguous under the rules in the module docstring: each question has a "?", no
# statement asks anything, and only the refund templates contain "refund".
_REFUND_QUESTIONS = (
    "Can I get a refund for order #{o}?",
    "How long does a Refund usually take? Asking about order #{o}",
    "REFUND please?? I was charged twice for order #{o}",
    "Is the annual plan refundable if I cancel in the first week?",
    "I returned order #{o} last week, when will I see the refund?",
    "hi, do you do refunds for digital orders like #{o}?",
)
_MONEY_BACK_QUESTIONS = (
    "Can I get my money back for order #{o}?",
    "Will you reimburse the shipping on order #{o}?",
    "Order #{o} arrived broken, can you send a replacement or my money back?",
)
_REFUND_STATEMENTS = (
    "Thanks, the refund for order #{o} arrived!",
    "Got my refund for #{o}, all good now.",
    "Just saying: the refund process was painless.",
)
_OTHER_QUESTIONS = (
    "How do I change the email on my account?",
    "Does order #{o} ship to Canada?",
    "Is there a dark mode in the app?",
    "Can I add a second user to my plan?",
)
_OTHER_STATEMENTS = (
    "Order #{o} arrived today, thanks!",
    "The new checkout page is much faster.",
    "Love the latest update.",
)
_SUPPORT_REPLIES = (
    "Thanks for reaching out, we're on it.",
    "Sorted: you should see it within 3-5 business days.",
    "I've sent you a direct message with the details.",
)
_CUSTOMER_REPLIES = ("Same problem here.", "+1, following this thread.", "Also waiting on this one.")
_GENERAL = (
    ("alex", "Does anyone know how refunds work for team expenses?"),
    ("maria", "Welcome to the new folks this week!"),
    ("bea", "Lunch at noon, who's in?"),
)
"""#general's messages: a refund question in the wrong channel, among others."""


@documented
class Channel(TypedDict):
    """One channel."""

    channel: str
    """The channel's name, without `#`."""

    topic: str
    """What the channel is for."""

    message_count: int
    """How many messages it has, thread replies included."""


@documented
class Message(TypedDict):
    """One message: a top-level post in a channel, or a reply in a top-level post's thread."""

    message_id: int
    """The message's id; ids grow with posting time and are never reused."""

    channel: str
    """The channel it is in, without `#`."""

    author: str
    """Who wrote it (`support-bot` for messages posted with these tools)."""

    author_role: Role
    """`customer`, or `support` for the support team (including `support-bot`)."""

    text: str
    """What it says."""

    reply_to: int | None
    """None for a top-level message; for a thread reply, the `message_id` of the thread's top-level message."""

    posted_at: str
    """When it was posted: UTC, ISO 8601 without an offset (`2026-03-02T08:15:00`)."""

    edited: bool
    """Whether its text was edited after posting."""


@documented
class MessagePage(TypedDict):
    """One page of `list_messages`."""

    items: list[Message]
    """At most 50 messages, oldest first (thread replies in the same listing, after their top message)."""

    next_offset: int | None
    """The offset to pass for the next page; None on the last page."""

    total_messages: int
    """How many messages the channel has, thread replies included."""


@documented
class DeletedMessage(TypedDict):
    """The outcome of `delete_message`."""

    message_id: int
    """The id of the deleted message."""

    deleted: bool
    """True: the message is gone."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS channels (
    channel TEXT PRIMARY KEY,
    topic TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    message_id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL REFERENCES channels (channel),
    author TEXT NOT NULL,
    author_role TEXT NOT NULL,
    text TEXT NOT NULL,
    reply_to INTEGER,
    posted_at TEXT NOT NULL,
    edited INTEGER NOT NULL DEFAULT 0
);
"""

_COLUMNS = "message_id, channel, author, author_role, text, reply_to, posted_at, edited"


def _message(row: tuple[Any, ...]) -> Message:
    return Message(message_id=row[0], channel=row[1], author=row[2], author_role=cast(Role, row[3]), text=row[4],
                   reply_to=row[5], posted_at=row[6], edited=bool(row[7]))


def _not_found(message_id: int) -> KeyError:
    return KeyError(f"no message {message_id}; list_messages(channel=...) shows the message ids")


def _check_text(text: str) -> None:
    if not text.strip():
        raise ValueError("text must not be empty")
    if len(text) > MAX_TEXT:
        raise ValueError(f"text is {len(text)} characters; the most a message can have is {MAX_TEXT}")


def is_unanswered_refund_question(message: Message, thread: list[Message]) -> bool:
    """Whether `message` is a question mentioning a refund with no support reply among `thread` (its replies)."""
    return (
        message["reply_to"] is None
        and message["author_role"] == "customer"
        and "?" in message["text"]
        and "refund" in message["text"].lower()
        and not any(reply["author_role"] == "support" for reply in thread)
    )


def unanswered_refund_questions(messages: list[Message], channel: str = SUPPORT_CHANNEL) -> list[Message]:
    """The unanswered questions mentioning a refund in `channel`, by the rules in the module docstring."""
    threads: dict[int, list[Message]] = {}
    for message in messages:
        if message["reply_to"] is not None:
            threads.setdefault(message["reply_to"], []).append(message)
    return [
        message for message in messages
        if message["channel"] == channel
        and is_unanswered_refund_question(message, threads.get(message["message_id"], []))
    ]


class ChatStore(SqliteStore):
    """The chat's SQLite file, plus the bookkeeping tests use to check side effects ran exactly once."""

    SCHEMA = _SCHEMA
    TABLES = ("messages", "channels")

    def seed(self, questions: int = 120, seed: int = 0) -> None:
        """Replace the whole store with `questions` customer posts in #support, their threads and #general.

        About a third of the #support messages are questions mentioning a refund (worded variously), the rest
        are "money back" questions, other questions and statements (some mentioning a refund, but not asking).
        About a third of the threads have a support reply, some only a customer's. Five messages are always
        there so the task cannot be done by a lax reading: an unanswered refund question, one answered by
        support, one with only a customer's "+1" (still unanswered), a "money back" question and a refund
        statement. #general has a refund question too, which is not #support's.

        Args:
            questions: How many top-level messages #support gets; at least 5 (for the five boundary messages).
            seed: The `random.Random` seed; the same seed gives the same chat.

        """
        if questions < 5:
            raise ValueError(f"questions must be at least 5 (for the five boundary messages), got {questions}")
        rng = random.Random(seed)
        kinds = (_REFUND_QUESTIONS, _MONEY_BACK_QUESTIONS, _REFUND_STATEMENTS, _OTHER_QUESTIONS, _OTHER_STATEMENTS)
        # (template, thread: 'support' | 'customer' | None)
        posts: list[tuple[str, str | None]] = []
        for _ in range(questions):
            templates = rng.choices(kinds, weights=(35, 10, 10, 25, 20))[0]
            roll = rng.random()
            thread = "support" if roll < 0.35 else "customer" if roll < 0.5 else None
            posts.append((rng.choice(templates), thread))
        boundary = [
            ("Can I get a refund for order #{o}?", None),
            ("Refund status for order #{o}?", "support"),
            ("Is a REFUND possible if I cancel today?", "customer"),
            ("Can I get my money back for order #{o}?", None),
            ("Thanks, the refund for order #{o} arrived!", None),
        ]
        for index, post in zip(rng.sample(range(questions), 5), boundary, strict=True):
            posts[index] = post

        # (posted_at, channel, author, role, text, the row of the thread's top message or None)
        rows: list[tuple[datetime.datetime, str, str, str, str, int | None]] = []
        for index, (template, thread) in enumerate(posts):
            at = _FIRST_POST + datetime.timedelta(minutes=7 * index)
            top = len(rows)
            rows.append((at, SUPPORT_CHANNEL, rng.choice(_CUSTOMERS), "customer",
                         template.format(o=rng.randint(10_000, 99_999)), None))
            if thread is not None:
                reply_at = at + datetime.timedelta(minutes=rng.randint(5, 400))
                if thread == "support":
                    author, role, reply = rng.choice(_SUPPORT), "support", rng.choice(_SUPPORT_REPLIES)
                else:
                    author, role, reply = rng.choice(_CUSTOMERS), "customer", rng.choice(_CUSTOMER_REPLIES)
                rows.append((reply_at, SUPPORT_CHANNEL, author, role, reply, top))
        for n, (author, text) in enumerate(_GENERAL):
            role = "support" if author in _SUPPORT else "customer"
            rows.append((_FIRST_POST + datetime.timedelta(minutes=60 * n + 3), "general", author, role, text, None))
        # Ids follow posting time, as in a real chat; a reply is always posted after its thread's top message.
        order = sorted(range(len(rows)), key=lambda i: (rows[i][0], i))
        ids = {row: message_id for message_id, row in enumerate(order, start=1)}
        self.create_schema()
        with self.write() as conn:
            self.reset(conn)
            conn.executemany("INSERT INTO channels (channel, topic) VALUES (?, ?)", CHANNELS.items())
            conn.executemany(
                f"INSERT INTO messages ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
                [
                    (ids[i], channel, author, role, text, None if top is None else ids[top], at.isoformat())
                    for i in order
                    for at, channel, author, role, text, top in (rows[i],)
                ],
            )

    def all_messages(self) -> list[Message]:
        """Every message of every channel, ordered by id."""
        with self.connect() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM messages ORDER BY message_id").fetchall()
        return [_message(row) for row in rows]


class ChatTools(IdempotentTools):
    """The chat's tools, bound to one store; `toolset()` hands them to an agent."""

    store: ChatStore

    def __init__(self, store: ChatStore) -> None:
        """Serve the tools from `store`."""
        super().__init__(store)

    def toolset(self) -> FunctionToolset[None]:
        """The six tools as a pydantic-ai toolset."""
        return FunctionToolset([
            self.list_channels, self.list_messages, self.get_message, self.post_message, self.edit_message,
            self.delete_message,
        ])

    @staticmethod
    def _fetch(conn: sqlite3.Connection, message_id: int) -> Message:
        row = conn.execute(f"SELECT {_COLUMNS} FROM messages WHERE message_id = ?", (message_id,)).fetchone()
        if row is None:
            raise _not_found(message_id)
        return _message(row)

    @staticmethod
    def _channel(conn: sqlite3.Connection, channel: str) -> str:
        name = channel.removeprefix("#")
        if conn.execute("SELECT 1 FROM channels WHERE channel = ?", (name,)).fetchone() is None:
            known = ", ".join(row[0] for row in conn.execute("SELECT channel FROM channels ORDER BY channel"))
            raise KeyError(f"no channel {channel!r}; the channels are: {known} (list_channels() shows them)")
        return name

    def list_channels(self) -> list[Channel]:
        """List every channel, with its topic and how many messages it has."""
        with self.store.read() as conn:
            rows = conn.execute(
                "SELECT c.channel, c.topic, COUNT(m.message_id) FROM channels c"
                " LEFT JOIN messages m ON m.channel = c.channel GROUP BY c.channel ORDER BY c.channel"
            ).fetchall()
        return [Channel(channel=row[0], topic=row[1], message_count=row[2]) for row in rows]

    def list_messages(self, channel: str, offset: int = 0) -> MessagePage:
        """List one page of a channel's messages, oldest first, thread replies included.

        A page has at most 50 messages; to see them all, call again with `next_offset` until it is None. A
        question's replies can be on a later page than the question: page through everything before deciding
        which questions are answered.

        Args:
            channel: The channel's name, e.g. `support` (a leading `#` is ignored).
            offset: How many messages to skip; 0 for the first page, then the previous page's `next_offset`.

        """
        check_offset(offset)
        with self.store.read() as conn:
            name = self._channel(conn, channel)
            rows, next_offset, total = read_page(
                conn, f"SELECT {_COLUMNS} FROM messages WHERE channel = ? ORDER BY message_id",
                "SELECT COUNT(*) FROM messages WHERE channel = ?", (name,), offset)
        return MessagePage(items=[_message(row) for row in rows], next_offset=next_offset, total_messages=total)

    def get_message(self, message_id: int) -> Message:
        """Get one message by its id.

        Args:
            message_id: The message's id, as shown by `list_messages`.

        """
        with self.store.connect() as conn:
            return self._fetch(conn, message_id)

    def post_message(self, channel: str, text: str, reply_to: int | None = None) -> Message:
        """Post a message as `support-bot` and return it with its id: top-level, or a reply in a thread.

        Args:
            channel: The channel's name, e.g. `support`.
            text: What to say; 1 to 4000 characters.
            reply_to: To reply in a thread, the `message_id` of the thread's top-level message (in `channel`);
                None for a new top-level message.

        """
        _check_text(text)

        def apply(conn: sqlite3.Connection) -> Message:
            name = self._channel(conn, channel)
            if reply_to is not None:
                parent = self._fetch(conn, reply_to)
                if parent["channel"] != name:
                    raise ValueError(
                        f"message {reply_to} is in #{parent['channel']}, not #{name}; post the reply there"
                    )
                if parent["reply_to"] is not None:
                    raise ValueError(
                        f"message {reply_to} is itself a reply; threads are one level deep, so reply to its "
                        f"top-level message {parent['reply_to']}"
                    )
            last = conn.execute("SELECT MAX(posted_at) FROM messages").fetchone()[0]
            # The store's clock: one minute after the latest message, so ids and posting times agree and a
            # seed gives the same results in every run.
            at = (datetime.datetime.fromisoformat(last) if last else _FIRST_POST) + datetime.timedelta(minutes=1)
            cursor = conn.execute(
                f"INSERT INTO messages ({_COLUMNS}) VALUES (NULL, ?, ?, 'support', ?, ?, ?, 0)",
                (name, BOT, text, reply_to, at.isoformat()),
            )
            assert cursor.lastrowid is not None
            return self._fetch(conn, cursor.lastrowid)

        return self.mutate("post_message", {"channel": channel, "text": text, "reply_to": reply_to}, apply)

    def edit_message(self, message_id: int, text: str) -> Message:
        """Replace the text of one of `support-bot`'s own messages and return it.

        Args:
            message_id: The message's id; it must be one `support-bot` posted.
            text: The new text; 1 to 4000 characters.

        """
        _check_text(text)

        def apply(conn: sqlite3.Connection) -> Message:
            message = self._fetch(conn, message_id)
            if message["author"] != BOT:
                raise PermissionError(
                    f"message {message_id} is {message['author']}'s; support-bot can only edit its own messages"
                )
            conn.execute("UPDATE messages SET text = ?, edited = 1 WHERE message_id = ?", (text, message_id))
            return self._fetch(conn, message_id)

        return self.mutate("edit_message", {"message_id": message_id, "text": text}, apply)

    def delete_message(self, message_id: int) -> DeletedMessage:
        """Delete one of `support-bot`'s own messages.

        Args:
            message_id: The message's id; it must be one `support-bot` posted, with no replies left in its thread.

        """

        def apply(conn: sqlite3.Connection) -> DeletedMessage:
            message = self._fetch(conn, message_id)
            if message["author"] != BOT:
                raise PermissionError(
                    f"message {message_id} is {message['author']}'s; support-bot can only delete its own messages"
                )
            if conn.execute("SELECT 1 FROM messages WHERE reply_to = ?", (message_id,)).fetchone() is not None:
                raise ValueError(f"message {message_id} has replies in its thread; delete those first")
            conn.execute("DELETE FROM messages WHERE message_id = ?", (message_id,))
            return DeletedMessage(message_id=message_id, deleted=True)

        return self.mutate("delete_message", {"message_id": message_id}, apply)


def check_refund_replies(store: ChatStore, before: list[Message], link: str) -> list[str]:
    """Check the end state of "reply to each unanswered refund question with `link`"; empty means correct.

    Correct means: every message of `before` is still there unchanged; each unanswered question mentioning a
    refund in #support (`unanswered_refund_questions(before)`) has exactly one new reply, by `support-bot`,
    containing `link`; and nothing else was posted.
    """
    targets = {message["message_id"]: message for message in unanswered_refund_questions(before)}
    after = {message["message_id"]: message for message in store.all_messages()}
    problems: list[str] = []
    before_ids = set()
    for message in before:
        before_ids.add(message["message_id"])
        now = after.get(message["message_id"])
        label = f"message {message['message_id']} ({message['author']}: {message['text']!r})"
        if now is None:
            problems.append(f"{label} was deleted")
        elif now != message:
            problems.append(f"{label} changed: {message} -> {now}")
    replies: dict[int, list[Message]] = {}
    for message_id, message in after.items():
        if message_id in before_ids:
            continue
        if message["reply_to"] in targets:
            replies.setdefault(message["reply_to"], []).append(message)
        else:
            where = "a new top-level message" if message["reply_to"] is None else f"a reply to {message['reply_to']}"
            problems.append(
                f"message {message_id} ({where} in #{message['channel']}: {message['text']!r}) should not have "
                "been posted"
            )
    for target_id, target in targets.items():
        label = f"question {target_id} ({target['text']!r})"
        posted = replies.get(target_id, [])
        if not posted:
            problems.append(f"{label} got no reply")
        elif len(posted) > 1:
            problems.append(f"{label} got {len(posted)} replies instead of one")
        for reply in posted:
            if link not in reply["text"]:
                problems.append(f"the reply {reply['message_id']} to {label} lacks the link {link}")
            if reply["author"] != BOT:
                problems.append(f"the reply {reply['message_id']} to {label} is by {reply['author']}, not {BOT}")
    return problems
