"""`evolve runs | leaderboard | show | plot` on fixture runs, and their one-line errors."""
from __future__ import annotations

import json
import shutil

import matplotlib.image
import pytest

from runs_fixture import CELL, make_run
from search import runs as R
from simcore.cli import main

SCHED = f"scheduling-{CELL}-fixture"
RET = f"retention-{CELL}-fixture"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    make_run(root, "scheduling", started_at="2026-11-30T01:00:00+00:00")
    make_run(root, "retention", started_at="2026-11-30T02:00:00+00:00")
    live = root / "live-run"
    shutil.copytree(root / SCHED, live)
    meta = json.loads((live / "run.json").read_text())
    meta.update(status="running", run_id="live-run", started_at="2026-11-30T00:00:00+00:00")
    (live / "run.json").write_text(json.dumps(meta))
    return root


def evolve(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_runs_lists_every_run_with_best_fitness(runs_dir, capsys):
    rc, out, _ = evolve(capsys, "runs", "--runs-dir", str(runs_dir), "--json")
    assert rc == 0
    rows = {r["run_id"]: r for r in json.loads(out)}
    assert set(rows) == {SCHED, RET, "live-run"}
    assert rows["live-run"]["status"] == "running" and rows[SCHED]["status"] == "finished"
    best = max(c["fitness"] for c in json.loads(evolve(capsys, "leaderboard", SCHED, "--runs-dir", str(runs_dir),
                                                       "--json")[1])["candidates"] if c["status"] == "ok")
    assert rows[SCHED]["best_fitness"] == pytest.approx(best)
    assert rows[SCHED]["iterations"] == "3/3"


def test_runs_dir_from_environment(runs_dir, capsys, monkeypatch):
    monkeypatch.setenv(R.ENV_RUNS, str(runs_dir))
    rc, out, _ = evolve(capsys, "runs")
    assert rc == 0 and SCHED in out and RET in out


def test_leaderboard_defaults_to_latest_run_and_ranks_failed_last(runs_dir, capsys):
    rc, out, _ = evolve(capsys, "leaderboard", "--runs-dir", str(runs_dir), "--json")
    board = json.loads(out)
    assert rc == 0 and board["run_id"] == RET   # started last
    cands = board["candidates"]
    assert [c["rank"] for c in cands] == list(range(1, len(cands) + 1))
    ok = [c for c in cands if c["status"] == "ok"]
    assert [c["fitness"] for c in ok] == sorted((c["fitness"] for c in ok), reverse=True)
    assert cands[-1]["status"] == "failed" and "forbidden module" in cands[-1]["reason"]
    assert all(c["fitness_lo"] <= c["fitness"] <= c["fitness_hi"] for c in ok)


def test_leaderboard_table_and_top(runs_dir, capsys):
    rc, out, _ = evolve(capsys, "leaderboard", SCHED, "--top", "2", "--runs-dir", str(runs_dir))
    assert rc == 0 and "top 2" in out and "it0000-seed" in out
    assert len(json.loads(evolve(capsys, "leaderboard", SCHED, "--top", "2", "--json",
                                 "--runs-dir", str(runs_dir))[1])["candidates"]) == 2


def test_show_diff_metrics_and_lineage(runs_dir, capsys):
    rc, out, _ = evolve(capsys, "show", SCHED, "it0003-cccc", "--runs-dir", str(runs_dir))
    assert rc == 0
    assert "--- seed.py" in out and "+++ it0003-cccc/program.py" in out
    assert "+        return int(round(pcb.attained_service_s * 500.0" in out
    assert "mean_jct_s" in out and "p99_jct_s" in out
    assert "it0003-cccc (it 3" in out and "<- it0001-aaaa" in out and "<- it0000-seed" in out


def test_lineage_walks_parents_to_the_seed(runs_dir):
    run = R.resolve_run(runs_dir, SCHED)
    assert [r["candidate_id"] for r in R.lineage(run, "it0003-cccc")] == ["it0003-cccc", "it0001-aaaa",
                                                                           "it0000-seed"]


def test_island_progress_is_monotone(runs_dir):
    df = R.island_progress(R.resolve_run(runs_dir, SCHED))
    assert set(df["island"]) == {0, 1}
    for _, g in df.groupby("island"):
        vals = g.sort_values("iteration")["best_fitness"].tolist()
        assert vals == sorted(vals)


def test_plot_writes_three_readable_pngs(runs_dir, tmp_path, capsys):
    rc, out, _ = evolve(capsys, "plot", SCHED, "--out", str(tmp_path), "--runs-dir", str(runs_dir))
    assert rc == 0
    for name in ("fitness_islands.png", "jct_cdf.png", "kv_utilization.png"):
        img = matplotlib.image.imread(tmp_path / name)
        assert img.shape[0] > 300 and img.shape[1] > 600
        assert img[..., :3].std() > 0.05, f"{name} looks blank"


@pytest.mark.parametrize("argv, message", [
    (["leaderboard", "nope"], "unknown run 'nope'"),
    (["show", SCHED, "nope"], "unknown candidate 'nope'"),
    (["export", SCHED, "--candidate", "it0002-bbbb", "--out", "OUT"], "candidate 'it0002-bbbb'"),
    (["export", "live-run", "--out", "OUT"], "still in progress"),
    (["plot", "live-run"], "still in progress"),
])
def test_bad_input_is_one_line_exit_2(runs_dir, tmp_path, capsys, argv, message):
    argv = [a.replace("OUT", str(tmp_path / "x")) for a in argv]
    rc, out, err = evolve(capsys, *argv, "--runs-dir", str(runs_dir))
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_no_runs_is_a_clear_error(tmp_path, capsys):
    rc, _, err = evolve(capsys, "leaderboard", "--runs-dir", str(tmp_path))
    assert rc == 2 and "no runs under" in err
