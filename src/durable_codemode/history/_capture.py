"""Replay one run's history offline and watch what the replayed workflow does, for the debugging commands.

Temporal's `Replayer` only says whether a history replays and, when not, gives core's one-line message
(`TMPRL1100 ... activity id of scheduled event 'call_0.3-1f…' does not match ... 'call_0.3-9c…'`). To say which
snippet, line and arguments that was, the replay is watched from three places, none of which changes what the
workflow does:
- an outbound interceptor records every command the replayed workflow issues (activities with their inputs, in
  the order that gives their sequence numbers, and continue-as-new with its input);
- the run's observer (`_observers.RunTelemetry`, attached by `observe_run` as tracing's spans are) learns each
  call's source line and each replayed snippet's outcome, and is handed the run's approval state;
- a workflow runner around Temporal's unsandboxed one reads that approval state after every activation but the
  eviction, so a replay of an open run ends with what the run is waiting for.

No activity runs: the replayer answers every command from the history. No server is needed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import WorkflowHistory
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.worker import (
    ContinueAsNewInput,
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    StartActivityInput,
    StartLocalActivityInput,
    UnsandboxedWorkflowRunner,
    WorkflowInboundInterceptor,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
    WorkflowRunner,
)

from .._converter import DATA_CONVERTER
from ..shared._approvals import ApprovalRecord, PendingApproval
from ..workflow._observers import ApprovalState, RunTelemetry, observe_run
from ..workflow._run import CodeModeRunWorkflow
from ..workflow._sandbox_types import SnippetOutcome

__all__ = [
    "REPLAY_BUILD_ID",
    "ReplayCapture",
    "ReplayedCall",
    "ReplayedCommand",
    "ReplayedSnippet",
    "failure_message",
    "quiet_replays",
    "replay_history",
]

REPLAY_BUILD_ID = "durable-codemode-replay"
"""The build id every offline `Replayer` of ours is given, so none computes Temporal's default.

An offline replay uses a build id only to name its in-memory task queue. Without one, the replayer computes the
default by compiling every loaded module's code to hash it: measured 0.73 s of CPU in each `codemode trace`,
`replay` or `audit` process (once per process; a fresh command always pays it).
"""

_CORE_MESSAGE = re.compile(r'message: "((?:[^"\\]|\\.)*)"')
"""The message inside core's `Failure { failure: Some(Failure { message: "..." ...` text."""


def failure_message(error: BaseException) -> str:
    """The one line that matters in a replay failure: core's message, not the Rust debug dump around it."""
    text = str(error)
    found = _CORE_MESSAGE.search(text)
    if found is None:
        return text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return found.group(1).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


@dataclass(kw_only=True)
class ReplayedCommand:
    """A command the replayed workflow issued."""

    kind: str
    """`activity`, `local_activity` or `continue_as_new`."""
    seq: int | None
    """The activity's sequence number (Temporal's activity id when none is given); `None` for others."""
    activity_type: str | None = None
    activity_id: str | None = None
    """The id the workflow gave (tool calls); `None` when Temporal numbers it (`str(seq)`)."""
    input: Any = None
    summary: str | None = None
    """The activity's summary, as the workflow gave it (a model request's names its turn: `model turn 3`)."""

    @property
    def effective_id(self) -> str | None:
        """The activity id as core compares it: the given one, else the sequence number."""
        if self.activity_id is not None:
            return self.activity_id
        return str(self.seq) if self.seq is not None else None


@dataclass(kw_only=True)
class ReplayedCall:
    """A tool call the replayed program made, with where in its code."""

    call_id: str
    tool: str
    args: dict[str, Any]
    code: str
    line: int
    """1-based; 0 for a call the model made directly (not from a snippet)."""


@dataclass(kw_only=True)
class ReplayedSnippet:
    """A `run_code` snippet the replay ran, and what it came to (`None` while it was still running)."""

    call_id: str
    code: str
    outcome: str | None = None
    content: Any = None


@dataclass(kw_only=True)
class ReplayCapture:
    """What one replay saw: the commands, calls and snippets in order, the approvals at the end, the failure."""

    run_id: str = ""
    commands: list[ReplayedCommand] = field(default_factory=list)
    calls: dict[str, ReplayedCall] = field(default_factory=dict)
    snippets: list[ReplayedSnippet] = field(default_factory=list)
    pending: list[PendingApproval] = field(default_factory=list)
    audit: list[ApprovalRecord] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    """The calls the replay sent to a person, in order (as the run's approval rules decided on replay)."""
    watched: bool = False
    """The run workflow's instance was reached, so `calls`, `snippets`, `pending` and `audit` mean something."""
    failure: BaseException | None = None
    _seq: int = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @property
    def ok(self) -> bool:
        """Whether the history replayed without a failure."""
        return self.failure is None

    @property
    def model_requests(self) -> int:
        return sum(1 for c in self.commands if c.activity_type == "durable-codemode.model_request")

    @property
    def nested_calls(self) -> int:
        return sum(1 for c in self.calls.values() if c.line > 0)

    @property
    def direct_calls(self) -> int:
        return sum(1 for c in self.calls.values() if c.line == 0)

    def command_for_id(self, activity_id: str) -> ReplayedCommand | None:
        """The activity command core reported under `activity_id` (a tool call's id, or a sequence number)."""
        return next((c for c in self.commands if c.effective_id == activity_id
                     and c.kind in ("activity", "local_activity")), None)


