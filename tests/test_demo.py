"""The bundled cart agent end to end on the real dev server, and the `codemode` command line around it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pydantic import TypeAdapter
from temporalio.client import Client

from durable_codemode import RunResult, start_run
from durable_codemode.apps.activities.cart import CartStore, check_removed_over, over_threshold
from durable_codemode.apps.workflows.cart import DEMO_PROMPT, MODEL_ENV, cart_agent, scripted_cart_model
from durable_codemode.history._trace import render_tree
from durable_codemode.testing import new_task_queue, replay, running_worker

from ._forked import run_codemode

_ANSWER = re.compile(
    r"Removed (\d+) lines over \$50 each \(\$([\d,]+)\.(\d\d)\); (\d+) lines remain \(\$([\d,]+)\.(\d\d)\)\."
)


def _cents(dollars: str, cents: str) -> int:
    return int(dollars.replace(",", "")) * 100 + int(cents)


def _cli_env(**extra: str) -> dict[str, str]:
    """The environment for a `codemode` subprocess: never a real model, whatever the developer has set."""
    env = {k: v for k, v in os.environ.items() if k not in (MODEL_ENV, "TEMPORAL_ADDRESS")}
    return {**env, **extra}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "durable_codemode.cli", *args]


@pytest.fixture
def store(tmp_path: Path) -> CartStore:
    store = CartStore(tmp_path / "cart.sqlite")
    store.seed(lines=122)
    return store


async def test_cart_agent_removes_lines_over_50_exactly_once(client: Client, store: CartStore) -> None:
    before = store.all_lines()
    over = over_threshold(before)
    kept = [line for line in before if line not in over]
    assert over and kept  # the seed has both, or this test proves nothing
    agent = cart_agent(store, model=scripted_cart_model())
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "cart", DEMO_PROMPT, task_queue=tq)
        result = await handle.result()

    match = _ANSWER.fullmatch(result.output)
    assert match, result.output
    assert int(match[1]) == len(over)
    assert _cents(match[2], match[3]) == sum(line["unit_price_cents"] * line["quantity"] for line in over)
    assert int(match[4]) == len(kept)
    assert _cents(match[5], match[6]) == sum(line["unit_price_cents"] * line["quantity"] for line in kept)

    assert check_removed_over(store, before) == []
    calls = result.nested_calls
    assert Counter(c.tool for c in calls) == {"list_cart": 3, "remove_line": len(over)}
    assert all(c.status == "ok" for c in calls)
    pages = sorted((c for c in calls if c.tool == "list_cart"), key=lambda c: int(c.call_id.split(".")[-1]))
    assert [c.args for c in pages] == ['{"offset": 0}', '{"offset": 50}', '{"offset": 100}']
    assert store.duplicate_effects() == 0
    assert store.execution_count("remove_line") == len(over)
    assert store.execution_count() == len(over)  # nothing but the removals changed the store
    assert result.usage.requests == 2 and result.continued_as_new == 0

    tree = render_tree(result)
    assert f"({3 + len(over)} nested calls)" in tree
    assert f"└─ answer: {result.output}" in tree
    await replay(handle)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_command(tmp_path: Path) -> None:
    done = subprocess.run(_cli("demo"), cwd=tmp_path, env=_cli_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "end state: correct" in done.stdout
    assert "model turn 0" in done.stdout and "list_cart(offset=0)" in done.stdout
    assert re.search(r"usage: 2 model requests, \d+ input tokens, \d+ output tokens", done.stdout)


@pytest.mark.timeout(60)
def test_run_against_an_unreachable_server_exits_2_naming_the_address(tmp_path: Path) -> None:
    done = subprocess.run(_cli("run", "cart", "hi"), cwd=tmp_path,
                          env=_cli_env(TEMPORAL_ADDRESS="127.0.0.1:1"),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr


async def _codemode(address: str, *args: str) -> tuple[int, str, str]:
    # Asynchronous, because the worker serving the run lives on this test's event loop.
    return await run_codemode(args, env=_cli_env(TEMPORAL_ADDRESS=address), timeout=60)


@pytest.mark.timeout(120)
async def test_run_command_json_and_unknown_agent(client: Client, store: CartStore) -> None:
    address = client.service_client.config.target_host
    tq = new_task_queue()
    async with running_worker(client, [cart_agent(store, model=scripted_cart_model())], task_queue=tq):
        code, out, err = await _codemode(address, "run", "cart", DEMO_PROMPT, "--task-queue", tq, "--json")
        assert code == 0, err
        result = TypeAdapter(RunResult).validate_json(out)  # stdout holds the JSON and nothing else
        assert result.output.startswith("Removed ")
        # Call records print with their field names (histories hold them as compact lists).
        printed = [c for t in json.loads(out)["turns"] for s in t["snippets"] for c in s["calls"]]
        assert printed and all(isinstance(c, dict) and c["tool"] for c in printed)
        assert "run cart-" in err  # the run id went to stderr

        code, out, err = await _codemode(address, "run", "nosuch", "hi", "--task-queue", tq)
    assert code == 1, out + err
    assert "no agent named 'nosuch'" in err
    assert "Traceback" not in err
