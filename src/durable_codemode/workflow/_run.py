"""The agent run as a Temporal workflow: model turns through an activity, `run_code` snippets in workflow code.

The loop is ours, not pydantic-ai's agent graph, because the workflow must own each turn: it records the agent's
spec once and replays with it, ends a run by continue-as-new in the same workflow task when a snippet hits its
compute limit, and keeps the history small (a nested call's activity carries only its tool, arguments and id).
pydantic-ai still supplies the models, the message format, the tools and their schemas.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RetryPolicy, VersioningBehavior
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelRequestPart,
        ModelResponse,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.usage import RunUsage, UsageLimits

    from ..shared._activity_io import (
        AfterRunInput,
        ModelRequestInput,
        ModelStep,
        ModelStreamTarget,
        OutputInput,
        OutputVerdict,
        RunErrorInput,
        RunRecovery,
    )
    from ..shared._carry import CarriedRepl, SealRequest, SealResult, carry_refused_note, digest
    from ..shared._files import CARRY_WITHOUT_STORE_BYTES, CarriedFiles
    from ..shared._names import (
        AFTER_RUN_ACTIVITY,
        DESCRIBE_AGENT_ACTIVITY,
        MODEL_REQUEST_ACTIVITY,
        OUTPUT_ACTIVITY,
        OUTPUT_CHECK_SUMMARY,
        RUN_ERROR_ACTIVITY,
        SEAL_REPL_ACTIVITY,
        STREAM_INFO_QUERY,
        WORKFLOW_TYPE,
    )
    from ..shared._records import CallRecord, RunResult, SnippetRecord, TurnRecord, bound_turns
    from ..shared._results import clip, printable
    from ..shared._run_events import EventStreamSettings
    from ..shared._types import (
        CONVERSATION_SENT_ONCE,
        RECORDED_END_STATUS,
        AgentSpec,
        Continuation,
        RunInput,
        behavior_version_refusal,
    )
    from ._approval_handlers import ApprovalHandlers
    from ._approval_state import Approvals, DecisionRules
    from ._batch import ToolBatcher
    from ._child_runs import ChildRuns
    from ._conversation import ConversationHandlers, SentConversation
    from ._event_stream import RunEventStream, StreamInfo
    from ._files import RunFilesystem
    from ._fingerprints import recorded_output
    from ._loop import (
        RunLoop,
        copied,
        count_response,
        model_requests_exhausted,
        run_code_args,
        with_note,
    )
    from ._observers import ApprovalState
    from ._progress import RunProgress
    from ._sandbox import Repl
    from ._sandbox_sessions import sandbox_sessions
    from ._sandbox_types import CallSite, Settled, SnippetOutcome
    from ._system_prompts import opening_parts, revalued
    from ._tool_calls import RunTools

__all__ = ["CodeModeRunWorkflow", "PinnedCodeModeRunWorkflow"]

_MODEL_TIMEOUT = timedelta(minutes=5)
_MODEL_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
"""A model request whose worker died (killed, OOM) is retried elsewhere after this, not after `_MODEL_TIMEOUT`:
the worker heartbeats while the request waits (`_heartbeat`)."""
_MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30),
                           maximum_attempts=5)
_DESCRIBE_TIMEOUT = timedelta(seconds=30)
_SEAL_TIMEOUT = timedelta(seconds=10)
_OUTPUT_TIMEOUT = timedelta(minutes=5)
"""Output validators may do I/O (a lookup, another model): as long as a model request may take."""

async def _run_deciding_activity(activity: str, arg: Any, *, result_type: type | None, summary: str) -> Any:
    """Run an output-deciding activity (the output check, `after_run`), whose final failure is the run's.

    Its `ApplicationError` (a validator's or hook's, by then past its retries or not retryable) ends the run with
    the same message and type, not retried: the workflow failure says what the user's code said, not "activity
    failed".
    """
    try:
        return await workflow.execute_activity(
            activity, arg, result_type=result_type, start_to_close_timeout=_OUTPUT_TIMEOUT,
            heartbeat_timeout=_MODEL_HEARTBEAT_TIMEOUT, retry_policy=_MODEL_RETRY, summary=summary)
    except ActivityError as e:
        cause = e.cause
        if isinstance(cause, ApplicationError):
            raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from e
        raise


def _failure_of(error: ApplicationError | ActivityError) -> tuple[str, str]:
    """The type and message a run's failure has: its own, or its activity's cause's (a model request's)."""
    failure = error.cause if isinstance(error, ActivityError) and error.cause is not None else error
    if isinstance(failure, ApplicationError):
        return failure.type or "ApplicationError", failure.message
    return type(failure).__name__, str(failure)


@workflow.defn(name=WORKFLOW_TYPE)
class CodeModeRunWorkflow(ApprovalHandlers, ConversationHandlers):
    """One agent run: model turns, `run_code` snippets, nested tool calls; returns a `RunResult`.

    Workers of a Worker Deployment serve it as `PinnedCodeModeRunWorkflow`, the same workflow declared pinned.
    """

    @workflow.init
    def __init__(self, input: RunInput) -> None:
        self._events = RunEventStream(input.stream_state)
        """The run's live event stream (hosted here from the start: Workflow Streams registers its handlers now;
        it publishes only once the run knows it streams)."""
        self._spec: AgentSpec | None = None
        self._deps: Any = None
        self._usage = RunUsage()
        self._usage_limits: UsageLimits | None = None
        self._run_loop = RunLoop(None, None, workflow.now)
        """What the model's responses mean, and the retry budgets (`_loop`): made again when the run knows its spec."""
        self._approvals = Approvals()
        self._progress = RunProgress(lambda: self._approvals)  # current details, status, spans (_observers)
        self._files: RunFilesystem | None = None
        self._output_tool_name: str | None = None
        self._children = ChildRuns()
        self._started_by: str | None = None
        self._tools: RunTools | None = None
        """The run's tool calls (`_tool_calls`), made when the run knows its agent (`run`)."""
        self._conversation = SentConversation(sends_once=False)
        """What the run's workers hold of its conversation (`_conversation`), known when the run knows its spec."""

    def _check_usage(self, check: Callable[[UsageLimits], None]) -> None:
        """Apply one of pydantic-ai's `UsageLimits` checks; past a limit the run fails with its message, not retried."""
        if self._usage_limits is None:
            return
        try:
            check(self._usage_limits)
        except UsageLimitExceeded as e:
            # What the run used rides along: a parent counts what its child run used before stopping (`_child_runs`).
            raise ApplicationError(str(e), self._usage, type="UsageLimitExceeded", non_retryable=True) from e

    @workflow.query(name=STREAM_INFO_QUERY)
    def stream_info(self) -> StreamInfo:
        """Whether the run streams its events, and the offsets its stream keeps (`durable_codemode.stream_events`)."""
        return replace(self._events.info(), calls=self._usage.tool_calls)


    @workflow.run
    async def run(self, input: RunInput) -> RunResult[Any]:
        self._progress.start(lambda: ApprovalState(pending=self.pending_approvals(), audit=list(self._approvals.audit)))
        cont = input.continuation
        if cont is None:
            spec = await workflow.execute_local_activity(
                DESCRIBE_AGENT_ACTIVITY,
                # The run's own instructions when it has some, then its prompt (what `before_run` hooks see): runs
                # recorded before passed four or five arguments (Temporal does not compare them on replay).
                args=[input.agent, input.deps, input.deps_type, input.model,
                      *([input.instructions] if input.instructions or input.prompt is not None else []),
                      *([input.prompt] if input.prompt is not None else [])],
                result_type=AgentSpec,
                start_to_close_timeout=_DESCRIBE_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=printable(f"describe agent {clip(input.agent, 200)}"),
            )
            cont = Continuation(spec=spec, usage=copied(input.usage), turns=[],
                                runs=0, new_message_index=len(input.message_history))
        self._spec = spec = cont.spec
        if (refusal := behavior_version_refusal(spec, workflow.info().workflow_id)) is not None:
            # Not an `ApplicationError`: it fails the workflow task, not the run, which waits as it was.
            raise refusal
        self._events.start(self._stream_settings(input, spec), agent=spec.agent, model=input.model or spec.model_name,
                           first=input.continuation is None)
        if self._events.streams:  # a run that does not stream has no such observer: it costs nothing
            self._progress.observe(self._events)
        self._deps = input.deps
        self._started_by = input.started_by
        self._usage, self._usage_limits = cont.usage, input.usage_limits
        self._run_loop = RunLoop(spec.output, spec.instructions, workflow.now, output_retries=cont.output_retries,
                                 tool_retries=dict(cont.tool_retries))
        self._approvals = Approvals(cont.approvals, DecisionRules(
            policy_of=lambda tool: getattr(spec.tool(tool), "approvers", None), signed=spec.signed_approvals,
            starter=input.started_by))
        self._approvals.on_decided = self._progress.approval_decided
        messages: list[ModelMessage] = list(input.message_history)
        self._conversation = SentConversation(messages, sends_once=spec.behavior_version >= CONVERSATION_SENT_ONCE)
        now = workflow.now()
        # As pydantic-ai does for a run given a history: its dynamic system prompts get the values of this run.
        appended = revalued(spec, messages, now) if messages and input.continuation is None else []
        if input.prompt is not None:
            # As pydantic-ai does: system prompts open a new conversation, not one continued from a history.
            system = opening_parts(spec, now) if not messages and input.continuation is None else []
            messages.append(ModelRequest(parts=[*appended, *system, UserPromptPart(input.prompt, timestamp=now)],
                                         instructions=spec.instructions, timestamp=now))
        elif appended and isinstance(messages[-1], ModelRequest):  # the history's last request is the one sent
            messages[-1] = replace(messages[-1], parts=[*appended, *messages[-1].parts])
        if not messages or not isinstance(messages[-1], ModelRequest):
            raise ApplicationError(
                "nothing to answer: give a prompt, or a message history that ends with a request",
                type="InvalidRunInput", non_retryable=True,
            )
        if spec.files is not None:
            self._files = RunFilesystem(spec.files, cont.files)
        self._tools = RunTools(
            spec=spec, deps=self._deps, started_by=self._started_by, usage=self._usage, limits=self._usage_limits,
            approvals=self._approvals, progress=self._progress, children=self._children, events=self._events,
            batcher=ToolBatcher(spec.agent, input.deps, args_limit=spec.limits.max_tool_args_bytes),
            loop=self._run_loop, check_usage=self._check_usage, show_details=self._show_details)
        repl = Repl(spec, self._start_tool, sandbox_sessions(),
                    awaiting_person=lambda call_id: call_id in self._approvals.pending,
                    files=self._files, notices=self._progress)
        if cont.repl is not None:
            refused = await self._restore_repl(cont.repl, repl)
            if refused is not None:
                messages = with_note(messages, carry_refused_note(refused), workflow.now())
        try:
            return await self._progress.run(self._body(input, cont, messages, repl), agent=spec.agent,
                                            run_index=cont.runs,
                                            records_end=spec.behavior_version >= RECORDED_END_STATUS)
        finally:
            repl.release_reservation()
            repl.close()

    @staticmethod
    def _stream_settings(input: RunInput, spec: AgentSpec) -> EventStreamSettings | None:
        """How the run streams: as the run asks (`RunInput.stream`), else as its agent says (recorded)."""
        if input.stream is False:
            return None
        if input.stream is True:
            return spec.stream or EventStreamSettings()
        return spec.stream

    async def _body(
        self, input: RunInput, cont: Continuation, messages: list[ModelMessage], repl: Repl
    ) -> RunResult[Any]:
        """The run's loop, then its end, as `agent.run()` orders them.

        The capabilities' `on_run_error` hooks may recover a failure of the loop (not one of `before_run` or
        `after_run`: pydantic-ai's do not see those either), and `after_run` sees the output.
        """
        try:
            output = await self._loop(input, cont, messages, repl)
        except (ApplicationError, ActivityError) as e:
            if not cont.spec.run_error_hooks or (isinstance(e, ActivityError) and isinstance(e.cause, CancelledError)):
                raise
            error_type, message = _failure_of(e)
            earlier, sent = self._conversation.refer(messages)
            recovery: RunRecovery = await _run_deciding_activity(
                RUN_ERROR_ACTIVITY,
                RunErrorInput(agent=cont.spec.agent, model=input.model, messages=None if earlier else sent,
                              earlier=earlier, new_messages=sent if earlier else [], usage=cont.usage,
                              error_type=error_type, error_message=message, deps=input.deps),
                result_type=RunRecovery,
                summary=printable(f"on_run_error hooks ({clip(error_type, 200)})"),
            )
            if not recovery.recovered:
                raise  # as it would have failed without the hooks
            output = recovery.output
        return await self._finish(input, messages, output, cont)

    async def _loop(
        self, input: RunInput, cont: Continuation, messages: list[ModelMessage], repl: Repl
    ) -> Any:
        """Model requests and their tool calls until the output is decided: the decided output (JSON).

        What each response means is `RunLoop`'s to say (`_loop`); this drives it with activities and the REPL.
        """
        spec, loop = cont.spec, self._run_loop
        limits = spec.limits
        usage, turns = cont.usage, cont.turns
        snippets_this_run = 0
        while True:
            self._check_usage(lambda u: u.check_before_request(usage))
            if (exhausted := model_requests_exhausted(usage, limits.max_model_requests)) is not None:
                raise ApplicationError(exhausted, type="ModelRequestLimitExceeded", non_retryable=True)
            if snippets_this_run >= limits.max_snippets_per_run or workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new_between_turns(input, cont, messages, repl)
            index = len(turns)
            if spec.code_mode:
                repl.reserve_session()
            hooked = spec.model_request_hooks  # recorded: runs from before hooks applied keep their bare responses
            earlier, sent = self._conversation.refer(messages)
            tools_ref, tools = self._conversation.refer_tools(spec.model_tools)
            answer = await self._progress.model_request(workflow.execute_activity(
                MODEL_REQUEST_ACTIVITY,
                ModelRequestInput(agent=spec.agent, model=input.model, messages=None if earlier else sent,
                                  earlier=earlier, new_messages=sent if earlier else [],
                                  tools=None if tools_ref else tools, tools_ref=tools_ref,
                                  deps=input.deps, model_settings=input.model_settings, output=spec.output,
                                  hooks=hooked, usage=usage if hooked else None,
                                  run_step=usage.requests + 1 if hooked else 0,
                                  output_retries=loop.output_retries if hooked else 0,
                                  native_tools=spec.native_tools, stream=self._model_stream(index)),
                result_type=ModelStep if hooked else ModelResponse,
                start_to_close_timeout=_MODEL_TIMEOUT,
                heartbeat_timeout=_MODEL_HEARTBEAT_TIMEOUT,
                retry_policy=_MODEL_RETRY,
                summary=f"model turn {index}",
            ), turn=index, model=input.model)
            if isinstance(answer, ModelStep):
                # The hooks' effect, as recorded: the history they rewrote (`ProcessHistory`), a retry they asked for.
                if answer.messages is not None:
                    messages[:] = answer.messages
                elif answer.response is not None:
                    self._conversation.answered(messages, answer.response)
                if answer.response is None or answer.retry is not None:
                    if answer.response is not None:
                        count_response(usage, answer.response)
                        messages.append(answer.response)
                    assert answer.retry is not None, "a model step without a response asks for a retry"
                    messages.append(loop.hook_retry(answer.retry))
                    continue
                response = answer.response
            else:
                response = answer
                self._conversation.answered(messages, response)
            count_response(usage, response)
            self._check_usage(lambda u: u.check_tokens(usage))
            messages.append(response)
            reading = loop.read(response)
            turn = TurnRecord(index=index, text=reading.text)
            turns.append(turn)
            if reading.answer is not None:
                return reading.answer
            if reading.empty:
                messages.append(loop.no_output())
                continue
            calls, functions, output_calls = reading.calls, reading.functions, reading.output_calls
            retry_parts: list[ModelRequestPart] = []
            if reading.check_first:
                verdict = await self._check_output(input, messages[:-1], response, functions, index,
                                                   counts=not reading.maybe_text)
                if verdict.retry is None:
                    return self._closed(messages, calls, verdict, [])
                if not functions:
                    messages.append(loop.request(list(verdict.retry.parts)))
                    continue
                retry_parts = [] if reading.maybe_text else list(verdict.retry.parts)
            parts: list[ModelRequestPart] = []
            self._progress.tool_calls(functions)
            direct = [c for c in functions if not loop.is_run_code(c)]
            direct_results = [asyncio.ensure_future(self._direct_call(c)) for c in direct]
            for call in functions:
                if not loop.is_run_code(call):
                    continue
                snippets_this_run += 1
                part, outcome = await self._run_code(call, repl, turn)
                if isinstance(part, ToolReturnPart):
                    self._progress.tool_returned(part)
                parts.append(part)
                if outcome is not None and outcome.ends_run:
                    # Every tool call of the response needs an answer, or the next request is malformed.
                    restarted = loop.restarted(calls, parts)
                    for future in direct_results:
                        future.cancel()
                    messages.append(restarted)
                    self._continue_as_new(input, cont, messages, note=outcome.kind)
            for part, record in await asyncio.gather(*direct_results):
                parts.append(part)
                turn.direct_calls.append(record)
            if output_calls:  # end_strategy graceful / exhaustive: the function tools ran first
                verdict = (loop.suppressed_output(parts, output_calls)
                           or await self._check_output(input, messages[:-1], response, functions, index))
                if verdict.retry is None:
                    return self._closed(messages, calls, verdict, parts)
                retry_parts = list(verdict.retry.parts)
            messages.append(loop.request(loop.in_call_order(calls, parts + retry_parts)))

    def _model_stream(self, turn: int) -> ModelStreamTarget | None:
        settings = self._events.settings
        if settings is None or not settings.model_deltas:
            return None
        return ModelStreamTarget(turn=turn, batch_interval=settings.model_batch_interval)

    async def _finish(self, input: RunInput, messages: list[ModelMessage], output: Any,
                      cont: Continuation) -> RunResult[Any]:
        """End the run with `output`, through the capabilities' `after_run` hooks when it recorded that it has any."""
        if cont.spec.after_run_hooks:
            earlier, sent = self._conversation.refer(messages)
            output = await _run_deciding_activity(
                AFTER_RUN_ACTIVITY,
                AfterRunInput(agent=cont.spec.agent, model=input.model, messages=None if earlier else sent,
                              output=output, usage=cont.usage, deps=input.deps, earlier=earlier,
                              new_messages=sent if earlier else []),
                result_type=None,
                summary="after_run hooks",
            )
        return self._result(output, cont, messages)

    def _closed(self, messages: list[ModelMessage], calls: list[ToolCallPart], verdict: OutputVerdict,
                answered: list[ModelRequestPart]) -> Any:
        """`verdict`'s output, once the request pydantic-ai ends such a run's messages with is added to them.

        That request answers the final response's tool calls: the output tool's (`verdict.closing`, from the output
        activity), the function calls that ran (`answered`), and the others as not run, so the conversation can be
        continued (`RunResult.all_messages()`). Verdicts recorded before `closing` existed add nothing.
        """
        self._output_tool_name = verdict.output_tool
        if (closing := self._run_loop.closing(calls, verdict, answered)) is not None:
            messages.append(closing)
        return verdict.output

    def _result(self, output: Any, cont: Continuation, messages: list[ModelMessage]) -> RunResult[Any]:
        bound_turns(cont.turns)
        return RunResult(output=output, usage=cont.usage, turns=cont.turns, continued_as_new=cont.runs,
                         approvals=self._approvals.audit, messages=list(messages),
                         new_message_index=min(cont.new_message_index, len(messages)),
                         output_tool_name=self._output_tool_name, run_id=workflow.info().workflow_id)

    async def _check_output(
        self, input: RunInput, before: list[ModelMessage], response: ModelResponse, functions: list[ToolCallPart],
        index: int, *, counts: bool = True,
    ) -> OutputVerdict:
        """Ask the output activity whether `response` (without its function calls) ends the run.

        A rejection counts against the agent's output retries (carried across continue-as-new) unless `counts` is
        false; past them, or on another final failure, the run fails with pydantic-ai's message, not retried.
        """
        assert self._spec is not None
        shape = recorded_output(self._spec.output)
        candidate = self._run_loop.output_candidate(response, functions)
        earlier, sent = self._conversation.refer(before)
        verdict: OutputVerdict = await _run_deciding_activity(
            OUTPUT_ACTIVITY,
            OutputInput(agent=self._spec.agent, model=input.model, messages=None if earlier else sent, earlier=earlier,
                        new_messages=sent if earlier else [], response=candidate,
                        retries=self._run_loop.output_retries, deps=input.deps, model_settings=input.model_settings,
                        output_fingerprint=shape.fingerprint, output_summary=shape.summary()),
            result_type=OutputVerdict,
            summary=f"{OUTPUT_CHECK_SUMMARY}{index}",
        )
        self._run_loop.output_checked(verdict, counts=counts)
        return verdict

    async def _run_code(
        self, call: ToolCallPart, repl: Repl, turn: TurnRecord
    ) -> tuple[ModelRequestPart, SnippetOutcome | None]:
        args, refused = run_code_args(call)
        if refused is not None:
            self._progress.run_code_refused(call_id=call.tool_call_id, args=args)
            return self._run_loop.retried(call, refused, "validation_error"), None
        code, restart = args["code"], args.get("restart", False)
        outcome = await self._progress.snippet(repl.run(code, run_code_id=call.tool_call_id, restart=restart),
                                               call_id=call.tool_call_id, code=code)
        turn.snippets.append(SnippetRecord(call_id=call.tool_call_id, code=code, outcome=outcome.kind,
                                           result=outcome.summary, calls=outcome.calls,
                                           computed_seconds=outcome.computed_seconds, files=outcome.files,
                                           files_omitted=outcome.files_omitted))
        if outcome.kind == "rejected":
            return self._run_loop.retried(call, outcome.content, "validation_error"), outcome
        return self._run_loop.returned(call, outcome.content), outcome

    def _start_tool(
        self, tool: str, args: dict[str, Any], call_id: str, site: CallSite
    ) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        """Start one tool call of a program (the REPL's `start_tool`): `RunTools.start`."""
        assert self._tools is not None, "a run calls tools only once it knows its agent"
        return self._tools.start(tool, args, call_id, site)

    async def _direct_call(self, call: ToolCallPart) -> tuple[ModelRequestPart, CallRecord]:
        assert self._tools is not None, "a run calls tools only once it knows its agent"
        return await self._tools.direct_call(call)

    async def _seal(self, request: SealRequest) -> SealResult:
        result: SealResult = await workflow.execute_local_activity(
            SEAL_REPL_ACTIVITY, request, result_type=SealResult, start_to_close_timeout=_SEAL_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=3), summary="seal the REPL")
        return result

    async def _restore_repl(self, carried: CarriedRepl, repl: Repl) -> str | None:
        """Load the REPL the last run carried, if its seal holds; else why not (for the model's note)."""
        dump = carried.dump()
        if digest(dump) != carried.digest:
            return "its dump does not match its digest"
        check = await self._seal(SealRequest(digest=carried.digest, written_by=carried.monty_version))
        if check.seal is None:
            return "this worker has no REPL key (CODEMODE_REPL_KEY)"
        if not hmac.compare_digest(check.seal, carried.seal):
            return "its seal does not check out under this worker's REPL key"
        if check.monty_version != carried.monty_version:
            return f"it was written by pydantic-monty {carried.monty_version}; this worker runs {check.monty_version}"
        repl.preload(dump, lenient_names=carried.lenient_names)
        return None

    async def _continue_as_new_between_turns(
        self, input: RunInput, cont: Continuation, messages: list[ModelMessage], repl: Repl
    ) -> None:
        """Continue as new at a turn boundary (snippet cap, Temporal's suggestion), carrying the REPL if it can."""
        dump = repl.idle_dump
        if dump is None:
            self._continue_as_new(input, cont, messages, note=None)
        limit = cont.spec.limits.max_carried_repl_bytes
        if len(dump) > limit:
            refused = (f"it is {len(dump):,} bytes, over SnippetLimits.max_carried_repl_bytes "
                                   f"({limit:,})")
        else:
            sealed = await self._seal(SealRequest(digest=digest(dump)))
            if sealed.seal is not None:
                carried = CarriedRepl.of(dump, written_by=sealed.monty_version, sealed=sealed.seal,
                                         lenient_names=repl.lenient_names)
                self._continue_as_new(input, cont, messages, note=None, repl=carried)
            refused = "the worker has no REPL key: set CODEMODE_REPL_KEY on every worker to carry it"
        # Say so, or the model's next program would trip over variables that are gone.
        self._continue_as_new(input, cont, with_note(messages, carry_refused_note(refused), workflow.now()), note=None)

    def _continue_as_new(
        self, input: RunInput, cont: Continuation, messages: list[ModelMessage], *, note: str | None,
        repl: CarriedRepl | None = None,
    ) -> NoReturn:
        bound_turns(cont.turns)
        files, refused = self._carried_files(cont.spec)
        if refused is not None:
            messages = with_note(messages, refused, workflow.now())
        self._progress.continuing(run_index=cont.runs + 1)
        workflow.continue_as_new(RunInput(
            agent=input.agent,
            message_history=messages,
            model=input.model,
            deps=input.deps,
            deps_type=input.deps_type,
            model_settings=input.model_settings,
            usage_limits=input.usage_limits,
            usage=input.usage,
            started_by=input.started_by,
            instructions=input.instructions,
            stream=input.stream,
            stream_state=self._events.carried(),
            continuation=Continuation(spec=cont.spec, usage=cont.usage, turns=cont.turns, runs=cont.runs + 1,
                                      note=note, approvals=self._approvals.audit, repl=repl,
                                      output_retries=self._run_loop.output_retries,
                                      tool_retries=self._run_loop.tool_retries,
                                      files=files, new_message_index=cont.new_message_index),
        ))

    def _carried_files(self, spec: AgentSpec) -> tuple[CarriedFiles | None, str | None]:
        """The run's written files for the next run, and the model's note if they cannot be carried.

        Without a payload store they must fit the continue-as-new input (Temporal refuses payloads over 2 MiB).
        """
        if self._files is None:
            return None, None
        size = self._files.size  # seeded files too: they travel in the spec
        if size > CARRY_WITHOUT_STORE_BYTES and not spec.payload_store:
            return None, (
                f"[durable-codemode] This long run continued in a fresh workflow run, and the files your programs "
                f"wrote are gone: the run's files came to {size:,} bytes, more than the "
                f"{CARRY_WITHOUT_STORE_BYTES:,} a run can carry without a payload store. The seeded files are still "
                "there. Keep fewer or smaller files (the agent's operator can give the workers a payload store: "
                "CODEMODE_PAYLOAD_STORE).")
        return self._files.carry(), None


@workflow.defn(name=WORKFLOW_TYPE, versioning_behavior=VersioningBehavior.PINNED)
class PinnedCodeModeRunWorkflow(CodeModeRunWorkflow):
    """The run workflow as the workers of a Worker Deployment serve it (`create_worker(deployment=...)`): pinned.

    A run stays on the version whose workers started it (its continue-as-new runs and child runs too, which inherit
    it) until it ends or is moved (`client/_deploys.move_run`): its recorded spec, rules and stubs belong to that
    version's code. Temporal's AUTO_UPGRADE would move a paused run onto new code at its next workflow task,
    unchecked. A class of its own because temporalio 1.35 refuses a workflow that declares a versioning behaviour on
    a worker without worker versioning ("versioning behavior cannot be specified without deployment options"), so
    unversioned workers (and replays) serve `CodeModeRunWorkflow`, the same workflow type.
    """

    @workflow.init
    def __init__(self, input: RunInput) -> None:
        super().__init__(input)

    @workflow.run
    async def run(self, input: RunInput) -> RunResult[Any]:
        return await super().run(input)
