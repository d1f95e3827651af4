"""A worker process for the crash tests: `python -m tests._ledger_worker --address A --task-queue Q --ledger FILE`.

It serves the `ledger` agent, whose tools move money between accounts in a real SQLite file (the ledger) and
record every side effect there, keyed by the call's idempotency key (`current_call().idempotency_key`). A test
can SIGKILL the process at any moment, start another, and afterwards count, per key, how often each side effect
ran (`Ledger.duplicate_effects()` must be 0) and compare every account's balance with what the run was told to do.

The model is the scripted pydantic-ai `FunctionModel` of `durable_codemode.testing` (named `scripted-ledger`): its
first turn writes a program from the run's prompt, a JSON `LedgerTask`, and its second answers with the program's
result. Once its worker polls, the process prints `ready <pid>` on stdout; it runs until killed. With
`--standby GO_FILE` it first connects and builds its worker, prints `standby <pid>`, and starts polling only once
the file GO_FILE exists (a warm spare: the crash tests' restarts then cost no start-up time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from temporalio import activity
from temporalio.common import RetryPolicy

from durable_codemode import (
    CodeModeAgent,
    CodeModeUserError,
    PoolSettings,
    ToolOptions,
    connect,
    create_worker,
    current_call,
)
from durable_codemode.apps.activities._store import IdempotentTools, SqliteStore
from durable_codemode.testing import RunCode, Step, last_result, scripted_model, user_prompt

AGENT = "ledger"
"""The agent's name, as runs name it."""

APPROVAL_CENTS = 1_000
"""A payout of this much or more waits for a person (the agent's approval rule)."""

READY = "ready"
"""The first word of the line the worker prints once it polls."""

STANDBY = "standby"
"""The first word of the line a `--standby` worker prints once it is built and waits for its go file."""


@dataclass(frozen=True)
class LedgerTask:
    """What one run does to its own account: the run's prompt, as JSON.

    The program deposits `gathers` batches of `width` gathered deposits, then `sequential` deposits one by one,
    each tool call pausing `pause_ms` inside the tool; with `payout` it then asks for a payout of `APPROVAL_CENTS`
    (which waits for a decision; a denial is caught), then `after` more sequential deposits, and reads the balance.
    """

    account: str
    gathers: int = 2
    width: int = 5
    sequential: int = 10
    after: int = 0
    pause_ms: int = 5
    payout: bool = False
    model_hang: float = 0.0
    """Seconds the model's first attempt at the first turn hangs (noted in the ledger), for a kill to land in it."""
    compute_loops: int = 0
    """Iterations of pure compute the program does after its gathers (15M: ~3 s in Monty): past its in-workflow
    budget, so it goes on in the compute activity. Its result is checked inside the program (`got` stays right
    only if the loop computed the value the host did)."""

    def prompt(self) -> str:
        """The run's prompt."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_prompt(cls, text: str) -> LedgerTask:
        """The task a prompt describes."""
        return cls(**json.loads(text))

    def program(self) -> str:
        """The `run_code` program the scripted model writes for this task."""
        return f"""import asyncio
acc = {self.account!r}
got = 0
for b in range({self.gathers}):
    batch = await asyncio.gather(*(deposit(account=acc, cents=100 * b + j + 1, pause_ms={self.pause_ms})
                                   for j in range({self.width})))
    got += sum(batch)
spin = 0
for i in range({self.compute_loops}):
    spin = (spin + i * i) % 1_000_003
got += spin - {self.spin()}
for k in range({self.sequential}):
    got += await deposit(account=acc, cents=k + 1, pause_ms={self.pause_ms})
paid = 0
if {self.payout}:
    try:
        paid = await payout(account=acc, cents={APPROVAL_CENTS})
    except PermissionError:
        paid = -1
for k in range({self.after}):
    got += await deposit(account=acc, cents=1000 + k, pause_ms={self.pause_ms})
