"""Dependencies run one way down: cli → the public facades → client / history → worker → workflow → shared.

Each part of the package may import only the parts below it, so what is replayed (`workflow/`, `shared/`) never
reaches up to code that does I/O, the worker never needs the client's code, and a client runs where no worker's
code is. The helpers at the top level that run outside workflow code (`_converter`, `_storage`, `_deployments`,
`_visibility`, `_history_events`, ...) sit between the worker and workflow code: every side may use them, and they
use only `shared/` and each other. Module-level, in-function and TYPE_CHECKING imports all count.
"""

from __future__ import annotations

from .test_determinism_lint import SRC, _imports, _module_name

RANK = {
    "cli": 6,
    "durable_codemode": 5, "testing": 5, "debugging": 5, "ui": 5, "events": 5, "apps": 5,
    "client": 4, "history": 4,
    "worker": 3,
    "helpers": 2,
    "workflow": 1,
    "shared": 0,
}
"""Each part's floor: a part imports only parts on lower floors (and itself)."""

APART = {("client", "history"), ("history", "client"), ("client", "worker")}
"""Pairs kept apart although one stands above the other: side by side, and a client that needs no worker."""


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "durable_codemode"
    if parts[1].startswith("_"):
        return "helpers"
    return parts[1]


def _edges() -> set[tuple[str, str, str, str]]:
    """(importing part, imported part, importing module, imported module) for every import between two parts."""
    found = set()
    for path in SRC.rglob("*.py"):
        module = _module_name(path)
        for imported in _imports(path):
            a, b = _part(module), _part(imported)
            if a != b:
                found.add((a, b, module, imported))
    return found


def test_every_part_has_a_floor() -> None:
    assert {a for a, *_ in _edges()} | {b for _, b, *_ in _edges()} <= set(RANK)


def test_imports_run_one_way_down() -> None:
    up = sorted(f"{m} -> {i}" for a, b, m, i in _edges() if RANK[b] >= RANK[a] or (a, b) in APART)
    assert up == [], "imports that run up or sideways:\n" + "\n".join(up)
