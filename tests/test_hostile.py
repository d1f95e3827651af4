"""Hostile and broken programs: a corpus, each with the outcome the model must see, all run at once on one worker.

For every program: the model gets a clear message (checked by substring), the run goes on (a second, ordinary
snippet in the same run works), no workflow task of its chain failed, its history replays, and no sandbox
process is left checked out. Well-behaved runs on the same worker, before, during and after, complete correctly.
The "Hostile and broken programs" table of docs/reliability.md is this corpus (`corpus_table()`); a test keeps
the two in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHandle

from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    PoolSettings,
    RunResult,
    SnippetLimits,
    ToolOptions,
    decide,
    start_run,
)
from durable_codemode.testing import (
    RunCode,
    child_processes,
    fetch_chain_histories,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)
from durable_codemode.worker import _pool

MIB = 1024 * 1024
SECRET_ENV = "CODEMODE_HOSTILE_SECRET"


@dataclass(frozen=True)
class Hostile:
    """One program of the corpus and what the model must be told."""

    attempt: str
    """What the program tries, for the table in docs/reliability.md."""
    code: str
    outcome: str
    """The outcome category, for the table in docs/reliability.md."""
    expect: tuple[str, ...]
    """Substrings of what the model sees after the program (its `run_code` result or retry message)."""
    limits: SnippetLimits | None = None
    deny: bool = False
    """Deny the program's first approval request while it waits."""


SMALL = SnippetLimits(max_memory_bytes=32 * MIB)
REFUSED_FILES = "no file system or network"
NO_MODULE = "run_code programs have no processes, files or network"
COMPUTE = ("The program was stopped", "a runaway loop", "The REPL is as it was before this run_code call")
RUNAWAY = SnippetLimits(max_compute_seconds=1)
"""A runaway bound the corpus can wait for (the default is 60 s)."""
STOPPED = ("The program was stopped", "host calls in a row", "The REPL was restarted")

