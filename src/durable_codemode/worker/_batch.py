"""The batch activity's body: the calls of one batched tool, run at once, each settled on its own.

A batch (`ToolOptions(batch=True)`, grouped in workflow code by `workflow/_batch`) is one activity attempt that
runs every call it was given concurrently and returns one `BatchOutcome` per call. Each call runs as the tool's
own activity would have:

- it sees its own `current_call()` (call id, idempotency key), its own `RunContext.tool_call_id`;
- one try gets the tool's `timeout`; transient failures (`_failures.TRANSIENT`, a timed-out try) are retried with
  the tool's `retry_policy` (its backoff and `maximum_attempts`) *inside* the batch, so a flaky call never makes
  the batch run the others again; any other exception is final for that call alone, with its type's name;
- a result over the limit for one tool result fails that call, as it would alone.

Every call that settles is heartbeated at once (all the outcomes so far, as the details; calls settling in the
same turn of the event loop share a beat), and the attempt also beats on a timer while calls run. A retried
attempt (its worker was killed, or it timed out) reads the last details and runs only the calls that had not
settled: a call done before the kill (and heartbeated) is never run again.

Without a payload store, the results of one batch share the payload budget of one tool result (1 MiB by
default): a call whose result does not fit is `deferred` and the workflow runs it again as its own activity.
Batched tools are read-only by contract, so running a read twice is harmless.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.usage import RunUsage
from pydantic_core import to_json
from temporalio import activity
from temporalio.exceptions import ApplicationError

from ..shared._activity_io import BatchedCall, BatchInput, BatchOutcome, BatchResult
from ._agent import CodeModeAgent
from ._context import ToolCallContext, bind_call
from ._deps import CallDeps
from ._failures import message_of, tool_failure
from ._heartbeat import heartbeating
from ._tool_calls import call_tool

__all__ = ["run_batch"]

_OUTCOMES = TypeAdapter(list[BatchOutcome])


def _earlier_outcomes(details: Any) -> dict[str, BatchOutcome]:
    """The outcomes an earlier attempt heartbeated (its last details), by call id; `{}` on a first attempt."""
    if not details:
        return {}
    try:
        return {o.call_id: o for o in _OUTCOMES.validate_python(details[0])}
    except ValidationError:  # details of another shape: run every call again (read-only tools)
        return {}


async def _one_try(agent: CodeModeAgent, input: BatchInput, deps: CallDeps, call: BatchedCall, attempt: int,
                   usage: RunUsage) -> Any:
    ctx = ToolCallContext(workflow_id=activity.info().workflow_id or "", call_id=call.call_id, tool=input.tool,
                          attempt=attempt)
    with bind_call(ctx):
        return await call_tool(agent, input.tool, call.args, call_id=call.call_id, attempt=attempt, deps=deps,
                                     recorded_schema=input.schema_digest, usage=usage)


async def _settle(agent: CodeModeAgent, input: BatchInput, deps: CallDeps, call: BatchedCall,
                  first_attempt: int) -> BatchOutcome:
    """One call, tried as the tool's retry policy says; its outcome (never raises a tool's error)."""
    policy = input.retry_policy
    tries = max(policy.maximum_attempts, 1)
    interval = policy.initial_interval.total_seconds()
    ceiling = (policy.maximum_interval or timedelta(seconds=interval * 100)).total_seconds()
    final: BatchOutcome | None = None
    for n in range(tries):
        try:
            usage = RunUsage()  # the try's `ctx.usage`: what a sub-agent run adds is counted in the run
            async with asyncio.timeout(input.timeout.total_seconds()) as deadline:
                value = await _one_try(agent, input, deps, call, first_attempt + n, usage)
            return BatchOutcome(call_id=call.call_id, kind="ok", value=value,
                                usage=usage if usage.has_values() else None)
        except TimeoutError as e:
            if not deadline.expired():  # the tool's own TimeoutError: final, as any other exception
                return BatchOutcome(call_id=call.call_id, kind="error", error_type="TimeoutError",
                                    message=message_of(e))
            final = BatchOutcome(call_id=call.call_id, kind="error", error_type="TimeoutError",
                                 message=f"{input.tool}() timed out, and retries did not help")
        except Exception as e:
            failure = tool_failure(input.tool, e)
            outcome = BatchOutcome(call_id=call.call_id, kind="error", error_type=failure.type,
                                   message=failure.message)
            if failure.non_retryable or failure.type in (policy.non_retryable_error_types or ()):
                return outcome
            final = outcome
        if n + 1 < tries:
            await asyncio.sleep(interval)
            interval = min(interval * policy.backoff_coefficient, ceiling)
    assert final is not None
    return final


async def run_batch(agent: CodeModeAgent, input: BatchInput, *, check_result: Callable[[Any], int],
                    result_budget: int | None) -> BatchResult:
    """Run the calls of `input` not settled by an earlier attempt; one outcome per call, in input order.

    `check_result` gives a result's JSON size and raises (an `ApplicationError`) when one result is over the
    limit; `result_budget` bounds the results the batch returns together (`None`: a payload store carries any).
    """
    info = activity.info()
    done = _earlier_outcomes(info.heartbeat_details)
    try:
        deps = await agent.deps_for_calls(input.deps)  # once for every call of the batch
    except Exception as e:  # the whole attempt fails: retried when transient, else each call gets the error
        raise tool_failure(input.tool, e) from e
    used = sum(len(to_json(o.value)) for o in done.values() if o.kind == "ok")

    beat_scheduled = False

    def beat() -> None:
        nonlocal beat_scheduled
        beat_scheduled = False
        activity.heartbeat(list(done.values()))

    def beat_soon() -> None:
        # Calls that settle in the same turn of the event loop share one beat (a gather of 200 trivial reads
        # would otherwise encode 200 growing lists).
        nonlocal beat_scheduled
        if not beat_scheduled:
            beat_scheduled = True
            asyncio.get_running_loop().call_soon(beat)

    async def one(call: BatchedCall) -> None:
        nonlocal used
        outcome = await _settle(agent, input, deps, call, info.attempt)
        if outcome.kind == "ok":
            try:
                size = check_result(outcome.value)
            except ApplicationError as e:
                outcome = BatchOutcome(call_id=call.call_id, kind="error", error_type=e.type, message=e.message)
            else:
                if result_budget is not None and used + size > result_budget:
                    outcome = BatchOutcome(call_id=call.call_id, kind="deferred")
                else:
                    used += size
        done[call.call_id] = outcome
        beat_soon()

    # Also on a timer while calls run (`heartbeating`), each beat with every outcome so far.
    await heartbeating(asyncio.gather(*(one(c) for c in input.calls if c.call_id not in done)),
                       details=lambda: [list(done.values())])
    return BatchResult(outcomes=[done[c.call_id] for c in input.calls])
