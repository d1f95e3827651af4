"""Each span made in workflow code is exported once per run, by the one worker whose workflow task recorded its end.

Why this is not simply `span.end()`: a workflow task can run live more than once, on one worker or on several.
Its completion may be refused (a new event arrived meanwhile, the task timed out, its worker was replaced or
killed), and then the task runs live again, on the same worker or another: Temporal's replay-safe tracer
provider only drops the ends made while history *replays*, so each live run of the task ended, and exported, its
spans again. Measured before (`bench/span_export.py`): 59 extra copies in 12 runs on two workers without a
workflow cache, two of them of a run's root span; one after a worker was SIGKILLed.

The rule here: a span ended in a live workflow task is held by the worker that ran the task until the server has
recorded that task's completion *by this worker* (the `WorkflowTaskCompleted` event right after the task's
`WorkflowTaskStarted`, with this worker's identity), and only then exported. A span whose task was not recorded
so (failed, timed out, refused, completed by another worker) is dropped: the run that the server did record
ends it again, and that one is exported. A span ended while history replays is never exported here: the worker
that recorded it did. How a worker learns that its task was recorded, cheapest first:

- the run's next activation on the same workflow instance comes from a later task, live: core gives a cached run
  a new task only once its last completion was accepted (a refused one evicts the run first);
- the run is evicted because its execution ended (`WORKFLOW_EXECUTION_ENDING`): the completion that ended it was
  accepted;
- otherwise (evicted for another reason, such as a worker without a workflow cache, or quiet: waiting for a
  person, a timer, a slow tool) the worker reads the run's history from its end (`settle`, from the worker's
  settling task, `worker/_span_settling`), a second after the run went quiet.

So a span is never exported twice, and a worker that lives on exports each of its spans within about a second of
the task that recorded it. A worker killed with SIGKILL loses the spans of its last second or so (as it loses
what its span processor had not sent yet); every span it had exported stays exported once.

What decides nothing a run records: which worker exports a span, and when. The workflow-side hook
(`span_ended`) only hands the span over; all of the rest runs outside workflow code.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from opentelemetry.trace import Span
from temporalio import workflow

__all__ = [
    "RunSpans",
    "WorkerSpans",
    "current_run",
    "drain_exports",
    "export",
    "span_ended",
]

_logger = logging.getLogger("durable_codemode")

_current = threading.local()  # determinism: ok (which run's activation this thread runs; decides no step)
"""The `RunSpans` of the workflow activation the thread is running (`current_run`), if a worker recorded it."""


@dataclass(eq=False)
class _Ended:
    span: Span
    end_ns: int
    """When it ended, live (the wall clock: what the span reports, never what the run decides)."""
    task: int
    """The run's history length in the task that ended it: that task's `WorkflowTaskStarted` event id."""


@dataclass(eq=False)
class RunSpans:
    """The spans one workflow instance of one run ended live, held until the task that ended each is recorded."""

    owner: WorkerSpans
    workflow_id: str
    run_id: str
    ended: dict[tuple[int, int], _Ended] = field(default_factory=dict)
    """By (trace id, span id): a span's later end (a task run again live) replaces an earlier one."""
    quiet_since: float | None = None
    """`time.monotonic()` when the instance's last activation ended (`None` while one runs)."""
    evicted: bool = False
    """Evicted: its spans wait for a history check (`WorkerSpans.due`), and it takes no more."""
    checks: int = 0
    """History checks that found a held span's task not recorded yet (`WorkerSpans.postpone`)."""
    next_check: float = 0.0
    """`time.monotonic()` before which its history is not read again."""

    def add(self, span: Span, end_ns: int, task: int) -> None:
        """Hold `span`, ended live at `end_ns` in the task whose `WorkflowTaskStarted` event id is `task`."""
        context = span.get_span_context()
        with self.owner.lock:
            if not self.evicted:
                self.ended[(context.trace_id, context.span_id)] = _Ended(span, end_ns, task)

    def activation_started(self, *, history_length: int, replaying: bool) -> None:
        """An activation of this instance starts: export what earlier tasks ended if this one is a later, live task.

        Only a cached instance gets a next activation, and core hands it one only after the server accepted the
        completion of its last task: so every task before this one was recorded, by this worker.
        """
        with self.owner.lock:
            self.quiet_since = None
            if replaying:
                return
            done = [k for k, e in self.ended.items() if e.task < history_length]
            spans = [self.ended.pop(k) for k in done]
        for ended in spans:
            export(ended.span, ended.end_ns)

    def activation_ended(self) -> None:
        """The activation is done: from now on the instance is quiet until its next one."""
        with self.owner.lock:
            self.quiet_since = time.monotonic()  # determinism: ok (when to check the history; decides no step)

    def evicted_now(self, *, execution_ending: bool) -> None:
        """The instance is evicted; `execution_ending`: because its run ended, by a completion the server accepted."""
        with self.owner.lock:
            self.evicted = True
            spans = list(self.ended.values()) if execution_ending else []
            if execution_ending:
                self.ended.clear()
            self.owner.runs.discard(self)
            if self.ended:
                self.owner.unsettled.append(self)
        for ended in spans:
            export(ended.span, ended.end_ns)


