"""`evolve validate` end to end on the fake engine: profile it, define a cell on the profile,
validate (replay twice + simulate), and read the table, the files and the plots."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.fakes.openai_stream import Spawned
from simcore import config
from search.cli import main
from simcore.workload import Call, Program, save_programs
from tests.test_live_profile import ENGINE_STEP, own_configs  # noqa: F401 (fixture)


def swe_like(n: int = 8) -> list[Program]:
    """Short agent programs: growing contexts (each call extends the last), tool gaps."""
    progs = []
    for i in range(n):
        calls, prompt = [], 200 + 40 * (i % 3)
        for k in range(3 + i % 3):
            out = 6 + (3 * i + 5 * k) % 10
            calls.append(Call(prompt, out, "bash", 0.05 + 0.03 * ((i + k) % 3)))
            prompt += out + 30 + 10 * (k % 2)
        last = calls[-1]
        calls[-1] = Call(last.prompt_tokens, last.output_tokens)
        progs.append(Program(f"swe-{i:02d}", tuple(calls)))
    return progs


def test_validate_against_the_fake_engine(own_configs, tmp_path, capsys):  # noqa: F811
    """The fake engine wakes up 3 ms slower after 15 ms idle and every request spends 2 ms on its way
    in and 2 ms before its stream closes, as a CPU host's engine and API server do: the profile
    measures both (idle.csv) and the simulation, charging them, lands near the real runs."""
    save_programs(swe_like(), own_configs / "wl.jsonl")
    with Spawned(ENGINE_STEP, mode="engine", max_model_len=4096, kv_pool_tokens=65536, wake_s=0.003,
                 wake_after_s=0.015, api_in_s=0.002, api_out_s=0.002) as url:
        assert main(["profile", "--server", url, "--out", str(own_configs / "prof"), "--prefill-tokens", "16,128,512",
                     "--contexts", "0,256", "--batch-sizes", "1,2,4,8", "--decode-contexts", "128,512",
                     "--decode-tokens", "16", "--repeats", "2"]) == 0
        (own_configs / "cells.yaml").write_text(
            "families:\n  fake:\n    hardware: cpu-host\n    model: tiny-llama\n    kv_pool_tokens: 65536\n"
            "    engine: {block_size: 16, max_num_seqs: 64, max_num_batched_tokens: 8192}\n"
            "    workload: {kind: file, path: wl.jsonl}\n    rates: [4]\n")
        config.cell_catalog.cache_clear()
        capsys.readouterr()
        out = tmp_path / "v"
        rc = main(["validate", "--cell", "fake_4", "--server", url, "--noise-floor", "--out", str(out), "--quiet",
                   "--profile", str(own_configs / "prof")])   # a cell without a profile, given one
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    v = json.loads((out / "validation.json").read_text())
    assert v["profile"] == str((own_configs / "prof").resolve()) and v["api_latency_s"] >= 0.004
    rows = {r["key"]: r for r in v["rows"]}
    assert set(rows) >= {"mean_jct_s", "p99_jct_s", "mape", "mean_ttft_s", "mean_tpot_s", "mean_queueing_s",
                         "preemptions", "prefix_hit_rate"}
    for key in ("mean_jct_s", "p99_jct_s", "mean_ttft_s", "mean_tpot_s"):
        r = rows[key]
        assert r["real"] > 0 and r["sim"] > 0 and r["real2"] > 0
        assert r["error"] == pytest.approx(r["sim"] / r["real"] - 1)
        assert r["noise"] == pytest.approx(r["real2"] / r["real"] - 1)
    # the fake engine batches like the simulator's engine and the profile times it: the two agree
    assert abs(rows["mean_jct_s"]["error"]) < 0.15, rows["mean_jct_s"]
    assert rows["mape"]["error"] < 0.2
    assert rows["preemptions"]["real"] == 0 and rows["preemptions"]["sim"] == 0
    # prefix hits: the same shared-prefix structure on both sides, and the second replay does not
    # hit the first one's prompts (a fresh salt per replay)
    assert rows["prefix_hit_rate"]["real"] == pytest.approx(rows["prefix_hit_rate"]["sim"], abs=2.0)
    assert rows["prefix_hit_rate"]["real2"] == pytest.approx(rows["prefix_hit_rate"]["real"], abs=0.5)
    for f in ("validation.md", "jct_cdf.png", "jct_per_program.png", "sim/summary.json", "real/calls.csv",
              "real2/programs.csv", "real/server_metrics.json"):
        assert (out / f).is_file(), f
    assert (out / "jct_cdf.png").stat().st_size > 5000
    table = (out / "validation.md").read_text()
    for label in ("mean JCT", "p99 JCT", "per-program JCT MAPE", "mean TTFT", "mean TPOT", "mean queueing delay",
                  "preemptions", "prefix-hit rate", "noise floor"):
        assert label in table, label
    assert "noise floor" in cap.out and "JCT" in cap.out   # the same table on the terminal
    real = pd.read_csv(out / "real" / "programs.csv")
    sim = pd.read_csv(out / "sim" / "programs.csv")
    assert sorted(real["program_id"]) == sorted(sim["program_id"])
    assert (real.sort_values("program_id")["arrival_s"].to_numpy()
            == pytest.approx(sim.sort_values("program_id")["arrival_s"].to_numpy()))   # one arrival schedule


def test_api_latency_lengthens_every_gap_and_is_added_once_per_call_and_program():
    from search.live.validate import client_view, with_api_latency
    from simcore.sim import simulate
    progs = swe_like(3)
    moved = with_api_latency(progs, 0.004)
    for p, q in zip(progs, moved):
        assert [c.tool_duration_s + 0.004 for c in p.calls[:-1]] == pytest.approx([c.tool_duration_s for c in q.calls[:-1]])
        assert q.calls[-1] == p.calls[-1] and [c.prompt_tokens for c in q.calls] == [c.prompt_tokens for c in p.calls]
    sim = simulate("rtx70b_swe10_0.1", programs=progs, seed=0)
    view = client_view(sim, 0.004)
    assert (view.programs["jct_s"] - sim.programs["jct_s"]).to_numpy() == pytest.approx(0.004)
    assert view.summary["mean_ttft_s"] == pytest.approx(sim.summary["mean_ttft_s"] + 0.004)
    assert view.summary["mean_tpot_s"] == pytest.approx(sim.summary["mean_tpot_s"])
    assert view.summary["mean_queueing_s"] == pytest.approx(sim.summary["mean_queueing_s"])
    assert client_view(sim, 0.0) is sim
