"""Loading the bundled apps at the moment a command needs them, with an error that says what to do without them.

The runtime never imports `durable_codemode.apps` at import time: a library user's worker, client or replayer
works with the apps absent (a trimmed install, a vendored copy of the runtime). Only the demo, `codemode bench`
and the bundled worker (`codemode dev`/`worker`, `python worker.py`) import them, inside `bundled_apps()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .shared._errors import CodeModeUserError

__all__ = ["APPS_PACKAGE", "bundled_apps"]

APPS_PACKAGE = "durable_codemode.apps"
"""Where the bundled apps are installed: `workflows/` and `activities/` of the repository, under our name."""


@contextmanager
def bundled_apps(command: str) -> Iterator[None]:
    """Import the bundled apps inside this block; if they are not installed, say so for `command`.

    Raises:
        CodeModeUserError: a module of `durable_codemode.apps` is missing (other import errors pass through).

    """
    try:
        yield
    except ModuleNotFoundError as e:
        if e.name is None or not (e.name == APPS_PACKAGE or e.name.startswith(f"{APPS_PACKAGE}.")):
            raise
        raise CodeModeUserError(
            f"{command} needs the bundled apps, and this installation has none ({e.name} is missing): install the "
            "durable-codemode wheel as published (`pip install durable-codemode`) or run from a checkout of its "
            "repository. Your own agents do not need them: serve them with create_worker(client, [agent])"
        ) from e
