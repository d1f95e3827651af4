"""The failover benchmark still runs: `bench/failover.py` at its smallest size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import pytest

from ._bench import run_bench


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_failover_bench_runs_and_prints_the_table() -> None:
    out = run_bench("failover.py", "--sticky", "1", "--reps", "1", "--runs", "2", "--calls", "6")
    assert "resumed median / max" in out and "2 runs of 11 nested calls per kill" in out
    assert "WRONG" not in out, out
