"""`codemode bench` and its harness on the real dev server: rows graded and replayed, ratios, JSON, plot, failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.models import Model
from temporalio.client import Client

from durable_codemode import CodeModeAgent
from durable_codemode.apps.activities.cart import CartTools
from durable_codemode.apps.workflows.cart import CART_TASK, CartInstance
from durable_codemode.apps.workflows.tasks import Mode, Task
from durable_codemode.cli._benchmark import run_benchmark
from durable_codemode.cli._benchmark_report import render_report
from durable_codemode.testing import RunCode, scripted_model

_CLEAN_ENV = {k: v for k, v in os.environ.items()
              if k not in ("TEMPORAL_ADDRESS", "CODEMODE_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")}


def _bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable_codemode.cli", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, env=_CLEAN_ENV, check=False)


@pytest.mark.slow
def test_bench_command_runs_the_cart_task_in_both_modes_and_writes_json_and_plot(tmp_path: Path) -> None:
    rows_file, plot_file = tmp_path / "rows.json", tmp_path / "plot.png"
    done = _bench("--tasks", "cart.remove-over-50", "--n", "5,20", "--json", str(rows_file),
                  "--plot", str(plot_file))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scripted" in done.stdout and "N = 5" in done.stdout and "N = 20" in done.stdout
    assert "4/4 rows passed" in done.stdout
    document = json.loads(rows_file.read_text())
    assert document["scripted"] is True
    rows = document["rows"]
    assert sorted((r["n"], r["mode"]) for r in rows) == [(5, "off"), (5, "on"), (20, "off"), (20, "on")]
    for row in rows:
        assert row["passed"] and row["ok"] and row["replay_ok"] and row["error"] is None, row
        assert row["model"].startswith("scripted") and row["scripted"]
        assert row["requests"] >= 2 and row["input_tokens"] > 0 and row["history_events"] > 0
        assert (row["nested_calls"] > 0) == (row["mode"] == "on")
        assert (row["direct_calls"] > 0) == (row["mode"] == "off")
    by_n = {r["n"]: r for r in document["ratios"]}
    assert set(by_n) == {5, 20}
    for ratio in by_n.values():
        assert all(ratio[k] is not None and ratio[k] > 0 for k in ("tokens", "wall", "requests", "history_bytes"))
    # Tool calling rereads every page it has seen on each turn; the program is the same text at any N.
    assert by_n[20]["tokens"] < by_n[5]["tokens"]
    # Every request carries the tool definitions too, and code mode's `run_code` carries every tool's stub.
    per_request = {r["mode"]: r["definition_tokens"] / r["requests"] for r in rows if r["n"] == 5}
    assert per_request["on"] > per_request["off"] > 0
    assert plot_file.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_fails_fast_on_a_model_without_its_key() -> None:
    done = _bench("--model", "openai:gpt-5", timeout=60)
    assert done.returncode == 2
    assert "OPENAI_API_KEY" in done.stderr and "codemode bench" not in done.stderr  # nothing was started


class _WrongAnswerInstance(CartInstance):
    """The cart task with a scripted model that does nothing and claims success: the oracle must catch it."""

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        wrong = scripted_model(RunCode("len((await list_cart())['items'])"), "Removed 3 lines over $50 each ($1.00).",
                               name="scripted-wrong")
        return CodeModeAgent(Agent(wrong, name="cart", toolsets=[CartTools(self.store).toolset()]))


def _broken_setup(workdir: Path, n: int) -> CartInstance:
    raise RuntimeError("seeding failed on purpose")


async def test_a_failing_row_is_reported_and_the_table_goes_on(client: Client) -> None:
    wrong = Task(name="cart.wrong-answer", apps=("cart",), kind="scaling", sizes=(5,), setup=_WrongAnswerInstance)
    broken = Task(name="cart.broken-setup", apps=("cart",), kind="scaling", sizes=(5,), setup=_broken_setup)
    rows = await run_benchmark(client, [wrong, broken, CART_TASK], modes=["on"], sizes=[5], warmup=False)
    assert [r.task for r in rows] == ["cart.wrong-answer", "cart.broken-setup", "cart.remove-over-50"]
    wrong_row, broken_row, good_row = rows
    assert wrong_row.error is None and not wrong_row.ok and not wrong_row.passed
    assert any("still in the cart" in p for p in wrong_row.problems)
    assert wrong_row.replay_ok is True  # the run itself was fine: it was graded wrong, not lost
    assert broken_row.error == "RuntimeError: seeding failed on purpose" and not broken_row.passed
    assert good_row.passed
    report = render_report(rows)
    assert "1/3 rows passed" in report
    assert "FAILED cart.wrong-answer N=5 code mode" in report and "seeding failed on purpose" in report

