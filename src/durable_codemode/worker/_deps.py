"""A run's deps on the worker: whether what a run records can be rebuilt, and what its tool calls get.

A run records its deps in its history, so they must be data; `CodeModeAgent` checks them when a run starts and
names what is wrong (a field holding a live resource, a value of the wrong type, a factory's failure).
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import PydanticSchemaGenerationError, TypeAdapter

from ..shared._errors import TransientToolError
from ..shared._results import clip

__all__ = [
    "TRANSIENT_DEPS_ERRORS",
    "CallDeps",
    "callable_name",
    "not_data_message",
    "not_deps_type",
    "qualified_name",
    "type_adapter",
    "type_label",
]


@functools.cache
def type_adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def not_data_message(agent: str, kind: Any, error: Exception) -> str:
    """Why `kind` (a deps type) cannot be rebuilt from what a run records, naming the fields that are not data."""
    try:
        hints = typing.get_type_hints(kind)
    except Exception:  # an unresolvable annotation: name no field
        hints = {}
    bad: dict[str, str] = {}
    for field_name, hint in hints.items():
        try:
            type_adapter(hint)
        except PydanticSchemaGenerationError:
            bad[field_name] = getattr(hint, "__qualname__", str(hint))
    cause = str(error).splitlines()[0]
    name = getattr(kind, "__qualname__", str(kind))
    if not bad:
        what = "it holds something that is not data"
        way = "a deps_factory that builds its deps on the worker"
    else:
        what = (f"its field{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} "
                f"hold{'s' if len(bad) == 1 else ''} a live resource, not data")
        built = ", ".join(f"{n}=run[{n!r}]" if n not in bad else f"{n}=<the worker's {bad[n]}>" for n in hints)
        way = f"a deps_factory that builds them on the worker, CodeModeAgent(agent, deps_factory=lambda run: " \
              f"{getattr(kind, '__name__', name)}({built}))"
    return (f"the deps of agent {agent!r} ({name}) cannot be rebuilt from what a run records: {what} ({cause}). A "
            f"run records its deps in its history, so only ids and settings; give the agent {way}, with the "
            "connections and clients the worker holds (docs/agents.md#deps-that-hold-connections)")


def qualified_name(kind: Any) -> str | None:
    """`module.QualName` of a class (what `start_run` records of a deps value), `None` for other types."""
    if not isinstance(kind, type):
        return None
    return f"{kind.__module__}.{kind.__qualname__}"


TRANSIENT_DEPS_ERRORS: tuple[type[BaseException], ...] = (TransientToolError, ConnectionError)
"""A `deps_factory`'s exceptions that are retried with the activity (the same ones a tool's are, `_failures`)."""


def callable_name(function: Any) -> str:
    """`module.qualname` of a function (a lambda's is `module.<lambda>`), else its repr, for messages."""
    qualname = getattr(function, "__qualname__", None)
    if qualname is None:
        return clip(repr(function), 80)
    module = getattr(function, "__module__", None)
    return f"{module}.{qualname}" if module else str(qualname)


def type_label(kind: Any) -> str:
    return str(getattr(kind, "__qualname__", None) or kind)


def not_deps_type(value: Any, kind: Any) -> str | None:
    """What `value` is when it is not a `kind` (an agent's `deps_type`), for the message; `None` when it is.

    Checked where `isinstance` can tell: a class, the origin of a generic (`dict[str, int]`), a `TypedDict` (a
    dict). Other annotations (a union, a protocol) are not checked.
    """
    if kind is type(None) or kind is Any:
        return None
    runtime = dict if typing.is_typeddict(kind) else typing.get_origin(kind) or kind
    if not isinstance(runtime, type) or isinstance(value, runtime):
        return None
    return f"a {type(value).__qualname__}, not a {type_label(kind)} (the agent's deps_type)"


@dataclass(frozen=True)
class CallDeps:
    """A run's deps as its tool calls get them (`CodeModeAgent.deps_for_calls`)."""

    value: Any
    """`ctx.deps`."""
    own: bool
    """The run has deps of its own (given, or built by a factory): its tools are read with them (`prepare`)."""
