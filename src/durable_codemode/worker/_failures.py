"""How a tool's (or a scripted model's) exception becomes an activity failure: decided here, in one place.

Transient failures (`TransientToolError`, `ConnectionError`, and a sub-agent's model error the run's own model
requests would retry) are retried within the tool's retry policy; every other exception is final, and keeps its
type's name, so the program sees a `KeyError` as a `KeyError` whether the call ran as its own activity or inside a
batch (`_batch`).

A model request is retried as a provider outage would be, except when the model is a pydantic-ai `FunctionModel`
(a scripted model, `durable_codemode.testing.scripted_model`) whose function raised an exception of its own: that is
a bug in the function, which five attempts over fifteen seconds would only hide (`function_model_failure`).
"""

from __future__ import annotations

import traceback
from types import TracebackType

import pydantic_ai.models.function
from pydantic import ValidationError
from pydantic_ai import ModelRetry
from pydantic_ai.exceptions import AgentRunError, ModelAPIError, ModelHTTPError, UserError
from temporalio.exceptions import ApplicationError

from ..shared._errors import CodeModeError, TransientToolError

__all__ = ["TRANSIENT", "function_model_failure", "message_of", "tool_failure"]

TRANSIENT: tuple[type[BaseException], ...] = (TransientToolError, ConnectionError)
"""Tool exceptions that are retried within the tool's retry policy; every other exception is final."""


def message_of(error: BaseException) -> str:
    """The message the tool wrote (`str(KeyError('x'))` is `"'x'"`: show `x`)."""
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        return error.args[0]
    return str(error) or type(error).__name__


def _validation_message(tool: str, error: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in error.errors(include_url=False)
    )
    return f"invalid arguments for {tool}(): {problems}"


def _model_request_may_pass(error: Exception) -> bool:
    """Whether `error` is a model request's (a sub-agent run by the tool) that may pass if made again.

    The same rule as the run's own model requests (`_activities._may_pass`): a dropped connection, a 5xx, a timeout,
    a conflict or a rate limit may pass; another 4xx (a bad key, a bad request) would fail the same way again.
    """
    if isinstance(error, ModelHTTPError):
        return error.status_code >= 500 or error.status_code in (408, 409, 429)
    return isinstance(error, ModelAPIError)


def tool_failure(tool: str, error: Exception) -> ApplicationError:
    """The activity failure for `error` raised by `tool`: retryable only when transient.

    A sub-agent's model error that would be retried as the run's own model request is transient too, so a tool
    that delegates gets the call again within its retry policy (`ToolOptions.retry_policy`).
    """
    if isinstance(error, TRANSIENT) or _model_request_may_pass(error):
        return ApplicationError(message_of(error), type=type(error).__name__)
    if isinstance(error, ValidationError):
        return ApplicationError(_validation_message(tool, error), type="ValueError", non_retryable=True)
    if isinstance(error, ModelRetry):
        return ApplicationError(error.message, type="ModelRetry", non_retryable=True)
    return ApplicationError(message_of(error), type=type(error).__name__, non_retryable=True)


_FUNCTION_MODEL_FILE = pydantic_ai.models.function.__file__
"""Where pydantic-ai's `FunctionModel` calls its function (a frame there means the function was running)."""


def _function_model_frames(tb: TracebackType | None) -> tuple[str, traceback.FrameSummary] | None:
    """The `FunctionModel`'s name and the frame that raised, if the exception came out of a `FunctionModel`'s function.

    Streamed or not; `None` when the exception did not pass through a `FunctionModel`.
    """
    model_name: str | None = None
    frames = traceback.extract_tb(tb)
    walk = tb
    while walk is not None:
        frame = walk.tb_frame
        if frame.f_code.co_filename == _FUNCTION_MODEL_FILE and model_name is None:
            owner = frame.f_locals.get("self")
            name = getattr(owner, "model_name", None)
            if isinstance(name, str):
                model_name = name
        walk = walk.tb_next
    if model_name is None or not frames:
        return None
    return model_name, frames[-1]


def function_model_failure(agent: str, error: BaseException) -> ApplicationError | None:
    """The final failure for a `FunctionModel`'s own bug in a model request of `agent`, or `None` (not one).

    An exception that came out of a `FunctionModel`'s function (it passed through pydantic-ai's `FunctionModel`) and
    is neither pydantic-ai's (`ModelHTTPError` and the like, which scripts raise on purpose to play an outage, are
    retried as usual) nor transient (`ConnectionError`, `TimeoutError`, `TransientToolError`) is a programming error
    in the function: the same request would raise it again. The failure names the model, the exception's type and
    message, and where it was raised, and is not retried.
    """
    if isinstance(error, (ModelAPIError, AgentRunError, UserError, CodeModeError, ModelRetry, *TRANSIENT,
                          TimeoutError)):
        return None
    found = _function_model_frames(error.__traceback__)
    if found is None:
        return None
    model_name, raised_at = found
    where = f"{raised_at.name}() at {raised_at.filename}:{raised_at.lineno}"
    return ApplicationError(
        f"the model function of FunctionModel {model_name!r} (agent {agent!r}) raised {type(error).__name__}: "
        f"{str(error) or '(no message)'}, in {where}: a scripted model's own exception is a bug in its function, so "
        "the request is not retried (raise pydantic-ai's ModelHTTPError to play a provider outage)",
        type=type(error).__name__, non_retryable=True)
