"""The one exception the sandbox raises: a candidate that broke a rule or a limit."""
from __future__ import annotations

from simcore.policies.base import PolicyError


class SandboxViolation(PolicyError):
    """A candidate policy was rejected or stopped; `str(e)` is one line of feedback."""

    def __init__(self, reason: str) -> None:
        # Keep the message to one line: it goes back to the LLM as feedback and into logs.
        super().__init__(" ".join(str(reason).split()))
