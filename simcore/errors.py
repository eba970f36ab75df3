"""The one base class of every error a user can act on.

Each layer raises its own subclasses (a bad config, workload, policy, run directory,
LLM endpoint ...) with a message that is one line naming the file, field or flag at fault.
The console script (search/cli.py) prints any `UserError` as that line and exits 2; it
needs no list of classes, so a new layer's errors cannot slip through as a traceback.
"""
from __future__ import annotations


class UserError(Exception):
    """An error caused by input the user can fix; str(e) is one line that says what and where."""
