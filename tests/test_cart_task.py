"""The cart's benchmark task end to end at N = 20, in both modes, graded by its oracle and replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from durable_codemode.apps.workflows.cart import CART_TASK
from durable_codemode.apps.workflows.tasks import Mode

from ._tasks import run_graded


@pytest.mark.parametrize("mode", ["on", "off"])
async def test_cart_task_at_20_in_both_modes(client: Client, tmp_path: Path, mode: Mode) -> None:
    instance = CART_TASK.setup(tmp_path, 20)
    await run_graded(client, instance, mode)


def test_cart_oracle_fails_on_a_wrong_reply_and_a_wrong_state(tmp_path: Path) -> None:
    instance = CART_TASK.setup(tmp_path, 20)
    assert any("still in the cart" in p for p in instance.check("Removed 0 lines."))