class _Outbound(WorkflowOutboundInterceptor):
    def __init__(self, nxt: WorkflowOutboundInterceptor, capture: ReplayCapture) -> None:
        super().__init__(nxt)
        self._capture = capture

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        self._capture.commands.append(ReplayedCommand(
            kind="activity", seq=self._capture.next_seq(), activity_type=input.activity,
            activity_id=input.activity_id, input=input.args[0] if input.args else None, summary=input.summary))
        return super().start_activity(input)

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        self._capture.commands.append(ReplayedCommand(
            kind="local_activity", seq=self._capture.next_seq(), activity_type=input.activity,
            activity_id=input.activity_id, input=input.args[0] if input.args else None))
        return super().start_local_activity(input)

    def continue_as_new(self, input: ContinueAsNewInput) -> Any:
        self._capture.commands.append(ReplayedCommand(
            kind="continue_as_new", seq=None, input=input.args[0] if input.args else None))
        return super().continue_as_new(input)


class _CapturingObserver(RunTelemetry):
    """The run's observer in a replay (`_observers.observe_run`): each call's source line, each snippet's outcome."""

    def __init__(self, capture: ReplayCapture, states: dict[str, Callable[[], ApprovalState]]) -> None:
        self._capture = capture
        self._states = states

    def approvals(self, state: Callable[[], ApprovalState]) -> None:
        self._capture.watched = True
        self._states[workflow.info().run_id] = state

    def call_made(self, *, tool: str, call_id: str, args: dict[str, Any], code: str, line: int) -> None:
        self._capture.calls[call_id] = ReplayedCall(call_id=call_id, tool=tool, args=dict(args), code=code, line=line)

    def approval_waiting(self, pending: PendingApproval, *, policy: str | None) -> None:
        self._capture.asked.append(pending.call_id)

    def run_code_refused(self, *, call_id: str, args: dict[str, Any]) -> None:
        self._capture.snippets.append(ReplayedSnippet(call_id=call_id, code=str(args.get("code", "")),
                                                      outcome="rejected"))

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        snippet = ReplayedSnippet(call_id=call_id, code=code)
        self._capture.snippets.append(snippet)

        async def watched() -> SnippetOutcome:
            outcome = await coro
            snippet.outcome, snippet.content = outcome.kind, outcome.content
            return outcome

        return watched()


def _interceptor(capture: ReplayCapture, states: dict[str, Callable[[], ApprovalState]]) -> Interceptor:
    class Inbound(WorkflowInboundInterceptor):
        def init(self, outbound: WorkflowOutboundInterceptor) -> None:
            super().init(_Outbound(outbound, capture))

        async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
            capture.run_id = workflow.info().run_id
            observe_run(_CapturingObserver(capture, states))
            return await super().execute_workflow(input)

    class Watching(Interceptor):
        def workflow_interceptor_class(
            self, input: WorkflowInterceptorClassInput
        ) -> type[WorkflowInboundInterceptor] | None:
            return Inbound

    return Watching()


class _WatchedInstance(WorkflowInstance):
    """Delegates to Temporal's instance; after each activation but the eviction, copies the approval state."""

    def __init__(self, inner: WorkflowInstance, capture: ReplayCapture,
                 states: dict[str, Callable[[], ApprovalState]]) -> None:
        self._inner = inner
        self._capture = capture
        self._states = states

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        completion = self._inner.activate(act)
        # The eviction cancels every task, and a cancelled approval wait takes its question back: read before.
        if not any(job.HasField("remove_from_cache") for job in act.jobs):
            state = self._states.get(act.run_id)
            if state is not None:
                now = state()
                self._capture.pending, self._capture.audit = now.pending, now.audit
        return completion

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class _WatchingRunner(WorkflowRunner):
    def __init__(self, capture: ReplayCapture, states: dict[str, Callable[[], ApprovalState]]) -> None:
        self._inner = UnsandboxedWorkflowRunner()
        self._capture = capture
        self._states = states

    def prepare_workflow(self, defn: Any) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _WatchedInstance(self._inner.create_instance(det), self._capture, self._states)


_quiet_runtime: Runtime | None = None


@contextmanager
def quiet_replays() -> Iterator[Runtime]:
    """A Temporal runtime without core's log lines, with the SDK's warnings muted, for command-line replays.

    A diverging replay makes core log a `WARN Failing workflow task` line and the SDK log a traceback: noise
    for a command whose whole job is to explain that failure better. Library callers keep the default logging.
    """
    global _quiet_runtime
    if _quiet_runtime is None:
        _quiet_runtime = Runtime(telemetry=TelemetryConfig(logging=None))
    logger = logging.getLogger("temporalio")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield _quiet_runtime
    finally:
        logger.setLevel(level)


async def replay_history(history: WorkflowHistory, *, runtime: Runtime | None = None) -> ReplayCapture:
    """Replay one run's history with the run workflow, offline, and return what the replay did.

    Never raises for a failed replay: the failure is in `ReplayCapture.failure`.
    """
    capture = ReplayCapture()
    states: dict[str, Callable[[], ApprovalState]] = {}
    replayer = Replayer(
        workflows=[CodeModeRunWorkflow],
        data_converter=DATA_CONVERTER,
        workflow_runner=_WatchingRunner(capture, states),
        interceptors=[_interceptor(capture, states)],
        runtime=runtime,
        debug_mode=True,  # offline: no 2 s deadlock detector, so no replay depends on this machine's speed
        build_id=REPLAY_BUILD_ID,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    capture.failure = result.replay_failure
    return capture
