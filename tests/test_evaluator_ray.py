"""Ray-backed evaluation: hard timeout with cancellation, a killed worker retried once.

Uses the fake simulator (tests/fakes/fakesim.py) whose control files make an evaluation
block, so the tests can kill the worker process mid-evaluation.
"""
import os
import signal
import time

import pytest

from simcore.packaged import seed_source
from tests.fakes import FAKESIM, ensure_ray

pytestmark = pytest.mark.timeout(240)

SEED = seed_source("scheduling")


@pytest.fixture()
def control(tmp_path, monkeypatch):
    # Ray workers read the control directory from their environment: pass it per task.
    monkeypatch.setenv("FAKESIM_CONTROL", str(tmp_path))
    return tmp_path


def _evaluator(control, timeout_s=120.0, stage1=False):
    ensure_ray()
    from evaluator.service import EvalPlan, RayEvaluator
    plan = EvalPlan(axis="scheduling", seed_source=SEED, cells=("rtx70b_swe_0.1",), draws=(0, 1),
                    stage1=stage1, timeout_s=timeout_s, simulator=FAKESIM, leak_cell=None)
    # the fake's control directory travels with the task, like any worker setting would
    ev = RayEvaluator(plan, runtime_env={"env_vars": {"FAKESIM_CONTROL": str(control)}})
    ev.ensure_baseline()
    return ev


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:   # a zombie waiting for its parent counts as stopped
        return open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    except OSError:
        return True


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


def test_seed_scores_parity_and_stage1_reports_the_first_draw(control):
    ev = _evaluator(control, stage1=True)
    r = ev.evaluate(SEED)
    e = r.estimate
    assert r.status == "ok" and (e.fitness, e.lo, e.hi) == (1.0, 1.0, 1.0) and e.draws == [0, 1]
    assert r.metrics["stage1_fitness"] == 1.0
    assert r.metrics["mean_jct_s"] == pytest.approx(ev.baseline_mean_jct("rtx70b_swe_0.1"))
    assert r.behaviour == ev.seed_evaluation().behaviour      # same decisions, same JCTs


def test_fixed_policies_reach_the_simulator(control):
    ensure_ray()
    from evaluator.service import EvalPlan, RayEvaluator
    plan = EvalPlan(axis="scheduling", seed_source=SEED, cells=("rtx70b_swe_0.1",), draws=(0,), stage1=False,
                    simulator=FAKESIM, leak_cell=None, fixed={"retention": {"name": "ttl"}})
    r = RayEvaluator(plan).evaluate(SEED.replace("1000.0", "990.0"))
    assert r.status == "ok" and r.metrics["fixed"] == "retention=ttl"


def test_hung_evaluation_is_killed_at_the_deadline(control):
    """The deadline covers the whole task (worker start included), so it is not compared with
    a wall clock here: the test checks that the hung code is stopped and named as a timeout."""
    ev = _evaluator(control, timeout_s=5.0)
    (control / "block_all").write_text("")     # every simulate() writes its pid, then sleeps 120 s
    r = ev.evaluate(SEED.replace("1000.0", "999.0"))
    (control / "block_all").unlink()
    assert r.status == "failed" and r.kind == "timeout" and "5 s limit" in r.reason and r.fitness == 0.0
    p = control / "pid"
    if p.exists():                              # it started: the forced cancellation killed it
        pid = int(p.read_text())
        deadline = time.monotonic() + 60
        while not _dead(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _dead(pid), "the hung evaluation's worker is still running"
    # the cluster keeps working after the forced cancellation (a fresh evaluator, generous limit)
    assert _evaluator(control).evaluate(SEED).status == "ok"


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