@dataclass(eq=False)
class WorkerSpans:
    """One worker's held spans (`RunSpans` per workflow instance), and the identity its task completions carry."""

    identity: str = ""
    """The worker's identity (`Worker(identity=...)`, by default its client's), as `WorkflowTaskCompleted` has it."""
    lock: threading.Lock = field(default_factory=threading.Lock)  # determinism: ok (guards held spans only)
    runs: set[RunSpans] = field(default_factory=set)
    """The instances the worker holds in its cache."""
    unsettled: list[RunSpans] = field(default_factory=list)
    """Evicted instances whose spans wait for a history check."""

    def instance(self, workflow_id: str, run_id: str) -> RunSpans:
        """A new workflow instance of run `run_id` (the worker's runner creates one per cache entry)."""
        run = RunSpans(self, workflow_id, run_id)
        with self.lock:
            self.runs.add(run)
        return run

    def due(self, *, quiet: float, everything: bool = False) -> dict[tuple[str, str], set[int]]:
        """The tasks (by run) whose recording to check in the history now.

        Those of evicted instances, and of instances quiet for `quiet` seconds; `everything`: all held (the worker
        is stopping, so no next activation will come).
        """
        now = time.monotonic()  # determinism: ok (when to check; decides no step)
        due: dict[tuple[str, str], set[int]] = {}
        with self.lock:
            runs = [*self.unsettled, *(r for r in self.runs if everything or (
                r.quiet_since is not None and now - r.quiet_since >= quiet))]
            for run in runs:
                if run.ended and (everything or run.next_check <= now):
                    due.setdefault((run.workflow_id, run.run_id), set()).update(e.task for e in run.ended.values())
        return due

    def settle(self, workflow_id: str, run_id: str, recorded: dict[int, bool]) -> None:
        """Export the held spans of run `run_id` whose task this worker recorded (`True`), drop the others (`False`).

        Tasks not in `recorded` (their outcome is not in the history yet) stay held.
        """
        spans = []
        with self.lock:
            for run in [*self.unsettled, *self.runs]:
                if (run.workflow_id, run.run_id) != (workflow_id, run_id):
                    continue
                for key in [k for k, e in run.ended.items() if e.task in recorded]:
                    ended = run.ended.pop(key)
                    if recorded[ended.task]:
                        spans.append(ended)
            self.unsettled = [r for r in self.unsettled if r.ended]
        for ended in spans:
            export(ended.span, ended.end_ns)

    def postpone(self, workflow_id: str, run_id: str) -> None:
        """The history of run `run_id` did not say yet: read it again later, less often each time.

        After `_GIVE_UP_CHECKS` checks (about 10 minutes) its held spans are dropped: a run whose history never
        says (deleted, say) must not hold them forever.
        """
        now = time.monotonic()  # determinism: ok (when to check; decides no step)
        with self.lock:
            for run in [*self.unsettled, *self.runs]:
                if (run.workflow_id, run.run_id) == (workflow_id, run_id):
                    run.checks += 1
                    run.next_check = now + min(30.0, 0.5 * 2 ** run.checks)
                    if run.checks > _GIVE_UP_CHECKS:
                        _logger.debug("dropped %d spans of run %s: its history never recorded their task",
                                      len(run.ended), run_id)
                        run.ended.clear()
            self.unsettled = [r for r in self.unsettled if r.ended]

    def held(self) -> int:
        """How many spans wait for their task to be recorded: for tests and metrics."""
        with self.lock:
            return sum(len(r.ended) for r in [*self.unsettled, *self.runs])


