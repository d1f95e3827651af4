"""The `codemode` command line: the offline demo, a dev server with a worker, a worker, and starting runs.

```
codemode demo [--lines 122]                      the cart agent end to end, offline, on an in-memory server
codemode dev [--db FILE] [--port 7233] [--ui]    a persistent dev server plus a worker, until Ctrl-C
codemode worker [--task-queue Q]                 a worker for the bundled agents (TEMPORAL_ADDRESS/embedded)
    worker: [--deployment NAME --build-id ID]    ... as a Worker Deployment version (runs pinned to it)
    dev, worker: [--approver-keys FILE]... [--approver-directory FILE]   signed approvals (or the env vars
                 CODEMODE_APPROVER_KEYS, CODEMODE_APPROVER_DIRECTORY)
codemode run AGENT "prompt" [--model M] [--json] start a run on TEMPORAL_ADDRESS and print its result
codemode run AGENT "prompt" --follow              ... showing model turns and nested calls as they happen
codemode watch RUN_ID                            follow a run live until it ends or waits for approval
codemode runs [--agent A] [--status S] [--version NAME:BUILD_ID]   recent runs: state, version, ...
codemode history RUN_ID [-o FILE] [--chain]      export a run's history as JSON (encrypted runs: --decrypt)
codemode trace RUN_ID | --history FILE [--json]  the run as a tree: turns, snippets, calls, approvals
codemode replay RUN_ID | --history FILE | --all  replay offline; on a divergence, where and why (exit 1)
codemode check-deploy --worker MODULE [--query Q] before a deploy: what the new code breaks in open runs (exit 1)
codemode move RUN_ID --to NAME:BUILD_ID --worker MODULE   pin a run to another worker deployment version
codemode approvals RUN_ID / approve / deny / audit / keygen    approvals: list, decide, the trail, a signing key
codemode keygen --encryption -o FILE             a payload encryption key (CODEMODE_ENCRYPTION_KEYS=FILE)
codemode codec-server [--origin URL]...          decrypt encrypted runs for the Temporal UI and CLI
codemode bench [--apps A] [--n 5,20] [--mode on,off] [--model M] [--json F] [--plot F.png]
                                                 code mode vs tool calling on the bundled tasks, graded
```

Exit codes: 0 done; 1 the run failed (or the demo's end state is wrong); 2 the command was used wrongly or the
server cannot be reached (also: `replay` of a run that needs `--worker MODULE`, a decision sent to a closed run);
3 (`watch`, `run --follow`) the run waits for approval; 130 interrupted.

What the commands print (all but `bench`'s tables and a bug's traceback) passes through `_results.printable`:
names, notes, call ids, program source, arguments and results that came from a run or from whoever can reach the
server cannot drive the terminal.

`main()` leaves through `exit_process` (`durable_codemode._process`): a short script whose last act is a Temporal
call can abort at interpreter exit (`PyGILState_Release`, exit 134), which would turn a clean run into a crash
report. It runs the `atexit` functions (the Monty pool's shutdown among them), flushes, then `os._exit`s; servers
and workers are stopped before that. Scripts get the same from `durable_codemode.run_script`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import Coroutine, Sequence
from typing import Any, NoReturn

from .._outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, EXIT_WAITING
from .._process import exit_process
from ..shared._errors import CodeModeUserError
from ._output import err
from ._parser import Command, build_parser
from ._serving import DEV_SERVER_DB, serve_bundled_agents

__all__ = [
    "DEV_SERVER_DB",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_WAITING",
    "exit_process",
    "main",
    "run_cli",
    "run_command",
    "serve_bundled_agents",
]


def run_command(command: Coroutine[Any, Any, int]) -> int:
    """Run `command` on a fresh event loop and return its exit code, turning known errors into one line.

    `CodeModeUserError` (bad configuration, no server at the address) is printed and gives `EXIT_USAGE`;
    Ctrl-C before a command has set up its own handling gives `EXIT_INTERRUPTED`; a closed stdout pipe
    gives `EXIT_FAILED` without a traceback; anything else is a bug: its traceback, then `EXIT_FAILED`.
    """
    try:
        return asyncio.run(command)
    except CodeModeUserError as e:
        err(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`codemode run ... | head`): nothing is left to tell it, and the final flush
        # must not fail again, so stdout goes to /dev/null from here on.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception:
        # A bug, not a usage error: show where, but still leave through exit_process (no abort at exit).
        traceback.print_exc()
        err("unexpected error (the traceback above); please report it with the command you ran")
        return EXIT_FAILED


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code; unlike `main()`, safe to call from Python (and tests)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already explained by argparse)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    handler: Command = args.handler
    return run_command(handler(args))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The `codemode` entry point: run the command, then `exit_process` with its exit code."""
    exit_process(run_cli(argv))
