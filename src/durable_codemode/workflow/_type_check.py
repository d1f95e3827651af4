"""Which of the type checker's diagnostics reject a snippet, and what a replay says of a rejection it cannot see.

This module runs in workflow code.
"""

from __future__ import annotations

from pydantic_monty import MontyTypingError

__all__ = ["RECORDED_REJECTION", "real_type_errors"]

_REBINDING = "error[invalid-assignment]"
_UNKNOWN_NAME = "error[unresolved-reference]"


def real_type_errors(error: MontyTypingError, *, lenient_names: bool) -> str:
    """The diagnostics of a rejected snippet worth rejecting it for (one per line in the concise format).

    Monty types a REPL's variables by their first value (`x = 1` declares `Literal[1]` for later snippets), so
    rebinding one in a later snippet (`x += 1`, `x = 'done'`) is reported as an invalid assignment. That is
    ordinary REPL use, so those diagnostics are dropped, and such a snippet runs unchecked. An unchecked snippet
    does not join the checker's context, so once one has run, the names it defined look unknown to the checker
    (`lenient_names`): unknown names are then left to the runtime's `NameError`. Everything else (missing
    `await`, wrong tool arguments) still rejects the snippet before it runs.
    """
    dropped = (_REBINDING, _UNKNOWN_NAME) if lenient_names else (_REBINDING,)
    return "\n".join(line for line in error.display().splitlines() if not any(d in line for d in dropped)).strip()


RECORDED_REJECTION = ("The code was not run: type error (recorded when this run first checked it).\nFix the code "
                      "and call run_code again.")
"""A rejected snippet's content when a replay's check, with less context than live, found nothing to reject."""