[got, paid, await balance(account=acc)]
"""

    def spin(self) -> int:
        """What the program's compute loop comes to, computed here."""
        spin = 0
        for i in range(self.compute_loops):
            spin = (spin + i * i) % 1_000_003
        return spin

    def mutations(self) -> int:
        """Side effects the program makes when the payout (if any) is approved; one fewer when it is denied."""
        return self.gathers * self.width + self.sequential + self.after + int(self.payout)

    def calls(self) -> int:
        """Nested calls the program makes (the balance read included)."""
        return self.mutations() + 1

    def expected(self, *, approved: bool) -> list[int]:
        """The program's result: `[deposited, paid (-1: denied, 0: no payout), balance]`."""
        got = sum(100 * b + j + 1 for b in range(self.gathers) for j in range(self.width))
        got += sum(k + 1 for k in range(self.sequential)) + sum(1000 + k for k in range(self.after))
        paid = (APPROVAL_CENTS if approved else -1) if self.payout else 0
        return [got, paid, got - max(paid, 0)]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL,
    tool TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    started REAL NOT NULL,
    finished REAL
);
"""


class Ledger(SqliteStore):
    """The ledger file: balances, every tool attempt (`attempts`) and every applied side effect (`executions`).

    `executions` (from `SqliteStore`) gets one row each time a side effect really runs, in the transaction that
    applies it; `attempts` one row each time a tool function starts, finished or not (a retry after a kill adds
    one), with the worker's pid and wall-clock times, so a benchmark can tell which worker completed what, when.
    """

    SCHEMA = _SCHEMA
    TABLES = ("balances", "attempts")

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection that does not sync on every commit: a crash test's kill is of the worker, not the OS."""
        with super().connect() as conn:
            conn.execute("PRAGMA synchronous=NORMAL")
            yield conn

    def begin_attempt(self, tool: str) -> int:
        """Record that `tool` started for the current call; the row's id, for `end_attempt`."""
        call = current_call()
        with self.write() as conn:
            cur = conn.execute(
                "INSERT INTO attempts (idempotency_key, tool, attempt, pid, started) VALUES (?, ?, ?, ?, ?)",
                (call.idempotency_key, tool, call.attempt, os.getpid(), time.time()))
            return int(cur.lastrowid or 0)

    def end_attempt(self, row: int) -> None:
        """Record that the attempt `row` returned."""
        with self.write() as conn:
            conn.execute("UPDATE attempts SET finished = ? WHERE id = ?", (time.time(), row))

    def note_model_hang(self, account: str) -> None:
        """Record that the model hangs for `account`'s run now (an `attempts` row with tool `model`)."""
        with self.write() as conn:
            conn.execute("INSERT INTO attempts (idempotency_key, tool, attempt, pid, started) VALUES (?, ?, 1, ?, ?)",
                         (f"model:{account}", "model", os.getpid(), time.time()))

    def model_hangs(self) -> int:
        """How many times a model hung (`note_model_hang`)."""
        with self.connect() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM attempts WHERE tool = 'model'").fetchone()[0])

    def balance(self, account: str) -> int:
        """An account's balance in cents (0 if it never moved)."""
        with self.connect() as conn:
            row = conn.execute("SELECT cents FROM balances WHERE account = ?", (account,)).fetchone()
        return int(row[0]) if row else 0

    def executions_per_key(self) -> dict[str, int]:
        """How many times each idempotency key's side effect ran."""
        with self.connect() as conn:
            rows = conn.execute("SELECT idempotency_key, COUNT(*) FROM executions GROUP BY idempotency_key")
            return {str(k): int(n) for k, n in rows}

    def attempt_count(self) -> int:
        """Tool attempts started so far (every tool, retries included)."""
        with self.connect() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0])

    def attempts(self) -> list[dict[str, Any]]:
        """Every attempt: key, tool, attempt, pid, started, finished (None: never returned)."""
        with self.connect() as conn:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute("SELECT * FROM attempts ORDER BY id")]


def _attempt() -> int:
    try:
        return activity.info().attempt
    except RuntimeError:  # not in an activity's context
        return 1


def _answer(returned: Any) -> str:
    """The final answer: the program's result as JSON, or what went wrong, so a test's assertion shows it."""
    if isinstance(returned, dict) and "result" in returned:
        return json.dumps(returned["result"])
    return f"the program did not return a result: {returned!r}"


