"""The floor of the long-run benchmark: a bare workflow doing the same batches, continuing as new as often.

`LongFloorWorkflow` runs `batches` batches of `size` gathered `bench.floor_get` activities (from `bench.floor`),
each after one `bench.floor_model` activity (the model turn that wrote the code-mode run's snippet), plus one for
the final answer, continuing as new after every `per_run` batches and carrying the running total: what a
hand-written Temporal workflow would do for the long-run task. `BigFloorWorkflow` makes one activity return
`size` bytes, the floor of the large-payload row.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow

from bench.floor import floor_get, floor_model

__all__ = ["BigFloorWorkflow", "LongFloorInput", "LongFloorWorkflow", "floor_big"]

_TIMEOUT = timedelta(seconds=60)


@dataclass(kw_only=True)
class LongFloorInput:
    """`batches` batches of `size` calls, `per_run` batches per workflow run; `done`/`total` carry the state."""

    batches: int
    size: int
    per_run: int
    done: int = 0
    total: int = 0


@workflow.defn(name="bench.long_floor")
class LongFloorWorkflow:
    """Batches of gathered activities, continue-as-new every `per_run` batches."""

    @workflow.run
    async def run(self, input: LongFloorInput) -> int:
        total, done = input.total, input.done
        for _ in range(input.per_run):
            if done == input.batches:
                await workflow.execute_activity(floor_model, done, start_to_close_timeout=_TIMEOUT)
                return total
            await workflow.execute_activity(floor_model, done, start_to_close_timeout=_TIMEOUT)
            results = await asyncio.gather(*(
                workflow.execute_activity(floor_get, i, start_to_close_timeout=_TIMEOUT) for i in range(input.size)
            ))
            total += sum(results)
            done += 1
        workflow.continue_as_new(LongFloorInput(batches=input.batches, size=input.size, per_run=input.per_run,
                                                done=done, total=total))


@activity.defn(name="bench.floor_big")
async def floor_big(size: int) -> str:
    """A result of `size` characters."""
    return "x" * size


@workflow.defn(name="bench.big_floor")
class BigFloorWorkflow:
    """One activity whose result is `size` bytes; returns its length."""

    @workflow.run
    async def run(self, size: int) -> int:
        return len(await workflow.execute_activity(floor_big, size, start_to_close_timeout=_TIMEOUT))
