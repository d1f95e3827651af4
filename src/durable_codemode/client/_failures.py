"""A durable run's failure raised as `agent.run()` raises it: pydantic-ai's own exception, with the run's id.

A run that fails reaches its client as temporalio's `WorkflowFailureError`, whose cause is an `ApplicationError`
carrying the failure's type by name (`UsageLimitExceeded`, `UnexpectedModelBehavior`, `ModelHTTPError`, ...), the
model request's behind an `ActivityError`. Code ported from `agent.run()` catches pydantic-ai's types, so
`run_agent` and `run_result` raise the failure as an exception that is both pydantic-ai's type and
`RunFailedError` (whose `run_id` names the run), built from what the run recorded. A failure pydantic-ai has no
type for (a worker's `CodeModeUserError`, a sandbox limit, a cancelled run) is raised as `RunWorkflowFailedError`:
still temporalio's `WorkflowFailureError` with the same `cause`, so code written for temporalio keeps working, but
its message is the worker's own words ("run 'x' failed: agent 'x' has tools whose calls need approval, ... give
create_worker(...)"), not temporalio's "Workflow execution failed", which told whoever started the run nothing.
"""

from __future__ import annotations

import re
from typing import Any

import pydantic_ai.exceptions as pydantic_ai_exceptions
from pydantic_ai.exceptions import AgentRunError, ModelAPIError, ModelHTTPError, UserError
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from .._outcome import run_failure_reason
from ..shared._errors import RunFailedError

__all__ = ["RunWorkflowFailedError", "agent_run_error", "run_failure"]

_HTTP_MESSAGE = re.compile(r"status_code: (\d+), model_name: (.*?), body: (.*)", re.DOTALL)
"""How pydantic-ai writes a `ModelHTTPError` (`str(e)`), which is what the model activity records."""


def _pydantic_ai_type(name: str) -> type[Exception] | None:
    """pydantic-ai's exception class called `name`, if a run can fail with it (an `AgentRunError`, a `UserError`)."""
    found = getattr(pydantic_ai_exceptions, name, None)
    if isinstance(found, type) and issubclass(found, (AgentRunError, UserError)):
        return found
    return None


_DURABLE: dict[str, type[Exception]] = {}
"""The classes `_durable` made, by pydantic-ai class name."""


def _durable(kind: type[Exception]) -> type[Exception]:
    """`kind` and `RunFailedError` in one class (made once per kind), named as pydantic-ai names `kind`."""
    made = _DURABLE.get(kind.__qualname__)
    if made is None or not issubclass(made, kind):
        doc = (f"pydantic-ai's `{kind.__name__}` raised by a durable run (`run_agent`, `run_result`): also a "
               "`RunFailedError`, whose `run_id` names the run.")
        made = _DURABLE[kind.__qualname__] = type(kind.__name__, (kind, RunFailedError),
                                                  {"__module__": RunFailedError.__module__, "__doc__": doc})
    return made


def _built(kind: type[Exception], message: str, details: tuple[Any, ...]) -> Exception | None:
    """An instance of `_durable(kind)` for the recorded `message`, or `None` when it cannot be rebuilt."""
    cls = _durable(kind)
    try:
        if issubclass(kind, ModelHTTPError):
            matched = _HTTP_MESSAGE.fullmatch(message)
            if matched is None:
                return None
            return cls(int(matched[1]), matched[2], matched[3])
        if issubclass(kind, ModelAPIError):
            model_name = str(details[0]) if details else "?"
            return cls(model_name, message)
        return cls(message)
    except TypeError:  # a class whose arguments a recorded failure cannot give
        return None


def agent_run_error(error: WorkflowFailureError, run_id: str) -> Exception | None:
    """The exception `agent.run()` would have raised for the failure of run `run_id`, or `None` (no such type).

    It is both pydantic-ai's type (`UsageLimitExceeded`, `UnexpectedModelBehavior`, `ModelHTTPError` with its
    `status_code`, `model_name` and `body`, `UserError`, ...) and `RunFailedError` (`run_id`, `error_type`,
    `message`), with the same message as the run's failure.
    """
    cause: BaseException | None = error.cause
    while isinstance(cause, (ActivityError, ChildWorkflowError)) and cause.cause is not None:
        cause = cause.cause  # a model request's failure, behind its activity's
    if not isinstance(cause, ApplicationError) or not cause.type:
        return None
    kind = _pydantic_ai_type(cause.type)
    if kind is None:
        return None
    built = _built(kind, cause.message, tuple(cause.details))
    if built is None:
        return None
    assert isinstance(built, RunFailedError)
    built.run_id = run_id
    built.error_type = cause.type
    built.message = cause.message
    built.add_note(f"raised by durable run {run_id!r} (`codemode trace {run_id}` shows it)")
    return built


class RunWorkflowFailedError(WorkflowFailureError, RunFailedError):
    """A durable run's failure that pydantic-ai has no exception for, saying why in its message.

    Both temporalio's `WorkflowFailureError` (its `cause` is the workflow's failure, as temporalio raised it) and
    `RunFailedError` (`run_id`, `error_type`: the innermost failure's type, e.g. `CodeModeUserError`, and `message`,
    the worker's words). `str()` is `run '<id>' failed: <why>`: the reason a worker logged reaches whoever started
    the run.
    """

    def __init__(self, error: WorkflowFailureError, run_id: str) -> None:
        reason = run_failure_reason(error)
        # Neither base's __init__ fits (temporalio's fixes the message, ours wants the type): set both by hand.
        Exception.__init__(self, f"run {run_id!r} failed: {reason}")
        self.__cause__ = error.cause
        self.run_id = run_id
        self.error_type = _innermost_type(error)
        self.message = reason


def _innermost_type(error: BaseException) -> str:
    """The type of the failure at the bottom of `error`'s causes: the `ApplicationError`'s recorded type if any."""
    current: BaseException | None = error
    found = type(error).__name__
    seen: list[BaseException] = []
    while current is not None and current not in seen:
        seen.append(current)
        found = current.type if isinstance(current, ApplicationError) and current.type else type(current).__name__
        current = getattr(current, "cause", None) or current.__cause__
    return found


def run_failure(error: WorkflowFailureError, run_id: str) -> Exception:
    """What a client raises for run `run_id`'s failure: pydantic-ai's exception when it has one, else ours.

    `agent_run_error`'s exception where pydantic-ai has a type for the failure; else a `RunWorkflowFailedError`,
    whose message says why the run failed. Raise it `from error.cause`, so `.cause` stays temporalio's.
    """
    return agent_run_error(error, run_id) or RunWorkflowFailedError(error, run_id)
