"""A run's files, answered in workflow code: each file call of a program is a pure function of this state.

Monty turns `pathlib.Path` methods and the `open` builtin into OS calls (`FunctionSnapshot.is_os_function`),
measured on pydantic-monty 1.4.0: `Path.read_text`/`read_bytes`/`write_text`/`write_bytes`/`exists`/`is_file`/
`is_dir`/`mkdir`/`iterdir`/`stat`/`unlink`/`rmdir`/`rename`/`resolve`/`absolute`, `Path.scan` (for `glob` and
`os.walk`), and `open` with a path and a mode, then `Path.read_text`/`read_bytes` (a read reads the whole file;
Monty serves `read(n)`, `readline()` and iteration from it) or `Path.append_text`/`append_bytes` (each
`write()`; `open` in mode `'w'` truncated first). Monty resolves relative paths against the working directory
(`/files`) and normalises `..` before the host sees them. Update modes (`'r+'`, `'w+'`, `'a+'`) and `'x'` are
refused by Monty itself (`ValueError`).

pydantic-monty's own `OSAccess` is not used: its `stat` reads the host clock, it has no size limit or read-only
part, and its state is a tree of file objects rather than data a continue-as-new can carry. Here the state is
two plain collections; nothing reads a clock (`stat` reports mtime 0) or the host's disk.
"""

from __future__ import annotations

import posixpath
from pathlib import PurePosixPath
from typing import Any

from pydantic_monty import MontyFileHandle, StatResult

from ..shared._files import FILES_ROOT, CarriedFiles, FilesSpec, decode_contents, encode_contents

__all__ = ["FILE_FUNCTIONS", "RunFilesystem"]

FILE_FUNCTIONS = frozenset({
    "Path.exists", "Path.is_file", "Path.is_dir", "Path.is_symlink", "open", "Path.read_text", "Path.read_bytes",
    "Path.write_text", "Path.write_bytes", "Path.append_text", "Path.append_bytes", "Path.mkdir", "Path.unlink",
    "Path.rmdir", "Path.iterdir", "Path.scan", "Path.stat", "Path.rename", "Path.resolve", "Path.absolute",
})
"""The OS calls a run's files answer (every file function Monty 1.4.0 sends)."""

_WRITES = frozenset({"Path.write_text", "Path.write_bytes", "Path.append_text", "Path.append_bytes"})

Answer = dict[str, Any]
"""A Monty resume value: `{'return_value': v}` or `{'exc_type': 'OSError', 'message': m}`."""


class _Refused(Exception):
    """A file call the program gets an exception for."""

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(message)
        self.answer: Answer = {"exc_type": exc_type, "message": message}


def _ok(value: Any) -> Answer:
    return {"return_value": value}