CORPUS: tuple[Hostile, ...] = (
    # -- escape attempts
    Hostile("read a file (`Path('/etc/passwd').read_text()`)",
            "from pathlib import Path\nPath('/etc/passwd').read_text()",
            "`PermissionError` in the program", ("PermissionError", REFUSED_FILES)),
    Hostile("`open('/etc/passwd')`", "open('/etc/passwd').read()",
            "not run: type error (`open` is not defined)", ("The code was not run", "`open` used when not defined")),
    Hostile("`import os; os.system('sh')`", "import os\nos.system('sh')",
            "not run: type error", ("The code was not run", "`os` has no member `system`")),
    Hostile("`import subprocess`", "import subprocess\nsubprocess.run(['sh'])",
            "`ModuleNotFoundError` naming what can be imported", ("No module named 'subprocess'", NO_MODULE)),
    Hostile("`import socket`", "import socket\nsocket.socket()",
            "`ModuleNotFoundError`", ("No module named 'socket'", NO_MODULE)),
    Hostile("`__import__('os')`", "__import__('os').system('sh')",
            "not run: type error", ("The code was not run", "`__import__` used when not defined")),
    Hostile("`().__class__.__bases__[0].__subclasses__()`", "().__class__.__bases__[0].__subclasses__()",
            "`AttributeError`", ("AttributeError", "has no attribute '__class__'")),
    Hostile("`getattr(get, '__globals__')`", "getattr(get, '__globals__')",
            "not run: type error", ("The code was not run", "`getattr` used when not defined")),
    Hostile("read env outside the allow-list (`os.getenv`)",
            f"import os\n[os.getenv('{SECRET_ENV}'), os.getenv('HOME')]",
            "unset (`None`)", ('"result": [null, null]',)),
    Hostile("read env outside the allow-list (`os.environ[...]`)", f"import os\nos.environ['{SECRET_ENV}']",
            "`KeyError`", (f"KeyError: {SECRET_ENV}",)),
    # -- compute, memory, recursion, output
    Hostile("infinite loop (`while True: pass`)", "while True:\n    pass",
            "goes on in the compute activity, stopped past `max_compute_seconds`: error, REPL as before the snippet",
            COMPUTE, RUNAWAY),
    Hostile("CPU burn in one builtin (`sum(range(10**12))`)", "sum(range(10**12))",
            "the same (stopped inside the builtin)", COMPUTE, RUNAWAY),
    Hostile("infinite loop inside `try/except BaseException`",
            "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass",
            "the same (not catchable)", COMPUTE, RUNAWAY),
    Hostile("memory bomb (`'a' * 10**10`)", "x = 'a' * (10**10)", "`MemoryError`",
            ("MemoryError", "memory limit exceeded"), SMALL),
    Hostile("memory growth in a loop", "x = []\nwhile True:\n    x.append('a' * 10**6)", "`MemoryError`",
            ("MemoryError", "memory limit exceeded"), SMALL),
    Hostile("deep recursion", "def f(n):\n    return f(n + 1)\nf(0)", "`RecursionError`",
            ("RecursionError", "maximum recursion depth")),
    Hostile("output flood (20 MB printed)", "for i in range(200_000):\n    print('x' * 100)",
            "stopped at the print past 64 KiB; the text up to there kept, with a note",
            ("printed more than the 65,536-byte output limit", "max_output_bytes")),
    Hostile("a 10 MB last value", "'x' * 10_000_000", "result cut, with a note",
            ("result_truncated", "Output over the 65,536-byte limit")),
    Hostile("last value: bytes that are not UTF-8", "b'\\xff\\x00'", "shown as its repr", ("b'\\\\xff\\\\x00'",)),
    Hostile("last value nested 100,000 deep", "x = []\nfor i in range(100_000):\n    x = [x]\nx",
            "shown cut at 100 levels", ("nested deeper than 100 levels",)),
    # -- tool calls
    Hostile("`gather` of 100,000 calls",
            "import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range(100_000)))",
            "`RuntimeError`: tool call limit", ("tool call limit reached", "a program may make 500 tool calls")),
    Hostile("`gather` of 2,500 calls (limit raised to 3,000)",
            "import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range(2_500)))",
            "`RuntimeError`: at most 500 calls in flight", ("500 tool calls are already in flight",
                                                            "gather at most 500 calls at a time"),
            SnippetLimits(max_tool_calls=3_000)),
    Hostile("a sandbox function as an argument", "from typing import Any\nv: Any = len\nawait echo(value=v)",
            "`TypeError`: not JSON", ("TypeError", "tools take JSON values")),
    Hostile("bytes as an argument", "from typing import Any\nv: Any = b'\\xff'\nawait echo(value=v)",
            "`TypeError`: not JSON", ("TypeError", "is a bytes value")),
    Hostile("`float('nan')` as an argument", "await echo(value=float('nan'))", "`TypeError`: not JSON",
            ("TypeError", "JSON cannot represent")),
    Hostile("a 5 MiB string argument", "await echo(value='x' * (5 * 1024 * 1024))",
            "`ValueError`: argument too large, the call does not run",
            ("ValueError", "over the 1,048,576-byte limit for one tool call", "max_tool_args_bytes")),
    Hostile("20 gathered 250 kB arguments (5 MB in one workflow task)",
            "import asyncio\nawait asyncio.gather(*(echo(value='x' * 250_000) for i in range(20)))",
            "`RuntimeError`: too many argument bytes in flight", ("the calls in flight already carry",)),
    Hostile("a tool returning 3 MiB (over Temporal's 2 MiB payload limit)", "r = await big(n=3 * 1024 * 1024)",
            "`RuntimeError`: result too large (the call ran)",
            ("over the 1,048,576-byte limit for one tool result", "max_tool_result_bytes", "the call did run")),
    # -- programs that swallow every exception
    Hostile("retry a refused call forever, swallowing the error",
            "from pathlib import Path\nwhile True:\n    try:\n        Path('/x').read_text()\n    except Exception:\n"
            "        pass", "stopped after 2,000 host calls without a wait; REPL restarted", STOPPED),
    Hostile("busy-wait on the clock (`while time.time() < t0 + 1`)",
            "import time\nt0 = time.time()\nwhile time.time() < t0 + 1:\n    pass", "stopped (time is frozen)",
            STOPPED),
    Hostile("keep calling past the tool call limit, swallowing the error",
            "while True:\n    try:\n        await get(i=1)\n    except Exception:\n        pass", "stopped", STOPPED,
            SnippetLimits(max_tool_calls=5)),
    Hostile("call a tool after a denial",
            "try:\n    await refund(cents=5)\nexcept PermissionError as e:\n    denied = str(e)\n"
            "[denied, await get(i=2)]", "`PermissionError` at the call; later calls run",
            ("refund() was denied by tester: not today", "20]"), deny=True),
)


