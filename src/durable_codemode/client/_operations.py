"""What a Temporal client does to a run: start it (with its deps), list what waits for a person, decide."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RunUsage, UsageLimits
from pydantic_core import to_jsonable_python
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.converter import PayloadConverter
from temporalio.service import RPCError, RPCStatusCode

from .._approvals import (
    DECIDE_ALL_UPDATE,
    DECIDE_UPDATE,
    ApprovalDecision,
    ApprovalRecord,
    BatchDecision,
    DecidedCalls,
    PendingApproval,
    RejectedDecision,
)
from .._decisions import decision_update_id
from .._errors import (
    CodeModeUserError,
    DecisionConflictError,
    InvalidRunInputError,
    RunClosedError,
    RunNotFoundError,
)
from .._models import unknown_model
from .._names import call_fingerprint
from .._signing import signing_payload
from .._types import RunInput, RunResult
from ..worker._agent import CodeModeAgent
from ..worker._worker import DEFAULT_TASK_QUEUE
from ..workflow._run import CodeModeRunWorkflow
from ._answering import no_answer
from ._children import MAX_CHILD_DEPTH, children_of
from ._failures import run_failure
from ._moving import run_motion
from ._signer import ApprovalSigner
from ._visibility import lacks_search_attributes, start_options

__all__ = ["DEFAULT_ANSWER_TIMEOUT", "MAX_DEPS_BYTES", "check_usage_limits", "decide", "decide_all", "deps_for_run",
           "pending_approvals", "rejected_decisions", "run_agent", "run_result", "start_run", "typed_result",
           "validate_run_input", "wait_for_approvals"]

DEFAULT_ANSWER_TIMEOUT = timedelta(seconds=10)
"""How long a query or a decision waits for a worker of the run to answer before `WorkerUnavailableError`."""

_T = TypeVar("_T")
OutputT = TypeVar("OutputT")


def validate_run_input(agent: str, prompt: str | None, message_history: Any) -> tuple[str | None, list[ModelMessage]]:
    """The prompt and message history a run starts with, checked before anything starts.

    `message_history` may hold pydantic-ai messages or their JSON-shaped dicts (`ModelMessagesTypeAdapter`). An
    empty prompt is allowed only with a history that ends with a request, which the run then answers.

    Raises:
        InvalidRunInputError: what is wrong, and what to pass instead.

    """
    if not isinstance(agent, str) or not agent.strip():
        raise InvalidRunInputError(f"the agent must be a non-empty agent name, got {agent!r}")
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidRunInputError(f"the prompt must be a string, got {type(prompt).__name__}")
    if isinstance(message_history, (str, bytes)) or not isinstance(message_history, Sequence):
        raise InvalidRunInputError(
            "message_history must be a list of pydantic-ai messages (e.g. ModelMessagesTypeAdapter.validate_json("
            f"text)), got {type(message_history).__name__}")
    try:
        history = ModelMessagesTypeAdapter.validate_python(list(message_history))
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidRunInputError(
            f"message_history is not a list of pydantic-ai messages ({e.error_count()} problems; the first, at "
            f"{where or 'the top'}: {first['msg']}); pass the messages of an earlier run, e.g. "
            "result.all_messages() or ModelMessagesTypeAdapter.validate_json(text)") from None
    if prompt is None or not prompt.strip():
        if not history or not isinstance(history[-1], ModelRequest):
            raise InvalidRunInputError(
                "the prompt is empty: say what the agent should do (or pass a message history that ends with a "
                "request for it to answer)")
        return None, history
    return prompt, history


async def _on_run(client: Client, run_id: str, call: Awaitable[_T], timeout: timedelta) -> _T:
    """`call` to run `run_id`, with its failures as errors that say what to do."""
    try:
        return await call
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:  # no such run, or one that has ended ("already completed")
            during = "aborted by closing workflow" in e.message  # it closed with the update in flight
            raise await _closed(client, run_id, during=during) or RunNotFoundError(run_id, _address(client)) from e
        if e.status in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
            raise await _closed(client, run_id) or await no_answer(
                client, run_id, timeout, what="answered", todo="ask again") from e
        raise
    except WorkflowUpdateRPCTimeoutOrCancelledError as e:
        raise await _closed(client, run_id) or await no_answer(
            client, run_id, timeout, what="took the decision (so nothing was recorded)",
            todo="decide again") from e


def _address(client: Client) -> str:
    return client.service_client.config.target_host


_CLOSED = {
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TIMED_OUT: "timed out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued as new",
}


async def _closed(client: Client, run_id: str, *, during: bool = False) -> RunClosedError | None:
    """`RunClosedError` if run `run_id` exists and has ended (how and when, from the server), else `None`."""
    try:
        description = await client.get_workflow_handle(run_id).describe()
    except RPCError:
        return None
    status = _CLOSED.get(description.status) if description.status is not None else None
    return RunClosedError(run_id, status, description.close_time, during=during) if status else None


MAX_DEPS_BYTES = 64 * 1024
"""The most a run's deps may be, as JSON: they travel in the run's input and with every model request and tool
call (each an activity whose input is recorded), so they are ids and settings, not data."""

_JSON_TYPES = (dict, list, str, int, float, bool)


def check_usage_limits(limits: UsageLimits | None) -> UsageLimits | None:
    """`limits` as a run records them, or the reason they cannot be.

    Raises:
        InvalidRunInputError: a limit a durable run cannot check yet (`cost_limit`, `count_tokens_before_request`).

    """
    if limits is None:
        return None
    if not isinstance(limits, UsageLimits):
        raise InvalidRunInputError(f"usage_limits must be pydantic_ai.usage.UsageLimits, got {type(limits).__name__}")
    refused = [name for name, on in (("cost_limit", limits.cost_limit is not None),
                                     ("count_tokens_before_request", limits.count_tokens_before_request)) if on]
    if refused:
        raise InvalidRunInputError(
            f"UsageLimits({', '.join(refused)}=...) is not checked by a durable run yet: leave it unset (request, "
            "tool call and token limits are checked)")
    return limits


def check_run_model(model: str | None) -> str | None:
    """A run's model string, checked as far as a client can: pydantic-ai must know its provider.

    Its API key is the worker's business (clients need none): a worker without it fails the run at its first step.

    Raises:
        InvalidRunInputError: not a string, or pydantic-ai does not know the model (no such provider).

    """
    if model is None:
        return None
    if not isinstance(model, str):
        raise InvalidRunInputError(f"model must be a pydantic-ai model string such as 'openai:gpt-5', got "
                                   f"{type(model).__name__}: a run records its model, so a Model object cannot "
                                   "be passed; give the agent that model instead")
    problem = unknown_model(model)
    if problem:
        raise InvalidRunInputError(f"the run's model {model!r}: {problem}")
    return model


def _unrecordable(converter: PayloadConverter, deps: Any, error: Exception) -> str:
    """Why `deps` cannot be recorded with a run: the fields the converter cannot serialize, and the way out.

    pydantic-ai's deps are often a connection or client beside ids (`SupportDependencies(customer_id, db)`): the
    message names the fields that are live resources and spells out the `deps_factory` that keeps them on the worker.
    """
    kind = type(deps)
    if dataclasses.is_dataclass(deps):
        values = {f.name: getattr(deps, f.name) for f in dataclasses.fields(deps)}
    elif isinstance(deps, BaseModel):
        values = dict(deps)
    else:
        return (f"deps of type {kind.__qualname__} cannot be serialized by the client's data converter ({error}); "
                "pass a dataclass, a pydantic BaseModel, a TypedDict or plain JSON values")
    live: dict[str, str] = {}
    data: dict[str, Any] = {}
    for name, value in values.items():
        try:
            converter.to_payloads([value])
            data[name] = to_jsonable_python(value)
        except Exception:
            live[name] = type(value).__qualname__
    if not live:
        return (f"deps of type {kind.__qualname__} cannot be serialized by the client's data converter ({error}); "
                "pass a dataclass, a pydantic BaseModel, a TypedDict or plain JSON values")
    built = ", ".join([*(f"{n}=run[{n!r}]" for n in data), *(f"{n}=<the worker's {t}>" for n, t in live.items())])
    named = ", ".join(f"{n!r} ({t})" for n, t in live.items())
    fields_are = f"fields {named} are live resources" if len(live) > 1 else f"field {named} is a live resource"
    return (f"deps of type {kind.__qualname__} cannot be recorded with the run: its {fields_are} the data converter "
            "cannot serialize. A run records its deps in its history, so it records ids and settings, and the "
            "worker holds connections and clients: give the agent a deps_factory that builds the deps on the "
            f"worker, CodeModeAgent(agent, deps_factory=lambda run: {kind.__name__}({built})), and start the run "
            f"with what it records, deps={data!r} (docs/agents.md#deps-that-hold-connections)")


def deps_for_run(client: Client, deps: Any, agent: CodeModeAgent | None = None) -> tuple[Any, str | None]:
    """`deps` checked for a run: `(deps, the qualified name of its class when it is not plain JSON)`.

    Raises:
        InvalidRunInputError: the data converter cannot serialize them, they are over `MAX_DEPS_BYTES`, or (with
            the `agent` object) they are not of the agent's `deps_type`.

    """
    if deps is None:
        return None, None
    kind = type(deps)
    converter = client.data_converter.payload_converter
    try:
        payloads = converter.to_payloads([deps])
    except Exception as e:
        raise InvalidRunInputError(_unrecordable(converter, deps, e)) from e
    size = sum(len(p.data) for p in payloads)
    if size > MAX_DEPS_BYTES:
        raise InvalidRunInputError(
            f"deps are {size:,} bytes as JSON, over {MAX_DEPS_BYTES:,}: they travel with every model request and "
            "tool call of the run, so pass ids and settings and let a tool fetch the data")
    type_name = None if isinstance(deps, _JSON_TYPES) else f"{kind.__module__}.{kind.__qualname__}"
    if agent is not None:
        try:
            agent.recorded_deps(to_jsonable_python(deps), type_name=type_name)
        except CodeModeUserError as e:
            raise InvalidRunInputError(str(e)) from e
    return deps, type_name


async def start_run(
    client: Client,
    agent: str | CodeModeAgent,
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
    started_by: str | None = None,
    instructions: str | None = None,
    stream: bool | None = None,
) -> WorkflowHandle[CodeModeRunWorkflow, RunResult[Any]]:
    """Start an agent run and return its handle; `await handle.result()` gives the `RunResult`.

    Args:
        client: from `durable_codemode.connect()`.
        agent: the agent's name, as served by a worker on `task_queue`; or the `CodeModeAgent` itself, which also
            checks `deps` against its `deps_type` here, before anything starts.
        prompt: the user's prompt; may be empty only when `message_history` ends with a request.
        task_queue: the workers' task queue.
        model: a pydantic-ai model string overriding the agent's model for this run. Its provider must be one
            pydantic-ai knows (checked here); its API key must be set on the workers (checked at the run's first
            step, which fails the run at once, naming the variable, when it is not).
        message_history: earlier messages to continue a conversation (`None`: none, as in `Agent.run`).
        deps: this run's deps, as in `Agent.run(deps=...)`: `ctx.deps` of its tools (in the sandbox and native),
            dynamic instructions and `prepare` functions. A dataclass, pydantic model, TypedDict or plain JSON,
            at most `MAX_DEPS_BYTES` as JSON; recorded in the run's input and carried across continue-as-new.
            `None`: the agent's `CodeModeAgent(deps=...)` default. The worker rebuilds them as the agent's
            `deps_type` and fails the run at its first step, naming both types, if they are of another type.
        model_settings: pydantic-ai `ModelSettings` for this run's model requests, merged over the agent's (as
            in `Agent.run`); recorded with the run.
        usage_limits: pydantic-ai `UsageLimits`, recorded with the run and checked in workflow code before each
            model request and tool call and after each response, over the whole continue-as-new chain. Past one
            the run fails with pydantic-ai's `UsageLimitExceeded` message, not retried.
        usage: the usage to start counting from, as `Agent.run(usage=...)`: the earlier runs of a conversation
            (`RunResult.usage`), so `usage_limits` count them too and the result's `usage` is the total. Recorded
            with the run (a copy: `run_agent` updates the object you pass in place, as `agent.run()` does).
        run_id: the workflow id; defaults to `<agent>-<random>`. Reusing the id of a running run is an error.
        instructions: this run's own instructions, added to the agent's, as `Agent.run(instructions=...)`; recorded
            when the run starts and sent with every model request of the run.
        started_by: who starts the run, recorded with it: an approver policy with `allow_self_approval=False`
            refuses this person's approvals of the run's calls. As the caller says (not authenticated).
        stream: whether the run streams its events live (`stream_events(client, handle.id)`): `True` with the
            agent's `EventStreamSettings` (or the defaults), `False` not even if its agent does, `None` (the
            default) as its agent says (`CodeModeAgent(stream=...)`). Recorded with the run.

    Raises:
        InvalidRunInputError: an empty agent name or prompt, a model pydantic-ai does not know, a malformed
            message history, deps that cannot be serialized, are too large or (given the agent) of the wrong type,
            or usage limits a durable run cannot check; nothing started.

    A run naming an agent that no worker on `task_queue` serves, or a model the worker cannot use (its API key is
    not set there), fails at once at its first step (the worker describes the agent), not retried, with the
    worker's message ("no agent named ...", "... OPENAI_API_KEY is not set ...") as the failure.

    """
    name = agent.name if isinstance(agent, CodeModeAgent) else agent
    prompt_or_none, history = validate_run_input(name, prompt, () if message_history is None else message_history)
    run_deps, deps_type = deps_for_run(client, deps, agent if isinstance(agent, CodeModeAgent) else None)
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRunInputError(f"instructions must be a string (added to the agent's for this run), got "
                                   f"{type(instructions).__name__}")
    if model_settings is not None and not isinstance(model_settings, dict):
        raise InvalidRunInputError(f"model_settings must be a dict (pydantic-ai ModelSettings), got "
                                   f"{type(model_settings).__name__}")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRunInputError(f"stream must be True, False or None (as the agent says), got "
                                   f"{type(stream).__name__}")
    if usage is not None and not isinstance(usage, RunUsage):
        raise InvalidRunInputError(f"usage must be pydantic_ai.usage.RunUsage (a previous run's RunResult.usage), got "
                                   f"{type(usage).__name__}")
    run_input = RunInput(agent=name, prompt=prompt_or_none, model=check_run_model(model), message_history=history,
                         deps=run_deps, deps_type=deps_type,
                         model_settings=dict(model_settings) if model_settings else None,
                         usage_limits=check_usage_limits(usage_limits), started_by=started_by,
                         instructions=instructions, usage=usage, stream=stream)
    workflow_id = run_id or f"{name}-{uuid.uuid4().hex[:12]}"
    try:
        return await client.start_workflow(CodeModeRunWorkflow.run, run_input, id=workflow_id,
                                           task_queue=task_queue, **start_options(client, name))
    except RPCError as e:
        if not lacks_search_attributes(client, e):  # then the memo carries agent and status (_visibility)
            raise
        return await client.start_workflow(CodeModeRunWorkflow.run, run_input, id=workflow_id,
                                           task_queue=task_queue, **start_options(client, name))


async def run_agent(
    client: Client,
    agent: str | CodeModeAgent,
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
    if output_type is None and isinstance(agent, CodeModeAgent):
        output_type = agent.output_type
    if event_stream_handler is not None:
        from ._stream import feed_event_stream_handler, stream_events  # (it builds on this module)

        await feed_event_stream_handler(event_stream_handler, stream_events(client, handle.id), deps=deps,
                                        prompt=prompt, run_id=handle.id, model=model)
    result = await run_result(handle, output_type)
    if usage is None:
        return result
    for name in (f.name for f in fields(RunUsage)):  # in place, as pydantic-ai counts into the caller's object
        setattr(usage, name, copy.copy(getattr(result.usage, name)))
    return replace(result, usage=usage)


async def run_result(handle: WorkflowHandle[Any, Any], output_type: Any = None) -> RunResult[Any]:
    """The result of a run (waiting for it to end), its output rebuilt as `output_type` if given (`typed_result`).

    Raises:
        pydantic_ai.exceptions.UsageLimitExceeded, UnexpectedModelBehavior, ModelHTTPError, UserError, ...: the run
            failed as `agent.run()` would have, with pydantic-ai's exception; it is also a `RunFailedError` whose
            `run_id` names the run (`_failures.agent_run_error`).
        RunWorkflowFailedError: the run failed in a way pydantic-ai has no exception for (a sandbox limit, a
            refused input, a worker's configuration error, ...), was cancelled or terminated. It is temporalio's
            `WorkflowFailureError` (same `cause`) and a `RunFailedError`, and its message is the worker's reason
            (`run 'ID' failed: ...`) rather than temporalio's "Workflow execution failed".

    """
    try:
        result: RunResult[Any] = await handle.result()
    except WorkflowFailureError as e:
        raised = run_failure(e, handle.id)
        if isinstance(raised, WorkflowFailureError):  # ours: `.cause` stays the workflow's failure, as temporalio's
            raise raised from e.cause
        raise raised from e
    return result if output_type is None else typed_result(result, output_type)


def typed_result(result: RunResult[Any], output_type: type[OutputT] | Any) -> RunResult[OutputT]:
    """`result` with its JSON output validated as `output_type` (a `BaseModel`, dataclass, union, `list[...]`).

    Raises:
        CodeModeUserError: the output does not validate as `output_type` (not the agent's output type?).

    """
    try:
        value = TypeAdapter(output_type).validate_python(result.output)
    except ValidationError as e:
        raise CodeModeUserError(
            f"the run's output does not validate as {getattr(output_type, '__name__', output_type)!r}: "
            f"{e.error_count()} error(s), first: {e.errors()[0]['msg']} at {e.errors()[0]['loc']}; pass the agent's "
            "own output type (or the CodeModeAgent) as output_type") from e
    return replace(result, output=value)


def _handle(client: Client, run_id: str) -> WorkflowHandle[CodeModeRunWorkflow, RunResult[Any]]:
    return client.get_workflow_handle_for(CodeModeRunWorkflow.run, run_id)


async def pending_approvals(
    client: Client, run_id: str, *, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT
) -> list[PendingApproval]:
    """The calls of run `run_id` waiting for a decision, then those its child runs wait on, each with its `run_id`.

    Queries: they answer in milliseconds and record nothing. A child's calls are read from the child itself, and
    only from the children the run lists as its own and the server confirms are (`_children`), never from what
    anyone signalled: a list someone forged cannot put another run's call in front of a person.

    Raises:
        RunNotFoundError: no run with that id.
        WorkerUnavailableError: no worker answered within `timeout` (a query needs one, even for a closed run);
            `WorkerBusyError` when one polls the run's task queue but was busy, so asking again later works.

    """
    return await _waiting_in(client, run_id, timeout, depth=0)


async def _waiting_in(client: Client, run_id: str, timeout: timedelta, *, depth: int) -> list[PendingApproval]:
    call = _handle(client, run_id).query(CodeModeRunWorkflow.pending_approvals, rpc_timeout=timeout)
    # A worker of 0.2.0 also listed its children's calls, as their signals said: those are not taken from it.
    own = [p for p in await _on_run(client, run_id, call, timeout) if p.run_id is None]
    return own + await children_waiting(client, run_id, timeout=timeout, depth=depth)


async def children_waiting(client: Client, run_id: str, *, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT,
                           depth: int = 0) -> list[PendingApproval]:
    """The calls run `run_id`'s child runs wait on, each read from the child and given its `run_id` (`_children`).

    Raises:
        RunNotFoundError / WorkerUnavailableError: as `pending_approvals`, for the run or one of its children.

    """
    if depth >= MAX_CHILD_DEPTH:
        return []
    children = await _on_run(client, run_id, children_of(client, run_id, timeout=timeout), timeout)

    async def of_child(child: str) -> list[PendingApproval]:
        try:
            calls = await _waiting_in(client, child, timeout, depth=depth + 1)
        except (RunNotFoundError, RunClosedError):  # it ended meanwhile: nothing waits there
            return []
        return [p if p.run_id else replace(p, run_id=child) for p in calls]

    listed = await asyncio.gather(*(of_child(c.run_id) for c in children))
    return [p for calls in listed for p in calls]


async def wait_for_approvals(
    client: Client, run_id: str, *, count: int = 1, timeout: timedelta = timedelta(minutes=1),
) -> list[PendingApproval]:
    """Wait until run `run_id` has at least `count` calls waiting for a decision; returns them.

    Ten times a second it asks the server whether the run is moving (a workflow task or an activity in flight,
    `_moving.run_motion`), and asks the run itself (the `pending_approvals` query, which records nothing) when it is
    not: a query that reaches a run on a worker without a workflow cache just as an activity completes can cost the
    run a workflow task, and stall it for 10 s (`_moving`). A run whose own call waits while other calls run on (a
    long tool beside it in a gather) is asked every 2 s. Waiters on one run in this process share each query: two
    queries reaching such a worker together lose one of them the same way.

    Raises:
        TimeoutError: fewer calls than `count` waited within `timeout`.
        RunNotFoundError / WorkerUnavailableError: as `pending_approvals`.

    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout.total_seconds()
    asked_at = loop.time()
    pending: list[PendingApproval] = []
    while True:
        motion = await run_motion(client, run_id)
        if not motion.moving or (motion.waiting and loop.time() - asked_at >= _ASK_A_MOVING_RUN_EVERY):
            asked_at = loop.time()
            pending = await _shared_ask(client, run_id)
            if len(pending) >= count:
                return pending
        if loop.time() > deadline:
            raise TimeoutError(f"run {run_id!r} has {len(pending)} call(s) waiting for approval after {timeout}, "
                               f"not {count}")
        await asyncio.sleep(0.1)


_ASK_A_MOVING_RUN_EVERY = 2.0
"""Seconds between `wait_for_approvals`' queries of a run that waits for a person while other calls run on."""

_ASKING: dict[tuple[int, int, str], asyncio.Future[list[PendingApproval]]] = {}
"""The `pending_approvals` query in flight for each (event loop, client, run), which `wait_for_approvals` share."""


async def _shared_ask(client: Client, run_id: str) -> list[PendingApproval]:
    """`pending_approvals(client, run_id)`, sharing the query in flight for the same run, if there is one."""
    key = (id(asyncio.get_running_loop()), id(client), run_id)
    asking = _ASKING.get(key)
    if asking is None:
        asking = _ASKING[key] = asyncio.ensure_future(pending_approvals(client, run_id))
        asking.add_done_callback(lambda _: _ASKING.pop(key, None))
    return await asyncio.shield(asking)


DEFAULT_SIGNATURE_LIFETIME = timedelta(minutes=5)
"""How long a signed decision stays valid by default: long enough to reach the run, too short to be kept."""


def _signed(client: Client, run_id: str, decision: ApprovalDecision, signer: ApprovalSigner | None,
            valid_for: timedelta, seen: PendingApproval | None) -> ApprovalDecision:
    """`decision` signed by `signer` (its approver, key id, expiry and signature set), or as it is without one.

    The signature covers the fingerprint of `seen`, the call as the approver saw it listed (its tool and
    arguments): the run refuses it if the call it holds is another (`None`: no such call is listed).
    """
    if signer is None:
        return decision
    if decision.approver not in (None, signer.approver):
        raise CodeModeUserError(f"the decision names approver {decision.approver!r}, but the key is "
                                f"{signer.approver!r}'s ({signer.key_id}): a decision is signed by its own approver")
    expires_at = datetime.now(UTC) + valid_for
    payload = signing_payload(namespace=client.namespace, run_id=run_id, call_id=decision.call_id,
                              approved=decision.approved, note=decision.note, approver=signer.approver,
                              expires_at=expires_at,
                              call_fingerprint=call_fingerprint(seen.tool, seen.args) if seen else "")
    return replace(decision, approver=signer.approver, key_id=signer.key_id, signature=signer.sign(payload),
                   expires_at=expires_at)


async def decide(
    client: Client, run_id: str, call_id: str, *, approved: bool, note: str | None = None,
    approver: str | None = None, signer: ApprovalSigner | None = None, seen: PendingApproval | None = None,
    valid_for: timedelta = DEFAULT_SIGNATURE_LIFETIME, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT,
) -> ApprovalRecord:
    """Approve or deny one waiting call; returns its audit record once the run has recorded it.

    The update id is `<call id> by <approver>` (`_decisions.decision_update_id`), so sending the same decision
    twice is harmless: the second gets the first's record back. The run accepts a decision under that id only if
    it is that approver's about that call, so nobody else can take it. The record returned is checked to be this
    decision (call, approver, verdict, note): a different decision sent under an id that already holds one (the
    approver changed their mind after deciding) raises `DecisionConflictError` instead of returning the first.
    With `signer` (`ApprovalSigner.load(path)`), the decision is signed as its approver, valid for `valid_for`,
    over the call as the approver saw it: `seen`, the `PendingApproval` they read (`pending_approvals`); without
    it, the call as run `run_id` lists it now. A run refuses a signature made for other arguments than its call's.

    Raises:
        temporalio.client.WorkflowUpdateFailedError: the run refused the decision, with a message saying why
            (unknown, decided or expired call; an approver the tool's policy does not name; a missing, forged or
            expired signature, or one made on other arguments; a malformed or over-long field, by name); the run
            is unaffected, and sending it again would fail the same way.
        DecisionConflictError: the run holds another decision under this update id; this one was not recorded.
        CodeModeUserError: `seen` is another call, or one listed as waiting in another run (its `run_id`).
        RunNotFoundError: no run with that id.
        RunClosedError: the run has ended (the message says how); nothing was recorded.
        WorkerUnavailableError: no worker took the decision within `timeout`; nothing was recorded
            (`WorkerBusyError`: one polls the run's task queue but was busy: decide again in a moment).

    """
    if seen is not None and (seen.call_id != call_id or seen.run_id not in (None, run_id)):
        where = f"run {seen.run_id!r}" if seen.run_id not in (None, run_id) else f"call {seen.call_id!r}"
        raise CodeModeUserError(f"seen= is {where}'s listed call, not call {call_id!r} of run {run_id!r}: pass the "
                                "PendingApproval of the call decided, and decide it on the run it waits in "
                                "(decide(client, p.run_id or run_id, p.call_id, seen=p))")
    if signer is not None and seen is None:
        try:
            listed = await _on_run(client, run_id, _handle(client, run_id).query(
                CodeModeRunWorkflow.pending_approvals, rpc_timeout=timeout), timeout)
        except (RPCError, CodeModeUserError):  # no worker, or closed: the update says what holds (a recorded
            listed = []                        # decision comes back by its update id, from a closed run too)
        seen = next((p for p in listed if p.call_id == call_id and p.run_id is None), None)
    decision = _signed(client, run_id, ApprovalDecision(call_id=call_id, approved=approved, note=note,
                                                        approver=approver), signer, valid_for, seen)
    update_id = decision_update_id(call_id, decision.approver)
    call = _handle(client, run_id).execute_update(DECIDE_UPDATE, decision, id=update_id, rpc_timeout=timeout)
    answer = await _on_run(client, run_id, call, timeout)
    try:
        return _own_record(run_id, update_id, decision, answer)
    except DecisionConflictError as conflict:
        # Temporal answers an update id's first outcome even from a closed run: an approver who decided before
        # would hear "a recorded decision stands" (exit 1) where anyone else hears "run is closed" (exit 2). One
        # situation, one answer: a closed run says so, to everyone (its audit trail shows what it recorded).
        closed = await _closed(client, run_id)
        if closed is not None:
            raise closed from conflict
        raise


def _own_record(run_id: str, update_id: str, decision: ApprovalDecision, answer: Any) -> ApprovalRecord:
    """The record the run answered `decision` with, if it is that decision's.

    Raises:
        DecisionConflictError: it is another decision's record (or no record at all).

    """
    try:
        record = _RECORD.validate_python(answer)
    except ValidationError:
        raise DecisionConflictError(
            f"run {run_id!r} did not record this decision: update id {update_id!r} was already used by another "
            "update, whose outcome Temporal returned instead (a worker from before update ids were bound to their "
            "approver let it through); upgrade the run's workers, then decide again with an approver named",
            None) from None
    differs = [what for what, mine, recorded in (
        ("call", decision.call_id, record.call_id), ("approver", decision.approver, record.approver),
        ("verdict", decision.approved, record.approved), ("note", decision.note, record.note)) if mine != recorded]
    if not differs:
        return record
    verb = "approval" if record.approved else "denial"
    held = (f"{record.approver!r}'s {verb} of call {record.call_id!r}" if record.approver else
            f"an {verb} of call {record.call_id!r}") + f", recorded at {record.decided_at:%Y-%m-%d %H:%M:%S}"
    if set(differs) <= {"verdict", "note"}:  # the same approver's earlier decision about the same call
        raise DecisionConflictError(
            f"run {run_id!r} did not record this decision: it already holds {held} under update id {update_id!r}, "
            f"and a recorded decision stands (its {' and '.join(differs)} differs from this one's)", record)
    raise DecisionConflictError(
        f"run {run_id!r} did not record this decision: update id {update_id!r} holds {held}, not this decision "
        "(a worker from before update ids were bound to their approver let another decision take the id); "
        "upgrade the run's workers, then decide again", record)


_RECORD = TypeAdapter(ApprovalRecord)
_RECORDS = TypeAdapter(list[ApprovalRecord])


async def decide_all(
    client: Client, run_id: str, *, approved: bool, note: str | None = None, approver: str | None = None,
    signer: ApprovalSigner | None = None, valid_for: timedelta = DEFAULT_SIGNATURE_LIFETIME,
    timeout: timedelta = DEFAULT_ANSWER_TIMEOUT,
) -> DecidedCalls:
    """Approve or deny every call of run `run_id` waiting for a decision (raises as `decide` does).

    The calls are listed first (`pending_approvals`); with `signer`, each of the run's own is signed over what the
    listing shows. The calls its child runs wait on cannot be decided on this run: they come back unanswered in
    the result's `elsewhere`, each with the `run_id` to decide it on (`codemode approve --all` names the command).
    The update id is random (an id of the form `<call id> by <approver>` is reserved for one decision); no update
    is sent when only child runs' calls wait.
    """
    listed = await pending_approvals(client, run_id, timeout=timeout)
    own = [p for p in listed if p.run_id is None]
    elsewhere = [p for p in listed if p.run_id is not None]
    if not own and elsewhere:
        return DecidedCalls([], elsewhere)
    batch = BatchDecision(approved=approved, note=note, approver=approver)
    if signer is not None:
        signed = [_signed(client, run_id, ApprovalDecision(call_id=p.call_id, approved=approved, note=note,
                                                           approver=approver), signer, valid_for, p)
                  for p in own]
        batch = BatchDecision(approved=approved, note=note, approver=signer.approver, key_id=signer.key_id,
                              signatures={d.call_id: d.signature or "" for d in signed},
                              expires_at=signed[0].expires_at if signed else None)
    update_id = str(uuid.uuid4())
    call = _handle(client, run_id).execute_update(DECIDE_ALL_UPDATE, batch, id=update_id, rpc_timeout=timeout)
    answer = await _on_run(client, run_id, call, timeout)
    try:
        records = _RECORDS.validate_python(answer)
    except ValidationError:
        raise DecisionConflictError(f"run {run_id!r} answered decide_all with something other than its records "
                                    f"(update id {update_id!r}); nothing here says what it recorded", None) from None
    for record in records:
        _own_record(run_id, update_id, ApprovalDecision(call_id=record.call_id, approved=approved, note=note,
                                                        approver=batch.approver), record)
    return DecidedCalls(records, elsewhere)


async def rejected_decisions(
    client: Client, run_id: str, *, timeout: timedelta = DEFAULT_ANSWER_TIMEOUT
) -> list[RejectedDecision]:
    """Recent decisions run `run_id` refused, with why.

    A query; the run keeps them in its worker's memory (a refused decision never enters the history), so after a
    worker restart it lists only those refused since.
    """
    call = _handle(client, run_id).query(CodeModeRunWorkflow.rejected_decisions, rpc_timeout=timeout)
    return await _on_run(client, run_id, call, timeout)
