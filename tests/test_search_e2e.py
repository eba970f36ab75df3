"""End-to-end searches through our loop over OpenEvolve's database and prompt sampler
(in-process, shared Ray).

The fake simulator keeps each evaluation at milliseconds; the LLM is the offline mutator,
the `openai` client against a local OpenAI-compatible server, or the `anthropic` client
against a local fake.
"""
import argparse
import json
from pathlib import Path

import pytest
from rich.console import Console

from search.driver import create_run, execute, parse_with
from search.llm import entries_for, label_for
from search.settings import load_settings
from tests.fakes import FAKESIM, ensure_ray
from tests.fakes.llm_servers import anthropic_server, openai_server

pytestmark = pytest.mark.timeout(300)

TINY = {"islands": 2, "population": 12, "archive_size": 6, "workers": 1, "timeout_s": 60,
        "migration_interval": 3, "checkpoint_interval": 2,
        "llm": {"timeout_s": 20, "retries": 0},
        "evaluator": {"simulator": FAKESIM, "leak_check": False, "workload_seeds": [0, 1],
                      "stage1_threshold": 0.0, "heldout": {"draws": [7, 8, 9], "top": 2}}}


def _search(tmp_path, iterations, llm=None, api_base=None, llm_models=None, fixed=None, llm_cfg=None, **over):
    ensure_ray()
    llm_settings = {**TINY["llm"], **({"models": llm_models} if llm_models else {}), **(llm_cfg or {})}
    settings = load_settings(None, {**TINY, "iterations": iterations, **over, "llm": llm_settings})
    entries = entries_for(llm, api_base, settings.llm)
    run = create_run("scheduling", "rtx70b_swe_0.1", settings, label_for(entries),
                     [e.model_dump() for e in entries], str(tmp_path / "run"), None,
                     fixed=parse_with(fixed, "scheduling"))
    code = execute(run, console=Console(file=open(tmp_path / "out.txt", "w"), width=200))
    return code, run


def _journal(run):
    return [json.loads(p.read_text()) for p in sorted((run.root / "journal" / "llm").iterdir())]


def test_offline_search_writes_the_run_layout_checks_held_out_draws_and_picks(tmp_path):
    code, run = _search(tmp_path, 10, llm="offline", fixed=["retention=ttl"])
    out = (tmp_path / "out.txt").read_text()
    assert code == 0, out[-2000:]
    meta = json.loads(run.run_json.read_text())
    assert meta["status"] == "finished" and meta["iterations_done"] == 10 == meta["iterations_planned"]
    assert meta["fixed_policies"] == {"retention": {"name": "ttl"}}
    res = {r.candidate_id: r for r in run.candidates()}
    assert len(res) >= 8          # the seed plus one candidate per iteration that produced an edit
    for cid, r in res.items():
        assert (run.candidate_dir(cid) / "program.py").is_file()
        assert r.draws == [0, 1] and set(r.per_draw) == {"0", "1"} or r.status != "ok"
        if r.iteration > 0:
            assert r.parent_id in res and r.model == "offline"
            assert r.metrics.get("fixed") == "retention=ttl" or r.status != "ok"
    # the held-out check: the best two (distinct behaviour) re-scored on draws 7-9
    checked = [r for r in res.values() if r.heldout is not None]
    assert 1 <= len(checked) <= 2 and all(r.heldout.draws == [7, 8, 9] for r in checked)
    assert all(r.heldout.level == pytest.approx(1 - 0.05 / len(checked)) for r in checked)
    pick = max(checked, key=lambda r: (r.heldout.fitness_ci[0], r.heldout.fitness))
    assert meta["best_candidate"] == pick.candidate_id
    assert (meta["winner"] == pick.candidate_id) == pick.heldout.significant
    best = json.loads((run.root / "best" / "result.json").read_text())
    assert best["candidate_id"] == pick.candidate_id and best["heldout"]["draws"] == [7, 8, 9]
    assert "held-out check" in out and ("winner:" in out or "no candidate is significantly better" in out)
    # the closing lines name the file to use: the winner's, or the seed's when nothing held
    if meta["winner"]:
        assert f"policy: {run.root / 'best' / 'policy.py'}" in out
    else:
        assert f"seed (the policy to use): {run.root / 'seed.py'}" in out
        assert "best re-scored candidate, not significantly better" in out
    assert any((run.root / "checkpoints").iterdir())
    # every iteration's prompt is stored next to its answer
    j = _journal(run)
    assert [r["iteration"] for r in j] == list(range(1, 11))
    assert all(r["prompt"]["system"] and r["prompt"]["user"] and r["response"] for r in j)


