"""A run's conversation sent once: what an activity input carries instead of the messages its workers already hold.

Before behaviour version 4 every model request's activity input carried the whole conversation so far, so a run's
history grew with the square of its turns (measured: 10 turns 199 KB, 20 turns 535 KB; a long run was forced to
continue as new by its conversation alone). From version 4 an input carries only the messages that are new since
the run's previous activity, plus a `ConversationPrefix`: how many messages come before them and a digest of those.
The worker finds them in its cache of recent conversations, or asks the run itself (`CONVERSATION_QUERY`, answered
from workflow memory: no history), and checks the digest before anything reads them.

Both sides compute the digest over the same bytes: each message as pydantic-ai's own JSON (`message_json`), chained
(`chain`). The workflow hashes its own objects; the worker hashes what it received or what the query answered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.tools import ToolDefinition

__all__ = ["CONVERSATION_CHUNK_BYTES", "ConversationPrefix", "ConversationRange", "chain", "digests_of",
           "message_json", "messages_of", "tools_digest", "tools_json", "tools_of"]

_TOOLS = TypeAdapter(list[ToolDefinition])

CONVERSATION_CHUNK_BYTES = 1024 * 1024
"""The most message JSON one answer of the conversation query carries (at least one message): well under the
2 MiB Temporal allows a payload, with room for the payload's encoding and an encryption codec's overhead."""


@dataclass(frozen=True, kw_only=True)
class ConversationPrefix:
    """The messages of a run's conversation that come before those an activity input carries, by reference."""

    count: int
    """How many messages come first (at least 1: an input that refers to none carries `earlier=None`)."""
    digest: str
    """`chain` over those messages' JSON: what the worker checks the messages it found against."""


@dataclass(frozen=True, kw_only=True)
class ConversationRange:
    """The argument of the conversation query: messages `start` to `end` (exclusive), at most `max_bytes` of them."""

    start: int
    end: int
    max_bytes: int = CONVERSATION_CHUNK_BYTES


def message_json(message: ModelMessage) -> bytes:
    """`message` as pydantic-ai's JSON for a message history (the bytes both sides hash)."""
    return ModelMessagesTypeAdapter.dump_json([message])[1:-1]


def chain(previous: str, item: bytes) -> str:
    """The digest of a conversation whose messages before the last have digest `previous` and whose last is `item`."""
    return hashlib.sha256(previous.encode() + b"\n" + item).hexdigest()


def digests_of(items: Iterable[bytes], previous: str = "") -> list[str]:
    """The chained digest after each of `items` (message JSON), starting after a conversation of digest `previous`."""
    digests = []
    for item in items:
        previous = chain(previous, item)
        digests.append(previous)
    return digests


def tools_json(tools: Sequence[ToolDefinition]) -> bytes:
    """The run's tool definitions as JSON: sent in the run's first model request, referred to by digest after."""
    return _TOOLS.dump_json(list(tools))


def tools_digest(data: bytes) -> str:
    """The digest of tool definitions' JSON (`tools_json`): what `ModelRequestInput.tools_ref` holds."""
    return hashlib.sha256(data).hexdigest()


def tools_of(data: bytes) -> list[ToolDefinition]:
    """The tool definitions of `data` (`tools_json`), as new objects."""
    return _TOOLS.validate_json(data)


def messages_of(items: Sequence[bytes]) -> list[ModelMessage]:
    """The messages of `items` (message JSON), each a new object: nothing a reader changes reaches a cache."""
    return ModelMessagesTypeAdapter.validate_json(b"[" + b",".join(items) + b"]")
