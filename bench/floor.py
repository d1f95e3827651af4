"""The floor: a bare Temporal workflow making the same round trips as a code-mode run, and nothing else.

`FloorWorkflow` is what a hand-written Temporal workflow would do for the benchmark's task, with no sandbox,
no model messages and no bookkeeping:

1. one local activity `bench.floor_describe` (the code-mode run's `describe_agent` local activity);
2. one activity `bench.floor_model` (the code-mode run's first model request);
3. N activities `bench.floor_get(i)` -> `i`, either all started at once and awaited with `asyncio.gather`
   (`gather`) or one after another (`sequential`); same start-to-close timeout (30 s) and retry policy as a
   code-mode tool's defaults, default activity ids, no summary;
4. one activity `bench.floor_model` (the code-mode run's second model request, which gives the final text);
5. returns `sum(results)`.

The activities are trivial `async def`s; their inputs and results are a bare int (the tool's own argument and
result), so the history of this workflow is Temporal's own cost of the same work.

Workflows must live in an importable module (a workflow class in `__main__` fails sandbox validation), hence
this file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

__all__ = ["FLOOR_ACTIVITIES", "FloorInput", "FloorWorkflow", "floor_describe", "floor_get", "floor_model"]

#: The same values as `durable_codemode.shared._config.DEFAULT_TOOL_RETRY_POLICY`, so both histories carry one policy.
_TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
_TOOL_TIMEOUT = timedelta(seconds=30)
_MODEL_TIMEOUT = timedelta(minutes=5)
_DESCRIBE_TIMEOUT = timedelta(seconds=30)
_DESCRIBE_RETRY = RetryPolicy(maximum_attempts=3)
_MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30),
                           maximum_attempts=5)


@dataclass(kw_only=True)
class FloorInput:
    """What the floor workflow does: N calls, gathered or sequential."""

    n: int
    mode: Literal["gather", "sequential"]


@activity.defn(name="bench.floor_describe")
async def floor_describe(name: str) -> str:
    """Stands in for `describe_agent` (a local activity)."""
    return name


@activity.defn(name="bench.floor_model")
async def floor_model(turn: int) -> int:
    """Stands in for one model request."""
    return turn


@activity.defn(name="bench.floor_get")
async def floor_get(i: int) -> int:
    """The trivial tool: returns its argument."""
    return i


FLOOR_ACTIVITIES: list[Callable[..., Any]] = [floor_describe, floor_model, floor_get]


@workflow.defn(name="bench.floor")
class FloorWorkflow:
    """1 local activity, 1 model activity, N tool activities, 1 model activity."""

    @workflow.run
    async def run(self, input: FloorInput) -> int:
        await workflow.execute_local_activity(floor_describe, "floor",
                                              start_to_close_timeout=_DESCRIBE_TIMEOUT,
                                              retry_policy=_DESCRIBE_RETRY)
        await workflow.execute_activity(floor_model, 0, start_to_close_timeout=_MODEL_TIMEOUT,
                                        retry_policy=_MODEL_RETRY)
        if input.mode == "gather":
            results = await asyncio.gather(*(
                workflow.execute_activity(floor_get, i, start_to_close_timeout=_TOOL_TIMEOUT,
                                          retry_policy=_TOOL_RETRY)
                for i in range(input.n)
            ))
            total = sum(results)
        else:
            total = 0
            for i in range(input.n):
                total += await workflow.execute_activity(floor_get, i, start_to_close_timeout=_TOOL_TIMEOUT,
                                                         retry_policy=_TOOL_RETRY)
        await workflow.execute_activity(floor_model, 1, start_to_close_timeout=_MODEL_TIMEOUT,
                                        retry_policy=_MODEL_RETRY)
        return total
