"""The library's exceptions.

```
CodeModeError
├── CodeModeUserError        the library was used wrongly (bad configuration, unknown agent); fix the code
├── AgentNotFoundError       a run names an agent this worker does not serve
└── TransientToolError       raised by a tool: retry me within the tool's retry policy
```
A tool's own exceptions are not wrapped: they reach the model's program as exceptions it can catch.
"""

from __future__ import annotations

__all__ = ["AgentNotFoundError", "CodeModeError", "CodeModeUserError", "TransientToolError"]


class CodeModeError(Exception):
    """Base class of every exception durable-codemode raises itself."""


class CodeModeUserError(CodeModeError):
    """durable-codemode was configured or called wrongly; the message says what to change."""


class AgentNotFoundError(CodeModeUserError):
    """A run names an agent that the worker (or the command) does not know."""

    def __init__(self, name: str, known: list[str]) -> None:
        listed = ", ".join(repr(k) for k in sorted(known)) or "none"
        super().__init__(
            f"no agent named {name!r} is served here (known agents: {listed}); pass the agent to "
            "`create_worker(...)` or start the worker that serves it"
        )
        self.name = name
        self.known = known


class TransientToolError(CodeModeError):
    """Raise from a tool when the failure may go away if the call is tried again (a flaky backend).

    The call is retried within the tool's retry policy; other exceptions are not retried and reach the
    program as exceptions it can catch.
    """
