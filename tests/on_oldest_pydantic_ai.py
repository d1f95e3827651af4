"""Run the tests that depend on pydantic-ai's release again, on the oldest release durable-codemode supports.

`python -m tests.on_oldest_pydantic_ai` (the README's test command runs it after the suite, which ran on the newest
release pip resolves). The oldest supported release is the lower bound of `pydantic-ai-slim` in `pyproject.toml`,
read from there so the two never disagree. It is installed in a second virtualenv, `.venv-oldest/`, and the tests
marked `pydantic_ai_release` run there with the same pytest options (which tests, and why those:
docs/development.md, "Two passes"). The exit status is pytest's.

The second virtualenv is made from the one running this script: copied, then pip moves pydantic-ai-slim (and
whatever pip resolves with it) to the oldest release. Everything else is the first pass's, as a fresh
`pip install -e '.[test]'` would resolve it; the copy takes ~25 s where a fresh install took ~95 s on 2 cores.
Run from a Python outside any virtualenv, it makes a fresh one instead. On later runs the virtualenv is updated.
"""

from __future__ import annotations

import re
import shutil
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


def copy_virtualenv(source: Path, target: Path) -> None:
    """Copy the virtualenv `source` to `target`, its scripts then starting `target`'s interpreter.

    A virtualenv finds its packages from where its interpreter link lies, so the copy is a virtualenv of its own;
    only the scripts' `#!` lines (and pyvenv.cfg's note of the command that made it) name the source's path.
    """
    shutil.copytree(source, target, symlinks=True)
    old, new = f"#!{source}/bin/", f"#!{target}/bin/"
    for script in (target / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        with script.open("rb") as f:
            if f.read(len(old)) != old.encode():
                continue
        script.write_bytes(script.read_bytes().replace(old.encode(), new.encode(), 1))
    config = target / "pyvenv.cfg"
    config.write_text(config.read_text(encoding="utf-8").replace(str(source), str(target)), encoding="utf-8")


def main(argv: list[str]) -> int:
    version = oldest_supported()
    python = OLDEST_VENV / "bin" / "python"
    if not python.exists():
        shutil.rmtree(OLDEST_VENV, ignore_errors=True)  # a copy cut short earlier
        if sys.prefix != sys.base_prefix:
            copy_virtualenv(Path(sys.prefix), OLDEST_VENV)
        else:
            venv.EnvBuilder(with_pip=True).create(OLDEST_VENV)
    print(f"== the tests marked pydantic_ai_release again, on pydantic-ai-slim {version}, the oldest supported "
          f"release ({OLDEST_VENV.name}/)", flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", ".[test]",
                    f"pydantic-ai-slim[openai,anthropic,mcp]=={version}"], cwd=ROOT, check=True)
    return subprocess.run([str(python), "-m", "pytest", "-m", "pydantic_ai_release", *argv], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
