"""What the run's workers already hold of its conversation, so each message enters the history once.

From behaviour version 4 (`CONVERSATION_SENT_ONCE`) an activity that takes the conversation gets only the messages
that are new since the run's previous such activity, plus a reference to the ones before (`ConversationPrefix`).
`SentConversation` mirrors what a worker's cache holds after each of them (`worker._conversations`): the messages
last sent, and the response the model activity answered, which the worker that made it keeps too. A worker that
holds less (another worker, a restart) asks the run (`CONVERSATION_QUERY`), answered here from memory.

The prefix is found by identity first: the run's loop appends to its list of messages and replaces a message only
by a new object (`with_note`, a hook's rewritten history), so an unchanged message is the same object. Past those,
by digest: a history a hook rewrote (new objects) still refers to the messages it left as they were. Everything
here is a function of the run's own objects, so a replay rebuilds the same state.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.tools import ToolDefinition

    from ..shared._conversation import (
        ConversationPrefix,
        ConversationRange,
        digests_of,
        message_json,
        tools_digest,
        tools_json,
    )
    from ..shared._names import CONVERSATION_QUERY, MODEL_TOOLS_QUERY

__all__ = ["ConversationHandlers", "SentConversation"]


class SentConversation:
    """The messages the run's workers hold (sent in earlier inputs, or answered by them), with their digests."""

    def __init__(self, held: Sequence[ModelMessage] = (), *, sends_once: bool) -> None:
        """Start from `held`: the conversation the run's input carried (a worker asks the run for it once).

        `sends_once`: the run's behaviour version sends each message once; otherwise every input carries the whole
        conversation, as such runs recorded it.
        """
        self._sends_once = sends_once
        self._messages: list[ModelMessage] = []
        self._digests: list[str] = []
        self._tools: Sequence[ToolDefinition] | None = None
        self._tools_json = b""
        if sends_once:
            self._adopt(list(held), 0)

    def refer(self, messages: Sequence[ModelMessage]) -> tuple[ConversationPrefix | None, list[ModelMessage]]:
        """`messages` as an activity input carries them: the reference to those already held, and the new ones."""
        if not self._sends_once:
            return None, messages  # type: ignore[return-value]
        held = self._messages
        limit = min(len(held), len(messages))
        common = 0
        while common < limit and held[common] is messages[common]:
            common += 1
        if common < len(messages):
            # Past the same objects, the same JSON counts too: a history a hook rewrote keeps what it did not change.
            previous = self._digests[common - 1] if common else ""
            digests = self._digests[:common] + digests_of((message_json(m) for m in messages[common:]), previous)
            while common < limit and digests[common] == self._digests[common]:
                common += 1
            if common < len(messages):  # as the worker's cache: it keeps the longer of what it held and what it got
                self._messages, self._digests = list(messages), digests
        if common == 0:
            return None, list(messages)
        return ConversationPrefix(count=common, digest=self._digests[common - 1]), list(messages[common:])

    def refer_tools(self, tools: Sequence[ToolDefinition]) -> tuple[str | None, list[ToolDefinition]]:
        """The run's tool definitions as a model request carries them: whole the first time, then by digest."""
        if not self._sends_once:
            return None, tools  # type: ignore[return-value]
        if tools is self._tools:
            return tools_digest(self._tools_json), []
        self._tools, self._tools_json = tools, tools_json(tools)
        return None, list(tools)

    def tools(self) -> str:
        """The JSON of the tool definitions the run's requests refer to (`refer_tools`)."""
        if self._tools is None:
            raise ValueError("the run has sent no tool definitions yet: the worker asked for tools no request "
                             "referred to")
        return self._tools_json.decode()

    def answered(self, sent: Sequence[ModelMessage], response: ModelMessage) -> None:
        """The model activity answered `response` to `sent`: its worker holds them both, as this does now."""
        if self._sends_once and len(self._messages) == len(sent) and (not sent or self._messages[-1] is sent[-1]):
            self._adopt([*self._messages, response], len(self._messages))

    def messages(self, wanted: ConversationRange) -> list[str]:
        """The JSON of messages `wanted.start` onwards, up to `wanted.end` and about `wanted.max_bytes` of them."""
        if not 0 <= wanted.start <= wanted.end <= len(self._messages):
            raise ValueError(f"the run holds {len(self._messages)} messages of its conversation, not "
                             f"{wanted.start} to {wanted.end}: the worker asked for a conversation this run never sent")
        out: list[str] = []
        size = 0
        for message in self._messages[wanted.start:wanted.end]:
            item = message_json(message).decode()
            if out and size + len(item) > wanted.max_bytes:
                break
            out.append(item)
            size += len(item)
        return out

    def _adopt(self, messages: list[ModelMessage], common: int) -> None:
        previous = self._digests[common - 1] if common else ""
        self._digests = self._digests[:common] + digests_of((message_json(m) for m in messages[common:]), previous)
        self._messages = messages


class ConversationHandlers:
    """The conversation query of the run workflow (a mixin of `CodeModeRunWorkflow`)."""

    _conversation: SentConversation
    """What the run's workers hold of its conversation (`CodeModeRunWorkflow.run`)."""

    @workflow.query(name=CONVERSATION_QUERY)
    def conversation(self, wanted: ConversationRange) -> list[str]:
        """Messages of the conversation the run has sent, as JSON: for a worker that does not hold them."""
        return self._conversation.messages(wanted)

    @workflow.query(name=MODEL_TOOLS_QUERY)
    def model_tools(self) -> str:
        """The tool definitions the run's model requests refer to, as JSON: for a worker that does not hold them."""
        return self._conversation.tools()
