"""Child runs in workflow code: a `child_run_tool` call starts the sub-agent's run as a child workflow.

The child is an ordinary run of the sub-agent (same workflow, its own history); the parent waits for it at the
call, adds its usage to its own, and answers the call with its output (or its failure, as an exception the program
may catch). With `child_run_tool(deps=...)` the child's deps are derived from the parent's context in an activity
first; the child runs bound by a share of what the parent's usage limits leave (`_share`), and what it used before
stopping at one counts in the parent's. The parent lists the children it has in flight (`running`, the
`CHILD_RUNS_QUERY`): a client reads the calls each child waits on for a person from the child itself. A child still
tells its parent of those calls (`CHILD_APPROVALS_SIGNAL`), as recorded runs did, but anyone can send that signal,
so nothing lists calls from it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Protocol

from pydantic import TypeAdapter
from pydantic_ai.usage import RunUsage, UsageLimits
from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from ..shared._activity_io import ChildDeps, ChildDepsInput
from ..shared._approvals import ChildApprovals, ChildRun, PendingApproval
from ..shared._names import (
    AGENT_MEMO,
    AGENT_SEARCH_ATTRIBUTE,
    CHILD_APPROVALS_SIGNAL,
    CHILD_DEPS_ACTIVITY,
    STATUS_MEMO,
    STATUS_RUNNING,
    STATUS_SEARCH_ATTRIBUTE,
    WORKFLOW_TYPE,
    child_deps_activity_id,
    child_run_id,
)
from ..shared._records import RunResult
from ..shared._types import RunInput, ToolSpec

__all__ = ["ChildRunNotices", "ChildRuns"]


class ChildRunNotices(Protocol):
    """Who hears of a run's child runs starting and ending (`RunProgress`)."""

    def child_run_started(self, *, call_id: str, run_id: str, agent: str) -> None: ...

    def child_run_ended(self, *, call_id: str, run_id: str, error: str | None) -> None: ...

_AGENT_KEY = SearchAttributeKey.for_keyword(AGENT_SEARCH_ATTRIBUTE)
_STATUS_KEY = SearchAttributeKey.for_keyword(STATUS_SEARCH_ATTRIBUTE)


def _visibility(agent: str) -> dict[str, Any]:
    """A child run's agent and status where visibility finds them: as its parent was started (`_visibility`)."""
    info = workflow.info()
    if info.typed_search_attributes.get(_STATUS_KEY) is not None:
        return {"memo": {AGENT_MEMO: agent}, "search_attributes": TypedSearchAttributes([
            SearchAttributePair(_AGENT_KEY, agent), SearchAttributePair(_STATUS_KEY, STATUS_RUNNING)])}
    if STATUS_MEMO in info.raw_memo:
        return {"memo": {AGENT_MEMO: agent, STATUS_MEMO: STATUS_RUNNING}}
    return {}


