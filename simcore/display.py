"""Terminal output shared by every command: text shown inertly and tables that never cut ids.

Commands print text that users, LLMs or candidates wrote only inside `rich.text.Text`
(never parsed as markup), after `strip_control`, which replaces control characters (they
could move the cursor or recolour the terminal) but keeps newlines and tabs: prompts,
responses and diffs are shown whole. One-line candidate text (reasons, names) comes out of
the sandbox already made inert by `sandbox.text.safe_text`.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_control(text: object) -> str:
    """Replace control characters (except newline and tab) with U+FFFD."""
    return _CONTROL.sub("\ufffd", str(text))


def stdout_console() -> Console:
    """Piped output (CI logs, `| less`) gets wide tables instead of Rich's 80-column default."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def print_table(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                ids: Sequence[str], right: Sequence[str] = ()) -> None:
    """A table whose identifier columns (`ids`) are never cut. If they and a readable width
    for the other columns do not fit the terminal, each row is printed as a block of
    `column: value` lines instead (values wrap, identifiers stay whole)."""
    widths = {c: max([len(str(r[i])) for r in rows] + [len(c)]) for i, c in enumerate(columns)}
    need = sum(widths[c] + 3 for c in columns if c in ids) + sum(min(widths[c], 12) + 3 for c in columns
                                                                  if c not in ids)
    if need <= console.width:
        t = Table(title=Text(strip_control(title)))
        for c in columns:
            justify = "right" if c in right else "left"
            if c in ids:
                t.add_column(c, no_wrap=True, min_width=widths[c], overflow="fold", justify=justify)
            else:
                t.add_column(c, overflow="fold", justify=justify)
        for r in rows:
            t.add_row(*[v if isinstance(v, Text) else Text(strip_control(v)) for v in r])
        console.print(t)
        return
    console.print(Text(strip_control(title), style="bold"))
    for r in rows:
        g = Table.grid(padding=(0, 1))
        g.add_column(no_wrap=True, style="dim")
        g.add_column(overflow="fold")
        for c, v in zip(columns, r):
            g.add_row(c, v if isinstance(v, Text) else Text(strip_control(v)))
        console.print(g)
        console.print()
