"""The cart's benchmark task end to end at N = 20, in both modes, graded by its oracle and replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from durable_codemode import start_run
from durable_codemode.testing import new_task_queue, replay, running_worker
from workflows.cart import CART_TASK
from workflows.tasks import Mode


@pytest.mark.parametrize("mode", ["on", "off"])
async def test_cart_task_at_20_in_both_modes(client: Client, tmp_path: Path, mode: Mode) -> None:
    instance = CART_TASK.setup(tmp_path, 20)
    agent = instance.agent(mode)
    task_queue = new_task_queue()
    async with running_worker(client, [agent], task_queue=task_queue):
        handle = await start_run(client, agent.name, instance.prompt, task_queue=task_queue)
        result = await handle.result()
        await replay(handle)
    assert instance.check(result.output) == []
    assert instance.duplicate_effects() == 0
    if mode == "on":
        assert len(result.nested_calls) > 0 and not result.direct_calls
    else:
        assert len(result.direct_calls) > 0 and not result.nested_calls


def test_cart_oracle_fails_on_a_wrong_reply_and_a_wrong_state(tmp_path: Path) -> None:
    instance = CART_TASK.setup(tmp_path, 20)
    assert any("still in the cart" in p for p in instance.check("Removed 0 lines."))
