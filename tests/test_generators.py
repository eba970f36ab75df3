"""Built-in SWE/BFCL generators against the published workload figures (DESIGN §2, paper
App. A), plus determinism and error handling.

The targets below are the published numbers, not what the generator happens to produce:
a generator change that drifts more than 5 % from any of them fails here.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from simcore.generators import KNOWN_KINDS, generate
from simcore.workload import WorkloadError, program_to_dict
from simcore.workload_cli import workload_stats

RTX70B_KV_POOL = 114_768  # tokens, DESIGN §2 (cells.yaml rtx70b_*)
TOL = 0.05


def close(value: float, target: float, tol: float = TOL) -> bool:
    return abs(value - target) <= tol * abs(target)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_swe_50_programs_match_published_totals(seed: int) -> None:
    s = workload_stats(generate("swe", 50, seed))
    assert s["programs"] == 50
    assert close(s["calls"], 2873), s["calls"]                       # 2,873 calls per 50 programs
    assert close(s["calls_per_program"]["median"], 47), s["calls_per_program"]
    assert close(s["context_tokens"], 38.7e6), s["context_tokens"]   # 38.7 M context tokens
    assert close(s["context_tokens_per_call"]["mean"], 13.5e3, 0.06)  # "≈13.5 k per call"
    assert close(s["output_tokens_per_call"]["median"], 95)          # mini-swe-agent ≈95
    assert 51 <= s["output_tokens_per_call"]["median"] <= 214        # public-trace range of medians


def test_swe_30_programs_match_the_30_program_cell() -> None:
    s = workload_stats(generate("swe", 30, 0))
    assert close(s["calls"], 1674), s["calls"]


def test_swe_context_grows_by_output_plus_observation_and_fits_the_pool() -> None:
    for p in generate("swe", 50, 7):
        for k in range(1, len(p.calls)):
            prev, cur = p.calls[k - 1], p.calls[k]
            # prompt(k+1) = prompt(k) + output(k) + observation(k), observation >= 1 token,
            # unless the 100 k context cap is reached
            assert cur.prompt_tokens >= min(100_000, prev.prompt_tokens + prev.output_tokens + 1)
            assert cur.prompt_tokens <= 100_000
            assert p.shared_prefix(k) == prev.prompt_tokens + prev.output_tokens \
                or cur.prompt_tokens == 100_000
        assert all(c.prompt_tokens + c.output_tokens <= RTX70B_KV_POOL for c in p.calls)


def test_swe_tool_gaps_shape() -> None:
    programs = generate("swe", 50, 0)
    s = workload_stats(programs)
    assert s["tool_share_under_1s"] > 0.5                            # "most < 1 s"
    bash = [c.tool_duration_s for p in programs for c in p.calls if c.tool_name == "bash"]
    assert 0.4 * 0.95 <= float(np.median(bash)) <= 0.5 * 1.05         # bash median ≈0.4–0.5 s
    for p in programs:
        assert p.calls[-1].tool_name is None and p.calls[-1].tool_duration_s == 0
        assert all(c.tool_name in {"view", "edit", "bash", "test"} for c in p.calls[:-1])
        assert all(c.tool_duration_s > 0 for c in p.calls[:-1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_swe_tracelab_tail_matches_production_traces(seed: int) -> None:
    s = workload_stats(generate("swe-tracelab", 50, seed))
    n = s["tool_calls"]
    # 4 % of tool calls last > 1 min (TraceLab): a binomial count, so allow 3 standard errors
    assert abs(s["tool_calls_over_60s"] - 0.04) <= 3 * math.sqrt(0.04 * 0.96 / n)
    assert close(s["tool_time_share_over_60s"], 0.85)                # ... and hold 85 % of tool time
    assert s["tool_share_under_1s"] > 0.5


def test_swe_kinds_share_programs_except_the_tail() -> None:
    a, b = generate("swe", 20, 3), generate("swe-tracelab", 20, 3)
    for pa, pb in zip(a, b):
        assert [(c.prompt_tokens, c.output_tokens, c.tool_name) for c in pa.calls] == \
               [(c.prompt_tokens, c.output_tokens, c.tool_name) for c in pb.calls]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bfcl_100_programs_match_published_shape(seed: int) -> None:
    programs = generate("bfcl", 100, seed)
    s = workload_stats(programs)
    assert s["calls_per_program"]["median"] == 5.5                    # bfcl-eval multi_turn_base
    assert close(s["context_tokens_per_call"]["mean"], 735)           # ≈735 prompt tokens per call
    assert close(s["output_tokens_per_call"]["mean"], 34)             # ≈34 output tokens per call
    intra = [c.tool_duration_s for p in programs for c in p.calls[:-1]]
    assert float(np.percentile(intra, 25)) < 0.1                      # simulated tools: tens of ms
    assert all(p.calls[-1].tool_name is None for p in programs)


def test_generation_is_deterministic_and_prefix_stable() -> None:
    for kind in KNOWN_KINDS:
        a = [program_to_dict(p) for p in generate(kind, 40, 11)]
        b = [program_to_dict(p) for p in generate(kind, 40, 11)]
        assert a == b
        small = [program_to_dict(p) for p in generate(kind, 25, 11)]
        assert small == a[:25]                                         # common random numbers
        other = [program_to_dict(p) for p in generate(kind, 40, 12)]
        assert other != a


def test_unknown_kind_lists_known_kinds() -> None:
    with pytest.raises(WorkloadError) as e:
        generate("sharegpt", 5, 0)
    msg = str(e.value)
    assert "sharegpt" in msg and all(k in msg for k in KNOWN_KINDS) and "\n" not in msg


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_bad_program_count(n) -> None:
    with pytest.raises(WorkloadError):
        generate("swe", n, 0)


def _swe(n: int, seed: int, short_first: dict | None, tmp_path) -> list:
    import yaml

    from simcore.generators import _config_dir
    cfg = yaml.safe_load((_config_dir() / "generators.yaml").read_text())
    if short_first is not None:
        cfg["swe"]["short_first"] = short_first
    path = tmp_path / f"generators-{abs(hash(repr(short_first)))}.yaml"  # parameters are cached by path
    path.write_text(yaml.safe_dump(cfg))
    return generate("swe", n, seed, config_path=path)


@pytest.mark.parametrize("seed", [0, 3])
def test_short_first_reorders_a_block_without_changing_it(seed: int, tmp_path) -> None:
    """The first 10 programs of a block come from its lowest 20 of 50 size strata; the block
    holds exactly the programs of the unordered trace, so 50-program totals (and every
    statistic above) are untouched, and prefixes stay prefixes."""
    ordered = _swe(100, seed, None, tmp_path)
    plain = _swe(100, seed, {"programs": 0, "of_strata": 1}, tmp_path)
    sizes = [len(p.calls) for p in ordered]
    for b in (0, 50):
        assert sorted(repr(p.calls) for p in ordered[b:b + 50]) == sorted(repr(p.calls) for p in plain[b:b + 50])
        rank = sorted(sizes[b:b + 50])
        assert max(sizes[b:b + 10]) <= rank[20]          # from the 20 lowest strata
        assert [p.calls for p in ordered[b:b + 10]] != [p.calls for p in plain[b:b + 10]]
    assert np.mean(sizes[:10]) < 0.7 * np.mean(sizes[:50])
    assert [p.program_id for p in ordered] == [f"swe-{i:04d}" for i in range(100)]
    assert [p.calls for p in _swe(30, seed, None, tmp_path)] == [p.calls for p in ordered[:30]]


def test_short_first_must_fit_the_strata(tmp_path) -> None:
    with pytest.raises(WorkloadError, match="short_first"):
        _swe(5, 0, {"programs": 30, "of_strata": 20}, tmp_path)
    with pytest.raises(WorkloadError, match="short_first"):
        _swe(5, 0, {"programs": 10, "of_strata": 60}, tmp_path)


def test_broken_parameter_file_is_one_line_error(tmp_path) -> None:
    bad = tmp_path / "generators.yaml"
    bad.write_text("swe:\n  calls: {median: -1, sigma: 0.5, min: 1, max: 10}\n")
    with pytest.raises(WorkloadError) as e:
        generate("swe", 3, 0, config_path=bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    bad.write_text("swe: [unclosed\n")
    with pytest.raises(WorkloadError) as e:
        generate("swe", 3, 0, config_path=bad)
    assert "invalid YAML" in str(e.value)


@pytest.mark.parametrize("cell,kind,n,published", [
    ("rtx70b_swe_0.02", None, None, 3726.0),      # paper Table 1 cell, stock mean JCT (DESIGN §2)
    ("rtx70b_swe_0.1", None, None, 2540.0),       # the search target cell, 30 programs
    ("rtx70b_swe10_0.02", None, None, 171.0),     # 10 programs at 0.02 JPS
    ("b200_8b_swe20_0.06", None, None, 53.0),     # B200 8B SWE, 20 programs at 0.06 JPS
    ("b200_8b_bfcl_0.06", "bfcl", 20, 11.3),      # B200 8B BFCL, 20 programs
])
def test_stock_jct_within_15_percent_of_published(cell: str, kind, n, published: float) -> None:
    """Calibration guard (issue 3): generator + engine at cache-LRU + FCFS, the cells' seed.
    benchmarks/calibration.py prints the full table, including the figures not reached."""
    from simcore.sim import simulate
    programs = generate(kind, n, 0) if kind else None
    jct = simulate(cell, programs=programs, seed=0).summary["mean_jct_s"]
    assert close(jct, published, 0.15), (cell, jct, published)
