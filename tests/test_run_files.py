"""A filesystem per run (`RunFiles`): what one snippet writes the next reads.

Across restarts and continue-as-new; a seeded folder is read-only; paths outside `/files` and writes past the
limit are clear errors in the program. Every completed run is replayed.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from durable_codemode import CodeModeUserError, RunFiles, RunResult, SnippetLimits, start_run
from durable_codemode.debugging import render_trace, trace_run
from durable_codemode.history._trace import files_text
from durable_codemode.shared._compute_wire import decode_answer, encode_answer
from durable_codemode.shared._files import FilesSpec
from durable_codemode.shared._records import FILE_LISTING_LIMIT, SnippetRecord, TurnRecord, bound_turns
from durable_codemode.testing import RunCode, last_result, new_task_queue, running_worker
from durable_codemode.workflow._files import RunFilesystem
from durable_codemode.workflow._stubs import run_code_tool_definition

from ._agents import items_agent
from ._runs import run_to_end


async def run(client: Client, *steps: Any, files: RunFiles | None = None,
              limits: SnippetLimits | None = None) -> tuple[RunResult, WorkflowHandle[Any, Any]]:
    return await run_to_end(client, items_agent(f"files{os.urandom(3).hex()}", *steps, limits=limits,
                                                agent_options={"files": files}))


def echo(messages: Any) -> str:
    return repr(last_result(messages))


def results(result: RunResult) -> list[str]:
    return [s.result for t in result.turns for s in t.snippets]


WRITE = """
from pathlib import Path
Path("notes").mkdir()
Path("notes/a.txt").write_text("alpha\\n")
with open("notes/b.txt", "w") as f:
    f.write("beta\\n")
    f.write("gamma\\n")
with open("/files/notes/a.txt", mode="a", encoding="utf-8", newline="") as f:
    f.write("more\\n")
Path("data.bin").write_bytes(b"\\x00\\x01\\xff")
n = await get(i=3)
Path("n.txt").write_text(str(n))
"""

READ = """
from pathlib import Path
import os
with open("notes/b.txt") as f:
    lines = [line.strip() for line in f]
{
    "a": Path("notes/a.txt").read_text(),
    "b": lines,
    "bin": list(Path("/files/data.bin").read_bytes()),
    "n": int(open("n.txt").read()),
    "listing": sorted(str(p) for p in Path(".").iterdir()),
    "txt": sorted(str(p) for p in Path("notes").glob("*.txt")),
    "exists": [Path("notes").is_dir(), Path("n.txt").exists(), Path("nope").exists()],
    "size": Path("n.txt").stat().st_size,
    "cwd": os.getcwd(),
}
"""


async def test_what_one_snippet_writes_the_next_reads_even_after_a_restart(client: Client) -> None:
    result, handle = await run(client, RunCode(WRITE), RunCode("open('n.txt').read()", restart=True),
                               RunCode(READ), echo, files=RunFiles())
    snippets = [s for t in result.turns for s in t.snippets]
    assert [s.outcome for s in snippets] == ["ok", "ok", "ok"], results(result)
    assert snippets[1].result == '{"result": "30"}'  # the REPL restarted; the run's files did not
    assert eval(result.output)["result"] == {
        "a": "alpha\nmore\n", "b": ["beta", "gamma"], "bin": [0, 1, 255], "n": 30,
        "listing": ["data.bin", "n.txt", "notes"], "txt": ["notes/a.txt", "notes/b.txt"],
        "exists": [True, True, False], "size": 2, "cwd": "/files",
    }
    assert snippets[0].files == {"data.bin": 3, "n.txt": 2, "notes/a.txt": 11, "notes/b.txt": 11}
    assert snippets[1].files is None and snippets[2].files is None  # they changed nothing
    trace = render_trace(await trace_run(client, handle.id))
    assert "files: data.bin 3 B, n.txt 2 B, notes/a.txt 11 B, notes/b.txt 11 B" in trace


async def test_files_survive_continue_as_new(client: Client) -> None:
    steps = [RunCode(f"from pathlib import Path\nPath('log.txt').write_text(Path('log.txt').read_text() + '{i}' "
                     f"if Path('log.txt').exists() else '{i}')") for i in range(4)]
    result, handle = await run(client, *steps, RunCode("open('log.txt').read()"), echo, files=RunFiles(),
                               limits=SnippetLimits(max_snippets_per_run=2))
    assert result.continued_as_new >= 2
    assert eval(result.output)["result"] == "0123"
    assert "continued as new" in render_trace(await trace_run(client, handle.id))


async def test_a_seeded_folder_is_read_only(client: Client, tmp_path: Path) -> None:
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "prices.csv").write_text("sku,cents\nA,100\n")
    (tmp_path / "ref" / "deep").mkdir()
    (tmp_path / "ref" / "deep" / "t.txt").write_text("t")
    code = """
