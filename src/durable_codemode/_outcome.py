"""How a command ends: its exit code, and the one line that says why a run failed.

Shared by the `codemode` commands (`cli`) and `codemode bench` (`benchmark`), so neither imports the other.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "EXIT_WAITING", "run_failure_reason"]

EXIT_OK = 0
EXIT_FAILED = 1
"""The run failed, or the demo's cart is not in the state the prompt asked for."""
EXIT_USAGE = 2
"""Wrong arguments, bad configuration, or no server at the address (argparse uses 2 too)."""
EXIT_WAITING = 3
"""`watch` / `run --follow` stopped because the run waits for a person's decision (it goes on once decided)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C, by the shell's convention (128 + SIGINT)."""


def run_failure_reason(error: BaseException) -> str:
    """What went wrong, from the failure's causes: the worker's own words, not Temporal's wrappers.

    `WorkflowFailureError` → `ActivityError` → `ApplicationError` chains carry generic outer messages
    ("Workflow execution failed", "Activity task failed"); the application errors inside say what happened
    (for an unknown agent, the worker's "no agent named ..."), outermost first.
    """
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = getattr(current, "cause", None) or current.__cause__
    told = [e.message for e in chain if isinstance(e, ApplicationError) and e.message]
    if not told:
        told = [str(chain[-1]) or type(chain[-1]).__name__]
    unique: list[str] = []
    for message in (m.strip().rstrip(".") for m in told):
        if not any(message in said for said in unique):  # a cause the outer message already quotes says nothing new
            unique.append(message)
    return ": ".join(unique)
