"""Starting a run from a Temporal client (its input and deps checked first) and reading its result."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, TypeAdapter, ValidationError
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

from .._models import unknown_model
from .._visibility import lacks_search_attributes, start_options
from ..shared._errors import (
    CodeModeUserError,
    InvalidRunInputError,
    RunClosedError,
    RunNotFoundError,
)
from ..shared._names import DEFAULT_TASK_QUEUE
from ..shared._records import RunResult
from ..shared._types import MAX_DEPS_BYTES, RunInput
from ..workflow._run import CodeModeRunWorkflow
from ._answering import no_answer
from ._failures import run_failure

__all__ = [
    "DEFAULT_ANSWER_TIMEOUT",
    "ServedAgent",
    "check_usage_limits",
    "closed_run",
    "deps_for_run",
    "on_run",
    "run_handle",
    "run_result",
    "served_agent",
    "start_run",
    "typed_result",
    "validate_run_input",
]


DEFAULT_ANSWER_TIMEOUT = timedelta(seconds=10)
"""How long a query or a decision waits for a worker of the run to answer before `WorkerUnavailableError`."""


_T = TypeVar("_T")


@runtime_checkable
class ServedAgent(Protocol):
    """An agent given by object instead of by name (a `CodeModeAgent` is one): what the client reads of it.

    The client needs only its name; with the object it also checks a run's deps before anything starts, and
    `run_agent` takes its output type. The worker's class is not imported here: a client may run where no
    worker's code is.
    """

    @property
    def name(self) -> str:
        """The name workers serve it under."""
        ...

    @property
    def output_type(self) -> Any:
        """What its runs return (`run_agent`'s default `output_type`)."""
        ...

    def recorded_deps(self, raw: Any, *, type_name: str | None = None) -> Any:
        """What a run would record as its deps, checked as its worker checks them (raises `CodeModeUserError`)."""
        ...


OutputT = TypeVar("OutputT")


def served_agent(agent: object) -> ServedAgent:
    """`agent`, given by object, as the client reads it; refused by name when it is not an agent a worker serves.

    Raises:
        InvalidRunInputError: not a `CodeModeAgent` (or another object with its name, output type and deps check):
            a pydantic-ai `Agent` given directly, say.

    """
    if isinstance(agent, ServedAgent):  # the protocol's members, checked by their names
        return agent
    raise InvalidRunInputError(
        f"the agent must be its name or the CodeModeAgent a worker serves, got an object of type "
        f"{type(agent).__qualname__}: wrap a pydantic-ai Agent as CodeModeAgent(agent) on the worker, and start "
        "runs with it or its name")


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


async def on_run(client: Client, run_id: str, call: Awaitable[_T], timeout: timedelta) -> _T:
    """`call` to run `run_id`, with its failures as errors that say what to do."""
    try:
        return await call
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:  # no such run, or one that has ended ("already completed")
            during = "aborted by closing workflow" in e.message  # it closed with the update in flight
            raise await closed_run(client, run_id, during=during) or RunNotFoundError(run_id, _address(client)) from e
        if e.status in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
            raise await closed_run(client, run_id) or await no_answer(
                client, run_id, timeout, what="answered", todo="ask again") from e
        raise
    except WorkflowUpdateRPCTimeoutOrCancelledError as e:
        raise await closed_run(client, run_id) or await no_answer(
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


async def closed_run(client: Client, run_id: str, *, during: bool = False) -> RunClosedError | None:
    """`RunClosedError` if run `run_id` exists and has ended (how and when, from the server), else `None`."""
    try:
        description = await client.get_workflow_handle(run_id).describe()
    except RPCError:
        return None
    status = _CLOSED.get(description.status) if description.status is not None else None
    return RunClosedError(run_id, status, description.close_time, during=during) if status else None


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


def deps_for_run(client: Client, deps: Any, agent: ServedAgent | None = None) -> tuple[Any, str | None]:
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
    name = agent if isinstance(agent, str) else served_agent(agent).name
    prompt_or_none, history = validate_run_input(name, prompt, () if message_history is None else message_history)
    run_deps, deps_type = deps_for_run(client, deps, None if isinstance(agent, str) else agent)
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


def run_handle(client: Client, run_id: str) -> WorkflowHandle[CodeModeRunWorkflow, RunResult[Any]]:
    return client.get_workflow_handle_for(CodeModeRunWorkflow.run, run_id)
