"""Bad input at the edges: each a clear error from the Python API and the CLI, a non-zero exit, nothing started.

Wrong agent names, empty prompts, malformed message histories, unknown run ids, runs whose worker is gone, a
server that is not there.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ModelResponse, TextPart, UserPromptPart
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from durable_codemode import (
    CodeModeAgent,
    CodeModeUserError,
    InvalidRunInputError,
    RunNotFoundError,
    WorkerBusyError,
    WorkerUnavailableError,
    connect,
    decide,
    decide_all,
    pending_approvals,
    run_agent,
    start_run,
)
from durable_codemode.cli import run_cli
from durable_codemode.debugging import fetch_chain, fetch_history, replay_run, trace_run
from durable_codemode.testing import RunCode, new_task_queue, replay, running_worker, scripted_model

from .test_demo import _codemode

NOWHERE = "127.0.0.1:1"


def echo_agent(name: str) -> CodeModeAgent:
    """Answers with the last user prompt it was given."""
    def answer(messages: Any) -> str:
        prompts = [p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
                   if isinstance(p, UserPromptPart)]
        return f"you said {prompts[-1]!r}"

    return CodeModeAgent(Agent(scripted_model(answer), name=name))


async def never_started(client: Client, run_id: str) -> bool:
    try:
        await client.get_workflow_handle(run_id).describe()
    except RPCError as e:
        return e.status == RPCStatusCode.NOT_FOUND
    return False


BAD_HISTORIES: list[tuple[Any, str]] = [
    ("not a list", "must be a list of pydantic-ai messages"),
    ([{"kind": "nonsense"}], "is not a list of pydantic-ai messages"),
    ([1, 2], "is not a list of pydantic-ai messages"),
]


async def test_bad_run_input_is_refused_before_anything_starts(client: Client) -> None:
    tq = new_task_queue()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"agent": "echo", "prompt": ""}, "the prompt is empty"),
        ({"agent": "echo", "prompt": "   \n"}, "the prompt is empty"),
        ({"agent": "", "prompt": "hi"}, "non-empty agent name"),
        ({"agent": Agent(name="echo"), "prompt": "hi"},
         "got an object of type Agent: wrap a pydantic-ai Agent as CodeModeAgent"),
        ({"agent": "echo", "prompt": 42}, "the prompt must be a string"),
        ({"agent": "echo", "prompt": "", "message_history": [ModelResponse(parts=[TextPart("hello")])]},
         "the prompt is empty"),  # a history that ends with a response leaves nothing to answer
        *(({"agent": "echo", "prompt": "hi", "message_history": h}, m) for h, m in BAD_HISTORIES),
    ]
    for kwargs, message in cases:
        run_id = f"bad-{uuid.uuid4().hex[:8]}"
        with pytest.raises(InvalidRunInputError, match=message):
            await start_run(client, task_queue=tq, run_id=run_id, **kwargs)
        assert await never_started(client, run_id), kwargs
    assert issubclass(InvalidRunInputError, ValueError) and issubclass(InvalidRunInputError, CodeModeUserError)


async def test_a_history_as_json_dicts_continues_a_conversation(client: Client) -> None:
    history = ModelMessagesTypeAdapter.dump_python([ModelRequest(parts=[UserPromptPart("from before")])],
                                                   mode="json")
    tq = new_task_queue()
    async with running_worker(client, [echo_agent("echo")], task_queue=tq):
        handle = await start_run(client, "echo", "", message_history=history, task_queue=tq)
        result = await handle.result()
    assert result.output == "you said 'from before'"
    await replay(handle)


async def test_an_agent_the_worker_does_not_serve_fails_fast_and_clearly(client: Client) -> None:
    tq = new_task_queue()
    run_id = f"wrong-agent-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, [echo_agent("echo")], task_queue=tq):
        started = time.monotonic()
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(run_agent(client, "cart", "hi", task_queue=tq, run_id=run_id), 30)
        took = time.monotonic() - started
    cause = failure.value.cause
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause
    assert "no agent named 'cart' is served here (known agents: 'echo')" in str(cause)
    assert took < 10  # not retried: a missing agent is final
    history = await client.get_workflow_handle(run_id).fetch_history()
    types = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in types
    assert types[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in types  # no model turn, no tool call


def test_a_worker_without_a_sandbox_binary_refuses_to_start(client: Client, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    from durable_codemode import create_worker

    # Without the check the worker started, and every run wedged at its first snippet: the pool could not spawn a
    # process inside a workflow task, which Temporal retried forever.
    monkeypatch.setenv("MONTY_BIN", str(tmp_path / "no-such-monty"))
    with pytest.raises(CodeModeUserError, match=r"cannot run sandboxes: the `monty` binary .*no-such-monty.*MONTY_BIN"):
        create_worker(client, [echo_agent("echo")], task_queue=new_task_queue())


async def test_unknown_run_ids(client: Client) -> None:
    run_id = f"nosuch-{uuid.uuid4().hex[:8]}"
    calls = [pending_approvals(client, run_id), decide(client, run_id, "call_0.0", approved=True),
             decide_all(client, run_id, approved=False), fetch_history(client, run_id), fetch_chain(client, run_id),
             replay_run(client, run_id), trace_run(client, run_id)]
    for call in calls:
        with pytest.raises(RunNotFoundError, match=f"no run with id '{run_id}'.*TEMPORAL_ADDRESS"):
            await call


async def test_a_run_without_a_worker_is_a_clear_error_not_a_hang(client: Client) -> None:
    tq = new_task_queue()
    handle = await start_run(client, "echo", "hi", task_queue=tq)  # no worker polls this queue
    try:
        started = time.monotonic()
        with pytest.raises(WorkerUnavailableError, match=f"no worker polls task queue '{tq}', where run") as error:
            await pending_approvals(client, handle.id, timeout=timedelta(seconds=1))
        assert not isinstance(error.value, WorkerBusyError) and error.value.pollers == ()
        assert error.value.task_queue == tq and "start a worker" in str(error.value)
        with pytest.raises(WorkerUnavailableError, match=r"took the decision \(so nothing was recorded\)"):
            await decide(client, handle.id, "call_0.0", approved=True, timeout=timedelta(seconds=1))
        assert time.monotonic() - started < 8
    finally:
        await handle.terminate("test cleanup")


async def test_a_busy_worker_is_not_called_missing(client: Client) -> None:
    # Before, any query past its deadline said "start a worker", also while one ran, busy with its workflow task
    # slots (34 times while one worker started 1,000 runs). The task queue's pollers tell the two apart.
    gate, holding = asyncio.Event(), asyncio.Event()
    agent = Agent(scripted_model(RunCode("await hold()"), "done"), name="busy-echo")

    @agent.tool_plain
    async def hold() -> str:
        """Answer once the test opens its gate."""
        holding.set()
        await gate.wait()
        return "held"

    async with running_worker(client, [CodeModeAgent(agent)]) as worker:
        handle = await start_run(client, "busy-echo", "go", task_queue=worker.task_queue)
        # Asked only once the worker has taken the run's tasks: a worker that has just started may not have polled
        # yet, and then the server rightly lists no poller (so the error says to start one).
        await holding.wait()
        # A deadline no worker can meet (a query takes milliseconds): the worker polls, so it was only not in time.
        busy = f"though 1 worker polls its task queue '{worker.task_queue}'"
        with pytest.raises(WorkerBusyError, match=busy) as error:
            await pending_approvals(client, handle.id, timeout=timedelta(microseconds=1))
        assert error.value.task_queue == worker.task_queue and len(error.value.pollers) == 1
        assert "start a worker" not in str(error.value) and "max_concurrent_workflow_tasks" in str(error.value)
        gate.set()
        assert (await handle.result()).output == "done"
    await replay(handle)


async def test_no_server_is_a_fast_one_line_error() -> None:
    started = time.monotonic()
    with pytest.raises(CodeModeUserError) as error:
        await connect(NOWHERE)
    assert time.monotonic() - started < 5
    message = str(error.value)
    assert f"cannot reach a Temporal server at {NOWHERE} (connection refused" in message
    assert "TEMPORAL_ADDRESS" in message and "\n" not in message


async def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], address: str,
              *args: str) -> tuple[int, str]:
    """`codemode ARGS` through `run_cli`, with TEMPORAL_ADDRESS set; its exit status and stderr."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    capsys.readouterr()
    code = await asyncio.to_thread(run_cli, list(args))
    return code, capsys.readouterr().err


