"""The agents this repository deploys: each bundled app's agent, a few lines on top of `durable_codemode`.

- `workflows.cart`: the shopping-cart agent over `activities.cart` (`codemode demo` runs it offline);
  `workflows.calendar`, `workflows.chat`, `workflows.kanban`, `workflows.inventory`: the other four apps;
- `workflows.cart_inventory`: the `cart-inventory` agent, with both apps' tools, for the job across two apps;
- `workflows.long` and `workflows.cart_inventory`: the long-horizon benchmark tasks (60-500 records);
- `workflows.tasks`: the benchmark's task protocol; `all_tasks()` lists every bundled task.

`worker.py` and `codemode dev` / `codemode worker` serve what `agents()` returns. The run workflow itself is
the library's `CodeModeRunWorkflow`; an app only defines its agent, tools and model.

Registering an app is one line in `_APPS` (its module must export `agents()`), a task one entry in `all_tasks()`.
The app modules are imported only when asked for: importing `workflows` creates no store.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from durable_codemode import CodeModeAgent
    from durable_codemode.apps.workflows.tasks import Task

__all__ = ["agents", "all_tasks", "app_modules"]

_APPS = ("cart", "calendar", "chat", "kanban", "inventory", "cart_inventory")
"""The modules under `workflows` whose `agents() -> list[CodeModeAgent]` the worker serves: the five apps, then
the agent over two of them."""


def app_modules() -> list[ModuleType]:
    """The bundled apps' modules, in `_APPS` order."""
    return [importlib.import_module(f"durable_codemode.apps.workflows.{name}") for name in _APPS]


def agents() -> list[CodeModeAgent]:
    """Every bundled app's agents, over each app's default store (seeded on first use)."""
    return [agent for module in app_modules() for agent in module.agents()]


def all_tasks() -> list[Task]:
    """Every bundled benchmark task: the apps' scaling tasks, then the long-horizon ones."""
    from durable_codemode.apps.workflows.calendar import CALENDAR_TASK
    from durable_codemode.apps.workflows.cart import CART_TASK
    from durable_codemode.apps.workflows.cart_inventory import CART_INVENTORY_TASK
    from durable_codemode.apps.workflows.chat import CHAT_TASK
    from durable_codemode.apps.workflows.inventory import INVENTORY_TASK
    from durable_codemode.apps.workflows.kanban import KANBAN_TASK
    from durable_codemode.apps.workflows.long import LONG_CART_TASK

    return [CART_TASK, CALENDAR_TASK, CHAT_TASK, KANBAN_TASK, INVENTORY_TASK, LONG_CART_TASK, CART_INVENTORY_TASK]
