"""The wheel as a user installs it: only our name at the top level, the demo from anywhere, the apps optional.

The wheel is built from this checkout and installed with `--no-deps` into a fresh virtual environment whose
dependencies come from the test environment's site-packages (added as a plain path, so that environment's
editable install of this checkout is not seen): what is imported as `durable_codemode` is the wheel's copy.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("test_packaging")  # one wheel and venv built for the module, in one test process

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class InstalledWheel:
    """A fresh virtual environment with the wheel installed in it."""

    wheel: Path
    python: Path
    site_packages: Path

    def run(self, *args: str, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the environment's Python (or, with args[0] == 'codemode', its console script) in `cwd`."""
        command = ([str(self.python.parent / "codemode"), *args[1:]] if args[0] == "codemode"
                   else [str(self.python), *args])
        # Its own process group: on a timeout the dev server the demo started goes too, not only the demo.
        proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**_clean_env(), **(env or {})}, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"{command} did not finish in {timeout} s:\n{out}\n{err}") from None
        return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _clean_env() -> dict[str, str]:
    # No server address, profile or payload store from the developer's shell: the demo starts its own server.
    drop = ("TEMPORAL_", "CODEMODE_", "PYTHONPATH", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstalledWheel]:
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp / "dist").glob("durable_codemode-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    # The dependencies: the test environment's packages, as a plain path (its .pth files are not run there).
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # The binaries of the dependencies (the Temporal CLI, Monty's sandbox process) sit next to the Python that runs
    # them, as an ordinary install puts them.
    for binary in ("temporal", "monty"):
        shutil.copy2(Path(sys.executable).parent / binary, venv / "bin" / binary)
    yield InstalledWheel(wheel=wheel, python=python, site_packages=site)


@pytest.mark.slow
def test_the_wheel_installs_no_top_level_name_but_ours(installed: InstalledWheel) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
    top = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"durable_codemode"}, top
    assert "durable_codemode/apps/workflows/cart.py" in names
    assert "durable_codemode/apps/activities/cart.py" in names
    found = installed.run("-c", "import durable_codemode; print(durable_codemode.__file__)", cwd=installed.wheel.parent)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(installed.site_packages), "the wheel's copy is what imports"


def test_codemode_demo_runs_from_an_empty_directory(installed: InstalledWheel, tmp_path: Path) -> None:
    done = installed.run("codemode", "demo", "--lines", "30", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "end state: correct" in done.stdout
    assert list(tmp_path.iterdir()) == [], "the demo leaves nothing in the directory it ran from"


def test_a_projects_own_workflows_package_is_its_own(installed: InstalledWheel, tmp_path: Path) -> None:
    """A Temporal project has `workflows/` and `activities/` of its own: next to ours, each is what it is."""
    for package in ("workflows", "activities"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"OWNER = 'the project: {package}'\n")
    check = textwrap.dedent("""
        import sys
        import workflows, activities
        from durable_codemode.apps.workflows import cart
        from durable_codemode.apps.activities.cart import CartStore
        assert workflows.OWNER == "the project: workflows", workflows.__file__
        assert activities.OWNER == "the project: activities", activities.__file__
        assert cart.__file__.startswith(sys.argv[1]) and cart.CartStore is CartStore, cart.__file__
        print("both")
    """)
    done = installed.run("-c", check, str(installed.site_packages), cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "both", done.stdout + done.stderr


def test_the_runtime_works_without_the_apps(installed: InstalledWheel, tmp_path: Path) -> None:
    """With the bundled apps removed, every runtime module imports, and the demo says what is missing."""
    trimmed = tmp_path / "trimmed"
    shutil.copytree(installed.site_packages / "durable_codemode", trimmed / "durable_codemode")
    for app in ("workflows", "activities"):
        shutil.rmtree(trimmed / "durable_codemode" / "apps" / app)
    check = textwrap.dedent("""
        import pkgutil, sys
        import durable_codemode
        assert durable_codemode.__file__.startswith(sys.argv[1]), durable_codemode.__file__
        for module in pkgutil.walk_packages(durable_codemode.__path__, "durable_codemode."):
            __import__(module.name)
        assert not any(name.startswith("durable_codemode.apps.") for name in sys.modules)
        from durable_codemode import CodeModeAgent, create_worker, start_run  # what a user of the library needs
        print("imported")
    """)
    env = {"PYTHONPATH": str(trimmed)}
    done = installed.run("-c", check, str(trimmed), cwd=tmp_path, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stdout + done.stderr
    demo = installed.run("codemode", "demo", cwd=tmp_path, env=env)
    assert demo.returncode == 2, demo.stdout + demo.stderr
    assert "codemode demo needs the bundled apps" in demo.stderr and "create_worker" in demo.stderr, demo.stderr
