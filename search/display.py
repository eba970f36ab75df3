"""Showing text that users, LLMs or candidates wrote, through Rich, safely.

Commands print such text only inside `rich.text.Text` (never parsed as markup), after
`strip_control`, which replaces control characters (they could move the cursor or recolour
the terminal) but keeps newlines and tabs: prompts, responses and diffs are shown whole.
One-line candidate text (reasons, names) comes out of the sandbox already made inert by
`sandbox.text.safe_text`.
"""
from __future__ import annotations

import re


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_control(text: object) -> str:
    """Replace control characters (except newline and tab) with U+FFFD."""
    return _CONTROL.sub("\ufffd", str(text))