class RunFilesystem:
    """The files of one run: written files and directories, plus the read-only seeded folder."""

    def __init__(self, spec: FilesSpec, carried: CarriedFiles | None = None) -> None:
        self.max_bytes = spec.max_bytes
        self.seed_root = spec.seed_root
        seeded = decode_contents(spec.seed)
        self._files: dict[str, bytes] = {**seeded, **(decode_contents(carried.files) if carried else {})}
        self._seeded = frozenset(seeded)
        self._dirs: set[str] = {FILES_ROOT, *(carried.dirs if carried else ())}
        if self.seed_root is not None:
            self._dirs.add(self.seed_root)
        for path in self._files:
            self._add_parents(path)
        self.version = 0
        """Counts changes, so a snippet can tell whether it changed the files."""

    # -- what the run shows and carries

    @property
    def size(self) -> int:
        """Bytes of content of every file, seeded ones included."""
        return sum(len(data) for data in self._files.values())

    def listing(self) -> dict[str, int]:
        """Every file, relative to `/files`, with its size in bytes, sorted by path."""
        return {path[len(FILES_ROOT) + 1:]: len(self._files[path]) for path in sorted(self._files)}

    def carry(self) -> CarriedFiles:
        """The written files and made directories, for the next run of the chain (seeded files are in the spec)."""
        written = {p: d for p, d in sorted(self._files.items()) if p not in self._seeded}
        seed_dirs = {d for d in self._dirs if self._read_only(d)}
        return CarriedFiles(files=encode_contents(written), dirs=sorted(self._dirs - seed_dirs - {FILES_ROOT}))

    # -- answering the program

    def answer(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Answer:
        """The answer to one file call `name(*args, **kwargs)`; an exception the program can catch if refused."""
        try:
            return self._answer(name, args, kwargs)
        except _Refused as refused:
            return refused.answer
        except Exception as e:  # an argument of a shape not foreseen: an error in the program, not a wedged task
            return {"exc_type": "OSError", "message": f"{name}: {type(e).__name__}: {e}"}

    def _answer(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Answer:
        if not args:
            raise _Refused("TypeError", f"{name}() got no path")
        path = self._inside(name, args[0])
        if name == "Path.exists":
            return _ok(path in self._files or path in self._dirs)
        if name == "Path.is_file":
            return _ok(path in self._files)
        if name == "Path.is_dir":
            return _ok(path in self._dirs)
        if name == "Path.is_symlink":
            return _ok(False)
        if name in ("Path.resolve", "Path.absolute"):
            return _ok(path)
        if name == "Path.stat":
            if path in self._files:
                return _ok(StatResult.file_stat(len(self._files[path]), 0o444 if self._read_only(path) else 0o644,
                                                mtime=0.0))
            if path in self._dirs:
                return _ok(StatResult.dir_stat(0o555 if self._read_only(path) else 0o755, mtime=0.0))
            raise self._missing(path)
        if name in ("Path.read_text", "Path.read_bytes"):
            data = self._file(path)
            if name == "Path.read_bytes":
                return _ok(data)
            try:
                return _ok(data.decode())
            except UnicodeDecodeError as e:
                raise _Refused("UnicodeDecodeError", f"{path!r} is not UTF-8 text ({e.reason} at byte {e.start}): "
                               "read it with Path.read_bytes(), or open it in mode 'rb'") from None
        if name == "open":
            return self._open(path, str(args[1]) if len(args) > 1 else "r")
        if name in _WRITES:
            data = args[1] if len(args) > 1 else b""
            raw = data.encode() if isinstance(data, str) else bytes(data)
            before = self._files.get(path, b"") if name.startswith("Path.append") else b""
            self._write(path, before + raw)
            return _ok(len(data))
        if name == "Path.mkdir":
            self._mkdir(path, parents=bool(kwargs.get("parents", False)), exist_ok=bool(kwargs.get("exist_ok", False)))
            return _ok(None)
        if name == "Path.unlink":
            self._file(path)
            self._writable(path)
            del self._files[path]
            self.version += 1
            return _ok(None)
        if name == "Path.rmdir":
            self._rmdir(path)
            return _ok(None)
        if name == "Path.iterdir":
            return _ok([PurePosixPath(p) for p in self._children(path)])
        if name == "Path.scan":
            return _ok(self._scan(path, kwargs.get("max_depth")))
        if name == "Path.rename":
            target = self._inside(name, args[1]) if len(args) > 1 else path
            self._rename(path, target)
            return _ok(None)
        raise _Refused("PermissionError", f"{name}: this file operation is not supported on a run's files")

    # -- checks

    def _inside(self, name: str, arg: Any) -> str:
        raw = arg.path if isinstance(arg, MontyFileHandle) else str(arg)
        path = posixpath.normpath(raw if raw.startswith("/") else posixpath.join(FILES_ROOT, raw))
        if path != FILES_ROOT and not path.startswith(FILES_ROOT + "/"):
            raise _Refused("PermissionError", f"{path!r} is outside this run's files ({name}): programs read and "
                           f"write files under {FILES_ROOT} only; use a relative path (it starts there) or "
                           f"{FILES_ROOT}/...")
        return path

    def _read_only(self, path: str) -> bool:
        root = self.seed_root
        return root is not None and (path == root or path.startswith(root + "/"))

    def _writable(self, path: str) -> None:
        if self._read_only(path):
            raise _Refused("PermissionError", f"{path!r} is read-only: {self.seed_root} holds the files the agent's "
                           f"author seeded the run with; write your own files elsewhere under {FILES_ROOT} "
                           f"(e.g. {FILES_ROOT}/out.txt)")

    @staticmethod
    def _missing(path: str) -> _Refused:
        return _Refused("FileNotFoundError", f"[Errno 2] No such file or directory: {path!r}")

    def _file(self, path: str) -> bytes:
        if path in self._dirs:
            raise _Refused("IsADirectoryError", f"[Errno 21] Is a directory: {path!r}")
        data = self._files.get(path)
        if data is None:
            raise self._missing(path)
        return data

    def _parent_exists(self, path: str) -> None:
        parent = posixpath.dirname(path)
        if parent in self._files:
            raise _Refused("NotADirectoryError", f"[Errno 20] Not a directory: {parent!r}")
        if parent not in self._dirs:
            raise _Refused("FileNotFoundError", f"[Errno 2] No such file or directory: {path!r} (its folder "
                           f"{parent!r} does not exist: Path({parent!r}).mkdir(parents=True) first)")

    # -- changes

    def _write(self, path: str, data: bytes) -> None:
        self._writable(path)
        if path in self._dirs:
            raise _Refused("IsADirectoryError", f"[Errno 21] Is a directory: {path!r}")
        self._parent_exists(path)
        total = self.size - len(self._files.get(path, b"")) + len(data)
        if total > self.max_bytes:
            raise _Refused("OSError", f"[Errno 28] No space left: writing {path!r} would bring this run's files to "
                           f"{total:,} bytes, over their {self.max_bytes:,}-byte limit (RunFiles.max_bytes); "
                           "delete files you no longer need (Path.unlink) or write less")
        self._files[path] = data
        self.version += 1

    def _open(self, path: str, mode: str) -> Answer:
        try:
            handle = MontyFileHandle(path, mode)
        except ValueError as e:
            raise _Refused("ValueError", f"open({path!r}, {mode!r}): {e}") from None
        action = handle.mode[0]
        if action == "r":
            self._file(path)
        elif action == "w" or path not in self._files:  # 'w' truncates, 'a' creates a missing file
            self._write(path, b"")
        else:
            self._writable(path)
        return _ok(handle)

    def _mkdir(self, path: str, *, parents: bool, exist_ok: bool) -> None:
        if path in self._files or (path in self._dirs and not exist_ok):
            raise _Refused("FileExistsError", f"[Errno 17] File exists: {path!r}")
        if path in self._dirs:
            return
        self._writable(path)
        if parents:
            parent = posixpath.dirname(path)
            if parent not in self._dirs:
                self._mkdir(parent, parents=True, exist_ok=True)
        else:
            self._parent_exists(path)
        self._dirs.add(path)
        self.version += 1

    def _rmdir(self, path: str) -> None:
        if path in self._files:
            raise _Refused("NotADirectoryError", f"[Errno 20] Not a directory: {path!r}")
        if path not in self._dirs:
            raise self._missing(path)
        self._writable(path)
        if path == FILES_ROOT:
            raise _Refused("PermissionError", f"{FILES_ROOT} is the root of this run's files and cannot be removed")
        if self._children(path):
            raise _Refused("OSError", f"[Errno 39] Directory not empty: {path!r}")
        self._dirs.discard(path)
        self.version += 1

    def _rename(self, path: str, target: str) -> None:
        self._writable(path)
        self._writable(target)
        if path in self._dirs:
            raise _Refused("PermissionError", f"rename of the folder {path!r}: only files can be renamed in a run's "
                           "files; make the new folder and move its files one by one")
        data = self._file(path)
        if target in self._dirs:
            raise _Refused("IsADirectoryError", f"[Errno 21] Is a directory: {target!r}")
        self._parent_exists(target)
        del self._files[path]
        self._files[target] = data
        self.version += 1

    def _add_parents(self, path: str) -> None:
        parent = posixpath.dirname(path)
        while parent.startswith(FILES_ROOT) and parent not in self._dirs:
            self._dirs.add(parent)
            parent = posixpath.dirname(parent)

    # -- listing

    def _children(self, path: str) -> list[str]:
        if path in self._files:
            raise _Refused("NotADirectoryError", f"[Errno 20] Not a directory: {path!r}")
        if path not in self._dirs:
            raise self._missing(path)
        prefix = path.rstrip("/") + "/"
        return sorted(p for p in (*self._files, *self._dirs) if p.startswith(prefix) and "/" not in p[len(prefix):])

    def _scan(self, path: str, max_depth: Any) -> list[tuple[str, bool, bool, bool]]:
        """`Path.scan` (glob, `os.walk`): the entry itself (`''`), then everything below to `max_depth` levels."""
        if path in self._files:
            return [("", False, True, False)]
        if path not in self._dirs:
            raise self._missing(path)
        entries: list[tuple[str, bool, bool, bool]] = [("", True, False, False)]
        prefix = path.rstrip("/") + "/"
        for p in sorted(p for p in (*self._files, *self._dirs) if p.startswith(prefix)):
            relative = p[len(prefix):]
            if isinstance(max_depth, int) and relative.count("/") + 1 > max_depth:
                continue
            entries.append((relative, p in self._dirs, p in self._files, False))
        return entries