def test_a_policy_file_fixed_with_with_runs_sandboxed_and_is_recorded(tmp_path):
    from pathlib import Path
    listing = Path(__file__).parent / "data" / "listings" / "retention_evolved.py"
    code, run = _search(tmp_path, 2, llm="offline", fixed=[f"retention={listing}"])
    assert code == 0, (tmp_path / "out.txt").read_text()[-2000:]
    meta = json.loads(run.run_json.read_text())
    assert meta["fixed_policies"]["retention"]["file"] == "fixed/retention.py"
    assert (run.root / "fixed" / "retention.py").read_text() == listing.read_text()
    ok = [r for r in run.candidates() if r.status == "ok"]
    assert ok and all(r.metrics["fixed"].startswith("retention=Sandboxed") for r in ok)


def test_prompts_tell_the_truth(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with openai_server(["good", "tweak", "good"]) as srv:
        code, run = _search(tmp_path, 3, llm="openai:fake-model", api_base=f"http://127.0.0.1:{srv.port}/v1")
        reqs = list(srv.requests)
    assert code == 0
    system, user = reqs[-1]["messages"][0]["content"], reqs[-1]["messages"][1]["content"]
    assert "POLICY AXIS: scheduling" in system and "context_tokens" in system
    assert "higher is better" in system and "lower-is-better" in system
    assert "code length exceeds" not in user                 # no length advice caused by the docstring
    assert "Performs well on" not in user and "Mixed results" not in user
    assert "mean JCT" in user and "(lower is better)" in user
    # the per-request seed varies (a server that honours it would otherwise repeat itself)
    seeds = [r.get("seed") for r in reqs]
    assert len(set(seeds)) == len(seeds)
    assert all(r["temperature"] == 1.0 for r in reqs)


def test_openai_backend_and_bad_answers_while_the_run_continues(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    script = ["good", "outside", "leak", "hang", "nodiff", "nomatch", "rewrite", "tweak"]
    with openai_server(script) as srv:
        code, run = _search(tmp_path, 8, llm="openai:fake-model", api_base=f"http://127.0.0.1:{srv.port}/v1")
        assert srv.posts == 8                         # exactly --iterations LLM calls
        reqs = list(srv.requests)
    assert code == 0
    res = {r.iteration: r for r in run.candidates() if r.iteration > 0}
    assert res[1].status == "ok" and res[1].fitness > 1.0                      # good
    assert (res[2].status, res[2].failure_kind) == ("failed", "markers")      # edit outside the block
    assert (res[3].status, res[3].failure_kind) == ("failed", "leak")         # reads pcb.program
    assert res[4].status == "failed" and res[4].failure_kind in ("crash", "sandbox", "timeout")   # infinite loop
    assert "deadline" in res[4].reason or "budget" in res[4].reason or "limit" in res[4].reason
    assert 5 not in res and 6 not in res                                       # no diff / SEARCH not found
    assert res[7].status == "ok" and "context_tokens * 7.0" in (run.candidate_dir(res[7].candidate_id)
                                                                 / "program.py").read_text()   # full rewrite
    assert res[8].status == "ok"                                               # the run went on
    meta = json.loads(run.run_json.read_text())
    assert meta["status"] == "finished" and meta["iterations_done"] == 8
    assert meta["counts"]["format_failures"] == 2 and meta["counts"]["failed_candidates"] == 3
    j = {r["iteration"]: r for r in _journal(run)}
    assert j[5]["format_failure"] == "no-edit" and j[6]["format_failure"] == "no-match"
    # failures are fed back to later prompts of the same island (iterations alternate islands)
    later = [r["messages"][1]["content"] for r in reqs[6:]]
    assert any("SEARCH blocks matched" in u or "no SEARCH/REPLACE block" in u for u in later)
    assert any("scored 0 (markers)" in r["messages"][1]["content"] for r in reqs[3:])


def test_anthropic_backend_passes_temperature(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1")   # overridden by api_base below
    with anthropic_server(["good", "tweak"]) as srv:
        code, run = _search(tmp_path, 2, llm_models=[{"backend": "anthropic:claude-test",
                                                      "api_base": f"http://127.0.0.1:{srv.port}"}],
                            llm_cfg={"temperature": 0.3})
        assert srv.posts == 2
        assert "POLICY AXIS: scheduling" in srv.requests[0]["system"]
        assert all(r["temperature"] == 0.3 for r in srv.requests)
        assert "/v1/models/claude-test" in srv.gets          # the preflight checked the model
    assert code == 0
    res = [r for r in run.candidates() if r.iteration > 0]
    assert len(res) == 2 and all(r.status == "ok" and r.model == "anthropic:claude-test" for r in res)


def test_a_failing_llm_stops_the_run_with_status_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    with openai_server(["fail500"]) as srv:
        code, run = _search(tmp_path, 20, llm="openai:fake-model", api_base=f"http://127.0.0.1:{srv.port}/v1",
                            llm_cfg={"max_consecutive_failures": 3, "retries": 1})
        posts = srv.posts
    meta = json.loads(run.run_json.read_text())
    out = (tmp_path / "out.txt").read_text()
    assert code == 1 and meta["status"] == "failed"
    assert "3 consecutive failed LLM calls" in meta["error"] and "HTTP 500" in meta["error"]
    assert meta["counts"]["llm_failures"] == 3 and meta["iterations_done"] == 3
    assert posts <= 3 * 2 + 1 * 2          # one retry each; at most one more iteration was in flight
    j = _journal(run)
    assert all(r["error"] and "HTTP 500" in r["error"] and "/v1/chat/completions" in r["error"] for r in j)
    assert "search failed" in out and "HTTP 500" in out


def test_a_silent_llm_costs_one_time_budget_per_call(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    with openai_server(["silent"], silent_s=60) as srv:
        code, run = _search(tmp_path, 5, llm="openai:fake-model", api_base=f"http://127.0.0.1:{srv.port}/v1",
                            llm_cfg={"timeout_s": 1.5, "retries": 2, "max_consecutive_failures": 2})
        posts = srv.posts
    meta = json.loads(run.run_json.read_text())
    assert code == 1 and "no answer within" in meta["error"]
    assert posts <= 3              # a timeout is not retried (one call per iteration in flight)


def _cli(monkeypatch, capsys, *argv):
    from search import run_cli as cli
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


def test_preflight_catches_a_wrong_base_url_and_an_unknown_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    with openai_server(["good"]) as srv, anthropic_server(["good"]) as a:
        base = f"http://127.0.0.1:{srv.port}"
        code, err = _cli(monkeypatch, capsys, "--axis", "scheduling", "--cell", "rtx70b_swe_0.1",
                         "--llm", "openai:fake-model", "--api-base", base, "--run-dir", str(tmp_path / "r1"))
        assert code == 2 and "404" in err and "/v1" in err           # base URL without /v1
        code, err = _cli(monkeypatch, capsys, "--axis", "scheduling", "--cell", "rtx70b_swe_0.1",
                         "--llm", "openai:other-model", "--api-base", base + "/v1", "--run-dir", str(tmp_path / "r2"))
        assert code == 2 and "does not serve model 'other-model'" in err and "fake-model" in err
        monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{a.port}")
        code, err = _cli(monkeypatch, capsys, "--axis", "scheduling", "--cell", "rtx70b_swe_0.1",
                         "--llm", "anthropic:claude-nope", "--run-dir", str(tmp_path / "r3"))
        assert code == 2 and "does not know model 'claude-nope'" in err
        assert srv.posts == 0 and a.posts == 0
    assert not any((tmp_path / d).exists() for d in ("r1", "r2", "r3"))


@pytest.mark.parametrize("argv,needle", [
    (["--axis", "scheduling", "--cell", "no_such_cell"], "no_such_cell"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--llm", "gpt4"], "expected offline"),
    (["--axis", "scheduling"], "--cell"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--iterations", "0"], "--iterations 0"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--iterations", "-1"], "--iterations -1"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--workers", "0"], "--workers 0"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--timeout", "-5"], "--timeout -5"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--with", "scheduling=fcfs"], "axis being searched"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--with", "retention=nope"], "unknown retention policy"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--with", "retention"], "AXIS=POLICY"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--llm", "openai:a@x@0"], "weight"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--llm", "openai:[bold]m[/bold]"],
     "openai:[bold]m[/bold]: OPENAI_API_KEY is not set"),       # shown literally, not as markup
])
def test_bad_arguments_are_one_line_errors(tmp_path, monkeypatch, capsys, argv, needle):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, err = _cli(monkeypatch, capsys, *argv, "--run-dir", str(tmp_path / "r"))
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert "configs/search.yaml" not in err


def test_weighted_ensemble_from_the_llm_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    with openai_server(["tweak"]) as o, anthropic_server(["tweak"]) as a:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{a.port}")
        code, run = _search(tmp_path, 8, llm="openai:fake-model@0.7,anthropic:claude-test@0.3",
                            api_base=f"http://127.0.0.1:{o.port}/v1")
        n_openai, n_anthropic = o.posts, a.posts
    assert code == 0 and n_openai + n_anthropic == 8 and n_openai >= 1 and n_anthropic >= 1
    assert json.loads(run.run_json.read_text())["llm"] == "openai:fake-model@0.7 + anthropic:claude-test@0.3"
    used = [r["model"] for r in _journal(run)]
    assert used.count("openai:fake-model") == n_openai and used.count("anthropic:claude-test") == n_anthropic


def test_json_stdout_is_parseable(tmp_path, monkeypatch, capsys):
    import yaml

    from search import run_cli as cli
    ensure_ray()
    monkeypatch.setenv("AGENTSERVESIM_SEARCH_REEXEC", "0")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "iterations": 1}))
    p = argparse.ArgumentParser()
    cli.register_main(p)
    code = cli.run(p.parse_args(["--axis", "scheduling", "--cell", "rtx70b_swe_0.1", "--config", str(cfg),
                                 "--run-dir", str(tmp_path / "run"), "--json"]))
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    doc = json.loads(out.out)
    assert doc["run_dir"] == str(tmp_path / "run") and doc["status"] == "finished" and doc["iterations_done"] == 1
    assert "held-out" in out.err or "result:" in out.err or "winner:" in out.err


