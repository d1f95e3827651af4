"""The approvals benchmark still runs: `bench/approvals_bench.py` at a tiny size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "approvals_bench.py"


@pytest.mark.timeout(150)
def test_approvals_bench_runs_and_prints_the_table() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--reps", "1", "--paused", "5"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    out = proc.stdout
    assert "measure" in out and "code mode" in out and "floor" in out and "cm/floor" in out, out
    assert "decision → tool starts, 1 MB REPL, cached" in out and "tiny REPL, evicted" in out, out
    assert "5 runs paused" in out and "(5/5 ok)" in out, out
    assert "sandbox sessions held, 5 paused (live_sessions)" in out and "= 0 PASS" in out, out
    assert "targets:" in out, out
