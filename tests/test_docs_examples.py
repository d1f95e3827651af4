"""Every fenced code block of README.md, docs/*.md and bench/README.md is run or checked here.

What each kind of block gets (a block no rule covers fails `test_every_block_has_a_rule`, naming it):

- ```python is executed, against the session's real Temporal dev server and real Monty. A page's blocks run in
  order in one namespace (a module), as a reader reads them. A block with top-level `await` runs on the test's
  event loop; one without runs in a thread, so its `asyncio.run(...)` works. A name a block uses that no earlier
  block of its page defines comes from `GIVEN`; the few text substitutions are in `SUBSTITUTIONS`. Functions named
  `test_*` that a block defines are called too, their arguments from `GIVEN`.
- ```bash: each command in `RUN_COMMANDS` is run (`codemode` in-process, through the CLI's own `run_cli`, against
  the dev server, with `PLACEHOLDERS` filled from real runs) and must give its exit status; every other command
  is checked by parsing: its program, subcommand and flags must exist (`codemode <sub> --help`, `python SCRIPT
  --help`, `temporal <sub> --help`), the files it names too, and the variables it sets must be ones the code reads.
- ```toml / ```yaml / ```json blocks are parsed.
- ``` (no language) is output. A block starting with `$ COMMAND` runs the command (it must be in `RUN_COMMANDS`)
  and every other line of the block must match a line of its output, in order (`…` matches anything; a duration
  such as `59 ms` matches any duration). Otherwise a marker names where the output comes from.

Markers: an HTML comment on the line just before the fence.

- `<!-- docs-test: background WHY -->`: a ```python block that runs until stopped (a worker): it runs as a task
  beside the page's later blocks, and the workers it started are shut down after the page's last block.
- `<!-- docs-test: compile WHY -->`: a ```python fragment that is only compiled.
- `<!-- docs-test: skip WHY -->`: not run at all, for what cannot run here.
- `<!-- docs-test: output NAME -->`: output that `OUTPUT_CHECKS[NAME]` makes now and compares.
- `<!-- docs-test: recorded PATH -->`: a benchmark's recorded results, which a test cannot re-measure: its columns
  must exist in the script PATH that prints them, or every row must match the results file PATH.

Also: relative links and their anchors resolve, and `codemode ...` / `python SCRIPT` in running text name
commands, flags and scripts that exist.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import concurrent.futures
import contextlib
import gc
import importlib
import inspect
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import tomllib
import traceback
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durable_codemode import CodeModeAgent, ToolOptions, pending_approvals, start_run, wait_for_approvals
from durable_codemode.cli import run_cli
from durable_codemode.client._devserver import temporal_cli_path
from durable_codemode.debugging import fetch_chain, histories_from_json, render_replay, replay_histories
from durable_codemode.history._deploy_check import check_deploy, render_deploy_check
from durable_codemode.testing import FinalOutput, RunCode, last_result, running_worker, scripted_model, user_prompt
from durable_codemode.worker import _pool

from ._agents import items_agent
from .test_debugging import CODE, echo, with_code

pytestmark = pytest.mark.xdist_group("test_docs_examples")
"""The pages share one worker and its waiting runs (`shop`), and a page that sizes the Monty pool needs the runs
before it to have let their sandboxes go: the module's tests run in one process, in the order they are collected."""

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]

README_COMMANDS = """\
# Install and run the demo: an agent run on an embedded Temporal dev server, driven by the bundled scripted model
python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/codemode demo

# Run the tests (a real Temporal dev server, real Monty, real SQLite, Debian's chromium for the web page, installed
# first if missing; the model is scripted), on the newest pydantic-ai, then on the oldest supported (.venv-oldest)
(command -v chromium || (apt-get update -q && apt-get install -y -q chromium)) && python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest && .venv/bin/python -m tests.on_oldest_pydantic_ai
"""  # noqa: E501 (the README's command, one line to copy)
"""The README's first block, exactly: a newcomer's two commands."""


# -- what the blocks get from the test ------------------------------------------------------------------------

SUBSTITUTIONS: list[tuple[str, str, str]] = [
    ('"openai:gpt-5"', "docs_model", "no API key here: the scripted `docs_model` below plays the model"),
    ("ConsoleSpanExporter()", "docs_span_exporter",
     "the spans are kept in memory, so the span tree below the block can be checked against them"),
    ('"/shared/codemode-payloads"', "docs_payload_dir", "a temporary directory instead of a shared volume"),
    ("run_script(main())", "__import__('asyncio').run(main())",
     "run_script ends the process (os._exit) after main, as a script's last line should; the test process goes on"),
]
"""(text in a ```python block, what replaces it, why). Each must be used by some block."""

PLACEHOLDERS = {
    "RUN_ID": "the id of a run of the `shop` agent below, waiting for approval of `refund(order='A', cents=10)`",
    "shop-1": "the same (the id the docs' sample output shows)",
    "CALL_ID": "that waiting call's id",
    "run.json": "a file in a temporary directory",
}
"""Words of a ```bash command or a `$ COMMAND` line that the test fills in before it runs the command."""

