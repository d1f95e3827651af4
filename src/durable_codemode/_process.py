"""Ending a process that used a Temporal client, without the abort a short script can hit at interpreter exit.

A short script whose last act is a Temporal call (`start_run`, `run_agent`, a dev server's shutdown) can die at
interpreter exit with `Fatal Python error: PyGILState_Release: thread state ... must be current when releasing`
and exit status 134 (SIGABRT), after it did everything right. It is temporalio's core runtime: its Rust threads
outlive the event loop and still reach for the interpreter while it finalizes (temporalio/sdk-python issue 300,
open). Measured here: 3 of 8 runs of a script that starts a run and returns aborted so; the `codemode` command line,
which leaves through `exit_process`, never did.

The way out that works is not to finalize the interpreter: run what it would run at exit (the `atexit` functions:
the Monty pool's shutdown, logging's flush, an OpenTelemetry exporter's last batch), flush stdout and stderr, then
`os._exit`. `run_script` is that around `asyncio.run`, for scripts; the command line and `worker.py` use
`exit_process` directly.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
import traceback
from collections.abc import Coroutine
from typing import Any, NoReturn

__all__ = ["exit_process", "run_script"]


def exit_process(code: int) -> NoReturn:
    """Run the interpreter's exit functions, flush, and leave with `os._exit(code)` (see the module docstring).

    Everything registered with `atexit` runs first, once, in the interpreter's own order (the Monty pool stops,
    log handlers and span exporters flush); only the interpreter's finalization, where the abort happens, is
    skipped. Non-daemon threads are not joined: stop them before calling this.
    """
    try:
        atexit._run_exitfuncs()  # what a normal exit would run; os._exit skips it
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to tell it
                stream.flush()
        os._exit(code)


def run_script(main: Coroutine[Any, Any, object]) -> NoReturn:
    """`asyncio.run(main)`, then leave the process as `codemode` does: no abort at interpreter exit.

    Use it in place of `asyncio.run(main())` as a script's last line::

        from durable_codemode import run_script

        async def main() -> None:
            ...  # start runs, wait for them

        if __name__ == "__main__":
            run_script(main())

    The exit status: `main`'s return value when it is an `int` (0 otherwise); a `SystemExit` inside gives its
    code; Ctrl-C gives 130; an exception prints its traceback, as Python would, and gives 1. It never returns, so
    it is for a script's end, not for code that goes on after (a notebook, a test, a server's request).
    """
    code: int
    try:
        returned = asyncio.run(main)
        code = returned if isinstance(returned, int) and not isinstance(returned, bool) else 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # sys.exit("message"): Python prints it and exits 1
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_process(code)
