"""The bundled team-chat agent: `activities.chat`'s tools behind code mode, and its benchmark task.

The model is chosen as for the cart (see `workflows.cart`): the `model` argument, else `CODEMODE_MODEL` when an
OpenAI or Anthropic API key is set too, else `scripted_chat_model()`, which plays the model's part for
`TASK_PROMPT` offline.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_ai.models.function import FunctionModel

from durable_codemode import CodeModeAgent
from durable_codemode.apps.activities.chat import (
    ChatStore,
    ChatTools,
    Message,
    check_refund_replies,
    unanswered_refund_questions,
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
    "CHAT_DB_ENV",
    "CHAT_TASK",
    "DEFAULT_CHAT_DB",
    "INSTRUCTIONS",
    "REFUND_FORM",
    "SCRIPTED_MODEL_NAME",
    "TASK_PROMPT",
    "ChatInstance",
    "agents",
    "chat_agent",
    "chat_db_path",
    "scripted_chat_model",
]

CHAT_DB_ENV = "CODEMODE_CHAT_DB"
"""Environment variable with the chat's SQLite file."""

DEFAULT_CHAT_DB = Path("~/.local/share/durable-codemode/chat.sqlite")
"""Where the chat lives when `CODEMODE_CHAT_DB` is unset (`~` is expanded when read)."""

REFUND_FORM = "https://example.com/refund-form"
"""The link every reply must carry."""

TASK_PROMPT = (
    f"In #support, reply to each unanswered question that mentions a refund with our refund form link: {REFUND_FORM}"
)
"""The benchmark task: pages of reads, then one `post_message` reply per unanswered refund question."""

SCRIPTED_MODEL_NAME = "scripted-chat"
"""The `model_name` of `scripted_chat_model()`, as runs record it."""

INSTRUCTIONS = """\
You are support-bot in the team chat; you use the chat tools, which you call from Python programs via run_code.

- list_messages(channel=..., offset=...) returns one page of at most 50 messages, oldest first, thread replies \
included: a reply has reply_to set to its thread's top-level message id; a top-level message has reply_to None. \
Page through the whole channel in one program (offset=0, then next_offset until it is None) before deciding \
anything: a question's replies can be on a later page than the question.
- A question is a customer's top-level message (author_role 'customer', reply_to None) whose text contains '?'.
- A message mentions a refund when its text contains 'refund' in any letter case ('Refund', 'refunds', \
'refundable'); 'money back' or 'reimburse' without the word does not count.
- A question is answered when its thread has a reply with author_role 'support'; a reply by another customer \
does not answer it.
- Reply in a thread with post_message(channel=..., text=..., reply_to=<the question's message_id>). There is no \
bulk endpoint: post one reply per question, all at once with asyncio.gather(...). Reply to each question once.
- Do the filtering in the program and return a small summary (counts), not the raw messages.
- Only post what the user asked for; never edit or delete other people's messages.
- Answer in one or two sentences, with how many replies you posted.
"""
"""What the agent is told; written for a real model (the scripted one ignores it)."""

_SCRIPTED_PROGRAM = f"""\
import asyncio

link = '{REFUND_FORM}'
messages = []
offset: int | None = 0
while offset is not None:
    page = await list_messages(channel='support', offset=offset)
    messages.extend(page['items'])
    offset = page['next_offset']
answered = {{m['reply_to'] for m in messages if m['reply_to'] is not None and m['author_role'] == 'support'}}
todo = [
    m['message_id'] for m in messages
    if m['reply_to'] is None and m['author_role'] == 'customer' and '?' in m['text']
    and 'refund' in m['text'].lower() and m['message_id'] not in answered
]
text = f'Sorry for the wait! Please fill in our refund form and we will take it from there: {{link}}'
await asyncio.gather(*(post_message(channel='support', text=text, reply_to=i) for i in todo))
{{'replied': len(todo), 'messages_read': len(messages)}}
"""


def _summary(replied: int) -> str:
    questions = "question" if replied == 1 else "questions"
    return f"Replied to {replied} unanswered refund {questions} in #support with the refund form link ({REFUND_FORM})."


_answer = summary_answer("reply", lambda s: _summary(s["replied"]))
"""The scripted model's final answer, from what its program returned (or how it failed)."""


