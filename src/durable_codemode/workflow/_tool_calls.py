"""A run's tool calls in workflow code: direct calls of the model's, and the nested calls of its programs.

Each call is counted against the run's usage limits, waits for a person's decision when its tool needs one (or its
approval rule says so, recorded), and runs as its activity, in a batch, or as a child run (`child_run_tool`); its
outcome is settled as the answer a Monty program gets (`Settled`), never as a raised tool error. What a direct
call's outcome means for the model (a return, a retry, a run past a tool's retries) is `RunLoop`'s (`_loop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.messages import ModelRequestPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.usage import RunUsage, UsageLimits

    from ..shared._activity_io import ToolCallInput
    from ..shared._approvals import ApprovalRecord, PendingApproval
    from ..shared._names import approval_verdict_marker, tool_activity_id
    from ..shared._records import CallRecord
    from ..shared._results import PREVIEW_CHARS, call_summary, clip, one_line, preview
    from ..shared._tool_usage import split_usage
    from ..shared._types import RECORDED_RULE_VERDICTS, AgentSpec, ToolSpec
    from ._approval_state import Approvals, approval_rule, denial_message, rule_verdict
    from ._batch import ToolBatcher
    from ._child_runs import ChildRuns
    from ._event_stream import RunEventStream
    from ._loop import RunLoop, check_counted, unknown_tool
    from ._progress import RunProgress
    from ._sandbox_types import CallSite, Settled

__all__ = ["RunTools"]

#: Exception names the sandbox knows, so a tool's `KeyError` is a `KeyError` inside the program too.
_SANDBOX_EXCEPTIONS = frozenset({
    "ArithmeticError", "AssertionError", "AttributeError", "FileExistsError", "FileNotFoundError",
    "ImportError", "IndexError", "KeyError", "LookupError", "MemoryError", "NotImplementedError",
    "OSError", "OverflowError", "PermissionError", "RecursionError", "RuntimeError", "TimeoutError",
    "TypeError", "UnicodeDecodeError", "UnicodeEncodeError", "ValueError", "ZeroDivisionError",
})


def _raised(name: str | None, message: str) -> Settled:
    """The exception a program gets for a tool failure of type `name` (the same for single and batched calls)."""
    name = name or "RuntimeError"
    if name in _SANDBOX_EXCEPTIONS:
        return {"exc_type": name, "message": message}
    return {"exc_type": "RuntimeError", "message": f"{name}: {message}"}


def _tool_error(tool: str, error: ActivityError) -> Settled:
    """The exception a program gets for a tool activity that failed for good (`error`)."""
    cause = error.cause
    if isinstance(cause, ApplicationError):
        return _raised(cause.type, cause.message)
    if isinstance(cause, TemporalTimeoutError):
        return {"exc_type": "TimeoutError", "message": f"{tool}() timed out, and retries did not help"}
    if isinstance(cause, CancelledError):
        return {"exc_type": "RuntimeError", "message": f"{tool}() was cancelled"}
    return {"exc_type": "RuntimeError", "message": f"{tool}() failed: {cause or error}"}


@dataclass(kw_only=True)
class RunTools:
    """The tool calls of one workflow run of an agent run, with what they share of the run's state.

    Made when the run knows its spec (`CodeModeRunWorkflow.run`); `usage` and `approvals` are the run's own
    objects (its queries read them too), counted into in place.
    """

    spec: AgentSpec
    deps: Any
    started_by: str | None
    usage: RunUsage
    limits: UsageLimits | None
    approvals: Approvals
    progress: RunProgress
    children: ChildRuns
    batcher: ToolBatcher
    events: RunEventStream
    loop: RunLoop
    check_usage: Callable[[Callable[[UsageLimits], None]], None]
    """The workflow's `_check_usage`: a limit passed fails the run with pydantic-ai's message, not retried."""
    show_details: Callable[[], None]
    """The workflow's `_show_details`: the run's details and its parent hear of a call waiting for a person."""
    ruled_calls: int = field(default=0)
    """Calls to tools with an approval rule so far in this workflow run (`approval_verdict_marker`)."""

    async def direct_call(self, call: ToolCallPart) -> tuple[ModelRequestPart, CallRecord]:
        """Make a direct call of a function tool (not `run_code`), and answer it as the model's next request does."""
        part, record = await self._direct_call_answer(call)
        self.progress.tool_returned(part)
        return part, record

    async def _direct_call_answer(self, call: ToolCallPart) -> tuple[ToolReturnPart, CallRecord]:
        tool = self.spec.tool(call.tool_name)
        now = workflow.now()
        if tool is None or tool.in_sandbox:
            message = unknown_tool(call, self.spec.model_tools)
            record = CallRecord(call_id=call.tool_call_id, tool=call.tool_name, args=preview(call.args),
                                status="error", result=message, started_at=now, finished_at=now)
            return self.loop.retried(call, message, "unknown_tool"), record
        try:
            args = call.args_as_dict()
        except ValueError as e:
            record = CallRecord(call_id=call.tool_call_id, tool=call.tool_name, args=preview(call.args),
                                status="error", result=str(e), started_at=now, finished_at=now)
            self._count_tool_retry(tool)
            return self.loop.retried(call, f"The arguments are not valid JSON: {e}", "validation_error"), record
        settled, record = await self.start(call.tool_name, args, call.tool_call_id, CallSite(code="", line=0))
        if "return_value" in settled:
            self.loop.tool_succeeded(tool.name)
            return self.loop.returned(call, settled["return_value"]), record
        if record.status != "denied":  # a person's decision, not a mistake of the model's
            self._count_tool_retry(tool)
        failed = f"{settled['exc_type']}: {settled.get('message', '')}"
        return self.loop.retried(call, failed, "model_retry"), record

    def _count_tool_retry(self, tool: ToolSpec) -> None:
        """Count one retry of a direct call of `tool`; past its budget the run fails, as pydantic-ai's does."""
        if (failure := self.loop.tool_retried(tool.name, tool.max_retries)) is not None:
            raise ApplicationError(failure, type="UnexpectedModelBehavior", non_retryable=True)

    def start(
        self, tool: str, args: dict[str, Any], call_id: str, site: CallSite
    ) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        """Start one tool call: register its approval at once if it needs one, then run it as its activity."""
        self.progress.call_made(tool=tool, call_id=call_id, args=args, code=site.code, line=site.line)
        spec = self.spec.tool(tool)
        assert spec is not None, f"tool {tool!r} is not in the recorded spec"
        if self.limits is not None:  # (a copy of the usage per call costs more than the check)
            projected = replace(self.usage, tool_calls=self.usage.tool_calls + 1)
            self.check_usage(lambda u: u.check_before_tool_call(projected))
            self.check_usage(lambda u: check_counted(u, self.usage))
        self.usage.tool_calls += 1
        wait = None
        pending = None
        if spec.requires_approval or (spec.approval_rule and self._gated_by_rule(tool, call_id, args)):
            now = workflow.now()
            pending = PendingApproval(
                call_id=call_id, tool=tool, args=args, code=site.code, line=site.line, requested_at=now,
                expires_at=now + spec.approval_timeout if spec.approval_timeout else None)
            # Registered before the program next waits, so the REPL knows the program waits on a person.
            self.approvals.pending[call_id] = pending
            self.show_details()
            wait = self.approvals.wait(pending, spec.approval_timeout)
        elif spec.child_run is not None:  # with the child runs made beside it, it shares the usage limits' rest
            self.children.expect(call_id)
        call = self.progress.call(lambda: self._call_tool(spec, args, call_id, wait), tool=tool, call_id=call_id,
                                   args=args)
        if pending is not None:  # told after the call itself, which it belongs to
            self.progress.approval_waiting(pending, policy=spec.approvers.describe() if spec.approvers else None)
        return call

    def _gated_by_rule(self, tool: str, call_id: str, args: dict[str, Any]) -> bool:
        """Whether `tool`'s approval rule sends this call to a person: decided once, live, and recorded.

        Live, the rule is asked (`rule_verdict`) and a call it gates records a marker (`approval_verdict_marker`);
        a replay reads the marker instead of asking the rule, so a deploy that changes or drops the rule never
        changes an old run's replay, and a replay needs no rule. Runs recorded before (behaviour version 1) ask the
        rule on every replay, as they ran.
        """
        if self.spec.behavior_version < RECORDED_RULE_VERDICTS:
            return approval_rule(self.spec.agent, tool)(args)
        self.ruled_calls += 1
        marker = approval_verdict_marker(self.ruled_calls, call_id)
        if workflow.unsafe.is_replaying():
            return workflow.patched(marker)
        gated, why = rule_verdict(self.spec.agent, tool, args)
        if why is not None:
            workflow.logger.warning("run %s, call %s: %s", workflow.info().workflow_id, call_id, why)
        if gated:
            workflow.patched(marker)
        return gated

    async def _call_tool(
        self, spec: ToolSpec, args: dict[str, Any], call_id: str,
        approval: Coroutine[Any, Any, ApprovalRecord] | None,
    ) -> tuple[Settled, CallRecord]:
        """Run one tool call as its activity and settle it as a Monty answer; never raises a tool's error."""
        tool = spec.name
        if approval is not None:
            decision = await approval
            self.show_details()
            if not decision.approved:
                message = denial_message(decision)
                return {"exc_type": "PermissionError", "message": message}, CallRecord(
                    call_id=call_id, tool=tool, args=preview(args), status="denied", result=message,
                    started_at=decision.requested_at, finished_at=decision.decided_at)
        options: dict[str, Any] = {
            "start_to_close_timeout": spec.timeout,
            "retry_policy": spec.retry_policy,
            "activity_id": tool_activity_id(call_id, tool, args),
        }
        if spec.heartbeat_timeout is not None and not spec.local:
            options["heartbeat_timeout"] = spec.heartbeat_timeout
        args_text = one_line(args)  # once per call: the record's preview
        # The tool and call id are in the activity's type and id already. Temporal does not compare a summary on
        # replay, so runs recorded with the older summaries (`get("i": 0)`) replay unchanged, and a replay, which
        # writes no history, makes none.
        if not workflow.unsafe.is_replaying():
            options["summary"] = call_summary(tool, args)
        payload = ToolCallInput(args=args, deps=self.deps, schema_digest=spec.schema_digest)
        started = workflow.now()
        status: Any = "ok"
        settled: Settled
        if spec.child_run is not None:  # a `child_run_tool`: the sub-agent's run, as a child workflow
            child, error = await self.children.run(spec, args, call_id, started_by=self.started_by,
                                                    agent=self.spec.agent, deps=self.deps,
                                                    limits=self.limits, usage=self.usage,
                                                    progress=self.progress, stream=self.events.streams)
            if child is None:
                assert error is not None
                settled, status = _raised(error["exc_type"], error["message"]), "error"
            else:
                settled = {"return_value": child.output}
            return settled, self._record(call_id, tool, args_text, settled, status, started)
        if spec.batch and spec.in_sandbox and approval is None:
            answer = await self.batcher.submit(spec, call_id, args)
            if answer is not None:  # else a batch of one, or a deferred result: its own activity, below
                if isinstance(answer, ActivityError):
                    settled, status = _tool_error(tool, answer), "error"
                elif answer.kind == "ok":
                    settled = {"return_value": answer.value}
                    if answer.usage is not None:
                        self.usage.incr(answer.usage)
                else:
                    settled, status = _raised(answer.error_type, answer.message or ""), "error"
                return settled, self._record(call_id, tool, args_text, settled, status, started)
        try:
            if spec.local:
                result = await workflow.execute_local_activity(spec.activity_type, payload, **options)
            else:
                result = await workflow.execute_activity(spec.activity_type, payload, **options)
            value, added = split_usage(result)  # what a sub-agent run of the tool used counts in the run's usage
            if added is not None:
                self.usage.incr(added)
            settled = {"return_value": value}
        except ActivityError as e:
            settled, status = _tool_error(tool, e), "error"
        except asyncio.CancelledError:
            raise
        return settled, self._record(call_id, tool, args_text, settled, status, started)

    @staticmethod
    def _record(call_id: str, tool: str, args_text: str, settled: Settled, status: Any,
                started: datetime) -> CallRecord:
        result = preview(settled.get("return_value")) if status == "ok" else (
            f"{settled['exc_type']}: {settled.get('message', '')}")
        return CallRecord.made(call_id=call_id, tool=tool, args=clip(args_text, PREVIEW_CHARS), status=status,
                               result=result, started_at=started, finished_at=workflow.now())
