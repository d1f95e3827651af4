"""Workers as separate OS processes, so a test can SIGKILL one (and its sandbox processes) and start another.

`WorkerFleet` starts `python -m tests._ledger_worker` processes, each in its own session (so its process group
holds the worker and every `monty` sandbox process it spawns), waits until each one polls its task queue, and
kills every group it started when the block ends, also when the test fails: no worker or sandbox process is left.
Each is forked from the test process's fork server (`tests/_forked.start_module`), which imported the package
once: a real process of its own, without the ~3 s of CPU an interpreter's start and import cost each.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from ._forked import start_module
from ._ledger_worker import READY, STANDBY, Ledger

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: the worker's working directory, so `tests` and `activities` import."""


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes in process group `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its closing parenthesis.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


class ChildProcess(Protocol):
    """What a test asks of a worker process: `subprocess.Popen`'s part that a forked one has (`tests/_forked`)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class WorkerProcess:
    """One worker process and the log its stdout and stderr go to."""

    proc: ChildProcess
    identity: str
    log: Path
    killed_at: float | None = None
    """`time.time()` just before it was SIGKILLed: it may still send requests until `dead_at`."""
    dead_at: float | None = None
    """`time.time()` once it and its group were reaped: it can send nothing after this.

    A request it wrote before dying (a workflow task completion, say) can still be stamped by the server after
    this moment, so "after the kill" must be judged by when a task was handed to it, not by when it completed.
    """
    live: bool = False
    """Whether it was told to poll (a spare never was)."""

    @property
    def pid(self) -> int:
        """The worker's pid, which is also its process group's id."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the worker process still runs."""
        return self.proc.poll() is None

    def sandbox_processes(self) -> list[int]:
        """The other live processes of its group: its `monty` sandbox processes."""
        return [p for p in group_members(self.pid) if p != self.pid]

    def kill(self) -> None:
        """SIGKILL the whole group at once (worker and sandboxes), as a crash would; return once all are gone."""
        if self.killed_at is None:
            self.killed_at = time.time()
        with suppress(ProcessLookupError):  # already gone
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()
        # The signal reaches every member at once, but each dies in its own time: wait until none is left.
        deadline = time.monotonic() + 10
        while group_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.dead_at is None:
            self.dead_at = time.time()

    def terminate(self) -> None:
        """SIGTERM the worker process alone, as a deploy asks a worker to stop; returns at once.

        Kubernetes signals a container's main process; the worker's sandbox processes are its own to stop.
        """
        with suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM the worker, as a deploy replaces it: it shuts down gracefully; return once its group is gone."""
        with suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        self.proc.wait(timeout)
        deadline = time.monotonic() + 10
        while group_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def tail(self, lines: int = 30) -> str:
        """The end of its log, for failure messages."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class WorkerFleet:
    """Starts ledger workers for one test and kills every one of them (and their sandboxes) at the end."""

    client: Client
    address: str
    task_queue: str
    ledger: Path
    logs: Path
    sticky: float = 3.0
    max_processes: int = 24
    tool_timeout: float = 5.0
    workflow_tasks: int | None = None
    extra_args: tuple[str, ...] = ()
    """More arguments for every worker process (`python -m tests._ledger_worker --help`)."""
    started: list[WorkerProcess] = field(default_factory=list)
    """Every process started, live or spare."""
    _spare: asyncio.Task[WorkerProcess] | None = None

    async def prepare(self, *, ready_timeout: float = 60.0) -> WorkerProcess:
        """Start a worker process in standby: imported, connected and built, but not polling yet."""
        identity = f"ledger-worker-{len(self.started)}"
        log = self.logs / f"{identity}.log"
        proc = start_module(  # in a session of its own: killpg reaches its sandbox processes too
            "tests._ledger_worker",
            ["--address", self.address, "--task-queue", self.task_queue, "--ledger", str(self.ledger),
             "--identity", identity, "--sticky", str(self.sticky), "--max-processes", str(self.max_processes),
             "--tool-timeout", str(self.tool_timeout), "--standby", str(self._go_file(identity)),
             *(["--workflow-tasks", str(self.workflow_tasks)] if self.workflow_tasks else []), *self.extra_args],
            log=log, cwd=ROOT)
        worker = WorkerProcess(proc, identity, log)
        self.started.append(worker)
        await self._wait_for_line(worker, STANDBY, time.monotonic() + ready_timeout)
        return worker

    async def start(self, *, spare: bool = False, ready_timeout: float = 60.0) -> WorkerProcess:
        """Start a worker (the spare made earlier, if any) and return once it polls the task queue.

        With `spare`, also prepare the next spare in the background, so the next `start` takes ~0.1 s.
        """
        worker = await (self._spare if self._spare is not None else self.prepare(ready_timeout=ready_timeout))
        self._spare = None
        deadline = time.monotonic() + ready_timeout
        self._go_file(worker.identity).touch()
        await self._wait_for_line(worker, READY, deadline)
        while worker.identity not in await self.pollers():
            if not worker.alive():
                raise RuntimeError(f"worker {worker.identity} exited with {worker.proc.returncode}:\n{worker.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {worker.identity} does not poll {self.task_queue}:\n{worker.tail()}")
            await asyncio.sleep(0.05)
        worker.live = True
        if spare:
            self._spare = asyncio.create_task(self.prepare(ready_timeout=ready_timeout))
        return worker

    def _go_file(self, identity: str) -> Path:
        """The file whose appearance tells the standby worker `identity` to poll."""
        return self.logs / f"{identity}.go"

    @staticmethod
    async def _wait_for_line(worker: WorkerProcess, word: str, deadline: float) -> None:
        while not any(line.startswith(word) for line in worker.log.read_text(errors="replace").splitlines()):
            if not worker.alive():
                raise RuntimeError(f"worker {worker.identity} exited with {worker.proc.returncode}:\n{worker.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {worker.identity} printed no {word!r} line in time:\n{worker.tail()}")
            await asyncio.sleep(0.05)

    async def pollers(self) -> set[str]:
        """Identities of the workers that recently polled the task queue for workflow tasks."""
        response = await self.client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=self.client.namespace, task_queue=TaskQueue(name=self.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
        return {p.identity for p in response.pollers}

    def kill_all(self) -> None:
        """SIGKILL every group this fleet started and wait until none of their processes is left."""
        if self._spare is not None:
            self._spare.cancel()
        for worker in self.started:
            worker.kill()
        deadline = time.monotonic() + 10
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.05)

    def leftovers(self) -> list[int]:
        """Processes still alive in any group this fleet started (should be none once all are killed)."""
        return [p for w in self.started for p in group_members(w.pid)]

    def by_identity(self) -> dict[str, WorkerProcess]:
        """The workers that polled, by their Temporal identity."""
        return {w.identity: w for w in self.started if w.live}


async def start_worker_process(module: str, args: list[str], *, identity: str, logs: Path,
                               ready: str = READY, timeout: float = 60.0, env: dict[str, str] | None = None,
                               cwd: Path = ROOT) -> WorkerProcess:
    """Start `python -m module args...` in its own process group; return once it prints a line starting `ready`.

    Forked (`tests/_forked.start_module`). For worker modules other than the ledger worker (`tests._deploy_agents`);
    the caller kills what it started (`WorkerProcess.kill`), also when the test fails. `env`: its whole environment
    (default: this process's); `cwd`: its working directory.
    """
    log = logs / f"{identity}.log"
    worker = WorkerProcess(start_module(module, args, log=log, cwd=cwd, env=env), identity, log, live=True)
    await WorkerFleet._wait_for_line(worker, ready, time.monotonic() + timeout)
    return worker


@asynccontextmanager
async def worker_fleet(client: Client, address: str, task_queue: str, tmp: Path, *, sticky: float = 3.0,
                       max_processes: int = 24, tool_timeout: float = 5.0,
                       workflow_tasks: int | None = None, extra_args: tuple[str, ...] = ()
                       ) -> AsyncIterator[WorkerFleet]:
    """A `WorkerFleet` (ledger at `tmp/ledger.sqlite`) whose processes are all killed when the block ends."""
    (tmp / "logs").mkdir(exist_ok=True)
    fleet = WorkerFleet(client, address, task_queue, tmp / "ledger.sqlite", tmp / "logs", sticky=sticky,
                        max_processes=max_processes, tool_timeout=tool_timeout, workflow_tasks=workflow_tasks,
                        extra_args=extra_args)
    Ledger(fleet.ledger).create_schema()
    try:
        yield fleet
    finally:
        fleet.kill_all()


async def workflow_task_workers(client: Client, workflow_id: str, *, completed: bool = False) -> list[
        tuple[float, str]]:
    """(time, worker identity) of every workflow task a worker started (or, with `completed`, completed) for the run.

    A task can be *started* by a worker that was just killed: its long poll was still open on the server, which
    handed it the task before noticing; that task then times out (the workflow task timeout, 10 s) and goes to
    another worker. Only a completed task shows that a worker really ran the run.
    """
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    kind = (EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED if completed else EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED)
    return [(e.event_time.ToNanoseconds() / 1e9,
             (e.workflow_task_completed_event_attributes.identity if completed
              else e.workflow_task_started_event_attributes.identity))
            for e in history.events if e.event_type == kind]


@dataclass(frozen=True)
class CompletedWorkflowTask:
    """One workflow task a worker completed: who, when the server handed it over and when it got the result."""

    identity: str
    started: float
    """The server's `WorkflowTaskStarted` time: when the task was handed to the worker's poll."""
    completed: float
    """The server's `WorkflowTaskCompleted` time: when the server processed the worker's response."""


async def completed_workflow_tasks(client: Client, workflow_id: str) -> list[CompletedWorkflowTask]:
    """Every workflow task of the run that a worker completed, paired with the moment it was handed over.

    A killed worker's last response can be stamped after its death (it was on the wire), but no worker can
    complete a task the server handed it after it died: the started time is the one to hold against a kill.
    """
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    started = {e.event_id: e.event_time.ToNanoseconds() / 1e9 for e in history.events
               if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED}
    return [CompletedWorkflowTask(identity=e.workflow_task_completed_event_attributes.identity,
                                  started=started[e.workflow_task_completed_event_attributes.started_event_id],
                                  completed=e.event_time.ToNanoseconds() / 1e9)
            for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]


async def stall_after_kill(client: Client, ledger: Ledger, workflow_id: str, survivor: WorkerProcess,
                           killed_at: float) -> tuple[float, float] | None:
    """How long a run held by a killed worker stalled after the kill: (resumed, next call) in seconds.

    Resumed: until the survivor started the run's next workflow task. Next call: until the first nested call it
    made from there returned on the survivor. None when the run made no call on the survivor after resuming (it
    had none left to make).
    """
    resumed = min((when for when, who in await workflow_task_workers(client, workflow_id)
                   if who == survivor.identity and when >= killed_at), default=None)
    if resumed is None:
        return None
    finished = [a["finished"] for a in ledger.attempts()
                if a["idempotency_key"].startswith(f"{workflow_id}:") and a["pid"] == survivor.pid
                and a["finished"] and a["started"] >= resumed]
    return (resumed - killed_at, min(finished) - killed_at) if finished else None