def ledger_agent(ledger: Ledger, *, tool_timeout: float = 5.0) -> CodeModeAgent:
    """The `ledger` agent over `ledger`: `deposit`, `payout` (approval at `APPROVAL_CENTS` or more), `balance`.

    Tools get `tool_timeout` seconds per attempt (an attempt lost with a killed worker is retried after that) and
    up to 20 attempts, so a run survives many kills and a loaded machine; no error ever reaches the program.
    """
    def first_turn(messages: list[ModelMessage]) -> Step:
        task = LedgerTask.from_prompt(user_prompt(messages))
        if task.model_hang and _attempt() == 1:
            ledger.note_model_hang(task.account)
            time.sleep(task.model_hang)  # the model runs in a thread: the activity keeps heartbeating meanwhile
        return RunCode(task.program())

    steps: list[Step] = [first_turn, lambda m: _answer(last_result(m))]
    agent = Agent(scripted_model(*steps, name="scripted-ledger"), name=AGENT, instructions="Use run_code.")
    tools = IdempotentTools(ledger)

    def move(tool: str, account: str, cents: int) -> int:
        def apply(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO balances (account, cents) VALUES (?, ?) ON CONFLICT (account) "
                         "DO UPDATE SET cents = cents + excluded.cents", (account, cents))
            return abs(cents)

        return tools.mutate(tool, {"account": account, "cents": cents}, apply)

    @agent.tool_plain
    def deposit(account: str, cents: int, pause_ms: int = 0) -> int:
        """Add `cents` to `account` (after `pause_ms` of work); returns the cents deposited."""
        row = ledger.begin_attempt("deposit")
        time.sleep(pause_ms / 1000)
        done = move("deposit", account, cents)
        ledger.end_attempt(row)
        return done

    @agent.tool_plain
    def payout(account: str, cents: int) -> int:
        """Take `cents` out of `account`; returns the cents paid."""
        row = ledger.begin_attempt("payout")
        done = move("payout", account, -cents)
        ledger.end_attempt(row)
        return done

    @agent.tool_plain
    def balance(account: str) -> int:
        """The balance of `account` in cents."""
        row = ledger.begin_attempt("balance")
        value = ledger.balance(account)
        ledger.end_attempt(row)
        return value

    retry = RetryPolicy(initial_interval=timedelta(milliseconds=100), backoff_coefficient=1.5,
                        maximum_interval=timedelta(seconds=1), maximum_attempts=20)
    return CodeModeAgent(
        agent,
        default_tool_options=ToolOptions(timeout=timedelta(seconds=tool_timeout), retry_policy=retry),
        tool_options={"payout": ToolOptions(timeout=timedelta(seconds=tool_timeout), retry_policy=retry,
                                            approval_rule=lambda args: args["cents"] >= APPROVAL_CENTS)},
    )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests._ledger_worker", description=__doc__)
    parser.add_argument("--address", required=True, help="the Temporal server, host:port")
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--ledger", required=True, help="the ledger's SQLite file")
    parser.add_argument("--identity", default=None, help="the worker's identity (default: ledger-<pid>)")
    parser.add_argument("--sticky", type=float, default=3.0, help="sticky_queue_schedule_to_start_timeout, s")
    parser.add_argument("--max-processes", type=int, default=24, help="Monty pool size")
    parser.add_argument("--standby", default=None, metavar="GO_FILE", help="poll only once the file GO_FILE exists")
    parser.add_argument("--workflow-tasks", type=int, default=None, help="max_concurrent_workflow_tasks")
    parser.add_argument("--tool-timeout", type=float, default=5.0, help="start-to-close timeout per tool attempt")
    parser.add_argument("--spans", default=None, metavar="DIR",
                        help="trace the runs: append each exported span to DIR/spans-<pid>.jsonl")
    parser.add_argument("--cache", type=int, default=None, help="max_cached_workflows (default: the SDK's)")
    return parser.parse_args(argv)


class SpanFile:
    """An OpenTelemetry span exporter that appends each span to a JSON-lines file, written through at once.

    Each line is flushed as the span is exported, so a worker killed with SIGKILL leaves every span it had
    exported in the file (and none it had not): what a test counts is what an operator's collector got.
    """

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the worker's lifetime)

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        for span in spans:
            context, parent = span.context, span.parent
            self._file.write(json.dumps({
                "pid": os.getpid(), "name": span.name, "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}", "parent_id": f"{parent.span_id:016x}" if parent else None,
                "start": span.start_time, "end": span.end_time, "status": span.status.status_code.name,
                "description": span.status.description, "attributes": dict(span.attributes or {}),
            }, default=str) + "\n")
        self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _trace_to(path: str) -> None:
    """Set the process's replay-safe tracer provider, exporting every span to `path` (`SpanFile`) as it ends."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from temporalio.contrib.opentelemetry import create_tracer_provider

    provider = create_tracer_provider()
    provider.add_span_processor(SimpleSpanProcessor(SpanFile(path)))  # type: ignore[arg-type]
    trace.set_tracer_provider(provider)


async def serve(args: argparse.Namespace) -> None:
    """Serve the ledger agent until SIGTERM (or a kill)."""
    ledger = Ledger(args.ledger)
    ledger.create_schema()
    if args.spans:
        _trace_to(os.path.join(args.spans, f"spans-{os.getpid()}.jsonl"))
    deadline = time.monotonic() + 60
    while True:  # a spare may start while the server restarts: wait for it, as a supervised worker would
        try:
            client = await connect(args.address)
            break
        except CodeModeUserError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    worker = create_worker(
        client, [ledger_agent(ledger, tool_timeout=args.tool_timeout)], task_queue=args.task_queue,
        pool=PoolSettings(max_processes=args.max_processes),
        identity=args.identity or f"ledger-{os.getpid()}",
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=args.sticky), unsigned_approvals=True,
        tracing=bool(args.spans),
        **({"max_concurrent_workflow_tasks": args.workflow_tasks} if args.workflow_tasks else {}),
        **({"max_cached_workflows": args.cache} if args.cache is not None else {}),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if args.standby:
        print(f"{STANDBY} {os.getpid()}", flush=True)
        while not os.path.exists(args.standby):
            await asyncio.sleep(0.02)
    async with worker:
        print(f"{READY} {os.getpid()}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """Run the worker; leave with `os._exit` (a Temporal client can abort at interpreter exit)."""
    asyncio.run(serve(_arguments(argv)))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
