"""How a tool's exception becomes an activity failure: decided here, in one place, for single and batched calls.

Transient failures (`TransientToolError`, `ConnectionError`, and a sub-agent's model error the run's own model
requests would retry) are retried within the tool's retry policy; every other exception is final, and keeps its
type's name, so the program sees a `KeyError` as a `KeyError` whether the call ran as its own activity or inside a
batch (`_batch`).
"""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_ai import ModelRetry
from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError
from temporalio.exceptions import ApplicationError

from .._errors import TransientToolError

__all__ = ["TRANSIENT", "message_of", "tool_failure"]

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
