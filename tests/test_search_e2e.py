"""End-to-end searches through the real OpenEvolve controller (in-process, shared Ray).

The fake simulator keeps each evaluation at milliseconds; the LLM is the offline mutator,
the `openai` client against a local OpenAI-compatible server, or the `anthropic` client
against a local fake.
"""
import argparse
import json

import pytest
from rich.console import Console

from search.driver import create_run, execute
from search.llm import entries_for, label_for
from search.settings import load_settings
from tests.fakes import FAKESIM, ensure_ray
from tests.fakes.llm_servers import anthropic_server, openai_server

pytestmark = pytest.mark.timeout(300)

TINY = {"islands": 2, "population": 12, "archive_size": 6, "workers": 1, "timeout_s": 60,
        "migration_interval": 3, "checkpoint_interval": 2,
        "evaluator": {"simulator": FAKESIM, "leak_check": False, "stage1_cell": "rtx70b_swe10_0.1"}}


def _search(tmp_path, iterations, llm=None, api_base=None, llm_models=None, **over):
    ensure_ray()
    settings = load_settings(None, {**TINY, "iterations": iterations, **over,
                                    **({"llm": {"models": llm_models}} if llm_models else {})})
    entries = entries_for(llm, api_base, settings.llm)
    run = create_run("scheduling", "rtx70b_swe_0.1", settings, label_for(entries),
                     [e.model_dump() for e in entries], str(tmp_path / "run"), None)
    code = execute(run, console=Console(file=open(tmp_path / "out.txt", "w"), width=200))
    return code, run


def _results(run):
    return {r["candidate_id"]: r for r in run.candidates()}


def _search_subprocess(tmp_path, iterations, seed):
    """The CLI in a child with a fixed hash seed: OpenEvolve iterates sets of ids, so only a
    fixed PYTHONHASHSEED makes the sampled parents (and so the outcome) reproducible."""
    import os
    import subprocess
    import sys

    import ray
    import yaml
    from search.rundir import RunDir

    ensure_ray()
    cfg = tmp_path / "search.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "iterations": iterations}))
    env = {**os.environ, "PYTHONHASHSEED": "0", "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "search", "--axis", "scheduling", "--cell", "rtx70b_swe_0.1",
                          "--config", str(cfg), "--seed", str(seed), "--llm", "offline",
                          "--run-dir", str(tmp_path / "run"),
                          "--ray-address", ray.get_runtime_context().gcs_address],
                         capture_output=True, text=True, env=env, timeout=280)
    (tmp_path / "out.txt").write_text(out.stdout + out.stderr)
    return out.returncode, RunDir(tmp_path / "run")


def test_offline_search_writes_the_run_layout_and_finds_a_better_policy(tmp_path):
    code, run = _search_subprocess(tmp_path, 10, seed=42)
    assert code == 0, (tmp_path / "out.txt").read_text()[-2000:]
    meta = json.loads(run.run_json.read_text())
    assert meta["status"] == "finished" and meta["iterations_done"] == 10 == meta["iterations_planned"]
    for k in ("run_id", "axis", "cell", "seed_file", "config", "llm", "started_at", "finished_at", "best_candidate"):
        assert k in meta
    res = _results(run)
    assert len(res) >= 8          # the seed plus one candidate per iteration that produced an edit
    for cid, r in res.items():
        assert (run.candidate_dir(cid) / "program.py").is_file()
        for k in ("candidate_id", "parent_id", "island", "generation", "iteration", "fitness",
                  "fitness_ci", "metrics", "status", "reason", "created_at"):
            assert k in r
        if r["iteration"] > 0:
            assert r["parent_id"] in res        # lineage resolves to recorded candidates
    best = json.loads((run.root / "best" / "result.json").read_text())
    assert best["candidate_id"] == meta["best_candidate"]
    assert best["fitness"] == max(r["fitness"] for r in res.values())
    assert (run.root / "best" / "policy.py").read_text() == (run.candidate_dir(best["candidate_id"]) / "program.py").read_text()
    assert any((run.root / "checkpoints").iterdir())
    # the mutator's edits change the schedule: fitness moves away from parity, and on this
    # workload (context length predicts size) the search ends above the seed
    assert any(abs(r["fitness"] - 1.0) > 1e-6 for r in res.values())
    assert best["fitness"] > 1.0 and best["fitness_ci"][0] <= best["fitness"] <= best["fitness_ci"][1]
    assert "best candidate" in (tmp_path / "out.txt").read_text()


