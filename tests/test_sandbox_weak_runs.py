"""--allow-weak-sandbox is recorded in the run (run.json's config) and shown by `evolve runs`
and `evolve leaderboard`; `evolve plot` of such a run is allowed the same weak sandbox."""
from __future__ import annotations

import json

from simcore.cli import main as evolve
from tests.runs_fixture import make_run


def _weaken(run_dir) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    meta.setdefault("config", {}).setdefault("evaluator", {})["allow_weak_sandbox"] = True
    (run_dir / "run.json").write_text(json.dumps(meta))


def test_runs_and_leaderboard_show_a_weak_sandbox(tmp_path, capsys):
    full = make_run(tmp_path, run_id="full-run", started_at="2026-11-30T01:00:00+00:00")
    weak = make_run(tmp_path, run_id="weak-run", started_at="2026-11-30T02:00:00+00:00")
    _weaken(weak)
    assert evolve(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["weak-run"]["sandbox"] == "weak" and rows["full-run"]["sandbox"] == "full"
    assert evolve(["runs", "--runs-dir", str(tmp_path)]) == 0
    assert "WEAK (--allow-weak-sandbox)" in capsys.readouterr().out
    assert evolve(["leaderboard", "weak-run", "--runs-dir", str(tmp_path)]) == 0
    assert "WEAK SANDBOX (--allow-weak-sandbox)" in capsys.readouterr().out
    assert evolve(["leaderboard", "full-run", "--runs-dir", str(tmp_path)]) == 0
    assert "WEAK" not in capsys.readouterr().out
    assert evolve(["leaderboard", "weak-run", "--runs-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["allow_weak_sandbox"] is True
    assert full.exists()


def test_the_search_flag_reaches_the_runs_config(tmp_path):
    import argparse

    from search import cli
    p = argparse.ArgumentParser()
    cli.register_main(p)
    args = p.parse_args(["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--allow-weak-sandbox"])
    assert args.allow_weak_sandbox is True
    from search.driver import create_run
    from search.settings import load_settings
    s = load_settings(None, {"evaluator": {"allow_weak_sandbox": True}})
    run = create_run("scheduling", "rtx70b_swe_0.1", s, "offline", [{"backend": "offline"}], str(tmp_path / "r"), None)
    assert json.loads(run.run_json.read_text())["config"]["evaluator"]["allow_weak_sandbox"] is True
    assert load_settings(None, {}).evaluator.allow_weak_sandbox is False
