"""The history-growth benchmark still runs: `bench/history_growth.py` at a tiny size, as a subprocess, so it cannot rot.

It also checks what the benchmark is for, at that size: our run's history grows linearly in its turns (each turn
adds no more than the run's bytes per turn so far) and its model requests do not grow, while the same run at
behaviour version 3 sends a larger request each turn.
"""

from __future__ import annotations

import pytest

from ._bench import run_bench


def _rows(out: str) -> dict[tuple[str, int], list[str]]:
    """The table's rows by (side, turns)."""
    rows = {}
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 2 and cells[1].isdigit():
            rows[cells[0], int(cells[1])] = cells
    return rows


def _number(cell: str) -> int:
    return int(cell.replace(",", ""))


@pytest.mark.timeout(150)
def test_history_growth_prints_the_table_and_ours_grows_linearly() -> None:
    out = run_bench("history_growth.py", "--turns", "3", "6")
    assert "history / (messages + fixed)" in out and "fixed: a side's fixed bytes per turn" in out, out
    rows = _rows(out)
    assert set(rows) == {(side, turns) for side in ("ours", "ours v3", "pydantic-ai") for turns in (3, 6)}, out
    assert all(row[-1] == "ok" for row in rows.values()), out
    three, six = rows["ours", 3], rows["ours", 6]
    # Linear: the turns 4 to 6 add at most what the first 3 cost per turn (that figure carries the run's constants).
    added_per_turn = (_number(six[3]) * 6 - _number(three[3]) * 3) / 3
    assert added_per_turn <= _number(three[3]), out
    assert three[6] == six[6] == "0", out  # one workflow run each
    # A later model request carries only what is new: the same size at 6 turns as at 3 (a digit more, at most).
    later = [_number(row[5].split(" / ")[1]) for row in (three, six)]
    assert later[1] <= later[0] + 16, out
    before = [_number(rows["ours v3", turns][5].split(" / ")[1]) for turns in (3, 6)]
    assert before[1] > before[0] + 1000, out  # version 3: the whole conversation each request
