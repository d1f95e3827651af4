"""The worker's side of a conversation sent once: recent runs' conversations, and the run asked for the rest.

An activity input of behaviour version 4 carries only the messages new since the run's previous activity and a
reference to the ones before (`shared._conversation`). `ConversationCache` keeps each recent run's conversation as
message JSON, bounded by runs and bytes; a reference it cannot serve (another worker made the run's previous
request, the worker restarted, the entry was evicted) is answered by the run itself, through its conversation query
(workflow memory, no history). Either way the messages are checked against the reference's digest before the
model, a hook or a validator reads them, so a wrong conversation is never used: a mismatch fails the attempt with
`ConversationMismatch`, retried, and the retry asks the run.

The cache is keyed by workflow id, not run id: a run continued as new carries its conversation on, and the digest
says whether what the cache holds is that conversation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from pydantic_ai.messages import ModelMessage
from pydantic_ai.tools import ToolDefinition
from temporalio import activity
from temporalio.exceptions import ApplicationError

from ..shared._conversation import (
    ConversationPrefix,
    ConversationRange,
    digests_of,
    message_json,
    messages_of,
    tools_digest,
    tools_json,
    tools_of,
)
from ..shared._names import CONVERSATION_QUERY, MODEL_TOOLS_QUERY

__all__ = ["DEFAULT_CONVERSATION_CACHE_BYTES", "ConversationCache", "ResolvedConversation"]

DEFAULT_CONVERSATION_CACHE_BYTES = 64 * 1024 * 1024
"""The message JSON a worker keeps of recent runs' conversations; past it the least recently used runs go."""

DEFAULT_CONVERSATION_CACHE_RUNS = 1024
"""The most runs a worker keeps a conversation of."""

_T = TypeVar("_T")

_QUERY_TIMEOUT = timedelta(seconds=30)
"""How long one ask of the run may take: a run whose workflow workers are all down answers nothing, and the
activity's attempt fails (retried) rather than waiting out its own timeout."""


@dataclass
class _Entry:
    items: list[bytes]
    digests: list[str]
    size: int


@dataclass
class ResolvedConversation:
    """A conversation found for an activity input: its messages (new objects) and where the cache has it."""

    messages: list[ModelMessage]
    digest: str
    """The digest of the whole conversation (`""` for none): a response extends the cache only after it."""