class ChildRuns:
    """A run's child runs: starting them, the calls they wait on for a person, and telling its own parent."""

    def __init__(self) -> None:
        self.running: dict[str, ChildRun] = {}
        """The child runs this run started and waits on, by workflow id: written only by this run's own code."""
        self.pending: dict[str, list[PendingApproval]] = {}
        """The calls each child run waits on for a person, by the child's workflow id, as signals said (anyone may
        send one: kept only so a recorded run passes on what it passed on, `tell_parent`)."""
        self._told: list[PendingApproval] | None = None
        self._sends: list[asyncio.Future[None]] = []
        self._expected: set[str] = set()
        """Calls that start a child run, made and not started yet (`expect`): they share the limits' rest."""
        self._held: dict[str, UsageLimits] = {}
        """The share of the parent's usage limits each running child holds, by workflow id."""

    def waiting(self) -> list[PendingApproval]:
        """The children's calls waiting for a person, as their signals said (untrusted: see `pending`)."""
        return [p for calls in self.pending.values() for p in calls]

    def heard(self, news: ChildApprovals) -> None:
        """A child's calls waiting for a person, as it just said (a grandchild's keep their own `run_id`)."""
        if news.pending:
            self.pending[news.run_id] = [replace(p, run_id=p.run_id or news.run_id) for p in news.pending]
        else:
            self.pending.pop(news.run_id, None)

    def tell_parent(self, pending: list[PendingApproval]) -> None:
        """If this run is a child run, tell its parent the calls it waits on now (when they changed).

        A signal to the parent, in the order the run's approvals changed, so a replay sends the same ones.
        """
        parent = workflow.info().parent
        if parent is None or pending == self._told:
            return
        self._told = list(pending)
        handle = workflow.get_external_workflow_handle(parent.workflow_id)
        news = ChildApprovals(run_id=workflow.info().workflow_id, pending=list(pending))
        send = asyncio.ensure_future(handle.signal(CHILD_APPROVALS_SIGNAL, news))
        # A parent that closed meanwhile cannot be told: nothing to do about it, and nothing waits on the send.
        send.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._sends.append(send)

    def expect(self, call_id: str) -> None:
        """A call that starts a child run was just made (`_start_tool`, before any of them starts).

        It shares the usage limits' rest with the calls made with it (a gather's), which start after.
        """
        self._expected.add(call_id)

    def _share(self, call_id: str, limits: UsageLimits | None, used: RunUsage) -> UsageLimits | None:
        """The parent's usage limits as they bind a child run starting now: an even share of what they leave.

        What they leave is each limit less what the parent used and what its running children hold; it is split
        among the child runs made together and not yet started, this one among them. `None`: the parent has none.
        """
        starting = len(self._expected | {call_id})
        self._expected.discard(call_id)
        if limits is None:
            return None

        def left(limit: int | None, spent: int, field: str) -> int | None:
            if limit is None:
                return None
            held = sum(getattr(h, field) or 0 for h in self._held.values())
            return max(0, limit - spent - held) // starting

        return replace(
            limits, request_limit=left(limits.request_limit, used.requests, "request_limit"),
            tool_calls_limit=left(limits.tool_calls_limit, used.tool_calls, "tool_calls_limit"),
            input_tokens_limit=left(limits.input_tokens_limit, used.input_tokens, "input_tokens_limit"),
            output_tokens_limit=left(limits.output_tokens_limit, used.output_tokens, "output_tokens_limit"),
            total_tokens_limit=left(limits.total_tokens_limit, used.total_tokens, "total_tokens_limit"))

    async def _deps(self, spec: ToolSpec, call_id: str, *, agent: str, deps: Any) -> ChildDeps:
        """The child's deps, derived from the parent's context by `child_run_tool(deps=...)` in an activity.

        Raises:
            ActivityError: the `deps=` function failed (past the tool's retries when transient).

        """
        if not spec.child_deps:
            return ChildDeps()
        result: ChildDeps = await workflow.execute_activity(
            CHILD_DEPS_ACTIVITY, ChildDepsInput(agent=agent, tool=spec.name, call_id=call_id, deps=deps),
            result_type=ChildDeps, start_to_close_timeout=spec.timeout, retry_policy=spec.retry_policy,
            activity_id=child_deps_activity_id(call_id), summary=f"{spec.name}(): the deps of its {spec.child_run} run")
        return result

    async def run(self, spec: ToolSpec, args: dict[str, Any], call_id: str, *, started_by: str | None, agent: str,
                  deps: Any, limits: UsageLimits | None, usage: RunUsage, progress: ChildRunNotices,
                  stream: bool) -> tuple[RunResult[Any] | None, dict[str, str] | None]:
        """Run the sub-agent of `spec` on the call's `prompt`, as a child workflow: (its result, or the error).

        The child gets the deps `spec`'s tool derives from the parent's (`agent`'s run, whose recorded `deps` they
        are) and its share of the parent's `limits`; what it used is added to `usage`, the parent's (what it used
        before failing on a usage limit too). The error is the program's exception (`exc_type`, `message`): the
        child's own failure (a usage limit, its model's final error, no worker serving its agent), its deps that
        could not be derived, or arguments that are not one `prompt` string. `progress` hears when the child starts
        and ends; `stream`: the child streams its events too (as its parent does), so a subscriber can follow it
        from its `ChildRunStartEvent`.
        """
        try:
            return await self._run(spec, args, call_id, started_by=started_by, agent=agent, deps=deps, limits=limits,
                                   usage=usage, progress=progress, stream=stream)
        finally:
            self._expected.discard(call_id)  # started, refused or cancelled: it no longer waits for a share

    async def _run(self, spec: ToolSpec, args: dict[str, Any], call_id: str, *, started_by: str | None, agent: str,
                   deps: Any, limits: UsageLimits | None, usage: RunUsage, progress: ChildRunNotices,
                   stream: bool) -> tuple[RunResult[Any] | None, dict[str, str] | None]:
        assert spec.child_run is not None
        prompt = args.get("prompt")
        if not isinstance(prompt, str) or set(args) != {"prompt"}:
            return None, {"exc_type": "TypeError", "message": f"{spec.name}() takes one argument, prompt: str"}
        info = workflow.info()
        child_id = child_run_id(info.workflow_id, call_id)
        try:
            child_deps = await self._deps(spec, call_id, agent=agent, deps=deps)
        except ActivityError as e:
            kind, message = _failure(e)
            return None, {"exc_type": kind, "message": f"the deps of the {spec.child_run} run {child_id!r} could not "
                                                      f"be derived ({spec.name}'s deps=): {message}"}
        share = self._share(call_id, limits, usage)
        if share is not None:
            self._held[child_id] = share
        self.running[child_id] = ChildRun(run_id=child_id, call_id=call_id, agent=spec.child_run)
        progress.child_run_started(call_id=call_id, run_id=child_id, agent=spec.child_run)
        try:
            result: RunResult[Any] = await workflow.execute_child_workflow(
                WORKFLOW_TYPE, RunInput(agent=spec.child_run, prompt=prompt, started_by=started_by,
                                        deps=child_deps.deps, deps_type=child_deps.deps_type, usage_limits=share,
                                        stream=True if stream else None),
                id=child_id, task_queue=info.task_queue, result_type=RunResult,
                static_summary=f"{spec.name}(): a run of {spec.child_run}", **_visibility(spec.child_run))
        except ChildWorkflowError as e:
            kind, message = _failure(e)
            spent = _spent(e)
            if spent is not None:  # it stopped at a usage limit: what it used counts in the parent's, as it ran
                usage.incr(spent)
            progress.child_run_ended(call_id=call_id, run_id=child_id, error=f"{kind}: {message}")
            return None, {"exc_type": kind, "message": f"the {spec.child_run} run {child_id!r} failed: {message}"}
        finally:
            self.pending.pop(child_id, None)
            self.running.pop(child_id, None)
            self._held.pop(child_id, None)
        usage.incr(result.usage)
        progress.child_run_ended(call_id=call_id, run_id=child_id, error=None)
        return result, None


_USAGE = TypeAdapter(RunUsage)


def _cause(error: ActivityError | ChildWorkflowError) -> BaseException | None:
    cause = error.cause
    while isinstance(cause, (ActivityError, ChildWorkflowError)) and cause.cause is not None:  # a model request's
        cause = cause.cause
    return cause


def _failure(error: ActivityError | ChildWorkflowError) -> tuple[str, str]:
    """The type and message of the failure behind `error` (a child run's, its model request's, an activity's)."""
    cause = _cause(error)
    kind = cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause).__name__
    message = cause.message if isinstance(cause, ApplicationError) else str(cause or error)
    return kind, message


def _spent(error: ChildWorkflowError) -> RunUsage | None:
    """What a child run used before it failed on a usage limit (its failure's details), if it says."""
    cause = _cause(error)
    if not isinstance(cause, ApplicationError) or cause.type != "UsageLimitExceeded" or not cause.details:
        return None
    try:
        return _USAGE.validate_python(cause.details[0])
    except ValueError:
        return None
