"""The benchmark still runs: `bench/run_bench.py` at a tiny size, as a subprocess, so it cannot rot."""

from __future__ import annotations

import pytest

from ._bench import run_bench, table_row


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_bench_runs_and_prints_the_table() -> None:
    out = run_bench("run_bench.py", "--n", "5", "--reps", "1")
    assert "scenario" in out and "wall cm" in out and "replay cm" in out, out
    assert "gather-5" in out and "sequential-5" in out, out


@pytest.mark.timeout(150)
def test_history_bytes_breaks_a_call_down() -> None:
    out = run_bench("history_bytes.py", "--n", "5")
    assert "gather-5: bytes per nested call" in out and "sequential-5: bytes per nested call" in out, out
    assert "run result | CallRecord JSON" in out and "scheduled | input: data" in out, out


@pytest.mark.timeout(150)
def test_snippet_costs_prints_a_row_per_program() -> None:
    out = run_bench("snippet_costs.py", "--reps", "1")
    assert "first check, cold" in out and "first check, warmed" in out, out
    for program in ("gather-20", "sequential-20", "rows (sort, json, re)"):
        assert f"\n{program} " in out, out


@pytest.mark.timeout(150)
def test_between_snippets_compares_kept_and_released() -> None:
    out = run_bench("between_snippets.py", "--snippets", "2", "--reps", "1")
    assert "wall kept" in out and "starting released" in out and "every history replayed" in out, out


@pytest.mark.timeout(150)
def test_replay_costs_times_each_part_of_a_replay() -> None:
    out = run_bench("replay_costs.py", "--n", "5", "--reps", "1")
    assert "cm: Monty round trips" in out and "activations floor" in out, out
    for scenario in ("gather-5", "sequential-5"):
        row = table_row(out, f"{scenario} ")
        # The sandbox's round trips were timed: a code-mode replay runs the program again.
        assert float(row[6].removesuffix(" ms")) > 0, row


@pytest.mark.timeout(150)
def test_monty_round_trip_times_both_placements() -> None:
    out = run_bench("monty_round_trip.py", "--n", "5", "--reps", "2", "--idle-ms", "5")
    assert "free µs/round trip" in out and "one CPU µs/round trip" in out and "after idle" in out, out
    for program in ("gather", "sequential"):
        row = table_row(out, f"{program} ")
        free, pinned, idle = float(row[1]), float(row[2]), float(row[4])
        assert free > 0 and pinned > 0 and idle > 0, row  # every placement ran the program to its end


@pytest.mark.timeout(150)
def test_live_phases_cut_each_run_into_the_same_phases() -> None:
    out = run_bench("live_phases.py", "--n", "3", "--kinds", "gather", "--reps", "1")
    phases = ("start, describe", "model request 1", "program start", "tool calls", "program end", "model request 2",
              "end ")
    # With one run a side, the medians are that run's: its phases cut it end to end, so they add up to it.
    for side in (1, 2):
        total = sum(float(table_row(out, phase)[side]) for phase in phases)
        assert abs(total - float(table_row(out, "whole run")[side])) < 0.5, out
