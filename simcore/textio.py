"""Reading a user's text files (workloads, traces, configs) with one-line errors.

Every reader of a file a user hands us goes through here, so that a missing file, a
directory, an unreadable file, non-UTF-8 bytes or a truncated JSON line all come back as
one line naming `file[:line]`, never as a traceback.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator


def read_text(path: str | Path, error: type[Exception], what: str = "file") -> str:
    """The file's text, decoded as UTF-8; any problem raises `error` with one line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x})") from None


def lines(path: str | Path, error: type[Exception], what: str = "file") -> Iterator[tuple[int, str]]:
    """(line number, line) for each non-blank line of a UTF-8 text file."""
    for lineno, line in enumerate(read_text(path, error, what).split("\n"), 1):
        if line.strip():
            yield lineno, line


def write_text_atomic(path: str | Path, text: str, error: type[Exception]) -> None:
    """Write via a temporary file and a rename, so a crash never leaves half a file; a
    read-only or missing folder raises `error` with one line."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise error(f"{path}: cannot write ({e.strerror or e})") from None


def json_problem(e: json.JSONDecodeError) -> str:
    """json's message as one phrase: 'Unterminated string starting at column 9' (json's own
    messages end in ' at' where its position would follow)."""
    msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg
    return f"malformed or truncated JSON ({msg} at column {e.colno})"
