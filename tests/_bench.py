"""Running a benchmark script as its user does, for the smoke tests that keep each one from rotting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_bench(script: str, *args: str) -> str:
    """Run `bench/<script>` with `args` in a subprocess (at most 120 s); assert it exits 0, return its stdout."""
    proc = subprocess.run([sys.executable, str(BENCH / script), *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def table_row(out: str, label: str) -> list[str]:
    """The cells of the line of `out` that starts with `label` (its first cell), stripped; fails showing `out`."""
    row = next((line for line in out.splitlines() if line.startswith(label)), None)
    assert row is not None, f"no row starting {label!r} in:\n{out}"
    return [cell.strip() for cell in row.split("|")]