from pathlib import Path
import csv
out = {"rows": list(csv.DictReader(open("seed/prices.csv").read().splitlines())),
       "deep": Path("/files/seed/deep/t.txt").read_text()}
for attempt in ["write", "open", "unlink", "new"]:
    try:
        if attempt == "write":
            Path("seed/prices.csv").write_text("x")
        elif attempt == "open":
            open("seed/prices.csv", "a")
        elif attempt == "unlink":
            Path("seed/prices.csv").unlink()
        else:
            Path("seed/mine.txt").write_text("x")
        out[attempt] = "allowed"
    except PermissionError as e:
        out[attempt] = str(e)
Path("copy.csv").write_text(Path("seed/prices.csv").read_text())
out
"""
    result, _ = await run(client, RunCode(code), echo, files=RunFiles(seed_from=tmp_path / "ref"))
    out = eval(result.output)["result"]
    assert out["rows"] == [{"sku": "A", "cents": "100"}] and out["deep"] == "t"
    for attempt in ["write", "open", "unlink", "new"]:
        assert "is read-only" in out[attempt] and "write your own files elsewhere" in out[attempt], out
    snippet = result.turns[0].snippets[0]
    assert snippet.files == {"copy.csv": 16, "seed/deep/t.txt": 1, "seed/prices.csv": 16}
    # Later edits to the folder never change a run: its seed was recorded when it started (and replayed above).
    (tmp_path / "ref" / "prices.csv").write_text("changed")


async def test_paths_outside_the_runs_files_and_writes_past_the_limit_are_clear_errors(client: Client) -> None:
    code = """
from pathlib import Path
out = {}
try:
    open("/etc/passwd").read()
except PermissionError as e:
    out["outside"] = str(e)
try:
    Path("../tmp/x").write_text("x")
except PermissionError as e:
    out["dotdot"] = str(e)
Path("a.txt").write_text("x" * 60)
try:
    Path("b.txt").write_text("y" * 60)
except OSError as e:
    out["full"] = str(e)
try:
    Path("no/such/dir.txt").write_text("z")
except FileNotFoundError as e:
    out["missing_dir"] = str(e)
out["b_exists"] = Path("b.txt").exists()
out
"""
    result, _ = await run(client, RunCode(code), echo, files=RunFiles(max_bytes=100))
    out = eval(result.output)["result"]
    assert "'/etc/passwd' is outside this run's files" in out["outside"] and "under /files" in out["outside"]
    assert "'/tmp/x' is outside this run's files" in out["dotdot"]
    assert "120 bytes, over their 100-byte limit (RunFiles.max_bytes)" in out["full"]
    assert "Path.unlink" in out["full"]
    assert "mkdir(parents=True)" in out["missing_dir"]
    assert out["b_exists"] is False


async def test_an_agent_without_files_still_refuses_file_calls(client: Client) -> None:
    result, _ = await run(client, RunCode("from pathlib import Path\nPath('x').write_text('x')"), echo)
    assert "PermissionError" in eval(result.output)["error"]


def test_run_files_config_is_validated_when_built(tmp_path: Path) -> None:
    with pytest.raises(CodeModeUserError, match="max_bytes must be a positive int"):
        RunFiles(max_bytes=0)
    with pytest.raises(CodeModeUserError, match="seed_at must be a plain relative path"):
        RunFiles(seed_at="../up")
    assert RunFiles(seed_from=str(tmp_path), seed_at="docs/ref").seed_root == "/files/docs/ref"  # type: ignore[arg-type]


def test_file_answers_travel_to_the_compute_activity_unchanged() -> None:
    files = RunFilesystem(FilesSpec(max_bytes=1000))
    d, x = PurePosixPath("/files/d"), PurePosixPath("/files/d/x.txt")
    answers = [files.answer("Path.mkdir", (d,), {}), files.answer("open", (x, "w"), {}),
               files.answer("Path.append_text", (x, "hi"), {}), files.answer("Path.iterdir", (d,), {}),
               files.answer("Path.stat", (x,), {}), files.answer("Path.scan", (PurePosixPath("/files"),), {})]
    for answer in answers:
        again = decode_answer(encode_answer(answer))
        assert repr(again) == repr(answer)
    assert files.listing() == {"d/x.txt": 2}


COMPUTE_BETWEEN_FILE_CALLS = """
from pathlib import Path
with open("a.txt", "w") as f:
    f.write("before ")
n = 0
for i in range(20_000_000):
    n = (n + i * i) % 1_000_003
