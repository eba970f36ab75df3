"""Showing text that users or candidates wrote through Rich, safely.

Run ids, cell names, model names, error messages and LLM answers can contain `[...]`
(which Rich would read as markup and swallow) and, for candidate or LLM text, control
characters (which could move the cursor or recolour the terminal). `safe` escapes the
first and replaces the second. (The sandbox's shared `safe_text` helper can replace this
one once it lands.)
"""
from __future__ import annotations

import re

from rich.markup import escape

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_control(text: object) -> str:
    """Replace control characters (except newline and tab) with U+FFFD."""
    return _CONTROL.sub("\ufffd", str(text))


def safe(text: object) -> str:
    """Text for Rich markup strings: control characters replaced, markup escaped."""
    return escape(strip_control(text))