def seen_by_model(messages: list[ModelMessage]) -> list[Any]:
    """Every tool return the model was given, in order (results, errors, retry messages)."""
    return [p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart)]


def hostile_agent(name: str, entry: Hostile) -> CodeModeAgent:
    # The program, then an ordinary snippet: the run must go on after any of them.
    model = scripted_model(RunCode(entry.code), RunCode("await get(i=4)"),
                           lambda m: json.dumps(seen_by_model(m), default=repr))
    agent = Agent(model, name=name, instructions="Use run_code.")

    @agent.tool_plain
    def get(i: int) -> int:
        """Ten times i."""
        return i * 10

    @agent.tool_plain
    def echo(value: Any) -> int:
        """The length of the value's text."""
        return len(str(value))

    @agent.tool_plain
    def big(n: int) -> str:
        """A text of n characters."""
        return "x" * n

    @agent.tool_plain
    def refund(cents: int) -> str:
        """Refund (a person approves each)."""
        return f"refunded {cents}"

    return CodeModeAgent(agent, limits=entry.limits,
                         tool_options={"refund": ToolOptions(requires_approval=True)})


def good_agent(name: str) -> CodeModeAgent:
    code = "import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range(50)))\nsum(r)"
    agent = Agent(scripted_model(RunCode(code), lambda m: json.dumps(seen_by_model(m))), name=name)

    @agent.tool_plain
    def get(i: int) -> int:
        """Ten times i."""
        return i * 10

    return CodeModeAgent(agent)


def corpus_table() -> str:
    """The table of hostile programs and their outcomes in docs/reliability.md."""
    rows = ["| program | outcome (what the model sees) |", "|---|---|"]
    rows += [f"| {e.attempt} | {e.outcome} |" for e in CORPUS]
    return "\n".join(rows)


