"""The history tools and `watch` see a run only through its observer and its events, never the workflow's insides.

A replay is watched by an observer of the run (`_observers.RunTelemetry`, attached with `observe_run`, as
tracing's spans are): it learns each call's source line, each snippet's outcome and the run's approvals. The
workflow may then rename or reshape its private methods and state freely: nothing outside `workflow/` reads them.
And `read_run` (traces, replay reports) and `watch` decode a history with the one reader, `_history_events`.
"""

from __future__ import annotations

import ast
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from durable_codemode.workflow import _run
from durable_codemode.workflow._observers import RunTelemetry, _Observers
from durable_codemode.workflow._sandbox_types import SnippetOutcome

ROOT = Path(__file__).resolve().parent.parent / "src" / "durable_codemode"
READERS = sorted((ROOT / "history").glob("*.py")) + sorted((ROOT / "client").glob("*.py"))


def _workflow_private_names() -> set[str]:
    """The run workflow's private methods and the private attributes its instances keep."""
    tree = ast.parse(Path(_run.__file__).read_text(encoding="utf-8"))
    workflow_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CodeModeRunWorkflow")
    names = {n.name for n in workflow_class.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for node in ast.walk(workflow_class):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and isinstance(node.ctx, ast.Store)):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_the_history_tools_never_touch_the_run_workflows_private_names() -> None:
    private = _workflow_private_names()
    assert {"_start_tool", "_run_code", "_approvals"} <= private  # what the replay capture once wrapped and read
    touched = []
    for path in READERS:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id == "self"):
                name = node.attr
            elif isinstance(node, ast.Constant) and node.value in private:  # getattr(obj, "_name")
                name = node.value
            if name is not None:
                touched.append(f"{path.relative_to(ROOT)}:{node.lineno} reads the run workflow's {name}")
    assert not touched, "observe the run through _observers.RunTelemetry instead:\n" + "\n".join(touched)


def test_watch_and_the_trace_read_events_with_one_reader() -> None:
    watch = ast.parse((ROOT / "client" / "_watch.py").read_text(encoding="utf-8"))
    imported = {(n.module, a.name) for n in ast.walk(watch) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("_history_events", "RunReader") in imported
    assert not [name for module, name in imported
                if module and module.startswith(("history", "_history")) and name.startswith("_")]


class _Recording(RunTelemetry):
    def __init__(self, name: str, seen: list[str]) -> None:
        self._name, self._seen = name, seen

    def snippet(self, coro: Coroutine[Any, Any, SnippetOutcome], *, call_id: str, code: str
                ) -> Coroutine[Any, Any, SnippetOutcome]:
        async def around() -> SnippetOutcome:
            self._seen.append(f"{self._name} enters {call_id}")
            outcome = await coro
            self._seen.append(f"{self._name} leaves {call_id}: {outcome.kind}")
            return outcome
        return around()

    def call_made(self, *, tool: str, call_id: str, args: dict[str, Any], code: str, line: int) -> None:
        self._seen.append(f"{self._name} saw {tool} at line {line}")


async def test_two_observers_of_a_run_each_see_every_step_the_first_outermost() -> None:
    # A traced worker's spans and a replay's capture may observe the same run; neither may hide a step from the other.
    seen: list[str] = []
    both = _Observers([_Recording("spans", seen), _Recording("capture", seen)])
    outcome = SnippetOutcome(kind="ok", content=1)

    async def snippet() -> SnippetOutcome:
        seen.append("the snippet runs")
        return outcome

    both.call_made(tool="get", call_id="call_0.1", args={}, code="await get()", line=1)
    assert await both.snippet(snippet(), call_id="call_0", code="await get()") is outcome
    assert seen == ["spans saw get at line 1", "capture saw get at line 1", "spans enters call_0",
                    "capture enters call_0", "the snippet runs", "capture leaves call_0: ok", "spans leaves call_0: ok"]