def scripted_chat_model() -> FunctionModel:
    """A scripted model that plays the model's part for `TASK_PROMPT`, offline.

    Turn 1 is one `run_code` program that pages through #support, finds the unanswered questions mentioning a
    refund and replies to them all concurrently, returning counts; turn 2 is the answer built from them. It
    answers every prompt this way; everything else in the run (Temporal, Monty, the tools, SQLite) is real.
    """
    return scripted_model(RunCode(_SCRIPTED_PROGRAM), _answer, name=SCRIPTED_MODEL_NAME)


def chat_db_path() -> Path:
    """The chat's SQLite file: `CODEMODE_CHAT_DB` if set, else `DEFAULT_CHAT_DB`."""
    return Path(os.environ.get(CHAT_DB_ENV) or DEFAULT_CHAT_DB).expanduser()


def chat_agent(store: ChatStore, *, model: Model | str | None = None) -> CodeModeAgent:
    """The chat agent over `store`.

    Args:
        store: The chat it works in; its tools read and change this SQLite file.
        model: A pydantic-ai model or model string; `None`: `CODEMODE_MODEL` if an API key is set too,
            else `scripted_chat_model()`.

    """
    chosen: Model | str = model or model_from_env() or scripted_chat_model()
    agent = Agent(chosen, name="chat", instructions=INSTRUCTIONS, toolsets=[ChatTools(store).toolset()])
    return CodeModeAgent(agent)


def agents() -> list[CodeModeAgent]:
    """The chat agent over `chat_db_path()`, seeded with 120 #support posts if the file is new."""
    path = chat_db_path()
    store = ChatStore(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        store.seed(questions=120)
    return [chat_agent(store)]


# -- the benchmark task ------------------------------------------------------------------------------------------


def _tool_calling_policy(seen: list[Seen]) -> list[Call] | str:
    """Page through all of #support first (a question's support reply can be pages later), then reply."""
    pages = [s.result for s in seen if s.tool == "list_messages" and s.ok]
    if not pages:
        return [Call("list_messages", {"channel": "support", "offset": 0})]
    if pages[-1]["next_offset"] is not None:
        return [Call("list_messages", {"channel": "support", "offset": pages[-1]["next_offset"]})]
    messages = [message for page in pages for message in page["items"]]
    answered = {m["reply_to"] for m in messages if m["reply_to"] is not None and m["author_role"] == "support"}
    questions = [
        m["message_id"] for m in messages
        if m["reply_to"] is None and m["author_role"] == "customer" and "?" in m["text"]
        and "refund" in m["text"].lower() and m["message_id"] not in answered
    ]
    done = {s.args["reply_to"] for s in seen if s.tool == "post_message"}
    text = f"Sorry for the wait! Please fill in our refund form and we will take it from there: {REFUND_FORM}"
    todo = [Call("post_message", {"channel": "support", "text": text, "reply_to": i}) for i in questions
            if i not in done]
    if todo:
        return todo
    return _summary(len(questions))


class ChatInstance:
    """`chat.refund-replies` at one N, the number of top-level #support posts (see `workflows.tasks.Instance`)."""

    def __init__(self, workdir: Path, n: int) -> None:
        """Seed a chat with `n` #support posts in `workdir`."""
        self.store = ChatStore(workdir / "chat.sqlite")
        self.store.seed(questions=n, seed=n)
        self.before: list[Message] = self.store.all_messages()
        self.prompt = TASK_PROMPT

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        """The chat agent; scripted for `mode` when `model` is None."""
        scripted: Model = (
            scripted_chat_model() if mode == "on"
            else tool_calling_model(_tool_calling_policy, name="scripted-tool-calling-chat")
        )
        agent = Agent(model or scripted, name="chat", instructions=INSTRUCTIONS,
                      toolsets=[ChatTools(self.store).toolset()])
        return CodeModeAgent(agent, code_mode=mode == "on")

    def check(self, reply: str) -> list[str]:
        """The end state is right, and the reply states how many replies were posted."""
        problems = check_refund_replies(self.store, self.before, REFUND_FORM)
        expected = len(unanswered_refund_questions(self.before))
        if str(expected) not in numbers_in(reply):
            problems.append(f"the reply does not state how many replies were posted ({expected}): {reply!r}")
        return problems

    def duplicate_effects(self) -> int:
        """Side effects that ran more than once."""
        return self.store.duplicate_effects()


CHAT_TASK = Task(
    name="chat.refund-replies",
    apps=("chat",),
    kind="scaling",
    sizes=SCALING_SIZES,
    setup=ChatInstance,
    description="reply to each unanswered #support question mentioning a refund with the refund form link",
)
"""The chat's scaling task."""
