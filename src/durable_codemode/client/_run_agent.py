"""`run_agent`: a durable run awaited as `agent.run()` is, its events fed to pydantic-ai's handler."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.messages import ModelMessage
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RunUsage, UsageLimits
from temporalio.client import Client

from ..shared._errors import InvalidRunInputError
from ..shared._names import DEFAULT_TASK_QUEUE
from ..shared._records import RunResult
from ._runs import ServedAgent, run_result, served_agent, start_run
from ._stream import feed_event_stream_handler, stream_events

__all__ = ["run_agent"]


async def run_agent(
    client: Client,
    agent: str | ServedAgent,
    prompt: str,
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    model: str | None = None,
    message_history: Sequence[ModelMessage] | None = (),
    deps: Any = None,
    model_settings: ModelSettings | None = None,
    usage_limits: UsageLimits | None = None,
    usage: RunUsage | None = None,
    run_id: str | None = None,
    instructions: str | None = None,
    output_type: Any = None,
    event_stream_handler: EventStreamHandler[Any] | None = None,
    stream: bool | None = None,
) -> RunResult[Any]:
    """Start an agent run and wait for its result (see `start_run` for the arguments), its output as `output_type`.

    `output_type` defaults to the agent's own when `agent` is the `CodeModeAgent`; with only its name and no
    `output_type`, the output is the JSON the workflow returned (a `BaseModel` output as its dict). For a
    statically typed `RunResult[Answer]`, use `typed_result(await run_agent(...), Answer)`.

    `usage`, as in `agent.run(usage=...)`, is counted into: once the run ends it holds the total (the run's
    `RunResult.usage`, which is then that same object), so one `RunUsage` passed to each run of a conversation
    keeps its running total, and each run's `usage_limits` count the runs before it.

    `event_stream_handler`, as in `agent.run(event_stream_handler=...)`, is called here, in the caller, with the
    run's events as the run publishes them (so the run streams: `stream` is taken as `True`): once per model request
    with its parts and deltas, once per response with its tool calls and what they did, a program's code-mode
    events among them (`durable_codemode.events`). Its `RunContext` carries `deps` and `prompt` as given here and the
    run's id; it runs while the run runs on its worker, so what it raises stops the waiting here, not the run.

    Raises:
        pydantic_ai.exceptions.UsageLimitExceeded, UnexpectedModelBehavior, ModelHTTPError, UserError, ...: what
            `agent.run()` raises for the same failure, with the same message; each is also a `RunFailedError`
            whose `run_id` names the failed run (`codemode trace RUN_ID`), as `run_result` raises them.
        RunWorkflowFailedError: a failure pydantic-ai has no exception for, as `run_result` raises it (a
            temporalio `WorkflowFailureError` whose message says why the run failed).
        InvalidRunInputError: as `start_run`; nothing started.

    """
    if event_stream_handler is not None and stream is False:
        raise InvalidRunInputError("event_stream_handler needs the run's events: drop stream=False")
    handle = await start_run(client, agent, prompt, task_queue=task_queue, model=model,
                             message_history=message_history, deps=deps, model_settings=model_settings,
                             usage_limits=usage_limits, usage=usage, run_id=run_id, instructions=instructions,
                             stream=True if event_stream_handler is not None else stream)
    if output_type is None and not isinstance(agent, str):
        output_type = served_agent(agent).output_type
    if event_stream_handler is not None:
        await feed_event_stream_handler(event_stream_handler, stream_events(client, handle.id), deps=deps,
                                        prompt=prompt, run_id=handle.id, model=model)
    result = await run_result(handle, output_type)
    if usage is None:
        return result
    for name in (f.name for f in fields(RunUsage)):  # in place, as pydantic-ai counts into the caller's object
        setattr(usage, name, copy.copy(getattr(result.usage, name)))
    return replace(result, usage=usage)