RUN_COMMANDS: dict[str, int] = {
    "codemode demo": 0,
    "codemode approvals RUN_ID": 0,
    "codemode approve RUN_ID CALL_ID --note ok": 0,
    "codemode runs --agent cart --status waiting": 0,
    "codemode trace RUN_ID": 0,
    "codemode history RUN_ID -o run.json --chain": 0,
    "codemode replay --history run.json": 0,
    "codemode replay RUN_ID --worker durable_codemode.apps.workflows.cart": 0,
    "codemode watch shop-1": 3,  # exit 3: the run waits for an approval
}
"""Commands the test runs (as the docs spell them, after shell quoting), with the exit status they must give. The
others need what a test cannot have here (`codemode dev` serves until Ctrl-C, `codemode bench` runs for minutes,
a real model needs a key, `docker` is not installed) and are checked by parsing."""

SHOP_PROGRAM = "x = await get(i=1)\nawait refund(order='A', cents=x)"


def shop_agent() -> CodeModeAgent:
    """The agent whose runs fill `run_id` / `RUN_ID`: its program waits for approval of a refund."""
    agent = Agent(scripted_model(RunCode(SHOP_PROGRAM), lambda m: f"refunded: {last_result(m)}"), name="shop")

    @agent.tool_plain
    def get(i: int) -> int:
        """Item i's price in cents."""
        return 10 * i

    @agent.tool_plain
    def refund(order: str, cents: int) -> str:
        """Refund `cents` on `order`."""
        return f"refund-{order}"

    return CodeModeAgent(agent, tool_options={"refund": ToolOptions(requires_approval=True)})


DOCS_MODEL_SCRIPT: dict[str, tuple[str, Callable[[Any], Any]]] = {
    # docs/agents.md, deps that hold connections: the balance the tool read through the worker's connection.
    "What is my balance?": ("await customer_balance()", lambda result: f"Your balance is {result['result']}."),
    # docs/agents.md, the same with a plain `def` tool (a worker thread) over a connection shared across threads.
    "What is my name?": ("await customer_name()", lambda result: f"Your name is {result['result']}."),
    # docs/agents.md, a sub-agent as a child run: the search run asks the extraction run, which lists the flights.
    "Which flight is cheapest: AK123 at $350 or LA101 at $250?": (
        "await ask_extraction(prompt='AK123 at $350 or LA101 at $250')",
        lambda result: f"The flights: {result['result']}."),
    "AK123 at $350 or LA101 at $250": ("['AK123 $350', 'LA101 $250']", lambda result: ", ".join(result["result"])),
    # docs/agents.md, per-run deps: the ticket's id shows the tool saw the run's tenant.
    "What is open?": ("await open_tickets()", lambda result: f"Open: {', '.join(result['result'])}."),
    # docs/agents.md, structured output: the final answer by the output tool, from the program's result.
    "Invoice this month": ("sum(await charges())",
                           lambda result: FinalOutput({"tenant_id": "acme", "total_cents": result["result"]})),
}
"""What `docs_model` does for each prompt the docs run: the program a model would write, and its answer."""


def _script(messages: list[ModelMessage]) -> tuple[str, Callable[[Any], Any]]:
    prompt = user_prompt(messages)
    assert prompt in DOCS_MODEL_SCRIPT, f"docs_model has no script for {prompt!r}: add it to DOCS_MODEL_SCRIPT"
    return DOCS_MODEL_SCRIPT[prompt]


DOCS_MODEL = scripted_model(lambda m: RunCode(_script(m)[0]), lambda m: _script(m)[1](last_result(m)),
                            name="docs-model")


def _readme_ran(ns: dict[str, Any]) -> None:
    # The walkthrough (examples/walkthrough.py, run as the README shows it): its program removed the lines over $50.
    assert sorted(ns["CART"]) == list(range(1, 51)), "the lines over $50 are still in the cart"


PAGE_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {"README.md": _readme_ran}
"""What a page's blocks must have done, beyond not failing, by the names they left."""


# -- blocks -------------------------------------------------------------------------------------------------------


