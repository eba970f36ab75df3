"""Test doubles for the search: a fake simulator and fake LLM HTTP servers (127.0.0.1)."""
from __future__ import annotations

from pathlib import Path

FAKESIM = str(Path(__file__).resolve().parent / "fakesim.py") + ":simulate"


def ensure_ray(workers: int = 2) -> None:
    """One local Ray per test process, shared by the tests that need it (start-up is ~5 s)."""
    from evaluator import raypool
    raypool.connect(None, workers, shared=True)   # searches run by tests must not shut it down
