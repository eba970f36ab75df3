"""Data the installed package carries: configs/ and seeds/ (never importable modules).

In the repository they are the top-level folders `configs/` and `seeds/`; `simcore/bundled/`
links to them, and pyproject.toml installs them as simcore's package data, so an editable
and a regular install read the same files through importlib.resources. A `configs` or
`seeds` folder (or module) in the user's current directory can never stand in for them.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .policies.base import AXES

# The hand-written seed each axis's search starts from (seeds/, paper Appendix F).
SEED_FILES: dict[str, str] = {"retention": "retention_ttl.py", "scheduling": "scheduling_plas.py",
                              "routing": "routing_affinity.py"}
assert set(SEED_FILES) == set(AXES)


def _bundled(name: str) -> Path:
    return Path(str(resources.files("simcore"))) / "bundled" / name


def configs_dir() -> Path:
    """The shipped configs/ folder (hardware, models, cells, profiles, workload parameters)."""
    return _bundled("configs")


def seeds_dir() -> Path:
    return _bundled("seeds")


def seed_source(axis: str) -> str:
    """The source of `axis`'s shipped seed policy file."""
    return (seeds_dir() / SEED_FILES[axis]).read_text(encoding="utf-8")
