"""What the bundled worker serves and what `codemode bench` runs: every app, the agent over two, every task once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_codemode.apps import workflows


def test_the_worker_serves_the_five_apps_and_the_cross_app_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the apps' default stores live under ~/.local/share
    for name in [k for k in os.environ if k.startswith("CODEMODE_")]:
        monkeypatch.delenv(name)
    names = [agent.name for agent in workflows.agents()]
    assert names == ["cart", "cart-guarded", "calendar", "chat", "kanban", "inventory", "cart-inventory"]
    stores = {p.name for p in (tmp_path / ".local/share/durable-codemode").glob("*.sqlite")}
    assert {"cart.sqlite", "inventory.sqlite"} <= stores and len(stores) == 5


def test_the_registry_lists_every_task_once_with_both_kinds() -> None:
    tasks = workflows.all_tasks()
    names = [t.name for t in tasks]
    assert len(names) == len(set(names))
    assert {app for t in tasks for app in t.apps} == {"cart", "calendar", "chat", "kanban", "inventory"}
    long = [t for t in tasks if t.kind == "long"]
    assert len(long) >= 2 and any(len(t.apps) == 2 for t in long)
    assert all(60 <= n <= 500 for t in long for n in t.sizes)
