"""What a person reads in the terminal cannot be forged by the text a run carries.

A hostile run puts every control character (C0, DEL, C1), escape sequences that erase a line, move the cursor,
recolour and retitle the terminal, and a bidirectional override into everything the commands print: its run id,
its call ids, its program's source (raw bytes in a comment and in a string), a tool's arguments and result, the
model's answer, a decision's note, and the approver names and call ids of refused decisions. Every command that
shows any of it (`approvals`, `approve`, `audit`, `trace`, `watch`, `runs`, `replay`, `history`, each also as
JSON) must print none of those characters raw, and must still show the text, escaped.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from pydantic_ai import Agent
from temporalio.client import Client, WorkflowUpdateFailedError

from durable_codemode import CodeModeAgent, ToolOptions, start_run, wait_for_approvals
from durable_codemode.shared._results import clip, code_lines, printable
from durable_codemode.testing import RunCode, new_task_queue, replay, running_worker, scripted_model

from .test_debugging import address, codemode, with_activity_type

CONTROL = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)])
"""Every C0 control character, DEL and every C1 control character."""
SEQUENCES = "\x1b[2K\x1b[1G\x1b[32mapproved by bob\x1b[0m\x1b]0;pwned\x07\x9b2K\r\u202e"
"""Erase the line, go to its start, forge a green entry, retitle the terminal, a one-byte CSI, CR, RTL override."""
HOSTILE = CONTROL + SEQUENCES
ARGV = HOSTILE.replace("\x00", "")
"""What a command line can carry (an argument cannot hold NUL)."""
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")
"""Anything a terminal would act on, but the newline that ends a line."""


def shows_nothing_raw(text: str, command: str) -> None:
    found = RAW.search(text)
    assert found is None, (f"`codemode {command}` printed {found.group()!r} raw at {found.start()}: "
                           f"{text[max(0, found.start() - 80):found.start() + 40]!r}")


def test_printable_escapes_every_control_character_once() -> None:
    shown = printable(HOSTILE)
    assert RAW.search(shown) is None and "\n" not in shown
    assert shown.startswith("\\x00\\x01") and "\\t\\n\\x0b\\x0c\\r" in shown and "\\x7f\\x80" in shown
    assert "\\x1b[2K\\x1b[1G" in shown and "\\x9b2K" in shown and shown.endswith("\\r\\u202e")
    assert printable(shown) == shown  # escaping twice changes nothing: a line may pass through it again
    assert printable("ana\nbob\x1b", lines=True) == "ana\nbob\\x1b"
    document = json.dumps({"note": HOSTILE}, ensure_ascii=False, indent=2)
    assert RAW.search(printable(document, json=True)) is None
    assert json.loads(printable(document, json=True)) == {"note": HOSTILE}  # still JSON, same value
    # Lines are numbered as Python numbers them: a form feed or U+2028 does not start a line.
    assert code_lines("a\x0cb\r\nc\rd\u2028e\nf") == ["a\x0cb", "c", "d\u2028e", "f"]


def hostile_agent(name: str) -> CodeModeAgent:
    code = (f"# {HOSTILE.replace(chr(10), '').replace(chr(13), '')}\n"      # raw bytes in a comment, NUL too
            f"r = await fetch(key={HOSTILE!r})\n"                           # arguments with every byte
            "await transfer(to='A\x1b[2K\x1b[1Gsafe', cents=5)\n"          # the overwritten arguments line
            "r")
    agent = Agent(scripted_model(RunCode(code, id=f"call{ARGV}"), lambda m: f"done {HOSTILE}"), name=name)

    @agent.tool_plain
    def fetch(key: str) -> str:
        """Fetch a value."""
        return f"value {key}"

    @agent.tool_plain
    def transfer(to: str, cents: int) -> str:
        """Transfer money."""
        return f"sent {cents} to {to}"

    return CodeModeAgent(agent, tool_options={"transfer": ToolOptions(requires_approval=True)})


async def shown(client: Client, *args: str, rc: int = 0) -> str:
    """Run `codemode ARGS`; it must exit `rc` and print nothing raw (stdout and stderr): its stdout."""
    code, out, err = await codemode(*args, address=address(client))
    command = " ".join(printable(a) for a in args)
    assert code == rc, (command, code, out[-2000:], err[-2000:])
    shows_nothing_raw(out, command)
    shows_nothing_raw(err, command)
    return out


@pytest.mark.slow
async def test_no_command_prints_a_runs_text_raw(client: Client, tmp_path: Path) -> None:
    name = f"hostile-{uuid.uuid4().hex[:6]}"
    run_id = f"{name}-{ARGV}"
    tq = new_task_queue()
    async with running_worker(client, [hostile_agent(name)], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, name, "go", task_queue=tq, run_id=run_id)
        (pending,) = await wait_for_approvals(client, run_id)
        assert pending.call_id == f"call{ARGV}.1" and pending.args["to"] == "A\x1b[2K\x1b[1Gsafe"
        # Refused decisions whose approver and call id are the attacker's text, for `audit` to list.
        for forged in ({"call_id": pending.call_id, "approver": f"mallory{HOSTILE}"},
                       {"call_id": f"nope{HOSTILE}", "approver": "ana", "note": HOSTILE}):
            with pytest.raises(WorkflowUpdateFailedError):
                await handle.execute_update("decide", forged, id=str(uuid.uuid4()))

        listed = await shown(client, "approvals", run_id)
        assert "A\\x1b[2K\\x1b[1Gsafe" in listed  # the arguments and the source line, shown, escaped
        assert json.loads(await shown(client, "approvals", run_id, "--json"))[0]["args"]["to"] == pending.args["to"]
        trail = await shown(client, "audit", run_id)
        assert "REFUSED approval by mallory\\x00\\x01" in trail and "nope\\x00\\x01" in trail
        rejected = json.loads(await shown(client, "audit", run_id, "--json"))["rejected"]
        assert rejected[0]["approver"].startswith(f"mallory{CONTROL[:40]}")  # the JSON keeps the value exactly
        assert "│ 3  await transfer(to='A\\x1b[2K\\x1b[1Gsafe', cents=5)" in await shown(client, "trace", run_id)
        await shown(client, "trace", run_id, "--json")
        assert "waits for approval" in await shown(client, "watch", run_id, rc=3)
        assert f"{name}-\\x01\\x02" in await shown(client, "runs", "--agent", name)

        decided = await shown(client, "approve", run_id, pending.call_id, "--note", ARGV, "--approver", "ana")
        assert decided.startswith("approved call\\x01\\x02")
        await handle.result()

    trail = await shown(client, "audit", run_id)
    assert "by ana  UNSIGNED  via update" in trail and "note: \\x01\\x02" in trail
    assert json.loads(await shown(client, "audit", run_id, "--json"))["decisions"][0]["note"] == ARGV
    tree = await shown(client, "trace", run_id)
    assert "output: done \\x00\\x01" in tree and "answer: done \\x00\\x01" in tree
    assert json.loads(await shown(client, "trace", run_id, "--json"))["approvals"][0]["note"] == ARGV
    answer = await shown(client, "watch", run_id)
    assert "answer: done \\x00\\x01" in answer and "\\x1b[32mapproved by bob" in answer
    await shown(client, "runs", "--agent", name)
    assert "ok, 2 model turns" in await shown(client, "replay", run_id)
    exported = await shown(client, "history", run_id)
    assert json.loads(exported)["events"]

    # A replay that diverges quotes the recorded and the replayed call and the source line: escaped too. The recorded
    # call's type is what is edited, not the program: a run whose stretch a loaded machine sent to the compute
    # activity replays that stretch's recorded outcome, so an edited program would not diverge there.
    diverged = with_activity_type(json.loads(exported), f"call{ARGV}.0", f"{name}.fetch\x1b[2K\x00")
    edited = tmp_path / "diverged.json"
    edited.write_text(json.dumps(diverged))
    report = await shown(client, "replay", "--history", str(edited), rc=1)
    assert ": DIVERGED" in report and "TMPRL1100" in report
    await shown(client, "trace", "--history", str(edited))
    await replay(handle)


async def test_the_temporal_ui_shows_a_runs_text_escaped_and_cut_visibly(client: Client) -> None:
    """Activity summaries and current details reach the Temporal UI as they are: escaped, cut with an "…"."""
    from temporalio.api.enums.v1 import EventType

    from durable_codemode import decide
    from durable_codemode._history_events import summary_of

    from .test_observability import current_details

    name = f"hostile-ui-{uuid.uuid4().hex[:6]}"
    code = ("r = await fetch(key='abc\u202edef')\n"                      # a bidi override: JSON keeps it raw
            "r = await fetch(key='x' * 300)\n"                             # past the summary's length
            "await transfer(to='A\x1b[2K\x1b[1Gsafe', cents=5)")          # a control sequence
    agent = Agent(scripted_model(RunCode(code, id=f"call{ARGV}"), "done"), name=name)

    @agent.tool_plain
    def fetch(key: str) -> str:
        """Fetch a value."""
        return f"value {key}"

    @agent.tool_plain
    def transfer(to: str, cents: int) -> str:
        """Transfer money."""
        return f"sent {cents} to {to}"

    tq = new_task_queue()
    durable = CodeModeAgent(agent, tool_options={"transfer": ToolOptions(requires_approval=True)})
    async with running_worker(client, [durable], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, name, "go", task_queue=tq)
        (pending,) = await wait_for_approvals(client, handle.id)
        details = await current_details(handle)
        shows_nothing_raw(details, "the current details")
        # The model's call id, escaped and cut (with an "…"); the gated call has not started: it is not in flight.
        assert details.splitlines() == [
            f"waiting for approval of 1 call(s): {printable(clip(pending.call_id, 80))} transfer",
            f"model turn 0: snippet {printable(clip(f'call{ARGV}', 80))} waiting: 0 calls in flight, 1 waiting for "
            "approval, 2 done"]
        await decide(client, handle.id, pending.call_id, approved=True, approver="ana")
        await handle.result()
    events = [e async for e in handle.fetch_history_events()]
    summaries = [summary_of(e) or "" for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    for summary in summaries:
        shows_nothing_raw(summary, "an activity summary")
    # The one argument format (as `codemode trace` and `watch` write a call), escaped, cut where it says so.
    assert [s for s in summaries if not s.startswith("model turn")] == [
        'fetch(key="abc\\u202edef")', 'fetch(key="' + "x" * 114 + '…)',
        'transfer(to="A\\u001b[2K\\u001b[1Gsafe", cents=5)']
    await replay(handle)


def test_renderers_escape_what_they_are_given() -> None:
    """The library's own drawings (what `durable_codemode.debugging` users print) escape too, line by line."""
    from durable_codemode.debugging import render_trace
    from durable_codemode.history._trace import RunTrace, TraceApproval

    trace = RunTrace(workflow_id=f"r{HOSTILE}", agent="a", status="completed", runs=[], turns=[],
                     approvals=[TraceApproval(call_id=f"c{HOSTILE}", tool="t", args={"x": HOSTILE},
                                              state="denied", via="update", approver="ana", note=HOSTILE)],
                     audit=[], output=HOSTILE, notes=[HOSTILE])
    text = render_trace(trace)
    shows_nothing_raw(text, "render_trace")
    assert len(text.splitlines()) == len(text.split("\n")) == 5  # no line of the run's text starts a new one
