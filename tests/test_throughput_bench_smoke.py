"""The throughput benchmark still runs: `bench/throughput.py` at its smallest size, as a subprocess."""

from __future__ import annotations

import pytest

from ._bench import run_bench, table_row


@pytest.mark.timeout(150)
def test_throughput_bench_runs_and_prints_the_table() -> None:
    out = run_bench("throughput.py", "--runs", "2", "--calls", "3", "--pool", "2")
    assert "sequential: 2 runs x 3 calls" in out and "gather: 2 runs x 3 calls" in out, out
    assert "calls/s cm" in out and "monty RSS (procs)" in out and "load average" in out, out
    assert "WRONG" not in out, out
    # Each side's CPU per run, by process: code mode's sandbox processes did the programs' work.
    assert "CPU/run cm: bench+server+monty" in out and "CPU cm/floor" in out, out
    row = table_row(out, "sequential: 2 runs")
    bench, server, monty = (float(x) for x in row[-4].removesuffix(" ms").split("+"))
    assert bench > 0 and server > 0 and monty > 0, row
