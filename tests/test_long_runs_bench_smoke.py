"""The long-run benchmark still runs: `bench/long_runs.py` at a tiny size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "long_runs.py"


@pytest.mark.timeout(150)
def test_long_runs_bench_runs_and_prints_the_table() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--snippets", "3", "--calls", "4", "--per-run", "2", "--big-mb", "0.5"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "long run: 12 nested calls" in proc.stdout and "payload: one 0.5 MB tool result" in proc.stdout
    assert "WRONG" not in proc.stdout, proc.stdout
