"""The chat's benchmark task end to end at N = 20, in both modes, graded by its oracle and replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from durable_codemode.apps.activities.chat import ChatStore, ChatTools, unanswered_refund_questions
from durable_codemode.apps.workflows.chat import CHAT_DB_ENV, CHAT_TASK, REFUND_FORM, ChatInstance, agents
from durable_codemode.apps.workflows.tasks import Mode

from ._tasks import run_graded


@pytest.mark.parametrize("mode", ["on", "off"])
async def test_chat_task_at_20_in_both_modes(client: Client, tmp_path: Path, mode: Mode) -> None:
    instance = CHAT_TASK.setup(tmp_path, 20)
    assert instance.agent(mode).name == "chat"
    await run_graded(client, instance, mode)
    targets = unanswered_refund_questions(instance.before)
    assert instance.store.execution_count("post_message") == instance.store.execution_count() == len(targets)


def _reply_to_all(instance: ChatInstance) -> int:
    tools = ChatTools(instance.store)
    targets = unanswered_refund_questions(instance.before)
    for message in targets:
        tools.post_message("support", f"Here is the form: {REFUND_FORM}", reply_to=message["message_id"])
    return len(targets)


def test_oracle_passes_on_the_right_end_state_and_reply(tmp_path: Path) -> None:
    instance = ChatInstance(tmp_path, 20)
    replied = _reply_to_all(instance)
    assert replied > 0
    assert instance.check(f"Replied to {replied} questions.") == []


def test_oracle_fails_on_a_reply_with_wrong_numbers(tmp_path: Path) -> None:
    instance = ChatInstance(tmp_path, 20)
    replied = _reply_to_all(instance)
    problems = instance.check(f"Replied to {replied + 1} questions.")
    assert problems == [f"the reply does not state how many replies were posted ({replied}): "
                        f"'Replied to {replied + 1} questions.'"]


def test_oracle_fails_on_a_wrong_end_state(tmp_path: Path) -> None:
    instance = ChatInstance(tmp_path, 20)
    replied = _reply_to_all(instance)
    tools = ChatTools(instance.store)
    before = instance.before
    targets = unanswered_refund_questions(before)
    # A lax reading: "money back" taken for a refund, and a question replied to twice; one reply lacks the link.
    money_back = next(m for m in before if "money back" in m["text"] and m["reply_to"] is None)
    tools.post_message("support", f"Form: {REFUND_FORM}", reply_to=money_back["message_id"])
    tools.post_message("support", f"Again: {REFUND_FORM}", reply_to=targets[0]["message_id"])
    tools.post_message("support", "See the pinned form.", reply_to=targets[1]["message_id"])
    problems = instance.check(f"Replied to {replied} questions.")
    assert len(problems) == 4
    assert any(f"a reply to {money_back['message_id']} " in p and "should not have been posted" in p
               for p in problems)
    assert any(f"question {targets[0]['message_id']} " in p and "got 2 replies" in p for p in problems)
    assert any(f"question {targets[1]['message_id']} " in p and "got 2 replies" in p for p in problems)
    assert any("lacks the link" in p for p in problems)


def test_oracle_fails_when_nothing_was_done(tmp_path: Path) -> None:
    instance = CHAT_TASK.setup(tmp_path, 20)
    problems = instance.check("Replied to 0 questions.")
    assert sum("got no reply" in p for p in problems) == len(unanswered_refund_questions(instance.before)) > 0


def test_agents_serve_the_chat_from_the_env_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sub" / "chat.sqlite"
    monkeypatch.setenv(CHAT_DB_ENV, str(path))
    [agent] = agents()
    assert agent.name == "chat" and path.exists()
    store = ChatStore(path)
    count = len(store.all_messages())
    assert sum(m["channel"] == "support" and m["reply_to"] is None for m in store.all_messages()) == 120
    ChatTools(store).post_message("support", "hello")
    agents()  # an existing chat is served as it is, never reseeded
    assert len(store.all_messages()) == count + 1