async def test_cli_entry_point_without_a_server() -> None:
    started = time.monotonic()
    rc, _out, err = await _codemode(NOWHERE, "approvals", "some-run")
    assert rc == 2 and "Traceback" not in err
    assert err.strip() == (f"codemode: cannot reach a Temporal server at {NOWHERE} (connection refused: nothing "
                           "listens on that port). Start one with `codemode dev` (embedded dev server and worker), "
                           "or set TEMPORAL_ADDRESS to your server's host:port.")
    assert time.monotonic() - started < 30  # the process's imports included, on a shared machine


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_cli_bad_input(client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    address = client.service_client.config.target_host
    (tmp_path / "not.json").write_text("{oops")
    (tmp_path / "wrong.json").write_text(json.dumps([{"kind": "nonsense"}]))
    tq = new_task_queue()
    lost = f"nosuch-{os.urandom(4).hex()}"
    waiting_queue = new_task_queue()
    waiting = await start_run(client, "echo", "hi", task_queue=waiting_queue)  # nobody serves its queue
    # (arguments, TEMPORAL_ADDRESS, exit status, what stderr says)
    cases: list[tuple[tuple[str, ...], str, int, tuple[str, ...]]] = [
        (("run", "echo", "", "--task-queue", tq), NOWHERE, 2, ("the prompt is empty",)),
        (("run", "echo", "hi", "--messages", str(tmp_path / "not.json")), NOWHERE, 2, ("is not JSON",)),
        (("run", "echo", "hi", "--messages", str(tmp_path / "wrong.json")), NOWHERE, 2,
         ("not a list of pydantic-ai messages",)),
        (("run", "echo", "hi", "--messages", str(tmp_path / "missing.json")), NOWHERE, 2,
         ("cannot read the messages file",)),
        (("run", "nosuch", "hi", "--task-queue", tq), address, 1, ("no agent named 'nosuch'",)),
        (("run", "echo", "hi", "--task-queue", tq, "--model", "nosuchprovider:x"), address, 2,
         ("the run's model 'nosuchprovider:x': pydantic-ai does not know it",)),
        (("runs",), NOWHERE, 2, (f"cannot reach a Temporal server at {NOWHERE}", "TEMPORAL_ADDRESS")),
        (("run", "echo", "hi"), NOWHERE, 2, (f"cannot reach a Temporal server at {NOWHERE}",)),
        (("approvals", lost), address, 2, (f"no run with id '{lost}'",)),
        (("approve", lost, "call_0.0"), address, 2, (f"no run with id '{lost}'",)),
        (("deny", lost, "--all"), address, 2, (f"no run with id '{lost}'",)),
        (("history", lost), address, 2, (f"no run with id '{lost}'",)),
        (("trace", lost), address, 2, (f"no run with id '{lost}'",)),
        (("replay", lost), address, 2, (f"no run with id '{lost}'",)),
        (("replay", "--history", str(tmp_path / "not.json")), address, 2, ("not a history file",)),
        (("approvals", waiting.id), address, 2, (f"no worker polls task queue '{waiting_queue}', where run "
                                                  f"'{waiting.id}' is served",)),
    ]
    try:
        async with running_worker(client, [echo_agent("echo")], task_queue=tq):
            # In this process (one at a time, in a thread, as the worker lives on this loop): a subprocess per
            # command costs seconds of imports on a shared machine. `main()` itself is run as a process below.
            done = [await cli(monkeypatch, capsys, addr, *args) for args, addr, _, _ in cases]
    finally:
        await waiting.terminate("test cleanup")
    problems = []
    for (args, _, code, says), (rc, err) in zip(cases, done, strict=True):
        if rc != code or not all(s in err for s in says) or "Traceback" in err:
            problems.append(f"codemode {' '.join(args)}: exit {rc} (wanted {code}), stderr {err.strip()[-300:]!r}")
    assert not problems, "\n".join(problems)
    # Only the run naming an unknown agent started (and failed); the refused ones never did.
    assert (await client.count_workflows(f"TaskQueue = '{tq}'")).count <= 1
