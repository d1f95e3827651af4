"""A run's observers (`RunTelemetry`): the hooks the run workflow calls at each of its steps.

What a run does is observed here, never through the workflow's own methods: tracing's spans are one observer
(`_tracing`, attached by a tracing worker's interceptor), the history tools' replays another (`history/_capture`),
and a streaming run's live event stream a third (`_event_stream`). Observers run in workflow code, so they are
replayed: they issue no command and change nothing the run decides.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio import workflow

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart

    from ..shared._approvals import ApprovalRecord, PendingApproval
    from ..shared._records import CallRecord, RunResult
    from ._approval_state import Approvals
    from ._sandbox_types import Settled, SnippetOutcome

__all__ = ["NO_TELEMETRY", "ApprovalState", "RunTelemetry", "observe_run", "run_telemetry"]

T = TypeVar("T")

_OBSERVERS_ATTR = "_durable_codemode_observers"
"""The observers attached to a workflow run (`observe_run`), on its workflow instance."""


@dataclass(frozen=True)
class ApprovalState:
    """What a run waits for and what was decided, as it stands (`RunTelemetry.approvals`)."""

    pending: list[PendingApproval]
    """The calls waiting for a person, its child runs' included, as the `pending_approvals` query lists them."""
    audit: list[ApprovalRecord]
    """Every decision so far, in order, those the run started with included."""


class RunTelemetry:
    """An observer of one workflow run: the hooks the run workflow calls at each of its steps.

    Two kinds of hook: the wrapping ones (`run`, `model_request`, `snippet`, `call`) get the step's awaitable
    and return one that awaits it (a span around it); the notices (`approvals`, `call_made`, `run_code_refused`,
    `printed`, the approval and child-run notices, ...) return nothing. An observer must not change what the
    workflow does: it issues no command, and a wrapped awaitable's result (or exception) is handed on as it is.

    Observers are attached to a run before it starts, by a workflow interceptor (`observe_run`): the spans of a
    tracing worker, and the history tools' replays (`history/_capture`); and by the run itself, its live event
    stream when it streams (`workflow/_event_stream`). This base is the "off" case: every hook
    returns its awaitable unchanged and ignores its notices.
    """

    def run(self, coro: Coroutine[Any, Any, RunResult[Any]], *, agent: str, run_index: int
            ) -> Coroutine[Any, Any, RunResult[Any]]:
        """The run span around the run's loop."""
        return coro

    def approvals(self, state: Callable[[], ApprovalState]) -> None:
        """As the run starts, before it awaits anything: `state()` reads the run's approvals at any later moment."""

    def model_request(self, coro: Coroutine[Any, Any, ModelResponse], *, turn: int, model: str | None
                      ) -> Coroutine[Any, Any, ModelResponse]:
        """A model-request span around the activity."""
        return coro

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        """A `run_code` span around the snippet; the calls it makes become its children."""
        return coro

    def run_code_refused(self, *, call_id: str, args: dict[str, Any]) -> None:
        """A `run_code` call with arguments it does not take: no snippet runs, the model is asked again.

        `args` as the model sent them (`{}` if they were not JSON).
        """

    def call_made(self, *, tool: str, call_id: str, args: dict[str, Any], code: str, line: int) -> None:
        """The program makes a tool call at `line` (1-based) of its `code`, or the model does (`line` 0, no code).

        The first thing the workflow does with the call, before it counts it against the usage limits or asks
        its approval rule: either may stop the workflow task, and an observer then still knows which call did.
        """

    def call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], *, tool: str, call_id: str,
             args: dict[str, Any], approvals: Approvals) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        """A nested- (or direct-) call span around one tool call, its approval wait included."""
        return coro

    def tool_calls(self, calls: Sequence[ToolCallPart]) -> None:
        """The model's function tool calls of one response are about to run (`run_code` and direct tools)."""

    def tool_returned(self, part: ToolReturnPart) -> None:
        """One of them is answered: `part` goes back to the model (a retry request when `part.outcome` says so)."""

    def printed(self, *, call_id: str, text: str) -> None:
        """The program of `run_code` call `call_id` printed `text` since its last notice.

        Given whenever the program next waits on Temporal, and at its end: at points a replay reaches with the same
        text, so an observer that numbers what it is told numbers it the same on replay.
        """

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None:
        """The program of `run_code` call `call_id` computed past its in-workflow budget.

        The compute activity goes on from its last dump (`stretch` 0: from its start).
        """

    def approval_waiting(self, pending: PendingApproval, *, policy: str | None) -> None:
        """A call starts waiting for a person (`policy`: who may decide, in words; `None`: anyone accepted)."""

    def approval_decided(self, record: ApprovalRecord) -> None:
        """A waiting call was decided (by a person, or its timeout).

        `record.settled` is false for one approval of several the policy requires.
        """

    def child_run_started(self, *, call_id: str, run_id: str, agent: str) -> None:
        """Call `call_id` starts a child run `run_id` of `agent` (`child_run_tool`)."""

    def child_run_ended(self, *, call_id: str, run_id: str, error: str | None) -> None:
        """The child run of call `call_id` ended: completed (`error` is `None`) or failed."""

    def continuing(self, *, run_index: int) -> None:
        """The run continues as new workflow run number `run_index`.

        In this workflow task: nothing is awaited between this notice and the continue-as-new.
        """

    @contextmanager
    def run_parent(self) -> Iterator[None]:
        """Make the run span's parent context current (for continue-as-new)."""
        yield