@dataclass
class Block:
    path: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    text: str
    marker: tuple[str, str] | None = None
    """(kind, the rest) of a `<!-- docs-test: kind rest -->` comment just before the fence."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} (```{self.lang})"


_FENCE = re.compile(r"^(`{3,})(.*)$")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(\w+)\s*:?\s*(.*?)\s*-->$")


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, ticks, lang = i, fence[1], fence[2].strip().split(" ")[0]
        i += 1
        while i < len(lines) and lines[i].rstrip() != ticks:
            i += 1
        assert i < len(lines), f"{path.relative_to(ROOT)}:{start + 1}: the code block is never closed"
        marker = _MARKER.match(lines[start - 1].strip()) if start else None
        found.append(Block(path, start + 1, lang, "\n".join(lines[start + 1:i]) + "\n",
                           (marker[1], marker[2]) if marker else None))
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [b for path in DOC_FILES for b in blocks_of(path)]


def rule_of(block: Block) -> str:
    """How `block` is exercised; an AssertionError naming it when nothing covers it."""
    kind = block.marker[0] if block.marker else None
    if kind in ("skip", "compile") and block.marker and not block.marker[1]:
        raise AssertionError(f"{block.where}: a `{kind}` marker must say why")
    if block.lang == "python" and kind in (None, "background", "compile", "skip"):
        return {None: "executed", "background": "executed"}.get(kind, kind)
    if block.lang == "bash" and kind is None:
        return "commands"
    if block.lang in ("toml", "yaml", "json") and kind is None:
        return "parsed"
    if block.lang == "" and kind is None and block.text.startswith("$ "):
        return "output of a command"
    if block.lang == "" and kind == "output" and block.marker and block.marker[1] in OUTPUT_CHECKS:
        return "output checked"
    if block.lang == "" and kind == "recorded" and block.marker and (ROOT / block.marker[1]).is_file():
        return "recorded"
    if kind == "skip":
        return "skip"
    raise AssertionError(f"no test covers this block: {block.where}")


def test_every_block_has_a_rule() -> None:
    problems = []
    for block in all_blocks():
        try:
            rule_of(block)
        except AssertionError as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)


def test_the_readme_starts_with_its_two_commands() -> None:
    first = blocks_of(ROOT / "README.md")[0]
    assert (first.lang, first.text) == ("bash", README_COMMANDS), f"{first.where} changed"


def test_the_tables_name_what_the_docs_use() -> None:
    text = "".join(b.text for b in all_blocks())
    commands = {_command_key(cmd) for b in all_blocks() if b.lang in ("bash", "") for cmd in _commands(b)}
    unused = [old for old, _, _ in SUBSTITUTIONS if old not in text]
    unused += [c for c in RUN_COMMANDS if c not in commands]
    assert not unused, f"no block uses these any more; drop them from the tables: {unused}"


# -- links --------------------------------------------------------------------------------------------------------


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file."""
    anchors = set()
    in_code = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_relative_links_resolve() -> None:
    problems = []
    for path in DOC_FILES:
        text = re.sub(r"(?ms)^(`{3,}).*?^\1$", "", path.read_text())  # not inside code blocks
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = unquote(target).partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                problems.append(f"{path.relative_to(ROOT)}: {target}: no file {file}")
            elif anchor and anchor not in _anchors(dest):
                problems.append(f"{path.relative_to(ROOT)}: {target}: no heading #{anchor} in {file or path.name}")
    assert not problems, "\n".join(problems)


# -- blocks checked by parsing ------------------------------------------------------------------------------------


def _commands(block: Block) -> Iterator[list[str]]:
    """The commands of a ```bash block (or a `$` line), one list of words each; `# or: codemode ...` too."""
    lines = block.text.splitlines()
    if block.lang == "":
        lines = [lines[0][2:]] if lines and lines[0].startswith("$ ") else []
    for line in lines:
        alternative = re.search(r"#\s*or:\s*(codemode\s.*)$", line)
        if alternative:
            yield shlex.split(alternative[1], comments=True)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        command: list[str] = []
        for word in lexer:
            if word in ("&&", "||", ";", "|", "&") or set(word) <= {"(", ")"}:  # (a subshell's parentheses too)
                if command:
                    yield command
                command = []
            else:
                command.append(word)
        if command:
            yield command


def _program(command: list[str]) -> tuple[dict[str, str], str, list[str]]:
    """(environment assignments, program without a `.venv/bin/` prefix, arguments)."""
    env = {}
    while command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", command[0]):
        name, _, value = command[0].partition("=")
        env[name] = value
        command = command[1:]
    assert command, "an assignment alone"
    return env, command[0].removeprefix(".venv/bin/"), command[1:]


@cache
def _help(*argv: str) -> str:
    """What `ARGV --help` prints (`temporal options` lists its global flags without `--help`)."""
    if argv[0] == "codemode":
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = run_cli([*argv[1:], "--help"])
        assert code == 0, f"`{' '.join(argv)} --help` exited {code}"
        return out.getvalue()
    argv = argv if argv[1:] == ("options",) else (*argv, "--help")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr[-500:]}"
    return done.stdout


@cache
def _script_help(script: str) -> str:
    """What `python SCRIPT --help` prints.

    A script in a package (`bench/`) is asked in-process, through the `main(argv)` its `__main__` calls: a second
    interpreter would import everything again, for seconds on a shared machine.
    """
    path = ROOT / script
    if not (path.parent / "__init__.py").is_file():
        return _help(sys.executable, script)
    main = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts)).main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        outcome = main(["--help"])
        if asyncio.iscoroutine(outcome):
            asyncio.run(outcome)
    assert exited.value.code == 0, f"`python {script} --help` exited {exited.value.code}"
    return out.getvalue()


def _flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))


def _check_flags(what: str, args: list[str], *helps: str) -> None:
    known = set().union(*map(_flags, helps))
    used = [a.split("=")[0] for a in args if a.startswith("-")]
    missing = [f for f in used if f not in known]
    assert not missing, f"`{what}` uses flags its help does not list: {missing}"


@cache
def _known_variables() -> str:
    """Text naming every environment variable the code reads: our sources, and `temporal options`."""
    sources = [p.read_text() for d in ("src", "workflows", "activities") for p in (ROOT / d).rglob("*.py")
               if "apps" not in p.relative_to(ROOT).parts]  # src/durable_codemode/apps links to the apps
    return "\n".join([*sources, _help(temporal_cli_path(), "options")])