Path("a.txt").write_text(Path("a.txt").read_text() + "after")
open("a.txt").read()
"""
"""File calls, then ~2.4 s of compute, then file calls again. The compute is past the live backstop
(`LIVE_BACKSTOP_SECONDS`, 1 s), so it goes on in the compute activity, which feeds the snippet again in
`/files` and gives it the file answers again, a handle among them. (10M steps took 1.21 s here: on a quiet machine
they sometimes finished under the backstop, in workflow code, and the test failed; 20M keep twice the margin.)"""


@pytest.mark.slow
async def test_file_calls_around_compute_that_goes_on_in_the_compute_activity(client: Client) -> None:
    result, _ = await run(client, RunCode(COMPUTE_BETWEEN_FILE_CALLS), echo, files=RunFiles())
    assert eval(result.output)["result"] == "before after", result.output
    (snippet,) = [s for t in result.turns for s in t.snippets]
    assert snippet.computed_seconds is not None and snippet.files == {"a.txt": 12}


def test_the_model_is_told_about_the_files_only_when_the_run_has_them() -> None:
    seeded = FilesSpec(max_bytes=1000, seed_root="/files/seed", seed={"/files/seed/a.txt": "YQ=="})
    with_files = run_code_tool_definition("", SnippetLimits(), files=seeded).description or ""
    assert "own files under /files" in with_files and "/files/seed holds 1 file given to you, read-only" in with_files
    assert "Not available: network," in with_files
    without = run_code_tool_definition("", SnippetLimits()).description or ""
    assert "/files" not in without and "Not available: files, network," in without


async def test_files_too_big_to_carry_without_a_payload_store_are_dropped_and_the_model_told(client: Client) -> None:
    big = "from pathlib import Path\nPath('big.txt').write_text('x' * 600_000)\nPath('small.txt').write_text('s')"
    listing = "from pathlib import Path\n[p.name for p in Path('.').iterdir()]"
    result, _ = await run(client, RunCode(big), RunCode(listing), notes_and_last, files=RunFiles(max_bytes=1_000_000),
                          limits=SnippetLimits(max_snippets_per_run=1))
    out = eval(result.output)
    assert out["last"] == {"result": []}, out
    assert any("the files your programs wrote are gone" in n and "600,001 bytes" in n for n in out["notes"]), out


def notes_and_last(messages: Any) -> str:
    notes = [p.content for m in messages[1:] for p in getattr(m, "parts", [])
             if getattr(p, "part_kind", "") == "user-prompt"]
    return repr({"last": last_result(messages), "notes": notes})


async def test_a_seed_too_big_to_record_without_a_payload_store_fails_the_run_at_once(
        client: Client, tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"b" * 600_000)
    name = f"files{os.urandom(3).hex()}"
    agent = items_agent(name, RunCode("1"), echo, agent_options={"files": RunFiles(max_bytes=1_000_000,
                                                                                   seed_from=tmp_path)})
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, name, "go", task_queue=tq)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    messages, error = [], failure.value.cause
    while error is not None:  # the workflow's failure, the activity's, its ApplicationError
        messages.append(str(error))
        error = error.__cause__ if error.__cause__ is not None else getattr(error, "cause", None)
    assert any("600,000 bytes" in m and "CODEMODE_PAYLOAD_STORE" in m for m in messages), messages


def test_a_file_call_of_an_unforeseen_shape_is_an_error_in_the_program_not_in_workflow_code() -> None:
    files = RunFilesystem(FilesSpec(max_bytes=1000))
    answer = files.answer("Path.write_bytes", (PurePosixPath("/files/x"), object()), {})
    assert answer["exc_type"] == "OSError" and "Path.write_bytes" in answer["message"]
    assert files.answer("Path.read_text", (), {})["exc_type"] == "TypeError"


def test_a_long_runs_summary_drops_the_oldest_file_listings_first() -> None:
    listing = {f"f{i:03}.txt": i for i in range(FILE_LISTING_LIMIT)}
    turns = [TurnRecord(index=i, text="", snippets=[SnippetRecord(call_id=f"c{i}", code="x", outcome="ok", result="",
                                                                  files=dict(listing))]) for i in range(3)]
    bound_turns(turns, budget=3 * 121 + 2 * sum(len(p) + 12 for p in listing))  # room for two listings
    assert [s.files_omitted for t in turns for s in t.snippets] == [FILE_LISTING_LIMIT, 0, 0]
    assert turns[0].snippets[0].files == {} and turns[2].snippets[0].files == listing
    assert files_text({}, FILE_LISTING_LIMIT).startswith("50 files, not listed")
    assert files_text({"a.txt": 12, "b.bin": 3 * 1024}, 2) == "a.txt 12 B, b.bin 3.0 KiB, … 2 more"
