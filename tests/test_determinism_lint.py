"""Workflow code must not read clocks, randomness, the environment or files directly.

What runs in workflow code lives in two folders: `durable_codemode/workflow/` (the run workflow, the sandbox driver,
its observers) and `durable_codemode/shared/` (the data, names and errors every side shares). All of it is replayed,
and it is passed through Temporal's sandbox, so the sandbox does not catch such reads. Every one must go through
`workflow.now()`, `workflow.random()`, `workflow.sleep()` or the recorded spec. A line may opt out with
`# determinism: ok (<reason>)`. The folders are checked whole, not by a list, and they stay a roof of their own:
everything workflow code imports is under them, and `shared/` imports nothing of the library outside itself, so
nothing that does I/O can slip into workflow code through an import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).parent.parent / "src" / "durable_codemode"
PACKAGE = "durable_codemode"
DENYLIST = {
    r"\bdatetime\.(now|utcnow|today)\(": "use workflow.now()",
    r"\bdate\.today\(": "use workflow.now().date()",
    r"\btime\.(time|monotonic|perf_counter|sleep)\(": "use workflow.now() / workflow.sleep()",
    r"\bimport random\b|\brandom\.(random|randint|choice|seed)\(": "use workflow.random()",
    r"\buuid\.uuid[14]\(": "use workflow.uuid4()",
    r"\bos\.(environ|getenv)\b": "read the recorded AgentSpec.env",
    r"(?<![\w.])open\(": "no file I/O in workflow code",
    r"\basyncio\.sleep\(": "use workflow.sleep()",
    r"\bthreading\.": "no threads in workflow code",
}
REPLAYED = ("workflow", "shared")
"""The folders of code that runs in workflow code."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _path_of(module: str) -> Path | None:
    base = SRC.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """The library's modules that `path` imports, at module level, in functions or under TYPE_CHECKING."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            candidates = [n for n in names if _path_of(n) is not None] or [target]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found |= {c for c in candidates if c.split(".")[0] == PACKAGE and _path_of(c) is not None}
    return found


def _replayed_folders() -> dict[str, Path]:
    """Every module of the folders that run in workflow code."""
    return {_module_name(p): p for folder in REPLAYED for p in sorted((SRC / folder).glob("*.py"))}


def _workflow_code() -> dict[str, Path]:
    """Every module that runs in workflow code: the workflow folder and what it imports, transitively."""
    todo = [_module_name(p) for p in sorted((SRC / "workflow").glob("*.py"))]
    seen: dict[str, Path] = {}
    while todo:
        module = todo.pop()
        path = _path_of(module)
        if module in seen or path is None:
            continue
        seen[module] = path
        todo += sorted(_imports(path) - set(seen))
    return seen


WORKFLOW_CODE = _workflow_code()
REPLAYED_CODE = _replayed_folders()


def test_workflow_code_is_under_one_roof() -> None:
    """Everything workflow code imports lives under `workflow/` or `shared/`: what is replayed is what is there."""
    assert {"durable_codemode.workflow._run", "durable_codemode.workflow._sandbox",
            "durable_codemode.shared._types", "durable_codemode.shared._names"} <= set(WORKFLOW_CODE)
    outside = sorted(m for m in WORKFLOW_CODE if m not in REPLAYED_CODE and m != "durable_codemode.workflow")
    assert outside == [], f"workflow code imports modules outside workflow/ and shared/: {outside}"


def test_shared_imports_only_shared() -> None:
    """`shared/` is the ground floor: every side imports it, and it imports nothing of theirs."""
    leaks = {m: sorted(i for i in _imports(p) if not i.startswith("durable_codemode.shared"))
             for m, p in REPLAYED_CODE.items() if m.startswith("durable_codemode.shared")}
    assert {m: i for m, i in leaks.items() if i} == {}


@pytest.mark.parametrize("module", sorted(REPLAYED_CODE))
def test_workflow_code_is_deterministic(module: str) -> None:
    problems = []
    path = REPLAYED_CODE[module]
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = re.sub(r"\"[^\"]*\"|'[^']*'", '""', line).split("#", 1)[0]  # strings and comments are not calls
        if "determinism: ok (" in line:
            continue
        for pattern, fix in DENYLIST.items():
            if re.search(pattern, code):
                problems.append(f"{path.relative_to(SRC.parent)}:{n}: {line.strip()}  -> {fix}")
    assert not problems, "\n".join(problems)


def test_the_lint_catches_a_clock_read() -> None:
    """The patterns are live: a plain clock read in workflow code would be reported."""
    assert any(re.search(p, "started = time.monotonic()") for p in DENYLIST)
    assert any(re.search(p, "key = os.environ['X']") for p in DENYLIST)
