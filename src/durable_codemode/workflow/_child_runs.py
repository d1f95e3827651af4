"""Child runs in workflow code: a `child_run_tool` call starts the sub-agent's run as a child workflow.

The child is an ordinary run of the sub-agent (same workflow, its own history); the parent waits for it at the
call, adds its usage to its own, and answers the call with its output (or its failure, as an exception the program
may catch). The parent lists the children it has in flight (`running`, the `CHILD_RUNS_QUERY`): a client reads the
calls each child waits on for a person from the child itself. A child still tells its parent of those calls
(`CHILD_APPROVALS_SIGNAL`), as recorded runs did, but anyone can send that signal, so nothing lists calls from it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from .._approvals import ChildApprovals, ChildRun, PendingApproval
from .._names import (
    AGENT_MEMO,
    AGENT_SEARCH_ATTRIBUTE,
    CHILD_APPROVALS_SIGNAL,
    STATUS_MEMO,
    STATUS_RUNNING,
    STATUS_SEARCH_ATTRIBUTE,
    WORKFLOW_TYPE,
    child_run_id,
)
from .._types import RunInput, RunResult, ToolSpec

__all__ = ["ChildRuns"]

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

    async def run(self, spec: ToolSpec, args: dict[str, Any], call_id: str, *,
                  started_by: str | None) -> tuple[RunResult[Any] | None, dict[str, str] | None]:
        """Run the sub-agent of `spec` on the call's `prompt`, as a child workflow: (its result, or the error).

        The error is the program's exception (`exc_type`, `message`): the child's own failure (a usage limit, its
        model's final error, no worker serving its agent), or arguments that are not one `prompt` string.
        """
        assert spec.child_run is not None
        prompt = args.get("prompt")
        if not isinstance(prompt, str) or set(args) != {"prompt"}:
            return None, {"exc_type": "TypeError", "message": f"{spec.name}() takes one argument, prompt: str"}
        info = workflow.info()
        child_id = child_run_id(info.workflow_id, call_id)
        self.running[child_id] = ChildRun(run_id=child_id, call_id=call_id, agent=spec.child_run)
        try:
            result: RunResult[Any] = await workflow.execute_child_workflow(
                WORKFLOW_TYPE, RunInput(agent=spec.child_run, prompt=prompt, started_by=started_by),
                id=child_id, task_queue=info.task_queue, result_type=RunResult,
                static_summary=f"{spec.name}(): a run of {spec.child_run}", **_visibility(spec.child_run))
        except ChildWorkflowError as e:
            cause = e.cause
            while isinstance(cause, ActivityError) and cause.cause is not None:  # its model request's own failure
                cause = cause.cause
            kind = cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause).__name__
            message = cause.message if isinstance(cause, ApplicationError) else str(cause or e)
            return None, {"exc_type": kind, "message": f"the {spec.child_run} run {child_id!r} failed: {message}"}
        finally:
            self.pending.pop(child_id, None)
            self.running.pop(child_id, None)
        return result, None
