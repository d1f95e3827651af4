"""Running a benchmark script as its user does, for the smoke tests that keep each one from rotting."""

from __future__ import annotations

from pathlib import Path

from ._forked import run_script

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_bench(script: str, *args: str) -> str:
    """Run `bench/<script>` with `args` in a child process (at most 120 s); assert it exits 0, return its stdout.

    A process forked from one that has imported the package already (`tests/_forked.py`): the script runs as
    `__main__` with its own arguments, streams and exit status, without paying the import again.
    """
    code, out, err = run_script(BENCH / script, args, timeout=120)
    assert code == 0, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def table_row(out: str, label: str) -> list[str]:
    """The cells of the line of `out` that starts with `label` (its first cell), stripped; fails showing `out`."""
    row = next((line for line in out.splitlines() if line.startswith(label)), None)
    assert row is not None, f"no row starting {label!r} in:\n{out}"
    return [cell.strip() for cell in row.split("|")]
