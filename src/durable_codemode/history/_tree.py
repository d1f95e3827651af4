"""A run drawn as a plain-text tree: model turns, their `run_code` snippets, and each snippet's nested calls.

```
model turn 0
└─ run_code call_0  ok  (45 nested calls)
   │ import asyncio
   │ …
   │ = {"result": {"removed": 42, ...}}
   ├─ call_0.0  list_cart(offset=0)  ok  → {"items": [...]}
   ├─ … 38 more calls (list_cart ×1, remove_line ×37)
   └─ call_0.44  remove_line(line_id=120)  ok  → {"line_id": 120, "removed": true}
model turn 1
└─ answer: Removed 42 lines ...
```

Plain characters only (no colours, no terminal queries), so the same text works in a terminal, a log file and
a test assertion. A snippet can make hundreds of calls, so long call lists are collapsed to their first and
last few with a count per tool; failed calls are counted too, so collapsing never hides that something failed.
"""  # noqa: RUF002 - the multiplication sign in the example is what the tree prints

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence

from .._types import CallRecord, RunResult, SnippetRecord, TurnRecord

__all__ = ["render_tree"]

_MAX_CODE_LINES = 6
"""Lines of a snippet's code shown before `…`: enough to recognise it, not to read it."""

_COLLAPSE_OVER = 8
"""A snippet with more calls than this shows only the first `_HEAD` and last `_TAIL`."""

_HEAD = 5
_TAIL = 2

_TIMES = "\u00d7"
"""The multiplication sign of `remove_line \u00d737`, escaped so it cannot be mistaken for an `x` here."""

_BRANCH, _LAST = "├─ ", "└─ "
_PIPE, _SPACE = "│  ", "   "

_CALL_NUMBER = re.compile(r"\.(\d+)$")


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _args(preview: str) -> str:
    """`{"offset": 0}` → `offset=0`; a preview cut short (not valid JSON) is shown as it is, minus braces."""
    try:
        args = json.loads(preview)
    except ValueError:
        return preview.strip("{}")
    if not isinstance(args, dict):
        return preview
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())


def _call_line(call: CallRecord, room: int) -> str:
    """One call; its arguments are cut first so that the status still fits in `room` characters."""
    args = _args(call.args)
    fixed = len(call.call_id) + len(call.tool) + len(call.status) + 10
    limit = max(min(room // 3, room - fixed - 8), 6)
    if len(args) > limit:
        args = args[: limit - 1] + "…"
    marker = "→" if call.status == "ok" else "✗"
    return f"{call.call_id}  {call.tool}({args})  {call.status}  {marker} {_one_line(call.result)}"


def _call_order(call: CallRecord) -> int:
    # Calls are recorded as they finish; the tree shows them in the order the program made them.
    match = _CALL_NUMBER.search(call.call_id)
    return int(match.group(1)) if match else -1


def _collapsed(calls: Sequence[CallRecord]) -> str:
    by_tool = Counter(c.tool for c in calls)
    tools = ", ".join(f"{tool} {_TIMES}{n}" for tool, n in by_tool.items())
    not_ok = Counter(c.status for c in calls if c.status != "ok")
    note = "".join(f"; {n} {status}" for status, n in sorted(not_ok.items()))
    return f"… {len(calls)} more calls ({tools}{note})"


def _code_lines(code: str) -> list[str]:
    # Blank lines carry nothing in a six-line preview.
    lines = [line.rstrip() for line in code.expandtabs(4).splitlines() if line.strip()]
    if len(lines) > _MAX_CODE_LINES:
        return [*lines[:_MAX_CODE_LINES], "…"]
    return lines


class _Tree:
    def __init__(self, width: int) -> None:
        self.width = width
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(_fit(line, self.width))

    def snippet(self, snippet: SnippetRecord, indent: str, last: bool) -> None:
        n = len(snippet.calls)
        count = f"  ({n} nested call{'s' if n != 1 else ''})" if n else ""
        self.add(f"{indent}{_LAST if last else _BRANCH}run_code {snippet.call_id}  {snippet.outcome}{count}")
        inner = indent + (_SPACE if last else _PIPE)
        gutter = inner + ("│ " if n else "  ")
        for line in _code_lines(snippet.code):
            self.add(gutter + line)
        if snippet.result:
            self.add(f"{gutter}= {_one_line(snippet.result)}")
        calls = sorted(snippet.calls, key=_call_order)
        self.calls(calls, inner)

    def calls(self, calls: Sequence[CallRecord], indent: str) -> None:
        if len(calls) > _COLLAPSE_OVER:
            head, hidden, tail = calls[:_HEAD], calls[_HEAD:-_TAIL], calls[-_TAIL:]
        else:
            head, hidden, tail = list(calls), [], []
        room = self.width - len(indent) - len(_BRANCH)
        rows: list[str] = [_call_line(c, room) for c in head]
        if hidden:
            rows.append(_collapsed(hidden))
        rows += [_call_line(c, room) for c in tail]
        for i, row in enumerate(rows):
            self.add(indent + (_LAST if i == len(rows) - 1 else _BRANCH) + row)

    def turn(self, turn: TurnRecord, *, final: bool) -> None:
        self.add(f"model turn {turn.index}")
        children: list[str | SnippetRecord | CallRecord] = []
        acted = bool(turn.snippets or turn.direct_calls)
        if turn.text:
            children.append(f"{'answer' if final and not acted else 'text'}: {_one_line(turn.text)}")
        elif not acted:
            children.append("(no text and no tool call: the model was asked again)")
        children += turn.snippets
        children += turn.direct_calls
        for i, child in enumerate(children):
            last = i == len(children) - 1
            if isinstance(child, SnippetRecord):
                self.snippet(child, "", last)
            elif isinstance(child, CallRecord):
                room = self.width - len(_BRANCH) - len("tool call ")
                self.add(f"{_LAST if last else _BRANCH}tool call {_call_line(child, room)}")
            else:
                self.add(f"{_LAST if last else _BRANCH}{child}")


def render_tree(result: RunResult, *, width: int = 100) -> str:
    """The run as a tree of model turns, snippets (with the start of their code) and nested calls.

    Args:
        result: A finished run's result.
        width: Maximum characters per line; longer lines (previews, code) end in `…`. At least 20.

    """
    tree = _Tree(max(width, 20))
    for i, turn in enumerate(result.turns):
        tree.turn(turn, final=i == len(result.turns) - 1)
    if result.continued_as_new:
        runs = result.continued_as_new
        tree.add(f"(the run continued as new {runs} time{'s' if runs != 1 else ''})")
    return "\n".join(tree.lines)
