"""Debugging from histories: export, trace, replay offline, and divergence reports that name snippet, line and call.

The divergences are made by editing a recorded history (its JSON), because nothing a deploy changes in an agent
alters how an old run replays: tools, stubs and limits are recorded at the start of the run. What an edit does is
what a changed runtime would do: the replayed program calls another tool, or passes other arguments.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from durable_codemode import RunResult, SnippetLimits, decide, start_run
from durable_codemode.debugging import (
    fetch_chain,
    histories_from_json,
    histories_to_json,
    list_runs,
    register_agents,
    render_replay,
    render_trace,
    replay_histories,
    replay_run,
    trace_histories,
    trace_run,
)
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker

from . import _rules_worker
from ._agents import items_agent
from ._forked import run_codemode
from .test_approvals import refunds_agent, wait_pending
from .test_demo import _cli_env

CODE = """a = await get(i=1)
b = await get(i=2)
try:
    await fail(kind='value')
except ValueError:
    pass
[a, b]"""


def echo(messages: Any) -> str:
    return repr(last_result(messages))


async def codemode(*args: str, address: str | None = None) -> tuple[int, str, str]:
    """Run `codemode` in a child process (`tests/_forked.py`); `address=None` points it at a port no server has."""
    return await run_codemode(args, env=_cli_env(TEMPORAL_ADDRESS=address or "127.0.0.1:1"),
                              cwd=Path(__file__).parent.parent, timeout=120)


def address(client: Client) -> str:
    return client.service_client.config.target_host


async def completed(client: Client, *steps: Any, tq: str | None = None,
                    **options: Any) -> tuple[WorkflowHandle[Any, RunResult], RunResult]:
    name = f"dbg{os.urandom(3).hex()}"
    agent = items_agent(name, *steps, **options)
    tq = tq or new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, name, "go", task_queue=tq)
        result = await handle.result()
    await replay(handle)  # every completed run replays cleanly
    return handle, result


# -- editing recorded histories ------------------------------------------------------------------------------


def _edit(payload: dict[str, Any], change: Callable[[Any], None]) -> None:
    value = json.loads(base64.b64decode(payload["data"]))
    change(value)
    payload["data"] = base64.b64encode(json.dumps(value).encode()).decode()


def with_code(history: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    """The history with the first `run_code` snippet's code (in the recorded model response) changed."""
    edited = copy.deepcopy(history)
    for event in edited["events"]:
        done = event.get("activityTaskCompletedEventAttributes")
        if done is None:
            continue
        payload = done["result"]["payloads"][0]
        if b"run_code" not in base64.b64decode(payload["data"]):
            continue

        def edit_code(response: Any) -> None:
            part = next(p for p in response["parts"] if p.get("tool_name") == "run_code")
            part["args"]["code"] = change(part["args"]["code"])

        _edit(payload, edit_code)
        return edited
    raise AssertionError("no recorded run_code snippet")


def with_activity_type(history: dict[str, Any], call_id: str, activity_type: str) -> dict[str, Any]:
    edited = copy.deepcopy(history)
    for event in edited["events"]:
        scheduled = event.get("activityTaskScheduledEventAttributes")
        if scheduled and scheduled["activityId"].startswith(call_id + "-"):
            scheduled["activityType"]["name"] = activity_type
            return edited
    raise AssertionError(f"no call {call_id}")