NO_TELEMETRY = RunTelemetry()
"""No observer."""


class _Observers(RunTelemetry):
    """Several observers of one run as one: each notice goes to all, each awaitable is wrapped by all.

    The first attached wraps outermost.
    """

    def __init__(self, observers: Sequence[RunTelemetry]) -> None:
        self._all = list(observers)

    def run(self, coro: Coroutine[Any, Any, RunResult[Any]], *, agent: str, run_index: int
            ) -> Coroutine[Any, Any, RunResult[Any]]:
        for observer in reversed(self._all):
            coro = observer.run(coro, agent=agent, run_index=run_index)
        return coro

    def approvals(self, state: Callable[[], ApprovalState]) -> None:
        for observer in self._all:
            observer.approvals(state)

    def model_request(self, coro: Coroutine[Any, Any, ModelResponse], *, turn: int, model: str | None
                      ) -> Coroutine[Any, Any, ModelResponse]:
        for observer in reversed(self._all):
            coro = observer.model_request(coro, turn=turn, model=model)
        return coro

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        for observer in reversed(self._all):
            coro = observer.snippet(coro, call_id=call_id, code=code)
        return coro

    def run_code_refused(self, *, call_id: str, args: dict[str, Any]) -> None:
        for observer in self._all:
            observer.run_code_refused(call_id=call_id, args=args)

    def call_made(self, *, tool: str, call_id: str, args: dict[str, Any], code: str, line: int) -> None:
        for observer in self._all:
            observer.call_made(tool=tool, call_id=call_id, args=args, code=code, line=line)

    def call(self, coro: Coroutine[Any, Any, tuple[Settled, CallRecord]], *, tool: str, call_id: str,
             args: dict[str, Any], approvals: Approvals) -> Coroutine[Any, Any, tuple[Settled, CallRecord]]:
        for observer in reversed(self._all):
            coro = observer.call(coro, tool=tool, call_id=call_id, args=args, approvals=approvals)
        return coro

    def tool_calls(self, calls: Sequence[ToolCallPart]) -> None:
        for observer in self._all:
            observer.tool_calls(calls)

    def tool_returned(self, part: ToolReturnPart) -> None:
        for observer in self._all:
            observer.tool_returned(part)

    def printed(self, *, call_id: str, text: str) -> None:
        for observer in self._all:
            observer.printed(call_id=call_id, text=text)

    def compute_escalated(self, *, call_id: str, stretch: int, reason: str) -> None:
        for observer in self._all:
            observer.compute_escalated(call_id=call_id, stretch=stretch, reason=reason)

    def approval_waiting(self, pending: PendingApproval, *, policy: str | None) -> None:
        for observer in self._all:
            observer.approval_waiting(pending, policy=policy)

    def approval_decided(self, record: ApprovalRecord) -> None:
        for observer in self._all:
            observer.approval_decided(record)

    def child_run_started(self, *, call_id: str, run_id: str, agent: str) -> None:
        for observer in self._all:
            observer.child_run_started(call_id=call_id, run_id=run_id, agent=agent)

    def child_run_ended(self, *, call_id: str, run_id: str, error: str | None) -> None:
        for observer in self._all:
            observer.child_run_ended(call_id=call_id, run_id=run_id, error=error)

    def continuing(self, *, run_index: int) -> None:
        for observer in self._all:
            observer.continuing(run_index=run_index)

    @contextmanager
    def run_parent(self) -> Iterator[None]:
        with contextlib.ExitStack() as parents:
            for observer in self._all:
                parents.enter_context(observer.run_parent())
            yield


def observe_run(observer: RunTelemetry) -> None:
    """Attach `observer` to the current workflow run: from a workflow inbound interceptor's `execute_workflow`.

    The run workflow asks for its observers as its run starts (`run_telemetry`); one attached later sees nothing.
    """
    instance = workflow.instance()
    observers: list[RunTelemetry] | None = getattr(instance, _OBSERVERS_ATTR, None)
    if observers is None:
        observers = []
        setattr(instance, _OBSERVERS_ATTR, observers)
    observers.append(observer)


def run_telemetry() -> RunTelemetry:
    """The observers attached to the current workflow run (`observe_run`), as one; `NO_TELEMETRY` if none."""
    observers: list[RunTelemetry] = getattr(workflow.instance(), _OBSERVERS_ATTR, [])
    if not observers:
        return NO_TELEMETRY
    return observers[0] if len(observers) == 1 else _Observers(observers)
