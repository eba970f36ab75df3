"""The measured performance model (simcore/perf_measured.py) and `evolve profile` on the fake engine."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tests.fakes.openai_stream import Spawned, linear_step

from search.cli import main
from simcore import config
from simcore.config import ConfigError
from simcore.packaged import configs_dir
from simcore.perf import build_perf_model
from simcore.perf_measured import PROFILE_FORMAT, MeasuredFit, MeasuredPerf, MeasuredProfileError, fit, load_measured
from simcore.sim import simulate

TRUE_A, TRUE_B = (0.004, 2e-5, 3e-9), (0.003, 4e-4, 5e-8)


def synthetic_tables(noise: float = 0.0, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    f = MeasuredFit(TRUE_A, TRUE_B)
    pre = pd.DataFrame([{"new_tokens": n, "context_tokens": c, "time_s": f.prefill_s(n, c) * (1 + noise * rng.standard_normal())}
                        for n in (16, 64, 256, 1024, 4096) for c in (0, 512, 4096)])
    dec = pd.DataFrame([{"batch_size": b, "context_tokens": c, "step_s": f.decode_s(b, c) * (1 + noise * rng.standard_normal())}
                        for b in (1, 4, 16, 64) for c in (128, 1024, 8192)])
    return pre, dec


def write_profile_dir(folder: Path, pre: pd.DataFrame, dec: pd.DataFrame, **meta) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pre.to_csv(folder / "prefill.csv", index=False)
    dec.to_csv(folder / "decode.csv", index=False)
    (folder / "profile.json").write_text(json.dumps({"format": PROFILE_FORMAT, **meta}))
    return folder


def test_fit_recovers_the_model_from_exact_points():
    pre, dec = synthetic_tables()
    f = fit(pre, dec)
    assert f.prefill_coef == pytest.approx(TRUE_A, rel=1e-6)
    assert f.decode_coef == pytest.approx(TRUE_B, rel=1e-6)


def test_fit_keeps_coefficients_non_negative_on_noisy_points():
    pre, dec = synthetic_tables(noise=0.05, seed=3)
    pre["time_s"] = 0.01 + 0.0 * pre["new_tokens"]   # a flat table: slopes must not go negative
    f = fit(pre, dec)
    assert min(f.prefill_coef) >= 0 and min(f.decode_coef) >= 0
    assert f.prefill_s(16, 0) == pytest.approx(0.01, rel=0.01)


def test_decode_window_sum_equals_the_steps_one_by_one():
    perf = MeasuredPerf(MeasuredFit(TRUE_A, TRUE_B), kv_bytes_per_token=1024, tp=1, host_link_gbs=25.0)
    n, kv, steps = 7, 7 * 900, 41
    one_by_one = sum(perf.step_time([], n, kv + n * k) for k in range(steps))
    assert perf.decode_steps_time(n, kv, steps) == pytest.approx(one_by_one, rel=1e-12)


def test_mixed_step_charges_the_fixed_cost_once():
    f = MeasuredFit(TRUE_A, TRUE_B)
    perf = MeasuredPerf(f, 1024, 1, 25.0)
    alone_p = perf.step_time([(256, 512)], 0, 0)
    alone_d = perf.step_time([], 8, 8 * 1000)
    mixed = perf.step_time([(256, 512)], 8, 8 * 1000)
    assert alone_p == pytest.approx(f.prefill_s(256, 512))
    assert alone_d == pytest.approx(f.decode_s(8, 1000))
    assert mixed == pytest.approx(alone_p + alone_d - min(TRUE_A[0], TRUE_B[0]))


def test_broken_profile_dirs_are_one_line_config_errors(tmp_path):
    with pytest.raises(MeasuredProfileError, match="not found"):
        load_measured(tmp_path / "missing", 1024)
    pre, dec = synthetic_tables()
    d = write_profile_dir(tmp_path / "p", pre, dec)
    (d / "decode.csv").write_text("batch_size,context_tokens\n1,2\n")
    with pytest.raises(ConfigError, match=r"decode.csv: missing columns \['step_s'\]"):
        load_measured(d, 1024)
    for body, why in [("batch_size,context_tokens,step_s\n1,2,inf\n2,2,0.1\n4,2,0.2\n", "infinite values \\(row 2\\)"),
                      ("batch_size,context_tokens,step_s\n1,2,0.1\n2,x,0.1\n4,2,0.2\n", "non-numeric .* \\(row 3\\)"),
                      ("batch_size,context_tokens,step_s\n1,2,0.1\n2,2,-0.1\n4,2,0.2\n", "negative values"),
                      ("batch_size,context_tokens,step_s\n1,2,0.1\n", "needs at least 3 rows, has 1")]:
        (d / "decode.csv").write_text(body)
        with pytest.raises(MeasuredProfileError, match=f"decode.csv: .*{why}") as e:
            load_measured(d, 1024)
        assert "\n" not in str(e.value)
    (d / "profile.json").write_text("{}")
    with pytest.raises(ConfigError, match="profile.json: field 'format'"):
        config.cell_catalog.cache_clear()
        from simcore.perf_measured import read_meta
        read_meta(d)


@pytest.fixture
def own_configs(tmp_path, monkeypatch):
    """A configs dir of our own (AGENTSERVESIM_CONFIGS) with a cpu-host hardware and a tiny model."""
    src = configs_dir()
    d = tmp_path / "configs"
    d.mkdir()
    shutil.copy(src / "hardware.yaml", d)
    shutil.copy(src / "models.yaml", d)
    with (d / "hardware.yaml").open("a") as fh:
        fh.write("cpu-host:\n  name: test host\n  peak_bf16_tflops: 1\n  mem_bw_tbs: 0.05\n  mem_gib: 8\n"
                 "  allreduce_gbs: 10\n  host_link_gbs: 10\n  host_kv_gib: 0\n  power_idle_w: 10\n  power_max_w: 50\n")
    with (d / "models.yaml").open("a") as fh:
        fh.write("tiny-llama:\n  hf_name: local/tiny\n  layers: 2\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n"
                 "  head_dim: 16\n  intermediate: 128\n  vocab: 1000\n  params_b: 0.0001\n")
    monkeypatch.setenv("AGENTSERVESIM_CONFIGS", str(d))
    for c in (config.cell_catalog, config.hardware_catalog, config.model_catalog):
        c.cache_clear()
    yield d
    monkeypatch.delenv("AGENTSERVESIM_CONFIGS")
    for c in (config.cell_catalog, config.hardware_catalog, config.model_catalog):
        c.cache_clear()


def test_a_cell_naming_a_profile_is_timed_by_it(own_configs):
    pre, dec = synthetic_tables()
    write_profile_dir(own_configs / "prof", pre, dec, kv_pool_tokens=4096, block_size=16)
    (own_configs / "cells.yaml").write_text(
        "families:\n  tiny:\n    hardware: cpu-host\n    model: tiny-llama\n    profile: prof\n"
        "    workload: {kind: swe, programs: 3}\n    rates: [0.5]\n")
    cell = config.get_cell("tiny_0.5")
    assert cell.profile == str((own_configs / "prof").resolve()) and cell.kv_pool_tokens == 4096
    perf = build_perf_model(cell)
    assert isinstance(perf, MeasuredPerf)
    assert perf.step_time([(256, 0)], 0, 0) == pytest.approx(MeasuredFit(TRUE_A, TRUE_B).prefill_s(256, 0))
    # one program alone (no batching effects): a profile 3x slower makes every step 3x slower
    from simcore.sim import cell_programs
    one = cell_programs(cell, 0)[:1]
    res = simulate(cell.model_copy(update={"kv_pool_tokens": 200_000}), programs=one, seed=0)
    slow = write_profile_dir(own_configs / "slow", pre.assign(time_s=pre["time_s"] * 3),
                             dec.assign(step_s=dec["step_s"] * 3))
    res3 = simulate(cell.model_copy(update={"kv_pool_tokens": 200_000, "profile": str(slow)}), programs=one, seed=0)
    for k in ("mean_tpot_s", "mean_ttft_s"):
        assert res3.summary[k] == pytest.approx(3 * res.summary[k], rel=1e-6)


def test_a_cell_with_a_missing_profile_is_a_config_error(own_configs):
    (own_configs / "cells.yaml").write_text(
        "families:\n  tiny:\n    hardware: cpu-host\n    model: tiny-llama\n    profile: nowhere\n"
        "    kv_pool_tokens: 1000\n    workload: {kind: swe, programs: 3}\n    rates: [0.5]\n")
    with pytest.raises(ConfigError, match=r"cells.yaml: families.tiny.profile: .*nowhere"):
        config.get_cell("tiny_0.5")


ENGINE_STEP = (0.003, 2e-5, 4e-4, 5e-8)   # the fake engine's true step: c0, per prefill token, per decode, per KV
engine_step = linear_step(*ENGINE_STEP)


def test_profile_of_the_fake_engine_recovers_its_step_times(tmp_path, capsys):
    with Spawned(ENGINE_STEP, mode="engine", max_model_len=4096, kv_pool_tokens=65536) as url:
        rc = main(["profile", "--server", url, "--out", str(tmp_path / "prof"), "--prefill-tokens", "16,128,512,1024",
                   "--contexts", "0,512", "--batch-sizes", "1,4,8,16", "--decode-contexts", "128,1024",
                   "--decode-tokens", "24", "--repeats", "3", "--tolerance", "0.25"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    meta = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert meta["format"] == PROFILE_FORMAT and meta["kv_pool_tokens"] == 65536 and meta["block_size"] == 16
    pre = pd.read_csv(tmp_path / "prof" / "prefill.csv")
    dec = pd.read_csv(tmp_path / "prof" / "decode.csv")
    assert len(pre) == 8 and len(dec) == 8
    assert set(pre["context_tokens"]) == {0, 512}          # the server's reported prefix hits
    # every grid point is printed with its error
    assert out.out.count(" %") >= 16 and ("reproduces all 16 measured points" in out.out or "lie beyond" in out.out)
    f = MeasuredFit(tuple(meta["fit"]["a"]), tuple(meta["fit"]["b"]))
    # decode: the step grows like the engine's (0.4 ms per sequence + 50 ns per KV token)
    true_rise = engine_step([], 16, 16 * 1036) - engine_step([], 1, 1036)
    assert f.decode_s(16, 1036) - f.decode_s(1, 1036) == pytest.approx(true_rise, rel=0.3)
    # prefill: 20 us per new token
    assert (f.prefill_s(1024, 0) - f.prefill_s(16, 0)) == pytest.approx(1008 * 2e-5, rel=0.3)
    assert meta["mean_abs_error"] < 0.1   # single points may scatter on a busy host; the fit may not


def test_profile_json_has_every_point_and_the_fit(tmp_path, capsys):
    with Spawned(ENGINE_STEP, mode="engine", max_model_len=4096, kv_pool_tokens=65536) as url:
        rc = main(["profile", "--server", url, "--out", str(tmp_path / "prof"), "--prefill-tokens", "16,128,256",
                   "--contexts", "0", "--batch-sizes", "1,2,4", "--decode-contexts", "128", "--decode-tokens", "8",
                   "--repeats", "1", "--tolerance", "0.5", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert len(doc["prefill"]) == 3 and len(doc["decode"]) == 3
    assert {"new_tokens", "time_s", "fit_s", "error"} <= set(doc["prefill"][0])
    assert doc["meta"]["fit"]["a"] and doc["profile_dir"] == str((tmp_path / "prof").resolve())


# ---------------------------------------------------------------------------- what lone requests miss
def test_default_grid_reaches_the_pool_and_the_step_budget():
    """Decode contexts up to what the KV pool holds B times, for every batch size, and a prefill
    point at the step budget: an agent workload's steps sit near those bounds."""
    from search.live.client import ServerInfo
    from search.live.profile import Profiler, default_grid
    info = ServerInfo("http://x", "m", 2048, ["m"], block_size=32, kv_pool_tokens=4096)
    g = default_grid(info, max_num_batched_tokens=2048, max_num_seqs=16, repeats=1)
    assert 512 in g.prefill_tokens and max(g.prefill_tokens) == 2046     # min(budget, mml - 2)
    assert 3 * 2048 // 4 in g.contexts

    class Client:
        pass
    c = Client()
    c.info = info
    _, dec, _ = Profiler(c, g).plan()   # type: ignore[arg-type]
    longest = {b: max(ctx for bb, ctx in dec if bb == b) for b in g.batch_sizes}
    for b, ctx in longest.items():
        blocks = -(-(ctx + g.decode_tokens) // 32)
        assert b * blocks <= 4096 // 32 - 1, (b, ctx)           # fits the pool (less vLLM's null block)
        assert b * (blocks + 2) > 4096 // 32 - 1 or ctx + g.decode_tokens + 1 >= 2048, (b, ctx)  # and reaches it
    # explicit --decode-contexts are taken as given
    g2 = default_grid(info, 2048, 16, 1)
    g2.decode_contexts, g2.fill_pool = [64], False
    _, dec2, _ = Profiler(c, g2).plan()   # type: ignore[arg-type]
    assert {ctx for _, ctx in dec2} == {64}


def test_wake_time_interpolates_the_idle_table_and_never_falls(tmp_path):
    pre, dec = synthetic_tables()
    d = write_profile_dir(tmp_path / "p", pre, dec)
    pd.DataFrame({"gap_s": [0, 0.005, 0.02, 0.2], "engine_idle_s": [0.004, 0.009, 0.024, 0.204],
                  "wake_s": [0.0, 0.0006, 0.0004, 0.0012]}).to_csv(d / "idle.csv", index=False)
    perf = load_measured(d, 1024)
    assert perf.wake_time(0.0) == 0.0
    assert perf.wake_time(0.009) == pytest.approx(0.0006)
    assert perf.wake_time(0.024) == pytest.approx(0.0006)      # the dip to 0.4 ms is noise: non-decreasing
    assert perf.wake_time(0.114) == pytest.approx(0.0009)      # linear between points
    assert perf.wake_time(10.0) == pytest.approx(0.0012)       # flat beyond the last
    (d / "idle.csv").write_text("gap_s,engine_idle_s\n0,0.004\n")
    with pytest.raises(MeasuredProfileError, match=r"idle.csv: missing columns \['wake_s'\]"):
        load_measured(d, 1024)


def test_the_engine_charges_the_wake_up_to_the_first_step_after_idle():
    """A call alone, then another after an idle gap: the first step after each idle period costs
    the profile's wake-up for that idle time; a step right after another costs nothing more."""
    from simcore.config import EngineArgs
    from simcore.instance import Instance
    from simcore.kv import KVManager
    from simcore.request import Request
    perf = MeasuredPerf(MeasuredFit(TRUE_A, TRUE_B), 1024, 1, 25.0, wake=((0.0, 0.01, 1.0), (0.0, 0.002, 0.002)))
    inst = Instance(0, KVManager(256, 16, 0, True), perf, EngineArgs())
    inst.add(Request(rid=0, pid=0, turn=0, prompt=100, output=2, shared=0, priority=0, arrival=5.0, instance=0))
    end1 = inst.step(5.0, float("inf"))                      # idle since forever: the full wake-up
    assert end1 - 5.0 == pytest.approx(perf.step_time([(100, 0)], 0, 0) + 0.002)
    inst.finish_step(end1)
    end2 = inst.step(end1, float("inf"))                     # right after the last step: none
    assert end2 - end1 == pytest.approx(perf.step_time([], 1, 101))
    assert [r.rid for r in inst.finish_step(end2)] == [0]
    inst.add(Request(rid=1, pid=1, turn=0, prompt=50, output=2, shared=0, priority=0, arrival=end2 + 0.005,
                     instance=0))
    end3 = inst.step(end2 + 0.005, float("inf"))             # 5 ms idle: half of the ramp to 10 ms
    assert end3 - (end2 + 0.005) == pytest.approx(perf.step_time([(50, 0)], 0, 0) + 0.001)
    # a timer without a wake-up (the roofline and table models) is left alone
    assert Instance(0, KVManager(256, 16, 0, True), MeasuredPerf(MeasuredFit(TRUE_A, TRUE_B), 1024, 1, 25.0),
                    EngineArgs())._wake(10.0) == 0.0


def test_profile_measures_the_fake_engines_wake_up_and_api_latency(tmp_path, capsys):
    """The fake engine's first step after more than 30 ms idle costs 10 ms more, and every request
    spends 4 ms on its way in and 3 ms before its stream closes: idle.csv must show both. (The
    injected delays are several times a loaded 2-CPU machine's scheduling jitter, so the margins
    below hold under the full suite.)"""
    with Spawned(ENGINE_STEP, mode="engine", max_model_len=4096, kv_pool_tokens=65536, wake_s=0.010,
                 wake_after_s=0.030, api_in_s=0.004, api_out_s=0.003) as url:
        rc = main(["profile", "--server", url, "--out", str(tmp_path / "prof"), "--prefill-tokens", "16,64,256",
                   "--contexts", "0", "--batch-sizes", "1,2,4", "--decode-contexts", "128", "--decode-tokens", "8",
                   "--idle-gaps", "0,40,80", "--repeats", "2"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    idle = pd.read_csv(tmp_path / "prof" / "idle.csv")
    meta = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert list(idle["gap_s"]) == [0.0, 0.04, 0.08]
    # back to back the engine sat idle only for the API round trip (under 30 ms: no wake-up); after
    # 40 and 80 ms of client-side gap it sat idle longer, and its TTFT rose by the fake's 10 ms
    assert (idle["engine_idle_s"] > idle["gap_s"]).all() and idle["engine_idle_s"].iloc[0] < 0.030
    assert idle["wake_s"].iloc[0] == pytest.approx(0.0, abs=0.003)
    assert idle["wake_s"].iloc[1:].to_numpy() == pytest.approx([0.010, 0.010], abs=0.004)
    assert meta["wake_s_max"] == pytest.approx(0.010, abs=0.004)
    # the API latency: 4 ms in + 3 ms out + the fake's own HTTP handling (a few milliseconds)
    assert 0.007 <= meta["api_latency_s"] <= 0.020, meta["api_latency_s"]
    assert "engine wake-up" in out.out and "API latency per call" in out.out
    # and the simulator reads the curve: a step after 80 ms of idle engine costs the 10 ms
    perf = load_measured(tmp_path / "prof", 1024)
    assert perf.wake_time(0.08 + meta["api_latency_s"]) == pytest.approx(0.010, abs=0.004)
