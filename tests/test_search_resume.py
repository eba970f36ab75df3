"""Runs as real processes: kill -9 then resume replays exactly; Ctrl-C stops promptly with a
consistent run.json; a finished run is extended or re-modelled; a user's search.py in the
current directory cannot stand in for ours.

Each process starts its own local Ray. The fake simulator is slowed down so that the kill
lands mid-run. Slow-ish (~2 min).
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
from tests.fakes.llm_servers import openai_server

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent

CONFIG = {"iterations": 12, "islands": 2, "population": 12, "archive_size": 6, "workers": 2, "seed": 7,
          "migration_interval": 3, "checkpoint_interval": 2, "timeout_s": 60,
          "evaluator": {"simulator": FAKESIM, "leak_check": False, "workload_seeds": [0, 1],
                        "stage1_threshold": 0.0, "heldout": {"draws": [5, 6], "top": 2}}}


def _env(**extra):
    env = {**os.environ, "FAKESIM_DELAY_S": "0.15", "PYTHONPATH": str(ROOT), **extra}
    for k in ("RAY_ADDRESS", "ANTHROPIC_API_KEY", "PYTHONHASHSEED", "AGENTSERVESIM_SEARCH_REEXEC"):
        env.pop(k, None)
    if "OPENAI_API_KEY" not in extra:
        env.pop("OPENAI_API_KEY", None)
    return env


def _cmd(cfg, run_dir, *extra):
    return [sys.executable, "-P", "-m", "search", "--axis", "scheduling", "--cell", "rtx70b_swe_0.1",
            "--config", str(cfg), "--run-dir", str(run_dir), *extra]


def _children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = [int(x) for x in out.split()]
    return kids + [g for k in kids for g in _children(k)]


def _board(run_dir):
    rows = [(r.candidate_id, r.fitness, r.fitness_ci, r.status, r.parent_id, r.island, r.generation,
             r.heldout.fitness if r.heldout else None) for r in RunDir(run_dir).leaderboard()]
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
    before = {r.candidate_id: r for r in RunDir(b).candidates()}
    meta_b = json.loads((b / "run.json").read_text())
    assert 6 <= len(before) < len(want), "the kill should land mid-run"
    assert meta_b["status"] == "running"            # killed: never got to record an end

    res = subprocess.run([sys.executable, "-P", "-m", "search", "resume", str(b)], env=_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got, got_best, meta_b = _board(b)
    assert meta_b["status"] == "finished" and meta_b["iterations_done"] == CONFIG["iterations"]
    assert got == want and got_best == want_best and meta_b["verdict"] == meta_a["verdict"]
    after = {r.candidate_id: r for r in RunDir(b).candidates()}
    for cid, r in before.items():                    # nothing scored before the kill was lost or redone
        assert after[cid].created_at == r.created_at
    assert str(b) in res.stdout

    # a finished run is extended: the first 12 iterations replay, 4 new ones follow
    ext = subprocess.run([sys.executable, "-P", "-m", "search", "resume", str(b), "--iterations", "16"],
                         env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ext.returncode == 0, ext.stdout[-2000:] + ext.stderr[-2000:]
    meta = json.loads((b / "run.json").read_text())
    assert meta["status"] == "finished" and meta["iterations_done"] == 16 == meta["iterations_planned"]
    assert len(list((b / "journal" / "llm").iterdir())) == 16
    again = subprocess.run([sys.executable, "-P", "-m", "search", "resume", str(b)], env=_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already finished (16 iterations)" in again.stderr


def test_ctrl_c_during_a_slow_llm_call_stops_promptly_and_resume_finishes(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "iterations": 3, "workers": 1}))
    run_dir = tmp_path / "r"
    env = _env(OPENAI_API_KEY="k", FAKESIM_DELAY_S="0")
    with openai_server(["silent"], silent_s=3600) as srv:
        proc = subprocess.Popen(_cmd(cfg, run_dir, "--llm", "openai:fake-model", "--api-base",
                                     f"http://127.0.0.1:{srv.port}/v1"), env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and srv.posts < 1:   # an LLM call is pending (and never answers)
            time.sleep(0.1)
        assert srv.posts >= 1
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    assert proc.returncode == 130, out[-2000:]
    assert took < 15, f"exit took {took:.1f} s after Ctrl-C"    # ~2-5 s on an idle 2-core machine
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["iterations_done"] == 0 and meta["finished_at"]
    assert "cannot schedule new futures" not in out and "Traceback" not in out
    assert f"evolve resume {run_dir}" in out
    # the same run, re-modelled onto a working server, finishes
    with openai_server(["good", "tweak"]) as srv:
        res = subprocess.run([sys.executable, "-P", "-m", "search", "resume", str(run_dir), "--llm",
                              "openai:fake-model", "--api-base", f"http://127.0.0.1:{srv.port}/v1"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        posts = srv.posts
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "finished" and meta["iterations_done"] == 3 and posts == 3
    assert [p["from_iteration"] for p in meta["llm_history"]] == [1, 1]


def test_a_search_py_in_the_current_directory_cannot_shadow_the_package(tmp_path):
    """`evolve` re-executes itself (fixed hash seed) without the current directory on sys.path."""
    for name in ("search.py", "sandbox.py", "simcore.py", "evaluator.py"):
        (tmp_path / name).write_text("print('SHADOWED: a user module ran')\nraise SystemExit(0)\n")
    for d in ("configs", "seeds"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("raise SystemExit('SHADOWED package')\n")
    cfg = tmp_path / "one.yaml"
    cfg.write_text(yaml.safe_dump({"workers": 1, "evaluator": {"workload_seeds": [0], "leak_check": False,
                                                               "heldout": {"draws": [100], "top": 1}}}))
    evolve = Path(sys.executable).parent / "evolve"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RAY_ADDRESS", "PYTHONHASHSEED", "AGENTSERVESIM_SEARCH_REEXEC",
                        "OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    res = subprocess.run([str(evolve), "--axis", "scheduling", "--cell", "rtx70b_swe10_0.1", "--iterations", "1",
                          "--config", str(cfg), "--run-dir", str(tmp_path / "run")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert "SHADOWED" not in res.stdout + res.stderr
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "finished" and meta["iterations_done"] == 1
    assert len(list((tmp_path / "run" / "candidates").iterdir())) == 2     # the seed and one candidate


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