def with_limits(history: dict[str, Any], **limits: Any) -> dict[str, Any]:
    """The history with the limits in the recorded agent spec (the `describe_agent` marker) changed."""
    edited = copy.deepcopy(history)
    for event in edited["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if marker and b"describe_agent" in base64.b64decode(marker["details"]["data"]["payloads"][0]["data"]):
            _edit(marker["details"]["result"]["payloads"][0], lambda spec: spec["limits"].update(limits))
            return edited
    raise AssertionError("no describe_agent marker")


async def report_of(history: dict[str, Any]) -> Any:
    return await replay_histories(histories_from_json(json.dumps(history)))


# -- tests ---------------------------------------------------------------------------------------------------


async def test_a_completed_run_replays_cleanly_with_counts(client: Client) -> None:
    handle, _ = await completed(client, RunCode(CODE), echo)
    report = await replay_run(client, handle.id)
    assert report.ok and not report.divergences
    assert (report.model_turns, report.snippets, report.nested_calls) == (2, 1, 3)
    rc, out, err = await codemode("replay", handle.id, address=address(client))
    assert rc == 0, err
    assert "ok, 2 model turns, 1 snippet, 3 nested calls" in out and "no activity ran" in out

    trace = await trace_run(client, handle.id)
    assert trace.status == "completed" and trace.output is not None
    assert [(c.call_id, c.tool, c.args, c.status, c.line) for c in trace.nested_calls] == [
        ("call_0.0", "get", {"i": 1}, "ok", 1), ("call_0.1", "get", {"i": 2}, "ok", 2),
        ("call_0.2", "fail", {"kind": "value"}, "error", 4)]
    assert trace.nested_calls[2].error == "ValueError: bad value"
    assert all(c.duration_s is not None and c.attempts == 1 for c in trace.nested_calls)
    assert trace.snippets[0].result == '{"result": [10, 20]}'


async def test_changed_arguments_name_the_snippet_line_and_call(client: Client) -> None:
    handle, _ = await completed(client, RunCode(CODE), echo)
    (history,) = await fetch_chain(client, handle.id)
    report = await report_of(with_code(history.to_json_dict(), lambda c: c.replace("get(i=2)", "get(i=7)")))
    assert not report.ok
    (div,) = report.divergences
    assert div.cause == "arguments_changed"
    assert (div.turn, div.snippet, div.line, div.call_id) == (0, "call_0", 2, "call_0.1")
    assert div.source_line == "b = await get(i=7)"
    assert div.recorded is not None and div.replayed is not None
    assert (div.recorded.tool, div.recorded.args, div.replayed.tool, div.replayed.args) == ("get", {"i": 2}, "get",
                                                                                          {"i": 7})
    # Same call, same tool: only the digest of the arguments in the activity id differs.
    assert div.recorded.activity_id and div.replayed.activity_id
    assert div.recorded.activity_id.split("-")[0] == div.replayed.activity_id.split("-")[0] == "call_0.1"
    assert div.recorded.activity_id != div.replayed.activity_id
    text = render_replay(report)
    assert "DIVERGED" in text and "model turn 0, snippet call_0, line 2, call call_0.1" in text
    assert "recorded  get(i=2)" in text and "replayed  get(i=7)" in text and "arguments changed" in text
    assert "TMPRL1100" in text


async def test_a_renamed_tool_names_the_call_and_both_activity_types(client: Client) -> None:
    handle, _ = await completed(client, RunCode(CODE), echo)
    (history,) = await fetch_chain(client, handle.id)
    agent = history.events[0].workflow_execution_started_event_attributes.memo.fields["agent"].data.decode()
    name = json.loads(agent)
    report = await report_of(with_activity_type(history.to_json_dict(), "call_0.1", f"{name}.fetch_item"))
    (div,) = report.divergences
    assert div.cause == "tool_renamed"
    assert (div.turn, div.snippet, div.line, div.call_id) == (0, "call_0", 2, "call_0.1")
    assert div.recorded is not None and div.replayed is not None
    assert (div.recorded.tool, div.recorded.activity_type) == ("fetch_item", f"{name}.fetch_item")
    assert (div.replayed.tool, div.replayed.activity_type) == ("get", f"{name}.get")
    assert "tool renamed" in render_replay(report)


async def test_limits_are_recorded_so_a_limit_change_is_found_only_in_the_recording(client: Client) -> None:
    handle, _ = await completed(client, RunCode(CODE), echo)
    (history,) = await fetch_chain(client, handle.id)
    # A feature: the worker's agent now has far lower limits, and the old run replays exactly as before.
    name = json.loads(history.events[0].workflow_execution_started_event_attributes.memo.fields["agent"].data)
    register_agents([items_agent(name, limits=SnippetLimits(max_tool_calls=1, max_output_bytes=10))])
    assert (await replay_histories([history])).ok
    # With the recorded limits themselves changed, the replayed program stops at its second call.
    report = await report_of(with_limits(history.to_json_dict(), max_tool_calls=1))
    (div,) = report.divergences
    assert div.cause == "sandbox_limits"
    assert (div.turn, div.snippet, div.line, div.call_id) == (0, "call_0", 2, "call_0.1")
    assert div.replayed_result is not None and "tool call limit reached" in div.replayed_result
    assert div.recorded is not None and div.recorded.args == {"i": 2}
    assert div.replayed is not None and div.replayed.what == "model request (turn 1)"
    assert "max_tool_calls=1" in div.explanation


async def test_a_failed_runs_trace_shows_the_failing_call_and_the_failure(client: Client) -> None:
    name = f"dbg{os.urandom(3).hex()}"
    agent = items_agent(name, RunCode("x = await get(i=3)\nawait fail(kind='permission')"), echo,
                        limits=SnippetLimits(max_model_requests=1))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, name, "go", task_queue=tq)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    trace = await trace_run(client, handle.id)
    assert trace.status == "failed" and trace.failure is not None and "model requests" in trace.failure
    failing = trace.call("call_0.1")
    assert failing is not None and (failing.tool, failing.status, failing.line) == ("fail", "error", 2)
    assert failing.error == "PermissionError: nope"
    assert trace.snippets[0].outcome == "error"  # from the replay: the result never reached a model request
    text = render_trace(trace)
    assert "call_0.1  fail(kind=\"permission\")  error  line 2" in text and "✗ PermissionError: nope" in text
    assert "failed: ModelRequestLimitExceeded" in text
    assert (await replay_run(client, handle.id)).ok  # a failed run replays too
    rc, out, err = await codemode("trace", handle.id, "--json", address=address(client))
    assert rc == 0, err
    data = json.loads(out)
    assert data["status"] == "failed"
    assert data["turns"][0]["snippets"][0]["calls"][1]["error"] == "PermissionError: nope"


