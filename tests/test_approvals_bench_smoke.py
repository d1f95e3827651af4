"""The approvals benchmark still runs: `bench/approvals_bench.py` at a tiny size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import pytest

from ._bench import run_bench


@pytest.mark.slow
@pytest.mark.xdist_group("cpu-heavy")  # one at a time (tests/conftest.py)
@pytest.mark.timeout(150)
def test_approvals_bench_runs_and_prints_the_table() -> None:
    out = run_bench("approvals_bench.py", "--reps", "1", "--paused", "5")
    assert "measure" in out and "code mode" in out and "floor" in out and "cm/floor" in out, out
    assert "decision → tool starts, 1 MB REPL, cached" in out and "tiny REPL, evicted" in out, out
    assert "5 runs paused" in out and "(5/5 ok)" in out, out
    assert "sandbox sessions held, 5 paused (live_sessions)" in out and "= 0 PASS" in out, out
    assert "targets:" in out, out
