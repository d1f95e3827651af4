"""Run the test suite again on the oldest pydantic-ai release durable-codemode supports.

`python -m tests.on_oldest_pydantic_ai` (the README's test command runs it after the suite, which ran on the newest
release pip resolves). The oldest supported release is the lower bound of `pydantic-ai-slim` in `pyproject.toml`,
read from there so the two never disagree. It is installed in a second virtualenv, `.venv-oldest/` (made on the
first run, updated on later ones), with everything else as `pip install -e '.[test]'` resolves it, and the suite
runs there with the same pytest options, less the tests marked `pydantic_ai_independent` (Temporal's faults and
the bench scripts, which the first pass ran). The exit status is the suite's.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLDEST_VENV = ROOT / ".venv-oldest"
_LOWER_BOUND = re.compile(r"^pydantic-ai-slim(\[[^\]]*\])?>=([0-9.]+)")


def oldest_supported() -> str:
    """The lower bound of `pydantic-ai-slim` in the project's dependencies (`>=X` is the oldest release tested)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        found = _LOWER_BOUND.match(requirement.replace(" ", ""))
        if found:
            return found.group(2)
    raise SystemExit("pyproject.toml has no `pydantic-ai-slim>=X` dependency: nothing says which release is oldest")


def main(argv: list[str]) -> int:
    version = oldest_supported()
    python = OLDEST_VENV / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(OLDEST_VENV)
    print(f"== the suite again on pydantic-ai-slim {version}, the oldest supported release ({OLDEST_VENV.name}/)",
          flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", ".[test]",
                    f"pydantic-ai-slim[openai,anthropic,mcp]=={version}"], cwd=ROOT, check=True)
    # Faults and bench scripts are pydantic-ai's business in no release: the first pass ran them (pyproject.toml).
    print("== leaving out the tests marked pydantic_ai_independent (worker kills, server restarts, bench scripts)",
          flush=True)
    return subprocess.run([str(python), "-m", "pytest", "-m", "not pydantic_ai_independent", *argv],
                          cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
