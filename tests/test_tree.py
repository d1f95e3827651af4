"""`render_tree`: a finished run drawn as `codemode trace` draws one; long call lists collapsed, errors never hidden."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic_ai.usage import RunUsage

from durable_codemode import CallRecord, RunResult, SnippetRecord, TurnRecord
from durable_codemode.history._trace import RunTrace, render_trace, render_tree, trace_turns_of

_T = datetime(2026, 1, 1, tzinfo=UTC)
TIMES = "\u00d7"  # the multiplication sign the tree prints in "remove_line <sign>115"


def call(call_id: str, tool: str, args: str, result: str,
         status: Literal["ok", "error", "cancelled"] = "ok") -> CallRecord:
    return CallRecord(call_id=call_id, tool=tool, args=args, status=status, result=result, started_at=_T,
                      finished_at=_T + timedelta(milliseconds=9))


def cart_calls(*, failing: int | None = None) -> list[CallRecord]:
    """3 pages and 119 removals, in the scrambled order a gather finishes them."""
    calls = [call(f"call_0.{n}", "list_cart", f'{{"offset": {50 * n}}}', '{"items": [], "next_offset": null}')
             for n in range(3)]
    for n in range(3, 122):
        if n == failing:
            calls.append(call(f"call_0.{n}", "remove_line", f'{{"line_id": {n}}}',
                              f"KeyError: no cart line {n}", status="error"))
        else:
            calls.append(call(f"call_0.{n}", "remove_line", f'{{"line_id": {n}}}',
                              f'{{"line_id": {n}, "removed": true}}'))
    random.Random(1).shuffle(calls)
    return calls


def result(*turns: TurnRecord, continued_as_new: int = 0) -> RunResult:
    return RunResult(output=turns[-1].text, usage=RunUsage(requests=len(turns)), turns=list(turns),
                     continued_as_new=continued_as_new)


def two_turns(snippet: SnippetRecord) -> RunResult:
    return result(TurnRecord(index=0, text="", snippets=[snippet]), TurnRecord(index=1, text="ok"))


CODE = "\n".join(f"line_{i} = {i}" for i in range(10))


def test_small_run_golden() -> None:
    snippet = SnippetRecord(call_id="call_0", code="x = await get(i=1)\n\nx * 2", outcome="ok",
                            result='{"result": 20}', calls=[call("call_0.0", "get", '{"i": 1}', "10")])
    text = render_tree(result(TurnRecord(index=0, text="", snippets=[snippet]),
                              TurnRecord(index=1, text="It is 20.")))
    assert text == (
        "model turn 0\n"
        "└─ run_code call_0  ok  (1 nested call)\n"
        "   │ 1  x = await get(i=1)\n"
        "   │ 3  x * 2\n"
        '   │ = {"result": 20}\n'
        "   └─ call_0.0  get(i=1)  ok  9 ms  → 10\n"
        "model turn 1\n"
        "└─ answer: It is 20."
    )


def test_it_is_the_trace_drawing() -> None:
    """One renderer: a run's tree and its trace from history draw the same snippet and call lines."""
    snippet = SnippetRecord(call_id="call_0", code="x = await get(i=1)", outcome="ok", result="{}",
                            calls=[call("call_0.0", "get", '{"i": 1}', "10")])
    run = two_turns(snippet)
    turns = trace_turns_of(run.turns, run=0)
    trace = render_trace(RunTrace(workflow_id="w", agent="a", status="completed", runs=[], turns=turns))
    tree = render_tree(run)
    assert tree.splitlines() == trace.splitlines()[1:]  # the trace adds its headline


def test_many_calls_collapse_to_first_six_and_last_three_in_call_order() -> None:
    snippet = SnippetRecord(call_id="call_0", code=CODE, outcome="ok", result='{"result": 1}',
                            calls=cart_calls())
    lines = render_tree(result(TurnRecord(index=0, text="", snippets=[snippet]),
                               TurnRecord(index=1, text="Done."))).splitlines()
    call_lines = [line for line in lines if line.lstrip(" │").startswith(("├─", "└─")) and "call_0." in line]
    assert [line.split()[1] for line in call_lines] == [
        "call_0.0", "call_0.1", "call_0.2", "call_0.3", "call_0.4", "call_0.5", "call_0.119", "call_0.120",
        "call_0.121"]
    assert f"   ├─ … 113 more calls, all ok (remove_line {TIMES}113)" in lines
    assert "   ├─ call_0.0  list_cart(offset=0)  ok  9 ms  → {\"items\": [], \"next_offset\": null}" in lines
    assert "(122 nested calls)" in lines[1]
    # The code preview stops after six lines.
    code_lines = [line for line in lines if line.startswith("   │ ")]
    assert code_lines[:7] == [f"   │ {i + 1:>2}  line_{i} = {i}" for i in range(6)] + ["   │ …"]


