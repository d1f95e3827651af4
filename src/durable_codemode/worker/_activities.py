"""The activities a worker registers: describe the agent, request the model, run a tool.

Tool activities are one dynamic activity that serves every `<agent>.<tool>` activity type: each tool call still
shows under its own type in the history and the UI, and the worker needs no list of tools before it starts.
Whether a failure is retried is decided here, in one place: transient failures are raised as retryable errors
(bounded by the tool's retry policy), everything else as non-retryable errors whose type is the original
exception's name, so the program sees a `KeyError` as a `KeyError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pydantic_ai.exceptions import (
    FallbackExceptionGroup,
    ModelHTTPError,
    UnexpectedModelBehavior,
    UsageLimitExceeded,
    UserError,
)
from pydantic_ai.messages import ModelResponse
from pydantic_ai.usage import RunUsage
from pydantic_core import to_json
from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from ..shared._activity_io import (
    AfterRunInput,
    BatchInput,
    BatchResult,
    ChildDeps,
    ChildDepsInput,
    ComputeRequest,
    ComputeResult,
    ModelRequestInput,
    ModelStep,
    OutputInput,
    OutputVerdict,
    RunErrorInput,
    RunRecovery,
    ToolCallInput,
    carried_messages,
)
from ..shared._carry import SealRequest, SealResult
from ..shared._config import AUTOMATIC_PAYLOAD_LIMIT_BYTES
from ..shared._errors import AgentNotFoundError, CodeModeUserError, GuardrailError, RunFailedError
from ..shared._files import CARRY_WITHOUT_STORE_BYTES
from ..shared._names import (
    AFTER_RUN_ACTIVITY,
    BATCH_ACTIVITY,
    CHILD_DEPS_ACTIVITY,
    COMPUTE_ACTIVITY,
    DESCRIBE_AGENT_ACTIVITY,
    MODEL_REQUEST_ACTIVITY,
    OUTPUT_ACTIVITY,
    RUN_ERROR_ACTIVITY,
    SEAL_REPL_ACTIVITY,
    call_id_of_activity,
)
from ..shared._tool_usage import with_usage
from ..shared._types import AgentSpec
from ._agent import CodeModeAgent
from ._approvers import ApprovalAuthority
from ._batch import run_batch
from ._child_runs import child_deps
from ._compute import compute_stretch
from ._context import ToolCallContext, bind_call
from ._conversations import ConversationCache
from ._describe import describe_run
from ._failures import TRANSIENT, function_model_failure, message_of, tool_failure
from ._heartbeat import heartbeating
from ._model_requests import request_model
from ._run_outcome import after_run, check_output, on_run_error
from ._seal import monty_version, seal
from ._tool_calls import call_tool

__all__ = ["CodeModeActivities"]


def _may_pass(error: BaseException) -> bool:
    """Whether a model request that failed with `error` may succeed if made again.

    HTTP 4xx other than timeouts, conflicts and rate limits fail the same way again (bad key, bad request), as do
    our own and pydantic-ai's usage errors; anything else (5xx, a dropped connection) may pass.
    """
    if isinstance(error, ModelHTTPError):
        return error.status_code >= 500 or error.status_code in (408, 409, 429)
    return not isinstance(error, (CodeModeUserError, UserError, UnexpectedModelBehavior))

_PYDANTIC_AI_FAILURES: dict[str, Callable[[str], BaseException]] = {
    "UsageLimitExceeded": UsageLimitExceeded,
    "UnexpectedModelBehavior": UnexpectedModelBehavior,
    "UserError": UserError,
}
"""The failures of a run's body that `on_run_error` hooks get as pydantic-ai's own exception, by recorded type."""


def run_failure(error_type: str, message: str) -> BaseException:
    """A run's recorded failure as an exception for its `on_run_error` hooks.

    pydantic-ai's own type when it has one (`UsageLimitExceeded`, ...), else `RunFailedError` naming the type.
    """
    rebuild = _PYDANTIC_AI_FAILURES.get(error_type)
    return rebuild(message) if rebuild is not None else RunFailedError(error_type, message)


def _subject(what: str) -> str:
    """`what` of the current activity's run, for an error about its conversation."""
    run = activity.info().workflow_id if activity.in_activity() else None
    return f"{what} of run {run!r}" if run else what


