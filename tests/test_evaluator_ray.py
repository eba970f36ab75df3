"""Ray-backed evaluation: hard timeout with cancellation, a killed worker retried once.

Uses the fake simulator (tests/fakes/fakesim.py) whose control files make an evaluation
block, so the tests can kill the worker process mid-evaluation.
"""
import os
import signal
import time
from importlib import resources

import pytest

from tests.fakes import FAKESIM, ensure_ray

pytestmark = pytest.mark.timeout(240)

SEED = resources.files("seeds").joinpath("scheduling_plas.py").read_text()


@pytest.fixture()
def control(tmp_path, monkeypatch):
    # Ray workers read the control directory from their environment: pass it per task.
    monkeypatch.setenv("FAKESIM_CONTROL", str(tmp_path))
    return tmp_path


def _evaluator(control, timeout_s=60.0):
    ensure_ray()
    from evaluator.service import EvalPlan, RayEvaluator
    plan = EvalPlan(axis="scheduling", seed_source=SEED, cells=("rtx70b_swe_0.1",), workload_seeds=(0, 1),
                    stage1_cell=None, timeout_s=timeout_s, simulator=FAKESIM, leak_check=False)
    ev = RayEvaluator(plan)
    # the fake's control directory travels with the task, like any worker setting would
    ev._remote = ev._remote.options(runtime_env={"env_vars": {"FAKESIM_CONTROL": str(control)}})
    ev.ensure_baseline()
    return ev


def _wait_pid(control, timeout=60.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = control / "pid"
        if p.exists() and p.read_text().strip():
            pid = int(p.read_text())
            p.unlink()
            return pid
        time.sleep(0.1)
    raise AssertionError("the evaluation never started")


def test_seed_scores_parity(control):
    ev = _evaluator(control)
    r = ev.evaluate(SEED)
    assert r.status == "ok" and r.fitness == 1.0 and r.fitness_ci == (1.0, 1.0)
    assert r.metrics["mean_jct_s"] == pytest.approx(ev.baseline_mean_jct("rtx70b_swe_0.1"))


def test_hung_evaluation_is_killed_at_the_deadline(control):
    ev = _evaluator(control, timeout_s=3.0)
    (control / "sleep").write_text("")
    t0 = time.time()
    r = ev.evaluate(SEED.replace("1000.0", "999.0"))
    assert r.status == "failed" and r.kind == "timeout" and "3 s" in r.reason and r.fitness == 0.0
    assert time.time() - t0 < 30
    (control / "sleep").unlink()
    # the cluster keeps working after the forced cancellation
    assert ev.evaluate(SEED).status == "ok"


def test_worker_killed_mid_evaluation_is_retried_once(control):
    ev = _evaluator(control)
    (control / "block_once").write_text("")
    import threading
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", ev.evaluate(SEED.replace("1000.0", "998.0"))))
    t.start()
    os.kill(_wait_pid(control), signal.SIGKILL)
    t.join(120)
    r = out["r"]
    assert r.status == "ok", r.reason


def test_worker_killed_twice_fails_the_candidate_with_the_reason(control):
    ev = _evaluator(control)
    (control / "block_all").write_text("")
    import threading
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", ev.evaluate(SEED.replace("1000.0", "997.0"))))
    t.start()
    os.kill(_wait_pid(control), signal.SIGKILL)
    os.kill(_wait_pid(control), signal.SIGKILL)
    (control / "block_all").unlink()
    t.join(120)
    r = out["r"]
    assert r.status == "failed" and r.kind == "worker" and "retried once" in r.reason
