"""`evolve workload import|generate|stats`, driven through an argparse parser built the way
search/cli.py mounts the module (register(subparsers), then args.func(args))."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


from simcore import workload_cli
from simcore.workload import load_programs

DATA = Path(__file__).resolve().parent / "data"


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="evolve")
    sub = parser.add_subparsers(dest="command", required=True)
    workload_cli.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_generate_then_stats_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "swe.jsonl"
    assert run_cli(["workload", "generate", "--kind", "swe", "-n", "50", "--seed", "0", "-o", str(out)]) == 0
    assert len(load_programs(out)) == 50
    capsys.readouterr()
    assert run_cli(["workload", "stats", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)          # exactly one JSON object
    assert s["programs"] == 50
    assert abs(s["calls"] - 2873) <= 0.05 * 2873
    assert abs(s["context_tokens"] - 38.7e6) <= 0.05 * 38.7e6
    assert abs(s["calls_per_program"]["median"] - 47) <= 0.05 * 47
    for key in ("mean", "median", "max"):
        assert key in s["calls_per_program"]
    for key in ("median", "p90", "p99"):
        assert s["tool_s"][key] is not None
    assert s["tool_time_share_over_60s"] is not None


def test_stats_table(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bfcl.jsonl"
    assert run_cli(["workload", "generate", "--kind", "bfcl", "-n", "10", "-o", str(out)]) == 0
    capsys.readouterr()
    assert run_cli(["workload", "stats", str(out)]) == 0
    text = capsys.readouterr().out
    assert "programs" in text and "context tokens" in text and "tool s median" in text


def test_import_each_format(tmp_path: Path) -> None:
    cases = [
        ("tracelab", DATA / "tracelab" / "replay_multi_session_large.csv", []),
        ("lmcache", DATA / "lmcache" / "miniswe_189f0222310bd8eee310f204e91b9c84.jsonl", ["--tpot", "0.01"]),
        ("bfcl", DATA / "bfcl" / "BFCL_v4_multi_turn_base.json", ["--func-docs", "none"]),
        ("mooncake", DATA / "mooncake" / "conversation_trace.jsonl", ["--arrivals", "poisson", "--rate", "3"]),
    ]
    for fmt, src, extra in cases:
        out = tmp_path / f"{fmt}.jsonl"
        assert run_cli(["workload", "import", "--format", fmt, str(src), "-o", str(out), *extra]) == 0, fmt
        assert load_programs(out)


def test_stats_of_single_call_programs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mc.jsonl"
    assert run_cli(["workload", "import", "--format", "mooncake",
                    str(DATA / "mooncake" / "conversation_trace.jsonl"), "-o", str(out)]) == 0
    capsys.readouterr()
    assert run_cli(["workload", "stats", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["programs"] == s["calls"] == 200 and s["tool_calls"] == 0
    assert s["tool_s"]["median"] is None and s["tool_time_share_over_60s"] is None
    assert s["arrival_span_s"] > 0                              # recorded arrivals kept


def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys) -> None:
    src = DATA / "mooncake" / "conversation_trace.jsonl"
    cases = [
        (["workload", "import", "--format", "nope", str(src), "-o", str(tmp_path / "o.jsonl")],
         "known formats: tracelab, lmcache, bfcl, mooncake"),
        (["workload", "generate", "--kind", "nope", "-n", "3", "-o", str(tmp_path / "o.jsonl")],
         "known kinds: swe"),
        (["workload", "stats", str(tmp_path / "absent.jsonl")], "no such workload file"),
        (["workload", "import", "--format", "mooncake", str(src), "-o", str(tmp_path / "no" / "dir" / "o.jsonl")],
         "cannot write"),
    ]
    trunc = tmp_path / "cut.jsonl"
    trunc.write_text(src.read_text().splitlines()[0] + "\n" + src.read_text().splitlines()[1][:30] + "\n")
    cases.append((["workload", "import", "--format", "mooncake", str(trunc), "-o", str(tmp_path / "o.jsonl")],
                  f"{trunc}:2: malformed or truncated JSON"))
    for argv, expect in cases:
        capsys.readouterr()
        assert run_cli(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert expect in err and len(err.splitlines()) == 1, err
