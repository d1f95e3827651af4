"""Run the test suite with two CPU burners beside it: `python -m tests.under_load [--runs N] [pytest options]`.

A test that passes only on a quiet machine hides the bugs a loaded production worker meets, so the suite must be
green with two `yes > /dev/null` running on the 2-core machine CI uses. This starts the two burners, runs the
README's two test passes (`python -m pytest`, then `python -m tests.on_oldest_pydantic_ai`) with this interpreter
`--runs` times (default 1), stops the burners, and prints one line per run: its passes' exit statuses, what pytest
said last, and the wall time. The exit status is 0 only if every pass of every run passed.

Options after `--runs N` go to pytest in both passes (e.g. `-x`, `-k name`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BURNERS = 2


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "(no output)"


def _run_pass(argv: list[str], log: Path) -> tuple[int, str]:
    with log.open("w") as out:
        code = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
    return code, _last_line(log.read_text(errors="replace"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.under_load", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="how many times to run both passes (default 1)")
    parser.add_argument("--logs", type=Path, default=ROOT / ".under-load", help="where each pass's output goes")
    args, pytest_args = parser.parse_known_args(argv)
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    args.logs.mkdir(parents=True, exist_ok=True)
    burners = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(BURNERS)]
    failed = False
    try:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            first = _run_pass(["-m", "pytest", *pytest_args], args.logs / f"run{run}-newest.log")
            second = _run_pass(["-m", "tests.on_oldest_pydantic_ai", *pytest_args], args.logs / f"run{run}-oldest.log")
            failed = failed or first[0] != 0 or second[0] != 0
            print(f"run {run}/{args.runs} with {BURNERS} burners: newest exit {first[0]} ({first[1]}); oldest exit "
                  f"{second[0]} ({second[1]}); {time.monotonic() - started:.0f} s; logs in {args.logs}", flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