def test_openai_backend_and_bad_candidates_score_zero_while_the_run_continues(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    script = ["good", "outside", "leak", "hang", "nodiff", "tweak"]
    with openai_server(script) as srv:
        code, run = _search(tmp_path, 6, llm="openai:fake-model", api_base=f"http://127.0.0.1:{srv.port}/v1")
        assert len(srv.requests) == 6
        req = srv.requests[0]
        assert req["model"] == "fake-model"
        assert "POLICY AXIS: scheduling" in req["messages"][0]["content"]
        assert "context_tokens" in req["messages"][0]["content"]
    assert code == 0
    res = sorted((r for r in run.candidates() if r["iteration"] > 0), key=lambda r: r["iteration"])
    kinds = {r["iteration"]: (r["status"], r.get("failure_kind"), r["fitness"]) for r in res}
    assert kinds[1][0] == "ok" and kinds[1][2] > 1.0                      # good
    assert kinds[2] == ("failed", "markers", 0.0)                          # edit outside the block
    assert kinds[3] == ("failed", "leak", 0.0)                             # reads pcb.program
    assert kinds[4] == ("failed", "timeout", 0.0)                          # infinite loop
    assert 5 not in kinds                                                  # no diff: no candidate
    assert kinds[6][0] == "ok"                                             # the run went on
    for r in res:
        if r["status"] == "failed":
            assert r["reason"]
    meta = json.loads(run.run_json.read_text())
    assert meta["status"] == "finished" and meta["iterations_done"] == 6
    # failures are fed back: a later prompt lists them
    journal = sorted((run.root / "journal" / "llm").iterdir())
    assert len(journal) == 6


def test_anthropic_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1")   # overridden by api_base below
    with anthropic_server(["good", "tweak"]) as srv:
        code, run = _search(tmp_path, 2, llm="anthropic:claude-test", api_base=f"http://127.0.0.1:{srv.port}")
        assert len(srv.requests) == 2
        assert "POLICY AXIS: scheduling" in srv.requests[0]["system"]
    assert code == 0
    res = [r for r in run.candidates() if r["iteration"] > 0]
    assert len(res) == 2 and all(r["status"] == "ok" for r in res)


def _cli(monkeypatch, capsys, *argv):
    from search import cli
    monkeypatch.setenv("AGENTSERVESIM_SEARCH_REEXEC", "0")
    p = argparse.ArgumentParser()
    cli.register_main(p)
    code = cli.run(p.parse_args(list(argv)))
    return code, capsys.readouterr().err


def test_missing_key_is_one_clear_error_before_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, err = _cli(monkeypatch, capsys, "--axis", "scheduling", "--cell", "rtx70b_swe_0.1",
                     "--llm", "openai:gpt-x", "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "OPENAI_API_KEY is not set" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_unreachable_server_is_one_clear_error(tmp_path, monkeypatch, capsys):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nothing listens there now
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    code, err = _cli(monkeypatch, capsys, "--axis", "scheduling", "--cell", "rtx70b_swe_0.1",
                     "--llm", "openai:m", "--api-base", f"http://127.0.0.1:{port}/v1",
                     "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "cannot reach" in err


@pytest.mark.parametrize("argv,needle", [
    (["--axis", "scheduling", "--cell", "no_such_cell"], "no_such_cell"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--llm", "gpt4"], "expected offline"),
    (["--axis", "scheduling"], "--cell"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--iterations", "0"], "iterations"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, monkeypatch, capsys, argv, needle):
    code, err = _cli(monkeypatch, capsys, *argv, "--run-dir", str(tmp_path / "r"))
    assert code == 2 and needle in err and "Traceback" not in err


def test_weighted_ensemble_from_the_config_file(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    with openai_server(["tweak"]) as o, anthropic_server(["tweak"]) as a:
        models = [{"backend": "openai:fake-model", "weight": 0.7, "api_base": f"http://127.0.0.1:{o.port}/v1"},
                  {"backend": "anthropic:claude-test", "weight": 0.3, "api_base": f"http://127.0.0.1:{a.port}"}]
        code, run = _search(tmp_path, 8, llm=None, llm_models=models)
        n_openai, n_anthropic = len(o.requests), len(a.requests)
    assert code == 0 and n_openai + n_anthropic == 8 and n_openai >= 1 and n_anthropic >= 1
    assert json.loads(run.run_json.read_text())["llm"] == "openai:fake-model@0.7 + anthropic:claude-test@0.3"
    used = [json.loads(p.read_text())["model"] for p in sorted((run.root / "journal" / "llm").iterdir())]
    assert used.count("openai:fake-model") == n_openai and used.count("anthropic:claude-test") == n_anthropic
