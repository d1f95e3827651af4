"""The failover benchmark still runs: `bench/failover.py` at its smallest size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "failover.py"


@pytest.mark.timeout(150)
def test_failover_bench_runs_and_prints_the_table() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--sticky", "1", "--reps", "1", "--runs", "2", "--calls", "6"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "resumed median / max" in proc.stdout and "2 runs of 11 nested calls per kill" in proc.stdout
    assert "WRONG" not in proc.stdout, proc.stdout