async def task_failures(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Each failed workflow task of the run's chain: its cause, the failure's type and message, its stack's end.

    All of it, not the message alone: a failure once came with an empty message, which said nothing to chase.

    Not the server's flush of buffered events (`FORCE_CLOSE_COMMAND` with no failure attached): over 100 events
    arriving while a task runs (a gather's 500 results, on a loaded machine) make the server close the task and
    hand it out again with them. That is Temporal's own limit (`history.maximumBufferedEventsBatch`), nothing of
    the run fails or is lost, and no worker can prevent it.
    """
    failures = []
    for history in await fetch_chain_histories(handle):
        for event in history.events:
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                continue
            attributes = event.workflow_task_failed_event_attributes
            if (attributes.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND
                    and not attributes.failure.message):
                continue
            failure = attributes.failure
            kind = failure.application_failure_info.type if failure.HasField("application_failure_info") else ""
            stack = failure.stack_trace.strip().splitlines()[-3:]
            failures.append(f"{WorkflowTaskFailedCause.Name(attributes.cause)} (event {event.event_id}): "
                            f"{kind or 'failure'}: {failure.message!r}; stack ends: {' | '.join(stack) or 'none'}")
    return failures


@pytest.fixture
async def roomy_pool() -> AsyncIterator[int]:
    """A pool with room for the corpus's concurrent snippets, so no run waits for a sandbox process."""
    assert _pool.POOL.live_sessions() == 0
    _pool.shutdown_pool()
    settings = PoolSettings(max_processes=6)
    _pool.POOL.configure(settings)
    # Started now, not by the runs: a process spawned inside a workflow task on this shared machine can take
    # long enough to trip Temporal's 2 s deadlock detector.
    # The same goes for each process's first type check (it loads the checker).
    with contextlib.ExitStack() as sessions:  # all at once, so each is a process of its own
        for _ in range(settings.max_processes):
            sessions.enter_context(_pool.POOL.session({"type_check": True})).feed_start("x: int = 1\nx + 1")
    assert _pool.POOL.wait_given_back()
    yield settings.max_processes
    _pool.shutdown_pool()
    _pool.POOL.configure(PoolSettings())


async def deny_first(client: Client, handle: WorkflowHandle[Any, Any]) -> None:
    for _ in range(600):
        pending = await handle.query(CodeModeRunWorkflow.pending_approvals)
        if pending:
            await decide(client, handle.id, pending[0].call_id, approved=False, note="not today", approver="tester")
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the program never asked for approval")


@pytest.mark.slow
@pytest.mark.xdist_group("cpu-heavy")  # one at a time (tests/conftest.py)
@pytest.mark.timeout(180)
async def test_hostile_corpus(client: Client, roomy_pool: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "hunter2")
    names = [f"hostile{i}-{os.urandom(2).hex()}" for i in range(len(CORPUS))]
    agents = [hostile_agent(n, e) for n, e in zip(names, CORPUS, strict=True)]
    goods = [good_agent(f"good{i}-{os.urandom(2).hex()}") for i in range(3)]
    tq = new_task_queue()
    gate = asyncio.Semaphore(4)  # a few at a time: the machine is shared, and compute limits are wall time

    async def run(name: str, deny: bool = False) -> tuple[RunResult, WorkflowHandle[Any, RunResult]]:
        async with gate:
            handle = await start_run(client, name, "go", task_queue=tq)
            if deny:
                await deny_first(client, handle)
            return await asyncio.wait_for(handle.result(), 60), handle

    async with running_worker(client, [*agents, *goods], task_queue=tq, pool=PoolSettings(max_processes=roomy_pool),
                              unsigned_approvals=True):
        first = await run(goods[0].name)
        hostile = [asyncio.ensure_future(run(n, e.deny)) for n, e in zip(names, CORPUS, strict=True)]
        during = asyncio.ensure_future(run(goods[1].name))
        results = await asyncio.gather(*hostile)
        after = await run(goods[2].name)
        good_runs = [first, await during, after]
        # Nothing spawned past the pools, nothing left spinning.
        assert len(child_processes()) <= _pool.max_sandbox_processes(PoolSettings(max_processes=roomy_pool))

    problems = []
    for entry, (result, handle) in zip(CORPUS, results, strict=True):
        seen = json.loads(result.output)
        text = json.dumps(seen[0]) if not isinstance(seen[0], str) else seen[0]
        missing = [s for s in entry.expect if s not in text]
        if missing:
            problems.append(f"{entry.attempt}: missing {missing} in what the model saw: {text[:300]}")
        if seen[-1] != {"result": 40}:
            problems.append(f"{entry.attempt}: the next snippet of the run gave {seen[-1]!r}")
        if failed := await task_failures(handle):
            problems.append(f"{entry.attempt}: workflow task failed: {failed[0][:600]}")
        await replay(handle)
    for result, handle in good_runs:
        assert json.loads(result.output) == [{"result": sum(i * 10 for i in range(50))}]
        assert not await task_failures(handle)
        await replay(handle)
    assert not problems, "\n".join(problems)
    assert _pool.POOL.live_sessions() == 0


def test_reliability_page_lists_the_corpus() -> None:
    page = (Path(__file__).parent.parent / "docs" / "reliability.md").read_text()
    rows = corpus_table().splitlines()[2:]
    missing = [row for row in rows if row not in page]
    assert not missing, "docs/reliability.md lacks rows (paste tests.test_hostile.corpus_table()):\n" + (
        "\n".join(missing))
