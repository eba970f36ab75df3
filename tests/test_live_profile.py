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
