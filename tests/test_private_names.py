"""Only `durable_codemode._pydantic_ai` touches pydantic-ai's private names: the rest of the code uses its public API.

pydantic-ai changes its private names between releases without notice; a runtime that supports a range of its
releases keeps every such touch in one seam module, each pinned by a test of its own (`tests/test_compat.py`).
This test reads every module of the runtime, the bundled apps and the worker, and fails on any other module that
imports from a private pydantic-ai module, imports a private name, or reads a private attribute pydantic-ai defines.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pydantic_ai
import pytest

pytestmark = [
    pytest.mark.pydantic_ai_release,  # runs again on the oldest pydantic-ai (docs/development.md)
    # One process for both tests: they share the scan of pydantic-ai's source (~8 s of CPU), cached per process.
    pytest.mark.xdist_group("private_names"),
]

ROOT = Path(__file__).resolve().parent.parent
SEAM = ROOT / "src" / "durable_codemode" / "_pydantic_ai.py"
CHECKED = [ROOT / "src", ROOT / "workflows", ROOT / "activities", ROOT / "worker.py", ROOT / "bench"]
OURS = frozenset({"self", "cls"})
"""Attribute reads on these are our own objects' (our classes may use a private name pydantic-ai also uses)."""


def _modules() -> list[Path]:
    found: list[Path] = []
    for place in CHECKED:
        found.extend([place] if place.is_file() else sorted(place.rglob("*.py")))
    return [path for path in found if path.resolve() != SEAM and "harness" not in path.name]


@functools.cache
def _pydantic_ai_private_names() -> frozenset[str]:
    """Every `_name` pydantic-ai's own source assigns as an attribute, declares as a field or defines as a method."""
    names: set[str] = set()
    for path in Path(pydantic_ai.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("_"):
                        names.add(item.name)
                    elif (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                          and item.target.id.startswith("_")):
                        names.add(item.target.id)
    return frozenset(name for name in names if not (name.startswith("__") and name.endswith("__")))


def _private_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "pydantic_ai" and any(part.startswith("_") for part in parts[1:])


OPT_OUT = "# not pydantic-ai:"
"""A line may read a private name pydantic-ai happens to share with another library, saying whose it is and why."""


def _violations(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    private = _pydantic_ai_private_names()
    where = path.relative_to(ROOT)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pydantic_ai":
            if _private_module(node.module):
                found.append(f"{where}:{node.lineno} imports from private module {node.module}")
            found.extend(f"{where}:{node.lineno} imports private name {alias.name} from {node.module}"
                         for alias in node.names if alias.name.startswith("_"))
        elif isinstance(node, ast.Import):
            found.extend(f"{where}:{node.lineno} imports private module {alias.name}"
                         for alias in node.names if _private_module(alias.name))
        elif isinstance(node, ast.Attribute) and node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in OURS) and not _opted_out(lines, node.lineno):
            found.append(f"{where}:{node.lineno} reads {ast.unparse(node)}, a private name of pydantic-ai's")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr"}
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in private):
            found.append(f"{where}:{node.lineno} reads {node.args[1].value!r} by name, a private name of pydantic-ai's")
    return found


def _opted_out(lines: list[str], lineno: int) -> bool:
    """Whether the line opts out with a reason (`# not pydantic-ai: <whose name it is>`)."""
    _, marker, reason = lines[lineno - 1].partition(OPT_OUT)
    return bool(marker) and len(reason.strip()) >= 10


def test_only_the_seam_touches_pydantic_ais_private_names() -> None:
    found = [line for path in _modules() for line in _violations(path)]
    assert not found, (
        "private pydantic-ai names outside durable_codemode/_pydantic_ai.py (move each into a function there, "
        "with the public API that would replace it, and pin it in tests/test_compat.py):\n" + "\n".join(found))


def test_the_check_sees_a_private_name() -> None:
    """The scan above is not vacuous: the seam itself reads private names, and the scan finds them there."""
    assert len(_violations(SEAM)) >= 5
