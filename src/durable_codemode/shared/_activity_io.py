"""The inputs and results of the run's activities: model requests, output checks, tool calls, batches, compute.

All are plain dataclasses serialized by Temporal's pydantic payload converter. Keep activity inputs small: a
nested call's input is the tool name, its arguments and its id, never the run's context or schemas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import SerializerFunctionWrapHandler, model_serializer
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.native_tools import AbstractNativeTool
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RunUsage
from temporalio.common import RetryPolicy

from ._config import SnippetLimits
from ._conversation import ConversationPrefix
from ._types import OutputSpec

__all__ = [
    "AfterRunInput",
    "BatchInput",
    "BatchOutcome",
    "BatchResult",
    "BatchedCall",
    "ChildDeps",
    "ChildDepsInput",
    "ComputeRequest",
    "ComputeResult",
    "ModelRequestInput",
    "ModelStep",
    "ModelStreamTarget",
    "OutputInput",
    "OutputVerdict",
    "RunErrorInput",
    "RunRecovery",
    "ToolCallInput",
    "carried_messages",
]

@dataclass(kw_only=True)
class ModelRequestInput:
    """The input of the model-request activity."""

    agent: str
    model: str | None
    messages: list[ModelMessage] | None
    """The whole conversation; `None` when the input refers to the messages before (`earlier`) and carries the new
    ones in `new_messages`: a worker of a release before behaviour version 4, which requires `messages`, then
    refuses the input (a failed attempt, retried elsewhere) instead of sending its model half a conversation."""
    tools: list[ToolDefinition] | None
    """The run's tool definitions; `None` when the input refers to them (`tools_ref`), refused by older workers
    for the same reason."""
    deps: Any = None
    """The run's deps (`RunInput.deps`), for model settings that are a function of the run context."""
    model_settings: dict[str, Any] | None = None
    """The run's own model settings (`RunInput.model_settings`), merged over the agent's."""
    output: OutputSpec | None = None
    """The recorded output spec (`AgentSpec.output`): what output the model is asked for."""
    hooks: bool = False
    """Run the capabilities' model-request hooks around the call and answer a `ModelStep`
    (`AgentSpec.model_request_hooks`); `False`: call the model alone and answer its `ModelResponse`."""
    usage: RunUsage | None = None
    """The run's usage before this request (`ctx.usage` of the hooks); sent only with `hooks`."""
    run_step: int = 0
    """The request's step in the run, from 1 (`ctx.run_step` of the hooks, as pydantic-ai counts requests)."""
    output_retries: int = 0
    """Output retries the run has used (`hooks` only): a hook's `ModelRetry` past the agent's budget fails the run."""
    native_tools: list[AbstractNativeTool] = field(default_factory=list)
    """The provider tools the request offers (`AgentSpec.native_tools`)."""
    stream: ModelStreamTarget | None = None
    """Publish the model's stream to the run's event stream (`worker/_model_stream`); `None`: the run does not
    stream, and the request is made as before."""
    tools_ref: str | None = None
    """The digest of the run's tool definitions (`shared._conversation.tools_digest`), which an earlier request of
    the run carried: `tools` is then `None`. `None`: `tools` are the definitions (every request of runs of behaviour
    versions before 4, and a run's first)."""
    earlier: ConversationPrefix | None = None
    """The messages before `new_messages`, by reference (`shared._conversation`). `None`: `messages` is the whole
    conversation (runs of behaviour versions before 4 send it whole, and a run's first request)."""
    new_messages: list[ModelMessage] = field(default_factory=list)
    """With `earlier`: the messages new since the run's previous activity that took the conversation."""


def carried_messages(input: ModelRequestInput | OutputInput | AfterRunInput | RunErrorInput) -> list[ModelMessage]:
    """The messages an input carries: the whole conversation, or (when it refers to those before) the new ones."""
    return input.new_messages if input.earlier is not None else list(input.messages or [])


@dataclass(kw_only=True)
class ModelStreamTarget:
    """Where and how a model activity publishes what its model streams: the run's stream, as model turn `turn`."""

    turn: int
    batch_interval: timedelta


@dataclass(kw_only=True)
class ModelStep:
    """What the model activity answers when it runs model-request hooks (`ModelRequestInput.hooks`)."""

    response: ModelResponse | None
    """The response the run goes on with (the model's, or one a hook gave: `SkipModelRequest`,
    `on_model_request_error`); `None` when a hook raised `ModelRetry`: then `retry` is the next request."""
    messages: list[ModelMessage] | None = None
    """The run's history as the hooks left it (`ProcessHistory` writes the processed history back, as in
    `agent.run()`), ending with the request; `None`: the hooks left it alone (the usual case: nothing recorded)."""
    retry: ModelRequest | None = None
    """The retry request a hook's `ModelRetry` asks for (pydantic-ai's `RetryFeedbackPart`)."""