def check_command(command: list[str]) -> None:
    """Check a command by parsing: its program, subcommand, flags, files and variables exist."""
    text = " ".join(command)
    env, program, args = _program(command)
    if program == "export":
        env, args = dict(a.partition("=")[::2] for a in args), []
    for name, value in env.items():
        assert re.search(rf"\b{name}\b", _known_variables()), f"`{text}` sets {name}, which nothing reads"
        inner = re.fullmatch(r"\$\((.*)\)", value)
        if inner:
            check_command(shlex.split(inner[1]))
    if program == "export":
        return
    if program == "codemode":
        sub = args[0]
        assert re.search(rf"^    {sub}\b", _help("codemode"), re.M), f"`{text}`: codemode has no command {sub}"
        _check_flags(text, args[1:], _help("codemode", sub))
    elif program == "source":
        assert args == [".venv/bin/activate"], f"`{text}`: only the venv the README's install command makes"
    elif program in ("python", "python3"):
        if args[:2] == ["-m", "venv"]:
            return
        if args[0] == "-m" and args[1] != "pytest":
            assert (ROOT / (args[1].replace(".", "/") + ".py")).is_file(), f"`{text}`: there is no module {args[1]}"
            return
        if args[:2] == ["-m", "pytest"]:
            paths = [a for a in args[2:] if not a.startswith("-")]
            assert all((ROOT / p).exists() for p in paths), f"`{text}` names a test file that does not exist"
            return
        if args[0] == "-m":  # a module of this repository (`python -m tests.on_oldest_pydantic_ai`)
            module = ROOT / (args[1].replace(".", "/") + ".py")
            assert module.is_file(), f"`{text}`: there is no module {args[1]} in the repository"
            return
        if args[0] == "-c":
            done = subprocess.run([sys.executable, "-c", args[1]], capture_output=True, timeout=30, check=False)
            assert done.returncode == 0, f"`{text}` exited {done.returncode}"
            return
        script, flags = args[0], args[1:]
        assert (ROOT / script).is_file(), f"`{text}`: there is no {script}"
        if flags:
            _check_flags(text, flags, _script_help(script))
    elif program == "pip":
        assert args[0] == "install", text
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        for target in (a for a in args[1:] if not a.startswith("-")):
            path, _, extras = target.partition("[")
            assert (ROOT / path / "pyproject.toml").is_file(), f"`{text}`: {path} is not the project"
            for extra in filter(None, extras.rstrip("]").split(",")):
                assert extra in project["optional-dependencies"], f"`{text}`: no extra [{extra}]"
    elif program == "temporal":
        subs = list(itertools.takewhile(lambda a: not a.startswith("-"), args))
        _check_flags(text, args[len(subs):], _help(temporal_cli_path(), *subs), _help(temporal_cli_path(), "options"))
    elif program == "command":  # `command -v chromium`: is it installed
        assert args[:1] == ["-v"] and len(args) == 2, text
    elif program == "apt-get":  # Debian's chromium for the browser tests, only
        assert args[0] in ("update", "install"), text
        assert args[0] == "update" or [a for a in args[1:] if not a.startswith("-")] == ["chromium"], text
    elif program == "docker":
        assert args[:2] == ["compose", "-f"], text
        compose = yaml.safe_load((ROOT / args[2]).read_text())
        assert compose["services"], f"`{text}`: {args[2]} has no services"
    else:
        raise AssertionError(f"no rule checks the program {program!r} (in `{text}`): add one to check_command")


def _command_key(command: list[str]) -> str:
    """The command as `RUN_COMMANDS` spells it: no environment assignments, no `.venv/bin/`."""
    _, program, args = _program(command)
    return " ".join([program, *args])


def _is_run(command: list[str]) -> bool:
    return _command_key(command) in RUN_COMMANDS


def _recorded_checks(block: Block) -> None:
    source = block.marker[1] if block.marker else ""
    if source.endswith(".json"):
        _check_apps_table(block, json.loads((ROOT / source).read_text()))
        return
    header = next(line for line in block.text.splitlines() if " | " in line)
    code = (ROOT / source).read_text()
    missing = [cell.strip() for cell in header.split("|") if cell.strip() not in code]
    assert not missing, f"{block.where}: columns that {source} no longer prints: {missing}"


_APPS_ROW = re.compile(r"(\S+) +(\d+) +([\d,]+) / ([\d,]+) +([\d.]+)x +(.+?) / (.+?) +([\d.]+)x +(\d+) / (\d+)"
                       r" +([\d,]+) / ([\d,]+) +(\w+)")


