"""The one contract for what a snippet gives back to the model, and previews for summaries.

The model gets a JSON object: `result` (the last expression's value) and `printed` (what the program printed),
each present only when there is one, so a program with neither gives `{}`. The whole object is bounded: past
the limit, the printed text is cut first, then the result is replaced by the start of its JSON, with a note
that tells the model how much was cut and what to do about it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic_core import to_jsonable_python

__all__ = ["PREVIEW_CHARS", "SUMMARY_ARGS_CHARS", "answer_text", "bounded_result", "call_arguments", "call_summary",
           "clip", "code_lines", "jsonable", "one_line", "preview", "printable"]


def jsonable(value: Any) -> Any:
    """`value` as JSON-compatible data; what JSON cannot hold (sandbox class proxies, ...) becomes its repr.

    Never raises: a program's last value is anything it built (bytes that are not UTF-8, a structure nested past
    the serializer's depth), and an exception here, in workflow code, would fail the workflow task forever.
    """
    try:
        return to_jsonable_python(value, fallback=repr, serialize_unknown=True)
    except (ValueError, TypeError, RecursionError):  # UnicodeDecodeError is a ValueError
        return _jsonable_walk(value, depth=0)


def _jsonable_walk(value: Any, depth: int) -> Any:
    if depth > 100:
        return "…(nested deeper than 100 levels)"
    if isinstance(value, dict):
        return {str(k): _jsonable_walk(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable_walk(v, depth + 1) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return repr(bytes(value))
    try:
        return to_jsonable_python(value, fallback=repr, serialize_unknown=True)
    except (ValueError, TypeError, RecursionError):
        return repr(value)


def _size(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False, default=repr).encode())


def _cut(text: str, max_bytes: int) -> str:
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[: max(0, max_bytes)].decode(errors="ignore")


def bounded_result(value: Any, printed: str, *, max_bytes: int) -> dict[str, Any]:
    """The model's view of a completed snippet, at most about `max_bytes` of JSON."""
    out: dict[str, Any] = {}
    if value is not None:
        out["result"] = jsonable(value)
    if printed:
        out["printed"] = printed
    total = _size(out)
    if total <= max_bytes:
        return out
    notes: list[str] = []
    if printed:
        others = _size({k: v for k, v in out.items() if k != "printed"})
        keep = max(max_bytes // 4, max_bytes - others - 200)
        if keep < len(printed.encode()):
            out["printed"] = _cut(printed, keep)
            notes.append(f"printed text cut to its first {keep:,} bytes")
    if _size(out) > max_bytes and "result" in out:
        text = json.dumps(out["result"], ensure_ascii=False, default=repr)
        room = max(256, max_bytes - _size({k: v for k, v in out.items() if k != "result"}) - 300)
        del out["result"]
        out["result_truncated"] = _cut(text, room)
        notes.append(f"the result is {len(text.encode()):,} bytes of JSON; only its first {room:,} are shown")
    out["note"] = (
        f"Output over the {max_bytes:,}-byte limit: " + "; ".join(notes)
        + ". Return less: filter, aggregate or slice in the program, and return counts, ids or a summary."
    )
    return out


def answer_text(output: Any) -> str:
    """A run's output as its reader sees it: the text itself, or a structured output as one line of JSON."""
    return output if isinstance(output, str) else json.dumps(jsonable(output), ensure_ascii=False)


PREVIEW_CHARS = 200
"""How long a preview is by default (a call record's arguments and result)."""


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A one-line preview of `value` for summaries and trees."""
    return clip(one_line(value), limit)


def one_line(value: Any) -> str:
    """`value` as one line of text (JSON unless it is a string), whole: `clip` it to a preview's length."""
    if type(value) is int:  # its JSON, without the serializers: a call record's preview of most tools' results
        return int.__repr__(value)
    if value is None:
        return "null"
    text = value if isinstance(value, str) else json.dumps(jsonable(value), ensure_ascii=False, default=repr)
    return " ".join(text.split())


def call_arguments(arguments: dict[str, Any], limit: int = PREVIEW_CHARS) -> str:
    """A call's arguments as the call would be written, `i=3, name="x"`, at most `limit` characters.

    The one argument format of every view of a call: the watchers, the traces, the live events.
    """
    text = ", ".join(f"{k}={json.dumps(jsonable(v), ensure_ascii=False, default=repr)}" for k, v in arguments.items())
    return clip(" ".join(text.split()), limit)


SUMMARY_ARGS_CHARS = 120
"""How many characters of a call's arguments its Temporal UI summary shows (`call_summary`), the "…" included."""


def call_summary(tool: str, arguments: dict[str, Any], limit: int = SUMMARY_ARGS_CHARS) -> str:
    """A call as the Temporal UI shows it (its activity's summary): `get(i=3, name="x")`, escaped, a cut marked.

    The arguments are a program's (untrusted), and the UI shows a summary as it is, bidirectional overrides and
    all: so it is escaped as the terminal's text is (`printable`), in the one argument format (`call_arguments`),
    and an "…" ends arguments cut at `limit` characters, so a cut summary never looks whole.
    """
    return printable(f"{tool}({call_arguments(arguments, limit)})")


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, an ellipsis last if it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


_LINE_END = re.compile(r"\r\n|\r|\n")


def code_lines(code: str) -> list[str]:
    """A program's lines as its line numbers count them (Python's line ends: CRLF, CR, LF).

    Not `str.splitlines()`, which also breaks at form feeds, file separators and U+2028: a program holding one
    would be drawn with its lines numbered past the line a call or an error names.
    """
    return _LINE_END.split(code)


_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What a terminal may act on instead of showing: C0 controls (ESC starts a cursor or erase sequence, CR returns
to the start of the line, BEL rings), DEL, C1 controls (0x9b is a one-byte CSI), the line and paragraph
separators, and the bidirectional overrides that reorder what is shown (Trojan Source)."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _escape_json(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def printable(text: str, *, lines: bool = False, json: bool = False) -> str:
    r"""`text` as a person may read it in a terminal: every character a terminal would act on is escaped.

    The one place untrusted text (approver names, notes, call ids, a program's source, arguments, tool results,
    failure messages) passes on its way to a screen, so none of it can move the cursor, erase a line, recolour
    the screen or start a new line that looks like the command's own (a forged "approved by bob" entry).
    Control characters become `\x1b`, `\n`, `\r`, `\t`; separators and bidirectional overrides
    `\u202e`. Backslashes are left alone, so escaping twice changes nothing.

    Args:
        text: Any text.
        lines: Keep `\n` as a line break: for text whose lines are the command's own (a rendered tree, a
            model's multi-line answer). Untrusted single values must not use it: their newlines are escaped.
        json: `text` is a JSON document: escape as `\u001b`, valid inside a JSON string, and keep the
            document's line breaks (an encoder has escaped those inside strings already), so the output is
            still JSON with the same value.

    """
    if json:
        return "\n".join(_UNSAFE.sub(_escape_json, line) for line in text.split("\n"))
    if lines:
        return "\n".join(_UNSAFE.sub(_escape, line) for line in text.split("\n"))
    return _UNSAFE.sub(_escape, text)