@dataclass(kw_only=True)
class OutputInput:
    """The input of the output activity: a response that may end the run, and the conversation before it."""

    agent: str
    model: str | None
    messages: list[ModelMessage] | None
    """The conversation up to the request the response answers (what output validators see as `ctx.messages`);
    `None` when the input refers to it (`earlier`, `new_messages`), as `ModelRequestInput.messages`."""
    response: ModelResponse
    """The candidate: the response's output tool calls, or its text (and files) when it called no tool."""
    retries: int
    """Output retries used so far (`ctx.retry` of output validators; past the budget the run fails)."""
    deps: Any = None
    model_settings: dict[str, Any] | None = None
    output_fingerprint: str | None = None
    """The run's recorded output (`AgentSpec.output`) as `_fingerprints.OutputShape.fingerprint`: a worker whose
    agent's output differs refuses, by name, an answer its output rejects (the model was offered the recorded one,
    so asking it again cannot help). `None` in inputs recorded before the field: checked as they were."""
    output_summary: str | None = None
    """The recorded output in words (`OutputShape.summary`), for that refusal."""
    earlier: ConversationPrefix | None = None
    """The messages before `new_messages`, by reference, as in `ModelRequestInput.earlier`."""
    new_messages: list[ModelMessage] = field(default_factory=list)
    """With `earlier`: the messages new since the run's previous activity that took the conversation."""


@dataclass
class AfterRunInput:
    """The input of the after-run activity: a run's decided output (as JSON) and what its `AgentRunResult` holds."""

    agent: str
    model: str | None
    messages: list[ModelMessage] | None
    """The run's conversation; `None` when the input refers to it, as `ModelRequestInput.messages`."""
    output: Any
    usage: RunUsage
    deps: Any = None
    earlier: ConversationPrefix | None = None
    """The messages before `new_messages`, by reference, as in `ModelRequestInput.earlier`."""
    new_messages: list[ModelMessage] = field(default_factory=list)
    """With `earlier`: the messages new since the run's previous activity that took the conversation."""


@dataclass(kw_only=True)
class RunErrorInput:
    """The input of the run-error activity: how a run's body failed, and what its `RunContext` holds then."""

    agent: str
    model: str | None
    messages: list[ModelMessage] | None
    """The run's conversation; `None` when the input refers to it, as `ModelRequestInput.messages`."""
    usage: RunUsage
    error_type: str
    """The failure's type, as the run would fail with it (`UsageLimitExceeded`, `UnexpectedModelBehavior`, ...)."""
    error_message: str
    deps: Any = None
    earlier: ConversationPrefix | None = None
    """The messages before `new_messages`, by reference, as in `ModelRequestInput.earlier`."""
    new_messages: list[ModelMessage] = field(default_factory=list)
    """With `earlier`: the messages new since the run's previous activity that took the conversation."""


@dataclass(kw_only=True)
class RunRecovery:
    """What the run-error activity found: whether the `on_run_error` hooks recovered the run, and its output."""

    recovered: bool
    output: Any = None
    """The output (JSON) of the result the hooks returned, when `recovered`."""


@dataclass(kw_only=True)
class OutputVerdict:
    """What the output activity found: the final output, or the request asking the model to try again."""

    output: Any = None
    """The validated output as JSON (`retry is None`)."""
    retry: ModelRequest | None = None
    """pydantic-ai's retry request (the validation errors, or an output validator's `ModelRetry` message)."""
    closing: ModelRequest | None = None
    """With `output`: the request pydantic-ai ends such a run's messages with, answering its output tool calls
    (`'Final result processed.'`); `None` for a text answer, and in verdicts recorded before the field."""
    output_tool: str | None = None
    """With `output`: the output tool whose call gave it (`RunResult.output_tool_name`)."""


@dataclass(kw_only=True)
class ChildDepsInput:
    """The input of the child-deps activity: the parent's call and deps, from which its child's deps are derived."""

    agent: str
    """The parent's agent, whose tool `tool` derives the deps."""
    tool: str
    call_id: str
    deps: Any = None
    """The parent run's deps (`RunInput.deps`), built as its agent's `deps_type` for the `RunContext`."""


@dataclass(kw_only=True)
class ChildDeps:
    """A child run's deps as it records them (`RunInput.deps`, `deps_type`), derived from its parent's context."""

    deps: Any = None
    deps_type: str | None = None
    """`module.QualName` of the value's class when it is not plain JSON (as `start_run` records deps)."""


@pydantic_dataclass(kw_only=True)
class ToolCallInput:
    """The input of a tool activity: only what the call needs, to keep histories small.

    The tool is in the activity type (`<agent>.<tool>`) and the call id in the activity id (`<call id>-<digest>`), and
    the activity reads them from there; the input holds the arguments. (Inputs recorded by 0.1.0 carried `tool` and
    `call_id` too: those keys are ignored.)

    A pydantic dataclass only so that its optional fields are left out of the payload while unset (`_unset_left_out`):
    every call of a run without deps would otherwise record `"deps":null`, and every non-MCP call
    `"schema_digest":null`, in the history.
    """

    args: dict[str, Any]
    deps: Any = None
    """The run's deps (`RunInput.deps`), rebuilt as the agent's `deps_type` for the tool's `RunContext`."""
    schema_digest: str | None = None
    """`ToolSpec.schema_digest`: the MCP tool's schemas as the run recorded them, checked against the server's."""

    @model_serializer(mode="wrap")
    def _unset_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value is not None or key == "args"}