@pytest.mark.parametrize("significant", [True, False])
def test_the_closing_lines_name_the_policy_to_use(tmp_path, significant):
    """A winner's run points at best/policy.py; a run whose pick did not hold on the held-out
    draws points at the seed and calls best/policy.py what it is."""
    from io import StringIO
    from types import SimpleNamespace

    from search.driver import _report
    from search.rundir import RunDir
    from tests.runs_fixture import make_run

    run = RunDir(make_run(tmp_path))
    pick = run.load_meta().best_candidate
    run.update(winner=pick if significant else None,
               verdict=f"{pick} beats the seed" if significant else "no candidate is significantly better")
    buf = StringIO()
    _report(Console(file=buf, width=400), run, SimpleNamespace(best=None))
    out = buf.getvalue()
    if significant:
        assert f"policy: {run.root / 'best' / 'policy.py'}" in out and "seed (the policy to use)" not in out
    else:
        assert f"seed (the policy to use): {run.seed_py}" in out
        assert f"best re-scored candidate, not significantly better: {run.root / 'best' / 'policy.py'}" in out
        assert "policy: " + str(run.root / "best") not in out


def test_a_machine_without_a_sandbox_layer_stops_the_search_with_the_reason(tmp_path):
    """The seed's evaluation meets a worker that refuses to start (no network namespace): the
    run stops at once, status failed, exit 2, and says which layer and which flag, instead of
    scoring every candidate as a crash."""
    sim = str(Path(__file__).resolve().parent / "fakes" / "unavailable_sim.py") + ":simulate"
    code, run = _search(tmp_path, 3, evaluator={**TINY["evaluator"], "simulator": sim})
    meta = json.loads(run.run_json.read_text())
    out = (tmp_path / "out.txt").read_text()
    assert code == 2 and meta["status"] == "failed" and meta["iterations_done"] == 0
    assert "sandbox layers unavailable" in meta["error"] and "netns" in meta["error"]
    assert "--allow-weak-sandbox" in meta["error"] and "crash" not in meta["error"]
    assert "search failed: sandbox layers unavailable" in " ".join(out.split())
    assert not list((run.root / "candidates").glob("c*"))   # no candidate was scored
