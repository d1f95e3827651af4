"""What a tool's own model use adds to its run's usage: a sub-agent run with pydantic-ai's `usage=ctx.usage`.

A tool that delegates to another agent (`await other.run(..., usage=ctx.usage)`, pydantic-ai's convention) counts
that agent's requests, tokens and tool calls into its `RunContext.usage`. The tool activity gives each call a
`ctx.usage` of its own, starting from zero, and what the tool added to it comes back with the result: the
workflow adds it to the run's usage, where the run's `UsageLimits` count it, as `agent.run()` counts it (in the
run's next check: before its next model request or tool call, and after its next response).

The usual result costs nothing more in history: a call that added no usage returns its bare value, as every result
recorded before this did; only a call that added some returns the envelope `{USAGE_KEY: <usage>, "value": <result>}`.
Whether a run counts a call's usage is therefore decided by what its history recorded, so replays count the same.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.usage import RunUsage
from pydantic_core import to_jsonable_python

__all__ = ["USAGE_KEY", "split_usage", "with_usage"]

USAGE_KEY = "durable_codemode.tool_usage"
"""The key of a tool result's envelope that carries the usage the call added; written into histories (pinned by
tests/test_compat.py)."""

_USAGE = TypeAdapter(RunUsage)


def with_usage(value: Any, usage: RunUsage | None) -> Any:
    """The activity's result: `value` itself, or its envelope with `usage` when the call added some."""
    if usage is None or not usage.has_values():
        return value
    recorded = {k: v for k, v in to_jsonable_python(usage).items() if v}  # only what it added
    return {USAGE_KEY: recorded, "value": value}


def split_usage(result: Any) -> tuple[Any, RunUsage | None]:
    """A tool activity's recorded result as (the tool's value, the usage the call added or `None`)."""
    if isinstance(result, dict) and len(result) == 2 and USAGE_KEY in result and "value" in result:
        return result["value"], _USAGE.validate_python(result[USAGE_KEY])
    return result, None
