"""`safe_text`: the one way candidate-provided text leaves the sandbox.

Exception messages, reasons, class and policy names come from code an LLM wrote. Before
they are printed, stored in a run or put into a prompt they go through `safe_text`, which
makes them one line of plain, inert text:
  - no control or format characters: ESC (ANSI/OSC sequences: colours, cursor moves, a
    forged `verdict: ADMISSIBLE` line, terminal titles, hyperlinks), CR, BEL, DEL, the C1
    range, bidirectional overrides, zero-width and line/paragraph separators are written
    out as `\\x1b`, `\\u202e`, ... (visible, so a reader sees something was there);
    newlines and tabs become spaces and runs of whitespace one space;
  - safe for Rich markup: a `[` that would open a Rich tag (`[red]`, `[/]`, `[link=...]`)
    gets a space after it, so the text prints as itself through `console.print`;
  - at most `limit` characters.
It is idempotent (applying it twice changes nothing), so layers that each pass text on may
each apply it.
"""
from __future__ import annotations

import re
import unicodedata

DEFAULT_LIMIT = 600
# categories written out: control, format (bidi, zero-width), surrogate, private use,
# unassigned, line and paragraph separators
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_TAG_OPEN = re.compile(r"\[(?=[A-Za-z#/@])")
_SPACES = re.compile(r"[ \t\n]+")


def _escape_char(ch: str) -> str:
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else (f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")


def safe_text(text: object, limit: int = DEFAULT_LIMIT) -> str:
    """`text` (any object: its str()) as one line of inert text; see the module docstring."""
    try:
        s = text if isinstance(text, str) else str(text)
    except Exception as e:  # noqa: BLE001 - a hostile __str__ must not escape either
        s = f"<unprintable {type(text).__name__}: {type(e).__name__}>"
    if len(s) > 4 * limit + 64:  # bound the work on huge inputs before escaping
        s = s[:4 * limit + 64]
    s = _SPACES.sub(" ", s)
    if not s.isascii() or any(c < " " or c == "\x7f" for c in s):
        s = "".join(_escape_char(c) if (c < " " or c == "\x7f" or
                                        (c >= "\x80" and unicodedata.category(c) in _UNSAFE_CATEGORIES))
                    else c for c in s)
    s = _TAG_OPEN.sub("[ ", s).strip()
    if len(s) > limit:
        s = s[:max(0, limit - 3)].rstrip() + "..."
    return s
