"""Trace importers on the real public samples in tests/data (see tests/data/NOTICE).

Expected values are read off the raw sample files (timestamps, token fields), not off the
importer's output.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from simcore.importers import import_trace, known_formats
from simcore.importers._common import count_tokens
from simcore.sim import simulate
from simcore.workload import WorkloadError, load_programs, program_to_dict, save_programs

DATA = Path(__file__).resolve().parent / "data"
TL = DATA / "tracelab"
LM = DATA / "lmcache"
BF = DATA / "bfcl" / "BFCL_v4_multi_turn_base.json"
MC = DATA / "mooncake" / "conversation_trace.jsonl"
MINISWE = LM / "miniswe_189f0222310bd8eee310f204e91b9c84.jsonl"
TAU = LM / "taubench_09867e5c74f53656f91797020d262e3b.jsonl"

SAMPLES = [
    ("tracelab", TL / "sanitized_round_trace.jsonl"),
    ("tracelab", TL / "replay_multi_session_large.csv"),
    ("tracelab", TL / "replay_session_workload_example.csv"),
    ("lmcache", MINISWE),
    ("lmcache", TAU),
    ("bfcl", BF),
    ("mooncake", MC),
]


@pytest.mark.parametrize("fmt,src", SAMPLES, ids=lambda x: getattr(x, "name", x))
def test_sample_imports_round_trips_and_simulates(fmt: str, src: Path, tmp_path: Path) -> None:
    programs = import_trace(fmt, src)
    assert programs
    out = tmp_path / "w.jsonl"
    save_programs(programs, out)
    back = load_programs(out)                       # the project's validating reader
    assert [program_to_dict(p) for p in back] == [program_to_dict(p) for p in programs]
    for p in back:
        assert p.calls[-1].tool_name is None
        assert all(c.prompt_tokens >= 1 and c.output_tokens >= 1 for c in p.calls)
    res = simulate("b200_8b_swe_0.1", programs=back[:40], seed=0)   # runs in the engine
    assert res.summary["programs"] == min(40, len(back))
    assert res.summary["calls"] == sum(len(p.calls) for p in back[:40])


def test_tracelab_round_trace_fields() -> None:
    programs = {p.program_id: p for p in import_trace("tracelab", TL / "sanitized_round_trace.jsonl")}
    assert sorted(len(p.calls) for p in programs.values()) == [9, 10]
    claude = next(p for pid, p in programs.items() if pid.startswith("claude:"))
    first = claude.calls[0]
    assert (first.prompt_tokens, first.output_tokens) == (32272, 931)   # input_tokens_total, output_tokens
    # round 0 ends with its last tool_call at 05:40:31.647; round 1's input is complete when
    # the WebSearch result lands at 05:40:50.938
    assert first.tool_name == "WebSearch"
    assert first.tool_duration_s == pytest.approx(50.938 - 31.647, abs=1e-3)
    # recorded arrivals: the Codex session (2026-03-21) precedes the Claude one (2026-06-01)
    assert claude.meta["arrival_s"] > 0
    assert min(p.meta["arrival_s"] for p in programs.values()) == 0


def test_tracelab_replay_csv_fields() -> None:
    [p] = import_trace("tracelab", TL / "replay_session_workload_example.csv")
    assert len(p.calls) == 11
    assert (p.calls[0].prompt_tokens, p.calls[0].output_tokens) == (12461 + 5875, 124)
    assert p.calls[0].tool_duration_s == pytest.approx(0.182)
    assert p.calls[1].shared_prefix_tokens == 18333
    assert p.calls[10].shared_prefix_tokens == 48060            # context rebuilt at round 10
    assert "arrival_s" not in p.meta                            # this CSV has no arrival_time
    large = import_trace("tracelab", TL / "replay_multi_session_large.csv")
    assert len(large) == 48 and sum(len(q.calls) for q in large) == 303
    assert large[1].meta["arrival_s"] == pytest.approx((393 - 117) / 1000)   # arrival_time in ms


def test_lmcache_tokens_gaps_and_order() -> None:
    rows = sorted((json.loads(l) for l in MINISWE.read_text().splitlines() if l.strip()),
                  key=lambda r: r["timestamp"])
    [p] = import_trace("lmcache", MINISWE)
    assert len(p.calls) == len(rows) == 6
    assert p.calls[0].prompt_tokens == count_tokens(rows[0]["input"])
    out0 = count_tokens(rows[0]["output"])
    dt = (rows[1]["timestamp"] - rows[0]["timestamp"]) / 1e6
    assert p.calls[0].tool_duration_s == pytest.approx(dt - (0.1 + out0 * 0.005), abs=1e-6)
    # a different generation-time estimate moves the gap accordingly
    [q] = import_trace("lmcache", MINISWE, ttft_s=0.0, tpot_s=0.0)
    assert q.calls[0].tool_duration_s == pytest.approx(dt, abs=1e-6)


def test_lmcache_interleaved_session_shares_only_real_prefixes() -> None:
    [p] = import_trace("lmcache", TAU)
    assert len(p.calls) == 31
    shared = [p.shared_prefix(k) for k in range(1, len(p.calls))]
    prev = [p.calls[k - 1].prompt_tokens for k in range(1, len(p.calls))]
    assert all(s <= c.prompt_tokens for s, c in zip(shared, p.calls[1:]))
    # agent and simulated user alternate: many calls do not extend their predecessor
    assert sum(s < pv for s, pv in zip(shared, prev)) >= 5


def test_bfcl_calls_follow_ground_truth() -> None:
    answers = [json.loads(l) for l in (BF.parent / f"possible_answer_{BF.name}").read_text().splitlines()]
    programs = import_trace("bfcl", BF)
    assert [len(p.calls) for p in programs] == [sum(len(t) for t in a["ground_truth"]) for a in answers]
    p0 = programs[0]                                 # GorillaFileSystem + TwitterAPI, 4 turns
    assert [c.tool_name for c in p0.calls[:3]] == ["cd", "mkdir", "mv"]
    assert p0.calls[0].tool_duration_s == pytest.approx(0.03)          # simulated tool
    assert p0.calls[2].tool_duration_s == pytest.approx(0.03 + 3.5)    # end of turn 1
    q = json.loads(BF.read_text().splitlines()[0])
    user0 = count_tokens(q["question"][0][0]["content"])
    assert p0.calls[0].prompt_tokens == 100 + 3182 + 2532 + user0      # system + schemas + question
    [n0] = import_trace("bfcl", BF, func_docs="none")[:1]
    assert n0.calls[0].prompt_tokens == 100 + user0
    assert all(c.output_tokens == count_tokens(s) + 20
               for c, s in zip(p0.calls, [x for t in answers[0]["ground_truth"] for x in t]))


def test_mooncake_requests_become_single_call_programs() -> None:
    rows = [json.loads(l) for l in MC.read_text().splitlines()]
    programs = import_trace("mooncake", MC, arrivals="recorded")
    assert len(programs) == len(rows) == 200
    assert all(len(p.calls) == 1 and p.calls[0].tool_name is None for p in programs)
    assert sorted(p.calls[0].prompt_tokens for p in programs) == sorted(r["input_length"] for r in rows)
    t0 = min(r["timestamp"] for r in rows)
    assert sorted(p.meta["arrival_s"] for p in programs) == pytest.approx(
        sorted((r["timestamp"] - t0) / 1000 for r in rows))


def test_arrival_modes() -> None:
    rec = import_trace("mooncake", MC)
    poi = import_trace("mooncake", MC, arrivals="poisson", rate=2.0, seed=5)
    assert [p.meta["arrival_s"] for p in poi] != [p.meta["arrival_s"] for p in rec]
    assert poi[0].meta["arrival_s"] == 0.0
    mean_gap = poi[-1].meta["arrival_s"] / (len(poi) - 1)
    assert 0.35 < mean_gap < 0.65                               # rate 2 per second
    with pytest.raises(WorkloadError, match="records no arrival times"):
        import_trace("bfcl", BF, arrivals="recorded")
    with pytest.raises(WorkloadError, match="needs --rate"):
        import_trace("bfcl", BF, arrivals="poisson")
    with pytest.raises(WorkloadError, match="unknown arrival mode"):
        import_trace("bfcl", BF, arrivals="uniform")


def test_unknown_format_lists_known_ones() -> None:
    with pytest.raises(WorkloadError) as e:
        import_trace("sharegpt", MC)
    assert all(f in str(e.value) for f in known_formats())


def _truncate(src: Path, dst: Path, keep_lines: int, cut_chars: int) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)[:keep_lines + 1]
    lines[-1] = lines[-1][:cut_chars]
    dst.write_text("".join(lines), encoding="utf-8")
    return dst


@pytest.mark.parametrize("fmt,src", [("tracelab", TL / "sanitized_round_trace.jsonl"), ("lmcache", TAU),
                                     ("mooncake", MC), ("bfcl", BF)], ids=lambda x: getattr(x, "name", x))
def test_truncated_jsonl_names_file_and_line(fmt: str, src: Path, tmp_path: Path) -> None:
    bad = _truncate(src, tmp_path / src.name, keep_lines=3, cut_chars=40)
    if fmt == "bfcl":
        shutil.copy(src.parent / f"possible_answer_{src.name}", tmp_path)
    with pytest.raises(WorkloadError) as e:
        import_trace(fmt, bad)
    msg = str(e.value)
    assert msg.startswith(f"{bad}:4:") and "truncated" in msg and "\n" not in msg


def test_truncated_csv_row_names_file_and_line(tmp_path: Path) -> None:
    src = TL / "replay_multi_session_large.csv"
    lines = src.read_text().splitlines()
    bad = tmp_path / "cut.csv"
    bad.write_text("\n".join(lines[:6] + [lines[6][:9]]) + "\n")
    with pytest.raises(WorkloadError, match=rf"^{bad}:7: truncated"):
        import_trace("tracelab", bad)
    bad.write_text("session_id,round_idx,input_len\n0,0,5\n")
    with pytest.raises(WorkloadError, match=r":1: replay CSV lacks column\(s\) prefix_len"):
        import_trace("tracelab", bad)


def test_wrong_field_types_name_the_field(tmp_path: Path) -> None:
    f = tmp_path / "lm.jsonl"
    f.write_text(json.dumps({"timestamp": "soon", "input": "a", "output": "b", "session_id": "s"}) + "\n")
    with pytest.raises(WorkloadError, match=r":1: field 'timestamp' must be int"):
        import_trace("lmcache", f)
    f.write_text(json.dumps({"timestamp": 0, "input_length": 0, "output_length": 3}) + "\n")
    with pytest.raises(WorkloadError, match=r":1: field 'input_length' must be an integer >= 1"):
        import_trace("mooncake", f)
    row = json.loads((TL / "sanitized_round_trace.jsonl").read_text().splitlines()[0])
    del row["input_tokens_total"]
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(WorkloadError, match=r":1: missing field 'input_tokens_total'"):
        import_trace("tracelab", f)


def test_bfcl_missing_answers_and_ground_truth(tmp_path: Path) -> None:
    q = tmp_path / BF.name
    shutil.copy(BF, q)
    with pytest.raises(WorkloadError, match="no possible-answer file found"):
        import_trace("bfcl", q)
    ans = tmp_path / f"possible_answer_{BF.name}"
    ans.write_text("\n".join((BF.parent / ans.name).read_text().splitlines()[:5]) + "\n")
    with pytest.raises(WorkloadError, match=rf"^{q}:6: 'multi_turn_base_5' has no ground truth"):
        import_trace("bfcl", q)


def test_missing_source_file(tmp_path: Path) -> None:
    for fmt in known_formats():
        with pytest.raises(WorkloadError, match="no such file"):
            import_trace(fmt, tmp_path / "absent.jsonl")
