"""`bench/harness_bench.py` still runs, at a tiny size, when pydantic-ai-harness is installed somewhere.

pydantic-ai-harness 0.62 pins `pydantic-ai-slim==2.62.0`, so it usually lives in its own venv (`.venv-harness`),
not in the test environment: `pytest.importorskip` on this interpreter would always skip. The test asks the
script which interpreter it would use (`harness_python()`: `$HARNESS_PYTHON`, `.venv-harness`, or this one) and
skips only when none can import it.
"""

from __future__ import annotations

import pytest

from bench.harness_bench import harness_python

from ._bench import run_bench


@pytest.mark.timeout(150)
def test_harness_bench_runs_and_prints_the_table() -> None:
    if harness_python() is None:
        pytest.skip("pydantic_ai_harness is not importable here, nor in $HARNESS_PYTHON or .venv-harness")
    out = run_bench("harness_bench.py", "--n", "3", "--reps", "1")
    assert "harness side:" in out and "pydantic-ai-harness" in out, out
    assert "wall harness" in out and "replay harness" in out and "harness/floor" in out, out
    assert "gather-3" in out and "sequential-3" in out, out
    assert "harness failed" not in out, out
