"""The approvals floor: a bare Temporal workflow that waits for a decision by update, then runs the activity.

`ApprovalsFloorWorkflow` is what a hand-written Temporal workflow would do for an approved call, and nothing else:

1. one local activity `bench.floor_describe` (shared with `bench.floor`) (the code-mode run's `describe_agent`);
2. one activity `bench.floor_model` (the code-mode run's first model request);
3. it registers one pending call and waits in `workflow.wait_condition` until the update `decide` (with a
   validator, like code mode's) decides it;
4. one activity `bench.approvals_floor_gated` (the approved tool call: same start-to-close timeout and retry
   policy as a code-mode tool's defaults), which records `time.perf_counter()` when it starts in `STARTS`,
   keyed by workflow id (the benchmark runs the worker in its own process, so the clocks are the same);
5. one activity `bench.floor_model` (the second model request), and returns the gated call's result.

It holds no program state: it is what Temporal itself costs from a decision to the activity starting.

Workflows must live in an importable module (a workflow class in `__main__` fails sandbox validation), hence
this file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

from bench.floor import floor_describe, floor_model

__all__ = [
    "APPROVALS_FLOOR_ACTIVITIES",
    "CALL_ID",
    "STARTS",
    "ApprovalsFloorWorkflow",
    "FloorApprovalInput",
    "approvals_floor_gated",
]

#: The same values as `durable_codemode.shared._config.DEFAULT_TOOL_RETRY_POLICY`.
_TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
_TOOL_TIMEOUT = timedelta(seconds=30)
_MODEL_TIMEOUT = timedelta(minutes=5)
_DESCRIBE_TIMEOUT = timedelta(seconds=30)

CALL_ID = "call_0.0"
"""The one pending call of a floor run (the id the code-mode run gives its first nested call)."""

STARTS: dict[str, float] = {}
"""`time.perf_counter()` when the gated activity started, by workflow id (first attempt wins)."""


@dataclass(kw_only=True)
class FloorApprovalInput:
    """The gated call's argument."""

    tag: str


@activity.defn(name="bench.approvals_floor_gated")
async def approvals_floor_gated(tag: str) -> str:
    """The approved call: records when it started."""
    STARTS.setdefault(activity.info().workflow_id or "", time.perf_counter())
    return f"done {tag}"


APPROVALS_FLOOR_ACTIVITIES: list[Callable[..., Any]] = [floor_describe, floor_model,
                                                        approvals_floor_gated]


@workflow.defn(name="bench.approvals_floor")
class ApprovalsFloorWorkflow:
    """1 local activity, 1 model activity, a wait for the `decide` update, the gated activity, 1 model activity."""

    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._decided: dict[str, bool] = {}

    @workflow.query(name="pending")
    def pending(self) -> list[str]:
        """The calls waiting for a decision."""
        return sorted(self._pending)

    @workflow.update(name="decide")
    def decide(self, call_id: str) -> bool:
        """Approve one waiting call."""
        self._pending.discard(call_id)
        self._decided[call_id] = True
        return True

    @decide.validator
    def _validate(self, call_id: str) -> None:
        if call_id not in self._pending:
            raise ValueError(f"no call {call_id!r} is waiting")

    @workflow.run
    async def run(self, input: FloorApprovalInput) -> str:
        await workflow.execute_local_activity(floor_describe, "floor",
                                              start_to_close_timeout=_DESCRIBE_TIMEOUT,
                                              retry_policy=RetryPolicy(maximum_attempts=3))
        await workflow.execute_activity(floor_model, 0, start_to_close_timeout=_MODEL_TIMEOUT)
        self._pending.add(CALL_ID)
        await workflow.wait_condition(lambda: CALL_ID in self._decided)
        result = await workflow.execute_activity(approvals_floor_gated, input.tag,
                                                 start_to_close_timeout=_TOOL_TIMEOUT, retry_policy=_TOOL_RETRY)
        await workflow.execute_activity(floor_model, 1, start_to_close_timeout=_MODEL_TIMEOUT)
        return result