@dataclass(kw_only=True)
class BatchedCall:
    """One call of a batch: its own id (the idempotency key the tool sees) and arguments."""

    call_id: str
    args: dict[str, Any]


@dataclass(kw_only=True)
class BatchInput:
    """The input of a batch activity: calls of one batched tool a program had in flight at once.

    Each call keeps what a `ToolCallInput` would give it (its id, arguments, the run's deps, shared once), and the
    tool's per-call options ride along, so the worker runs each call as the tool's own activity would: `timeout`
    per try, transient failures retried by `retry_policy` inside the batch.
    """

    agent: str
    tool: str
    calls: list[BatchedCall]
    deps: Any = None
    timeout: timedelta
    """`ToolOptions.timeout`: one try of one call."""
    retry_policy: RetryPolicy
    """`ToolOptions.retry_policy`: the tries each call gets for transient failures (and the backoff between them)."""
    schema_digest: str | None = None
    """`ToolSpec.schema_digest` of an MCP tool: each call is refused when the server now describes it differently."""


@dataclass(kw_only=True)
class BatchOutcome:
    """What one call of a batch came to (in `BatchResult`, and in the batch's heartbeat details)."""

    call_id: str
    kind: Literal["ok", "error", "deferred"]
    """`ok`: `value` is the result; `error`: the call failed for good, `error_type` / `message` say how (as the
    tool's own activity would have failed); `deferred`: it ran, but its result did not fit in the batch's payload,
    so the workflow runs it again as its own activity (batched tools are read-only)."""
    value: Any = None
    error_type: str | None = None
    message: str | None = None
    usage: RunUsage | None = None
    """`ok`: what the call added to its `ctx.usage` (a sub-agent run), counted in the run's usage; `None`: nothing
    (and in outcomes recorded before the field)."""


@dataclass(kw_only=True)
class BatchResult:
    """The result of a batch activity: one outcome per call, in the order of `BatchInput.calls`."""

    outcomes: list[BatchOutcome]


@dataclass(kw_only=True)
class ComputeResult:
    """Output of the compute activity: where the program got to, at its next host round trip or its end."""

    kind: Literal["suspended", "complete", "error", "runaway", "crashed", "too_large"]
    """`suspended`: at its next host round trip (a tool call, a clock read, a wait: workflow code answers it);
    `complete` / `error`: the snippet ended (a value, or an exception it did not catch); `runaway`: past
    `max_compute_seconds`; `crashed`: its sandbox process died, or it did not repeat itself; `too_large`: where
    it got to is over `ComputeRequest.max_dump_bytes` (`error` holds the size)."""
    state: str | None = None
    """`suspended`: the suspended program's dump; `complete` / `error`: the REPL after the snippet (base64)."""
    output: Any = None
    """`complete`: the program's value (`_results.jsonable`)."""
    printed: str = ""
    """What the program printed from the request's `state` on."""
    error: str | None = None
    """`error`: the exception (`Type: message`); `runaway` / `crashed`: what happened."""
    traceback: str | None = None
    seconds: float = 0.0
    """Wall time the stretch computed."""
    where: Literal["activity", "workflow"] = "activity"
    """Where it computed: in the activity, or in workflow code (past the budget, recorded by the activity)."""


@dataclass(kw_only=True)
class ComputeRequest:
    """Input of the compute activity: a stretch of a program to compute, from a dump (see `worker/_compute`)."""

    agent: str
    run_code_id: str
    start: Literal["feed", "snapshot", "computed"]
    """`feed`: start the snippet `code` in the REPL `state` (`None`: a fresh REPL); `snapshot`: load the suspended
    program `state`; then give it `answers` in order. `computed`: workflow code already computed the stretch (it
    took longer than the in-workflow budget): `state` is where it got to, and the activity records it."""
    state: str | None
    """A Monty dump, base64 (`_compute_wire.encode_dump`)."""
    code: str = ""
    answers: list[Any] = field(default_factory=list)
    """What workflow code answered the program's suspensions with since `state`, encoded by `_compute_wire`:
    the activity gives them again (the program repeats itself exactly), and the last one starts the stretch."""
    limits: SnippetLimits
    seed: int = 0
    """`feed` into a fresh REPL: the seed workflow code drew for its `random`."""
    max_dump_bytes: int | None = None
    """The largest dump the activity may return (no payload store: Temporal's 2 MiB payload limit); `None`: any."""
    computed: ComputeResult | None = None
    """`computed`: the outcome to record."""
    cwd: str | None = None
    """`feed`: the snippet's working directory (`/files` in runs with files); `None`: Monty's default."""