class ConversationCache:
    """Recent runs' conversations on this worker, by workflow id, least recently used out first."""

    def __init__(self, *, max_bytes: int = DEFAULT_CONVERSATION_CACHE_BYTES,
                 max_runs: int = DEFAULT_CONVERSATION_CACHE_RUNS) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._tools: OrderedDict[str, bytes] = OrderedDict()
        """Each recent run's tool definitions (JSON), by workflow id: the same for every request of a run."""
        self._size = 0
        self._max_bytes, self._max_runs = max_bytes, max_runs
        self.asked = 0
        """How many references the run was asked for (a cache miss): for tests and the benchmark."""

    async def resolve(self, messages: Sequence[ModelMessage], earlier: ConversationPrefix | None, *,
                      subject: str) -> ResolvedConversation:
        """The whole conversation an input carries (`messages` after `earlier`), checked, and kept for the next.

        `subject` names the activity in errors ("the model request of run 'r-1'").
        """
        new_items = [message_json(m) for m in messages]
        if earlier is None:
            items: list[bytes] = []
            digests: list[str] = []
        else:
            items, digests = await self._earlier(earlier, subject)
        items = items + new_items
        digests = digests + digests_of(new_items, digests[-1] if digests else "")
        self._keep(_run_key(), items, digests)
        # Without a reference the input's own messages are the conversation, fresh from its payload.
        whole = list(messages) if earlier is None else messages_of(items)
        return ResolvedConversation(messages=whole, digest=digests[-1] if digests else "")

    async def tools(self, tools: Sequence[ToolDefinition], ref: str | None, *,
                    subject: str) -> list[ToolDefinition]:
        """The tool definitions a model request offers: `tools`, or the run's that `ref` refers to, checked."""
        key = _run_key()
        if ref is None:
            if key is not None and tools:
                self._keep_tools(key, tools_json(tools))
            return list(tools)
        held = self._tools.get(key) if key is not None else None
        if held is None or tools_digest(held) != ref:
            self.asked += 1
            held = (await _ask(MODEL_TOOLS_QUERY, None, str, subject, "its tool definitions")).encode()
            if tools_digest(held) != ref:
                raise ApplicationError(
                    f"{subject}: the tool definitions the run answered do not match the digest its input recorded, "
                    "so they were not used: the attempt is retried; a run that answers so again has a bug: report "
                    "it", type="ConversationMismatch")
        if key is not None:
            self._keep_tools(key, held)
        return tools_of(held)

    def _keep_tools(self, key: str, data: bytes) -> None:
        self._tools[key] = data
        self._tools.move_to_end(key)
        while len(self._tools) > self._max_runs:
            self._tools.popitem(last=False)

    def answered(self, conversation: ResolvedConversation, response: ModelMessage) -> None:
        """The model answered `response` to `conversation`: the run's next request refers to both."""
        key = _run_key()
        entry = self._entries.get(key) if key is not None else None
        if key is None or entry is None or (entry.digests[-1] if entry.digests else "") != conversation.digest:
            return
        item = message_json(response)
        self._keep(key, [*entry.items, item], [*entry.digests, *digests_of([item], conversation.digest)])

    def held_runs(self) -> list[str]:
        """The workflow ids whose conversations the cache holds, least recently used first."""
        return list(self._entries)

    def forget(self, key: str | None) -> None:
        """Drop what the cache holds of run `key`."""
        entry = self._entries.pop(key, None) if key is not None else None
        if entry is not None:
            self._size -= entry.size

    async def _earlier(self, earlier: ConversationPrefix, subject: str) -> tuple[list[bytes], list[str]]:
        key = _run_key()
        entry = self._entries.get(key) if key is not None else None
        count = earlier.count
        if entry is not None and len(entry.digests) >= count and entry.digests[count - 1] == earlier.digest:
            items = entry.items[:count]
            digests = digests_of(items)  # the bytes themselves, hashed again: a corrupted entry is never used
            if digests[-1] != earlier.digest:
                self.forget(key)
                raise _mismatch(subject, count, "this worker's cache of recent conversations",
                                then="the attempt is retried and asks the run itself")
            self._entries.move_to_end(key)  # type: ignore[arg-type]
            return items, digests
        self.asked += 1
        items = await _ask_run(count, subject)
        digests = digests_of(items)
        if len(items) != count or digests[-1] != earlier.digest:
            raise _mismatch(subject, count, "the run's answer to the conversation query",
                            then="the attempt is retried; a run that answers so again has a bug: report it")
        return items, digests

    def _keep(self, key: str | None, items: list[bytes], digests: list[str]) -> None:
        if key is None or not items:
            return
        old = self._entries.get(key)
        if old is not None and len(old.digests) >= len(digests) and old.digests[len(digests) - 1] == digests[-1]:
            self._entries.move_to_end(key)  # it holds this conversation and more (an output check's is shorter)
            return
        self.forget(key)
        entry = _Entry(items=items, digests=digests, size=sum(len(i) for i in items))
        if entry.size > self._max_bytes:
            return
        self._entries[key] = entry
        self._size += entry.size
        while self._size > self._max_bytes or len(self._entries) > self._max_runs:
            _, dropped = self._entries.popitem(last=False)
            self._size -= dropped.size


def _run_key() -> str | None:
    return activity.info().workflow_id if activity.in_activity() else None


async def _ask_run(count: int, subject: str) -> list[bytes]:
    """The run's first `count` messages, asked of the run itself, in chunks a query answer can carry."""
    items: list[bytes] = []
    while len(items) < count:
        chunk = await _ask(CONVERSATION_QUERY, ConversationRange(start=len(items), end=count), list[str], subject,
                           f"the run's first {count} messages")
        if not chunk:
            break
        items.extend(c.encode() for c in chunk)
    return items


async def _ask(query: str, arg: Any, result_type: type[_T], subject: str, what: str) -> _T:
    """The current activity's run's answer to `query`: what its workflow holds in memory, at no history cost."""
    info = activity.info()
    if info.workflow_id is None:
        raise ApplicationError(f"{subject} refers to {what}, but the activity belongs to no run: schedule it from "
                               "the run workflow", type="ConversationUnavailable", non_retryable=True)
    handle = activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
    try:
        args = [] if arg is None else [arg]
        answer: _T = await handle.query(query, *args, result_type=result_type, rpc_timeout=_QUERY_TIMEOUT)
        return answer
    except Exception as e:
        raise ApplicationError(
            f"{subject} refers to {what}, which this worker does not hold, and asking the run for them failed "
            f"({type(e).__name__}: {e}): the attempt is retried; if it goes on failing, check that the run's task "
            "queue has a workflow worker running", type="ConversationUnavailable") from e


def _mismatch(subject: str, count: int, where: str, *, then: str) -> ApplicationError:
    return ApplicationError(
        f"{subject}: the run's first {count} messages found in {where} do not match the digest its input recorded, "
        f"so they were not used: {then}", type="ConversationMismatch")
