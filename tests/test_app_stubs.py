"""What a real model reads about each bundled app: every result field is documented in the `run_code` stubs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from durable_codemode.apps.workflows.calendar import CALENDAR_TASK
from durable_codemode.apps.workflows.cart import CART_TASK
from durable_codemode.apps.workflows.chat import CHAT_TASK
from durable_codemode.apps.workflows.inventory import INVENTORY_TASK
from durable_codemode.apps.workflows.kanban import KANBAN_TASK
from durable_codemode.apps.workflows.tasks import Task
from durable_codemode.worker._describe import describe_run

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


@pytest.mark.parametrize("task", [CART_TASK, CALENDAR_TASK, CHAT_TASK, KANBAN_TASK, INVENTORY_TASK],
                         ids=lambda t: t.name)
async def test_every_result_field_is_documented_in_the_stubs(task: Task, tmp_path: Path) -> None:
    spec = await describe_run(task.setup(tmp_path, 5).agent("on"))
    lines = spec.stubs.splitlines()
    fields = [i for i, line in enumerate(lines) if re.match(r"^    \w+: ", line)]
    assert fields, spec.stubs
    undocumented = [lines[i].strip() for i in fields if not lines[i + 1].lstrip().startswith('"""')]
    assert undocumented == [], f"result fields without a docstring in the stubs: {undocumented}"
