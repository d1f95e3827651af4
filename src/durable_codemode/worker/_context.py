"""What a tool can learn about the call it is serving: chiefly an idempotency key.

Activities are at-least-once: a worker can die after a tool's side effect and before Temporal records the
result, and the retry runs the tool again. Every nested call therefore has a stable id, and a tool that
changes data can use `current_call().idempotency_key` to make its second execution a no-op.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["ToolCallContext", "current_call"]


@dataclass(frozen=True, kw_only=True)
class ToolCallContext:
    """The identity of one tool call, as seen from inside the tool."""

    workflow_id: str
    """The agent run's workflow id; it stays the same across continue-as-new."""

    call_id: str
    """`<run_code call id>.<n>` for a call from a snippet, the model's tool call id for a direct call."""

    tool: str
    """The tool's name as the model sees it."""

    attempt: int
    """The activity attempt, 1 for the first execution."""

    @property
    def idempotency_key(self) -> str:
        """A key that is the same for every attempt of this call and different for every other call."""
        return f"{self.workflow_id}:{self.call_id}"


_current: contextvars.ContextVar[ToolCallContext | None] = contextvars.ContextVar(
    "durable_codemode_tool_call", default=None
)


def current_call() -> ToolCallContext:
    """The call the current tool is serving.

    Raises:
        RuntimeError: outside a tool activity run by durable-codemode (e.g. a tool called directly in a
            unit test); use `durable_codemode.testing.tool_call_context(...)` to provide one there.

    """
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(
            "current_call() is only available inside a tool run by durable-codemode; in a unit test, wrap "
            "the call in `durable_codemode.testing.tool_call_context(...)`."
        )
    return ctx


@contextmanager
def bind_call(ctx: ToolCallContext) -> Iterator[ToolCallContext]:
    """Make `ctx` what `current_call()` returns for the duration of the block."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