def test_collapsing_never_hides_a_failed_call() -> None:
    snippet = SnippetRecord(call_id="call_0", code="...", outcome="ok", result="{}",
                            calls=cart_calls(failing=50))
    lines = render_tree(two_turns(snippet)).splitlines()
    assert f"   ├─ … 112 more calls, all ok (remove_line {TIMES}112)" in lines
    assert "   ├─ call_0.50  remove_line(line_id=50)  error  9 ms  ✗ KeyError: no cart line 50" in lines


def test_few_calls_are_all_shown() -> None:
    calls = [call(f"call_0.{n}", "get", f'{{"i": {n}}}', str(n)) for n in range(8)]
    snippet = SnippetRecord(call_id="call_0", code="...", outcome="ok", result="{}", calls=calls)
    text = render_tree(two_turns(snippet))
    assert "more calls" not in text
    assert all(f"call_0.{n}  get(i={n})" in text for n in range(8))


def test_errors_are_shown() -> None:
    failed = call("call_0.0", "get", '{"i": -1}', "KeyError: no item -1", status="error")
    errored = SnippetRecord(call_id="call_0", code="await get(i=-1)", outcome="error",
                            result='{"error": "KeyError: no item -1", "traceback": "..."}', calls=[failed])
    rejected = SnippetRecord(call_id="call_1", code="undefined_name", outcome="rejected",
                             result="The code was not run: type error.")
    text = render_tree(result(TurnRecord(index=0, text="", snippets=[errored]),
                              TurnRecord(index=1, text="", snippets=[rejected]),
                              TurnRecord(index=2, text="I could not.")))
    assert "└─ run_code call_0  error  (1 nested call)" in text
    assert '   │ = {"error": "KeyError: no item -1", "traceback": "..."}' in text
    assert "   └─ call_0.0  get(i=-1)  error  9 ms  ✗ KeyError: no item -1" in text
    assert ("└─ run_code call_1  rejected\n     1  undefined_name\n     = The code was not run: type error."
            in text)


def test_direct_calls_and_text_next_to_calls() -> None:
    direct = [call("call_a", "get_line", '{"line_id": 3}', '{"line_id": 3}'),
              call("call_b", "remove_line", '{"line_id": 9}', "KeyError: no cart line 9", status="error")]
    text = render_tree(result(TurnRecord(index=0, text="Let me look.", direct_calls=direct),
                              TurnRecord(index=1, text="Line 3 is there; 9 was not.")))
    assert text.splitlines() == [
        "model turn 0",
        "├─ text: Let me look.",
        '├─ tool call call_a  get_line(line_id=3)  ok  9 ms  → {"line_id": 3}',
        "└─ tool call call_b  remove_line(line_id=9)  error  9 ms  ✗ KeyError: no cart line 9",
        "model turn 1",
        "└─ answer: Line 3 is there; 9 was not.",
    ]


def test_lines_fit_the_width() -> None:
    long = "x" * 500
    calls = [call("call_0.0", "echo", f'{{"text": "{long}"}}', long)]
    snippet = SnippetRecord(call_id="call_0", code=f"await echo(text='{long}')", outcome="ok",
                            result=f'{{"result": "{long}"}}', calls=calls)
    for width in (40, 80, 100):
        lines = render_tree(result(TurnRecord(index=0, text="", snippets=[snippet]),
                                   TurnRecord(index=1, text=long)), width=width).splitlines()
        assert all(len(line) <= width for line in lines), width
        assert all(line.endswith("…") for line in lines if len(line) == width)
        call_line = next(line for line in lines if "call_0.0" in line)
        assert "echo(text=" in call_line and "ok" in call_line  # arguments are cut before the status is


def test_empty_turn_and_continue_as_new() -> None:
    text = render_tree(result(TurnRecord(index=0, text=""), TurnRecord(index=1, text="hi"),
                              continued_as_new=2))
    assert text.splitlines() == [
        "model turn 0",
        "└─ (no text and no tool call: the model was asked again)",
        "model turn 1",
        "└─ answer: hi",
        "(the run continued as new 2 times)",
    ]
