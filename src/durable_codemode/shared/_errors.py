"""The library's exceptions.

```
CodeModeError
├── CodeModeUserError        the library was used wrongly (bad configuration, unknown agent); fix the code
│   ├── DepsFactoryError     an agent's deps_factory failed for good, or built another type than its deps_type
│   └── OutputChangedError   a deploy changed an agent's output, and it rejects an answer made for a run's recorded one
├── AgentNotFoundError       a run names an agent this worker does not serve
├── InvalidRunInputError     a run's prompt or message history is unusable (also a ValueError); nothing started
├── GuardrailError           a capability's before_run hook stopped a run at its start (the hook's error is the cause)
├── RunNotFoundError         no run with that id on the server
├── RunClosedError           a decision sent to a run that has ended (it says how it ended)
├── DecisionConflictError    the run answered a decision with another decision's record: this one was not recorded
├── WorkerUnavailableError   no worker answered for a run in time (a query or a decision): none polls its queue
│   └── WorkerBusyError      ... though one polls it: it was busy (all its workflow task slots taken)
└── TransientToolError       raised by a tool: retry me within the tool's retry policy
```
A tool's own exceptions are not wrapped: they reach the model's program as exceptions it can catch.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = [
    "AgentNotFoundError",
    "CodeModeError",
    "CodeModeUserError",
    "DecisionConflictError",
    "DepsFactoryError",
    "GuardrailError",
    "InvalidRunInputError",
    "OutputChangedError",
    "RunClosedError",
    "RunFailedError",
    "RunNotFoundError",
    "TransientToolError",
    "UnsupportedBehaviorVersionError",
    "WorkerBusyError",
    "WorkerUnavailableError",
]


class CodeModeError(Exception):
    """Base class of every exception durable-codemode raises itself."""


class CodeModeUserError(CodeModeError):
    """durable-codemode was configured or called wrongly; the message says what to change."""


class DepsFactoryError(CodeModeUserError):
    """An agent's `deps_factory` raised a final error, or returned another type than the agent's `deps_type`.

    The message names the agent, the factory and (for a wrong type) both types. Not retried: the same deps would
    fail the same way. A factory's transient error (`ConnectionError`, `TransientToolError`) is retried instead.
    """


class OutputChangedError(CodeModeUserError):
    """A deploy changed an agent's output since a run started, and the new output rejects the run's answer.

    The run offers its model the output it recorded (`AgentSpec.output`), so the model answers in that shape; the
    worker checks answers with the agent's output as it is now. When the two differ and the answer does not pass,
    asking the model again cannot help: the run fails with this error (its type is the run's failure type), naming
    both outputs. Finish such runs on a worker version whose agent has the recorded output (a pinned deploy,
    docs/operations.md), or start them again on the new one. `codemode check-deploy` reports the change first.
    """

    def __init__(self, agent: str, recorded: str, current: str, rejection: str) -> None:
        super().__init__(
            f"the output of agent {agent!r} changed since this run started: the run offers its model the output it "
            f"recorded ({recorded}), and this worker's agent now has {current}, which rejects the answer "
            f"({rejection}). "
            "Asking the model again cannot help; finish such runs on a worker version whose agent has the recorded "
            "output (a pinned deploy: docs/operations.md#deploying-new-code-while-runs-wait), or start them again")
        self.agent = agent


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


class GuardrailError(CodeModeError):
    """A capability's `before_run` hook raised at the start of a run.

    The run ends there, before any model request or tool call, with the hook's message (not retried).
    """


class RunFailedError(CodeModeError):
    """A durable run's failure, rebuilt from what the run recorded: its type's name and its message.

    - Its `on_run_error` hooks get it when pydantic-ai has no exception type for the failure (a model request's
      final error, a limit of the sandbox, a tool's retries run out); a usage limit, the output retries and a
      `UserError` reach them as pydantic-ai's own `UsageLimitExceeded`, `UnexpectedModelBehavior` and `UserError`.
    - `run_agent` and `run_result` raise a failure pydantic-ai has a type for (`UsageLimitExceeded`,
      `UnexpectedModelBehavior`, `ModelHTTPError`, `UserError`, ...) as an exception of both that type and this
      one, with `run_id` set, so `except UsageLimitExceeded` written for `agent.run()` catches it.

    The failure was recorded in workflow code, perhaps on another worker, so what is rebuilt is its type's name
    (`error_type`, e.g. `ModelHTTPError`) and its message.
    """

    run_id: str | None = None
    """The durable run that failed (its workflow id); `None` for the hooks' copy, raised inside that run."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message


class InvalidRunInputError(CodeModeUserError, ValueError):
    """A run's input was refused before anything started: an empty prompt, a malformed message history."""


class RunNotFoundError(CodeModeUserError):
    """No run with that id on the server."""

    def __init__(self, workflow_id: str, address: str) -> None:
        super().__init__(f"no run with id {workflow_id!r} on the Temporal server at {address}: check the id "
                         "(`codemode runs` lists recent runs) and TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE")
        self.workflow_id = workflow_id


class RunClosedError(CodeModeUserError):
    """A decision (or another update) was sent to a run that has ended; nothing was recorded.

    `status` is how it ended (`completed`, `failed`, `terminated`, `cancelled`, `timed out`), `closed_at` when;
    `during`: it closed while the decision was being taken (Temporal aborted the update), so whether it was recorded
    first is for its audit trail to say.
    """

    def __init__(self, workflow_id: str, status: str, closed_at: datetime | None, *, during: bool = False) -> None:
        when = f" at {closed_at:%Y-%m-%d %H:%M:%S %Z}".rstrip() if closed_at else ""
        how = {"terminated": "was terminated", "cancelled": "was cancelled"}.get(status, status)
        if during:
            message = (f"run {workflow_id!r} closed while this decision was being taken: it {how}{when}; whether the "
                       f"decision was recorded first, `codemode audit {workflow_id}` shows")
        else:
            message = (f"run {workflow_id!r} is closed: it {how}{when}, so it takes no decision (`codemode audit "
                       f"{workflow_id}` shows the decisions it recorded; `codemode trace {workflow_id}` the run)")
        super().__init__(message)
        self.workflow_id = workflow_id
        self.status = status
        self.closed_at = closed_at


class DecisionConflictError(CodeModeError):
    """The run answered a decision with the record of another one, so this decision was not recorded.

    Temporal returns an update id's first outcome to every later update under that id: a decision sent again
    with a different verdict or note gets the first one back (a recorded decision stands), and an id taken by
    another update (before update ids were bound to their approver) gets that update's outcome. `record` is what
    the run holds under the id (`None`: not a decision's record at all).
    """

    def __init__(self, message: str, record: Any = None) -> None:
        super().__init__(message)
        self.record = record


class UnsupportedBehaviorVersionError(CodeModeError):
    """A run was recorded by a release whose behaviour this one does not replay (`AgentSpec.behavior_version`).

    Raised in workflow code, it fails the workflow task, never the run: Temporal retries the task, and the run waits
    as it was until a worker of the release named takes it (or someone ends it). A replay (`codemode replay`,
    Temporal's `Replayer`) reports it as the replay's failure.
    """

    def __init__(self, workflow_id: str, version: int, release: str | None, oldest: int, current: int) -> None:
        """`release`: the last release that replays `version` (`None`: the run is newer than this release)."""
        recorded = (f"run {workflow_id!r} was recorded with behaviour version {version}, which "
                    f"{release or 'a newer release of durable-codemode'} replays; this release replays behaviour "
                    f"versions {oldest} to {current}. Nothing was changed and the run waits: ")
        self.requirement = f"durable-codemode=={release.rsplit(' ', 1)[-1]}" if release else None
        """What `pip install` installs `release` with (`None` without one)."""
        if release is None:
            todo = "upgrade the workers of its task queue"
        else:
            todo = (f"finish it with a worker of {release} on its task queue (pip install '{self.requirement}'), or "
                    f"end it (temporal workflow terminate --workflow-id {workflow_id!r}) and start it again")
        super().__init__(recorded + todo + ".")
        self.workflow_id = workflow_id
        self.version = version
        self.release = release


class WorkerUnavailableError(CodeModeUserError):
    """No worker answered for a run in time: queries and decisions need a worker serving the run's task queue.

    Nothing was recorded; send the decision again once a worker runs. The message says which it was, from the
    task queue's pollers as the server lists them: no worker polls the run's task queue (start one), none has
    polled it for a while (they stopped, or hang), or one polls it but did not answer in time (`WorkerBusyError`).
    """

    def __init__(self, message: str, *, task_queue: str | None = None, pollers: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.task_queue = task_queue
        """The run's task queue, when the server said."""
        self.pollers = pollers
        """The identities of the workers that polled it lately (none: no worker serves it)."""


class WorkerBusyError(WorkerUnavailableError):
    """A worker polls the run's task queue, yet none answered in time: busy, or it stopped moments ago.

    Busy: its workflow task slots were all taken, by runs starting or replaying. Nothing was recorded. Ask again,
    allow longer (`timeout=`), or give the workers more workflow task slots; a worker serving many runs waiting
    for people answers within milliseconds once a slot is free.
    """


class TransientToolError(CodeModeError):
    """Raise from a tool when the failure may go away if the call is tried again (a flaky backend).

    The call is retried within the tool's retry policy; other exceptions are not retried and reach the
    program as exceptions it can catch.
    """
