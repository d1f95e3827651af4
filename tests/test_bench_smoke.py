"""The benchmark still runs: `bench/run_bench.py` at a tiny size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "run_bench.py"


@pytest.mark.timeout(150)
def test_bench_runs_and_prints_the_table() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--n", "5", "--reps", "1"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "scenario" in proc.stdout and "wall cm" in proc.stdout and "replay cm" in proc.stdout, proc.stdout
    assert "gather-5" in proc.stdout and "sequential-5" in proc.stdout, proc.stdout
