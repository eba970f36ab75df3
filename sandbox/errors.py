"""The exceptions the sandbox raises; their messages are one line of inert text (safe_text)."""
from __future__ import annotations

from simcore.policies.base import PolicyError

from .text import safe_text


class SandboxViolation(PolicyError):
    """A candidate policy was rejected or stopped; `str(e)` is one line of feedback."""

    def __init__(self, reason: str) -> None:
        # One line of inert text: it goes back to the LLM as feedback, into runs and onto
        # terminals, and parts of it were written by the candidate.
        super().__init__(safe_text(reason))


class SandboxUnavailable(PolicyError):
    """An isolation layer is missing on this machine and weak sandboxes were not allowed.

    Not the candidate's fault, so not a SandboxViolation: a search stops on it instead of
    scoring every candidate zero. The message names the missing layers and the flag.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(safe_text(reason, limit=1200))