def _check_apps_table(block: Block, results: dict[str, Any]) -> None:
    """Each row of the code mode / tool calling table against the medians it was made from, every cell."""

    def seconds(s: float) -> str:
        return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"

    def rounds_to(shown: str, a: float, b: float) -> bool:  # the ratios are shown to 2-4 digits
        return abs(float(shown) - a / b) <= 0.5 * 10 ** -len(shown.partition(".")[2])

    medians = {(r["task"], r["n"], r["mode"]): r for r in results["medians"]}
    rows = [line.strip() for line in block.text.splitlines()[2:] if line.strip()]
    assert len(rows) == len(medians) // 2, f"{block.where}: {len(rows)} rows for {len(medians)} medians"
    for line in rows:
        row = _APPS_ROW.fullmatch(line)
        assert row, f"{block.where}: not a row: {line!r}"
        on, off = medians[(row[1], int(row[2]), "on")], medians[(row[1], int(row[2]), "off")]
        cells = (row[3], row[4], row[6], row[7], *row.groups()[8:])
        expected = (f"{on['tokens']:,}", f"{off['tokens']:,}", seconds(on["wall_s"]), seconds(off["wall_s"]),
                    str(on["requests"]), str(off["requests"]), f"{on['history_bytes'] // 1024:,}",
                    f"{off['history_bytes'] // 1024:,}", "yes" if on["passed"] and off["passed"] else "NO")
        assert cells == expected, f"{block.where}: {line!r} is not what {block.marker[1]} holds: {expected}"
        assert rounds_to(row[5], on["tokens"], off["tokens"]) and rounds_to(row[8], on["wall_s"], off["wall_s"]), (
            f"{block.where}: {line!r}: a ratio is not what {block.marker[1]} holds")


