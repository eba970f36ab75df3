"""`--policy EXPORT_DIR`: the exported tracker sets priorities and session ids, as deployed."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.fakes.openai_stream import FakeServer
from tests.runs_fixture import CELL, make_run
from search.cli import main
from simcore.workload import Call, Program, save_programs


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """The PLAS seed of a fixture run, exported by the real `evolve export`."""
    root = tmp_path_factory.mktemp("runs")
    make_run(root, "scheduling")
    out = root / "pkg"
    assert main(["export", f"scheduling-{CELL}-fixture", "--candidate", "it0000-seed", "--out", str(out),
                 "--runs-dir", str(root)]) == 0
    return out


@pytest.fixture
def wl(tmp_path):
    p = tmp_path / "wl.jsonl"
    save_programs([Program(f"p{i}", (Call(64, 6, "bash", 0.02), Call(96, 5, "view", 0.02), Call(128, 4)))
                   for i in range(3)], p)
    return p


def test_exported_plas_sets_priority_and_session_like_its_deployment(export_dir, wl, tmp_path, capsys):
    srv = FakeServer(priority=True, ttft_s=0.01, tpot_s=0.005)
    url = srv.start()
    try:
        rc = main(["replay", str(wl), "--server", url, "--rate", "50", "--policy", str(export_dir),
                   "--out", str(tmp_path / "real"), "--quiet"])
    finally:
        srv.stop()
    err = capsys.readouterr().err
    assert rc == 0, err
    meta = json.loads((export_dir / "metadata.json").read_text())
    assert "runs in this process" in err and meta["package"] in err and meta["policy_sha256"][:12] in err
    calls = pd.read_csv(tmp_path / "real" / "calls.csv").sort_values(["program_id", "turn"])
    reqs = [r for r in srv.requests if r.body.get("max_tokens") != 2]   # not the probe
    assert len(reqs) == 9
    by_prompt = {tuple(r.body["prompt"][:8]): r for r in reqs if "session_id" in r.body}
    assert len(by_prompt) == 3   # first calls of the three programs
    for r in reqs:
        pid = r.body["session_id"]
        assert r.headers.get("x-session-id") == pid and r.body["vllm_xargs"] == {"session_id": pid}
        assert isinstance(r.body["priority"], int)
    # PLAS: priority of call k = attained service of calls < k in ms, measured as the deployment does
    # (first scheduling = send + the server's reported queue time, to completion)
    for pid, g in calls.groupby("program_id"):
        service = (g["finish_s"] - g["first_scheduled_s"]).cumsum().shift(fill_value=0.0) * 1000.0
        sent = sorted((r for r in reqs if r.body["session_id"] == pid), key=lambda r: r.received)
        assert [r.body["priority"] for r in sent] == [int(round(x)) for x in service]
        assert sent[0].body["priority"] == 0 and sent[-1].body["priority"] > 0
    s = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert s["policies"]["scheduling"].startswith("export:") and "runs in this process" in s["policy"]


def test_edited_policy_fails_the_sha256_check(export_dir, wl, tmp_path, capsys):
    bad = tmp_path / "edited"
    import shutil
    shutil.copytree(export_dir, bad)
    (bad / "policy.py").write_text((bad / "policy.py").read_text() + "\n# edited\n")
    rc = main(["replay", str(wl), "--server", "http://127.0.0.1:1", "--rate", "5", "--policy", str(bad), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "sha256" in err and "metadata.json" in err and "Traceback" not in err


def test_fcfs_server_refusing_priorities_stops_with_one_line_and_keeps_finished_calls(export_dir, wl, tmp_path, capsys):
    with FakeServer(priority=False, ttft_s=0.005, tpot_s=0.002) as url:
        rc = main(["replay", str(wl), "--server", url, "--rate", "50", "--policy", str(export_dir),
                   "--out", str(tmp_path / "real"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "--scheduling-policy priority" in err and "Traceback" not in err
    calls = pd.read_csv(tmp_path / "real" / "calls.csv")
    assert len(calls) >= 1 and (calls["turn"] == 0).all()   # first calls (priority 0) went through
    s = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert "priority" in s["error"]
