"""The large-catalog benchmark still runs: `bench/catalog.py` on its 300 tools, as a subprocess, so it cannot rot."""

from __future__ import annotations

import pytest

from ._bench import run_bench


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_catalog_bench_runs_and_prints_the_table() -> None:
    out = run_bench("catalog.py")
    assert "run_code description" in out and "tokens sent" in out, out
    assert "every stub" in out and "index (default)" in out, out
    assert "every run answered {'refund': 'refund_99999'" in out, out
