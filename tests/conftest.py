"""Shared fixtures (helpers live in tests/helpers.py; `tests` is a package, so pytest puts
the repository root on sys.path and tests import `tests.helpers`, `tests.fakes`, ...)."""
from __future__ import annotations

import pytest

from tests.helpers import ConstantPerf


@pytest.fixture
def constant_perf(monkeypatch):
    """Patch the performance model the simulator builds with a constant-step one."""
    perf = ConstantPerf()
    monkeypatch.setattr("simcore.perf.build_perf_model", lambda cell: perf)
    return perf
