"""`codemode ARGS` and `python SCRIPT ARGS` as real child processes, forked from one that has already imported them.

Importing `durable_codemode.cli` (pydantic-ai, temporalio, the apps) costs ~3 s of CPU, and the suite runs the
command ~90 times and the bench scripts a dozen times: measured, started afresh they took ~340 s of CPU, the largest
single cost of the suite (~900 s in all on 2 cores); forked, 27 s. So the tests that run a command or a script do it
the way a fork server does (`multiprocessing`'s "forkserver" start method): one process imports them once
(`tests/_forked_preload.py`) and forks a child for each run. Each child is still its own process, with its own
arguments, environment, working directory, standard streams (stdin empty, stdout and stderr captured) and exit
status, and a command leaves the way `codemode` does (`main()`, `exit_process`, `os._exit`): what it prints and how
it exits are its own.

What a fork skips is the interpreter's start and the import, so the tests about those still start a fresh
interpreter: the console script of an installed wheel (`test_packaging`), `python -m durable_codemode.cli` from an
empty directory (`test_demo`), a script's exit (`test_scripts_exit`), and the long-running `codemode dev`/`worker`
(`test_signed_cli`). A command reads its environment when it runs, not when it is imported
(`test_forked.py::test_no_module_reads_the_environment_when_imported` holds the package to that), so a child's
environment is the one given.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path

__all__ = ["ForkedProcess", "run_codemode", "run_script", "start_module"]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["tests._forked_preload"])


def _become(env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """In the forked child: take this environment, directory and these streams, as a fresh process would have.

    `out` and `err` may be one file (a worker's log): both streams then share one descriptor, as `2>&1` does.
    """
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    target = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(target, 1)
    if err != out:
        os.close(target)
        target = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(target, 2)
    os.close(target)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # Streams as the interpreter opened them on files at its start (its encoding and error handlers), stdout
    # block-buffered and stderr line-buffered.
    first_out, first_err = sys.__stdout__, sys.__stderr__
    assert first_out is not None and first_err is not None
    sys.stdout = open(1, "w", encoding=first_out.encoding, errors=first_out.errors, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding=first_err.encoding, errors=first_err.errors, closefd=False,  # noqa: SIM115
                      buffering=1)


def _command(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The forked child of `run_codemode`: `codemode ARGV`, leaving through `exit_process` as the command does."""
    _become(env, cwd, out, err)
    sys.argv = ["codemode", *argv]
    from durable_codemode.cli import main

    main(argv)


def _script(path: str, argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The forked child of `run_script`: `python PATH ARGV`, with the script's folder first on `sys.path`."""
    _become(env, cwd, out, err)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")
    # Returning exits 0 after flushing the streams, as an interpreter does at the end of a script; an exception
    # prints its traceback and exits 1; `sys.exit(n)` exits n (multiprocessing's process bootstrap does each).


def _module(module: str, argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The forked child of `start_module`: `python -m MODULE ARGV` in a session (and process group) of its own."""
    os.setsid()  # as `start_new_session=True`: killing its group reaches every process it starts (its sandboxes)
    _become(env, cwd, out, err)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _run(target: object, args: tuple[object, ...], what: str, *, env: Mapping[str, str],
         cwd: Path | str | None, timeout: float) -> tuple[int, str, str]:
    with tempfile.TemporaryDirectory(prefix="codemode-forked-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        process = _CONTEXT.Process(target=target, args=(*args, dict(env), str(cwd or os.getcwd()), out, err),
                                   name=what[:40], daemon=True)
        process.start()
        try:
            process.join(timeout)
            code = process.exitcode
            if code is None:
                raise AssertionError(f"`{what}` still ran after {timeout:.0f} s; its stderr:\n"
                                     f"{Path(err).read_text(errors='replace')[-3000:]}")
        finally:
            if process.exitcode is None:
                process.kill()
                process.join(10)
            with contextlib.suppress(ValueError):
                process.close()
        # Negative when a signal ended it, as `asyncio`'s `returncode` is; decoded strictly, as the tests did.
        return code, Path(out).read_bytes().decode(), Path(err).read_bytes().decode()


async def run_codemode(args: Sequence[str], *, env: Mapping[str, str], cwd: Path | str | None = None,
                       timeout: float = 120) -> tuple[int, str, str]:
    """Run `codemode ARGS` in a child process; its exit status, stdout and stderr.

    Asynchronous, because the worker serving the runs a command reads often lives on the caller's event loop.
    A command still running after `timeout` seconds is killed and fails the test, naming it.
    """
    return await asyncio.to_thread(_run, _command, (list(args),), f"codemode {' '.join(args)}", env=env, cwd=cwd,
                                   timeout=timeout)


def run_script(path: Path | str, args: Sequence[str], *, env: Mapping[str, str] | None = None,
               cwd: Path | str | None = None, timeout: float = 120) -> tuple[int, str, str]:
    """Run `python PATH ARGS` in a child process and wait for it; its exit status, stdout and stderr."""
    return _run(_script, (str(path), list(args)), f"python {path} {' '.join(args)}",
                env=os.environ if env is None else env, cwd=cwd, timeout=timeout)


class ForkedProcess:
    """A long-running child forked by `start_module`, with the part of `subprocess.Popen`'s API the tests use.

    It is the fork server's child, not this process's: its exit status comes through multiprocessing's sentinel.
    """

    def __init__(self, process: BaseProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        pid = self._process.pid
        assert pid is not None
        return pid

    @property
    def returncode(self) -> int | None:
        """Its exit status once it ended (negative: the signal that ended it), else `None`."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"forked {self._process.name}", timeout or 0.0)
        return code


def start_module(module: str, args: Sequence[str], *, log: Path, cwd: Path | str,
                 env: Mapping[str, str] | None = None) -> ForkedProcess | subprocess.Popen[bytes]:
    """Start `python -m MODULE ARGS` as a child in its own session, stdout and stderr to `log`; returns at once.

    For the worker processes the crash tests kill and replace (`tests/_workers.py`): started afresh, each paid
    ~3.3 s of CPU to import before it polled, ~90 s of the suite's CPU; forked, the import is the fork server's,
    paid once. Stdin is empty: a worker waiting for a go-ahead waits for a file (`_ledger_worker --standby`).
    """
    environment = dict(os.environ if env is None else env)
    Path(log).touch()  # there at once, as a `Popen`'s redirected stdout is: a test may read it before the child runs
    if multiprocessing.current_process().daemon:
        # This process is itself forked (a bench script run by `run_script`), and multiprocessing lets a daemonic
        # process have no children of its own: start the worker afresh, as `python -m` would.
        with open(log, "wb") as out:
            return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=environment)
    process = _CONTEXT.Process(target=_module, args=(module, list(args), environment, str(cwd), str(log), str(log)),
                               name=f"{module} {' '.join(args)}"[:60], daemon=True)
    process.start()
    forked = ForkedProcess(process)
    # Return once the child leads its own session, as `Popen(start_new_session=True)` does (it forks, `setsid`s and
    # execs before returning): a `killpg` sent earlier would find no group, and the child would run on.
    while forked.poll() is None and _group_of(forked.pid) != forked.pid:
        time.sleep(0.001)
    return forked


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
