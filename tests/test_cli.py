"""The `evolve` command: outputs and one-line errors on bad input (no tracebacks)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from search.cli import main
from simcore.packaged import configs_dir


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search", *args], capture_output=True, text=True, timeout=300)


def test_simulate_prints_summary():
    p = run_cli("simulate", "--cell", "rtx70b_swe_0.1", "--retention", "ttl", "--scheduling", "plas")
    assert p.returncode == 0, p.stderr
    assert "mean JCT" in p.stdout and "rtx70b_swe_0.1" in p.stdout


def test_simulate_json_has_the_promised_fields(capsys):
    assert main(["simulate", "--cell", "rtx70b_swe10_0.1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for k in ("mean_jct_s", "p50_jct_s", "p99_jct_s", "calls", "programs", "makespan_s", "mean_queueing_s",
              "preemptions", "wall_s"):
        assert k in out


def test_simulate_writes_result_files(tmp_path, capsys):
    assert main(["simulate", "--cell", "rtx70b_swe10_0.1", "--out", str(tmp_path / "r")]) == 0
    for f in ("summary.json", "programs.csv", "calls.csv", "kv_timeline.csv"):
        assert (tmp_path / "r" / f).stat().st_size > 0


def test_sweep_json_is_relative_to_lru_fcfs(capsys):
    assert main(["sweep", "--cell", "rtx70b_swe10_0.1", "--retention", "cache-lru,ttl", "--scheduling",
                 "fcfs,plas", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"]["cache-lru+fcfs"]["delta_vs_lru_fcfs"] == 0.0
    assert set(out["points"]) == {"cache-lru+fcfs", "cache-lru+plas", "ttl+fcfs", "ttl+plas"}


def _one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    text = " ".join(lines)
    for n in needles:
        assert n in text, text


def test_unknown_cell_lists_valid_ones():
    _one_line_error(run_cli("simulate", "--cell", "nope"), "unknown cell 'nope'", "rtx70b_swe_0.1")


def test_unknown_policy_lists_valid_ones():
    _one_line_error(run_cli("simulate", "--cell", "rtx70b_swe_0.1", "--retention", "nope"),
                    "unknown retention policy", "cache-lru")


@pytest.mark.parametrize("content,needle", [
    ('{"program_id":"a","calls":[{"prompt_tokens":10,"output_tokens":2,"tool":null}]}\n{"program_id": "b", "calls": [{"pro\n',
     ":2: malformed or truncated JSON"),
    ('{"program_id":"a","calls":[{"prompt_tokens":-3,"output_tokens":2}]}\n', "'prompt_tokens' must be >= 1"),
    ('{"program_id":"a","calls":[]}\n', "'calls' must be a non-empty list"),
    ('{"program_id":"a","calls":[{"prompt_tokens":10,"output_tokens":2,"tool":{"duration_s":"x"}}]}\n',
     "tool.duration_s"),
])
def test_malformed_trace_is_one_line_with_file_and_line(tmp_path, content, needle):
    f = tmp_path / "w.jsonl"
    f.write_text(content)
    _one_line_error(run_cli("simulate", "--cell", "rtx70b_swe_0.1", "--workload", str(f)), str(f), needle)


def test_call_that_can_never_fit_is_one_line(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"program_id":"big","calls":[{"prompt_tokens":200000,"output_tokens":5,"tool":null}]}\n')
    _one_line_error(run_cli("simulate", "--cell", "rtx70b_swe_0.1", "--workload", str(f)),
                    "program 'big' call 0", "can never fit the KV pool")


def test_recorded_arrivals_from_an_imported_trace(tmp_path, capsys):
    out = tmp_path / "tl.jsonl"
    assert main(["workload", "import", "--format", "tracelab", "--arrivals", "recorded",
                 "tests/data/tracelab/replay_multi_session_large.csv", "-o", str(out)]) == 0
    from simcore.sim import simulate
    from simcore.workload import load_programs
    progs = load_programs(out)
    res = simulate("b200_8b_swe_0.1", programs=progs, arrivals="recorded")
    want = sorted(p.meta["arrival_s"] - min(q.meta["arrival_s"] for q in progs) for p in progs)
    assert sorted(res.programs["arrival_s"]) == want
    assert len(set(want)) > 1


@pytest.mark.parametrize("cells,needles", [
    ("families:\n  x:\n    hardware: B200\n    model: Llama-3.1-8B\n    rates: [0.1\n", ["cells.yaml", "invalid YAML"]),
    ("families:\n  x:\n    hardware: TPU9\n    model: Llama-3.1-8B\n    workload: {kind: swe, programs: 5}\n"
     "    rates: [0.1]\n", ["cells.yaml", "families.x.hardware", "unknown 'TPU9'"]),
    ("families:\n  x:\n    hardware: B200\n    model: Llama-3.1-8B\n    kv_pool_tokens: -5\n"
     "    workload: {kind: swe, programs: 5}\n    rates: [0.1]\n", ["cells.yaml", "kv_pool_tokens"]),
])
def test_broken_config_is_one_line_naming_file_and_field(tmp_path, cells, needles):
    import os
    import shutil
    src = configs_dir()
    for f in ("hardware.yaml", "models.yaml"):
        shutil.copy(src / f, tmp_path / f)
    (tmp_path / "cells.yaml").write_text(cells)
    p = subprocess.run([sys.executable, "-m", "search", "cells"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "AGENTSERVESIM_CONFIGS": str(tmp_path)})
    _one_line_error(p, *needles)


def test_a_policy_file_that_hangs_is_one_line_naming_the_file(tmp_path):
    f = tmp_path / "hang.py"
    f.write_text("class Hang(SchedulingPolicy):\n    def priority(self, pcb, now):\n        while True:\n"
                 "            pass\n")
    _one_line_error(run_cli("simulate", "--cell", "rtx70b_swe10_0.1", "--scheduling", str(f)),
                    str(f), "deadline")