def test_blocks_checked_by_parsing() -> None:
    for block in all_blocks():
        rule = rule_of(block)
        if rule == "parsed":
            {"toml": tomllib.loads, "yaml": yaml.safe_load, "json": json.loads}[block.lang](block.text)
        elif rule == "compile":
            compile(block.text, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        elif rule == "recorded":
            _recorded_checks(block)
        elif rule == "commands":
            for command in _commands(block):
                if not _is_run(command):
                    check_command(command)


def test_inline_commands_exist() -> None:
    """`codemode ...` and `python SCRIPT` in running text (the commands table) name what exists, flags too."""
    problems = []
    for path in DOC_FILES:
        for span in re.findall(r"`((?:codemode|python) [^`]*)`", path.read_text()):
            words = span.replace("[", " ").replace("]", " ").split()
            try:
                if words[0] == "python" and words[1:3] == ["-m", "pytest"]:
                    assert all((ROOT / w).exists() for w in words[3:] if not w.startswith("-")), "no such test file"
                    continue
                if words[0] == "python" and words[1] == "-m":  # a module of this repository
                    assert (ROOT / (words[2].replace(".", "/") + ".py")).is_file(), f"there is no module {words[2]}"
                    continue
                if words[0] == "python":
                    path = words[2].replace(".", "/") + ".py" if words[1] == "-m" else words[1]
                    assert (ROOT / path).is_file(), f"there is no {path}"
                    continue
                for sub in (s for s in words[1].split("/") if s != "..."):
                    check_command(["codemode", sub, *(w for w in words[2:] if w.startswith("-"))])
            except AssertionError as e:
                problems.append(f"{path.relative_to(ROOT)}: `{span}`: {e}")
    assert not problems, "\n".join(problems)


# -- the pages, run ------------------------------------------------------------------------------------------------


@dataclass
class Shop:
    """Runs of `shop_agent()` waiting for approval, for the placeholders and for `run_id`."""

    client: Client
    task_queue: str
    handles: list[WorkflowHandle[Any, Any]] = field(default_factory=list)

    async def waiting_run(self) -> tuple[str, str]:
        """A new run, once its refund waits for approval: (run id, call id)."""
        handle = await start_run(self.client, "shop", "refund order A", task_queue=self.task_queue)
        self.handles.append(handle)
        async with asyncio.timeout(30):
            while not (pending := await pending_approvals(self.client, handle.id)):
                await asyncio.sleep(0.05)  # the query answers from the run's state: poll it until the call waits
        return handle.id, pending[0].call_id


@pytest.fixture(scope="module")
async def shop(env: WorkflowEnvironment) -> AsyncIterator[Shop]:
    async with running_worker(env.client, [shop_agent()], unsigned_approvals=True) as worker:
        shop = Shop(env.client, worker.task_queue)
        yield shop
        for handle in shop.handles:  # the runs a block left waiting
            with contextlib.suppress(Exception):
                await handle.terminate("docs test done")


@pytest.fixture
def docs_env(env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment every block sees: the dev server, and nothing of the developer's own settings."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", env.client.namespace)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "no-temporal.toml"))
    # The pages show piped output, which the CLI draws 100 columns wide (`cli/_output.tree_width`); pytest-xdist's
    # workers set COLUMNS=80, and a developer's terminal something else.
    monkeypatch.setenv("COLUMNS", "100")
    for name in ("TEMPORAL_PROFILE", "TEMPORAL_API_KEY", "TEMPORAL_TLS", "CODEMODE_MODEL", "CODEMODE_PAYLOAD_STORE",
                 "CODEMODE_REPL_KEY"):
        monkeypatch.delenv(name, raising=False)
    for app in ("CART", "CALENDAR", "CHAT", "KANBAN", "INVENTORY"):  # the bundled apps' stores
        monkeypatch.setenv(f"CODEMODE_{app}_DB", str(tmp_path / f"{app.lower()}.sqlite"))
    return tmp_path


_DEMO: dict[str, tuple[int, str]] = {}
"""`codemode demo`'s exit status and output, run once for all the blocks that show it."""


async def run_codemode(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`codemode ARGV` in-process (the CLI's own `run_cli`, in a thread so this loop keeps serving the workers)."""
    if argv == ["demo"] and "demo" in _DEMO:
        return _DEMO["demo"][0], _DEMO["demo"][1], ""
    capsys.readouterr()
    code = await asyncio.to_thread(run_cli, argv)
    out, err = capsys.readouterr()
    if argv == ["demo"]:
        _DEMO["demo"] = (code, out)
    return code, out, err


def _line_pattern(line: str) -> re.Pattern[str]:
    pattern = re.escape(line.rstrip())
    pattern = re.sub(r"\d+(?:\\\.\d+)?\\ (?:ms|s)\b", r"\\d+(?:\\.\\d+)?\\ (?:ms|s)", pattern)
    return re.compile(pattern.replace("…", ".*"))


def check_output(expected: list[str], actual: str, where: str) -> None:
    """Every non-blank expected line matches a line of `actual`, in order."""
    lines = actual.splitlines()
    at = 0
    for want in (line for line in expected if line.strip()):
        pattern = _line_pattern(want)
        while at < len(lines) and not pattern.fullmatch(lines[at].rstrip()):
            at += 1
        assert at < len(lines), f"{where}: the output has no line {want!r} (in this order); it was:\n{actual}"
        at += 1


async def _check_divergence(block: Block, ns: dict[str, Any], given: Given) -> None:
    """README's replay report: a run of `get(i=1)`, `get(i=2)`, replayed with the snippet's 2 changed to a 7."""
    agent = items_agent("dbg", RunCode(CODE), echo)
    async with running_worker(given.client, [agent], unsigned_approvals=True) as worker:
        handle = await start_run(given.client, "dbg", "go", task_queue=worker.task_queue, run_id="dbg-a41f09")
        await handle.result()
    (history,) = await fetch_chain(given.client, handle.id)
    edited = with_code(history.to_json_dict(), lambda c: c.replace("get(i=2)", "get(i=7)"))
    report = render_replay(await replay_histories(histories_from_json(json.dumps(edited))))
    check_output(block.text.splitlines(), report, block.where)


async def _check_spans(block: Block, ns: dict[str, Any], given: Given) -> None:
    """observability.md's span tree against the spans its example exported: each span's name and attributes."""
    spans = ns["docs_span_exporter"].get_finished_spans()
    problems = []
    for line in block.text.splitlines():
        entry = line.lstrip("│├└─ ")
        if not entry.startswith("codemode."):
            continue
        name = entry.split("  ")[0]
        attributes = dict(a.split("=", 1) for a in re.findall(r"\b[\w.]+=\S+", entry))
        if not any(s.name == name and all(str((s.attributes or {}).get(f"codemode.{k}")) == v
                                          for k, v in attributes.items()) for s in spans):
            seen = [dict(s.attributes or {}) for s in spans if s.name == name][:3]
            problems.append(f"no span {name!r} with {attributes}; spans of that name: {seen}")
    assert not problems, f"{block.where}: " + "\n".join(problems) + f"\nspans: {sorted({s.name for s in spans})}"


async def _check_refusal(block: Block, ns: dict[str, Any], given: Given) -> None:
    """reliability.md's refused replay: a run recorded by 0.1.0 (`tests/histories/before_parking.json`)."""
    text = (ROOT / "tests" / "histories" / "before_parking.json").read_text()
    check_output(block.text.splitlines(), render_replay(await replay_histories(histories_from_json(text))),
                 block.where)


async def _check_deploy_report(block: Block, ns: dict[str, Any], given: Given) -> None:
    """operations.md's check-deploy report: a run of the `ops` agent's old code, paused, against its new code."""
    from ._deploy_agents import AGENT, ops_agent

    async with running_worker(given.client, [ops_agent("old")], unsigned_approvals=True) as worker:
        handle = await start_run(given.client, AGENT, "pay", task_queue=worker.task_queue)
        await wait_for_approvals(given.client, handle.id)
        check = await check_deploy(given.client, [ops_agent("new")], query=f"TaskQueue = '{worker.task_queue}'")
    await handle.terminate("the docs' check is done")
    check_output(block.text.splitlines(), render_deploy_check(check), block.where)


async def _check_summaries(block: Block, ns: dict[str, Any], given: Given) -> None:
    """observability.md's Temporal UI summaries: what `call_summary` makes of the three calls it names."""
    from durable_codemode.shared._results import call_summary

    made = [call_summary("fetch", {"key": "abc\u202edef"}), call_summary("fetch", {"key": "x" * 300}),
            call_summary("transfer", {"to": "A\x1b[2K\x1b[1Gsafe", "cents": 5})]
    assert [line for line in block.text.splitlines() if line.strip()] == made, f"{block.where}: {made}"


OUTPUT_CHECKS: dict[str, Callable[[Block, dict[str, Any], Given], Awaitable[None]]] = {
    "deploy-check": _check_deploy_report,  # a run of tests/_deploy_agents.py's old code, as test_deploy_versions
    "divergence": _check_divergence,  # a real replay whose snippet was edited, as tests/test_debugging.py does
    "refusal": _check_refusal,
    "spans": _check_spans,
    "summaries": _check_summaries,
}
"""The `<!-- docs-test: output NAME -->` checkers: each makes the output now and compares."""


@dataclass
class Given:
    """What blocks may use without defining it; each `run_id` is a fresh run."""

    client: Client
    shop: Shop
    tmp: Path
    injected: set[str] = field(default_factory=set)
    """The names given to the page so far and not since bound by one of its blocks."""

    async def value(self, name: str) -> Any:
        if name == "client":
            return self.client
        if name == "run_id":
            return (await self.shop.waiting_run())[0]
        raise KeyError(name)


GIVEN = {
    "client": "a client of the test's dev server (what `await durable_codemode.connect()` gives here)",
    "run_id": "the id of a new run waiting for approval of `refund(order='A', cents=10)`",
}


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(the names a block uses without binding them, the names it binds)."""
    bound, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:  # `case Event(text=text)` binds `text`
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return used - bound - set(dir(builtins)), bound


def _source(block: Block) -> str:
    text = block.text
    for old, new, _ in SUBSTITUTIONS:
        text = text.replace(old, new)
    return "\n" * block.line + text  # so tracebacks give the markdown's line numbers


async def run_python(block: Block, ns: dict[str, Any], given: Given, background: list[asyncio.Task[Any]]) -> None:
    source = _source(block)
    tree = ast.parse(source)
    free, bound = _names(tree)
    for name in sorted(free):
        if name in ns and name not in given.injected:
            continue  # an earlier block of the page defined it
        assert name in GIVEN, (f"{block.where} uses {name!r}, which no earlier block of its page defines and "
                               "GIVEN does not give")
        ns[name] = await given.value(name)  # fresh for each block (a new run for each `run_id`)
        given.injected.add(name)
    given.injected -= bound
    before = set(ns)
    code = compile(source, str(block.path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    is_coroutine = bool(code.co_flags & 0x80)  # CO_COROUTINE: the block awaits at top level
    if block.marker and block.marker[0] == "background":
        assert is_coroutine, f"{block.where}: a background block must await"
        background.append(asyncio.create_task(eval(code, ns)))
        await asyncio.sleep(0)  # run it up to its first wait, so a block that fails at once fails here
        return
    if is_coroutine:
        await eval(code, ns)
    else:
        await _in_thread(block, code, ns)
    for name in sorted(set(ns) - before):
        if name.startswith("test_") and callable(ns[name]):
            params = [await given.value(p) for p in inspect.signature(ns[name]).parameters]
            outcome = ns[name](*params)
            if asyncio.iscoroutine(outcome):
                await outcome


BLOCK_SECONDS = 90
"""How long a block that runs its own event loop (`run_script(main())`) may take: under the test's own 120 s."""


async def _in_thread(block: Block, code: types.CodeType, ns: dict[str, Any]) -> None:
    """Run a block that starts its own event loop in a thread; one that outlives `BLOCK_SECONDS` fails naming where.

    A thread cannot be stopped, so what the failure can do is say where the block waits: its thread's stack and its
    event loop's tasks. The thread is a daemon of its own (not the loop's executor, which the session's end joins):
    a block that never ends fails its test, and the session still ends and reports it.
    """
    outcome: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run() -> None:
        try:
            exec(code, ns)
        except BaseException as e:  # handed to the test, as to_thread would
            outcome.set_exception(e)
        else:
            outcome.set_result(None)

    thread = threading.Thread(target=run, name=f"block {block.where}", daemon=True)
    thread.start()
    with contextlib.suppress(TimeoutError):
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(outcome)), BLOCK_SECONDS)
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    where = "".join(traceback.format_stack(frame)) if frame is not None else "(its thread has ended)"
    loop = asyncio.get_running_loop()
    for other in [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]:
        if other is not loop and other.is_running():  # the block's loop: where each of its tasks waits
            for pending in list(asyncio.all_tasks(other)):
                stack = io.StringIO()
                pending.print_stack(file=stack)
                where += "\n" + stack.getvalue()
    raise AssertionError(f"{block.where} still ran after {BLOCK_SECONDS} s; its thread waits at:\n{where}")


async def run_commands(block: Block, given: Given, capsys: pytest.CaptureFixture[str]) -> None:
    """Run the block's commands that are in RUN_COMMANDS, and check its output lines if it shows output."""
    commands = [c for c in _commands(block) if _is_run(c)]
    if not commands:
        return
    values: dict[str, str] = {"run.json": str(given.tmp / "run.json")}
    if any(word in ("RUN_ID", "CALL_ID", "shop-1") for command in commands for word in command):
        values["RUN_ID"], values["CALL_ID"] = await given.shop.waiting_run()
        values["shop-1"] = values["RUN_ID"]
    assert set(values) <= set(PLACEHOLDERS)
    for command in commands:
        expected = RUN_COMMANDS[_command_key(command)]
        argv = [values.get(a, a) for a in _program(command)[2]]
        code, out, err = await run_codemode(argv, capsys)
        assert code == expected, f"{block.where}: `codemode {' '.join(argv)}` exited {code}, not {expected}:\n{err}"
        if block.lang == "":
            shown = [line.replace("shop-1", values["RUN_ID"]) if "RUN_ID" in values else line
                     for line in block.text.splitlines()[1:]]
            check_output(shown, out, block.where)


def _pages() -> list[Path]:
    return [p for p in DOC_FILES if any(rule_of(b) in ("executed", "output of a command", "output checked")
                                        or (b.lang == "bash" and any(map(_is_run, _commands(b))))
                                        for b in blocks_of(p))]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
async def test_page(page: Path, env: WorkflowEnvironment, shop: Shop, docs_env: Path,
                    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's python blocks, the commands it shows and the output it shows, top to bottom."""
    given = Given(env.client, shop, docs_env)
    (docs_env / "payloads").mkdir()
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if "ConsoleSpanExporter()" in page.read_text() and isinstance(provider, ReplaySafeTracerProvider):
        # An earlier test set the process's provider, and a block's own cannot replace it: listen to that one.
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    name = "docs_example_" + re.sub(r"\W", "_", str(page.relative_to(ROOT).with_suffix("")))
    module = types.ModuleType(name)  # a module, as a user's code is (pydantic resolves its types through it)
    monkeypatch.setitem(sys.modules, name, module)
    ns: dict[str, Any] = module.__dict__
    ns.update(docs_model=DOCS_MODEL, docs_span_exporter=exporter, docs_payload_dir=str(docs_env / "payloads"))
    background: list[asyncio.Task[Any]] = []

    def no_exit(code: int) -> None:  # a block that ends the process would end pytest with exit 0: a silent pass
        raise AssertionError(f"a block of {page.name} called os._exit({code}) (run_script?): add a SUBSTITUTION")

    monkeypatch.setattr(os, "_exit", no_exit)
    if "PoolSettings(" in page.read_text():
        # In a user's process the first worker starts the Monty pool with the PoolSettings it is given; here earlier
        # tests started it (at the machine's default size, 4 per CPU: 4 on one core), and a running pool keeps its
        # size. Stop it so the page's settings apply as they would for the user.
        assert _pool.POOL.live_sessions() == 0
        _pool.shutdown_pool()
    try:
        for block in blocks_of(page):
            rule = rule_of(block)
            if rule == "executed":
                await run_python(block, ns, given, background)
                for task in background:
                    if task.done():
                        task.result()  # a background block that failed
            elif rule in ("commands", "output of a command"):
                await run_commands(block, given, capsys)
            elif rule == "output checked":
                await OUTPUT_CHECKS[block.marker[1] if block.marker else ""](block, ns, given)
        PAGE_CHECKS.get(str(page.relative_to(ROOT)), lambda ns: None)(ns)
    finally:
        for worker in [v for v in ns.values() if isinstance(v, Worker) and v.is_running]:
            await worker.shutdown()
        async with asyncio.timeout(30):
            outcomes = await asyncio.gather(*background, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


# -- commands mean in a shell what they say -------------------------------------------------------------------------


def _shell_expansions(line: str) -> list[str]:
    """What bash would expand in `line` that reads as text: `$` then a digit, a lowercase name or `$` again.

    Unquoted or inside double quotes only (single quotes and a backslash keep it). `$NAME` in capitals (a variable the
    reader sets) and `$(...)` (a command substitution) are meant; `"... $150"` is not: bash makes it `50`.
    """
    found, quote, i = [], "", 0
    while i < len(line):
        c = line[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if c in "'\"" and quote in ("", c):
            quote = "" if quote == c else c
        elif c == "#" and not quote and (i == 0 or line[i - 1].isspace()):
            break  # a comment
        elif c == "$" and quote != "'" and i + 1 < len(line) and re.match(r"[0-9a-z$!@*#?-]", line[i + 1]):
            found.append(line[i:i + 6])
        i += 1
    return found


def test_commands_mean_in_the_shell_what_they_say() -> None:
    """`codemode run cart-guarded "... for $150"` reached the agent as "... for 50": every command is checked."""
    from durable_codemode.cli import _serving

    lines = [(b.where, line) for b in all_blocks() if b.lang == "bash" for line in b.text.splitlines()]
    lines += [(str(p.relative_to(ROOT)), span) for p in DOC_FILES
              for span in re.findall(r"`((?:codemode|python) [^`]*)`", p.read_text())]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _serving._how_to_run("localhost:7233", "durable-codemode")  # the hint `codemode dev` prints
    lines += [("codemode dev's hint", line) for line in out.getvalue().splitlines()]
    problems = [f"{where}: {line.strip()!r} ({', '.join(found)}…: the shell expands it; use single quotes or \\$)"
                for where, line in lines if (found := _shell_expansions(line))]
    assert not problems, "\n".join(problems)
    assert _shell_expansions('codemode run cart "over $50"') and not _shell_expansions("codemode run cart 'over $50'")