async def test_a_paused_runs_trace_shows_the_pending_call_online_and_offline(client: Client, tmp_path: Path) -> None:
    code = "total = await lookup(order='A1')\nr = await refund(order='A1', cents=total)\n[total, r]"
    name = f"dbg-refunds-{os.urandom(2).hex()}"
    tq = new_task_queue()
    async with running_worker(client, [refunds_agent(name, code, [])], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, name, "refund A1", task_queue=tq)
        await wait_pending(handle)
        trace = await trace_run(client, handle.id)
        assert trace.status == "running" and trace.state == "waiting for approval"
        (pending,) = trace.pending
        assert (pending.call_id, pending.tool, pending.args, pending.line) == ("call_0.1", "refund",
                                                                               {"order": "A1", "cents": 1234}, 2)
        call = trace.call("call_0.1")
        assert call is not None and call.status == "pending"
        assert trace.snippets[0].outcome == "running"
        text = render_trace(trace)
        assert "waiting for approval of call_0.1" in text
        assert 'call_0.1  refund(order="A1", cents=1234)  pending  line 2  waiting for approval since' in text

        assert (await replay_run(client, handle.id)).ok  # an open run replays up to where it waits
        rc, out, err = await codemode("trace", handle.id, address=address(client))
        assert rc == 0 and "pending  line 2" in out, err
        rc, out, err = await codemode("runs", "--agent", name, address=address(client))
        assert rc == 0 and handle.id in out and "waiting for approval (1)" in out, err
        # The history alone, offline: the replay rebuilds what the run waits for.
        file = tmp_path / "paused.json"
        rc, out, err = await codemode("history", handle.id, "-o", str(file), address=address(client))
        assert rc == 0, err
        offline = await trace_histories(histories_from_json(file.read_text()))
        assert [(p.call_id, p.line) for p in offline.pending] == [("call_0.1", 2)]
        rc, out, err = await codemode("trace", "--history", str(file))  # no server at the address
        assert rc == 0 and "pending  line 2" in out, err

        await decide(client, handle.id, "call_0.1", approved=True, note="fine", approver="ana")
        await handle.result()
    done = await trace_run(client, handle.id)
    call = done.call("call_0.1")
    assert call is not None and call.status == "ok" and call.approval is not None
    assert (call.approval.state, call.approval.approver, call.approval.via) == ("approved", "ana", "update")
    assert "approved by ana (update): fine" in render_trace(done)
    assert (await replay_run(client, handle.id)).ok
    await replay(handle)


async def test_approval_rules_are_read_from_the_history_or_from_the_worker_module(client: Client,
                                                                                  tmp_path: Path) -> None:
    # A run records each verdict of its approval rules (behaviour version 2): its replay and trace need no rule.
    tq = new_task_queue()
    async with running_worker(client, _rules_worker.agents(), task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, _rules_worker.NAME, "go", task_queue=tq)
        (pending,) = await wait_pending(handle)
        file = tmp_path / "rules.json"
        file.write_text(histories_to_json(await fetch_chain(client, handle.id)))
        await decide(client, handle.id, pending.call_id, approved=True)
        await handle.result()
    await replay(handle)
    rc, out, err = await codemode("replay", "--history", str(file))
    assert rc == 0 and "ok, 1 model turn, 1 snippet, 2 nested calls" in out, (out, err)
    rc, out, err = await codemode("trace", "--history", str(file))
    assert rc == 0 and "call_0.1" in out and "pending  line 2" in out, (out, err)
    # A run of behaviour version 1 asks its rules again on replay: it needs the agents' module.
    old = str(Path(__file__).parent / "histories" / "behavior_version_1_rule.json")
    rc, out, err = await codemode("replay", "--history", old)
    assert rc == 2 and "NOT REPLAYED" in out and "--worker MODULE" in out, (out, err)
    assert "line 2, call call_0.0" in out
    rc, out, err = await codemode("replay", "--history", old, "--worker", "tests._rules_worker")
    assert rc == 0 and "ok, 2 model turns, 1 snippet, 2 nested calls" in out, (out, err)
    # The check before a deploy replays the recent runs: this release's need no --worker.
    for _ in range(100):  # visibility is eventually consistent
        if any(r.workflow_id == handle.id for r in await list_runs(client, query=f"TaskQueue = '{tq}'")):
            break
        await asyncio.sleep(0.1)
    rc, out, err = await codemode("replay", "--all", "--query", f"TaskQueue = '{tq}'", address=address(client))
    assert rc == 0 and "1 runs: 1 replayed cleanly" in out, (out, err)


