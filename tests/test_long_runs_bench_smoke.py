"""The long-run benchmark still runs: `bench/long_runs.py` at a tiny size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import pytest

from ._bench import run_bench


@pytest.mark.timeout(150)
def test_long_runs_bench_runs_and_prints_the_table() -> None:
    out = run_bench("long_runs.py", "--snippets", "3", "--calls", "4", "--per-run", "2", "--big-mb", "0.5")
    assert "long run: 12 nested calls" in out and "payload: one 0.5 MB tool result" in out
    assert "WRONG" not in out, out
