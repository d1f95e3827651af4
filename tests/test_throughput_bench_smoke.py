"""The throughput benchmark still runs: `bench/throughput.py` at its smallest size, as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "throughput.py"


@pytest.mark.timeout(150)
def test_throughput_bench_runs_and_prints_the_table() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--runs", "2", "--calls", "3", "--pool", "2"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    out = proc.stdout
    assert "sequential: 2 runs x 3 calls" in out and "gather: 2 runs x 3 calls" in out, out
    assert "calls/s cm" in out and "monty RSS (procs)" in out and "load average" in out, out
    assert "WRONG" not in out, out
