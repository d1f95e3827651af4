"""Model strings that cannot work, caught where they can be: the provider's name at start, its key on the worker.

A missing API key or an unknown model name is a configuration error, not a transient failure: it ends the run at
once with the one thing to change, never an activity retried with back-off. pydantic-ai resolves a model string
(`infer_model`) by building its provider, and the provider reads its key from the environment, so:

- `start_run(model=...)` checks only that pydantic-ai knows the model's provider (`unknown_model`): the client
  process need not hold any key, and a typo starts no run;
- the worker checks the rest (`build_model`), where the key must be: `create_worker` for an agent whose model is a
  string (`Agent(..., defer_model_check=True)`; pydantic-ai checks the others when the agent is built), and a
  run's first step for the run's model, so the run fails before its first model request;
- the model-request activity raises the same error, not retried, if the key is gone by then (a run continued on
  a worker without it).

Errors other than pydantic-ai's `UserError` and a missing provider package pass through unchanged, retried as
before: they may be transient.
"""

from __future__ import annotations

import re

from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model, infer_model, parse_model_id
from pydantic_ai.providers import infer_provider_class

from .shared._errors import CodeModeUserError

__all__ = ["build_model", "unknown_model"]

_KEY_VARIABLE = re.compile(r"Set the `([A-Z][A-Z0-9_]*)` environment variable")
"""How pydantic-ai's providers name the variable a missing key (or base URL) is read from; pinned in
tests/test_compat.py, and a message it does not match is passed on whole."""

_EXAMPLES = "a 'provider:model' string such as 'openai:gpt-5' or 'anthropic:claude-sonnet-4-5'"


def unknown_model(model: str) -> str | None:
    """Why pydantic-ai does not know `model` (no such provider), or `None`; builds no provider, reads no key.

    The reason leaves out the model string itself (`"pydantic-ai does not know it (...): give ..."`): callers name it.

    An unknown name under a known provider (`openai:no-such-model`) passes: only the provider's API can tell.
    """
    provider, _ = parse_model_id(model)
    if model == "test" or (provider is not None and _known_provider(provider)):
        return None
    try:  # for pydantic-ai's own message ("Did you mean ...?"): it fails before building a provider
        infer_model(model)
    except UserError as e:
        return f"pydantic-ai does not know it ({e}): give {_EXAMPLES}"
    return None  # pragma: no cover - pydantic-ai knew it after all


def _known_provider(provider: str) -> bool:
    try:
        infer_provider_class(provider)
    except ValueError:
        return False
    except ImportError:  # known, but its package is not installed here: the workers may have it
        return True
    return True


def build_model(model: str, *, subject: str, whose: str, otherwise: str) -> Model:
    """`infer_model(model)`, its configuration errors raised as one `CodeModeUserError` that names what to do.

    Args:
        model: a pydantic-ai model string.
        subject: who wants the model, for the message (`"agent 'cart'"`).
        whose: which of its models this is, for the message (`"its model"`, `"the run's model"`).
        otherwise: the fix besides setting the variable, for the message (`"start the run with another model"`).

    Raises:
        CodeModeUserError: the provider's key (or other required variable) is not set in this process's
            environment, pydantic-ai does not know the model, or the provider's package is not installed.

    """
    try:
        return infer_model(model)
    except UserError as e:
        found = _KEY_VARIABLE.search(str(e))
        if found:
            variable = found.group(1)
            raise CodeModeUserError(
                f"{subject} cannot use {whose} {model!r}: {variable} is not set in this worker's environment. Set "
                f"{variable} where the worker runs (every worker of the task queue needs it), or {otherwise}"
            ) from e
        problem = unknown_model(model)
        raise CodeModeUserError(f"{subject} cannot use {whose} {model!r}: {problem or e}"
                                + ("" if problem else f"; or {otherwise}")) from e
    except ImportError as e:
        raise CodeModeUserError(
            f"{subject} cannot use {whose} {model!r}: its provider's package is not installed on this worker ({e}); "
            f"install it where the worker runs, or {otherwise}"
        ) from e
