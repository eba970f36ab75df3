"""`evolve runs | leaderboard | show | plot` on fixture runs, and their one-line errors."""
from __future__ import annotations

import json
import shutil

import matplotlib.image
import pytest

from rich.console import Console

from tests.runs_fixture import CELL, make_run
from search import runs as R
from search import runs_cli
from simcore.cli import main

SCHED = f"scheduling-{CELL}-fixture"
RET = f"retention-{CELL}-fixture"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    make_run(root, "scheduling", started_at="2026-11-30T01:00:00+00:00", fixed={"retention": {"name": "ttl"}})
    make_run(root, "retention", started_at="2026-11-30T02:00:00+00:00")
    # the retention run's pick was re-scored on a held-out draw and is not significant there
    meta = json.loads((root / RET / "run.json").read_text())
    res_path = root / RET / "candidates" / meta["best_candidate"] / "result.json"
    res = json.loads(res_path.read_text())
    res["heldout"] = {"fitness": 1.0042, "fitness_ci": [0.9931, 1.0157], "level": 0.983, "draws": [100],
                      "per_draw": {"100": 1.0042}, "significant": False}
    res_path.write_text(json.dumps(res))
    meta.update(winner=None, verdict="no candidate is significantly better than the seed on the 1 held-out draws")
    (root / RET / "run.json").write_text(json.dumps(meta))
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
    assert rows[SCHED]["llm"] == "offline" and rows[SCHED]["failed_candidates"] == 1
    assert rows[SCHED]["llm_failures"] == 0 and rows[SCHED]["fixed"] == "retention=ttl"


@pytest.fixture
def narrow(monkeypatch):
    """A 60-column terminal: the tables must fold other columns, never cut identifiers."""
    import io
    buf = io.StringIO()
    monkeypatch.setattr(runs_cli, "console", Console(file=buf, width=60, highlight=False))
    return buf


def test_tables_never_cut_identifiers_on_a_narrow_terminal(runs_dir, narrow, capsys):
    assert main(["runs", "--runs-dir", str(runs_dir)]) == 0
    out = narrow.getvalue()
    assert "1.0042 (lo 0.9931) n.s." in out and "winner" not in out
    for rid in (SCHED, RET, "live-run"):
        assert rid in out, out
    assert "…" not in out
    narrow.seek(0)
    narrow.truncate()
    assert main(["leaderboard", RET, "--runs-dir", str(runs_dir)]) == 0
    out = narrow.getvalue()
    assert "n.s." in out and "result: no candidate is significantly better" in " ".join(out.split())
    narrow.seek(0)
    narrow.truncate()
    assert main(["leaderboard", SCHED, "--runs-dir", str(runs_dir)]) == 0
    out = narrow.getvalue()
    for cid in ("it0000-seed", "it0001-aaaa", "it0002-bbbb", "it0003-cccc"):
        assert cid in out, out


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
    assert cands[-1]["failure_kind"] == "gate"
    assert all(c["fitness_lo"] <= c["fitness"] <= c["fitness_hi"] for c in ok)


def test_leaderboard_table_and_top(runs_dir, capsys):
    rc, out, _ = evolve(capsys, "leaderboard", SCHED, "--top", "2", "--runs-dir", str(runs_dir))
    assert rc == 0 and "top 2" in out and "it0000-seed" in out
    assert len(json.loads(evolve(capsys, "leaderboard", SCHED, "--top", "2", "--json",
                                 "--runs-dir", str(runs_dir))[1])["candidates"]) == 2


def test_show_diff_metrics_lineage_and_the_llm_exchange(runs_dir, capsys):
    rc, out, _ = evolve(capsys, "show", SCHED, "it0003-cccc", "--runs-dir", str(runs_dir))
    assert rc == 0
    assert "--- seed.py" in out and "+++ it0003-cccc/program.py" in out
    assert "+        return int(round(pcb.attained_service_s * 500.0" in out
    assert "mean_jct_s" in out and "p99_jct_s" in out
    assert "it0003-cccc (it 3" in out and "<- it0001-aaaa" in out and "<- it0000-seed" in out
    # the model, the prompt and the answer, shown literally (no markup swallowed, no escape codes)
    assert "LLM: offline" in out and "other axes: retention=ttl" in out
    assert "Prompt of iteration 3: keep [bold]this[/bold] literal" in out and "\x1b" not in out
    assert "Answer of iteration 3: [red]not markup[/red]" in out


def test_show_defaults_to_the_runs_pick_and_has_json(runs_dir, capsys):
    best = json.loads((runs_dir / SCHED / "run.json").read_text())["best_candidate"]
    rc, out, _ = evolve(capsys, "show", SCHED, "--runs-dir", str(runs_dir))
    assert rc == 0 and f"{SCHED} / {best}" in out and "the run's pick" in out
    rc, out, _ = evolve(capsys, "show", SCHED, "--json", "--runs-dir", str(runs_dir))
    assert json.loads(out)["result"]["candidate_id"] == best
    rc, out, _ = evolve(capsys, "show", SCHED, "it0003-cccc", "--json", "--runs-dir", str(runs_dir))
    doc = json.loads(out)
    assert doc["fixed_policies"] == {"retention": "ttl"} and doc["journal"]["model"] == "offline"
    assert doc["journal"]["response"] == "Answer of iteration 3: [red]not markup[/red]"


def test_lineage_walks_parents_to_the_seed(runs_dir):
    run = R.resolve_run(runs_dir, SCHED)
    assert [r["candidate_id"] for r in R.lineage(run, "it0003-cccc")] == ["it0003-cccc", "it0001-aaaa",
                                                                           "it0000-seed"]


def test_fitness_progress_is_monotone_in_the_lower_bound_and_carries_the_interval(runs_dir):
    df = R.fitness_progress(R.resolve_run(runs_dir, SCHED))
    assert set(df["island"]) == {0, 1}
    for _, g in df.groupby("island"):
        lows = g.sort_values("iteration")["best_lo"].tolist()
        assert lows == sorted(lows)
        assert (g["best_lo"] <= g["best_fitness"]).all() and (g["best_fitness"] <= g["best_hi"]).all()


def test_plot_and_show_use_the_runs_fixed_policies(runs_dir):
    from search.plots import simulate_pair
    run = R.resolve_run(runs_dir, SCHED)
    assert run.fixed_policies == {"retention": "ttl"}
    res = simulate_pair(run, run.root / "candidates" / "it0001-aaaa" / "program.py")
    assert res["seed"].policies["retention"] == "ttl" and res["best"].policies["retention"] == "ttl"
    m = json.loads((run.root / "candidates" / "it0001-aaaa" / "result.json").read_text())["metrics"]
    assert res["best"].summary["mean_jct_s"] == pytest.approx(m["mean_jct_s"])   # the run's own numbers


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