class CodeModeActivities:
    """The activity implementations for a set of agents, looked up by name."""

    def __init__(self, agents: Sequence[CodeModeAgent], *, repl_key: bytes | None = None,
                 payload_store: bool = False, authority: ApprovalAuthority | None = None) -> None:
        self._repl_key = repl_key
        self._authority = authority
        self._payload_store = payload_store
        """Whether this worker's data converter offloads large payloads; without one, tool arguments and results
        are bounded by default (`SnippetLimits.max_tool_args_bytes` / `max_tool_result_bytes`)."""
        self.conversations = ConversationCache()
        """Recent runs' conversations (`_conversations`): an input refers to the messages its worker already holds."""
        self._agents: dict[str, CodeModeAgent] = {}
        for agent in agents:
            if agent.name in self._agents:
                raise CodeModeUserError(f"two agents are named {agent.name!r}; agent names must be unique on a worker")
            self._agents[agent.name] = agent

    @property
    def agents(self) -> dict[str, CodeModeAgent]:
        """The served agents by name."""
        return dict(self._agents)

    def agent(self, name: str) -> CodeModeAgent:
        """The agent called `name`.

        Raises:
            AgentNotFoundError: no such agent is served here.

        """
        try:
            return self._agents[name]
        except KeyError:
            raise AgentNotFoundError(name, list(self._agents)) from None

    def all(self) -> list[Callable[..., Any]]:
        """Every activity to register on the worker."""
        return [self.describe_agent, self.model_request, self.check_output, self.after_run, self.on_run_error,
                self.seal_repl,
                self.compute, self.run_tool, self.run_batch, self.child_deps]

    @activity.defn(name=DESCRIBE_AGENT_ACTIVITY)
    async def describe_agent(self, name: str, deps: Any = None, deps_type: str | None = None,
                             model: str | None = None, instructions: str | None = None,
                             prompt: str | None = None) -> AgentSpec:
        """Record the agent's spec at the start of a run (with its deps: dynamic instructions and tools see them).

        The run's model is built here first: a missing key or unknown model fails the run at its first step, not
        retried. (`model` comes last, with a default: runs started before it was passed schedule three arguments.)
        The agent's `before_run` hooks see the run's `prompt` here; a guardrail that raises fails the run, not
        retried (`GuardrailError`).
        """
        try:
            spec = await describe_run(self.agent(name), deps, deps_type=deps_type, model=model,
                                      authority=self._authority, instructions=instructions, prompt=prompt)
        except (CodeModeUserError, GuardrailError) as e:
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from e
        if spec.limits.max_tool_args_bytes is None and not self._payload_store:
            # Resolved here and recorded: workflow code cannot see whether the worker has a payload store.
            spec.limits = replace(spec.limits, max_tool_args_bytes=AUTOMATIC_PAYLOAD_LIMIT_BYTES)
        spec.payload_store = self._payload_store
        seeded = spec.files.seeded_bytes if spec.files is not None else 0
        if seeded > CARRY_WITHOUT_STORE_BYTES and not self._payload_store:
            raise ApplicationError(
                f"agent {name!r}: its RunFiles seed folder holds {seeded:,} bytes of files, more than the "
                f"{CARRY_WITHOUT_STORE_BYTES:,} a run can record without a payload store (Temporal refuses payloads "
                "over 2 MiB): give the workers a payload store (CODEMODE_PAYLOAD_STORE), or seed fewer files",
                type="CodeModeUserError", non_retryable=True)
        return spec

    @activity.defn(name=COMPUTE_ACTIVITY)
    async def compute(self, request: ComputeRequest) -> ComputeResult:
        """A stretch of a program past its in-workflow budget: computed here, or recorded (`_compute`)."""
        return await heartbeating(compute_stretch(request))

    @activity.defn(name=SEAL_REPL_ACTIVITY)
    async def seal_repl(self, request: SealRequest) -> SealResult:
        """Seal a REPL dump's digest with this worker's key (see `_carry`); `seal=None` without a key."""
        mine = monty_version()
        key = self._repl_key
        return SealResult(seal=seal(key, request.digest, request.written_by or mine) if key else None,
                          monty_version=mine)

    @activity.defn(name=MODEL_REQUEST_ACTIVITY)
    async def model_request(self, input: ModelRequestInput) -> ModelResponse | ModelStep:
        """One request to the agent's model (or the run's override), heartbeating while it waits.

        pydantic-ai's own graph makes it, for one step (`CodeModeAgent.request`). With `input.hooks` (the run
        recorded that its agent has model-request hooks) the answer is a `ModelStep`: what the hooks did (a
        retry, a rewritten history) is data the run adopts; otherwise the response alone, the shape such runs
        recorded. The hooks may do I/O, and a retry of the activity runs them again.
        A model that cannot work (no key, unknown, package missing) and pydantic-ai's `UserError` are final; HTTP
        errors are retried unless they are client errors that would fail the same way again.
        """
        agent = self.agent(input.agent)
        subject = _subject("the model request")
        conversation = await self.conversations.resolve(carried_messages(input), input.earlier, subject=subject)
        tools = await self.conversations.tools(input.tools or [], input.tools_ref, subject=subject)
        try:
            step = await heartbeating(request_model(agent,
                input.model, conversation.messages, tools, deps=input.deps, model_settings=input.model_settings,
                output=input.output, native_tools=input.native_tools, hooked=input.hooks, usage=input.usage,
                run_step=input.run_step, output_retries=input.output_retries, stream=input.stream))
        except (CodeModeUserError, UserError, UnexpectedModelBehavior) as e:
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from e
        except ModelHTTPError as e:
            raise ApplicationError(str(e), type="ModelHTTPError", non_retryable=not _may_pass(e)) from e
        except FallbackExceptionGroup as e:
            # Every model of a `ModelFallback` chain failed: a retry of the activity walks the chain again from its
            # first model, unless every failure would repeat.
            raise ApplicationError(f"{e}: " + "; ".join(f"{type(x).__name__}: {x}" for x in e.exceptions),
                                   type="FallbackExceptionGroup",
                                   non_retryable=not any(_may_pass(x) for x in e.exceptions)) from e
        except Exception as e:
            bug = function_model_failure(input.agent, e)  # a scripted model's own bug: not retried as an outage
            if bug is not None:
                raise bug from e
            raise
        if step.response is not None and (not input.hooks or step.messages is None):
            self.conversations.answered(conversation, step.response)  # as the run's `SentConversation` does
        if input.hooks:
            return step
        # Without hooks nothing asks for a retry; a history pydantic-ai cleaned for sending (consecutive requests
        # merged) is what the model was sent, not a rewrite the run adopts (such runs record the response alone).
        if step.response is None or step.retry is not None:
            raise ApplicationError(
                f"agent {input.agent!r} asked for a retry in a model request of a run that recorded no model-request "
                "hooks (it started before the agent had them): finish or cancel the run on a worker with the agent "
                "as it was, or start a new run", type="CodeModeUserError", non_retryable=True)
        return step.response

    @activity.defn(name=OUTPUT_ACTIVITY)
    async def check_output(self, input: OutputInput) -> OutputVerdict:
        """Check a response that may end the run: its output, validated (and its validators run), or a retry.

        A rejection past the agent's output retry budget, a wrong deps type and pydantic-ai's `UserError` are final
        (the run fails with pydantic-ai's message); a validator's own transient failure is retried.
        """
        agent = self.agent(input.agent)
        conversation = await self.conversations.resolve(carried_messages(input), input.earlier,
                                                        subject=_subject("the output check"))
        try:
            return await heartbeating(check_output(
                agent, conversation.messages, input.response, retries=input.retries, deps=input.deps,
                model_settings=input.model_settings,
                recorded=(input.output_fingerprint, input.output_summary or "?") if input.output_fingerprint else None))
        except TRANSIENT as e:
            raise ApplicationError(message_of(e), type=type(e).__name__) from e
        except (CodeModeUserError, UserError, UnexpectedModelBehavior) as e:
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from e
        except Exception as e:
            raise ApplicationError(f"the output of agent {input.agent!r} could not be checked: "
                                   f"{type(e).__name__}: {message_of(e)}", type=type(e).__name__,
                                   non_retryable=True) from e

    @activity.defn(name=AFTER_RUN_ACTIVITY)
    async def after_run(self, input: AfterRunInput) -> Any:
        """The run's output after its capabilities' `after_run` hooks (`CodeModeAgent.after_run`), as JSON.

        The hooks may do I/O: a transient failure is retried; any other exception of a hook is final and fails the
        run with the hook's message (as it would fail `agent.run()`).
        """
        agent = self.agent(input.agent)
        conversation = await self.conversations.resolve(carried_messages(input), input.earlier,
                                                        subject=_subject("the after_run hooks"))
        try:
            return await heartbeating(after_run(agent, input.model, conversation.messages, input.output, input.usage,
                                                      deps=input.deps))
        except TRANSIENT as e:
            raise ApplicationError(message_of(e), type=type(e).__name__) from e
        except CodeModeUserError as e:  # its deps could not be built (`DepsFactoryError`)
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from e
        except Exception as e:
            raise ApplicationError(f"an after_run hook of agent {input.agent!r} failed the run: "
                                   f"{type(e).__name__}: {message_of(e)}", type=type(e).__name__,
                                   non_retryable=True) from e

    @activity.defn(name=RUN_ERROR_ACTIVITY)
    async def on_run_error(self, input: RunErrorInput) -> RunRecovery:
        """Whether the capabilities' `on_run_error` hooks recover a failed run, and with what output (JSON).

        The hooks get the failure rebuilt (`run_failure`). When they raise it back, none recovered the run: it fails
        as it would have. Another exception of theirs is final and fails the run with its message; a transient one
        is retried (the hooks may do I/O).
        """
        agent = self.agent(input.agent)
        error = run_failure(input.error_type, input.error_message)
        conversation = await self.conversations.resolve(carried_messages(input), input.earlier,
                                                        subject=_subject("the on_run_error hooks"))
        try:
            return RunRecovery(recovered=True, output=await heartbeating(
                on_run_error(agent, input.model, conversation.messages, input.usage, error, deps=input.deps)))
        except BaseException as e:
            if e is error:
                return RunRecovery(recovered=False)
            if isinstance(e, TRANSIENT):
                raise ApplicationError(message_of(e), type=type(e).__name__) from e
            if not isinstance(e, Exception):
                raise
            if isinstance(e, CodeModeUserError):  # its deps could not be built (`DepsFactoryError`)
                raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from e
            raise ApplicationError(f"an on_run_error hook of agent {input.agent!r} failed the run with "
                                   f"{type(e).__name__}: {message_of(e)} (the run had failed with "
                                   f"{input.error_type}: {input.error_message})", type=type(e).__name__,
                                   non_retryable=True) from e

    @activity.defn(name=CHILD_DEPS_ACTIVITY)
    async def child_deps(self, input: ChildDepsInput) -> ChildDeps:
        """Derive the deps of the child run a `child_run_tool(deps=...)` call starts, from the calling run's context.

        The function's transient errors (`ConnectionError`, `TransientToolError`) are retried within the tool's
        retry policy; any other is final, and the call fails in the program with its type and message.
        """
        agent = self.agent(input.agent)
        ctx = ToolCallContext(workflow_id=activity.info().workflow_id or "", call_id=input.call_id, tool=input.tool,
                              attempt=activity.info().attempt)

        async def derive() -> ChildDeps:
            deps = await agent.build_deps(input.deps)
            return await child_deps(agent, input.tool, agent.run_context(
                tool_name=input.tool, call_id=input.call_id, attempt=activity.info().attempt, deps=deps))

        with bind_call(ctx):
            try:
                return await heartbeating(derive())
            except Exception as e:
                raise tool_failure(input.tool, e) from e

    @activity.defn(dynamic=True)
    async def run_tool(self, args: Sequence[RawValue]) -> Any:
        """Serve the `<agent>.<tool>` activity types: validate the arguments, run the tool, classify failures."""
        info = activity.info()
        agent_name, _, tool_name = info.activity_type.rpartition(".")
        if not args:
            raise ApplicationError(f"activity {info.activity_type!r} got no input", non_retryable=True)
        payload = activity.payload_converter().from_payload(args[0].payload, ToolCallInput)
        call_id = call_id_of_activity(info.activity_id)
        try:
            agent = self.agent(agent_name)
        except AgentNotFoundError as e:
            raise ApplicationError(str(e), type="AgentNotFoundError", non_retryable=True) from e
        ctx = ToolCallContext(workflow_id=info.workflow_id or "", call_id=call_id, tool=tool_name,
                              attempt=info.attempt)
        usage = RunUsage()  # the tool's `ctx.usage`: what a sub-agent run adds is counted in the run (`_tool_usage`)

        async def call() -> Any:
            deps = await agent.deps_for_calls(payload.deps)  # once per activity
            return await call_tool(agent, tool_name, payload.args, call_id=call_id, attempt=info.attempt, deps=deps,
                                   recorded_schema=payload.schema_digest, usage=usage)

        with bind_call(ctx):
            try:
                result = await heartbeating(call())
            except Exception as e:
                raise tool_failure(tool_name, e) from e
        self._check_result_size(agent, tool_name, result)
        return with_usage(result, usage)

    @activity.defn(name=BATCH_ACTIVITY)
    async def run_batch(self, input: BatchInput) -> BatchResult:
        """Run the calls of one batch concurrently, each as its tool's own activity would (see `_batch`)."""
        try:
            agent = self.agent(input.agent)
        except AgentNotFoundError as e:
            raise ApplicationError(str(e), type="AgentNotFoundError", non_retryable=True) from e
        limit = agent.limits.max_tool_result_bytes
        budget = None if self._payload_store else limit or AUTOMATIC_PAYLOAD_LIMIT_BYTES
        return await run_batch(agent, input, check_result=lambda result: self._check_result_size(
            agent, input.tool, result), result_budget=budget)

    def _check_result_size(self, agent: CodeModeAgent, tool: str, result: Any) -> int:
        """The result's JSON size; raises when over the limit for one tool result.

        Without a payload store, a result over 2 MiB could not be recorded at all; refusing it here, below
        that, gives the program an error it can act on instead of the SDK's payload error.
        """
        size = len(to_json(result))
        limit = agent.limits.max_tool_result_bytes
        if limit is None:
            if self._payload_store:
                return size
            limit = AUTOMATIC_PAYLOAD_LIMIT_BYTES
        if size > limit:
            raise ApplicationError(
                f"{tool}() returned {size:,} bytes of JSON, over the {limit:,}-byte limit for one tool result "
                "(SnippetLimits.max_tool_result_bytes), so its result is not returned; the call did run. Ask for "
                "less per call (a page, a filter, a summary).",
                type="RuntimeError", non_retryable=True,
            )
        return size