_GIVE_UP_CHECKS = 25
"""History checks of a run (0.5 s, then twice as long each time, at most 30 s apart) before its held spans are
dropped: about 10 minutes."""


@contextmanager
def current_run(run: RunSpans | None) -> Iterator[None]:
    """Make `run` the run whose activation this thread runs (the worker's runner, around each activation)."""
    before = getattr(_current, "run", None)
    _current.run = run
    try:
        yield
    finally:
        _current.run = before


def span_ended(span: Span) -> None:
    """A span made in workflow code ends, live: held by the worker that runs this task, or exported at once.

    At once only when no worker's runner records its tasks (a worker not made by `create_worker`): then a span
    is exported once per process, as before this module.
    """
    run: RunSpans | None = getattr(_current, "run", None)
    info = workflow.info()
    end_ns = time.time_ns()  # determinism: ok (the span's end time, reported; decides no step)
    if run is None or run.run_id != info.run_id:
        export(span, end_ns)
        return
    run.add(span, end_ns, info.get_current_history_length())


# -- exporting -----------------------------------------------------------------------------------------------------

_EXPORTED: OrderedDict[tuple[int, int], None] = OrderedDict()
"""(trace id, span id) of the spans this process exported, newest last, at most `_EXPORTED_MAX`: a span two
workflow instances of one run ended in this process (a query's replay beside the task, say) is exported once."""

_EXPORTED_MAX = 100_000

_exported_lock = threading.Lock()  # determinism: ok (guards the exported set; decides no step)

_queue: queue.SimpleQueue[tuple[Span, int] | None] | None = None
_queued = 0
_drained = threading.Condition(_exported_lock)  # determinism: ok (for `drain_exports`; decides no step)

EXPORTING_THREAD = "durable-codemode-span-export"
"""The thread that ends held spans, so a span processor's export never runs on a workflow thread."""


def export(span: Span, end_ns: int) -> None:
    """End `span` at `end_ns` (so its processors export it), once per process, off the calling thread."""
    global _queue, _queued
    context = span.get_span_context()
    key = (context.trace_id, context.span_id)
    with _exported_lock:
        if key in _EXPORTED:
            return
        _EXPORTED[key] = None
        if len(_EXPORTED) > _EXPORTED_MAX:
            _EXPORTED.popitem(last=False)
        _queued += 1
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(target=_end_spans, args=(_queue,), name=EXPORTING_THREAD,  # determinism: ok (see above)
                             daemon=True).start()
        _queue.put((span, end_ns))


def _end_spans(spans: queue.SimpleQueue[tuple[Span, int] | None]) -> None:
    global _queued
    while (item := spans.get()) is not None:
        span, end_ns = item
        try:
            span.end(end_time=end_ns)  # outside workflow code: the replay-safe span ends it as it is
        except Exception:  # a span processor's failure must not stop the exports that follow
            _logger.exception("ending a span failed")
        with _exported_lock:
            _queued -= 1
            if not _queued:
                _drained.notify_all()


def drain_exports(timeout: float = 10.0) -> bool:
    """Wait until every span handed to `export` has ended (and so reached its processors); whether all had."""
    with _exported_lock:
        return _drained.wait_for(lambda: not _queued, timeout)
