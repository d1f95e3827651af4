"""The tests' forked commands (`tests/_forked.py`) behave as `codemode` and `python SCRIPT` started afresh.

Most tests that run a command fork it from a process that imported the package once. That is only as good as
the two assumptions it rests on, held here: a forked command prints and exits exactly as a fresh interpreter
running it does, and nothing in the package reads the environment while it is imported (a child's environment
is set after the import, so a value read then would be the fork server's, not the one the test gave).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from ._forked import run_codemode, run_script
from .test_demo import _cli, _cli_env

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "durable_codemode"


def _fresh(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run(_cli(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("args", [
    ["runs"],                                       # no server at the address: a usage error (2) on stderr
    ["keygen", "ana", "-o", "ana.json"],            # a file in the working directory, stdout and stderr, exit 0
])
async def test_a_forked_command_prints_and_exits_as_a_fresh_one(args: list[str], tmp_path: Path) -> None:
    env = _cli_env(TEMPORAL_ADDRESS="127.0.0.1:1", COLUMNS="100")
    (tmp_path / "fresh").mkdir()
    (tmp_path / "forked").mkdir()
    fresh = _fresh(args, env, tmp_path / "fresh")
    forked = await run_codemode(args, env=env, cwd=tmp_path / "forked")
    if args[0] == "keygen":  # a random key: compare what was printed with its id and public key taken out
        assert (tmp_path / "fresh" / "ana.json").is_file() and (tmp_path / "forked" / "ana.json").is_file()
        fresh, forked = _without_key(fresh), _without_key(forked)
    assert forked == fresh


def _without_key(result: tuple[int, str, str]) -> tuple[int, str, str]:
    code, out, err = result
    return (code, *(re.sub(r'ana-[0-9a-f]{8}|"public_key": "[^"]+"', "KEY", text) for text in (out, err)))


def test_a_forked_script_gets_its_arguments_streams_and_exit_status(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import os, sys\n"
        "print(sys.argv[1:], __name__, os.environ['GIVEN'], os.getcwd() == sys.argv[1])\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(int(sys.argv[2]))\n")
    code, out, err = run_script(script, [str(tmp_path), "3"], env={"GIVEN": "yes"}, cwd=tmp_path)
    assert (code, out, err) == (3, f"{[str(tmp_path), '3']} __main__ yes True\n", "to stderr\n")
    script.write_text("raise ValueError('boom')\n")
    code, out, err = run_script(script, [], cwd=tmp_path)
    assert code == 1 and "ValueError: boom" in err


def _reads_environment(node: ast.AST) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and inner.attr in ("environ", "getenv", "environb"):
            return True
        if isinstance(inner, ast.Name) and inner.id in ("environ", "getenv"):
            return True
    return False


def _import_time_nodes(tree: ast.Module) -> list[ast.AST]:
    """What runs when a module is imported.

    Its statements outside function bodies, and every default value, decorator and class body (whose own
    methods' bodies run later).
    """
    found: list[ast.AST] = []

    def visit(body: list[ast.stmt]) -> None:
        for statement in body:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                found.extend([*statement.decorator_list, *statement.args.defaults,
                              *(d for d in statement.args.kw_defaults if d is not None)])
            elif isinstance(statement, ast.ClassDef):
                found.extend([*statement.decorator_list, *statement.bases, *statement.keywords])
                visit(statement.body)
            elif isinstance(statement, ast.If | ast.Try | ast.With):
                found.extend(ast.iter_child_nodes(statement))
            else:
                found.append(statement)

    visit(tree.body)
    return found


def test_no_module_reads_the_environment_when_imported() -> None:
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _import_time_nodes(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _reads_environment(node):
                readers.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}")
    assert readers == [], ("read the environment when the command runs, not when its module is imported (a forked "
                           f"command would see the fork server's): {readers}")


def test_the_check_above_sees_an_import_time_read() -> None:
    tree = ast.parse("import os\nLEVEL = os.environ.get('X')\n"
                     "def later(given=os.getenv('Z')):\n    return os.environ['Y']\n")
    nodes = _import_time_nodes(tree)
    assert [_reads_environment(n) for n in nodes] == [False, True, True]  # the import, LEVEL, the default
    assert not any(isinstance(n, ast.Return) for n in nodes)  # the function's body runs later

