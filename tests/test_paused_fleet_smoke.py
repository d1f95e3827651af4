"""The paused-fleet benchmark still runs: `bench/paused_fleet.py` at a tiny size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import pytest

from ._bench import run_bench


@pytest.mark.timeout(150)
def test_paused_fleet_bench_runs_and_prints_the_table() -> None:
    out = run_bench("paused_fleet.py", "--paused", "3", "--idle", "0.5")
    assert "measure" in out and "just paused (3 runs): worker RSS" in out, out
    assert "pool retired after its last use" in out and "(0 monty left)" in out, out
    assert "approved → completed" in out and "| 4/4 in " in out, out
