"""Serve the bundled agents: `python worker.py`.

With `TEMPORAL_ADDRESS` set, the worker connects there; otherwise it starts an embedded Temporal dev server
persisted to `~/.local/share/durable-codemode/dev-server.sqlite` and prints its address. Ctrl-C stops it.
`CODEMODE_APPROVER_KEYS` and `CODEMODE_APPROVER_DIRECTORY` name the approvers' public keys and groups
(docs/approvals.md#signed-approvals-from-the-command-line).
This is `codemode worker`: both call `durable_codemode.cli.serve_bundled_agents`, so there is one
implementation.
"""

from __future__ import annotations

from durable_codemode.cli import exit_process, run_command, serve_bundled_agents


async def main() -> int:
    return await serve_bundled_agents()


if __name__ == "__main__":
    # `run_command` is `asyncio.run` plus one-line errors; `exit_process` flushes and leaves with `os._exit`,
    # which avoids the abort a Temporal client can cause at interpreter exit.
    exit_process(run_command(main()))
