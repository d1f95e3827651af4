"""How the answers a workflow gave a program travel to the compute activity, which gives them again.

A program that goes past its in-workflow budget goes on in the compute activity from its last dump; the
suspensions it passed since that dump must be answered exactly as workflow code answered them (the program then
repeats itself, deterministically), so the answers are written into the activity's input. They are Monty resume
values: an awaited call's future, a value (a clock read's `datetime`, `os.urandom`'s bytes, a tool's JSON
result, a file call's path, file handle or stat result), an exception, the answers to a `FutureSnapshot` (by
Monty call id), or a name lookup's empty resume.
JSON has no `datetime`, `bytes`, `Ellipsis`, paths or integer keys, so each answer is tagged.
"""

from __future__ import annotations

import base64
import zlib
from datetime import date, datetime
from pathlib import PurePosixPath
from typing import Any

from pydantic_monty import MontyFileHandle, StatResult

__all__ = ["NAME_LOOKUP", "decode_answer", "decode_dump", "encode_answer", "encode_dump", "encoded_size"]

NAME_LOOKUP: Any = object()
"""The answer to a `NameLookupSnapshot`: `resume()` with no value (the program gets a `NameError`)."""

_TAG = "__codemode__"


def _encode_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return {_TAG: "datetime", "iso": value.isoformat()}
    if isinstance(value, date):
        return {_TAG: "date", "iso": value.isoformat()}
    if isinstance(value, bytes):
        return {_TAG: "bytes", "b64": base64.b64encode(value).decode()}
    if isinstance(value, PurePosixPath):
        return {_TAG: "path", "path": str(value)}
    if isinstance(value, MontyFileHandle):
        return {_TAG: "file_handle", "path": value.path, "mode": value.mode, "position": value.position}
    if isinstance(value, StatResult):
        return {_TAG: "stat", "fields": list(value)}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_encode_value(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {_TAG: "dict", "items": {k: _encode_value(v) for k, v in value.items()}}
        return {_TAG: "pairs", "items": [[_encode_value(k), _encode_value(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    if value is ... :
        return {_TAG: "ellipsis"}
    return value


def _decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(_TAG)
    if kind == "datetime":
        return datetime.fromisoformat(value["iso"])
    if kind == "date":
        return date.fromisoformat(value["iso"])
    if kind == "bytes":
        return base64.b64decode(value["b64"])
    if kind == "path":
        return PurePosixPath(value["path"])
    if kind == "file_handle":
        return MontyFileHandle(value["path"], value["mode"], position=value["position"])
    if kind == "stat":
        return StatResult(*value["fields"])
    if kind == "tuple":
        return tuple(_decode_value(v) for v in value["items"])
    if kind == "dict":
        return {k: _decode_value(v) for k, v in value["items"].items()}
    if kind == "pairs":
        return {_decode_value(k): _decode_value(v) for k, v in value["items"]}
    if kind == "ellipsis":
        return ...
    raise ValueError(f"not an encoded answer value: {value!r}")


def encode_answer(answer: Any) -> Any:
    """An answer to one suspension, as JSON-safe data; `decode_answer` gives it back exactly."""
    if answer is NAME_LOOKUP:
        return {_TAG: "name_lookup"}
    return _encode_value(answer)


def decode_answer(encoded: Any) -> Any:
    """The answer `encode_answer` wrote (`NAME_LOOKUP` for a name lookup's empty resume)."""
    if isinstance(encoded, dict) and encoded.get(_TAG) == "name_lookup":
        return NAME_LOOKUP
    return _decode_value(encoded)


_COMPRESSED = "z:"


def encode_dump(state: bytes | None) -> str | None:
    """A Monty dump as text for an activity's input or output: zlib (level 1), then base64 (JSON has no bytes).

    A program's data compresses well (200k small dicts: 28 MB of dump, 3.4 MB compressed, in 0.13 s), and every
    byte saved is one less to encode, record (or write to the payload store) and read back.
    """
    return None if state is None else _COMPRESSED + base64.b64encode(zlib.compress(state, 1)).decode()


def decode_dump(text: str | None) -> bytes | None:
    """The dump `encode_dump` wrote."""
    if text is None:
        return None
    if text.startswith(_COMPRESSED):
        return zlib.decompress(base64.b64decode(text[len(_COMPRESSED):]))
    return base64.b64decode(text)


def encoded_size(text: str | None) -> int:
    """Bytes the encoded dump takes in a payload (about)."""
    return 0 if text is None else len(text)
