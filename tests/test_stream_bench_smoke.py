"""The event-stream benchmark still runs: `bench/stream_bench.py` at a tiny size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import pytest

from ._bench import run_bench


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_stream_bench_runs_and_prints_the_table() -> None:
    out = run_bench("stream_bench.py", "--reps", "1", "--calls", "3", "--gather", "5", "--tokens", "30")
    rows = [[cell.strip() for cell in line.split(" | ")] for line in out.splitlines() if " | " in line]
    assert rows[0][:2] == ["scenario", "side"] and "latency p95" in rows[0] and "+B/call" in rows[0], out
    sides = {(row[0], row[1]) for row in rows[1:]}
    assert {("calls", side) for side in ("off", "subscriber", "no subscriber", "slow subscriber",
                                          "update subscriber")} <= sides, out
    assert {("tokens", "subscriber"), ("tokens", "whole parts"), ("gather", "subscriber")} <= sides, out
    latency = rows[0].index("latency p95")
    assert all(row[latency].endswith(" ms") for row in rows[1:] if row[1] == "subscriber"), out
    assert any(line.startswith("token run history") for line in out.splitlines()), out