async def test_an_exported_chain_replays_from_the_file_with_no_server(client: Client, tmp_path: Path) -> None:
    handle, result = await completed(client, RunCode("a = await get(i=1)"), RunCode("await get(i=2)"), echo,
                                     limits=SnippetLimits(max_snippets_per_run=1))
    assert result.continued_as_new == 2  # after each snippet, at the next model turn
    file = tmp_path / "chain.json"
    rc, out, err = await codemode("history", handle.id, "--chain", "-o", str(file), address=address(client))
    assert rc == 0 and "3 runs" in out, err
    rc, out, err = await codemode("replay", "--history", str(file))  # TEMPORAL_ADDRESS: nothing listens there
    assert rc == 0, (out, err)
    assert "run 1 of 3" in out and "run 3 of 3" in out and "3 model turns, 2 snippets, 2 nested calls" in out
    runs = json.loads(file.read_text())["runs"]
    runs[1] = with_code(runs[1], lambda c: c.replace("i=2", "i=3"))
    file.write_text(json.dumps({"workflow_id": handle.id, "runs": runs}))
    rc, out, err = await codemode("replay", "--history", str(file))
    assert rc == 1, (out, err)
    assert "run 2 of 3" in out and "model turn 1, snippet call_1, line 1, call call_1.0" in out
    assert "recorded  get(i=2)" in out and "replayed  get(i=3)" in out
    trace = await trace_histories(histories_from_json(file.read_text()), replay=False)
    assert [t.run for t in trace.turns] == [0, 1, 2] and trace.runs[0].status == "continued_as_new"
    assert "continued as new: run 2 of 3" in render_trace(trace)


async def test_a_sandbox_killed_mid_program_replays_cleanly(client: Client) -> None:
    from pydantic_ai import Agent

    from durable_codemode import CodeModeAgent
    from durable_codemode.testing import scripted_model

    from .test_snippets import CRASH_THEN_COMPUTE, _kill_sandbox_processes_when_the_program_runs

    agent = Agent(scripted_model(RunCode("x = 0\n" + CRASH_THEN_COMPUTE), RunCode("1 + 1"), "done"),
                  name="dbg-crashy")

    @agent.tool_plain
    def crash() -> int:
        """Kill the sandbox process running the program, once the program runs again."""
        return _kill_sandbox_processes_when_the_program_runs()

    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent)], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, "dbg-crashy", "go", task_queue=tq)
        await handle.result()
    # The kill is recorded where it happened (the stretch came from the compute activity), so a replay reads
    # the outcome instead of meeting the kill: no divergence, expected or not.
    report = await replay_run(client, handle.id)
    assert report.ok
    (run,) = report.runs
    assert run.verdict == "ok" and run.divergence is None
    assert "computed in an activity" in render_trace(await trace_run(client, handle.id))


async def test_replay_all_and_runs_list_recent_runs(client: Client) -> None:
    tq = new_task_queue()
    ok, _ = await completed(client, RunCode("await get(i=1)"), echo, tq=tq)
    name = f"dbg{os.urandom(3).hex()}"
    agent = items_agent(name, RunCode("await get(i=1)"), echo, limits=SnippetLimits(max_model_requests=1))
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        failed = await start_run(client, name, "go", task_queue=tq)
        with pytest.raises(WorkflowFailureError):
            await failed.result()
    assert (await replay_run(client, failed.id)).ok
    for _ in range(100):  # visibility is eventually consistent
        listed = {r.workflow_id: r.state for r in await list_runs(client, query=f"TaskQueue = '{tq}'")}
        if ok.id in listed and failed.id in listed:
            break
        await asyncio.sleep(0.1)
    assert (listed[ok.id], listed[failed.id]) == ("completed", "failed")
    rc, out, err = await codemode("replay", "--all", "--query", f"TaskQueue = '{tq}'", address=address(client))
    assert rc == 0, (out, err)
    assert ok.id in out and failed.id in out and "2 runs: 2 replayed cleanly" in out
    rc, out, err = await codemode("runs", "--status", "failed", "--query", f"TaskQueue = '{tq}'",
                                  address=address(client))
    assert rc == 0 and failed.id in out and ok.id not in out, err


async def test_an_unknown_run_is_a_clear_usage_error(client: Client) -> None:
    for command in (("trace", "no-such-run"), ("replay", "no-such-run"), ("history", "no-such-run")):
        rc, out, err = await codemode(*command, address=address(client))
        assert rc == 2 and "no run with id 'no-such-run'" in err and "codemode runs" in err, (command, out, err)
