"""The chat app's tools: CRUD behaviour, pagination, validation, idempotency, the seed and the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai import RunContext
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from durable_codemode.apps.activities.chat import (
    BOT,
    MAX_TEXT,
    PAGE_SIZE,
    ChatStore,
    ChatTools,
    Message,
    check_refund_replies,
    unanswered_refund_questions,
)
from durable_codemode.testing import tool_call_context

LINK = "https://example.com/refund-form"


@pytest.fixture
def store(tmp_path: Path) -> ChatStore:
    store = ChatStore(tmp_path / "chat.db")
    store.seed()
    return store


@pytest.fixture
def tools(store: ChatStore) -> ChatTools:
    return ChatTools(store)


def _support(store: ChatStore) -> list[Message]:
    return [m for m in store.all_messages() if m["channel"] == "support"]


def _thread(messages: list[Message], top: Message) -> list[Message]:
    return [m for m in messages if m["reply_to"] == top["message_id"]]


def test_seed_is_deterministic(tmp_path: Path) -> None:
    a, b, c = (ChatStore(tmp_path / f"{name}.db") for name in "abc")
    a.seed(seed=0)
    b.seed(seed=0)
    c.seed(seed=1)
    messages = a.all_messages()
    assert [m["message_id"] for m in messages] == list(range(1, len(messages) + 1))
    assert sum(m["channel"] == "support" and m["reply_to"] is None for m in messages) == 120
    assert messages == b.all_messages()
    assert messages != c.all_messages()


@pytest.mark.parametrize("n", [5, 20, 200])
def test_seed_has_the_boundary_messages(tmp_path: Path, n: int) -> None:
    store = ChatStore(tmp_path / "c.db")
    store.seed(questions=n, seed=n)
    messages = store.all_messages()
    tops = [m for m in messages if m["channel"] == "support" and m["reply_to"] is None]
    assert len(tops) == n
    targets = unanswered_refund_questions(messages)
    assert any(m["text"].startswith("Can I get a refund") for m in targets)
    # Only a customer replied: still unanswered.
    assert any(_thread(messages, m) and all(r["author_role"] == "customer" for r in _thread(messages, m))
               for m in targets)
    answered = next(m for m in tops if m["text"].startswith("Refund status"))
    assert answered not in targets and any(r["author_role"] == "support" for r in _thread(messages, answered))
    money_back = next(m for m in tops if "money back" in m["text"])
    statement = next(m for m in tops if m["text"].startswith("Thanks, the refund"))
    assert money_back not in targets and statement not in targets
    general = [m for m in messages if m["channel"] == "general"]
    assert any("refund" in m["text"] and "?" in m["text"] for m in general)
    for m in messages:
        if m["reply_to"] is not None:
            assert m["reply_to"] < m["message_id"]
    assert [m["posted_at"] for m in messages] == sorted(m["posted_at"] for m in messages)


def test_seed_mix(store: ChatStore) -> None:
    messages = store.all_messages()
    targets = unanswered_refund_questions(messages)
    refund_questions = [m for m in messages if m["channel"] == "support" and m["reply_to"] is None
                        and "?" in m["text"] and "refund" in m["text"].lower()]
    assert 15 < len(targets) < len(refund_questions) < 60
    assert {"refund", "Refund", "REFUND"} <= {w.strip("?,.!") for m in refund_questions for w in m["text"].split()}


def test_pagination_across_pages(tools: ChatTools, store: ChatStore) -> None:
    support = _support(store)
    pages = []
    offset: int | None = 0
    while offset is not None:
        page = tools.list_messages("support", offset)
        pages.append(page)
        offset = page["next_offset"]
    sizes = [len(p["items"]) for p in pages]
    assert sizes[:-1] == [PAGE_SIZE] * (len(pages) - 1) and 0 < sizes[-1] <= PAGE_SIZE
    assert all(p["total_messages"] == len(support) for p in pages)
    assert [m for p in pages for m in p["items"]] == support
    # A question's support reply can be on a later page than the question.
    first_page = {m["message_id"] for m in pages[0]["items"]}
    assert any(m["reply_to"] in first_page for p in pages[1:] for m in p["items"])
    assert tools.list_messages("#support", 0) == pages[0]
    assert tools.list_messages("support", 10_000)["items"] == []


def test_list_validation(tools: ChatTools) -> None:
    with pytest.raises(KeyError, match=r"no channel 'random'; the channels are: general, support"):
        tools.list_messages("random")
    with pytest.raises(ValueError, match="offset must be 0 or more"):
        tools.list_messages("support", -1)
    channels = tools.list_channels()
    assert [c["channel"] for c in channels] == ["general", "support"]
    assert channels[0]["message_count"] == 3


def test_get_message(tools: ChatTools, store: ChatStore) -> None:
    assert tools.get_message(7) == store.all_messages()[6]
    with pytest.raises(KeyError, match=r"no message 9999; list_messages\(channel=...\) shows the message ids"):
        tools.get_message(9999)


def test_post_edit_delete(tools: ChatTools, store: ChatStore) -> None:
    last = store.all_messages()[-1]
    question = unanswered_refund_questions(store.all_messages())[0]
    reply = tools.post_message("support", f"Form: {LINK}", reply_to=question["message_id"])
    assert reply["message_id"] == last["message_id"] + 1
    assert reply["author"] == BOT and reply["author_role"] == "support" and reply["reply_to"] == question["message_id"]
    assert reply["posted_at"] > last["posted_at"] and not reply["edited"]
    assert question not in unanswered_refund_questions(store.all_messages())
    edited = tools.edit_message(reply["message_id"], f"Please use the form: {LINK}")
    assert edited == {**reply, "text": f"Please use the form: {LINK}", "edited": True}
    top = tools.post_message("general", "Support hours are 9-5.")
    assert top["reply_to"] is None and top["channel"] == "general"
    assert tools.delete_message(reply["message_id"]) == {"message_id": reply["message_id"], "deleted": True}
    with pytest.raises(KeyError, match=f"no message {reply['message_id']}"):
        tools.get_message(reply["message_id"])
    assert store.execution_count() == 4


def test_post_validation(tools: ChatTools, store: ChatStore) -> None:
    messages = store.all_messages()
    support_reply = next(m for m in messages if m["reply_to"] is not None)
    general = next(m for m in messages if m["channel"] == "general")
    with pytest.raises(ValueError, match="text must not be empty"):
        tools.post_message("support", "  ")
    with pytest.raises(ValueError, match=f"the most a message can have is {MAX_TEXT}"):
        tools.post_message("support", "x" * (MAX_TEXT + 1))
    top_id = support_reply["reply_to"]
    with pytest.raises(ValueError, match=rf"is itself a reply.*reply to its top-level message {top_id}"):
        tools.post_message("support", "hi", reply_to=support_reply["message_id"])
    with pytest.raises(ValueError, match=f"message {general['message_id']} is in #general, not #support"):
        tools.post_message("support", "hi", reply_to=general["message_id"])
    with pytest.raises(KeyError, match="no message 9999"):
        tools.post_message("support", "hi", reply_to=9999)
    with pytest.raises(KeyError, match="no channel 'sales'"):
        tools.post_message("sales", "hi")
    with pytest.raises(PermissionError, match="support-bot can only edit its own messages"):
        tools.edit_message(1, "changed")
    with pytest.raises(PermissionError, match="support-bot can only delete its own messages"):
        tools.delete_message(1)
    top = tools.post_message("support", "Announcement")
    tools_reply = tools.post_message("support", "Follow-up", reply_to=top["message_id"])
    with pytest.raises(ValueError, match="has replies in its thread; delete those first"):
        tools.delete_message(top["message_id"])
    tools.delete_message(tools_reply["message_id"])
    tools.delete_message(top["message_id"])
    assert store.all_messages() == messages
    assert store.execution_count() == 4


def test_retry_with_the_same_key_runs_once(tools: ChatTools, store: ChatStore) -> None:
    question = unanswered_refund_questions(store.all_messages())[0]
    posted = []
    for attempt in (1, 2, 3):
        with tool_call_context(call_id="call_0.0", tool="post_message", attempt=attempt):
            posted.append(tools.post_message("support", f"Form: {LINK}", reply_to=question["message_id"]))
        with tool_call_context(call_id="call_0.1", tool="edit_message", attempt=attempt):
            tools.edit_message(posted[0]["message_id"], f"Form (edited): {LINK}")
    assert posted[0] == posted[1] == posted[2]
    assert store.execution_count("post_message") == 1
    assert store.execution_count("edit_message") == 1
    assert store.duplicate_effects() == 0
    assert [m["author"] for m in _thread(store.all_messages(), question)].count(BOT) == 1


def test_different_keys_are_different_calls(tools: ChatTools, store: ChatStore) -> None:
    question = unanswered_refund_questions(store.all_messages())[0]
    with tool_call_context(call_id="call_0.0"):
        tools.post_message("support", LINK, reply_to=question["message_id"])
    with tool_call_context(call_id="call_0.1"):
        tools.post_message("support", LINK, reply_to=question["message_id"])
    assert store.execution_count("post_message") == 2
    assert sum(m["author"] == BOT for m in store.all_messages()) == 2


def test_oracle(tools: ChatTools, store: ChatStore) -> None:
    before = store.all_messages()
    targets = unanswered_refund_questions(before)
    assert check_refund_replies(store, before, LINK)  # nothing posted yet: wrong
    for message in targets:
        tools.post_message("support", f"Form: {LINK}", reply_to=message["message_id"])
    assert check_refund_replies(store, before, LINK) == []
    general = next(m for m in before if m["channel"] == "general" and "refund" in m["text"])
    tools.post_message("general", f"Form: {LINK}", reply_to=general["message_id"])
    tools.post_message("support", "New top-level post")
    problems = check_refund_replies(store, before, LINK)
    assert len(problems) == 2
    assert any(f"a reply to {general['message_id']} in #general" in p for p in problems)
    assert any("a new top-level message in #support" in p for p in problems)


def test_oracle_reports_a_deleted_or_changed_message(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "c.db")
    store.seed(questions=20)
    before = store.all_messages()
    tools = ChatTools(store)
    for message in unanswered_refund_questions(before):
        tools.post_message("support", LINK, reply_to=message["message_id"])
    with store.write() as conn:  # what the tools refuse, done behind their back
        conn.execute("UPDATE messages SET text = 'rewritten' WHERE message_id = 1")
        conn.execute("DELETE FROM messages WHERE message_id = 2")
    problems = check_refund_replies(store, before, LINK)
    assert len(problems) == 2
    assert any(p.startswith("message 1 ") and "changed" in p for p in problems)
    assert any(p.startswith("message 2 ") and "was deleted" in p for p in problems)


async def test_toolset_exposes_the_six_tools(tools: ChatTools) -> None:
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    defs = await tools.toolset().get_tools(ctx)
    assert set(defs) == {"list_channels", "list_messages", "get_message", "post_message", "edit_message",
                         "delete_message"}
    post = defs["post_message"].tool_def
    assert set(post.parameters_json_schema["properties"]) == {"channel", "text", "reply_to"}
    assert post.parameters_json_schema["required"] == ["channel", "text"]
    assert "top-level message" in post.parameters_json_schema["properties"]["reply_to"]["description"]
