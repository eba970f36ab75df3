"""A search killed with SIGKILL mid-run and resumed ends with the same leaderboard as an
uninterrupted run with the same seed, and loses none of the candidates scored before the kill.

Runs `python -m search` as real processes (each starts its own local Ray), with the fake
simulator slowed down so that the kill lands mid-run. Slow-ish (~1 min).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from search.rundir import RunDir
from tests.fakes import FAKESIM

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent

CONFIG = {"iterations": 12, "islands": 2, "population": 12, "archive_size": 6, "workers": 2, "seed": 7,
          "migration_interval": 3, "checkpoint_interval": 2, "timeout_s": 60,
          "evaluator": {"simulator": FAKESIM, "leak_check": False, "stage1_cell": "rtx70b_swe10_0.1",
                        "workload_seeds": [0, 1]}}


def _env():
    env = dict(os.environ, FAKESIM_DELAY_S="0.15", PYTHONPATH=str(ROOT))
    for k in ("RAY_ADDRESS", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PYTHONHASHSEED",
              "AGENTSERVESIM_SEARCH_REEXEC"):
        env.pop(k, None)
    return env


def _cmd(cfg, run_dir):
    return [sys.executable, "-m", "search", "--axis", "scheduling", "--cell", "rtx70b_swe_0.1",
            "--config", str(cfg), "--run-dir", str(run_dir)]


def _children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = [int(x) for x in out.split()]
    return kids + [g for k in kids for g in _children(k)]


def _board(run_dir):
    rows = [(r["candidate_id"], r["fitness"], r["status"], r["parent_id"], r["island"], r["generation"])
            for r in RunDir(run_dir).leaderboard()]
    meta = json.loads((Path(run_dir) / "run.json").read_text())
    return rows, meta["best_candidate"], meta


def test_kill_9_and_resume_matches_an_uninterrupted_run(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    a, b = tmp_path / "a", tmp_path / "b"
    done = subprocess.run(_cmd(cfg, a), env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    want, want_best, meta_a = _board(a)
    assert meta_a["status"] == "finished"

    proc = subprocess.Popen(_cmd(cfg, b), env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 200
    while time.time() < deadline and len(list((b / "candidates").glob("*/result.json"))) < 6:
        time.sleep(0.05)
    kids = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for k in kids:                      # the local Ray the killed driver had started
        try:
            os.kill(k, signal.SIGKILL)
        except ProcessLookupError:
            pass
    before = {r["candidate_id"]: r for r in RunDir(b).candidates()}
    meta_b = json.loads((b / "run.json").read_text())
    assert 6 <= len(before) < len(want), "the kill should land mid-run"
    assert meta_b["status"] == "running"            # killed: never got to record an end

    res = subprocess.run([sys.executable, "-m", "search", "resume", str(b)], env=_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got, got_best, meta_b = _board(b)
    assert meta_b["status"] == "finished" and meta_b["iterations_done"] == CONFIG["iterations"]
    assert got == want and got_best == want_best
    after = {r["candidate_id"]: r for r in RunDir(b).candidates()}
    for cid, r in before.items():                    # nothing scored before the kill was lost or redone
        assert after[cid]["created_at"] == r["created_at"]
    assert "best candidate" in res.stdout and str(b) in res.stdout


def test_joins_an_existing_ray_cluster_by_address(tmp_path):
    """`--ray-address` makes the run a driver of someone else's cluster (here: this test's)."""
    import ray

    from tests.fakes import ensure_ray
    ensure_ray()
    address = ray.get_runtime_context().gcs_address
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "iterations": 3}))
    env = dict(_env(), RAY_AUTH_MODE="disabled", FAKESIM_DELAY_S="0")
    done = subprocess.run(_cmd(cfg, tmp_path / "c") + ["--ray-address", address], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"ray cluster {address}" in done.stdout
    assert json.loads((tmp_path / "c" / "run.json").read_text())["status"] == "finished"
    # the cluster outlives the run that joined it
    assert ray.is_initialized() and ray.get(ray.put(1)) == 1
